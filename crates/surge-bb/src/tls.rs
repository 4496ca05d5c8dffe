//! TLS for the node protocol (rustls, mutual X.509): every I/O node and
//! every client (mount, status, drain, pool, the nodes themselves when they
//! copy chunks to each other) holds a certificate signed by the burst
//! buffer's CA; a node serves only peers that present one, and a client
//! talks only to nodes that do. The certificates name the pool, not a host
//! ([`SERVER_NAME`]): nodes come and go at addresses nobody knows ahead.
//! rustls has no server-side external PSK, so a shared secret is not offered.
//!
//! A connection is used by a reader and writers on different threads (the
//! protocol is multiplexed), so [`split`] gives each side a half: writers
//! encrypt under a short lock and send outside it, in order, through a queue;
//! the reader waits for the socket without the lock. Neither waits for the
//! other while blocked on the network, so two peers that both write a large
//! frame while the other is not reading cannot deadlock on the lock.

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The name every node certificate carries (subjectAltName DNS), checked by clients.
pub const SERVER_NAME: &str = "surge-bb";
/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {msg}")]
    Pem { path: PathBuf, msg: String },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("node TLS configuration rejected: {0}")]
    Config(#[from] rustls::Error),
    #[error("cannot verify peers with the CA in {path}: {msg}")]
    Ca { path: PathBuf, msg: String },
}

fn pem_err(path: &Path) -> impl FnOnce(rustls::pki_types::pem::Error) -> TlsError + '_ {
    move |e| TlsError::Pem { path: path.to_path_buf(), msg: e.to_string() }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let v: Vec<_> = CertificateDer::pem_file_iter(path).map_err(pem_err(path))?.collect::<Result<_, _>>().map_err(pem_err(path))?;
    if v.is_empty() {
        return Err(TlsError::NoCertificate(path.to_path_buf()));
    }
    Ok(v)
}

/// Both sides of node TLS for this process: it serves with its certificate
/// (a node) and presents the same one when it connects (any process).
pub struct NodeTls {
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
    /// Where it was loaded from (for messages).
    pub dir: PathBuf,
}

impl std::fmt::Debug for NodeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeTls({})", self.dir.display())
    }
}

impl NodeTls {
    /// `dir/ca-cert.pem` (the CA that signs every member's certificate),
    /// `dir/node-cert.pem` and `dir/node-key.pem` (this process's
    /// certificate, subjectAltName DNS:surge-bb, for both server and client
    /// authentication, and its key).
    pub fn from_dir(dir: &Path) -> Result<NodeTls, TlsError> {
        let (ca, cert, key) = (dir.join("ca-cert.pem"), dir.join("node-cert.pem"), dir.join("node-key.pem"));
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(&ca)? {
            roots.add(c).map_err(|e| TlsError::Ca { path: ca.clone(), msg: e.to_string() })?;
        }
        let roots = Arc::new(roots);
        let chain = certs(&cert)?;
        let key_der = PrivateKeyDer::from_pem_file(&key).map_err(pem_err(&key))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| TlsError::Ca { path: ca.clone(), msg: e.to_string() })?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key_der.clone_key())?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key_der)?;
        Ok(NodeTls { server: Arc::new(server), client: Arc::new(client), dir: dir.to_path_buf() })
    }
}

/// The two halves of a connection: a reader for one thread, a writer for
/// the others (plain TCP or TLS).
pub type Halves = (Box<dyn Read + Send>, Box<dyn Write + Send>);

/// Plain halves of a TCP stream.
pub fn plain(stream: TcpStream) -> io::Result<Halves> {
    Ok((Box::new(stream.try_clone()?), Box::new(stream)))
}

/// The server side: the TLS handshake (bounded by [`HANDSHAKE_TIMEOUT`]),
/// then the halves. A peer without a certificate from the CA fails here.
pub fn accept(cfg: &Arc<rustls::ServerConfig>, stream: TcpStream) -> io::Result<Halves> {
    let conn = rustls::ServerConnection::new(cfg.clone()).map_err(io::Error::other)?;
    split(conn.into(), stream)
}

/// The client side, checking the node's certificate against the CA and [`SERVER_NAME`].
pub fn connect(cfg: &Arc<rustls::ClientConfig>, stream: TcpStream) -> io::Result<Halves> {
    let name = ServerName::try_from(SERVER_NAME).expect("a valid DNS name");
    let conn = rustls::ClientConnection::new(cfg.clone(), name).map_err(io::Error::other)?;
    split(conn.into(), stream)
}

