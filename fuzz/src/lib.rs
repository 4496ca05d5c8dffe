//! The fuzz targets as plain functions (a panic is a finding), shared by the
//! cargo-fuzz binaries in `fuzz_targets/` and the bounded stable loop in
//! `tests/bounded.rs`, plus generators of valid inputs for the seed corpus.
//!
//! | target | code under test | extra oracle |
//! |---|---|---|
//! | `nbd_handshake` | NBD server option phase, then transmission | none (no panic, no hang) |
//! | `nbd_requests` | NBD transmission phase (request parser + dispatch) | none |
//! | `cache_meta` | elastic-cache on-disk metadata decoder (as read, and with the CRC fixed up) | decode → encode → decode is identity |
//! | `fault_rules` | fault-injection one-line rules parser | parse → display → parse is identity |
//! | `bb_frames` | burst-buffer node protocol: frame reader, request and response decoders | a decoded request or response re-encodes to the same frame |
//! | `trace_import` | trace importers: blkparse text, fio iologs, `iostat -x` (first byte picks one) | every imported request's range fits in 64 bits |
//! | `trace_segment` | trace segment reader (header, gzip body, records) | a read segment re-written reads back the same |

use surge_block::cache::meta;
use surge_block::fault::FaultRules;
use surge_nbd::proto::*;

pub fn nbd_handshake(data: &[u8]) {
    surge_nbd::fuzz_handshake(data);
}

pub fn nbd_requests(data: &[u8]) {
    surge_nbd::fuzz_requests(data);
}

pub fn cache_meta(data: &[u8]) {
    meta_round_trip(data);
    // A fuzzer rarely forges a CRC: also decode with the checksum fixed up, so
    // the checks behind it (counts, ranges, duplicates) get explored too.
    if data.len() >= meta::HEADER_LEN {
        let n = u32::from_le_bytes(data[12..16].try_into().unwrap()) as usize;
        if let Some(len) = n.checked_mul(meta::ENTRY_LEN).and_then(|l| l.checked_add(meta::HEADER_LEN)).filter(|&l| l <= data.len()) {
            let mut fixed = data.to_vec();
            fixed[40..44].fill(0);
            let crc = crc32c::crc32c(&fixed[..len]);
            fixed[40..44].copy_from_slice(&crc.to_le_bytes());
            meta_round_trip(&fixed);
        }
    }
}

fn meta_round_trip(data: &[u8]) {
    if let Ok(m) = meta::decode(data) {
        let again = meta::decode(&m.encode()).expect("re-encoded metadata must decode");
        assert_eq!(again, m, "decode/encode round trip changed the metadata");
    }
}

pub fn fault_rules(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(rules) = s.parse::<FaultRules>() {
        let text = rules.to_string();
        let again: FaultRules = text.parse().unwrap_or_else(|e| panic!("{s:?} parsed, its canonical form {text:?} did not: {e}"));
        assert_eq!(again, rules, "{s:?} -> {text:?} changed the rules");
    }
}

/// A byte stream as an I/O node reads it (requests) and as a client reads it
/// (responses): every frame read re-encodes to the bytes it was read from.
pub fn bb_frames(data: &[u8]) {
    use surge_bb::proto::{encode_request, encode_response, read_request, read_response};
    reencodes(data, |r| read_request(r), encode_request);
    reencodes(data, |r| read_response(r), encode_response);
}

/// Reads frames from `data` with `read` until it stops; each must encode
/// back to exactly the bytes it was read from.
fn reencodes<T: std::fmt::Debug>(
    data: &[u8],
    read: impl Fn(&mut &[u8]) -> Result<Option<(u64, T)>, surge_bb::proto::ReadError>,
    encode: impl Fn(u64, &T) -> Vec<u8>,
) {
    let mut stream = data;
    loop {
        let before = stream;
        let Ok(Some((id, frame))) = read(&mut stream) else { break };
        assert_eq!(encode(id, &frame), &before[..before.len() - stream.len()], "{frame:?} re-encoded differently");
    }
}

/// Every target by name.
pub const TARGETS: &[(&str, fn(&[u8]))] = &[
    ("nbd_handshake", nbd_handshake),
    ("nbd_requests", nbd_requests),
    ("cache_meta", cache_meta),
    ("fault_rules", fault_rules),
    ("bb_frames", bb_frames),
    ("trace_import", trace_import),
    ("trace_segment", trace_segment),
];

