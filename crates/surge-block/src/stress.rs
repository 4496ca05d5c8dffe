//! A randomized fault + power-cut stress run for any layer that persists
//! state (the elastic cache's `tests/cache_stress.rs` is the model it grew
//! from): writer threads, each owning its blocks, write whole and partial
//! blocks (some FUA), zero and discard them, FLUSH and read them back, while a
//! control thread drives the layer's own life (a stream job, a rebuild, a
//! member replacement, a swap) and changes the faults below it (failing
//! writes, failing flushes that lose what they held, a device that vanishes).
//! The power fails at a random event of the power domain below (or after the
//! last operation); the test then reopens the layer on the raw media and
//! checks every sector.
//!
//! The model, per sector (the value is a 32-bit tag repeated over the 512
//! bytes, so a misplaced or torn sector shows): `now`, what a read may return
//! (exact: the last acknowledged write, unless a fault was injected since it
//! was written, when anything durable or written since may show); `dur`, what
//! it held at its owner's last acknowledged FLUSH or FUA write; `since`,
//! everything written after. After the power cut a sector must hold a value of
//! `dur` or `since` (or, if a failed write covered it since it was last made
//! durable, anything). A read may fail only after a fault. A loss acknowledged
//! (see [`crate::ledger`]) makes `dur`, `since` and `now` one set: the lost
//! writes are gone, any of them may show.
//!
//! Use: implement [`Subject`] for the layer, build it over media wrapped in a
//! [`crate::crashpoint::Power`] domain and [`crate::fault::FaultDev`]s, call
//! [`run`], cut the power, reopen on the raw media and call
//! [`Models::check_after_restart`]. `SURGE_STRESS_ITERS`, `SURGE_STRESS_SECS`
//! and `SURGE_STRESS_SEED` bound a run ([`Budget::from_env`]).

use crate::crashpoint::Power;
use crate::dev::{BlockDev, ZeroMode};
use parking_lot::{Mutex, RwLock};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

pub const BS: u64 = 4096;
pub const SECTOR: u64 = 512;
const SECTORS: u64 = BS / SECTOR;

/// The layer under test, as the harness drives it.
pub trait Subject: Sync {
    /// The device the writers use.
    fn dev(&self) -> &dyn BlockDev;
    /// One step of the layer's own life, or of the faults below it, picked
    /// with `rng` (the control thread calls it until the writers are done).
    fn control(&self, rng: &mut StdRng);
    /// Faults injected below the layer so far: any of them may hide or drop
    /// data, so reads become lenient for what was written before.
    fn faults(&self) -> u64;
    /// Why FLUSH fails until acknowledged, if it does.
    fn loss(&self) -> Option<String>;
    /// Acknowledge a pending loss, as a user would.
    fn acknowledge_loss(&self);
    /// Internal consistency (after every control step).
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
    /// State worth printing when a check fails.
    fn describe(&self) -> String {
        String::new()
    }
    /// What the layer knows of 4 KiB block `b` (for failure messages).
    fn describe_block(&self, b: u64) -> String {
        let _ = b;
        String::new()
    }
}

/// What one iteration does.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub writers: u64,
    pub blocks_each: u64,
    /// Operations per writer.
    pub ops: u64,
    /// Writers also discard (a layer whose discard must read zeroes or the old data).
    pub discard: bool,
    pub seed: u64,
}

impl Plan {
    /// Bytes the writers use, from offset 0.
    pub fn region(&self) -> u64 {
        self.writers * self.blocks_each * BS
    }

    /// Block `i` of writer `t`: writers interleave, so their blocks share
    /// metadata words, stripe members and flushes.
    pub fn block_of(&self, t: u64, i: u64) -> u64 {
        i * self.writers + t
    }
}

/// The tag of a sector holding zeroes.
pub const ZERO_TAG: u32 = 0;

/// 512 bytes holding `tag`.
pub fn sector_data(tag: u32) -> [u8; SECTOR as usize] {
    let mut b = [0u8; SECTOR as usize];
    for w in b.chunks_mut(4) {
        w.copy_from_slice(&tag.to_le_bytes());
    }
    b
}

/// The tag a sector holds, or `None` if it is torn or foreign.
pub fn decode(b: &[u8]) -> Option<u32> {
    let t = u32::from_le_bytes(b[..4].try_into().unwrap());
    b.chunks(4).all(|w| w == t.to_le_bytes()).then_some(t)
}

