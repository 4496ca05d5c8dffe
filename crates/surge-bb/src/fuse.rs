//! The POSIX mount: a `fuser` file system over [`Client`]. Requests that may
//! wait on the network are handed to a worker pool as they arrive (fuser's
//! loop is single-threaded; replies are `Send`), so slow requests do not hold
//! up others. Requests answered from memory (a write going into the write-
//! behind buffers, the attributes of an open file) are answered on the loop:
//! a hand-over costs a thread wake-up, more than such a request itself.
//!
//! Kernel caching: names and attributes are cached for `attr_ttl` (1 s by
//! default, as JuiceFS does; a `stat` may be that old). Opens keep
//! close-to-open all the same: each reads the file's attributes and its
//! directories' places from metadata, fails with ESTALE when a name the
//! kernel cached has moved (the kernel walks the path again, asking afresh),
//! and drops the kernel's attributes of the file (see [`crate::kcache`]).
//! Without `strict`, file pages stay in the kernel page cache while a file
//! is open, and across an open that finds the file's content generation
//! unchanged since its last open here; any other open drops them. With
//! `strict`, files are opened direct-I/O: every read reaches the client,
//! which reads committed metadata (read-after-write across mounts).

use crate::client::Client;
use crate::kcache::{KernelNames, PageGenerations};
use crate::meta::{Attr, Kind, SetAttr};
use crate::tier::DataError;
use crate::workers::Workers;
use fuser::{
    FileAttr, FileType, Filesystem, KernelConfig, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug)]
pub struct MountConfig {
    /// Direct I/O opens: read-after-write across mounts (no kernel page cache).
    pub strict: bool,
    /// Kernel attribute/entry cache lifetime (opens check names and
    /// attributes whatever it is: see the module's comment).
    pub attr_ttl: Duration,
    /// Worker threads serving FUSE requests.
    pub threads: usize,
}

impl MountConfig {
    /// Names and attributes are cached for 1 s unless `strict` (read-after-
    /// write across mounts: every stat asks metadata) or set.
    pub fn new(strict: bool, attr_ttl: Option<Duration>) -> MountConfig {
        let attr_ttl = attr_ttl.unwrap_or(if strict { Duration::ZERO } else { Duration::from_secs(1) });
        MountConfig { strict, attr_ttl, ..Default::default() }
    }
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig { strict: false, attr_ttl: Duration::from_secs(1), threads: 8 }
    }
}

/// Directory listings taken at opendir, by file handle: (inode, kind, name).
type DirListings = Arc<Mutex<HashMap<u64, Vec<(u64, FileType, String)>>>>;

pub struct BbFs {
    client: Arc<Client>,
    cfg: MountConfig,
    workers: Workers,
    next_fh: AtomicU64,
    dirs: DirListings,
    page_gens: Arc<Mutex<PageGenerations>>,
    names: Arc<Mutex<KernelNames>>,
    /// Set once the session runs: invalidates attributes the kernel cached.
    notifier: Arc<OnceLock<fuser::Notifier>>,
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH
    }
}

fn ns(t: TimeOrNow) -> i64 {
    match t {
        TimeOrNow::Now => crate::now_ns(),
        TimeOrNow::SpecificTime(t) => t.duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0),
    }
}

fn kind(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
    }
}

pub fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: a.ino,
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: time(a.atime_ns),
        mtime: time(a.mtime_ns),
        ctime: time(a.ctime_ns),
        crtime: time(a.ctime_ns),
        kind: kind(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 1 << 20,
        flags: 0,
    }
}

/// The kernel refused to drop its cached attributes of `ino`: ENOENT means
/// it holds none (nothing to drop); anything else means a stat may show
/// attributes older than the open's, said once per mount.
fn inval_refused(ino: u64, e: &std::io::Error) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if e.raw_os_error() != Some(libc::ENOENT) && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!("the kernel refused to drop its cached attributes of inode {ino} at open ({e}): a stat may show older ones for up to --attr-ttl (said once)");
    }
}

