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

/// A server in `mode` with fresh certificates on a unix socket in a temp dir,
/// or None (after printing SKIP) when one of `tools` is not installed.
fn tls_server(mode: TlsMode, tools: &[&str]) -> Option<(tempfile::TempDir, std::path::PathBuf, Server)> {
    if let Some(t) = tools.iter().find(|t| !have(t)) {
        eprintln!("SKIP: {t} not installed");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let sock = dir.path().join("s");
    let server = start(mode, Some(dir.path()), &sock);
    Some((dir, sock, server))
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
    let Some((_dir, sock, server)) = tls_server(TlsMode::Require, &["openssl"]) else { return };
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
    let Some((dir, sock, server)) = tls_server(TlsMode::Require, &["openssl", "nbdinfo", "nbdcopy"]) else { return };
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
    let Some((dir, sock, server)) = tls_server(TlsMode::Allow, &["openssl", "nbdinfo"]) else { return };
    let tls_uri = format!("nbds+unix:///?socket={}&tls-certificates={}", sock.display(), dir.path().display());
    let plain_uri = format!("nbd+unix:///?socket={}", sock.display());
    let tls_json = String::from_utf8(run(Command::new("nbdinfo").arg("--json").arg(&tls_uri)).stdout).unwrap();
    let plain_json = String::from_utf8(run(Command::new("nbdinfo").arg("--json").arg(&plain_uri)).stdout).unwrap();
    assert!(tls_json.contains("\"TLS\": true"), "{tls_json}");
    assert!(plain_json.contains("\"TLS\": false"), "{plain_json}");
    server.shutdown().unwrap();
}

/// A client certificate signed by the CA in `dir` (client-cert.pem, client-key.pem
/// in `out`, the layout libnbd and qemu read), or self-signed with `ca: None`.
fn make_client_cert(dir: &Path, out: &Path, ca: Option<&Path>) {
    std::fs::create_dir_all(out).unwrap();
    let ossl = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(out));
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    std::fs::write(out.join("ext.cnf"), "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n").unwrap();
    match ca {
        None => {
            ossl(&[&["req", "-x509"], &ec[..], &["-keyout", "client-key.pem", "-out", "client-cert.pem", "-days", "2", "-subj", "/CN=self-signed-client"]].concat());
        }
        Some(ca) => {
            ossl(&[&["req"], &ec[..], &["-keyout", "client-key.pem", "-out", "client.csr", "-subj", "/CN=surge-test-client"]].concat());
            let (cert, key) = (ca.join("ca-cert.pem"), ca.join("ca-key.pem"));
            ossl(&[
                "x509", "-req", "-in", "client.csr", "-CA", cert.to_str().unwrap(), "-CAkey", key.to_str().unwrap(), "-CAcreateserial",
                "-out", "client-cert.pem", "-days", "2", "-extfile", "ext.cnf",
            ]);
        }
    }
    std::fs::copy(dir.join("ca-cert.pem"), out.join("ca-cert.pem")).unwrap();
}

/// A rustls client trusting the CA in `ca_dir`, presenting `client` (dir with
/// client-cert.pem and client-key.pem) if given.
fn rustls_client(ca_dir: &Path, client: Option<&Path>) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(ca_dir.join("ca-cert.pem")).unwrap()).unwrap();
    let b = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    Arc::new(match client {
        None => b.with_no_client_auth(),
        Some(d) => {
            let certs = CertificateDer::pem_file_iter(d.join("client-cert.pem")).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
            b.with_client_auth_cert(certs, PrivateKeyDer::from_pem_file(d.join("client-key.pem")).unwrap()).unwrap()
        }
    })
}

/// Greeting, fixed-newstyle flags, NBD_OPT_STARTTLS acknowledged: the plain socket, ready for TLS.
fn raw_starttls(sock: &Path) -> std::os::unix::net::UnixStream {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes()).unwrap();
    s.write_all(&encode_option_header(OPT_STARTTLS, 0)).unwrap();
    let mut r = [0u8; 20];
    s.read_exact(&mut r).unwrap();
    assert_eq!(parse_option_reply_header(&r).unwrap().reply, REP_ACK);
    s
}

type TlsStream = rustls::StreamOwned<rustls::ClientConnection, std::os::unix::net::UnixStream>;

/// A TLS session to "localhost" after STARTTLS (the handshake runs on first use).
fn tls_stream(sock: &Path, cfg: Arc<rustls::ClientConfig>) -> TlsStream {
    let conn = rustls::ClientConnection::new(cfg, "localhost".try_into().unwrap()).unwrap();
    rustls::StreamOwned::new(conn, raw_starttls(sock))
}

