//! Who may talk to the burst buffer's services (issue 38 items 1 and 2): I/O
//! nodes over mutual TLS, Redis with an ACL user and password, etcd with a
//! user, a password and TLS. A client without credentials learns nothing and
//! changes nothing. Real redis-server and etcd; certificates made here with
//! openssl (Debian packages openssl, redis-server, etcd-server).

use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use surge_bb::conn::NodePool;
use surge_bb::local::LocalRedis;
use surge_bb::meta::redis::{redact, RedisAuth, RedisMeta};
use surge_bb::node::{self, NodeConfig};
use surge_bb::proto::{self, ChunkId, Request};
use surge_bb::store::StoreConfig;
use surge_bb::tier::{Access, TierConfig};
use surge_bb::tls::NodeTls;

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl (Debian package openssl)");
    assert!(o.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

const EC: [&str; 5] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

/// A CA in `ca` (made if missing) and a certificate it signs in `out`
/// (`node-cert.pem`, `node-key.pem`, with `ca-cert.pem` beside them), for
/// the names in `san` (e.g. `DNS:surge-bb`) and both TLS roles.
fn issue(ca: &Path, out: &Path, san: &str, prefix: &str) {
    std::fs::create_dir_all(ca).unwrap();
    std::fs::create_dir_all(out).unwrap();
    if !ca.join("ca-key.pem").exists() {
        openssl(ca, &[&["req", "-x509"], &EC[..], &["-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", "2", "-subj", "/CN=test-ca"]].concat());
    }
    std::fs::write(out.join("ext.cnf"), format!("subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n")).unwrap();
    let (key, csr, cert) = (format!("{prefix}-key.pem"), format!("{prefix}.csr"), format!("{prefix}-cert.pem"));
    openssl(out, &[&["req"], &EC[..], &["-keyout", &key, "-out", &csr, "-subj", "/CN=member"]].concat());
    let (c, k) = (ca.join("ca-cert.pem"), ca.join("ca-key.pem"));
    openssl(out, &["x509", "-req", "-in", &csr, "-CA", c.to_str().unwrap(), "-CAkey", k.to_str().unwrap(), "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", &cert]);
    std::fs::copy(ca.join("ca-cert.pem"), out.join("ca-cert.pem")).unwrap();
}

fn redis() -> (tempfile::TempDir, LocalRedis) {
    let dir = tempfile::tempdir().unwrap();
    let r = LocalRedis::start(&dir.path().join("redis"), surge_bb::local::free_port().unwrap()).expect("redis-server (scripts/test-all.sh installs it)");
    (dir, r)
}

fn tier_config(url: String, access: Access) -> TierConfig {
    TierConfig { redis: url, fs: "t".into(), membership: "redis".into(), s3: None, replicas: 1, chunk_size: 64 << 10, access }
}

fn node_config(tls: Option<Arc<NodeTls>>) -> NodeConfig {
    NodeConfig {
        listen: "127.0.0.1:0".into(),
        store: StoreConfig { capacity: 16 << 20, spill_dir: None, spill_capacity: 0 },
        writeback: Default::default(),
        rebalance: Default::default(),
        prefault: false,
        tls,
        insecure: false,
    }
}

/// Sends `req` on a plain TCP connection; the answer, if one comes.
fn plain_call(addr: &str, req: &Request) -> Option<proto::Response> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = s.write_all(&proto::encode_request(7, req));
    proto::read_response(&mut s).ok().flatten().map(|(_, r)| r)
}

