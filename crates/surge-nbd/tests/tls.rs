//! NBD_OPT_STARTTLS: the option rules in every mode, and real TLS clients
//! (libnbd's nbdinfo and nbdcopy) against a certificate made by a test CA.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use surge_block::MemoryDev;
use surge_nbd::client::Handshake;
use surge_nbd::proto::*;
use surge_nbd::{tls, Export, Listen, Server, ServerConfig, TlsMode};

fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn have(tool: &str) -> bool {
    Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().map(|o| o.status.success()).unwrap_or(false)
}

/// A CA and a server certificate for "localhost", in the qemu/libnbd layout.
fn make_certs(dir: &Path) {
    let ossl = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(dir));
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    ossl(&[&["req", "-x509"], &ec[..], &["-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", "2", "-subj", "/CN=surge-test-ca"]].concat());
    ossl(&[&["req"], &ec[..], &["-keyout", "server-key.pem", "-out", "server.csr", "-subj", "/CN=localhost"]].concat());
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    ossl(&[
        "x509", "-req", "-in", "server.csr", "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem", "-CAcreateserial", "-out",
        "server-cert.pem", "-days", "2", "-extfile", "ext.cnf",
    ]);
}

fn start(mode: TlsMode, certs: Option<&Path>, sock: &Path) -> Server {
    let mut cfg = ServerConfig::new(vec![Export::new("disk", Arc::new(MemoryDev::new(32 << 20)))]);
    cfg.tls_mode = mode;
    cfg.tls = certs.map(|d| tls::server_config_from_dir(d).unwrap());
    let server = Server::start(cfg).unwrap();
    server.listen(&Listen::Unix(sock.to_path_buf())).unwrap();
    server
}

#[test]
fn starttls_is_refused_with_err_policy_when_tls_is_off() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let server = start(TlsMode::Off, None, &sock);
    let mut h = Handshake::connect_unix(&sock).unwrap();
    assert_eq!(h.option_raw(OPT_STARTTLS, &[]).unwrap()[0].reply, REP_ERR_POLICY);
    // The session goes on in plain text.
    assert_eq!(h.info("").unwrap().size, 32 << 20);
    h.abort().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn tls_mode_without_a_certificate_is_a_config_error() {
    let mut cfg = ServerConfig::new(vec![Export::new("d", Arc::new(MemoryDev::new(1 << 20)))]);
    cfg.tls_mode = TlsMode::Require;
    assert!(Server::start(cfg).is_err());
}

#[test]
fn require_mode_answers_tls_reqd_until_starttls_and_closes_on_export_name() {
    if !have("openssl") {
        eprintln!("SKIP: openssl not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let sock = dir.path().join("s");
    let server = start(TlsMode::Require, Some(dir.path()), &sock);
    let mut h = Handshake::connect_unix(&sock).unwrap();
    assert_eq!(h.option_raw(OPT_LIST, &[]).unwrap()[0].reply, REP_ERR_TLS_REQD);
    assert_eq!(h.info("").unwrap_err().option_reply(), Some(REP_ERR_TLS_REQD));
    assert_eq!(h.option_raw(OPT_STARTTLS, b"x").unwrap()[0].reply, REP_ERR_INVALID, "STARTTLS takes no data");
    assert_eq!(h.option_raw(OPT_STARTTLS, &[]).unwrap()[0].reply, REP_ACK);
    drop(h);
    // NBD_OPT_EXPORT_NAME cannot be refused with an error: the server closes.
    assert!(Handshake::connect_unix(&sock).unwrap().export_name("").is_err());
    server.shutdown().unwrap();
}

#[test]
fn libnbd_clients_use_the_export_over_tls() {
    if !have("openssl") || !have("nbdinfo") || !have("nbdcopy") {
        eprintln!("SKIP: openssl, nbdinfo or nbdcopy not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let sock = dir.path().join("s");
    let server = start(TlsMode::Require, Some(dir.path()), &sock);
    let uri = format!("nbds+unix:///?socket={}&tls-certificates={}", sock.display(), dir.path().display());
    let out = run(Command::new("nbdinfo").arg("--json").arg(&uri));
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(json.contains("\"TLS\": true"), "{json}");
    assert!(json.contains("\"export-size\": 33554432"), "{json}");
    // Data through TLS both ways, with nbdcopy's parallel requests.
    let src = dir.path().join("src.raw");
    let back = dir.path().join("back.raw");
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").arg(&src).arg(&uri));
    run(Command::new("nbdcopy").arg(&uri).arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert_eq!(&got[..data.len()], &data[..]);
    // Without TLS the same server refuses to serve.
    let plain = format!("nbd+unix:///?socket={}", sock.display());
    assert!(!Command::new("nbdinfo").arg(&plain).output().unwrap().status.success());
    server.shutdown().unwrap();
}

#[test]
fn allow_mode_serves_plain_and_tls_clients() {
    if !have("openssl") || !have("nbdinfo") {
        eprintln!("SKIP: openssl or nbdinfo not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let sock = dir.path().join("s");
    let server = start(TlsMode::Allow, Some(dir.path()), &sock);
    let tls_uri = format!("nbds+unix:///?socket={}&tls-certificates={}", sock.display(), dir.path().display());
    let plain_uri = format!("nbd+unix:///?socket={}", sock.display());
    let tls_json = String::from_utf8(run(Command::new("nbdinfo").arg("--json").arg(&tls_uri)).stdout).unwrap();
    let plain_json = String::from_utf8(run(Command::new("nbdinfo").arg("--json").arg(&plain_uri)).stdout).unwrap();
    assert!(tls_json.contains("\"TLS\": true"), "{tls_json}");
    assert!(plain_json.contains("\"TLS\": false"), "{plain_json}");
    server.shutdown().unwrap();
}

#[test]
fn remote_device_speaks_tls_for_nbds_uris_and_checks_the_certificate() {
    use surge_block::BlockDev;
    use surge_nbd::{NbdUri, RemoteDev, RemoteOptions};
    if !have("openssl") {
        eprintln!("SKIP: openssl not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let sock = dir.path().join("s");
    let server = start(TlsMode::Require, Some(dir.path()), &sock);
    let uri = |q: &str| -> NbdUri { format!("nbds+unix:///disk?socket={}{q}", sock.display()).parse().unwrap() };
    let dev = RemoteDev::open(&uri(&format!("&tls-certificates={}", dir.path().display())), RemoteOptions::default()).unwrap();
    dev.write_at(&[7u8; 65536], 4096, false).unwrap();
    let mut b = vec![0u8; 65536];
    dev.read_at(&mut b, 4096).unwrap();
    assert_eq!(b, vec![7u8; 65536]);
    drop(dev);
    // No CA: refused before connecting. A name the certificate lacks: refused.
    let e = RemoteDev::open(&uri(""), RemoteOptions::default()).err().unwrap().to_string();
    assert!(e.contains("tls-certificates"), "{e}");
    let bad = uri(&format!("&tls-certificates={}&tls-hostname=elsewhere", dir.path().display()));
    let e = RemoteDev::open(&bad, RemoteOptions::default()).err().unwrap().to_string();
    assert!(e.contains("TLS"), "{e}");
    // A plain nbd:// client cannot use a TLS-only server.
    let plain: NbdUri = format!("nbd+unix:///disk?socket={}", sock.display()).parse().unwrap();
    assert!(RemoteDev::open(&plain, RemoteOptions::default()).is_err());
    server.shutdown().unwrap();
}
