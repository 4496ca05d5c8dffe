//! Rebalancing onto an added node. Rendezvous placement gives a node that
//! joins the chunks whose top-R set now contains it (about R/N of them); new
//! versions go there at once, and this moves the copies already cached. Each
//! node walks the chunks it holds: a current version in S3 whose top-R set no
//! longer contains this node is copied to the top-R node that does not hold it
//! yet, that node replaces this one in the holder list (`Tier::hand_over`, the
//! compare-and-set the drain uses), and this node drops its copy. So only the
//! changed share moves, one copy per chunk, and nothing moves between nodes
//! that were there before.
//!
//! Dirty chunks are left alone: write-back makes them clean within the
//! write-back delay and a later pass moves them then. Handing them over would
//! race write-back (which marks the listed holders clean) and re-replication,
//! and need the drain's take-back machinery, to save one short wait. Copies
//! nobody lists as a holder (cache copies) are left to LRU eviction.
//!
//! A pass runs when the placement nodes change, and again every `retry`
//! while chunks are left (dirty, or their target failed: a failed target is
//! skipped for the rest of the pass). Copying is paced to `rate` bytes per
//! second in a thread of its own: client I/O never waits for it.
//!
//! Nor does client I/O share the node with it: a pass starts, and each copy
//! goes, only once the node has taken no write for `quiet`; otherwise the
//! pass stops and the next one (after `retry`) looks again. A rebalance only
//! saves later reads a trip to S3, while its copies take the CPU and network
//! a write burst needs; and a pool grows during exactly such bursts.
//! (Measured, 3 rounds each: `scripts/bench/bb-seq.sh -s 256 -n 3 -m 2`, where the pool
//! grows during the first write, wrote the next two at 670-1027 MB/s with
//! rebalancing copying beside them, 1071-1306 MB/s with it off.)

use crate::meta::{ChunkEntry, DrainProgress, MetaError};
use crate::placement;
use crate::proto::ChunkId;
use crate::store::ChunkStore;
use crate::tier::{DataError, Handover, Tier};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct RebalanceConfig {
    /// Bytes per second copied to other nodes at most (0: no rebalancing).
    pub rate: u64,
    /// While chunks are left to move, look again this often.
    pub retry: Duration,
    /// Copy only once the node has taken no write for this long.
    pub quiet: Duration,
}

impl Default for RebalanceConfig {
    fn default() -> Self {
        RebalanceConfig { rate: 128 << 20, retry: Duration::from_secs(2), quiet: Duration::from_secs(1) }
    }
}

/// The node has taken no write (last at `last_write`) for `quiet` by `now`.
pub fn writes_quiet(last_write: Option<Instant>, now: Instant, quiet: Duration) -> bool {
    !matches!(last_write, Some(t) if now.saturating_duration_since(t) < quiet)
}

/// How long to wait so that `moved` bytes in `elapsed` stay within `rate` bytes/s.
pub fn pace(moved: u64, elapsed: Duration, rate: u64) -> Duration {
    if rate == 0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(moved as f64 / rate as f64).saturating_sub(elapsed)
}

/// A chunk this node holds, is listed for, and placement now puts elsewhere.
struct Move {
    c: ChunkId,
    len: u64,
    e: ChunkEntry,
}

enum Step {
    Moved,
    /// Every node placement wants has it already: this copy was surplus.
    Dropped,
    /// Not now: dirty, its target failed, or its entry changed.
    Wait,
}

/// A file deleted since its chunks were listed: nothing of it to move.
fn gone<T>(r: Result<T, MetaError>) -> Result<Option<T>, MetaError> {
    match r {
        Err(MetaError::NotFound) => Ok(None),
        r => r.map(Some),
    }
}

/// A rebalance in progress: from the first pass with something to move until
/// a pass leaves nothing.
struct Run {
    started: Instant,
    chunks: u64,
    bytes: u64,
    progress: DrainProgress,
}

/// What the rebalance thread keeps between passes.
#[derive(Default)]
pub struct State {
    /// The placement nodes at the last pass.
    nodes: Vec<String>,
    /// The last pass left chunks to move.
    left: bool,
    last: Option<Instant>,
    run: Option<Run>,
}

