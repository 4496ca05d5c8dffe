//! Pieces the NBD client tests share: an in-process surge server on a unix
//! socket, and a proxy in front of it whose connections can be cut and whose
//! socket can go away and come back (a server restart, as the client sees it).

#![allow(dead_code)]

use parking_lot::Mutex;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use surge_block::{BlockDev, Caps};
use surge_nbd::{Export, Listen, NbdUri, RemoteOptions, Server, ServerConfig};

pub fn uri_for(sock: &Path, export: &str) -> NbdUri {
    format!("nbd+unix:///{export}?socket={}", sock.display()).parse().unwrap()
}

pub fn opts() -> RemoteOptions {
    RemoteOptions { reconnect_timeout: Duration::from_secs(10), request_timeout: Duration::from_secs(10), ..RemoteOptions::default() }
}

/// An in-process surge server on a unix socket.
pub struct InProcess {
    pub server: Option<Server>,
    pub sock: PathBuf,
    pub _dir: tempfile::TempDir,
}

impl InProcess {
    pub fn start(dev: Arc<dyn BlockDev>) -> InProcess {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nbd.sock");
        let server = Server::start(ServerConfig::new(vec![Export::new("disk", dev)])).unwrap();
        server.listen(&Listen::Unix(sock.clone())).unwrap();
        InProcess { server: Some(server), sock, _dir: dir }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            let _ = s.shutdown();
        }
    }
}

/// A unix-socket proxy to `target`: `cut` drops every connection, `down`
/// also removes the socket until `resume`.
pub struct Proxy {
    pub path: PathBuf,
    pub target: PathBuf,
    pub conns: Arc<Mutex<Vec<UnixStream>>>,
    pub up: Arc<AtomicBool>,
    /// Bumped by `resume`: an older acceptor registers nothing.
    pub generation: Arc<std::sync::atomic::AtomicU64>,
    /// Run before each accepted connection is forwarded, with a function that
    /// cuts every connection forwarded so far (a restart at that moment).
    pub before_forward: Arc<Mutex<Option<AcceptHook>>>,
}

pub type AcceptHook = Box<dyn FnMut(&dyn Fn()) + Send>;

impl Proxy {
    pub fn start(path: PathBuf, target: PathBuf) -> Proxy {
        let p = Proxy { path, target, conns: Arc::default(), up: Arc::new(AtomicBool::new(false)), generation: Arc::default(), before_forward: Arc::default() };
        p.resume();
        p
    }

    pub fn resume(&self) {
        let _ = std::fs::remove_file(&self.path);
        let listener = UnixListener::bind(&self.path).unwrap();
        let mine = {
            let _c = self.conns.lock();
            self.up.store(true, Ordering::SeqCst);
            self.generation.fetch_add(1, Ordering::SeqCst) + 1
        };
        let (target, conns, up, generation, hook) = (self.target.clone(), self.conns.clone(), self.up.clone(), self.generation.clone(), self.before_forward.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if let Some(h) = hook.lock().as_mut() {
                    h(&|| cut_all(&conns));
                }
                let Ok(server) = UnixStream::connect(&target) else { continue };
                // Registered under the lock `down` takes, or refused: a
                // connection must never outlive a "restart" uncut.
                let mut c = conns.lock();
                if !up.load(Ordering::SeqCst) || generation.load(Ordering::SeqCst) != mine {
                    return;
                }
                c.push(client.try_clone().unwrap());
                c.push(server.try_clone().unwrap());
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
    }

    pub fn cut(&self) {
        cut_all(&self.conns);
    }

    pub fn down(&self) {
        self.up.store(false, Ordering::SeqCst);
        drop(self.conns.lock()); // no acceptor is between its check and its push
        let _ = UnixStream::connect(&self.path); // wake the acceptor so it exits
        let _ = std::fs::remove_file(&self.path);
        self.cut();
    }
}


fn cut_all(conns: &Mutex<Vec<UnixStream>>) {
    for s in conns.lock().drain(..) {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
}

/// A disk behind a volatile write cache that a server restart empties:
/// writes wait in memory until FLUSH (or FUA); `lose()` drops them, as a
/// killed server process does.
pub struct VolatileDisk {
    pub disk: Arc<dyn BlockDev>,
    pending: Mutex<Vec<(u64, Vec<u8>)>>,
}

impl VolatileDisk {
    pub fn new(disk: Arc<dyn BlockDev>) -> Self {
        VolatileDisk { disk, pending: Mutex::new(Vec::new()) }
    }

    pub fn memory(size: u64) -> Self {
        Self::new(Arc::new(surge_block::MemoryDev::new(size)))
    }

    /// Writes waiting in the cache.
    pub fn waiting(&self) -> usize {
        self.pending.lock().len()
    }

    pub fn lose(&self) -> usize {
        std::mem::take(&mut *self.pending.lock()).len()
    }

    /// Write what waits, in order, then flush the disk. What waits is gone
    /// whether this succeeds or not (the server keeps no copy).
    fn write_back(&self, pending: &mut Vec<(u64, Vec<u8>)>) -> surge_block::Result<()> {
        let mut first_error = None;
        for (off, data) in pending.drain(..) {
            if let Err(e) = self.disk.write_at(&data, off, false) {
                first_error.get_or_insert(e);
            }
        }
        let flushed = self.disk.flush();
        match first_error {
            Some(e) => Err(e),
            None => flushed,
        }
    }
}

impl BlockDev for VolatileDisk {
    fn size(&self) -> u64 {
        self.disk.size()
    }
    fn caps(&self) -> Caps {
        Caps { volatile_cache: true, ..Caps::default() }
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        let pending = self.pending.lock();
        self.disk.read_at(buf, offset)?;
        for (off, data) in pending.iter() {
            let (lo, hi) = ((*off).max(offset), (off + data.len() as u64).min(offset + buf.len() as u64));
            if lo < hi {
                buf[(lo - offset) as usize..(hi - offset) as usize].copy_from_slice(&data[(lo - off) as usize..(hi - off) as usize]);
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        surge_block::check_range(self.size(), offset, buf.len() as u64)?;
        let mut pending = self.pending.lock();
        pending.push((offset, buf.to_vec()));
        if fua {
            // Everything before it too: an older waiting write must not land
            // over it later.
            return self.write_back(&mut pending);
        }
        Ok(())
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.write_back(&mut self.pending.lock())
    }
}

