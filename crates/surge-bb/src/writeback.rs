//! Write-back, run by every I/O node: dirty chunk versions go to S3 oldest
//! first (each by the first live node holding it), then each changed file's
//! export object with its manifest (as the object's user metadata, or an
//! object of its own when it does not fit or the file has no export object)
//! and each directory's marker object; dirty chunks that lost a holder are
//! copied to another node first. Every step is idempotent: S3 keys are never reused, so
//! a node dying half-way leaves nothing another node cannot redo.

use crate::meta::{self, ChunkEntry, ChunkUpdate, Ino, Kind, MetaError};
use crate::placement;
use crate::proto::ChunkId;
use crate::s3::{chunk_key, dir_marker_key, export_key, manifest_key, EMBEDDED_MANIFEST_MAX, MANIFEST_METADATA};
use crate::store::ChunkStore;
use crate::tier::{DataError, Tier};
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct WritebackConfig {
    /// A dirty chunk waits this long before write-back (lets rewrites coalesce);
    /// an fsync that waits for S3 skips the wait.
    pub delay: Duration,
    /// A chunk still dirty after this long is logged as late.
    pub deadline: Duration,
    /// Uploads in flight per node.
    pub parallel: usize,
    /// A dirty chunk on a node that the dirty log no longer lists, older than
    /// this, is an orphan (a client died before committing it): made evictable.
    pub orphan_grace: Duration,
    /// A file whose holes (bytes no write covered) exceed both this and its
    /// data gets no export object: S3 objects have no holes, so its view
    /// would upload all of them as zeros (`truncate -s 5T` would stream
    /// 5 TiB). Its chunks and manifest are written as for any file.
    pub export_holes_max: u64,
}

impl Default for WritebackConfig {
    fn default() -> Self {
        WritebackConfig {
            delay: Duration::from_millis(500),
            deadline: Duration::from_secs(30),
            parallel: 8,
            orphan_grace: Duration::from_secs(60),
            export_holes_max: 1 << 30,
        }
    }
}

/// A chunk as the store holds it, lent to an upload.
struct StoredChunk(Arc<crate::store::ChunkData>);

impl AsRef<[u8]> for StoredChunk {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

#[derive(serde::Serialize)]
struct Manifest<'a> {
    ino: Ino,
    /// Left out of the manifest an export object carries: its key is the path
    /// (and S3 metadata is ASCII).
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<&'a str>,
    size: u64,
    gen: u64,
    chunk_size: u64,
    chunks: Vec<ManifestChunk>,
}

#[derive(serde::Serialize)]
struct ManifestChunk {
    idx: u64,
    key: String,
    len: u64,
}

pub struct Writeback {
    tier: Arc<Tier>,
    store: Arc<ChunkStore>,
    me: String,
    cfg: WritebackConfig,
    late_logged: Mutex<HashSet<ChunkId>>,
    errors_logged: crate::LogEvery5s,
    backoff: Mutex<Backoff>,
    /// The bucket's key layout is recorded (before this node's first manifest).
    layout_recorded: std::sync::atomic::AtomicBool,
}

/// How long write-back rests after a pass whose uploads all failed (S3 down,
/// the bucket gone): doubling from 200 ms up to 5 s, back to none after an
/// upload succeeds. Without it a node retried every dirty chunk every 100 ms.
#[derive(Debug, Default)]
struct Backoff {
    pause: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(5);

    fn failed(&mut self) {
        self.pause = (self.pause * 2).clamp(Self::FIRST, Self::MAX);
    }

    fn succeeded(&mut self) {
        self.pause = Duration::ZERO;
    }
}

impl Writeback {
    pub fn new(tier: Arc<Tier>, store: Arc<ChunkStore>, me: String, cfg: WritebackConfig) -> Writeback {
        Writeback { tier, store, me, cfg, late_logged: Mutex::default(), errors_logged: Default::default(), backoff: Mutex::default(), layout_recorded: Default::default() }
    }

    /// Logs an error at most every 5 s (S3 down would otherwise flood the log).
    fn log_error(&self, what: &str) {
        if self.errors_logged.due().is_some() {
            tracing::error!("write-back: {what}");
        }
    }

    /// How long to rest before the next pass: none while uploads succeed.
    pub fn pause(&self) -> Duration {
        self.backoff.lock().pause
    }