/// `sectors` sectors of tagged contents (for a base image or initial data).
pub fn tagged(sectors: u64, tag_of: impl Fn(u64) -> u32) -> Vec<u8> {
    (0..sectors).flat_map(|s| sector_data(tag_of(s))).collect()
}

fn push_unique(v: &mut Vec<u32>, x: u32) {
    if !v.contains(&x) {
        v.push(x);
    }
}

#[derive(Clone, Debug)]
struct Sector {
    now: Vec<u32>,
    dur: Vec<u32>,
    since: Vec<u32>,
    /// A failed write covered it since it was last made durable: it may
    /// hold anything, now and after a crash.
    torn: bool,
    /// `Subject::faults` when it was last written.
    written_at: u64,
}

impl Sector {
    fn new(initial: u32) -> Self {
        Sector { now: vec![initial], dur: vec![initial], since: vec![], torn: false, written_at: 0 }
    }

    fn loose(&self, faults: u64) -> bool {
        faults != self.written_at
    }

    fn allowed_after_crash(&self, v: Option<u32>) -> bool {
        match v {
            Some(v) => self.dur.contains(&v) || self.since.contains(&v) || self.now.contains(&v),
            None => self.torn,
        }
    }

    fn allowed_now(&self, v: Option<u32>, faults: u64) -> bool {
        if self.loose(faults) {
            return self.allowed_after_crash(v);
        }
        match v {
            Some(v) => self.now.contains(&v),
            None => self.torn,
        }
    }

    /// A write (of `tag`, or zeroes) was acknowledged (`ok`) or failed.
    fn wrote(&mut self, tag: u32, ok: bool, fua: bool, faults_before: u64) {
        push_unique(&mut self.since, tag);
        if ok {
            // Exact from now on, unless a fault was injected since the write began.
            self.written_at = faults_before;
            self.now = vec![tag];
            if fua {
                self.dur = vec![tag];
                self.since.clear();
                self.torn = false;
            }
        } else {
            push_unique(&mut self.now, tag);
            self.torn = true;
        }
    }

    /// A FLUSH of the owner was acknowledged.
    fn flushed(&mut self, faults: u64) {
        let mut dur = self.now.clone();
        if self.loose(faults) {
            for &v in self.dur.iter().chain(&self.since) {
                push_unique(&mut dur, v);
            }
        }
        self.dur = dur;
        self.since.clear();
    }

    /// A loss was acknowledged: what was not durable may be gone.
    fn forget(&mut self) {
        for v in std::mem::take(&mut self.since).into_iter().chain(self.now.clone()) {
            push_unique(&mut self.dur, v);
        }
        self.now = self.dur.clone();
    }
}

/// One writer's blocks, sector by sector.
pub struct WriterModel {
    t: u64,
    sectors: Vec<Sector>,
    acks_seen: u64,
    /// Its operations, for failure messages.
    log: Vec<String>,
}

/// Every writer's model, after [`run`].
pub struct Models {
    plan: Plan,
    writers: Vec<WriterModel>,
}

/// What every thread shares.
struct World<'a> {
    s: &'a dyn Subject,
    power: &'a Power,
    plan: Plan,
    /// Held shared around each writer op and its model update, exclusively to
    /// acknowledge a loss, so that no op straddles an acknowledgement.
    gate: RwLock<()>,
    acks: AtomicU64,
    stop: AtomicBool,
    failure: Mutex<Option<String>>,
}

impl World<'_> {
    fn fail(&self, msg: String) {
        let mut f = self.failure.lock();
        if f.is_none() {
            *f = Some(msg);
        }
        self.stop.store(true, SeqCst);
    }

    fn done(&self) -> bool {
        self.stop.load(SeqCst) || self.power.is_dead()
    }
}

fn apply_acks(w: &World, m: &mut WriterModel) {
    let acks = w.acks.load(SeqCst);
    if acks != m.acks_seen {
        m.sectors.iter_mut().for_each(Sector::forget);
        m.acks_seen = acks;
    }
}

