//! Security of `surge serve` end to end (issue 6, item 5): TLS with real
//! clients (libnbd's nbdinfo/nbdcopy with nbds://, qemu-img with a
//! tls-creds-x509 object) against certificates made here by a test CA (openssl
//! and GnuTLS certtool), export allow-lists by client address, and the refusal
//! to listen off the machine without TLS or --insecure.
//! A missing tool fails the test, naming the Debian package to install.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Test PKI: `server/` (server-cert.pem, server-key.pem, as `--tls-certs`
/// wants), `client/` (ca-cert.pem of the CA that signed it, as libnbd's
/// tls-certificates= and qemu's tls-creds-x509 want) and `wrong/` (ca-cert.pem
/// of an unrelated CA).
struct Pki {
    server: PathBuf,
    client: PathBuf,
    wrong: PathBuf,
}

fn ossl(dir: &Path, args: &[&str]) {
    let openssl = require("openssl", "openssl");
    run_ok(Command::new(openssl).args(args).current_dir(dir));
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

/// A self-signed CA in `dir` (ca-cert.pem, ca-key.pem).
fn openssl_ca(dir: &Path, cn: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let subj = format!("/CN={cn}");
    ossl(dir, &[&["req", "-x509", "-nodes"], &EC[..], &["-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", "2", "-subj", &subj]].concat());
}

/// The recipe of `surge serve --help` and docs/security.md, with openssl.
fn openssl_pki(root: &Path) -> Pki {
    let ca = root.join("ca");
    openssl_ca(&ca, "surge-test-ca");
    let server = root.join("server");
    std::fs::create_dir_all(&server).unwrap();
    ossl(&server, &[&["req", "-nodes"], &EC[..], &["-keyout", "server-key.pem", "-out", "server.csr", "-subj", "/CN=localhost"]].concat());
    std::fs::write(server.join("ext.cnf"), "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n").unwrap();
    let (ca_cert, ca_key) = (ca.join("ca-cert.pem"), ca.join("ca-key.pem"));
    ossl(
        &server,
        &[
            "x509", "-req", "-in", "server.csr", "-CA", ca_cert.to_str().unwrap(), "-CAkey", ca_key.to_str().unwrap(),
            "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", "server-cert.pem",
        ],
    );
    finish_pki(root, &ca_cert)
}

/// The certtool recipe of docs/security.md.
fn certtool_pki(root: &Path) -> Pki {
    let certtool = require("certtool", "gnutls-bin");
    let ca = root.join("ca");
    let server = root.join("server");
    std::fs::create_dir_all(&ca).unwrap();
    std::fs::create_dir_all(&server).unwrap();
    let ct = |dir: &Path, args: &[&str]| run_ok(Command::new(&certtool).args(args).current_dir(dir));
    std::fs::write(ca.join("ca.info"), "cn = surge test CA\nca\ncert_signing_key\nexpiration_days = 2\n").unwrap();
    ct(&ca, &["--generate-privkey", "--outfile", "ca-key.pem"]);
    ct(&ca, &["--generate-self-signed", "--load-privkey", "ca-key.pem", "--template", "ca.info", "--outfile", "ca-cert.pem"]);
    std::fs::write(
        server.join("server.info"),
        "cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\nencryption_key\nsigning_key\nexpiration_days = 2\n",
    )
    .unwrap();
    let (ca_cert, ca_key) = (ca.join("ca-cert.pem"), ca.join("ca-key.pem"));
    ct(&server, &["--generate-privkey", "--outfile", "server-key.pem"]);
    ct(
        &server,
        &[
            "--generate-certificate", "--load-privkey", "server-key.pem", "--load-ca-certificate", ca_cert.to_str().unwrap(),
            "--load-ca-privkey", ca_key.to_str().unwrap(), "--template", "server.info", "--outfile", "server-cert.pem",
        ],
    );
    finish_pki(root, &ca_cert)
}

fn finish_pki(root: &Path, ca_cert: &Path) -> Pki {
    let client = root.join("client");
    std::fs::create_dir_all(&client).unwrap();
    std::fs::copy(ca_cert, client.join("ca-cert.pem")).unwrap();
    let other = root.join("other-ca");
    openssl_ca(&other, "some-other-ca");
    let wrong = root.join("wrong");
    std::fs::create_dir_all(&wrong).unwrap();
    std::fs::copy(other.join("ca-cert.pem"), wrong.join("ca-cert.pem")).unwrap();
    Pki { server: root.join("server"), client, wrong }
}

fn nbdinfo(args: &[&str]) -> std::process::Output {
    run(Command::new(require("nbdinfo", "libnbd-bin")).args(args))
}

fn tls_uri(port: u16, export: &str, certs: &Path) -> String {
    format!("nbds://127.0.0.1:{port}/{export}?tls-certificates={}", certs.display())
}

/// `surge serve` on a temp unix socket plus tcp:127.0.0.1:PORT.
fn serve_tcp(port: u16, args: &[&str]) -> Surge {
    let listen = format!("tcp:127.0.0.1:{port}");
    Surge::start(&[&["--listen", listen.as_str()], args].concat())
}

fn fails(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "expected a refusal, got success:\n{}", text(&out.stdout));
    text(&out.stderr)
}