impl State {
    /// A pass is due: the placement nodes (sorted) changed, or chunks were
    /// left and `retry` has passed.
    pub fn due(&self, nodes: &[String], retry: Duration, now: Instant) -> bool {
        nodes != self.nodes || (self.left && self.last.is_none_or(|t| now.duration_since(t) >= retry))
    }
}

pub struct Rebalancer {
    tier: Arc<Tier>,
    store: Arc<ChunkStore>,
    me: String,
    pub cfg: RebalanceConfig,
}

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

impl Rebalancer {
    pub fn new(tier: Arc<Tier>, store: Arc<ChunkStore>, me: String, cfg: RebalanceConfig) -> Rebalancer {
        Rebalancer { tier, store, me, cfg }
    }

    /// Copies here whose top-`replicas` set over `nodes` does not contain this
    /// node (no metadata asked).
    fn misplaced(&self, nodes: &[String]) -> Vec<(ChunkId, u64)> {
        let r = self.tier.replicas;
        let here = |c: &ChunkId| placement::rank(nodes, c).into_iter().take(r).any(|n| n == self.me);
        self.store.list().into_iter().filter(|(c, _)| !here(c)).collect()
    }

    /// Of those, the current versions that list this node as a holder: a
    /// superseded copy goes when its commit discards it.
    fn to_move(&self, misplaced: Vec<(ChunkId, u64)>) -> Result<Vec<Move>, DataError> {
        let mut v = Vec::new();
        for (c, len) in misplaced {
            let Some((_, e)) = gone(self.tier.meta.chunks(c.ino, &[c.idx]))? else { continue };
            if let Some(e) = e.into_iter().flatten().find(|e| e.ver == c.ver && e.holders.contains(&self.me)) {
                v.push(Move { c, len, e });
            }
        }
        Ok(v)
    }

    fn move_one(&self, m: &Move, nodes: &[String], failed: &mut HashSet<String>) -> Result<Step, DataError> {
        if !m.e.persisted {
            return Ok(Step::Wait); // write-back first (see the module comment)
        }
        let top: Vec<&str> = placement::rank(nodes, &m.c).into_iter().take(self.tier.replicas).collect();
        if top.iter().all(|t| m.e.holders.iter().any(|h| h == t)) {
            // In S3, so dropping this holder never leaves it without a copy.
            gone(self.tier.meta.drop_holder(&m.c, &self.me))?;
            self.store.delete(&m.c);
            return Ok(Step::Dropped);
        }
        let Some(data) = self.store.get(&m.c) else { return Ok(Step::Dropped) };
        match self.tier.hand_over("rebalance", m.c, &m.e, &self.me, &data, false, &top, failed)? {
            Handover::To(t) => {
                tracing::debug!("rebalance: chunk {} moved to {t} (holders were {:?})", m.c.member(), m.e.holders);
                // Readers that looked before the swap fall back to the other holders.
                self.store.delete(&m.c);
                Ok(Step::Moved)
            }
            Handover::Changed | Handover::NoTarget => Ok(Step::Wait),
        }
    }

    fn quiet(&self) -> bool {
        writes_quiet(self.store.last_dirty_put(), Instant::now(), self.cfg.quiet)
    }

