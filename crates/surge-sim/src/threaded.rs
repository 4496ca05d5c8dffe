//! The threaded harness: virtual-time runs of layers that have threads of
//! their own (a stripe's mirror rebuilds, the cache's writeback, a swap
//! controller, the provider's attach delays). Every thread (closed-loop
//! fio-like workers, a sampler, the layers' own) registers on one
//! [`SimClock`], which advances to the next deadline once all of them sleep,
//! so the real layers run with real I/O on tmpfs files while the model clock
//! moves. [`crate::replay`] is the other engine: one thread, many requests in
//! flight, for layers that book their service at submission (the volume
//! models); what has threads runs here.
//!
//! The burstable experiment's Figures 1, 3 and 5 and its ephemeral stages run
//! on this harness.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use surge_block::{BlockDev, BlockError, Clock, ClockThread, Hold, SimClock};
use surge_cloud::{CloudError, CostReport, Delays, LocalConfig, LocalProvider, PriceTable, Provider};

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{what}: {source}")]
    Io { what: String, source: BlockError },
    #[error("the local cloud: {0}")]
    Cloud(#[from] CloudError),
    #[error("the run's directory: {0}")]
    Dir(#[from] std::io::Error),
    #[error("no volume named {0}")]
    NoVolume(String),
}

pub type Result<T, E = HarnessError> = std::result::Result<T, E>;

fn io(what: String) -> impl FnOnce(BlockError) -> HarnessError {
    move |source| HarnessError::Io { what, source }
}

/// The local cloud of one run: volumes on tmpfs files, scaled by `f`.
pub fn provider(dir: &Path, clock: Arc<dyn Clock>, f: f64, attach_delay: Duration) -> Result<Arc<LocalProvider>> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let cfg = LocalConfig {
        delays: Delays { create: Duration::ZERO, attach: attach_delay, detach: Duration::ZERO, delete: Duration::ZERO },
        prices: PriceTable::default(),
        epoch_unix_ns: Some(0),
        scale: surge_block::model::Scale { rate: 1.0, time: f },
        ..LocalConfig::new(dir)
    };
    Ok(Arc::new(LocalProvider::open(cfg, clock)?))
}

/// Dollars of the volumes whose name starts with `prefix` between two cost
/// reports, from exact lifetimes (the meter rounds to whole seconds, which at a
/// reduced time scale would overcharge short-lived volumes), with the billing
/// minimum scaled by `f`.
pub fn usd_between(prices: &PriceTable, at0: &CostReport, at1: &CostReport, prefix: &str, f: f64) -> f64 {
    let min = prices.minimum_seconds as f64 * f;
    let exact = |v: &surge_cloud::VolumeCost| v.usd_month * v.seconds.max(min) / prices.seconds_per_month as f64;
    at1.volumes
        .iter()
        .filter(|v| v.name.as_deref().is_some_and(|n| n.starts_with(prefix)))
        .map(|v| {
            let before = at0.volumes.iter().find(|b| b.id == v.id).map_or(0.0, exact);
            exact(v) - before
        })
        .sum()
}

/// What a worker does.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    pub name: String,
    /// Bytes per request.
    pub bs: u64,
    /// Closed-loop workers, one request in flight each (fio iodepth x numjobs).
    pub workers: usize,
    /// Addressed bytes from offset 0 (fio's file).
    pub region: u64,
    /// Percent of requests that read.
    pub read_pct: u32,
    /// Zipf theta over `region / bs` items (rank order scattered), or uniform.
    pub zipf: Option<f64>,
    /// Written into every 4 KiB page with its offset (see [`stamp`]).
    pub tag: u64,
}

/// Zipf(theta) sampler over `n` items by inverse CDF, ranks mapped to items by
/// a fixed random permutation (hot items scattered over the file, as fio's).
pub struct Zipf {
    cdf: Vec<f64>,
    perm: Vec<u64>,
}