#[test]
fn a_node_with_tls_answers_only_members_of_its_ca() {
    let d = tempfile::tempdir().unwrap();
    let (ca, other_ca) = (d.path().join("ca"), d.path().join("other-ca"));
    issue(&ca, &d.path().join("node"), "DNS:surge-bb", "node");
    issue(&ca, &d.path().join("client"), "DNS:surge-bb", "node");
    issue(&other_ca, &d.path().join("stranger"), "DNS:surge-bb", "node");
    let tls = |n: &str| Arc::new(NodeTls::from_dir(&d.path().join(n)).unwrap());
    let (_r, redis) = redis();
    let cfg = tier_config(redis.url(), Access { node_tls: Some(tls("client")), ..Default::default() });
    let n = node::start(node_config(Some(tls("node"))), tier_config(redis.url(), Access { node_tls: Some(tls("node")), ..Default::default() }).open().unwrap()).unwrap();
    let tier = cfg.open().unwrap();
    let c = ChunkId { ino: 5, idx: 0, ver: 1 };
    tier.pool.put(&n.addr, c, b"private bytes", true).unwrap();
    assert_eq!(tier.pool.get(&n.addr, c).unwrap().as_deref(), Some(&b"private bytes"[..]));

    // Without TLS: no answer to anything, and nothing changes.
    for req in [Request::Get { chunk: c }, Request::Delete { chunk: c }, Request::MarkClean { chunk: c }, Request::Stat, Request::Drain] {
        assert!(plain_call(&n.addr, &req).is_none(), "a plaintext {req:?} was answered");
    }
    // A certificate from another CA, or none that the node trusts: refused.
    let stranger = NodePool::new(Duration::from_secs(5)).with_tls(Some(tls("stranger")));
    assert!(stranger.get(&n.addr, c).is_err(), "a member of another CA read a chunk");
    assert!(stranger.delete(&n.addr, c).is_err());
    assert!(NodePool::new(Duration::from_secs(5)).get(&n.addr, c).is_err(), "a plaintext pool read a chunk");
    // The chunk is still there, still dirty, and the node is not draining.
    assert_eq!(n.store.get(&c).as_deref().map(|d| &d[..]), Some(&b"private bytes"[..]));
    assert_eq!(n.store.stat().dirty_bytes, 13);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!n.drained());
    assert!(tier.members.live().unwrap().iter().all(|i| i.draining.is_none()), "a plaintext DRAIN was obeyed");
    n.stop();
}

#[test]
fn a_node_off_loopback_needs_tls_or_insecure() {
    let e = node::check_exposure("0.0.0.0:7400", false, false).unwrap_err().to_string();
    assert!(e.contains("--tls-dir") && e.contains("--insecure"), "{e}");
    node::check_exposure("0.0.0.0:7400", true, false).unwrap();
    node::check_exposure("0.0.0.0:7400", false, true).unwrap();
    node::check_exposure("127.0.0.1:7400", false, false).unwrap();
    node::check_exposure("[::1]:7400", false, false).unwrap();
    // start() itself refuses, before binding anything.
    let (_r, redis) = redis();
    let mut cfg = node_config(None);
    cfg.listen = "0.0.0.0:0".into();
    let tier = tier_config(redis.url(), Access::default()).open().unwrap();
    let e = node::start(cfg, tier).err().unwrap().to_string();
    assert!(e.contains("refusing to serve chunks on 0.0.0.0:0"), "{e}");
}

#[test]
fn a_redis_with_a_password_refuses_clients_without_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let rdir = dir.path().join("redis");
    let redis = LocalRedis::start_secured(&rdir, surge_bb::local::free_port().unwrap()).expect("redis-server");
    let pw_file = surge_bb::local::password_file(&rdir);
    assert_eq!(std::fs::metadata(&pw_file).unwrap().permissions().mode() & 0o777, 0o600);
    let password = RedisAuth::read_password(&pw_file).unwrap();
    assert!(password.len() >= 32);
    // Neither the ACL file nor any process's arguments hold the password.
    assert!(!std::fs::read_to_string(rdir.join("users.acl")).unwrap().contains(&password));
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) {
            assert!(!String::from_utf8_lossy(&cmdline).contains(&password), "the password is in the arguments of {}", p.path().display());
        }
    }
    // No login, the default user, a wrong password: refused, and told nothing.
    let e = RedisMeta::connect(&redis.url(), "t").err().expect("served without a password").to_string();
    assert!(e.to_lowercase().contains("auth") || e.contains("NOPERM"), "{e}");
    let wrong = RedisAuth { user: Some("surge".into()), password: Some("guess".into()), tls_dir: None };
    assert!(RedisMeta::connect_with(&redis.url(), &wrong, "t").is_err());
    // The password in a URL is honoured, and hidden in every message.
    let in_url = format!("redis://surge:{password}@127.0.0.1:1/");
    let e = RedisMeta::connect(&in_url, "t").err().unwrap().to_string();
    assert!(!e.contains(&password) && e.contains("surge:***@127.0.0.1:1"), "{e}");
    // The right login works.
    let tier = tier_config(redis.url(), Access { redis: redis.auth(), ..Default::default() }).open().unwrap();
    assert!(tier.meta.params().is_ok());
    assert!(!format!("{:?}", redis.auth()).contains(&password), "Debug shows the password");
}

