//! Bounded fuzzing of the handshake and request parsers: random bytes and
//! structured mutations of valid client streams, fed both to the in-process
//! entry points and to a live server over a socket. The server must not panic,
//! and on a live socket it must answer or close (never hang), and keep serving
//! other clients.

use proptest::prelude::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;
use surge_block::MemoryDev;
use surge_nbd::client::{Client, ClientOptions};
use surge_nbd::proto::*;
use surge_nbd::{fuzz_handshake, fuzz_requests, Export, Listen, Server, ServerConfig};

fn cases() -> u32 {
    std::env::var("SURGE_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(1000)
}

/// One request of a generated valid stream.
#[derive(Debug, Clone)]
struct Req {
    cmd: u16,
    flags: u16,
    offset: u64,
    len: u32,
}

fn req_strategy() -> impl Strategy<Value = Req> {
    (0u16..9, any::<u16>(), 0u64..(1 << 20), 0u32..70_000, any::<bool>()).prop_map(|(cmd, flags, offset, len, plain)| Req {
        cmd,
        // Mostly valid flags, sometimes anything.
        flags: if plain { flags & (CMD_FLAG_FUA | CMD_FLAG_DF | CMD_FLAG_REQ_ONE) } else { flags },
        offset,
        len,
    })
}

/// A valid client stream: flags, options, GO, requests (with payloads), DISC.
fn valid_stream(structured: bool, meta: bool, reqs: &[Req]) -> Vec<u8> {
    let mut s = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
    let mut opt = |o: u32, d: &[u8]| {
        s.extend_from_slice(&encode_option_header(o, d.len() as u32));
        s.extend_from_slice(d);
    };
    opt(OPT_LIST, &[]);
    if structured {
        opt(OPT_STRUCTURED_REPLY, &[]);
    }
    if meta {
        opt(OPT_SET_META_CONTEXT, &encode_meta_context_request("disk", &[BASE_ALLOCATION]));
    }
    opt(OPT_INFO, &encode_info_request("ro", &[INFO_NAME, INFO_BLOCK_SIZE]));
    opt(OPT_GO, &encode_info_request("disk", &[]));
    for (i, r) in reqs.iter().enumerate() {
        s.extend_from_slice(&encode_request(&Request { flags: r.flags, cmd: r.cmd, cookie: i as u64, offset: r.offset, len: r.len }));
        if r.cmd == CMD_WRITE {
            s.extend(std::iter::repeat(i as u8).take(r.len as usize));
        }
    }
    s.extend_from_slice(&encode_request(&Request { flags: 0, cmd: CMD_DISC, cookie: 0, offset: 0, len: 0 }));
    s
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Remove(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16)).prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), 1usize..32).prop_map(|(i, n)| Mutation::Remove(i, n)),
    ]
}

fn apply(mut s: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        if s.is_empty() {
            break;
        }
        match m {
            Mutation::Flip(i, b) => {
                let i = i % s.len();
                s[i] ^= b | 1;
            }
            Mutation::Truncate(i) => s.truncate(i % s.len()),
            Mutation::Insert(i, v) => {
                let i = i % s.len();
                s.splice(i..i, v.iter().copied());
            }
            Mutation::Remove(i, n) => {
                let i = i % s.len();
                let end = (i + n).min(s.len());
                s.drain(i..end);
            }
        }
    }
    s
}

fn mutated_stream() -> impl Strategy<Value = Vec<u8>> {
    (any::<bool>(), any::<bool>(), proptest::collection::vec(req_strategy(), 0..12), proptest::collection::vec(mutation(), 0..4))
        .prop_map(|(st, meta, reqs, muts)| apply(valid_stream(st, meta, &reqs), &muts))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_the_handshake(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        fuzz_handshake(&data);
    }

    #[test]
    fn random_bytes_never_panic_the_request_loop(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        fuzz_requests(&data);
    }

    #[test]
    fn mutated_valid_streams_never_panic(data in mutated_stream()) {
        fuzz_handshake(&data);
        // The same bytes past the 4-byte client flags, as a transmission stream.
        if data.len() > 4 {
            fuzz_requests(&data[3..]);
        }
    }
}

#[test]
fn valid_streams_reach_transmission_and_run_requests() {
    // Sanity check that the generator makes streams the server accepts: the
    // fuzz cases then really exercise the request path, not only the handshake.
    let reqs = [Req { cmd: CMD_WRITE, flags: 0, offset: 0, len: 10 }, Req { cmd: CMD_READ, flags: 0, offset: 0, len: 10 }];
    let srv = live_server();
    let out = converse(&srv.1, &valid_stream(true, true, &reqs)).expect("server closes after DISC");
    // Two replies: a simple ACK for the write and a data chunk for the read.
    let read_reply = encode_chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 1, 18);
    assert!(out.windows(read_reply.len()).any(|w| w == read_reply), "read reply missing");
    assert!(out.windows(16).any(|w| w == encode_simple_reply(0, 0)), "write ack missing");
    srv.0.shutdown().unwrap();
}

fn live_server() -> (Server, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("fuzz.sock");
    let mut ro = Export::new("ro", Arc::new(MemoryDev::new(64 * 1024)));
    ro.read_only = true;
    let cfg = ServerConfig::new(vec![Export::new("disk", Arc::new(MemoryDev::new(1 << 20))), ro]);
    let server = Server::start(cfg).unwrap();
    server.listen(&Listen::Unix(sock.clone())).unwrap();
    (server, sock, dir)
}

/// Sends `data`, half-closes, and reads until the server closes. `None` if the
/// server neither answered to the end nor closed within the timeout.
fn converse(sock: &std::path::Path, data: &[u8]) -> Option<Vec<u8>> {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let writer = {
        let mut w = s.try_clone().unwrap();
        let data = data.to_vec();
        // Write from another thread: the server may answer before reading everything.
        std::thread::spawn(move || {
            let _ = w.write_all(&data);
            let _ = w.shutdown(std::net::Shutdown::Write);
        })
    };
    let mut out = Vec::new();
    let res = s.read_to_end(&mut out);
    let _ = s.shutdown(std::net::Shutdown::Both);
    writer.join().unwrap();
    match res {
        Ok(_) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(out),
        Err(_) => None,
    }
}

#[test]
fn live_server_answers_or_closes_on_mutated_streams_and_keeps_serving() {
    let (server, sock, _dir) = live_server();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig { cases: cases() / 3, failure_persistence: None, ..ProptestConfig::default() });
    runner
        .run(&mutated_stream(), |data| {
            prop_assert!(converse(&sock, &data).is_some(), "server neither answered nor closed");
            Ok(())
        })
        .unwrap();
    let mut c = Client::connect_unix(&sock, &ClientOptions { export: "disk".into(), ..Default::default() }).unwrap();
    c.write(0, b"alive", true).unwrap();
    c.disconnect().unwrap();
    server.shutdown().unwrap();
}
