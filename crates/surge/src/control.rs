//! The control API: JSON lines on a unix socket (`<data-dir>/control.sock`).
//!
//! Parts of the daemon (exports, cache layers, tenants, the cost meter) implement
//! [`Controllable`] and register with the [`Registry`]; `surge status`, `surge set`
//! (and later `surge qos`, `surge top`) are clients.
//!
//! Protocol, one JSON object per line each way:
//! - `{"cmd":"status"}` -> `{"ok":true,"targets":[{"name","kind","status"}...]}`
//! - `{"cmd":"set","target":T,"key":K,"value":V}` -> `{"ok":true}`
//! - any failure -> `{"ok":false,"error":"..."}`

use anyhow::Context as _;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use surge_controller::Controllable;

/// Everything registered in this daemon, in registration order.
#[derive(Default)]
pub struct Registry {
    items: RwLock<Vec<Arc<dyn Controllable>>>,
}

impl Registry {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Fails if the name is taken, so `surge set` is never ambiguous.
    pub fn register(&self, item: Arc<dyn Controllable>) -> anyhow::Result<()> {
        let mut items = self.items.write();
        let name = item.name();
        anyhow::ensure!(!items.iter().any(|i| i.name() == name), "control target {name:?} registered twice");
        items.push(item);
        Ok(())
    }

    pub fn find(&self, name: &str) -> Option<Arc<dyn Controllable>> {
        self.items.read().iter().find(|i| i.name() == name).cloned()
    }

    pub fn snapshot(&self) -> Vec<TargetStatus> {
        self.items.read().iter().map(|i| TargetStatus { name: i.name(), kind: i.kind(), status: i.status() }).collect()
    }

    /// Answer one request.
    pub fn handle(&self, req: Request) -> Response {
        match req {
            Request::Status => Response::ok_targets(self.snapshot()),
            Request::Set { target, key, value } => match self.find(&target) {
                None => Response::error(format!("no target named {target:?} (see `surge status`)")),
                Some(t) => match t.set(&key, &value) {
                    Ok(()) => Response::ok(),
                    Err(e) => Response::error(e),
                },
            },
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "lowercase")]
pub enum Request {
    Status,
    Set { target: String, key: String, value: String },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TargetStatus {
    pub name: String,
    pub kind: String,
    pub status: serde_json::Value,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<TargetStatus>>,
}

impl Response {
    fn ok() -> Self {
        Response { ok: true, error: None, targets: None }
    }
    fn ok_targets(t: Vec<TargetStatus>) -> Self {
        Response { ok: true, error: None, targets: Some(t) }
    }
    fn error(e: impl Into<String>) -> Self {
        Response { ok: false, error: Some(e.into()), targets: None }
    }
}

/// Remove a leftover unix socket file, but only if nothing answers on it and it
/// is a socket: never delete a live server's socket or a regular file.
pub fn remove_stale_socket(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
    };
    anyhow::ensure!(meta.file_type().is_socket(), "{} exists and is not a socket; refusing to replace it", path.display());
    match UnixStream::connect(path) {
        Ok(_) => anyhow::bail!("another server is already listening on {}", path.display()),
        Err(_) => std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display())),
    }
}