/// Runs NBD_OPT_LIST over TLS; `Ok(names)` or the error that ended the session.
fn tls_list(sock: &Path, cfg: Arc<rustls::ClientConfig>) -> std::io::Result<usize> {
    use std::io::{Read, Write};
    let mut t = tls_stream(sock, cfg);
    t.write_all(&encode_option_header(OPT_LIST, 0))?;
    let mut n = 0;
    loop {
        let mut r = [0u8; 20];
        t.read_exact(&mut r)?;
        let h = parse_option_reply_header(&r).unwrap();
        let mut d = vec![0u8; h.len as usize];
        t.read_exact(&mut d)?;
        if h.reply != REP_SERVER {
            return Ok(n);
        }
        n += 1;
    }
}

// Issue 10 item 8: "The server MUST operate in NOTLS mode unless ... the client
// replied with NBD_FLAG_C_FIXED_NEWSTYLE".
#[test]
fn starttls_is_refused_to_a_client_without_fixed_newstyle() {
    use std::io::{Read, Write};
    if !have("openssl") {
        eprintln!("SKIP: openssl not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    for mode in [TlsMode::Allow, TlsMode::Require] {
        let sock = dir.path().join(format!("s-{mode:?}"));
        let server = start(mode, Some(dir.path()), &sock);
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        s.write_all(&FLAG_C_NO_ZEROES.to_be_bytes()).unwrap();
        s.write_all(&encode_option_header(OPT_STARTTLS, 0)).unwrap();
        let mut r = [0u8; 20];
        s.read_exact(&mut r).unwrap();
        let h = parse_option_reply_header(&r).unwrap();
        assert!(h.reply != REP_ACK && h.reply & (1 << 31) != 0, "{mode:?}: STARTTLS answered {:#x}", h.reply);
        let mut msg = vec![0u8; h.len as usize];
        s.read_exact(&mut msg).unwrap();
        if mode == TlsMode::Require {
            // Not TLS_REQD either: such a client can never start TLS.
            s.write_all(&encode_option_header(OPT_LIST, 0)).unwrap();
            s.read_exact(&mut r).unwrap();
            let h = parse_option_reply_header(&r).unwrap();
            assert!(h.reply != REP_ERR_TLS_REQD && h.reply & (1 << 31) != 0, "LIST answered {:#x}", h.reply);
        }
        drop(s);
        server.shutdown().unwrap();
    }
}

// Issue 10 item 8: a TLS session that ends during option haggling (ABORT) is
// shut down with close_notify before the socket closes.
#[test]
fn a_tls_session_ending_during_negotiation_gets_close_notify() {
    use std::io::{Read, Write};
    let Some((dir, sock, server)) = tls_server(TlsMode::Require, &["openssl"]) else { return };
    let mut t = tls_stream(&sock, rustls_client(dir.path(), None));
    t.write_all(&encode_option_header(OPT_ABORT, 0)).unwrap();
    let mut r = [0u8; 20];
    t.read_exact(&mut r).unwrap();
    assert_eq!(parse_option_reply_header(&r).unwrap().reply, REP_ACK);
    let mut rest = Vec::new();
    // rustls reports a close without close_notify as UnexpectedEof.
    t.read_to_end(&mut rest).expect("the server must send close_notify before closing");
    assert!(rest.is_empty());
    server.shutdown().unwrap();
}

// Issue 10 item 11: with peer verification the server wants a client
// certificate signed by its CA (ca-cert.pem beside the server's certificate).
#[test]
fn verify_peer_admits_only_clients_with_a_certificate_from_the_ca() {
    if !have("openssl") {
        eprintln!("SKIP: openssl not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let good = dir.path().join("good");
    make_client_cert(dir.path(), &good, Some(dir.path()));
    let selfsigned = dir.path().join("self");
    make_client_cert(dir.path(), &selfsigned, None);
    let other_ca = dir.path().join("other-ca");
    std::fs::create_dir_all(&other_ca).unwrap();
    make_certs(&other_ca);
    let wrong = dir.path().join("wrong");
    make_client_cert(dir.path(), &wrong, Some(&other_ca));

    let mut cfg = ServerConfig::new(vec![Export::new("disk", Arc::new(MemoryDev::new(1 << 20)))]);
    cfg.tls_mode = TlsMode::Require;
    cfg.tls = Some(tls::server_config(dir.path(), true).unwrap());
    let server = Server::start(cfg).unwrap();
    let sock = dir.path().join("s");
    server.listen(&Listen::Unix(sock.clone())).unwrap();

    assert_eq!(tls_list(&sock, rustls_client(dir.path(), Some(&good))).unwrap(), 1, "a client certificate from the CA");
    for (what, client) in [("no certificate", None), ("self-signed", Some(&selfsigned)), ("another CA", Some(&wrong))] {
        let r = tls_list(&sock, rustls_client(dir.path(), client.map(|p| p.as_path())));
        assert!(r.is_err(), "{what}: admitted");
    }
    // Without verification the same certificate-less client is served.
    let mut cfg = ServerConfig::new(vec![Export::new("disk", Arc::new(MemoryDev::new(1 << 20)))]);
    cfg.tls_mode = TlsMode::Require;
    cfg.tls = Some(tls::server_config(dir.path(), false).unwrap());
    let open = Server::start(cfg).unwrap();
    let sock2 = dir.path().join("s2");
    open.listen(&Listen::Unix(sock2.clone())).unwrap();
    assert_eq!(tls_list(&sock2, rustls_client(dir.path(), None)).unwrap(), 1);
    open.shutdown().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn verify_peer_without_a_ca_certificate_is_a_clear_error() {
    if !have("openssl") {
        eprintln!("SKIP: openssl not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    std::fs::remove_file(dir.path().join("ca-cert.pem")).unwrap();
    let err = tls::server_config(dir.path(), true).expect_err("must fail").to_string();
    assert!(err.contains("ca-cert.pem"), "{err}");
}

#[test]
fn remote_device_speaks_tls_for_nbds_uris_and_checks_the_certificate() {
    use surge_block::BlockDev;
    use surge_nbd::{NbdUri, RemoteDev, RemoteOptions};
    let Some((dir, sock, server)) = tls_server(TlsMode::Require, &["openssl"]) else { return };
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

// Issue 38 item 8: an upstream that requires client certificates is usable
// from nbds:// URIs: client-cert.pem and client-key.pem beside ca-cert.pem.
#[test]
fn remote_device_presents_the_client_certificate_in_its_tls_directory() {
    use surge_block::BlockDev;
    use surge_nbd::{NbdUri, RemoteDev, RemoteOptions};
    if !have("openssl") {
        eprintln!("SKIP: openssl not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let client = dir.path().join("client");
    make_client_cert(dir.path(), &client, Some(dir.path()));
    let mut cfg = ServerConfig::new(vec![Export::new("disk", Arc::new(MemoryDev::new(1 << 20)))]);
    cfg.tls_mode = TlsMode::Require;
    cfg.tls = Some(tls::server_config(dir.path(), true).unwrap());
    let server = Server::start(cfg).unwrap();
    let sock = dir.path().join("s");
    server.listen(&Listen::Unix(sock.clone())).unwrap();
    let uri = |certs: &Path| -> NbdUri { format!("nbds+unix:///disk?socket={}&tls-certificates={}", sock.display(), certs.display()).parse().unwrap() };
    let dev = RemoteDev::open(&uri(&client), RemoteOptions::default()).unwrap();
    dev.write_at(&[9u8; 4096], 0, false).unwrap();
    let mut b = vec![0u8; 4096];
    dev.read_at(&mut b, 0).unwrap();
    assert_eq!(b, vec![9u8; 4096]);
    drop(dev);
    // The CA alone (no client certificate): the server refuses the session.
    let ca_only = dir.path().join("ca-only");
    std::fs::create_dir_all(&ca_only).unwrap();
    std::fs::copy(dir.path().join("ca-cert.pem"), ca_only.join("ca-cert.pem")).unwrap();
    assert!(RemoteDev::open(&uri(&ca_only), RemoteOptions::default()).is_err(), "served without a client certificate");
    // Half an identity is a configuration error, not a silent downgrade.
    std::fs::copy(client.join("client-cert.pem"), ca_only.join("client-cert.pem")).unwrap();
    let e = tls::client_config_from_dir(&ca_only).err().unwrap().to_string();
    assert!(e.contains("client-key.pem"), "{e}");
    server.shutdown().unwrap();
}

// Issue 38 item 10: certificates are reloaded without a restart.
#[test]
fn set_tls_swaps_the_certificate_for_new_sessions() {
    if !have("openssl") {
        eprintln!("SKIP: openssl not installed");
        return;
    }
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    make_certs(a.path());
    make_certs(b.path());
    let sock = a.path().join("s");
    let server = start(TlsMode::Require, Some(a.path()), &sock);
    assert_eq!(tls_list(&sock, rustls_client(a.path(), None)).unwrap(), 1);
    assert!(tls_list(&sock, rustls_client(b.path(), None)).is_err(), "CA b trusted before the swap");
    server.set_tls(tls::server_config_from_dir(b.path()).unwrap()).unwrap();
    assert_eq!(tls_list(&sock, rustls_client(b.path(), None)).unwrap(), 1, "new sessions use the new certificate");
    assert!(tls_list(&sock, rustls_client(a.path(), None)).is_err(), "the old certificate is still served");
    server.shutdown().unwrap();
    // A server started without TLS cannot be given it live.
    let plain = start(TlsMode::Off, None, &a.path().join("p"));
    assert!(plain.set_tls(tls::server_config_from_dir(b.path()).unwrap()).is_err());
    plain.shutdown().unwrap();
}