    /// One pass of everything: chunks, publishes, unpublishes. Returns chunks written.
    pub fn tick(&self) -> usize {
        let n = match self.write_back_chunks() {
            Ok(n) => n,
            Err(e) => {
                self.log_error(&e.to_string());
                0
            }
        };
        if let Err(e) = self.publish_files() {
            self.log_error(&format!("publishing: {e}"));
        }
        if let Err(e) = self.unpublish() {
            self.log_error(&format!("removing export objects: {e}"));
        }
        n
    }

    fn write_back_chunks(&self) -> Result<usize, DataError> {
        let Some(s3) = &self.tier.s3 else { return Ok(0) };
        let live = self.tier.live_nodes();
        let now = crate::now_ms();
        let mut batch = Vec::new();
        for (c, logged) in self.tier.meta.dirty_oldest(1024)? {
            if logged != 0 && now - logged < self.cfg.delay.as_millis() as i64 {
                break; // the log is ordered: everything after is younger
            }
            if now - logged > self.cfg.deadline.as_millis() as i64 && self.late_logged.lock().insert(c) {
                tracing::warn!("chunk {} dirty for {} s, past the {:?} write-back deadline", c.member(), (now - logged) / 1000, self.cfg.deadline);
            }
            let local = self.store.get(&c);
            let (_, e) = self.tier.meta.chunks(c.ino, &[c.idx])?;
            let Some(e) = e.into_iter().next().flatten().filter(|e| e.ver == c.ver) else {
                // Superseded or deleted since it was logged: nothing to write.
                self.tier.meta.mark_persisted(&c)?;
                continue;
            };
            let first_live = e.holders.iter().find(|h| live.contains(h));
            match first_live {
                Some(h) if *h == self.me => {}
                Some(_) => continue,
                None => {
                    self.log_error(&format!("chunk {}: no holder of it is alive ({:?})", c.member(), e.holders));
                    continue;
                }
            }
            let data = match local {
                // Uploaded from the store's own buffer, not a copy of it.
                Some(d) => bytes::Bytes::from_owner(StoredChunk(d)),
                // This node restarted and lost its copy: take another holder's.
                None => bytes::Bytes::from(self.tier.read_chunk(c.ino, c.idx, &e)?),
            };
            batch.push((c, e, data));
            if batch.len() >= self.cfg.parallel * 4 {
                break;
            }
        }
        if batch.is_empty() {
            return Ok(0);
        }
        let puts: Vec<(String, bytes::Bytes)> =
            batch.iter().map(|(c, _, d)| (chunk_key(c.ino, c.idx, c.ver), d.clone())).collect();
        let results = s3.put_many(puts, self.cfg.parallel);
        let mut done = 0;
        // A holder that is gone or does not answer is not asked again in this
        // tick: a hung node would otherwise cost a timeout per chunk and stall
        // all write-back (its copies, if it comes back, are released as orphans).
        let mut unresponsive: HashSet<&str> = HashSet::new();
        for ((c, e, _), r) in batch.iter().zip(results) {
            match r {
                Ok(()) => {
                    self.tier.meta.mark_persisted(c)?;
                    for h in &e.holders {
                        if *h == self.me {
                            self.store.mark_clean(c);
                        } else if live.contains(h) && !unresponsive.contains(h.as_str()) {
                            if let Err(err) = self.tier.pool.mark_clean(h, *c) {
                                tracing::warn!("write-back: {err}; not telling {h} of written-back chunks in this pass");
                                unresponsive.insert(h);
                            }
                        }
                    }
                    self.late_logged.lock().remove(c);
                    done += 1;
                }
                Err(err) => self.log_error(&format!("chunk {} stays dirty: {err}", c.member())),
            }
        }
        let mut backoff = self.backoff.lock();
        if done == 0 {
            backoff.failed();
        } else {
            backoff.succeeded();
        }
        Ok(done)
    }

    /// Is this node the one (of the live ones) that publishes `ino`?
    fn mine(&self, live: &[String], ino: Ino) -> bool {
        placement::rank(live, &ChunkId { ino, idx: u64::MAX, ver: 0 }).first().is_some_and(|n| *n == self.me)
    }