fn errno(e: &DataError) -> i32 {
    e.errno()
}

fn name_str(name: &OsStr) -> Result<String, i32> {
    name.to_str().map(str::to_string).ok_or(libc::EINVAL)
}

impl BbFs {
    pub fn new(client: Arc<Client>, cfg: MountConfig) -> std::io::Result<BbFs> {
        let workers = Workers::start("bb-fuse", cfg.threads)?;
        let names = Arc::new(Mutex::new(KernelNames::new(cfg.attr_ttl)));
        Ok(BbFs {
            client,
            cfg,
            workers,
            next_fh: AtomicU64::new(1),
            dirs: Arc::default(),
            page_gens: Arc::default(),
            names,
            notifier: Arc::default(),
        })
    }

    /// Replies with an entry, noting the name told to the kernel.
    fn entry_replier(&self, parent: u64, name: String) -> impl FnOnce(ReplyEntry, &Attr) + Send + 'static {
        let (ttl, names) = (self.cfg.attr_ttl, self.names.clone());
        move |reply, a| {
            names.lock().told(parent, &name, a.ino, Instant::now());
            reply.entry(&ttl, &file_attr(a), 0)
        }
    }

    fn spawn(&self, f: impl FnOnce(&Arc<Client>) + Send + 'static) {
        let c = self.client.clone();
        self.workers.run(move || f(&c));
    }

    /// A write-only open bypasses the kernel page cache: nothing can read
    /// through it, and copying each write into fresh page-cache pages (a
    /// first touch of memory) set the pace of a streaming writer.
    fn open_flags(&self, flags: i32) -> u32 {
        if self.cfg.strict || flags & libc::O_ACCMODE == libc::O_WRONLY {
            fuser::consts::FOPEN_DIRECT_IO
        } else {
            0 // without KEEP_CACHE the kernel drops the file's cached pages
        }
    }
}