#[test]
fn tls_client_with_the_right_ca_connects_and_moves_data() {
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = openssl_pki(pki_dir.path());
    let port = free_port();
    let certs = pki.server.to_str().unwrap();
    let s = serve_tcp(port, &["--tls", "require", "--tls-certs", certs, "--export", "disk=memory:16MiB"]);
    assert!(s.stdout().contains("TLS is required") && s.stdout().contains("nbds://"), "{}", s.stdout());

    let uri = tls_uri(port, "disk", &pki.client);
    let out = nbdinfo(&["--json", &uri]);
    assert!(out.status.success(), "nbdinfo {uri}: {}", text(&out.stderr));
    let json = text(&out.stdout);
    assert!(json.contains("\"TLS\": true") && json.contains("\"export-size\": 16777216"), "{json}");

    // Data both ways through TLS, nbdcopy's parallel requests, over TCP and unix.
    let src = s.path("src.raw");
    random_file(&src, 4 << 20);
    let nbdcopy = require("nbdcopy", "libnbd-bin");
    run_ok(Command::new(&nbdcopy).arg(&src).arg(&uri));
    let unix_uri = format!("nbds+unix:///disk?socket={}&tls-certificates={}", s.sock.display(), pki.client.display());
    let back = s.path("back.raw");
    run_ok(Command::new(&nbdcopy).arg(&unix_uri).arg(&back));
    let got = std::fs::read(&back).unwrap();
    assert_eq!(&got[..4 << 20], &std::fs::read(&src).unwrap()[..], "data read back over TLS differs");

    // qemu's own TLS client (GnuTLS) with a tls-creds-x509 object.
    let qemu_img = require("qemu-img", "qemu-utils");
    let obj = format!("tls-creds-x509,id=tls0,dir={},endpoint=client", pki.client.display());
    let img = format!("driver=nbd,host=127.0.0.1,port={port},export=disk,tls-creds=tls0");
    let out = run_ok(Command::new(&qemu_img).args(["info", "--output=json", "--object", &obj, "--image-opts", &img]));
    assert!(text(&out.stdout).contains("\"virtual-size\": 16777216"), "{}", text(&out.stdout));
}

#[test]
fn tls_client_with_a_wrong_ca_is_refused() {
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = openssl_pki(pki_dir.path());
    let port = free_port();
    let s = serve_tcp(port, &["--tls", "require", "--tls-certs", pki.server.to_str().unwrap(), "--export", "disk=memory:1MiB"]);
    let err = fails(&nbdinfo(&[&tls_uri(port, "disk", &pki.wrong)]));
    assert!(err.to_lowercase().contains("certificate") || err.to_lowercase().contains("verif"), "{err}");
    let qemu_img = require("qemu-img", "qemu-utils");
    let obj = format!("tls-creds-x509,id=tls0,dir={},endpoint=client", pki.wrong.display());
    let img = format!("driver=nbd,host=127.0.0.1,port={port},export=disk,tls-creds=tls0");
    let out = run(Command::new(&qemu_img).args(["info", "--object", &obj, "--image-opts", &img]));
    assert!(!out.status.success(), "qemu-img accepted a server its CA did not sign");
    // The refusals were the client's: the right CA still works on the same server.
    assert!(nbdinfo(&["--size", &tls_uri(port, "disk", &pki.client)]).status.success(), "{}", s.logs());
}