    /// One pass over the placement nodes `nodes` (sorted, this node among
    /// them): moves what it can, paced, publishing progress (None once
    /// nothing is left) and stopping early when `stop` says so or the node
    /// takes writes (see the module comment).
    pub fn pass(&self, st: &mut State, nodes: &[String], publish: &mut dyn FnMut(Option<DrainProgress>), stop: &dyn Fn() -> bool) -> Result<(), DataError> {
        let added: Vec<&String> = nodes.iter().filter(|n| !st.nodes.contains(n)).collect();
        let added = if st.nodes.is_empty() { String::new() } else { format!(" ({added:?} joined)") };
        st.nodes = nodes.to_vec();
        st.last = Some(Instant::now());
        st.left = true; // until this pass says otherwise: an error retries
        if !self.quiet() {
            tracing::debug!("rebalance: this node is taking writes; looking again in {:?}", self.cfg.retry);
            if let Some(run) = st.run.as_mut().filter(|r| !r.progress.paused) {
                run.progress.paused = true;
                publish(Some(run.progress));
            }
            return Ok(());
        }
        let work = self.to_move(self.misplaced(nodes))?;
        let total: u64 = work.iter().map(|m| m.len).sum();
        if work.is_empty() {
            st.left = false;
            if let Some(run) = st.run.take() {
                self.finish(&run);
                publish(None);
            }
            return Ok(());
        }
        let run = st.run.get_or_insert_with(|| {
            tracing::info!(
                "rebalance started: {} chunks ({:.1} MiB) held here are now placed on other nodes{added}; moving them at up to {:.0} MiB/s",
                work.len(),
                mib(total),
                mib(self.cfg.rate)
            );
            Run { started: Instant::now(), chunks: 0, bytes: 0, progress: DrainProgress::default() }
        });
        run.progress.total_bytes = run.progress.total_bytes.max(run.bytes + total);
        run.progress.paused = false;
        let (mut left, mut left_chunks) = (total, work.len() as u64);
        (run.progress.left_bytes, run.progress.left_chunks) = (left, left_chunks);
        publish(Some(run.progress));
        let mut failed = HashSet::new();
        let (start, mut moved, mut published) = (Instant::now(), 0u64, Instant::now());
        for m in &work {
            if stop() {
                break;
            }
            if !self.quiet() {
                run.progress.paused = true;
                break;
            }
            match self.move_one(m, nodes, &mut failed)? {
                Step::Moved => {
                    (run.chunks, run.bytes, moved) = (run.chunks + 1, run.bytes + m.len, moved + m.len);
                    std::thread::sleep(pace(moved, start.elapsed(), self.cfg.rate));
                }
                Step::Dropped => {}
                Step::Wait => continue,
            }
            (left, left_chunks) = (left - m.len, left_chunks - 1);
            if published.elapsed() >= Duration::from_millis(500) {
                run.progress.left_bytes = left;
                run.progress.left_chunks = left_chunks;
                publish(Some(run.progress));
                published = Instant::now();
            }
        }
        st.left = left_chunks > 0;
        if st.left {
            run.progress.left_bytes = left;
            run.progress.left_chunks = left_chunks;
            publish(Some(run.progress));
        } else if let Some(run) = st.run.take() {
            self.finish(&run);
            publish(None);
        }
        Ok(())
    }

    fn finish(&self, run: &Run) {
        tracing::info!(
            "rebalance done: moved {} chunks ({:.1} MiB, {} bytes) to other nodes in {:.1} s",
            run.chunks,
            mib(run.bytes),
            run.bytes,
            run.started.elapsed().as_secs_f64()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_keeps_the_rate() {
        let mib = 1 << 20;
        assert_eq!(pace(10 * mib, Duration::from_secs(1), 10 * mib), Duration::ZERO);
        assert_eq!(pace(20 * mib, Duration::from_millis(500), 10 * mib), Duration::from_millis(1500));
        assert_eq!(pace(20 * mib, Duration::from_secs(5), 10 * mib), Duration::ZERO, "never a negative wait");
        assert_eq!(pace(u64::MAX, Duration::ZERO, 0), Duration::ZERO, "rate 0: not paced");
    }

    #[test]
    fn copies_wait_until_the_node_has_taken_no_write_for_the_quiet_time() {
        let t0 = Instant::now();
        let quiet = Duration::from_secs(1);
        assert!(writes_quiet(None, t0, quiet), "a node that never took a write");
        assert!(!writes_quiet(Some(t0), t0 + Duration::from_millis(999), quiet));
        assert!(writes_quiet(Some(t0), t0 + quiet, quiet));
        assert!(!writes_quiet(Some(t0 + quiet), t0, quiet), "a write stamped after `now` (another thread's clock read)");
    }

    #[test]
    fn a_pass_is_due_when_placement_changes_or_chunks_were_left() {
        let t0 = Instant::now();
        let nodes = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut st = State { nodes: nodes(&["a", "b"]), last: Some(t0), ..Default::default() };
        let retry = Duration::from_secs(2);
        assert!(!st.due(&nodes(&["a", "b"]), retry, t0 + Duration::from_secs(60)), "nothing changed, nothing left");
        assert!(st.due(&nodes(&["a", "b", "c"]), retry, t0), "a node joined");
        st.left = true;
        assert!(!st.due(&nodes(&["a", "b"]), retry, t0 + Duration::from_secs(1)));
        assert!(st.due(&nodes(&["a", "b"]), retry, t0 + Duration::from_secs(2)));
    }
}