fn writer(w: &World, t: u64, initial: &(dyn Fn(u64) -> u32 + Sync)) -> WriterModel {
    let plan = w.plan;
    let mut rng = StdRng::seed_from_u64(plan.seed ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let sectors = (0..plan.blocks_each * SECTORS).map(|k| Sector::new(initial(plan.block_of(t, k / SECTORS) * SECTORS + k % SECTORS))).collect();
    let mut m = WriterModel { t, sectors, acks_seen: 0, log: Vec::new() };
    let mut next_tag = 1u32;
    let dev = w.s.dev();
    let mut log = std::mem::take(&mut m.log);
    for _ in 0..plan.ops {
        if w.done() {
            break;
        }
        let _g = w.gate.read();
        apply_acks(w, &mut m);
        let i = rng.gen_range(0..plan.blocks_each);
        let b = plan.block_of(t, i);
        let (first, n) = if rng.gen_bool(0.4) {
            (0, SECTORS)
        } else {
            let f = rng.gen_range(0..SECTORS);
            (f, rng.gen_range(1..=SECTORS - f))
        };
        let secs = (i * SECTORS + first) as usize..(i * SECTORS + first + n) as usize;
        let (off, len) = (b * BS + first * SECTOR, n * SECTOR);
        let faults_before = w.s.faults();
        match rng.gen_range(0..100) {
            0..=44 => {
                let tag = ((t as u32 + 1) << 24) | next_tag;
                next_tag += 1;
                let buf: Vec<u8> = (0..n).flat_map(|_| sector_data(tag)).collect();
                let fua = rng.gen_bool(0.1);
                let ok = dev.write_at(&buf, off, fua).is_ok();
                log.push(format!("b{b} write s{first}+{n} tag {tag} fua {fua}: ok {ok}, faults {faults_before}..{}", w.s.faults()));
                m.sectors[secs].iter_mut().for_each(|s| s.wrote(tag, ok, fua, faults_before));
            }
            45..=54 => {
                let ok = dev.write_zeroes(off, len, ZeroMode { may_trim: rng.gen_bool(0.5), fast_only: false }).is_ok();
                log.push(format!("b{b} zeroes s{first}+{n}: ok {ok}"));
                m.sectors[secs].iter_mut().for_each(|s| s.wrote(ZERO_TAG, ok, false, faults_before));
            }
            55..=61 if plan.discard => {
                // Afterwards a sector reads zeroes or what it held.
                let r = dev.discard(off, len);
                log.push(format!("b{b} discard s{first}+{n}: {r:?}"));
                for s in &mut m.sectors[secs] {
                    push_unique(&mut s.now, ZERO_TAG);
                    push_unique(&mut s.since, ZERO_TAG);
                }
            }
            62..=71 => {
                let r = dev.flush();
                log.push(format!("FLUSH: {r:?}"));
                if r.is_ok() {
                    let faults = w.s.faults();
                    m.sectors.iter_mut().for_each(|s| s.flushed(faults));
                }
            }
            _ => {
                let mut buf = vec![0u8; BS as usize];
                let r = dev.read_at(&mut buf, b * BS);
                let faults = w.s.faults();
                if w.power.is_dead() {
                    // The cut reverted unflushed writes on the media: reads now
                    // show the post-crash state, checked after the restart.
                    break;
                }
                match r {
                    Err(e) if faults == 0 => w.fail(format!("writer {t}: read of block {b} failed without any fault: {e}")),
                    Err(_) => {}
                    Ok(()) => {
                        for k in 0..SECTORS as usize {
                            let s = &m.sectors[i as usize * SECTORS as usize + k];
                            let got = decode(&buf[k * SECTOR as usize..(k + 1) * SECTOR as usize]);
                            if !s.allowed_now(got, faults) {
                                w.fail(format!(
                                    "STALE READ: writer {t}, block {b} sector {k} reads {got:?}; may read {:?} (durable {:?}, since {:?}, torn {}, faults {} now {faults}); {}\nthis writer's last operations on the block and FLUSHes:\n{}",
                                    s.now, s.dur, s.since, s.torn, s.written_at, format!("{}; block: {}", w.s.describe(), w.s.describe_block(b)), ops_on(&log, b)
                                ));
                                break;
                            }
                        }
                    }
                }
            }
        }
    }
    m.log = log;
    m
}

/// The last operations of `log` on block `b` and its FLUSHes.
fn ops_on(log: &[String], b: u64) -> String {
    let mine: Vec<&String> = log.iter().filter(|l| l.starts_with(&format!("b{b} ")) || l.starts_with("FLUSH")).collect();
    mine[mine.len().saturating_sub(30)..].iter().map(|l| l.as_str()).collect::<Vec<_>>().join("\n")
}

fn control(w: &World) {
    let mut rng = StdRng::seed_from_u64(w.plan.seed ^ 0xC0_17_20_1E);
    while !w.done() {
        w.s.control(&mut rng);
        if rng.gen_bool(0.1) && w.s.loss().is_some() {
            let _g = w.gate.write();
            w.s.acknowledge_loss();
            w.acks.fetch_add(1, SeqCst);
        }
        if let Err(e) = w.s.check() {
            w.fail(format!("layer state inconsistent: {e}"));
        }
        std::thread::yield_now();
    }
}

/// Run the writers and the control thread until the writers are done or the
/// power fails. `initial(sector)` is the tag every sector starts with.
pub fn run(s: &dyn Subject, power: &Power, plan: Plan, initial: &(dyn Fn(u64) -> u32 + Sync)) -> Result<Models, String> {
    let w = World { s, power, plan, gate: RwLock::new(()), acks: AtomicU64::new(0), stop: AtomicBool::new(false), failure: Mutex::new(None) };
    let models = std::thread::scope(|sc| {
        let ws: Vec<_> = (0..plan.writers).map(|t| sc.spawn({ let w = &w; move || writer(w, t, initial) })).collect();
        let ctl = sc.spawn(|| control(&w));
        let models: Vec<_> = ws.into_iter().map(|h| h.join()).collect();
        w.stop.store(true, SeqCst);
        let ctl = ctl.join();
        (models, ctl)
    });
    let (models, ctl) = models;
    if ctl.is_err() {
        return Err("the control thread panicked".into());
    }
    let mut writers: Vec<WriterModel> = models.into_iter().enumerate().map(|(t, m)| m.map_err(|_| format!("writer {t} panicked"))).collect::<Result<_, _>>()?;
    // Acknowledgements after a writer's last operation count too.
    for m in &mut writers {
        apply_acks(&w, m);
    }
    if let Some(f) = w.failure.lock().take() {
        return Err(f);
    }
    Ok(Models { plan, writers })
}

impl Models {
    /// After the power cut and a restart on the raw media: every sector holds
    /// what it may (its durable value, a value written since, or anything if a
    /// failed write covered it).
    pub fn check_after_restart(&self, dev: &dyn BlockDev) -> Result<(), String> {
        let mut got = vec![0u8; self.plan.region() as usize];
        dev.read_at(&mut got, 0).map_err(|e| format!("read after the restart: {e}"))?;
        self.check_bytes(&got)
    }

    /// The same check on the region's bytes.
    pub fn check_bytes(&self, got: &[u8]) -> Result<(), String> {
        for m in &self.writers {
            for (k, s) in m.sectors.iter().enumerate() {
                let b = self.plan.block_of(m.t, k as u64 / SECTORS);
                let at = (b * BS + (k as u64 % SECTORS) * SECTOR) as usize;
                let v = decode(&got[at..at + SECTOR as usize]);
                if !s.allowed_after_crash(v) {
                    return Err(format!(
                        "LOST after the power cut: block {b} sector {} (writer {}) holds {v:?}; allowed: durable {:?}, written since {:?}, now {:?} (torn {})\nthe writer's last operations on the block and FLUSHes:\n{}",
                        k as u64 % SECTORS,
                        m.t,
                        s.dur,
                        s.since,
                        s.now,
                        s.torn,
                        ops_on(&m.log, b)
                    ));
                }
            }
        }
        Ok(())
    }
}

/// How long a stress test runs: iterations, wall time, first seed.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub iters: u64,
    pub secs: u64,
    pub first_seed: u64,
    /// The same seed again and again (thread timing differs).
    pub repeat: bool,
}