#[test]
fn plaintext_clients_are_refused_when_tls_is_required() {
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = openssl_pki(pki_dir.path());
    let port = free_port();
    let s = serve_tcp(port, &["--tls", "require", "--tls-certs", pki.server.to_str().unwrap(), "--export", "disk=memory:1MiB"]);
    // The server answers NBD_REP_ERR_TLS_REQD (libnbd reports it as "not supported").
    let err = fails(&nbdinfo(&[&format!("nbd://127.0.0.1:{port}/disk")]));
    assert!(err.contains("opt_go") || err.to_lowercase().contains("tls"), "{err}");
    fails(&nbdinfo(&[&s.uri("disk")]));
    fails(&nbdinfo(&["--list", &format!("nbd://127.0.0.1:{port}")]));
    let qemu_img = require("qemu-img", "qemu-utils");
    let out = run(Command::new(&qemu_img).args(["info", &format!("nbd://127.0.0.1:{port}/disk")]));
    assert!(!out.status.success(), "qemu-img without TLS got in: {}", text(&out.stdout));
    // With TLS allowed instead, the same plaintext client is served.
    drop(s);
    let port = free_port();
    let _s = serve_tcp(port, &["--tls", "allow", "--tls-certs", pki.server.to_str().unwrap(), "--export", "disk=memory:1MiB"]);
    let out = nbdinfo(&["--size", &format!("nbd://127.0.0.1:{port}/disk")]);
    assert_eq!(text(&out.stdout).trim(), "1048576", "{}", text(&out.stderr));
}

#[test]
fn certificates_made_with_certtool_work_too() {
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = certtool_pki(pki_dir.path());
    let port = free_port();
    let _s = serve_tcp(port, &["--tls", "require", "--tls-certs", pki.server.to_str().unwrap(), "--export", "disk=memory:2MiB"]);
    let out = nbdinfo(&["--size", &tls_uri(port, "disk", &pki.client)]);
    assert_eq!(text(&out.stdout).trim(), "2097152", "{}", text(&out.stderr));
    fails(&nbdinfo(&["--size", &tls_uri(port, "disk", &pki.wrong)]));
}

