//! TLS for NBD (NBD_OPT_STARTTLS) with rustls: X.509 server certificates and,
//! optionally, client certificates checked against a CA (mutual TLS), for the
//! server and for the client (`remote`, which verifies the server against a
//! CA). rustls has no external-PSK support on the server side, so TLS-PSK (which
//! qemu and nbdkit offer through GnuTLS) is not available.
//!
//! One rustls connection (server or client side) is shared by the connection's
//! reader thread and the writers behind a mutex. The reader waits for the socket to become
//! readable *without* the lock (poll), then takes it only to decrypt what
//! arrived, so replies can be encrypted and sent while the reader waits.

use crate::io::Socket;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConnection, Connection, ServerConnection};
use std::io::{self, IoSlice, Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use thiserror::Error;

/// How the server treats TLS (the spec's NOTLS, SELECTIVETLS and FORCEDTLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsMode {
    /// STARTTLS is refused (NBD_REP_ERR_POLICY).
    #[default]
    Off,
    /// Clients may upgrade with STARTTLS; plain clients are served too.
    Allow,
    /// Every option but STARTTLS and ABORT gets NBD_REP_ERR_TLS_REQD until the
    /// client upgrades; NBD_OPT_EXPORT_NAME without TLS closes the connection.
    Require,
}

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("cannot read {path}: {msg}")]
    Pem { path: PathBuf, msg: String },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("TLS configuration rejected: {0}")]
    Config(#[from] rustls::Error),
    #[error("{0} holds no CA certificate: verifying clients (--tls-verify-peer) needs the CA that signs their certificates in ca-cert.pem")]
    NoClientCa(PathBuf),
    #[error("cannot verify clients with {path}: {msg}")]
    ClientCa { path: PathBuf, msg: String },
    #[error("{have} is there but {missing} is not: a client certificate needs both")]
    HalfIdentity { have: PathBuf, missing: PathBuf },
}

fn pem_err(path: &Path) -> impl FnOnce(rustls::pki_types::pem::Error) -> TlsError {
    let path = path.to_path_buf();
    move |e| TlsError::Pem { path, msg: e.to_string() }
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    CertificateDer::pem_file_iter(path).map_err(pem_err(path))?.collect::<Result<_, _>>().map_err(pem_err(path))
}

/// A rustls server configuration from a PEM certificate chain and private key;
/// with `client_ca`, clients must present a certificate signed by a CA in that
/// PEM file (mutual TLS), otherwise the handshake fails.
pub fn server_config_from_pem(cert_chain: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = load_certs(cert_chain)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(cert_chain.to_path_buf()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(pem_err(key))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let cfg = match client_ca {
        None => builder.with_no_client_auth().with_single_cert(certs, key)?,
        Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, provider)?).with_single_cert(certs, key)?,
    };
    Ok(Arc::new(cfg))
}

