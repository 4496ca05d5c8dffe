//! The durable record of cache failures that a restart must honour.
//!
//! A cache device that failed (any I/O error) may still hold metadata naming
//! dirty blocks that were saved to backing and rewritten since: reopening it
//! would drain stale data over newer, FLUSHed data. And blocks whose only
//! durable copy is still on the failed device must come back from it (and from
//! nowhere else) after a restart. [`Fences`] says both, per failed device (by
//! the cache id in its metadata, and the label of whoever attached it), plus
//! whether acknowledged writes may have been lost (then every FLUSH fails until
//! the user acknowledges). The cache layer changes it only through
//! [`FenceStore::update`], which is durable on return; a FLUSH is acknowledged
//! only once the record covering it is durable. See docs/cache.md, "Failures".

use crate::error::{BlockError, Result};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Everything a restart must honour.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fences {
    /// Failed cache devices, by the cache id in their metadata.
    #[serde(default)]
    pub failed: BTreeMap<u64, FailedCache>,
    /// Acknowledged writes may have been lost: every FLUSH fails until the user
    /// acknowledges (`ElasticCache::ack_loss`).
    #[serde(default)]
    pub loss: Option<LossNote>,
}

/// One failed cache device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedCache {
    /// Who attached it (the elastic controller: the cloud volume id).
    #[serde(default)]
    pub label: String,
    /// Backing blocks whose only durable copy is still on this device: a
    /// restart recovers exactly these from it. Empty: the device is fenced,
    /// never reopened, and may be deleted.
    #[serde(default)]
    pub pending: BTreeSet<u64>,
}

/// Why FLUSH fails until the user acknowledges.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LossNote {
    pub reason: String,
    /// Wall-clock time it was first recorded (ms since the Unix epoch).
    pub since_unix_ms: u64,
}

impl Fences {
    /// Labels of failed devices that are fully fenced (nothing pending).
    pub fn fenced_labels(&self) -> Vec<String> {
        self.failed.values().filter(|f| f.pending.is_empty() && !f.label.is_empty()).map(|f| f.label.clone()).collect()
    }

    /// Parse the file form; `Err` on anything that is not a valid record (a
    /// fence is never silently ignored).
    pub fn decode(bytes: &[u8]) -> std::result::Result<Fences, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("invalid cache fence record: {e}"))
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("fences serialize");
        v.push(b'\n');
        v
    }
}

/// Where the record lives. `update` is atomic and durable on return.
pub trait FenceStore: Send + Sync + Debug {
    /// The current record.
    fn get(&self) -> Fences;
    /// Apply `change` and make the result durable before returning; on error
    /// the record is unchanged.
    fn update(&self, change: &mut dyn FnMut(&mut Fences)) -> Result<()>;
}

/// Apply `change` to a copy of `cur`; if it changed anything, `persist` it and
/// only then make it current.
fn update_with(cur: &Mutex<Fences>, change: &mut dyn FnMut(&mut Fences), persist: impl FnOnce(&Fences) -> std::io::Result<()>) -> Result<()> {
    let mut cur = cur.lock();
    let mut next = cur.clone();
    change(&mut next);
    if next != *cur {
        persist(&next).map_err(|e| BlockError::io("write of the cache fence record", 0, 0, e))?;
        *cur = next;
    }
    Ok(())
}

/// A JSON file, replaced atomically (write a temporary file, fsync, rename,
/// fsync the directory). The daemon keeps one per elastic volume in its data
/// directory.
#[derive(Debug)]
pub struct FileFences {
    path: PathBuf,
    cur: Mutex<Fences>,
}

impl FileFences {
    /// Load the record at `path` (none yet: empty). A record that cannot be
    /// read or parsed is an error: refusing to start beats resurrecting data.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let cur = match std::fs::read(&path) {
            Ok(b) => Fences::decode(&b).map_err(|e| BlockError::Corrupt(format!("{}: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Fences::default(),
            Err(e) => return Err(BlockError::io("read of the cache fence record", 0, 0, e)),
        };
        Ok(FileFences { path, cur: Mutex::new(cur) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn store(&self, f: &Fences) -> std::io::Result<()> {
        let dir = self.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tmp = self.path.with_extension("tmp");
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(crate::file::DATA_FILE_MODE).open(&tmp)?;
            file.write_all(&f.encode())?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)?;
        std::fs::File::open(dir)?.sync_all()
    }
}

impl FenceStore for FileFences {
    fn get(&self) -> Fences {
        self.cur.lock().clone()
    }

    fn update(&self, change: &mut dyn FnMut(&mut Fences)) -> Result<()> {
        update_with(&self.cur, change, |next| self.store(next))
    }
}

/// In memory: for tests (share one between a cache and its "restart") and for
/// callers that never restart. `set_failing` makes updates fail.
#[derive(Debug, Default)]
pub struct MemoryFences {
    cur: Mutex<Fences>,
    failing: AtomicBool,
}

impl MemoryFences {
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on every update fails (true) or works (false).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Relaxed);
    }
}

impl FenceStore for MemoryFences {
    fn get(&self) -> Fences {
        self.cur.lock().clone()
    }

    fn update(&self, change: &mut dyn FnMut(&mut Fences)) -> Result<()> {
        update_with(&self.cur, change, |_| match self.failing.load(Relaxed) {
            true => Err(std::io::Error::from_raw_os_error(libc::EIO)),
            false => Ok(()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Fences {
        let mut f = Fences::default();
        f.failed.insert(7, FailedCache { label: "vol-000003".into(), pending: [1, 5, 9].into() });
        f.failed.insert(9, FailedCache { label: "vol-000004".into(), pending: BTreeSet::new() });
        f.loss = Some(LossNote { reason: "backing flush failed".into(), since_unix_ms: 1 });
        f
    }

    #[test]
    fn file_record_survives_reopen_and_is_replaced_atomically() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("v.fences.json");
        let s = FileFences::open(&p).unwrap();
        assert_eq!(s.get(), Fences::default());
        s.update(&mut |f| *f = sample()).unwrap();
        assert!(!p.with_extension("tmp").exists());
        let again = FileFences::open(&p).unwrap();
        assert_eq!(again.get(), sample());
        assert_eq!(again.get().fenced_labels(), vec!["vol-000004".to_string()]);
    }

    #[test]
    fn a_damaged_record_is_an_error_not_an_empty_one() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("v.fences.json");
        std::fs::write(&p, b"{\"failed\": {\"7\": ").unwrap();
        let e = FileFences::open(&p).unwrap_err();
        assert!(e.to_string().contains("invalid cache fence record"), "{e}");
    }

    #[test]
    fn a_failing_store_changes_nothing() {
        let m = MemoryFences::new();
        m.set_failing(true);
        assert!(m.update(&mut |f| *f = sample()).is_err());
        assert_eq!(m.get(), Fences::default());
        m.set_failing(false);
        m.update(&mut |f| *f = sample()).unwrap();
        assert_eq!(m.get(), sample());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Fences::decode(&bytes);
        }

        #[test]
        fn encode_then_decode_is_identity(ids in proptest::collection::btree_map(any::<u64>(), proptest::collection::btree_set(any::<u64>(), 0..8), 0..4), reason in ".{0,20}") {
            let mut f = Fences::default();
            for (id, pending) in ids {
                f.failed.insert(id, FailedCache { label: format!("v{id}"), pending });
            }
            f.loss = (!reason.is_empty()).then_some(LossNote { reason, since_unix_ms: 3 });
            prop_assert_eq!(Fences::decode(&f.encode()).unwrap(), f);
        }
    }
}