    fn publish_files(&self) -> Result<(), DataError> {
        if self.tier.s3.is_none() {
            return Ok(());
        }
        // A draining node publishes nothing new: the others take its share.
        let live = self.tier.placement_nodes();
        let before = crate::now_ms() - self.cfg.delay.as_millis() as i64;
        for ino in self.tier.meta.publish_queue(before, 64)? {
            if !self.mine(&live, ino) {
                continue;
            }
            match self.publish_one(ino) {
                Ok(()) => {}
                Err(DataError::Meta(MetaError::NotFound)) => self.tier.meta.drop_publish(ino)?,
                Err(e) => {
                    self.tier.meta.requeue_publish(ino, crate::now_ms() + 1000)?;
                    self.log_error(&format!("publishing inode {ino}: {e}"));
                }
            }
        }
        Ok(())
    }

    /// Writes the export object of one file and its manifest (on the object
    /// when it fits: one PUT) once all its chunks are in S3; a directory gets its marker object (`dir/`) and,
    /// after a rename, queues its children (their keys changed too).
    fn publish_one(&self, ino: Ino) -> Result<(), DataError> {
        let meta = &self.tier.meta;
        let s3 = self.tier.s3.as_ref().expect("checked by caller");
        let a = meta.getattr(ino)?;
        let path = meta::path_of(meta.as_ref(), ino)?;
        if a.kind == Kind::Dir {
            let marker = dir_marker_key(&path);
            if ino != meta::ROOT && a.xkey.as_deref() != Some(marker.as_str()) {
                s3.put_dir_marker(&marker)?;
                // Not current any more (renamed, or its old marker still being
                // deleted): it is queued again.
                if !meta.mark_published(ino, a.gen, &marker, false)? {
                    return Ok(());
                }
            }
            let now = crate::now_ms();
            for child in meta.readdir(ino)? {
                meta.requeue_publish(child.ino, now)?;
            }
            meta.drop_publish(ino)?;
            return Ok(());
        }
        let xkey = export_key(&path);
        // Never over surge's own objects (a name made before it was reserved),
        // nor a file larger than an object may be.
        if is_internal(&xkey) || a.size > meta::MAX_FILE_SIZE {
            self.log_error(&format!("not publishing {path} (inode {ino}, {} bytes): its export key {xkey} is reserved or it is too large", a.size));
            meta.drop_publish(ino)?;
            return Ok(());
        }
        if a.persisted() && a.xkey.as_deref() == Some(xkey.as_str()) {
            meta.drop_publish(ino)?;
            return Ok(());
        }
        let cs = self.tier.params.chunk_size;
        let n = a.size.div_ceil(cs);
        let mut map = meta.chunk_map(ino)?;
        // The chunks that exist and the imported ones; holes need no look.
        let imported = a.import.as_ref().map_or(0, |(_, lim)| lim.div_ceil(cs)).min(n);
        let present: std::collections::BTreeSet<u64> = map.keys().copied().filter(|i| *i < n).chain(0..imported).collect();
        for idx in present {
            match map.get(&idx) {
                Some(e) if !e.persisted => {
                    // Not all chunks are in S3 yet: come back later.
                    meta.requeue_publish(ino, crate::now_ms() + self.cfg.delay.as_millis() as i64)?;
                    return Ok(());
                }
                Some(_) => {}
                None if a.import.as_ref().is_some_and(|(_, lim)| idx * cs < *lim) => {
                    // Copy the imported bytes into a chunk object first, so the
                    // export object (maybe the same key) can be replaced.
                    let data = self.tier.read_imported(&a.import, idx)?;
                    let ver = (u64::MAX >> 1) - a.gen; // unique per (ino, idx): imports happen once per gen
                    let e = ChunkEntry { ver, len: data.len() as u64, persisted: true, holders: vec![] };
                    s3.put(&chunk_key(ino, idx, ver), bytes::Bytes::from(data))?;
                    meta.materialize(ino, &ChunkUpdate { idx, base: None, entry: e.clone() })?;
                    map.insert(idx, e);
                }
                None => {}
            }
        }
        let mut manifest = Manifest {
            ino,
            path: None,
            size: a.size,
            gen: a.gen,
            chunk_size: cs,
            chunks: map.iter().filter(|(i, _)| **i < n).map(|(i, e)| ManifestChunk { idx: *i, key: chunk_key(ino, *i, e.ver), len: e.len }).collect(),
        };
        if !self.layout_recorded.load(std::sync::atomic::Ordering::Relaxed) {
            s3.ensure_layout()?;
            self.layout_recorded.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let want = |idx: u64| (a.size - idx * cs).min(cs);
        let data: u64 = map.iter().filter(|(i, _)| **i < n).map(|(i, e)| e.len.min(want(*i))).sum();
        let holes = a.size - data;
        let sparse = holes > self.cfg.export_holes_max.max(data);
        let embedded = serde_json::to_string(&manifest).map_err(|e| MetaError::Corrupt(e.to_string()))?;
        let embed = !sparse && embedded.len() <= EMBEDDED_MANIFEST_MAX;
        if !embed {
            manifest.path = Some(&path);
            let body = serde_json::to_vec_pretty(&manifest).map_err(|e| MetaError::Corrupt(e.to_string()))?;
            s3.put(&manifest_key(ino, a.gen), bytes::Bytes::from(body))?;
        }
        if sparse {
            // No export view (an older, denser one is removed, so the bucket
            // never shows stale content); the manifest says it all.
            tracing::info!("{path} (inode {ino}): {holes} bytes of holes, {data} of data: no export object at {xkey}, only its manifest");
            s3.delete(&xkey)?;
        } else {
            let metadata: &[(&str, &str)] = if embed { &[(MANIFEST_METADATA, embedded.as_str())] } else { &[] };
            self.put_export(s3, &xkey, metadata, ino, n, &map, want)?;
        }
        if meta.mark_published(ino, a.gen, &xkey, a.import.is_some())? {
            tracing::debug!("published {path} (inode {ino}, generation {})", a.gen);
        }
        Ok(())
    }

    /// Streams the export object of a file: its chunks, and holes as zeros
    /// lent from one shared buffer (no read, no allocation per hole).
    #[allow(clippy::too_many_arguments)]
    fn put_export(
        &self,
        s3: &crate::s3::S3,
        xkey: &str,
        metadata: &[(&str, &str)],
        ino: Ino,
        n: u64,
        map: &std::collections::BTreeMap<u64, ChunkEntry>,
        want: impl Fn(u64) -> u64,
    ) -> Result<(), DataError> {
        let zeros = bytes::Bytes::from(vec![0u8; self.tier.params.chunk_size as usize]);
        let mut idx = 0;
        s3.put_streamed(xkey, metadata, || {
            if idx >= n {
                return Ok(None);
            }
            let want = want(idx) as usize;
            let piece = match map.get(&idx) {
                Some(e) => {
                    let mut p = self.tier.read_chunk(ino, idx, e).map_err(|e| crate::s3::S3Error::Request {
                        op: "assemble",
                        key: xkey.to_string(),
                        msg: e.to_string(),
                    })?;
                    // A short chunk's rest is zeros.
                    p.resize(want, 0);
                    bytes::Bytes::from(p)
                }
                None => zeros.slice(..want),
            };
            idx += 1;
            Ok(Some(piece))
        })?;
        Ok(())
    }

    fn unpublish(&self) -> Result<(), DataError> {
        let Some(s3) = &self.tier.s3 else { return Ok(()) };
        for _ in 0..64 {
            let Some(key) = self.tier.meta.claim_unpublish()? else { break };
            if is_internal(&key) {
                // Only a file named before /.surge was reserved could queue it.
                self.log_error(&format!("not deleting {key}: it is one of the burst buffer's own objects"));
            } else if let Err(e) = s3.delete(&key) {
                self.log_error(&format!("export object {key} not deleted: {e}"));
            }
            self.tier.meta.unpublish_done(&key)?;
        }
        Ok(())
    }

    /// Re-replicates dirty chunks that lost a holder, and releases orphans.
    pub fn maintain(&self) {
        if let Err(e) = self.rereplicate() {
            self.log_error(&format!("re-replication: {e}"));
        }
        // Metadata changes across shards whose client died half-way.
        match self.tier.meta.recover() {
            Ok(0) => {}
            Ok(n) => tracing::info!("settled {n} metadata changes a client left half-done"),
            Err(e) => self.log_error(&format!("metadata recovery: {e}")),
        }
        for c in self.store.dirty_older_than(self.cfg.orphan_grace) {
            match self.tier.meta.is_dirty(&c) {
                Ok(false) => {
                    tracing::info!("chunk {} on this node is not in the dirty log: released (persisted, superseded or never committed)", c.member());
                    self.store.mark_clean(&c);
                }
                Ok(true) => {}
                Err(e) => {
                    self.log_error(&format!("orphan check: {e}"));
                    break;
                }
            }
        }
    }

    /// Does holder `h` (live) really hold `c`, logged dirty at `logged_ms`?
    /// A node that started after the chunk was logged is a restart at the
    /// same address (an empty node) unless it got a copy since: ask it.
    fn really_holds(&self, h: &str, c: &ChunkId, logged_ms: i64, started_ms: i64) -> bool {
        if h == self.me || started_ms <= logged_ms {
            return true;
        }
        self.tier.pool.has(h, *c).unwrap_or(false)
    }

    fn rereplicate(&self) -> Result<(), DataError> {
        self.tier.forget_live_cache();
        let info = self.tier.live_info();
        let started = |h: &str| info.iter().find(|n| n.addr == h).map(|n| n.started_ms);
        let targets: Vec<String> = info.iter().filter(|n| n.draining.is_none()).map(|n| n.addr.clone()).collect();
        for (c, logged) in self.tier.meta.dirty_oldest(4096)? {
            let Some(local) = self.store.get(&c) else { continue };
            let (_, e) = self.tier.meta.chunks(c.ino, &[c.idx])?;
            let Some(e) = e.into_iter().next().flatten().filter(|e| e.ver == c.ver) else { continue };
            let alive: Vec<String> = e
                .holders
                .iter()
                .filter(|h| started(h).is_some_and(|s| self.really_holds(h, &c, logged, s)))
                .cloned()
                .collect();
            let want = self.tier.replicas.min(targets.len().max(alive.len()));
            if alive.len() >= want && alive.len() == e.holders.len() {
                continue;
            }
            if alive.first() != Some(&self.me) {
                continue;
            }
            let mut holders = alive.clone();
            let mut target = self.tier.replicas.saturating_sub(holders.len());
            for node in placement::rank(&targets, &c) {
                if target == 0 {
                    break;
                }
                if holders.iter().any(|h| h == node) {
                    continue;
                }
                match self.tier.pool.put(node, c, &local, true) {
                    Ok(()) => {
                        holders.push(node.to_string());
                        target -= 1;
                    }
                    Err(err) => tracing::warn!("re-replicating chunk {} to {node}: {err}", c.member()),
                }
            }
            // Dead, or restarted at the same address since the chunk was logged.
            let dead: Vec<&String> = e.holders.iter().filter(|h| !alive.contains(h)).collect();
            if holders != e.holders && self.tier.meta.set_holders(&c, &e.holders, &holders)? {
                tracing::info!("chunk {}: holders {:?} -> {:?} (dead: {:?})", c.member(), e.holders, holders, dead);
            }
        }
        Ok(())
    }
}

/// Whether an object key is under the bucket's internal prefix (`.surge/`).
fn is_internal(key: &str) -> bool {
    key == crate::s3::INTERNAL_PREFIX || key.strip_prefix(crate::s3::INTERNAL_PREFIX).is_some_and(|r| r.starts_with('/'))
}

#[cfg(test)]
mod backoff_tests {
    use super::Backoff;
    use std::time::Duration;

    #[test]
    fn failed_passes_back_off_doubling_to_a_cap_and_a_success_ends_it() {
        let mut b = Backoff::default();
        assert_eq!(b.pause, Duration::ZERO);
        let pauses: Vec<u64> = (0..7)
            .map(|_| {
                b.failed();
                b.pause.as_millis() as u64
            })
            .collect();
        assert_eq!(pauses, [200, 400, 800, 1600, 3200, 5000, 5000]);
        b.succeeded();
        assert_eq!(b.pause, Duration::ZERO);
    }
}

#[cfg(test)]
mod reserved_tests {
    /// Keys write-back never publishes over nor deletes (issue 38 item 7).
    #[test]
    fn only_keys_under_the_internal_prefix_are_internal() {
        for k in [".surge", ".surge/chunks/5/0/1", ".surge/manifests/5/1.json"] {
            assert!(super::is_internal(k), "{k}");
        }
        for k in [".surgeon", "a/.surge/x", "surge/x", "x.surge"] {
            assert!(!super::is_internal(k), "{k}");
        }
    }
}