fn split(mut conn: rustls::Connection, sock: TcpStream) -> io::Result<Halves> {
    let (rt, wt) = (sock.read_timeout()?, sock.write_timeout()?);
    sock.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    sock.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    {
        let mut s = &sock;
        while conn.is_handshaking() {
            conn.complete_io(&mut s)?;
        }
        while conn.wants_write() {
            conn.write_tls(&mut s)?;
        }
    }
    sock.set_read_timeout(rt)?;
    sock.set_write_timeout(wt)?;
    let shared = Arc::new(Shared { sock, state: Mutex::new(State { conn, out: VecDeque::new() }), send: Mutex::new(()) });
    Ok((Box::new(TlsReader { c: shared.clone(), raw: vec![0; 64 << 10], pos: 0, len: 0, eof: false }), Box::new(TlsWriter { c: shared })))
}

struct State {
    conn: rustls::Connection,
    /// Records encrypted and not sent yet, in the order rustls made them.
    out: VecDeque<Vec<u8>>,
}

struct Shared {
    sock: TcpStream,
    state: Mutex<State>,
    /// Held while sending records, so they leave in queue order.
    send: Mutex<()>,
}

impl Shared {
    /// Moves what rustls wants to send into the queue (under the state lock).
    fn queue(st: &mut State) -> io::Result<()> {
        while st.conn.wants_write() {
            let mut v = Vec::new();
            st.conn.write_tls(&mut v)?;
            st.out.push_back(v);
        }
        Ok(())
    }

    /// Sends the queue. `wait`: until it is empty (a writer); else only if
    /// nobody is sending (the reader: whoever is, sends its records too, as
    /// a sender looks at the queue again after letting go).
    fn flush(&self, wait: bool) -> io::Result<()> {
        loop {
            let guard = if wait {
                self.send.lock()
            } else {
                match self.send.try_lock() {
                    Some(g) => g,
                    None => return Ok(()),
                }
            };
            loop {
                let next = self.state.lock().out.pop_front();
                let Some(rec) = next else { break };
                (&self.sock).write_all(&rec)?;
            }
            drop(guard);
            if self.state.lock().out.is_empty() {
                return Ok(());
            }
        }
    }
}

struct TlsWriter {
    c: Arc<Shared>,
}

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = {
            let mut st = self.c.state.lock();
            let n = st.conn.writer().write(buf)?;
            Shared::queue(&mut st)?;
            n
        };
        // rustls takes a bounded amount at a time: send it before taking more.
        self.c.flush(true)?;
        if n == 0 && !buf.is_empty() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "TLS session closed"));
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.c.flush(true)
    }
}

struct TlsReader {
    c: Arc<Shared>,
    /// Ciphertext read from the socket and not yet given to rustls.
    raw: Vec<u8>,
    pos: usize,
    len: usize,
    /// The socket reached its end (rustls has been told).
    eof: bool,
}