/// Accepts client certificates that chain to a CA in `ca` (PEM), nothing else.
fn client_verifier(
    ca: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let err = |msg: String| TlsError::ClientCa { path: ca.to_path_buf(), msg };
    if !ca.exists() {
        return Err(TlsError::NoClientCa(ca.to_path_buf()));
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots.add(cert).map_err(|e| err(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoClientCa(ca.to_path_buf()));
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().map_err(|e| err(e.to_string()))
}

/// The qemu/nbdkit directory layout: `server-cert.pem` and `server-key.pem` in
/// `dir`; with `verify_peer` (nbdkit's `--tls-verify-peer`) also `ca-cert.pem`,
/// the CA whose signature a client certificate must carry.
pub fn server_config(dir: &Path, verify_peer: bool) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let ca = dir.join("ca-cert.pem");
    server_config_from_pem(&dir.join("server-cert.pem"), &dir.join("server-key.pem"), verify_peer.then_some(ca.as_path()))
}

/// [`server_config`] without client certificates.
pub fn server_config_from_dir(dir: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    server_config(dir, false)
}

/// A rustls client configuration trusting the CA certificates in a PEM file.
pub fn client_config_from_ca(ca: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    client_config(ca, None)
}

/// A client configuration trusting the CA in `ca`; with `identity` (a PEM
/// certificate chain and its key) the client presents that certificate to
/// servers that ask for one (mutual TLS).
pub fn client_config(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let ca_err = |e: rustls::pki_types::pem::Error| TlsError::Pem { path: ca.to_path_buf(), msg: e.to_string() };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(ca_err)? {
        roots.add(cert.map_err(ca_err)?)?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoCertificate(ca.to_path_buf()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let cfg = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = load_certs(cert)?;
            if certs.is_empty() {
                return Err(TlsError::NoCertificate(cert.to_path_buf()));
            }
            builder.with_client_auth_cert(certs, PrivateKeyDer::from_pem_file(key).map_err(pem_err(key))?)?
        }
    };
    Ok(Arc::new(cfg))
}

/// The qemu/nbdkit/libnbd directory layout on the client side: `ca-cert.pem`
/// in `dir` checks the server; `client-cert.pem` and `client-key.pem`, when
/// there, are presented to a server that asks for a client certificate.
/// One of the two without the other is an error (a typo would otherwise
/// turn mutual TLS off silently).
pub fn client_config_from_dir(dir: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
    let identity = match (cert.exists(), key.exists()) {
        (true, true) => Some((cert.as_path(), key.as_path())),
        (false, false) => None,
        (true, false) => return Err(TlsError::HalfIdentity { have: cert, missing: key }),
        (false, true) => return Err(TlsError::HalfIdentity { have: key, missing: cert }),
    };
    client_config(&dir.join("ca-cert.pem"), identity)
}

/// The TLS state of one connection, shared by its reader and writers.
pub(crate) struct TlsSession {
    conn: Mutex<Connection>,
    /// How long a read may wait for data, in ms (0: forever); the plain socket's
    /// read timeout does not apply because the reader polls before reading.
    read_timeout_ms: AtomicU64,
}

/// Runs the TLS handshake on `sock` (the NBD_REP_ACK to STARTTLS already sent).
/// `early` holds bytes the plain reader had already buffered past the option.
pub(crate) fn accept(cfg: Arc<rustls::ServerConfig>, sock: &Socket, early: &[u8]) -> io::Result<Arc<TlsSession>> {
    let mut conn: Connection = ServerConnection::new(cfg).map_err(io::Error::other)?.into();
    if !early.is_empty() {
        conn.read_tls(&mut &early[..])?;
        conn.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    }
    handshake(conn, sock)
}

/// Runs the client side of the TLS handshake on `sock` (after the server's
/// NBD_REP_ACK to STARTTLS), checking the certificate against `server_name`.
pub(crate) fn connect(cfg: Arc<rustls::ClientConfig>, server_name: &str, sock: &Socket) -> io::Result<Arc<TlsSession>> {
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("TLS server name {server_name:?}: {e}")))?;
    let conn: Connection = ClientConnection::new(cfg, name).map_err(io::Error::other)?.into();
    handshake(conn, sock)
}

fn handshake(mut conn: Connection, sock: &Socket) -> io::Result<Arc<TlsSession>> {
    let mut s = sock.try_clone()?;
    while conn.is_handshaking() {
        conn.complete_io(&mut s)?;
    }
    let timeout = sock_read_timeout(sock)?;
    Ok(Arc::new(TlsSession { conn: Mutex::new(conn), read_timeout_ms: AtomicU64::new(timeout) }))
}

fn sock_read_timeout(sock: &Socket) -> io::Result<u64> {
    let t = match sock {
        Socket::Unix(s) => s.read_timeout()?,
        Socket::Tcp(s) => s.read_timeout()?,
    };
    Ok(t.map_or(0, |d| d.as_millis().clamp(1, i32::MAX as u128) as u64))
}

