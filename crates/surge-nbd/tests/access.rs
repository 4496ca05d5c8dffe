//! Export allow-lists on the wire: what a client outside the list sees on
//! LIST, INFO, GO, EXPORT_NAME and the meta-context options, over unix and TCP.

use std::sync::Arc;
use surge_block::MemoryDev;
use surge_nbd::client::Handshake;
use surge_nbd::proto::*;
use surge_nbd::{AllowList, Export, Listen, Server, ServerConfig};

/// Exports: "open" (everyone), "local" (127.0.0.1 only), "net" (10.0.0.0/8),
/// "sock" (unix clients only). "open" is first: it answers to "".
fn start(dir: &std::path::Path) -> (Server, std::path::PathBuf, std::net::SocketAddr) {
    let export = |name: &str, allow: Option<&str>| {
        let mut e = Export::new(name, Arc::new(MemoryDev::new(1 << 20)));
        e.allow = allow.map(|a| a.parse::<AllowList>().unwrap());
        e
    };
    let cfg = ServerConfig::new(vec![
        export("open", None),
        export("local", Some("127.0.0.1")),
        export("net", Some("10.0.0.0/8")),
        export("sock", Some("unix")),
    ]);
    let server = Server::start(cfg).unwrap();
    let sock = dir.join("s");
    server.listen(&Listen::Unix(sock.clone())).unwrap();
    server.listen(&Listen::Tcp("127.0.0.1:0".parse().unwrap())).unwrap();
    let tcp = server
        .local_addrs()
        .into_iter()
        .find_map(|l| match l {
            Listen::Tcp(a) => Some(a),
            _ => None,
        })
        .unwrap();
    (server, sock, tcp)
}

fn names(h: &mut Handshake) -> Vec<String> {
    h.list().unwrap().into_iter().map(|e| e.name).collect()
}

#[test]
fn list_shows_only_the_exports_a_client_may_use() {
    let dir = tempfile::tempdir().unwrap();
    let (server, sock, tcp) = start(dir.path());
    let mut h = Handshake::connect_tcp(tcp).unwrap();
    assert_eq!(names(&mut h), ["open", "local"]);
    h.abort().unwrap();
    let mut h = Handshake::connect_unix(&sock).unwrap();
    assert_eq!(names(&mut h), ["open", "sock"]);
    h.abort().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn info_and_go_answer_err_policy_outside_the_list_and_work_inside_it() {
    let dir = tempfile::tempdir().unwrap();
    let (server, sock, tcp) = start(dir.path());
    let mut h = Handshake::connect_tcp(tcp).unwrap();
    let e = h.info("net").unwrap_err();
    assert_eq!(e.option_reply(), Some(REP_ERR_POLICY), "{e}");
    assert!(e.to_string().contains("127.0.0.1"), "{e}");
    assert_eq!(h.info("sock").unwrap_err().option_reply(), Some(REP_ERR_POLICY));
    // Unknown names stay UNKNOWN (a refusal is not confused with absence).
    assert_eq!(h.info("nope").unwrap_err().option_reply(), Some(REP_ERR_UNKNOWN));
    // The refusal leaves the session usable.
    assert_eq!(h.info("local").unwrap().size, 1 << 20);
    let reply = h.option_raw(OPT_GO, &encode_info_request("net", &[])).unwrap();
    assert_eq!(reply.last().unwrap().reply, REP_ERR_POLICY);
    let mut c = h.go("local").unwrap();
    c.write(0, &[7u8; 512], false).unwrap();
    c.disconnect().unwrap();

    let mut h = Handshake::connect_unix(&sock).unwrap();
    assert_eq!(h.info("local").unwrap_err().option_reply(), Some(REP_ERR_POLICY));
    let mut c = h.go("sock").unwrap();
    let mut buf = [0u8; 512];
    c.read(0, &mut buf).unwrap();
    c.disconnect().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn meta_context_options_do_not_leak_a_refused_export() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _sock, tcp) = start(dir.path());
    let mut h = Handshake::connect_tcp(tcp).unwrap();
    assert!(h.structured_replies().unwrap());
    let e = h.list_meta_contexts("net", &[]).unwrap_err();
    assert_eq!(e.option_reply(), Some(REP_ERR_POLICY), "{e}");
    let e = h.set_meta_context("net", &["base:allocation"]).unwrap_err();
    assert_eq!(e.option_reply(), Some(REP_ERR_POLICY), "{e}");
    assert_eq!(h.set_meta_context("local", &["base:allocation"]).unwrap().len(), 1);
    h.abort().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn export_name_outside_the_list_closes_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _sock, tcp) = start(dir.path());
    let h = Handshake::connect_tcp(tcp).unwrap();
    assert!(h.export_name("net").is_err(), "a refused export must not enter transmission");
    let h = Handshake::connect_tcp(tcp).unwrap();
    let mut c = h.export_name("local").unwrap();
    c.flush().unwrap();
    c.disconnect().unwrap();
    let st = server.stats();
    let conns = |n: &str| st.exports.iter().find(|e| e.name == n).unwrap().connections;
    assert_eq!((conns("net"), conns("local")), (0, 1));
    server.shutdown().unwrap();
}

#[test]
fn the_default_export_obeys_the_first_exports_list() {
    let dir = tempfile::tempdir().unwrap();
    let mut e = Export::new("only", Arc::new(MemoryDev::new(1 << 20)));
    e.allow = Some("10.0.0.0/8".parse().unwrap());
    let server = Server::start(ServerConfig::new(vec![e])).unwrap();
    let sock = dir.path().join("s");
    server.listen(&Listen::Unix(sock.clone())).unwrap();
    let mut h = Handshake::connect_unix(&sock).unwrap();
    assert!(names(&mut h).is_empty());
    assert_eq!(h.info("").unwrap_err().option_reply(), Some(REP_ERR_POLICY));
    h.abort().unwrap();
    server.shutdown().unwrap();
}