impl TlsReader {
    /// Plaintext rustls has ready; `None` when it needs more ciphertext.
    fn plaintext(st: &mut State, buf: &mut [u8], eof: bool) -> Option<io::Result<usize>> {
        match st.conn.reader().read(buf) {
            Ok(n) => Some(Ok(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && !eof => None,
            // The peer closed (with or without close_notify): the end of the stream.
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::UnexpectedEof) => Some(Ok(0)),
            Err(e) => Some(Err(e)),
        }
    }
}

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let mut st = self.c.state.lock();
                if let Some(r) = Self::plaintext(&mut st, buf, self.eof) {
                    return r;
                }
                if self.pos < self.len {
                    let took = st.conn.read_tls(&mut &self.raw[self.pos..self.len])?;
                    self.pos += took;
                    let processed = st.conn.process_new_packets();
                    // Alerts and key updates rustls made go out (even on error).
                    let queued = Shared::queue(&mut st);
                    drop(st);
                    let _ = queued.and_then(|_| self.c.flush(false));
                    processed.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    continue;
                }
            }
            // Nothing decrypted or pending: wait for the socket, without the lock.
            let n = loop {
                match (&self.c.sock).read(&mut self.raw) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    r => break r?,
                }
            };
            (self.pos, self.len) = (0, n);
            if n == 0 {
                let mut st = self.c.state.lock();
                st.conn.read_tls(&mut &[][..])?;
                let processed = st.conn.process_new_packets();
                self.eof = true;
                processed.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// A CA in `dir` and a member certificate signed by it (or self-signed
    /// with `ca: None`) in `out`, in the layout [`NodeTls::from_dir`] reads.
    pub(crate) fn make_member(ca_dir: &Path, out: &Path, signed: bool) {
        let ossl = |dir: &Path, args: &[&str]| {
            let o = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl (Debian package openssl)");
            assert!(o.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        };
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        std::fs::create_dir_all(ca_dir).unwrap();
        std::fs::create_dir_all(out).unwrap();
        if !ca_dir.join("ca-key.pem").exists() {
            ossl(ca_dir, &[&["req", "-x509"], &ec[..], &["-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", "2", "-subj", "/CN=bb-ca"]].concat());
        }
        std::fs::write(out.join("ext.cnf"), "subjectAltName=DNS:surge-bb\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n").unwrap();
        if signed {
            ossl(out, &[&["req"], &ec[..], &["-keyout", "node-key.pem", "-out", "node.csr", "-subj", "/CN=member"]].concat());
            let (c, k) = (ca_dir.join("ca-cert.pem"), ca_dir.join("ca-key.pem"));
            ossl(out, &["x509", "-req", "-in", "node.csr", "-CA", c.to_str().unwrap(), "-CAkey", k.to_str().unwrap(), "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", "node-cert.pem"]);
        } else {
            ossl(out, &[&["req", "-x509"], &ec[..], &["-keyout", "node-key.pem", "-out", "node-cert.pem", "-days", "2", "-subj", "/CN=stranger", "-addext", "subjectAltName=DNS:surge-bb"]].concat());
        }
        std::fs::copy(ca_dir.join("ca-cert.pem"), out.join("ca-cert.pem")).unwrap();
    }

    fn pair(a: &NodeTls, b: &NodeTls) -> (Halves, Halves) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = a.server.clone();
        let t = std::thread::spawn(move || accept(&server, l.accept().unwrap().0));
        let c = connect(&b.client, TcpStream::connect(addr).unwrap());
        (t.join().unwrap().unwrap(), c.unwrap())
    }

    /// Both sides write more than the socket buffers hold while neither
    /// reads yet, then read: no deadlock, every byte arrives in order.
    #[test]
    fn large_writes_both_ways_at_once_arrive_whole() {
        let d = tempfile::tempdir().unwrap();
        make_member(&d.path().join("ca"), &d.path().join("m"), true);
        let t = NodeTls::from_dir(&d.path().join("m")).unwrap();
        let ((mut sr, mut sw), (mut cr, mut cw)) = pair(&t, &t);
        let data: Vec<u8> = (0..(24 << 20)).map(|i: u32| (i % 251) as u8).collect();
        let (d1, d2) = (data.clone(), data.clone());
        let w1 = std::thread::spawn(move || sw.write_all(&d1).and_then(|_| sw.flush()));
        let w2 = std::thread::spawn(move || cw.write_all(&d2).and_then(|_| cw.flush()));
        std::thread::sleep(Duration::from_millis(200));
        let r1 = std::thread::spawn(move || {
            let mut v = vec![0u8; 24 << 20];
            sr.read_exact(&mut v).map(|_| v)
        });
        let mut v = vec![0u8; 24 << 20];
        cr.read_exact(&mut v).unwrap();
        assert!(v == data, "client read different bytes");
        assert!(r1.join().unwrap().unwrap() == data, "server read different bytes");
        w1.join().unwrap().unwrap();
        w2.join().unwrap().unwrap();
    }

    #[test]
    fn a_member_of_another_ca_is_refused_both_ways() {
        let d = tempfile::tempdir().unwrap();
        make_member(&d.path().join("ca"), &d.path().join("m"), true);
        make_member(&d.path().join("other-ca"), &d.path().join("x"), true);
        make_member(&d.path().join("ca"), &d.path().join("self"), false);
        let (good, other, stranger) = (
            NodeTls::from_dir(&d.path().join("m")).unwrap(),
            NodeTls::from_dir(&d.path().join("x")).unwrap(),
            NodeTls::from_dir(&d.path().join("self")).unwrap(),
        );
        for (server, client, what) in [(&good, &other, "client of another CA"), (&other, &good, "node of another CA"), (&good, &stranger, "self-signed client")] {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let cfg = server.server.clone();
            let t = std::thread::spawn(move || accept(&cfg, l.accept().unwrap().0).map(|_| ()));
            let c = connect(&client.client, TcpStream::connect(addr).unwrap()).and_then(|(mut r, _)| r.read(&mut [0u8; 1]).map(|_| ()));
            let s = t.join().unwrap();
            assert!(s.is_err() || c.is_err(), "{what}: the session was established");
            assert!(s.is_err(), "{what}: the server accepted it");
        }
    }
}
