//! A node leaving the pool. It is marked draining in membership, so placement
//! stops choosing it for new chunks; then each dirty chunk it holds is handed
//! to the chunk's rendezvous owner among the remaining nodes (copied, then the
//! holder list swapped by compare-and-set: `Tier::hand_over`, which the
//! rebalance of an added node shares), unless write-back takes it to S3
//! first. A target that fails is skipped for the rest of the pass (a hung node
//! would otherwise cost a timeout per chunk). Before the node leaves, every
//! handed-over chunk not yet in S3 must still be held by a live node; one whose
//! new holders are gone is taken back and handed over again. Last, the node
//! removes itself from the holder lists of the chunks it still has, so no
//! reader is sent to a node that is gone. Clean copies are in S3 already (or
//! are cache copies of S3 objects): nothing moves for them.

use crate::meta::DrainProgress;
use crate::placement;
use crate::proto::ChunkId;
use crate::store::{ChunkData, ChunkStore};
use crate::tier::{DataError, Handover, Tier};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// A dirty chunk that is not the current version of its chunk may belong to a
/// client that stored it and has not committed yet: wait this long for it.
const UNCOMMITTED_GRACE: Duration = Duration::from_secs(10);

pub struct Drainer {
    tier: Arc<Tier>,
    store: Arc<ChunkStore>,
    me: String,
    /// Chunks handed over, with this node's copy: kept here (the store may
    /// evict clean copies) until the node leaves, in case the new holder dies
    /// before then and the chunk must be taken back.
    handed: Mutex<HashMap<ChunkId, Arc<ChunkData>>>,
}

impl Drainer {
    pub fn new(tier: Arc<Tier>, store: Arc<ChunkStore>, me: String) -> Drainer {
        Drainer { tier, store, me, handed: Mutex::default() }
    }

    /// What is left to move before the node may leave, without moving anything.
    pub fn left(&self) -> DrainProgress {
        let st = self.store.stat();
        DrainProgress { total_bytes: st.dirty_bytes, left_bytes: st.dirty_bytes, left_chunks: st.dirty_chunks, paused: false }
    }

    /// One pass over this node's dirty chunks: hands over what it can.
    /// Returns (chunks, bytes) still dirty here.
    pub fn pass(&self) -> Result<(u64, u64), DataError> {
        self.tier.forget_live_cache();
        let targets: Vec<String> = self.tier.placement_nodes().into_iter().filter(|n| *n != self.me).collect();
        let mut failed = HashSet::new();
        let (mut chunks, mut bytes) = (0, 0);
        for (c, len, age) in self.store.dirty_chunks() {
            if !self.hand_over(c, age, &targets, &mut failed)? {
                chunks += 1;
                bytes += len;
            }
        }
        Ok((chunks, bytes))
    }

    /// True when this node's copy of `c` no longer needs to stay dirty.
    /// Targets that fail go into `failed` and are not tried again.
    fn hand_over(&self, c: ChunkId, age: Duration, targets: &[String], failed: &mut HashSet<String>) -> Result<bool, DataError> {
        let (_, e) = self.tier.meta.chunks(c.ino, &[c.idx])?;
        let Some(e) = e.into_iter().next().flatten().filter(|e| e.ver == c.ver) else {
            // Superseded or deleted, or stored by a client not committed yet.
            if age < UNCOMMITTED_GRACE {
                return Ok(false);
            }
            self.store.mark_clean(&c);
            return Ok(true);
        };
        if e.persisted || !e.holders.contains(&self.me) {
            // Written back, or an extra copy nobody lists.
            self.store.mark_clean(&c);
            return Ok(true);
        }
        let Some(data) = self.store.get(&c) else { return Ok(true) };
        match self.tier.hand_over("drain", c, &e, &self.me, &data, true, &placement::rank(targets, &c), failed)? {
            Handover::To(t) => {
                tracing::info!("drain: chunk {} handed to {t} (holders were {:?})", c.member(), e.holders);
                self.handed.lock().insert(c, data);
                self.store.mark_clean(&c);
                Ok(true)
            }
            // Changed: the next pass looks again. No target: write-back takes
            // it to S3 instead.
            Handover::Changed | Handover::NoTarget => Ok(false),
        }
    }