#[test]
fn allow_lists_refuse_other_addresses_and_admit_allowed_ones() {
    let port = free_port();
    let s = serve_tcp(
        port,
        &[
            "--export", "open=memory:1MiB", "--export", "net10=memory:1MiB", "--export", "local=memory:2MiB",
            "--export", "sock=memory:3MiB", "--allow", "net10=10.0.0.0/8", "--allow", "local=127.0.0.1",
            "--allow", "sock=unix",
        ],
    );
    let tcp = |e: &str| format!("nbd://127.0.0.1:{port}/{e}");
    // From 127.0.0.1 over TCP: 10.0.0.0/8 and unix-only exports are refused...
    let err = fails(&nbdinfo(&["--size", &tcp("net10")]));
    assert!(err.contains("not available to clients at 127.0.0.1") || err.to_lowercase().contains("policy"), "{err}");
    fails(&nbdinfo(&["--size", &tcp("sock")]));
    // ... and hidden from the list, while allowed ones are listed and served.
    let list = text(&run_ok(Command::new(require("nbdinfo", "libnbd-bin")).args(["--list", "--json", &tcp("")])).stdout);
    assert!(list.contains("\"open\"") && list.contains("\"local\""), "{list}");
    assert!(!list.contains("net10") && !list.contains("\"sock\""), "refused exports listed: {list}");
    assert_eq!(text(&nbdinfo(&["--size", &tcp("local")]).stdout).trim(), "2097152");
    assert_eq!(text(&nbdinfo(&["--size", &tcp("open")]).stdout).trim(), "1048576");
    // Over the unix socket it is the other way round for `sock` and `local`.
    assert_eq!(text(&nbdinfo(&["--size", &s.uri("sock")]).stdout).trim(), "3145728");
    fails(&nbdinfo(&["--size", &s.uri("local")]));
    fails(&nbdinfo(&["--size", &s.uri("net10")]));
    // `surge status` shows each export's list (null: open to everyone).
    let st = s.client(&["status", "--json"]);
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&st.stderr)));
    let allow_of = |n: &str| st.as_array().unwrap().iter().find(|t| t["name"] == n).unwrap()["status"]["allow"].clone();
    assert_eq!(allow_of("net10"), "10.0.0.0/8");
    assert_eq!(allow_of("sock"), "unix");
    assert!(allow_of("open").is_null());
    // qemu-img sees the same refusal.
    let qemu_img = require("qemu-img", "qemu-utils");
    assert!(!run(Command::new(&qemu_img).args(["info", &tcp("net10")])).status.success());
    assert!(run(Command::new(&qemu_img).args(["info", &tcp("local")])).status.success());
}

#[test]
fn allow_lists_come_from_the_config_file_too() {
    let port = free_port();
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = cfg_dir.path().join("surge.toml");
    std::fs::write(
        &cfg,
        "[[export]]\nname = \"a\"\nspec = \"memory:1MiB\"\nallow = [\"10.0.0.0/8\"]\n[[export]]\nname = \"b\"\nspec = \"memory:1MiB\"\nallow = [\"127.0.0.0/8\", \"unix\"]\n",
    )
    .unwrap();
    let _s = serve_tcp(port, &["--config", cfg.to_str().unwrap()]);
    fails(&nbdinfo(&["--size", &format!("nbd://127.0.0.1:{port}/a")]));
    assert!(nbdinfo(&["--size", &format!("nbd://127.0.0.1:{port}/b")]).status.success());
}

/// `surge serve ARGS` that must fail at startup; returns its stderr.
fn serve_must_fail(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("c.sock");
    let mut child = Command::new(SURGE)
        .arg("serve")
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--control")
        .arg(&control)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("surge serve {args:?} started instead of refusing:\n{}", text(&out.stdout));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    text(&out.stderr)
}

#[test]
fn non_loopback_listeners_need_tls_require_or_insecure() {
    let port = free_port();
    let public = format!("tcp:0.0.0.0:{port}");
    let err = serve_must_fail(&["--listen", &public, "--export", "m=memory:1MiB"]);
    assert!(err.contains("refusing to listen on 0.0.0.0") && err.contains("--tls require") && err.contains("--insecure"), "{err}");
    let pki_dir = tempfile::tempdir().unwrap();
    let pki = openssl_pki(pki_dir.path());
    let certs = pki.server.to_str().unwrap();
    // TLS that plaintext clients may skip is not enough.
    let err = serve_must_fail(&["--listen", &public, "--tls", "allow", "--tls-certs", certs, "--export", "m=memory:1MiB"]);
    assert!(err.contains("refusing to listen"), "{err}");
    // TLS without certificates is a clear error too.
    let err = serve_must_fail(&["--tls", "require", "--export", "m=memory:1MiB"]);
    assert!(err.contains("--tls-certs") && err.contains("server-cert.pem"), "{err}");
    let missing = pki_dir.path().join("nothing-here");
    let err = serve_must_fail(&["--tls", "require", "--tls-certs", missing.to_str().unwrap(), "--export", "m=memory:1MiB"]);
    assert!(err.contains("nothing-here") && err.contains("server-cert.pem"), "{err}");
    let err = serve_must_fail(&["--export", "m=memory:1MiB", "--allow", "m=10.0.0.0/8,bogus"]);
    assert!(err.contains("bogus"), "{err}");
    // Issue 38 item 3: TLS required but nobody told apart (no client
    // certificates, an export without an allow-list): refused too.
    let err = serve_must_fail(&["--listen", &public, "--tls", "require", "--tls-certs", certs, "--export", "m=memory:1MiB"]);
    assert!(err.contains("does not authenticate") && err.contains("--tls-verify-peer") && err.contains("\"m\""), "{err}");

    // With TLS required and an allow-list on the export, the same listener
    // starts; clients reach it on loopback only.
    // A port picked just before it is served, not before the refusals above.
    let port = free_port();
    let public = format!("tcp:0.0.0.0:{port}");
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("nbd.sock");
    let control = sock_dir.path().join("control.sock");
    let mut cmd = Command::new(SURGE);
    cmd.arg("serve").arg("--data-dir").arg(sock_dir.path()).arg("--control").arg(&control);
    cmd.args(["--listen", &format!("unix:{}", sock.display()), "--listen", &public, "--tls", "require", "--tls-certs", certs]);
    cmd.args(["--export", "m=memory:1MiB", "--allow", "m=127.0.0.1,unix"]);
    let _s = Surge::spawn(cmd, sock_dir, sock, control);
    let out = nbdinfo(&["--size", &tls_uri(port, "m", &pki.client)]);
    assert_eq!(text(&out.stdout).trim(), "1048576", "{}", text(&out.stderr));
    fails(&nbdinfo(&["--size", &format!("nbd://127.0.0.1:{port}/m")]));
}