impl Zipf {
    pub fn new(n: u64, theta: f64, seed: u64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|k| {
                acc += 1.0 / (k as f64).powf(theta);
                acc
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= acc);
        let mut perm: Vec<u64> = (0..n).collect();
        let mut rng = StdRng::seed_from_u64(seed);
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.gen_range(0..=i));
        }
        Zipf { cdf, perm }
    }

    pub fn sample(&self, rng: &mut StdRng) -> u64 {
        let u: f64 = rng.gen();
        let rank = self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1);
        self.perm[rank]
    }

    /// Probability mass of the ranks beyond the `k` most popular.
    pub fn tail_beyond(&self, k: u64) -> f64 {
        match k {
            0 => 1.0,
            k if k as usize >= self.cdf.len() => 0.0,
            k => 1.0 - self.cdf[k as usize - 1],
        }
    }
}

/// Counters the workers bump and the sampler reads.
#[derive(Default)]
pub struct Tally {
    pub ops: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
}

/// Stamp every 4 KiB page of a write with its offset and the run's tag, so a
/// final read finds misplaced or lost blocks.
pub fn stamp(buf: &mut [u8], offset: u64, tag: u64) {
    for (i, page) in buf.chunks_mut(4096).enumerate() {
        page[..8].copy_from_slice(&(offset + i as u64 * 4096).to_le_bytes());
        page[8..16].copy_from_slice(&tag.to_le_bytes());
    }
}

/// Pages of `[0, len)` whose stamp is missing or wrong (all must be stamped).
pub fn bad_pages(dev: &dyn BlockDev, len: u64, tag: u64) -> Result<u64> {
    let mut bad = 0;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        dev.read_at(&mut buf[..n], off).map_err(io(format!("reading back at {off}")))?;
        for (i, page) in buf[..n].chunks(4096).enumerate() {
            let at = off + i as u64 * 4096;
            if page.len() < 16 || page[..8] != at.to_le_bytes() || page[8..16] != tag.to_le_bytes() {
                bad += 1;
            }
        }
        off += n as u64;
    }
    Ok(bad)
}

/// Write `[0, len)` once, stamped, in 1 MiB requests (fio laying out its file).
pub fn lay_out(dev: &dyn BlockDev, len: u64, tag: u64) -> Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        stamp(&mut buf[..n], off, tag);
        dev.write_at(&buf[..n], off, false).map_err(io(format!("laying out at {off}")))?;
        off += n as u64;
    }
    dev.flush().map_err(io("flushing the laid-out file".into()))?;
    Ok(())
}

/// Run `w` on `dev` from now until `until` on `clock`; returns when every
/// worker is done. `hold` (taken before anything else was started on the
/// clock) is released once every worker has registered.
pub fn run_workers(dev: &Arc<dyn BlockDev>, clock: &Arc<SimClock>, w: &Workload, until: Duration, tally: &Arc<Tally>, seed: u64, hold: Hold) {
    let tag = w.tag;
    let zipf = w.zipf.map(|t| Arc::new(Zipf::new(w.region / w.bs, t, seed)));
    let all_in = std::sync::Barrier::new(w.workers);
    let hold = parking_lot::Mutex::new(Some(hold));
    let hold = &hold;
    std::thread::scope(|s| {
        for k in 0..w.workers {
            let (dev, clock, tally, zipf, all_in) = (dev.clone(), clock.clone(), tally.clone(), zipf.clone(), &all_in);
            s.spawn(move || {
                let _t = ClockThread::enter(clock.clone());
                if all_in.wait().is_leader() {
                    hold.lock().take();
                }
                let mut rng = StdRng::seed_from_u64(seed ^ (k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let mut buf = vec![0u8; w.bs as usize];
                let items = w.region / w.bs;
                while clock.now() < until {
                    let item = match &zipf {
                        Some(z) => z.sample(&mut rng),
                        None => rng.gen_range(0..items),
                    };
                    let off = item * w.bs;
                    let read = rng.gen_range(0..100) < w.read_pct;
                    let r = if read {
                        dev.read_at(&mut buf, off)
                    } else {
                        stamp(&mut buf, off, tag);
                        dev.write_at(&buf, off, false)
                    };
                    match r {
                        Ok(()) => {
                            tally.ops.fetch_add(1, Relaxed);
                            tally.bytes.fetch_add(w.bs, Relaxed);
                        }
                        Err(e) => {
                            if tally.errors.fetch_add(1, Relaxed) == 0 {
                                eprintln!("virtual-time run: I/O error: {e}");
                            }
                        }
                    }
                }
            });
        }
    });
}

/// One point of a run's timeline (model time, seconds since the window started).
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub t: f64,
    pub ops: u64,
    pub bytes: u64,
    /// Burst balance of each member (percent), in slot order.
    pub credits_pct: Vec<f64>,
}

/// Sample `tally` and `credits(last)` every `every` until `until` (a registered
/// thread); `last` is true for the sample at `until` (to read the bill there).
pub fn spawn_sampler(
    clock: Arc<SimClock>,
    t0: Duration,
    every: Duration,
    until: Duration,
    tally: Arc<Tally>,
    credits: impl Fn(bool) -> Vec<f64> + Send + 'static,
) -> std::thread::JoinHandle<Vec<Sample>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let _t = ClockThread::enter(clock.clone());
        tx.send(()).ok();
        let mut out = Vec::new();
        let mut next = t0;
        loop {
            clock.sleep_until(next);
            out.push(Sample { t: (clock.now() - t0).as_secs_f64(), ops: tally.ops.load(Relaxed), bytes: tally.bytes.load(Relaxed), credits_pct: credits(next >= until) });
            if next >= until {
                return out;
            }
            next = (next + every).min(until);
        }
    });
    rx.recv().ok();
    h
}