impl Filesystem for BbFs {
    fn init(&mut self, _req: &Request<'_>, config: &mut KernelConfig) -> Result<(), libc::c_int> {
        use fuser::consts::*;
        let _ = config.add_capabilities(FUSE_BIG_WRITES | FUSE_ASYNC_READ | FUSE_PARALLEL_DIROPS);
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let answer = self.entry_replier(parent, name.clone());
        self.spawn(move |c| match c.lookup(parent, &name) {
            Ok(a) => answer(reply, &a),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        let ttl = self.cfg.attr_ttl;
        // An open file's attributes are in memory: answered here, with no
        // hand-over to a worker (fstat and lseek of open files ask often).
        if let Some(a) = self.client.open_attr(ino) {
            return reply.attr(&ttl, &file_attr(&a));
        }
        self.spawn(move |c| match c.getattr(ino) {
            Ok(a) => reply.attr(&ttl, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let ttl = self.cfg.attr_ttl;
        let set = SetAttr { mode, uid, gid, atime_ns: atime.map(ns), mtime_ns: mtime.map(ns) };
        self.spawn(move |c| match c.setattr(ino, &set, size) {
            Ok(a) => reply.attr(&ttl, &file_attr(&a)),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn mkdir(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let (uid, gid) = (req.uid(), req.gid());
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let answer = self.entry_replier(parent, name.clone());
        self.spawn(move |c| match c.create(parent, &name, Kind::Dir, mode & !umask & 0o7777, uid, gid) {
            Ok(a) => answer(reply, &a),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let names = self.names.clone();
        self.spawn(move |c| match c.unlink(parent, &name) {
            Ok(()) => {
                names.lock().forget_name(parent, &name);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        let names = self.names.clone();
        self.spawn(move |c| match c.rmdir(parent, &name) {
            Ok(()) => {
                names.lock().forget_name(parent, &name);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn rename(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, newparent: u64, newname: &OsStr, flags: u32, reply: ReplyEmpty) {
        if flags != 0 {
            // RENAME_NOREPLACE / RENAME_EXCHANGE are not offered.
            return reply.error(libc::EINVAL);
        }
        let (name, newname) = match (name_str(name), name_str(newname)) {
            (Ok(a), Ok(b)) => (a, b),
            _ => return reply.error(libc::EINVAL),
        };
        let names = self.names.clone();
        self.spawn(move |c| match c.rename(parent, &name, newparent, &newname) {
            Ok(()) => {
                names.lock().renamed(parent, &name, newparent, &newname, Instant::now());
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, flags: i32, reply: ReplyOpen) {
        let oflags = self.open_flags(flags);
        let (page_gens, names, notifier) = (self.page_gens.clone(), self.names.clone(), self.notifier.clone());
        let (strict, attrs_cached) = (self.cfg.strict, !self.cfg.attr_ttl.is_zero());
        self.spawn(move |c| {
            // Close-to-open: what metadata says now, not what the kernel cached.
            let (a, dirs) = match c.fresh_attr_with_ancestors(ino) {
                Ok(x) => x,
                Err(e) if e.errno() == libc::ENOENT && names.lock().was_told(ino) => return reply.error(libc::ESTALE),
                Err(e) => return reply.error(errno(&e)),
            };
            if !names.lock().still_true(&a, &dirs) {
                return reply.error(libc::ESTALE); // the kernel walks the path again
            }
            // Re-reading a file nobody changed (Montage reads each projected
            // image many times) is served by the kernel.
            let unchanged = page_gens.lock().reopened_unchanged(ino, a.gen);
            if attrs_cached {
                // The kernel's attributes may be older than this open's (a
                // size, a mode another mount set): the next stat asks, and
                // is answered from the open file, in memory.
                if let Some(Err(e)) = notifier.get().map(|n| n.inval_inode(ino, -1, 0)) {
                    inval_refused(ino, &e);
                }
            }
            let keep = unchanged && !strict && flags & libc::O_TRUNC == 0;
            let r = c.open_fresh(a).and_then(|fh| {
                if flags & libc::O_TRUNC != 0 {
                    if let Err(e) = c.truncate(ino, 0) {
                        let _ = c.release(ino, fh);
                        return Err(e);
                    }
                }
                Ok(fh)
            });
            match r {
                Ok(fh) => reply.opened(fh, if keep { oflags | fuser::consts::FOPEN_KEEP_CACHE } else { oflags }),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn create(&mut self, req: &Request<'_>, parent: u64, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let (ttl, names) = (self.cfg.attr_ttl, self.names.clone());
        let (uid, gid) = (req.uid(), req.gid());
        let oflags = self.open_flags(flags);
        let name = match name_str(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.spawn(move |c| {
            let r = c.create(parent, &name, Kind::File, mode & !umask & 0o7777, uid, gid).and_then(|a| Ok((c.open_fresh(a.clone())?, a)));
            match r {
                Ok((fh, a)) => {
                    names.lock().told(parent, &name, a.ino, Instant::now());
                    reply.created(&ttl, &file_attr(&a), 0, fh, oflags)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn read(&mut self, _req: &Request<'_>, ino: u64, _fh: u64, offset: i64, size: u32, _flags: i32, _lock: Option<u64>, reply: ReplyData) {
        // Cached bytes are answered here, as writes are buffered here: a
        // hand-over to a worker would cost more than the copy.
        let offset = offset.max(0) as u64;
        if let Some(d) = self.client.read_cached(ino, offset, size as usize) {
            return reply.data(d.as_slice());
        }
        self.spawn(move |c| match c.read(ino, offset, size as usize) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn write(&mut self, _req: &Request<'_>, ino: u64, fh: u64, offset: i64, data: &[u8], _wf: u32, _flags: i32, _lock: Option<u64>, reply: ReplyWrite) {
        // Buffering a write is a memory copy: done here, without a hand-over
        // to a worker (applications often write a few KiB at a time). Only a
        // writer over the write-behind budget waits, on a worker.
        let n = data.len() as u32;
        match self.client.write_buffered(ino, fh, offset.max(0) as u64, data) {
            Ok(false) => reply.written(n),
            Ok(true) => self.spawn(move |c| match c.wait_under_budget(ino, fh) {
                Ok(()) => reply.written(n),
                Err(e) => reply.error(errno(&e)),
            }),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(&mut self, _req: &Request<'_>, ino: u64, fh: u64, _lock: u64, reply: ReplyEmpty) {
        self.spawn(move |c| match c.flush(ino, fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn release(&mut self, _req: &Request<'_>, ino: u64, fh: u64, _flags: i32, _lock: Option<u64>, _flush: bool, reply: ReplyEmpty) {
        self.spawn(move |c| match c.release(ino, fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn fsync(&mut self, _req: &Request<'_>, ino: u64, fh: u64, _datasync: bool, reply: ReplyEmpty) {
        self.spawn(move |c| match c.fsync(ino, fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn opendir(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let dirs = self.dirs.clone();
        self.spawn(move |c| {
            let r = c.getattr(ino).and_then(|a| {
                let entries = c.readdir(ino)?;
                let mut v = vec![(ino, FileType::Directory, ".".to_string()), (a.parent.max(1), FileType::Directory, "..".to_string())];
                v.extend(entries.into_iter().map(|e| (e.ino, kind(e.kind), e.name)));
                Ok(v)
            });
            match r {
                Ok(v) => {
                    dirs.lock().insert(fh, v);
                    reply.opened(fh, 0);
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdir(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, offset: i64, mut reply: ReplyDirectory) {
        let dirs = self.dirs.lock();
        let Some(v) = dirs.get(&fh) else { return reply.error(libc::EBADF) };
        for (i, (ino, k, name)) in v.iter().enumerate().skip(offset.max(0) as usize) {
            if reply.add(*ino, i as i64 + 1, *k, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&mut self, _req: &Request<'_>, _ino: u64, fh: u64, _flags: i32, reply: ReplyEmpty) {
        self.dirs.lock().remove(&fh);
        reply.ok();
    }

    fn statfs(&mut self, _req: &Request<'_>, _ino: u64, reply: ReplyStatfs) {
        self.spawn(move |c| {
            let nodes = c.tier.live_nodes();
            let mut total = 0u64;
            let mut used = 0u64;
            for n in &nodes {
                if let Ok(s) = c.tier.pool.stat(n) {
                    total += s.capacity_bytes;
                    used += s.used_bytes;
                }
            }
            let bs = 4096u64;
            let blocks = total / bs / c.tier.replicas as u64;
            let free = total.saturating_sub(used) / bs / c.tier.replicas as u64;
            reply.statfs(blocks, free, free, 1 << 30, 1 << 30, bs as u32, 255, bs as u32);
        });
    }

    fn access(&mut self, _req: &Request<'_>, _ino: u64, _mask: i32, reply: ReplyEmpty) {
        reply.ok();
    }
}

/// Mounts and serves until unmounted (`fusermount3 -u DIR`) or `stop` is set.
pub fn mount(client: Arc<Client>, dir: &std::path::Path, cfg: MountConfig, stop: Arc<std::sync::atomic::AtomicBool>) -> std::io::Result<()> {
    use fuser::MountOption as O;
    let opts = [O::FSName("surge-bb".into()), O::Subtype("surge-bb".into()), O::DefaultPermissions, O::AllowOther, O::RW];
    let fs = BbFs::new(client, cfg)?;
    let notifier = fs.notifier.clone();
    let session = fuser::spawn_mount2(fs, dir, &opts)?;
    let _ = notifier.set(session.notifier());
    tracing::info!("burst buffer mounted at {}", dir.display());
    while !session.guard.is_finished() {
        if stop.load(Ordering::SeqCst) {
            tracing::info!("unmounting {}", dir.display());
            drop(session); // unmounts
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    session.join();
    Ok(())
}