/// The listening side; dropping it stops accepting and removes the socket file.
pub struct ControlServer {
    path: PathBuf,
    /// (device, inode) of the socket file we bound, so drop never removes a
    /// file that another server put at the same path after ours was deleted.
    file_id: Option<(u64, u64)>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    pub fn start(path: &Path, registry: Arc<Registry>) -> anyhow::Result<Self> {
        remove_stale_socket(path)?;
        // Only the user the daemon runs as may steer it (bound with that mode,
        // no window where the umask's mode applies).
        let listener = surge_nbd::bind_unix(path, SOCKET_MODE).with_context(|| format!("binding control socket {}", path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || accept_loop(listener, registry, stop2))
            .context("spawning control thread")?;
        Ok(ControlServer { path: path.to_path_buf(), file_id: file_id(path), stop, thread: Some(thread) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        // The accept loop polls this flag, so stopping needs nothing on disk
        // (the socket file may be gone, with the whole data directory).
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if self.file_id.is_some() && file_id(&self.path) == self.file_id {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Mode of the control socket: its owner only.
pub const SOCKET_MODE: u32 = 0o600;
/// Longest request line; a longer one gets an error and the connection closes.
pub const MAX_REQUEST: usize = 1 << 20;

/// How often the accept loop looks at the stop flag.
const ACCEPT_POLL_MS: i32 = 100;

/// Waits up to `ms` for a pending connection on `listener`.
fn readable(listener: &UnixListener, ms: i32) -> bool {
    use std::os::unix::io::AsRawFd;
    let mut p = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

fn accept_loop(listener: UnixListener, registry: Arc<Registry>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        if !readable(&listener, ACCEPT_POLL_MS) {
            continue;
        }
        match listener.accept().map(|(s, _)| s) {
            Ok(stream) => {
                let registry = registry.clone();
                let _ = std::thread::Builder::new().name("control-conn".into()).spawn(move || {
                    if let Err(e) = serve_client(stream, &registry) {
                        tracing::debug!("control client: {e}");
                    }
                });
            }
            Err(e) => tracing::warn!("control socket accept: {e}"),
        }
    }
}

/// Answer requests line by line until the client closes. A line longer than
/// [`MAX_REQUEST`] is answered with an error and ends the connection before
/// more of it is read.
fn serve_client(stream: UnixStream, registry: &Registry) -> std::io::Result<()> {
    use std::io::Read as _;
    let mut out = stream.try_clone()?;
    let mut r = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        if (&mut r).take(MAX_REQUEST as u64 + 1).read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        let too_long = line.len() > MAX_REQUEST;
        let text = String::from_utf8_lossy(&line);
        if !too_long && text.trim().is_empty() {
            continue;
        }
        let resp = if too_long {
            Response::error(format!("request longer than {MAX_REQUEST} bytes"))
        } else {
            match serde_json::from_str::<Request>(&text) {
                Ok(req) => registry.handle(req),
                Err(e) => Response::error(format!("bad request: {e}")),
            }
        };
        serde_json::to_writer(&mut out, &resp)?;
        out.write_all(b"\n")?;
        if too_long {
            // Closing with unread input would reset the connection and lose
            // the answer: say it, then discard (not keep) input for a moment.
            out.shutdown(std::net::Shutdown::Write)?;
            let _ = out.set_read_timeout(Some(Duration::from_millis(200)));
            let until = std::time::Instant::now() + Duration::from_secs(1);
            let mut sink = [0u8; 64 << 10];
            while std::time::Instant::now() < until && matches!(out.read(&mut sink), Ok(n) if n > 0) {}
            return Ok(());
        }
    }
}

/// Send one request to a running daemon and return its answer.
pub fn call(path: &Path, req: &Request) -> anyhow::Result<Response> {
    let stream = UnixStream::connect(path).with_context(|| {
        format!("cannot reach surge's control socket {} (is `surge serve` running? pass --control PATH otherwise)", path.display())
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut w = stream.try_clone()?;
    serde_json::to_writer(&mut w, req)?;
    w.write_all(b"\n")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).context("reading control reply")?;
    anyhow::ensure!(!line.is_empty(), "control socket closed without a reply");
    serde_json::from_str(&line).context("parsing control reply")
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use serde_json::json;

    struct Knob {
        name: String,
        value: Mutex<u64>,
    }

    impl Controllable for Knob {
        fn name(&self) -> String {
            self.name.clone()
        }
        fn kind(&self) -> String {
            "knob".into()
        }
        fn status(&self) -> serde_json::Value {
            json!({ "value": *self.value.lock() })
        }
        fn set(&self, key: &str, value: &str) -> Result<(), String> {
            match key {
                "value" => {
                    *self.value.lock() = value.parse().map_err(|_| format!("value={value}: not a number"))?;
                    Ok(())
                }
                _ => Err(format!("no setting {key:?}")),
            }
        }
    }

    fn knob(name: &str) -> Arc<Knob> {
        Arc::new(Knob { name: name.into(), value: Mutex::new(1) })
    }

    #[test]
    fn duplicate_names_are_refused() {
        let r = Registry::new();
        r.register(knob("a")).unwrap();
        assert!(r.register(knob("a")).unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn set_changes_the_target_and_errors_come_back_as_text() {
        let r = Registry::new();
        let k = knob("a");
        r.register(k.clone()).unwrap();
        let set = |t: &str, key: &str, v: &str| r.handle(Request::Set { target: t.into(), key: key.into(), value: v.into() });
        assert!(set("a", "value", "7").ok);
        assert_eq!(*k.value.lock(), 7);
        let bad = set("a", "value", "x");
        assert!(!bad.ok && bad.error.unwrap().contains("not a number"));
        assert!(set("b", "value", "1").error.unwrap().contains("no target named \"b\""));
    }

    #[test]
    fn the_socket_serves_status_and_set_over_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let r = Registry::new();
        r.register(knob("a")).unwrap();
        let server = ControlServer::start(&path, r.clone()).unwrap();
        assert!(call(&path, &Request::Set { target: "a".into(), key: "value".into(), value: "42".into() }).unwrap().ok);
        let st = call(&path, &Request::Status).unwrap();
        let t = &st.targets.unwrap()[0];
        assert_eq!((t.name.as_str(), t.kind.as_str()), ("a", "knob"));
        assert_eq!(t.status["value"], 42);

        // Garbage gets an error line, not a dropped connection.
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"{\"cmd\":\"explode\"}\n").unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        let resp: Response = serde_json::from_str(&line).unwrap();
        assert!(!resp.ok && resp.error.unwrap().contains("bad request"));

        drop(server);
        assert!(!path.exists(), "socket file removed on shutdown");
        assert!(call(&path, &Request::Status).unwrap_err().to_string().contains("is `surge serve` running"));
    }

    // Issue 38 item 5: the socket is its owner's only (not the umask's
    // 0755), and a line without end is cut instead of buffered forever.
    #[test]
    fn the_control_socket_is_private_and_an_endless_line_is_cut() {
        use std::io::Read as _;
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let r = Registry::new();
        r.register(knob("a")).unwrap();
        let _server = ControlServer::start(&path, r).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let mut s = UnixStream::connect(&path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let w = s.try_clone().unwrap();
        // A line without end: the server answers once it passes 1 MiB and
        // hangs up, so a writer that goes on fails (within 10 s).
        let writer = std::thread::spawn(move || {
            let mut w = w;
            let chunk = vec![b'x'; 64 << 10];
            let t = std::time::Instant::now();
            while t.elapsed() < Duration::from_secs(10) {
                if w.write_all(&chunk).is_err() {
                    return true;
                }
            }
            false
        });
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        let resp: Response = serde_json::from_str(reply.trim()).unwrap();
        assert!(!resp.ok && resp.error.unwrap().contains("longer than"), "{reply}");
        assert!(writer.join().unwrap(), "the server kept reading the endless line");
        assert!(call(&path, &Request::Status).unwrap().ok, "the daemon still answers");
    }

    #[test]
    fn stale_sockets_are_removed_but_live_ones_and_files_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("live.sock");
        let _l = UnixListener::bind(&live).unwrap();
        assert!(remove_stale_socket(&live).unwrap_err().to_string().contains("already listening"));
        assert!(live.exists());

        let stale = dir.path().join("stale.sock");
        drop(UnixListener::bind(&stale).unwrap());
        assert!(stale.exists());
        remove_stale_socket(&stale).unwrap();
        assert!(!stale.exists());

        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(remove_stale_socket(&file).unwrap_err().to_string().contains("not a socket"));
        assert!(file.exists());
        remove_stale_socket(&dir.path().join("absent")).unwrap();
    }
}