pub fn trace_import(data: &[u8]) {
    use surge_trace::import::{import, Format, IostatOptions};
    let Some((&which, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let format = [Format::Blkparse, Format::FioIolog, Format::Iostat][which as usize % 3];
    // Small synthesized iostat traces only (a rate of 1e11/s is valid input but a huge trace).
    let opts = IostatOptions { device_size: 1 << 30, max_requests: 100_000, ..Default::default() };
    if let Ok(t) = import(format, text, &opts) {
        assert!(t.records.iter().all(|r| r.offset.checked_add(r.len).is_some()));
    }
}

pub fn trace_segment(data: &[u8]) {
    use surge_trace::reader::parse_segment;
    let Ok((h, recs, _cut)) = parse_segment(data) else { return };
    let dir = std::env::temp_dir().join(format!("surge-fuzz-seg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut w = surge_trace::SegmentWriter::create(&dir, h, surge_trace::Limits { segment_bytes: u64::MAX / 2, max_bytes: u64::MAX }).expect("a fresh dir");
    for r in &recs {
        w.push(r).expect("writing a segment");
    }
    w.finish().expect("closing a segment");
    let back = surge_trace::Trace::open(&dir).expect("a re-written segment reads");
    let mut sorted = recs.clone();
    sorted.sort_by_key(|r| r.t_ns);
    assert_eq!(back.records, sorted, "a segment re-written read back differently");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Valid inputs to start from (also written to `corpus/` by the ignored test
/// `write_seed_corpus`).
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "nbd_handshake" => handshake_seeds(),
        "nbd_requests" => request_seeds(),
        "cache_meta" => meta_seeds(),
        "bb_frames" => bb_frame_seeds(),
        "trace_import" => [
            (0u8, include_str!("../../crates/surge/tests/data/blkparse-sample.txt")),
            (1, include_str!("../../crates/surge-trace/tests/data/fio-v3-sync.iolog")),
            (1, "fio version 2 iolog\n/dev/x add\n/dev/x open\n/dev/x write 0 4096\n/dev/x wait 100\n/dev/x read 0 512\n/dev/x close\n"),
            (2, include_str!("../../crates/surge-trace/tests/data/iostat-x.txt")),
        ]
        .iter()
        .map(|(w, s)| [&[*w][..], s.as_bytes()].concat())
        .collect(),
        "trace_segment" => trace_segment_seeds(),
        "fault_rules" => [
            "",
            "write.fail_nth=100,read.fail_prob=0.01,latency=5ms,tear_nth=3,vanish_after=1000",
            "flush.fail_every=2,flush.errno=enospc,discard.drop,zeroes.latency=250us,volatile,seed=9",
            "read.fail_prob=0.5,write.latency=1.5s,flush.drop",
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect(),
        _ => Vec::new(),
    }
}

/// A small valid segment (every op, FUA, out-of-order times) and an empty one.
fn trace_segment_seeds() -> Vec<Vec<u8>> {
    use surge_trace::{Header, Limits, Op, Rec, SegmentWriter, Source};
    let mut out = Vec::new();
    for n in [0u64, 24] {
        let dir = std::env::temp_dir().join(format!("surge-fuzz-seed-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut w = SegmentWriter::create(&dir, Header::new(Source::SurgeRecord, "seed"), Limits::default()).unwrap();
        let ops = [Op::Read, Op::Write, Op::Flush, Op::Trim, Op::Zero, Op::Dropped];
        for i in 0..n {
            let t_ns = i * 1000 + if i % 5 == 0 { 0 } else { 300 };
            w.push(&Rec { t_ns, op: ops[i as usize % 6], offset: i * 4096, len: 4096, fua: i % 4 == 1, dur_ns: i * 10 }).unwrap();
        }
        w.finish().unwrap();
        out.push(std::fs::read(dir.join("seg-000001.strace")).unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
    out
}

fn option(buf: &mut Vec<u8>, opt: u32, data: &[u8]) {
    buf.extend_from_slice(&IHAVEOPT.to_be_bytes());
    buf.extend_from_slice(&opt.to_be_bytes());
    buf.extend_from_slice(&(data.len() as u32).to_be_bytes());
    buf.extend_from_slice(data);
}

fn name_and_infos(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

fn meta_query(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

fn request(buf: &mut Vec<u8>, flags: u16, cmd: u16, cookie: u64, offset: u64, len: u32) {
    buf.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    buf.extend_from_slice(&flags.to_be_bytes());
    buf.extend_from_slice(&cmd.to_be_bytes());
    buf.extend_from_slice(&cookie.to_be_bytes());
    buf.extend_from_slice(&offset.to_be_bytes());
    buf.extend_from_slice(&len.to_be_bytes());
    if cmd == CMD_WRITE {
        buf.extend((0..len).map(|i| i as u8));
    }
}

/// A mix of every command, including some out of range.
fn some_requests(buf: &mut Vec<u8>) {
    request(buf, 0, CMD_WRITE, 1, 0, 512);
    request(buf, CMD_FLAG_FUA, CMD_WRITE, 2, 4096, 100);
    request(buf, 0, CMD_READ, 3, 0, 4096);
    request(buf, CMD_FLAG_DF, CMD_READ, 4, 512, 8192);
    request(buf, 0, CMD_FLUSH, 5, 0, 0);
    request(buf, 0, CMD_TRIM, 6, 65536, 65536);
    request(buf, CMD_FLAG_NO_HOLE, CMD_WRITE_ZEROES, 7, 0, 1024);
    request(buf, CMD_FLAG_FAST_ZERO, CMD_WRITE_ZEROES, 8, 8192, 4096);
    request(buf, 0, CMD_CACHE, 9, 0, 65536);
    request(buf, CMD_FLAG_REQ_ONE, CMD_BLOCK_STATUS, 10, 0, 1 << 20);
    request(buf, 0, CMD_READ, 11, (1 << 20) - 10, 100); // past the end
    request(buf, 0, CMD_DISC, 12, 0, 0);
}

fn handshake_seeds() -> Vec<Vec<u8>> {
    let flags = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes();
    let mut out = Vec::new();
    // Structured replies, base:allocation, GO, then requests.
    let mut s = flags.to_vec();
    option(&mut s, OPT_STRUCTURED_REPLY, &[]);
    option(&mut s, OPT_LIST_META_CONTEXT, &meta_query("disk", &["base:"]));
    option(&mut s, OPT_SET_META_CONTEXT, &meta_query("disk", &["base:allocation"]));
    option(&mut s, OPT_GO, &name_and_infos("disk", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]));
    some_requests(&mut s);
    out.push(s);
    // LIST, INFO on both exports and a missing one, then the old EXPORT_NAME.
    let mut s = flags.to_vec();
    option(&mut s, OPT_LIST, &[]);
    option(&mut s, OPT_INFO, &name_and_infos("ro", &[INFO_EXPORT]));
    option(&mut s, OPT_INFO, &name_and_infos("nosuch", &[]));
    option(&mut s, OPT_EXPORT_NAME, b"disk");
    some_requests(&mut s);
    out.push(s);
    // Unknown and refused options, then ABORT.
    let mut s = flags.to_vec();
    option(&mut s, OPT_STARTTLS, &[]);
    option(&mut s, OPT_EXTENDED_HEADERS, &[]);
    option(&mut s, 999, b"junk");
    option(&mut s, OPT_ABORT, &[]);
    out.push(s);
    // GO on the read-only export without structured replies; writes must fail.
    let mut s = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
    option(&mut s, OPT_GO, &name_and_infos("ro", &[]));
    some_requests(&mut s);
    out.push(s);
    out
}

fn request_seeds() -> Vec<Vec<u8>> {
    (0u8..8)
        .map(|mode| {
            let mut s = vec![mode];
            some_requests(&mut s);
            s
        })
        .collect()
}

fn meta_seeds() -> Vec<Vec<u8>> {
    let m = |entries: Vec<(u64, u32)>| meta::Meta { seq: 3, block_size: 65536, nslots: 64, backing_size: 1 << 30, cache_id: 7, entries }.encode();
    vec![m(vec![]), m(vec![(0, 0), (5, 63), (16383, 7)]), m((0..40).map(|i| (i * 3, i as u32)).collect())]
}

/// One stream of every request kind, and one of responses.
fn bb_frame_seeds() -> Vec<Vec<u8>> {
    use surge_bb::proto::{encode_request, encode_response, ChunkId, Request, Response, Status};
    let chunk = ChunkId { ino: 7, idx: 3, ver: 1 << 32 };
    let requests = [
        Request::Put { chunk, dirty: true, data: b"chunk bytes".to_vec() },
        Request::Get { chunk },
        Request::Delete { chunk },
        Request::MarkClean { chunk },
        Request::Stat,
        Request::Has { chunk },
        Request::Drain,
    ];
    let responses = [
        Response { status: Status::Ok, body: b"chunk bytes".to_vec() },
        Response { status: Status::NotFound, body: vec![] },
        Response { status: Status::NoSpace, body: b"node full".to_vec() },
        Response { status: Status::BadRequest, body: vec![] },
    ];
    vec![
        requests.iter().enumerate().flat_map(|(i, r)| encode_request(i as u64, r)).collect(),
        responses.iter().enumerate().flat_map(|(i, r)| encode_response(i as u64, r)).collect(),
    ]
}