/// Rate per second between consecutive samples (`per`: ops or bytes).
pub fn rates(samples: &[Sample], per: impl Fn(&Sample) -> u64) -> Vec<(f64, f64)> {
    samples.windows(2).filter(|w| w[1].t > w[0].t).map(|w| (w[1].t, (per(&w[1]) - per(&w[0])) as f64 / (w[1].t - w[0].t))).collect()
}

/// Average rate over `[from, to]` seconds of the window.
pub fn average(samples: &[Sample], per: impl Fn(&Sample) -> u64, from: f64, to: f64) -> f64 {
    let at = |t: f64| samples.iter().min_by(|a, b| (a.t - t).abs().total_cmp(&(b.t - t).abs()));
    match (at(from), at(to)) {
        (Some(a), Some(b)) if b.t > a.t => (per(b) - per(a)) as f64 / (b.t - a.t),
        _ => 0.0,
    }
}

/// Credit balances (percent) of the volumes named, read from the models.
pub fn credits_of(provider: &LocalProvider, ids: &[String]) -> Vec<f64> {
    ids.iter().map(|id| provider.model(id).and_then(|m| m.credits().percent()).unwrap_or(f64::NAN)).collect()
}

/// Set a volume's operation credits (gp2) to `frac` of its bucket.
pub fn set_op_credits(provider: &LocalProvider, id: &str, frac: f64) {
    if let Some(m) = provider.model(id) {
        let c = m.credits();
        if let Some(cap) = c.ops_capacity {
            m.set_credits(Some((cap as f64 * frac) as u64), None);
        }
    }
}

/// Set a volume's byte credits (st1) to `frac` of its bucket.
pub fn set_byte_credits(provider: &LocalProvider, id: &str, frac: f64) {
    if let Some(m) = provider.model(id) {
        if let Some(cap) = m.credits().bytes_capacity {
            m.set_credits(None, Some((cap as f64 * frac) as u64));
        }
    }
}

/// The id of the volume named `name`.
pub fn id_of(provider: &dyn Provider, name: &str) -> Result<String> {
    provider.list()?.into_iter().find(|v| v.name.as_deref() == Some(name)).map(|v| v.id).ok_or_else(|| HarnessError::NoVolume(name.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_1_2_concentrates_on_few_items_and_covers_them_all() {
        let z = Zipf::new(1000, 1.2, 7);
        let mut rng = StdRng::seed_from_u64(1);
        let mut hits = vec![0u32; 1000];
        for _ in 0..100_000 {
            hits[z.sample(&mut rng) as usize] += 1;
        }
        let mut sorted = hits.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let top10: u32 = sorted[..100].iter().sum();
        assert!(top10 as f64 / 100_000.0 > 0.75, "10 % of items take most requests: {top10}");
        assert!((z.tail_beyond(100) - (1.0 - top10 as f64 / 100_000.0)).abs() < 0.02);
        assert_eq!(z.tail_beyond(0), 1.0);
        assert_eq!(z.tail_beyond(1000), 0.0);
    }
}