impl TlsSession {
    /// Applies the socket's current read timeout to TLS reads too.
    pub(crate) fn sync_read_timeout(&self, sock: &Socket) -> io::Result<()> {
        self.read_timeout_ms.store(sock_read_timeout(sock)?, Ordering::Relaxed);
        Ok(())
    }

    /// Sends close_notify (the spec: shut TLS down before closing).
    pub(crate) fn close(&self, sock: &Socket) {
        let mut c = self.conn.lock();
        c.send_close_notify();
        let mut s = sock;
        let _ = flush_tls(&mut c, &mut s);
    }
}

fn flush_tls(c: &mut Connection, sock: &mut impl Write) -> io::Result<()> {
    while c.wants_write() {
        c.write_tls(sock)?;
    }
    Ok(())
}

impl Write for &Socket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => (&*s).write(buf),
            Socket::Tcp(s) => (&*s).write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => (&*s).write_vectored(bufs),
            Socket::Tcp(s) => (&*s).write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Plaintext reader over a shared TLS session.
pub(crate) struct TlsReader {
    session: Arc<TlsSession>,
    sock: Socket,
}

impl TlsReader {
    pub(crate) fn new(session: Arc<TlsSession>, sock: Socket) -> Self {
        TlsReader { session, sock }
    }
}

/// Blocks until `fd` is readable (or closed), for at most `ms` (0: forever).
fn wait_readable(fd: i32, ms: u64) -> io::Result<()> {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let timeout = if ms == 0 { -1 } else { ms as i32 };
    loop {
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, timeout) };
        if r == 0 {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "TLS peer sent nothing in time"));
        }
        if r > 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let mut c = self.session.conn.lock();
                match c.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    // Peer closed without close_notify: treat as end of stream.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                    Err(e) => return Err(e),
                }
            }
            wait_readable(fd_of(&self.sock), self.session.read_timeout_ms.load(Ordering::Relaxed))?;
            let mut c = self.session.conn.lock();
            let mut s = &self.sock;
            match c.read_tls(&mut ReadAdapter(&mut s)) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            let processed = c.process_new_packets();
            // Alerts or key updates rustls queued go out now (even on error).
            let _ = flush_tls(&mut c, &mut s);
            processed.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }
}

fn fd_of(s: &Socket) -> i32 {
    match s {
        Socket::Unix(s) => s.as_raw_fd(),
        Socket::Tcp(s) => s.as_raw_fd(),
    }
}

/// `Read` for `&Socket` without needing `&mut Socket`.
struct ReadAdapter<'a, 'b>(&'a mut &'b Socket);

impl Read for ReadAdapter<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match *self.0 {
            Socket::Unix(s) => (&*s).read(buf),
            Socket::Tcp(s) => (&*s).read(buf),
        }
    }
}

/// Plaintext writer over a shared TLS session: every call encrypts and sends
/// all it was given before returning.
pub(crate) struct TlsWriter {
    session: Arc<TlsSession>,
    sock: Socket,
}

impl TlsWriter {
    pub(crate) fn new(session: Arc<TlsSession>, sock: Socket) -> Self {
        TlsWriter { session, sock }
    }

    fn write_all_locked(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut c = self.session.conn.lock();
        let mut s = &self.sock;
        let mut total = 0;
        for b in bufs {
            let mut rest: &[u8] = b;
            while !rest.is_empty() {
                let n = c.writer().write(rest)?;
                rest = &rest[n..];
                total += n;
                if n == 0 || c.wants_write() {
                    // rustls' send buffer is bounded: drain it to the socket.
                    flush_tls(&mut c, &mut s)?;
                }
            }
        }
        flush_tls(&mut c, &mut s)?;
        Ok(total)
    }
}

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all_locked(&[IoSlice::new(buf)])
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.write_all_locked(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        let mut c = self.session.conn.lock();
        let mut s = &self.sock;
        flush_tls(&mut c, &mut s)
    }
}