#[test]
fn redacted_urls_keep_the_server_and_drop_the_password() {
    assert_eq!(redact("redis://user:s3cr3t@10.0.0.1:6379/0"), "redis://user:***@10.0.0.1:6379/0");
    assert_eq!(redact("rediss://:s3cr3t@host/"), "rediss://:***@host/");
    assert_eq!(redact("redis://token@host:1/"), "redis://***@host:1/");
    assert_eq!(redact("redis://127.0.0.1:6379/"), "redis://127.0.0.1:6379/");
    assert_eq!(redact("not a url"), "not a url");
}

/// etcd with TLS (its certificate for 127.0.0.1, client certificates
/// required) and auth on: only a client with the CA, a certificate and the
/// password gets the node list.
#[cfg(feature = "etcd")]
#[test]
fn etcd_needs_tls_a_client_certificate_and_the_password() {
    use surge_bb::membership::{Etcd, EtcdAuth, Membership};
    let d = tempfile::tempdir().unwrap();
    let ca = d.path().join("ca");
    issue(&ca, &d.path().join("server"), "IP:127.0.0.1", "server");
    issue(&ca, &d.path().join("client"), "DNS:surge-bb", "client");
    let port = surge_bb::local::free_port().unwrap();
    let peer = surge_bb::local::free_port().unwrap();
    let url = format!("https://127.0.0.1:{port}");
    let s = d.path().join("server");
    let mut etcd = Command::new("etcd")
        .arg("--data-dir")
        .arg(d.path().join("data"))
        .args(["--listen-client-urls", &url, "--advertise-client-urls", &url])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}"), "--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-cluster", &format!("default=http://127.0.0.1:{peer}")])
        .arg("--cert-file")
        .arg(s.join("server-cert.pem"))
        .arg("--key-file")
        .arg(s.join("server-key.pem"))
        .arg("--trusted-ca-file")
        .arg(ca.join("ca-cert.pem"))
        .arg("--client-cert-auth")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(d.path().join("etcd.log")).unwrap())
        .spawn()
        .expect("etcd (Debian package etcd-server)");
    let client_dir = d.path().join("client");
    let tls_only = EtcdAuth { tls_dir: Some(client_dir.clone()), ..Default::default() };
    let start = std::time::Instant::now();
    while Etcd::connect_with(&url, "t", &tls_only).is_err() {
        assert!(start.elapsed() < Duration::from_secs(20), "etcd did not start: {}", std::fs::read_to_string(d.path().join("etcd.log")).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Turn auth on: a root user with a password.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let read = |f: &str| std::fs::read(client_dir.join(f)).unwrap();
        let tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read("ca-cert.pem")))
            .identity(etcd_client::Identity::from_pem(read("client-cert.pem"), read("client-key.pem")));
        let mut c = etcd_client::Client::connect([url.as_str()], Some(etcd_client::ConnectOptions::new().with_tls(tls))).await.unwrap();
        c.user_add("root", "etcd-root-password", None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.auth_enable().await.unwrap();
    });
    let auth = EtcdAuth { user: Some("root".into()), password: Some("etcd-root-password".into()), tls_dir: Some(client_dir.clone()) };
    let e = Etcd::connect_with(&url, "t", &auth).unwrap();
    e.live().unwrap();
    // Plaintext, TLS without a client certificate, the certificate without the password.
    assert!(Etcd::connect_with(&url.replace("https", "http"), "t", &EtcdAuth::default()).is_err(), "plaintext was served");
    let no_cert = d.path().join("ca-only");
    std::fs::create_dir_all(&no_cert).unwrap();
    std::fs::copy(client_dir.join("ca-cert.pem"), no_cert.join("ca-cert.pem")).unwrap();
    let pw_only = EtcdAuth { tls_dir: Some(no_cert), ..auth.clone() };
    assert!(Etcd::connect_with(&url, "t", &pw_only).is_err(), "served without a client certificate");
    assert!(Etcd::connect_with(&url, "t", &tls_only).is_err(), "served without the password");
    let wrong = EtcdAuth { password: Some("guess".into()), ..auth };
    assert!(Etcd::connect_with(&url, "t", &wrong).is_err(), "served with a wrong password");
    let _ = etcd.kill();
    let _ = etcd.wait();
}