impl Budget {
    /// From `SURGE_STRESS_ITERS`, `SURGE_STRESS_SECS`, `SURGE_STRESS_SEED`,
    /// `SURGE_STRESS_REPEAT=1`, with these defaults.
    pub fn from_env(iters: u64, secs: u64) -> Budget {
        let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
        Budget { iters: env("SURGE_STRESS_ITERS", iters), secs: env("SURGE_STRESS_SECS", secs), first_seed: env("SURGE_STRESS_SEED", 1), repeat: env("SURGE_STRESS_REPEAT", 0) == 1 }
    }

    /// Run `iteration(seed)` until the budget is spent; panics with the seed
    /// that reproduces a failure. A watchdog aborts a run whose iteration
    /// hangs (no progress for `hang`). Returns the iterations done.
    pub fn run(&self, name: &str, hang: Duration, iteration: impl Fn(u64) -> Result<(), String>) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(self.secs);
        let current = std::sync::Arc::new((AtomicU64::new(0), Mutex::new(Instant::now()), AtomicBool::new(false)));
        let watchdog = {
            let c = current.clone();
            let name = name.to_string();
            std::thread::spawn(move || {
                while !c.2.load(SeqCst) {
                    std::thread::sleep(Duration::from_millis(200));
                    if c.1.lock().elapsed() > hang {
                        eprintln!("{name}: HANG: seed {} made no progress for {hang:?} (SURGE_STRESS_SEED={} SURGE_STRESS_ITERS=1 reproduces the setup)", c.0.load(SeqCst), c.0.load(SeqCst));
                        std::process::abort();
                    }
                }
            })
        };
        let mut done = 0;
        for i in 0..self.iters {
            if Instant::now() > deadline {
                break;
            }
            let seed = if self.repeat { self.first_seed } else { self.first_seed + i };
            current.0.store(seed, SeqCst);
            *current.1.lock() = Instant::now();
            if let Err(e) = iteration(seed) {
                current.2.store(true, SeqCst);
                panic!("{name}: iteration {} (SURGE_STRESS_SEED={seed} SURGE_STRESS_ITERS=1 reproduces the setup): {e}", done + 1);
            }
            done += 1;
        }
        current.2.store(true, SeqCst);
        let _ = watchdog.join();
        eprintln!("{name}: {done} iterations passed (first seed {})", self.first_seed);
        assert!(done > 0, "{name}: no iteration ran");
        done
    }
}