    /// Checks every chunk handed over that is still not in S3: one that no
    /// live node holds any more (its new holder died) is taken back here,
    /// dirty, to be handed over again. Returns the chunks taken back or not
    /// yet confirmed; the node may leave only when this is 0.
    pub fn confirm_handed(&self) -> Result<u64, DataError> {
        self.tier.forget_live_cache();
        let live = self.tier.live_nodes();
        let handed: Vec<(ChunkId, Arc<ChunkData>)> = self.handed.lock().iter().map(|(c, d)| (*c, d.clone())).collect();
        // A holder that does not answer is not asked again in this check (a
        // hung node would cost a timeout per chunk).
        let mut unresponsive: HashSet<String> = HashSet::new();
        let mut unsure = 0;
        for (c, data) in handed {
            let (_, e) = self.tier.meta.chunks(c.ino, &[c.idx])?;
            let Some(e) = e.into_iter().next().flatten().filter(|e| e.ver == c.ver && !e.persisted) else {
                self.handed.lock().remove(&c); // in S3, superseded or deleted
                continue;
            };
            let held = e.holders.iter().any(|h| {
                if *h == self.me || !live.contains(h) || unresponsive.contains(h) {
                    return false;
                }
                self.tier.pool.has(h, c).unwrap_or_else(|err| {
                    tracing::warn!("drain: asking {h} whether it holds chunk {}: {err}", c.member());
                    unresponsive.insert(h.clone());
                    false
                })
            });
            if held {
                continue;
            }
            unsure += 1;
            if let Err(err) = self.store.put(c, data.to_vec(), true) {
                tracing::error!("drain: chunk {} lost its new holders {:?} and cannot be taken back: {err}", c.member(), e.holders);
                continue;
            }
            if self.tier.meta.set_holders(&c, &e.holders, std::slice::from_ref(&self.me))? {
                tracing::warn!("drain: chunk {} taken back: no live node holds it any more (holders were {:?})", c.member(), e.holders);
                self.handed.lock().remove(&c);
            }
        }
        Ok(unsure)
    }

    /// Removes this node from the holder lists of the chunk versions it still
    /// has (persisted ones, and handed-over ones). Returns how many lists changed.
    pub fn drop_from_holders(&self) -> Result<u64, DataError> {
        let mut n = 0;
        for c in self.store.chunks() {
            if self.tier.meta.drop_holder(&c, &self.me)? {
                n += 1;
            }
        }
        Ok(n)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("{addr} is not a live I/O node of this pool (live: {live})")]
    NotLive { addr: String, live: String },
    #[error("asking {addr} to drain: {why}")]
    Refused { addr: String, why: String },
    #[error("{addr} still holds {left_chunks} dirty chunks ({left_bytes} bytes) after {timeout:?}; it keeps draining")]
    Timeout { addr: String, left_chunks: u64, left_bytes: u64, timeout: Duration },
    #[error(transparent)]
    Membership(#[from] crate::membership::MembershipError),
}

/// Asks node `addr` to leave the pool and waits until it has left, calling
/// `progress` with each new state (for a progress bar).
pub fn drain_node(tier: &Tier, addr: &str, timeout: Duration, mut progress: impl FnMut(&DrainProgress)) -> Result<(), DrainError> {
    let live = tier.members.live()?;
    if !live.iter().any(|n| n.addr == addr) {
        let live = live.iter().map(|n| n.addr.as_str()).collect::<Vec<_>>().join(", ");
        return Err(DrainError::NotLive { addr: addr.into(), live });
    }
    tier.pool.drain(addr).map_err(|e| DrainError::Refused { addr: addr.into(), why: e.to_string() })?;
    let start = std::time::Instant::now();
    let mut last = DrainProgress::default();
    loop {
        let live = tier.members.live()?;
        let Some(n) = live.iter().find(|n| n.addr == addr) else {
            progress(&DrainProgress { left_bytes: 0, left_chunks: 0, ..last });
            return Ok(());
        };
        if let Some(p) = n.draining {
            if p != last {
                progress(&p);
                last = p;
            }
        }
        if start.elapsed() > timeout {
            return Err(DrainError::Timeout { addr: addr.into(), left_chunks: last.left_chunks, left_bytes: last.left_bytes, timeout });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