/// Redis over TLS (client certificates required) with an ACL user: only a
/// client with the CA, a certificate and the password is served.
#[test]
fn redis_over_tls_needs_the_ca_a_client_certificate_and_the_password() {
    let d = tempfile::tempdir().unwrap();
    let ca = d.path().join("ca");
    issue(&ca, &d.path().join("server"), "IP:127.0.0.1", "server");
    issue(&ca, &d.path().join("client"), "DNS:surge-bb", "client");
    let digest = ring::digest::digest(&ring::digest::SHA256, b"redis-tls-password");
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(d.path().join("users.acl"), format!("user default off\nuser bb on #{hex} ~* &* +@all\n")).unwrap();
    let port = surge_bb::local::free_port().unwrap();
    let s = d.path().join("server");
    let mut child = Command::new("redis-server")
        .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--tls-auth-clients", "yes"])
        .arg("--tls-cert-file")
        .arg(s.join("server-cert.pem"))
        .arg("--tls-key-file")
        .arg(s.join("server-key.pem"))
        .arg("--tls-ca-cert-file")
        .arg(ca.join("ca-cert.pem"))
        .arg("--aclfile")
        .arg(d.path().join("users.acl"))
        .arg("--dir")
        .arg(d.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server");
    let url = format!("rediss://127.0.0.1:{port}/");
    let auth = RedisAuth { user: Some("bb".into()), password: Some("redis-tls-password".into()), tls_dir: Some(d.path().join("client")) };
    let start = std::time::Instant::now();
    let m = loop {
        match RedisMeta::connect_with(&url, &auth, "t") {
            Ok(m) => break m,
            Err(e) => assert!(start.elapsed() < Duration::from_secs(15), "redis over TLS: {e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(m);
    let ca_only = d.path().join("ca-only");
    std::fs::create_dir_all(&ca_only).unwrap();
    std::fs::copy(ca.join("ca-cert.pem"), ca_only.join("ca-cert.pem")).unwrap();
    let refused = [
        (format!("redis://127.0.0.1:{port}/"), RedisAuth { tls_dir: None, ..auth.clone() }, "plaintext"),
        (url.clone(), RedisAuth { tls_dir: Some(ca_only), ..auth.clone() }, "no client certificate"),
        (url.clone(), RedisAuth { password: None, user: None, ..auth.clone() }, "no password"),
        (format!("redis://127.0.0.1:{port}/"), auth.clone(), "a TLS directory with a redis:// URL"),
    ];
    for (u, a, what) in refused {
        let r = RedisMeta::connect_with(&u, &a, "t");
        assert!(r.is_err(), "{what}: served");
    }
    let _ = child.kill();
    let _ = child.wait();
}