/// A client certificate (client-cert.pem, client-key.pem) in `root/NAME`, beside
/// the ca-cert.pem a client uses to check the server: signed by the CA in
/// `signer` (ca-cert.pem, ca-key.pem), or self-signed with `None`.
fn client_cert_dir(root: &Path, name: &str, trusted_ca: &Path, signer: Option<&Path>) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(trusted_ca, dir.join("ca-cert.pem")).unwrap();
    std::fs::write(dir.join("ext.cnf"), "extendedKeyUsage=clientAuth\n").unwrap();
    let subj = format!("/CN=surge-client-{name}");
    match signer {
        None => ossl(&dir, &[&["req", "-x509", "-nodes"], &EC[..], &["-keyout", "client-key.pem", "-out", "client-cert.pem", "-days", "2", "-subj", &subj]].concat()),
        Some(ca) => {
            ossl(&dir, &[&["req", "-nodes"], &EC[..], &["-keyout", "client-key.pem", "-out", "client.csr", "-subj", &subj]].concat());
            let (cert, key) = (ca.join("ca-cert.pem"), ca.join("ca-key.pem"));
            ossl(
                &dir,
                &[
                    "x509", "-req", "-in", "client.csr", "-CA", cert.to_str().unwrap(), "-CAkey", key.to_str().unwrap(),
                    "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", "client-cert.pem",
                ],
            );
        }
    }
    dir
}