/// Counts of what the iterations exercised, printed at the end so a passing
/// run says what it covered.
#[derive(Default)]
pub struct Tally {
    counts: Mutex<Vec<(&'static str, u64)>>,
}

impl Tally {
    pub fn count(&self, what: &'static str, yes: bool) {
        let mut c = self.counts.lock();
        match c.iter_mut().find(|(k, _)| *k == what) {
            Some((_, n)) => *n += u64::from(yes),
            None => c.push((what, u64::from(yes))),
        }
    }

    pub fn get(&self, what: &str) -> u64 {
        self.counts.lock().iter().find(|(k, _)| *k == what).map_or(0, |(_, n)| *n)
    }

    pub fn report(&self) -> String {
        self.counts.lock().iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
    }
}

/// Random fault rules for a device below the layer: `volatile` (a write cache
/// the power cut empties) and `flush.fail_loses` always; some failing writes,
/// flushes, reads, torn writes, a vanishing device, by `rng`.
pub fn random_rules(rng: &mut StdRng, may_vanish: bool) -> crate::fault::FaultRules {
    let mut s = format!("volatile,flush.fail_loses,seed={}", rng.gen::<u32>());
    if rng.gen_bool(0.6) {
        s += &format!(",flush.fail_prob={}", [0.02, 0.1, 0.3][rng.gen_range(0..3)]);
    }
    if rng.gen_bool(0.4) {
        s += &format!(",write.fail_prob={}", [0.005, 0.02, 0.05][rng.gen_range(0..3)]);
    }
    if rng.gen_bool(0.2) {
        s += &format!(",read.fail_prob={}", [0.005, 0.02][rng.gen_range(0..2)]);
    }
    if rng.gen_bool(0.1) {
        s += &format!(",tear_nth={}", rng.gen_range(1..200));
    }
    if may_vanish && rng.gen_bool(0.1) {
        s += &format!(",vanish_after={}", rng.gen_range(1..400));
    }
    s.parse().expect("valid rules")
}

/// Faults a [`crate::fault::FaultDev`] injected (each may hide or drop data).
pub fn injected(d: &crate::fault::FaultDev) -> u64 {
    let s = d.stats();
    s.injected.iter().sum::<u64>() + s.gone + s.torn + s.lost_bytes
}