/// Issue 10 item 11: `--tls-verify-peer` (nbdkit's name) admits only clients
/// whose certificate the CA in `--tls-certs DIR/ca-cert.pem` signed: libnbd's
/// nbdinfo and qemu-img (GnuTLS) with a right-CA certificate get in; a
/// self-signed one, one from another CA, or none is refused.
#[test]
fn tls_verify_peer_admits_only_client_certificates_signed_by_the_ca() {
    let pki_dir = tempfile::tempdir().unwrap();
    let root = pki_dir.path();
    let pki = openssl_pki(root);
    let ca = root.join("ca");
    std::fs::copy(ca.join("ca-cert.pem"), pki.server.join("ca-cert.pem")).unwrap();
    let trusted = pki.client.join("ca-cert.pem");
    let good = client_cert_dir(root, "good", &trusted, Some(&ca));
    let selfsigned = client_cert_dir(root, "self-signed", &trusted, None);
    let wrong = client_cert_dir(root, "wrong-ca", &trusted, Some(&root.join("other-ca")));

    let port = free_port();
    let certs = pki.server.to_str().unwrap();
    let s = serve_tcp(port, &["--tls", "require", "--tls-certs", certs, "--tls-verify-peer", "--export", "disk=memory:1MiB"]);
    assert!(s.stdout().contains("client certificate"), "the TLS note names the client certificate:\n{}", s.stdout());

    let out = nbdinfo(&["--size", &tls_uri(port, "disk", &good)]);
    assert_eq!(text(&out.stdout).trim(), "1048576", "right-CA client certificate: {}", text(&out.stderr));
    let qemu_img = require("qemu-img", "qemu-utils");
    let qemu = |dir: &Path| {
        let obj = format!("tls-creds-x509,id=tls0,dir={},endpoint=client", dir.display());
        let img = format!("driver=nbd,host=127.0.0.1,port={port},export=disk,tls-creds=tls0");
        run(Command::new(&qemu_img).args(["info", "--output=json", "--object", &obj, "--image-opts", &img]))
    };
    let out = qemu(&good);
    assert!(out.status.success() && text(&out.stdout).contains("\"virtual-size\": 1048576"), "qemu-img: {}", text(&out.stderr));

    for (what, dir) in [("self-signed", &selfsigned), ("another CA's", &wrong), ("no", &pki.client)] {
        fails(&nbdinfo(&["--size", &tls_uri(port, "disk", dir)]));
        assert!(!qemu(dir).status.success(), "qemu-img with {what} client certificate got in");
    }
    assert!(s.logs().to_lowercase().contains("certificate"), "refusals are logged:\n{}", s.logs());
    // The right certificate still works after the refusals.
    assert!(nbdinfo(&["--size", &tls_uri(port, "disk", &good)]).status.success());

    // Without ca-cert.pem beside the server certificate, or without TLS, the flag is refused at startup.
    std::fs::remove_file(pki.server.join("ca-cert.pem")).unwrap();
    let err = serve_must_fail(&["--tls", "require", "--tls-certs", certs, "--tls-verify-peer", "--export", "m=memory:1MiB"]);
    assert!(err.contains("ca-cert.pem"), "{err}");
    let err = serve_must_fail(&["--tls-verify-peer", "--export", "m=memory:1MiB"]);
    assert!(err.contains("--tls-verify-peer") && err.contains("--tls"), "{err}");
}

/// Issue 38 item 10: SIGHUP re-reads the certificates in --tls-certs: a
/// renewed certificate (here: from another CA) is served without a restart,
/// and a broken file leaves the running one in place.
#[test]
fn sighup_reloads_the_tls_certificates() {
    let (a_dir, b_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (openssl_pki(a_dir.path()), openssl_pki(b_dir.path()));
    let live = tempfile::tempdir().unwrap();
    let copy = |from: &Path| {
        for f in ["server-cert.pem", "server-key.pem"] {
            std::fs::copy(from.join(f), live.path().join(f)).unwrap();
        }
    };
    copy(&a.server);
    let port = free_port();
    let s = serve_tcp(port, &["--tls", "require", "--tls-certs", live.path().to_str().unwrap(), "--export", "disk=memory:1MiB"]);
    let size = |certs: &Path| nbdinfo(&["--size", &tls_uri(port, "disk", certs)]);
    assert!(size(&a.client).status.success(), "{}", s.logs());
    fails(&size(&b.client));
    copy(&b.server);
    s.signal(libc::SIGHUP);
    let t = Instant::now();
    while !size(&b.client).status.success() {
        assert!(t.elapsed() < Duration::from_secs(10), "the new certificate is not served after SIGHUP:\n{}", s.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    fails(&size(&a.client));
    // A key that does not load: logged, and the running certificate stays.
    std::fs::write(live.path().join("server-key.pem"), "not a key\n").unwrap();
    s.signal(libc::SIGHUP);
    let t = Instant::now();
    while !s.logs().contains("TLS certificates not reloaded") {
        assert!(t.elapsed() < Duration::from_secs(10), "no error logged:\n{}", s.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(size(&b.client).status.success(), "{}", s.logs());
}
