//! Crash-point enumeration: make a persistent layer "lose power" at the N-th write
//! or flush of its metadata, for every N in turn, then reopen it and check.
//!
//! Two parts:
//! - [`Power`] and [`CrashDev`]: devices wrapped by [`Power::wrap`] share one power
//!   domain. Mutations (write, write-zeroes, discard) and flushes of *counted*
//!   devices are numbered 1, 2, ... When the armed event number is reached the
//!   power fails: that event does not complete (a write is dropped, or torn: only
//!   some of its sectors reach the medium), the volatile write caches of every
//!   device in the domain lose what the [`Volatile`] model says, and every later
//!   mutation or flush fails with [`BlockError::Gone`] (or is silently dropped, see
//!   [`AfterDeath`]). Reads still work. The wrapped (inner) devices then hold
//!   exactly the state a real disk would have after the power cut, so a test
//!   reopens the layer straight on them.
//! - [`enumerate`]: runs an operation once to count its events, then once per
//!   crash point (every event, plus "just after the operation returned"), and
//!   calls a verify closure that reopens the layer and checks an invariant or a
//!   reference model (see [`crate::conformance::Model`]).
//!
//! The volatile cache model matters: a real disk acknowledges a write before it is
//! durable, and persists unflushed writes in any order, even partly. Only a FLUSH
//! (or a FUA write) makes data durable. [`Volatile::RandomSectors`] is the strictest
//! model: every 512-byte sector of every unflushed write independently survives or
//! not (still applied in order, so a sector ends up with one of the versions written
//! to it since the last flush, or its flushed contents).
//!
//! # Example: a two-slot checksummed record
//!
//! ```
//! use std::sync::Arc;
//! use surge_block::{BlockDev, MemoryDev};
//! use surge_block::crashpoint::{enumerate, EnumConfig, Volatile};
//!
//! // Slot i holds [generation u64][value u64][checksum u64] at i * 512.
//! fn encode(gen: u64, val: u64) -> [u8; 24] {
//!     let mut b = [0u8; 24];
//!     b[..8].copy_from_slice(&gen.to_le_bytes());
//!     b[8..16].copy_from_slice(&val.to_le_bytes());
//!     b[16..].copy_from_slice(&(gen.wrapping_mul(31) ^ val ^ 0x5eed).to_le_bytes());
//!     b
//! }
//! fn load(dev: &dyn BlockDev) -> (u64, u64) {
//!     let mut best = (0, 0);
//!     for slot in 0..2 {
//!         let mut b = [0u8; 24];
//!         dev.read_at(&mut b, slot * 512).unwrap();
//!         let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
//!         if b != [0; 24] && encode(w(0), w(1)) == b && w(0) > best.0 {
//!             best = (w(0), w(1));
//!         }
//!     }
//!     best
//! }
//! fn store(dev: &dyn BlockDev, gen: u64, val: u64) -> surge_block::Result<()> {
//!     dev.write_at(&encode(gen, val), (gen % 2) * 512, false)?;
//!     dev.flush()
//! }
//!
//! let report = enumerate(
//!     &EnumConfig { volatile: Volatile::RandomSectors, variants: 4, ..EnumConfig::default() },
//!     || {
//!         // Fixture: a medium that durably holds generation 1 = 10.
//!         let dev = Arc::new(MemoryDev::new(4096));
//!         store(dev.as_ref(), 1, 10).unwrap();
//!         dev
//!     },
//!     |medium, power| store(power.wrap(medium.clone(), true).as_ref(), 2, 20).is_ok(),
//!     |medium, _point, acked| {
//!         let got = load(medium.as_ref());
//!         match (acked, got) {
//!             (true, (2, 20)) | (false, (1, 10)) | (false, (2, 20)) => Ok(()),
//!             _ => Err(format!("acked={acked} but recovered {got:?}")),
//!         }
//!     },
//! )
//! .unwrap();
//! assert_eq!(report.events, 2); // one write, one flush
//! ```

use crate::dev::{check_range, BlockDev, Caps, Extent, ZeroMode};
use crate::error::{BlockError, Result};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::sync::Arc;

/// What happens to writes that completed but were not yet flushed, at a power cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Volatile {
    /// No volatile cache: every completed write is durable (a write-through disk).
    Off,
    /// Every unflushed non-FUA write is lost.
    LoseAll,
    /// Each unflushed write independently survives or not (seeded).
    RandomWrites,
    /// Each sector of each unflushed write independently survives or not (seeded).
    #[default]
    RandomSectors,
}

/// What the event that hits the crash point does, if it is a mutation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DyingWrite {
    /// Nothing of it reaches the medium.
    Dropped,
    /// A random subset of its sectors reaches the medium (seeded).
    #[default]
    Torn,
}

/// How the domain behaves after the power cut (the process may still be running
/// code for a moment, as after a real cut it would not; tests choose).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterDeath {
    /// Mutations and flushes fail with `BlockError::Gone`.
    #[default]
    Fail,
    /// Mutations and flushes "succeed" but change nothing (the layer may go on to
    /// acknowledge things it never persisted; verify must catch that).
    Drop,
}

/// One numbered event of a counted device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Write { offset: u64, len: u64 },
    Flush,
}

/// Where a run of [`enumerate`] crashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashPoint {
    /// 1-based event number; `total + 1` means "after the operation returned".
    pub n: u64,
    /// Events the operation performs when it does not crash.
    pub total: u64,
    /// The event that did not complete (`None` for the after-return point).
    pub event: Option<Event>,
    /// Index of the volatile-loss variant (0..variants) for this point.
    pub variant: u32,
    pub seed: u64,
}

impl CrashPoint {
    /// The crash came after the operation returned.
    pub fn after_return(&self) -> bool {
        self.n > self.total
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.event {
            Some(e) => write!(f, "crash at event {}/{} ({e:?}), variant {}, seed {}", self.n, self.total, self.variant, self.seed),
            None => write!(f, "crash after return ({} events), variant {}, seed {}", self.total, self.variant, self.seed),
        }
    }
}

/// How a power domain fails.
#[derive(Debug, Clone, Copy)]
pub struct PowerConfig {
    /// The 1-based event number at which power fails; `None` never (a counting run).
    pub crash_at: Option<u64>,
    pub volatile: Volatile,
    pub dying_write: DyingWrite,
    pub after: AfterDeath,
    /// Atomic unit of the media, for torn writes and sector-level loss.
    pub sector: u32,
    pub seed: u64,
}

impl Default for PowerConfig {
    fn default() -> Self {
        PowerConfig {
            crash_at: None,
            volatile: Volatile::default(),
            dying_write: DyingWrite::default(),
            after: AfterDeath::default(),
            sector: 512,
            seed: 0,
        }
    }
}

/// A completed, not yet flushed mutation: enough to undo and redo it.
struct Pending {
    offset: u64,
    old: Vec<u8>,
    new: Vec<u8>,
    /// FUA: durable already, survives the cut.
    durable: bool,
}

struct DevState {
    inner: Arc<dyn BlockDev>,
    counted: bool,
    log: Vec<Pending>,
}

struct PowerState {
    cfg: PowerConfig,
    events: u64,
    history: Vec<Event>,
    dead: bool,
    died_at: Option<Event>,
    devs: Vec<DevState>,
    rng: StdRng,
}

/// A power domain shared by the devices wrapped through it. One lock serializes
/// all I/O in the domain: this is a test tool, and it keeps logs and media in the
/// same order.
pub struct Power {
    state: Mutex<PowerState>,
}

impl Power {
    pub fn new(cfg: PowerConfig) -> Arc<Self> {
        Arc::new(Power {
            state: Mutex::new(PowerState {
                rng: StdRng::seed_from_u64(cfg.seed),
                cfg,
                events: 0,
                history: Vec::new(),
                dead: false,
                died_at: None,
                devs: Vec::new(),
            }),
        })
    }

    /// Put `inner` in this domain. Events of `counted` devices are numbered and can
    /// be crash points; uncounted devices (e.g. a data device) only lose their
    /// volatile cache at the cut and fail afterwards.
    pub fn wrap(self: &Arc<Self>, inner: Arc<dyn BlockDev>, counted: bool) -> Arc<CrashDev> {
        let mut st = self.state.lock();
        st.devs.push(DevState { inner: inner.clone(), counted, log: Vec::new() });
        Arc::new(CrashDev { power: self.clone(), id: st.devs.len() - 1, size: inner.size() })
    }

    /// Events counted so far.
    pub fn events(&self) -> u64 {
        self.state.lock().events
    }

    /// Every counted event so far, in order.
    pub fn history(&self) -> Vec<Event> {
        self.state.lock().history.clone()
    }

    pub fn is_dead(&self) -> bool {
        self.state.lock().dead
    }

    /// The event at which power failed, if it failed at an event.
    pub fn died_at(&self) -> Option<Event> {
        self.state.lock().died_at
    }

    /// Cut the power now (if not already cut): volatile caches lose what the model
    /// says, later mutations fail. Afterwards the inner devices hold the post-crash
    /// state.
    pub fn cut(&self) {
        let mut st = self.state.lock();
        if !st.dead {
            st.die();
        }
    }
}

impl PowerState {
    /// Apply the power cut to every device's medium.
    fn die(&mut self) {
        self.dead = true;
        let cfg = self.cfg;
        let sector = cfg.sector.max(1) as usize;
        for d in 0..self.devs.len() {
            let log = std::mem::take(&mut self.devs[d].log);
            let inner = self.devs[d].inner.clone();
            if cfg.volatile == Volatile::Off || log.is_empty() {
                continue;
            }
            // Undo everything since the last flush (newest first) to get the flushed
            // state back, then redo what survives, oldest first.
            for p in log.iter().rev() {
                let _ = inner.write_at(&p.old, p.offset, false);
            }
            for p in &log {
                if p.durable {
                    let _ = inner.write_at(&p.new, p.offset, false);
                    continue;
                }
                match cfg.volatile {
                    Volatile::Off => unreachable!(),
                    Volatile::LoseAll => {}
                    Volatile::RandomWrites => {
                        if self.rng.gen_bool(0.5) {
                            let _ = inner.write_at(&p.new, p.offset, false);
                        }
                    }
                    Volatile::RandomSectors => write_random_sectors(&*inner, &mut self.rng, p.offset, &p.new, sector),
                }
            }
            let _ = inner.flush();
        }
    }

    /// Count an event of device `id`; true if power fails at it.
    fn tick(&mut self, id: usize, ev: Event) -> bool {
        if !self.devs[id].counted {
            return false;
        }
        self.events += 1;
        self.history.push(ev);
        if self.cfg.crash_at == Some(self.events) {
            self.died_at = Some(ev);
            return true;
        }
        false
    }

    fn after_death(&self) -> Result<()> {
        match self.cfg.after {
            AfterDeath::Fail => Err(BlockError::Gone("power cut (crash-point test)".into())),
            AfterDeath::Drop => Ok(()),
        }
    }
}

/// Write the sectors of `data` (placed at `offset`) that a coin toss keeps. Sector
/// boundaries are absolute (multiples of `sector` on the device).
fn write_random_sectors(dev: &dyn BlockDev, rng: &mut StdRng, offset: u64, data: &[u8], sector: usize) {
    let mut pos = 0usize;
    while pos < data.len() {
        let abs = offset + pos as u64;
        let n = (sector - (abs % sector as u64) as usize).min(data.len() - pos);
        if rng.gen_bool(0.5) {
            let _ = dev.write_at(&data[pos..pos + n], abs, false);
        }
        pos += n;
    }
}

/// A device in a [`Power`] domain. See the module docs.
pub struct CrashDev {
    power: Arc<Power>,
    id: usize,
    size: u64,
}

impl CrashDev {
    pub fn power(&self) -> &Arc<Power> {
        &self.power
    }

    /// Run a mutation: count it, maybe die at it, log it for the volatile model.
    /// `new` computes the contents the range holds after a successful op.
    fn mutate(&self, offset: u64, len: u64, fua: bool, new: impl FnOnce() -> Vec<u8>, op: impl FnOnce(&dyn BlockDev) -> Result<()>) -> Result<()> {
        check_range(self.size, offset, len)?;
        let mut st = self.power.state.lock();
        if st.dead {
            return st.after_death();
        }
        let inner = st.devs[self.id].inner.clone();
        if st.tick(self.id, Event::Write { offset, len }) {
            st.die();
            if st.cfg.dying_write == DyingWrite::Torn {
                let sector = st.cfg.sector.max(1) as usize;
                let data = new();
                write_random_sectors(&*inner, &mut st.rng, offset, &data, sector);
                let _ = inner.flush();
            }
            return Err(BlockError::Gone(format!("power cut at write of {len} bytes at {offset}")));
        }
        let volatile = st.cfg.volatile != Volatile::Off;
        let old = if volatile {
            let mut old = vec![0u8; len as usize];
            inner.read_at(&mut old, offset)?;
            Some(old)
        } else {
            None
        };
        op(&*inner)?;
        if let Some(old) = old {
            st.devs[self.id].log.push(Pending { offset, old, new: new(), durable: fua });
        }
        Ok(())
    }
}

impl BlockDev for CrashDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        let st = self.power.state.lock();
        let mut caps = st.devs[self.id].inner.caps();
        caps.volatile_cache |= st.cfg.volatile != Volatile::Off;
        caps
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let inner = self.power.state.lock().devs[self.id].inner.clone();
        // Reads do not need the domain lock: mutations of a range a caller is
        // reading concurrently are undefined anyway.
        inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.mutate(offset, buf.len() as u64, fua, || buf.to_vec(), |d| d.write_at(buf, offset, fua))
    }

    fn flush(&self) -> Result<()> {
        let mut st = self.power.state.lock();
        if st.dead {
            return st.after_death();
        }
        if st.tick(self.id, Event::Flush) {
            st.die();
            return Err(BlockError::Gone("power cut at flush".into()));
        }
        let inner = st.devs[self.id].inner.clone();
        inner.flush()?;
        st.devs[self.id].log.clear();
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        // Afterwards the range may read as anything; record what it reads as.
        let inner = self.power.state.lock().devs[self.id].inner.clone();
        let after = |d: &dyn BlockDev| {
            let mut b = vec![0u8; len as usize];
            d.read_at(&mut b, offset).map(|_| b).unwrap_or_default()
        };
        self.mutate(offset, len, false, || after(&*inner), |d| d.discard(offset, len))
    }

    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.mutate(offset, len, false, || vec![0u8; len as usize], |d| d.write_zeroes(offset, len, mode))
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let inner = self.power.state.lock().devs[self.id].inner.clone();
        inner.block_status(offset, len)
    }
}

/// How [`enumerate`] explores crash points.
#[derive(Debug, Clone, Copy)]
pub struct EnumConfig {
    pub volatile: Volatile,
    pub dying_write: DyingWrite,
    pub after: AfterDeath,
    pub sector: u32,
    /// Runs per crash point with different seeds (random models only).
    pub variants: u32,
    pub seed: u64,
    /// Also crash just after the operation returned.
    pub after_return: bool,
}

impl Default for EnumConfig {
    fn default() -> Self {
        EnumConfig {
            volatile: Volatile::default(),
            dying_write: DyingWrite::default(),
            after: AfterDeath::default(),
            sector: 512,
            variants: 3,
            seed: 1,
            after_return: true,
        }
    }
}

/// What an enumeration covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EnumReport {
    /// Counted events of the operation (crash points = events + after-return).
    pub events: u64,
    /// Crash runs made (points x variants).
    pub runs: u64,
}

/// For an operation under test: count its metadata events, then for every crash
/// point (and variant) build a fresh fixture, run the operation in a power domain
/// armed to fail there, cut the power if the operation returned first, and verify.
///
/// - `prepare()` builds the fixture in its pre-operation, durable state (e.g. the
///   metadata medium, or a struct holding several media).
/// - `run(&fixture, &power)` opens the layer on devices wrapped with
///   `power.wrap(..)` and performs the operation; its result (e.g. "acknowledged")
///   goes to `verify`. Errors after the cut are expected.
/// - `verify(&fixture, &point, result)` reopens the layer on the *raw* media of the
///   fixture (now in post-crash state) and checks invariants.
///
/// Returns the first failure with its crash point, so it can be replayed.
pub fn enumerate<F, R>(
    cfg: &EnumConfig,
    mut prepare: impl FnMut() -> F,
    mut run: impl FnMut(&F, &Arc<Power>) -> R,
    mut verify: impl FnMut(&F, &CrashPoint, R) -> std::result::Result<(), String>,
) -> std::result::Result<EnumReport, String> {
    let power_cfg = |crash_at, seed| PowerConfig {
        crash_at,
        volatile: cfg.volatile,
        dying_write: cfg.dying_write,
        after: cfg.after,
        sector: cfg.sector,
        seed,
    };
    // Counting run (no crash): also checks the operation is sound without one.
    let fixture = prepare();
    let power = Power::new(power_cfg(None, cfg.seed));
    let result = run(&fixture, &power);
    let total = power.events();
    let history = power.history();
    let clean = CrashPoint { n: total + 1, total, event: None, variant: 0, seed: cfg.seed };
    drop(power);
    // Without a cut, what the operation left must verify as an after-return point.
    verify(&fixture, &clean, result).map_err(|e| format!("without a crash ({total} events): {e}"))?;

    let random = matches!(cfg.volatile, Volatile::RandomWrites | Volatile::RandomSectors) || cfg.dying_write == DyingWrite::Torn;
    let variants = if random { cfg.variants.max(1) } else { 1 };
    let last = if cfg.after_return { total + 1 } else { total };
    let mut report = EnumReport { events: total, runs: 0 };
    for n in 1..=last {
        for variant in 0..variants {
            let seed = cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(n * 1000 + variant as u64);
            let fixture = prepare();
            let power = Power::new(power_cfg(Some(n), seed));
            let result = run(&fixture, &power);
            let event = if n <= total {
                let died = power.died_at();
                if died.is_none() {
                    return Err(format!(
                        "crash point {n}/{total} never reached: the operation is not deterministic (counting run saw {:?})",
                        history.get(n as usize - 1)
                    ));
                }
                died
            } else {
                None
            };
            power.cut();
            let point = CrashPoint { n, total, event, variant, seed };
            report.runs += 1;
            verify(&fixture, &point, result).map_err(|e| format!("{point}: {e}"))?;
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryDev;

    fn mem(size: u64) -> Arc<dyn BlockDev> {
        Arc::new(MemoryDev::new(size))
    }

    fn read(dev: &dyn BlockDev, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        dev.read_at(&mut b, off).unwrap();
        b
    }

    #[test]
    fn events_are_counted_only_on_counted_devices() {
        let power = Power::new(PowerConfig::default());
        let meta = power.wrap(mem(4096), true);
        let data = power.wrap(mem(4096), false);
        meta.write_at(&[1; 10], 0, false).unwrap();
        data.write_at(&[1; 10], 0, false).unwrap();
        meta.flush().unwrap();
        data.flush().unwrap();
        meta.write_zeroes(0, 512, ZeroMode::default()).unwrap();
        assert_eq!(power.events(), 3);
        assert_eq!(power.history(), vec![Event::Write { offset: 0, len: 10 }, Event::Flush, Event::Write { offset: 0, len: 512 }]);
    }

    #[test]
    fn dying_write_is_dropped_and_later_writes_fail_but_reads_work() {
        let raw = mem(4096);
        let power = Power::new(PowerConfig { crash_at: Some(2), volatile: Volatile::Off, dying_write: DyingWrite::Dropped, ..Default::default() });
        let dev = power.wrap(raw.clone(), true);
        dev.write_at(&[7; 512], 0, false).unwrap();
        let e = dev.write_at(&[8; 512], 512, false).unwrap_err();
        assert!(matches!(e, BlockError::Gone(_)), "{e}");
        assert!(power.is_dead());
        assert!(matches!(dev.write_at(&[9; 512], 1024, false), Err(BlockError::Gone(_))));
        assert!(matches!(dev.flush(), Err(BlockError::Gone(_))));
        assert_eq!(read(dev.as_ref(), 0, 512), vec![7; 512], "reads still work");
        assert_eq!(read(raw.as_ref(), 512, 1024), vec![0; 1024], "nothing of the dying or later writes landed");
    }

    #[test]
    fn after_death_drop_mode_pretends_success_but_changes_nothing() {
        let raw = mem(4096);
        let power = Power::new(PowerConfig { crash_at: Some(1), after: AfterDeath::Drop, dying_write: DyingWrite::Dropped, ..Default::default() });
        let dev = power.wrap(raw.clone(), true);
        assert!(dev.write_at(&[1; 512], 0, false).is_err(), "the dying write itself fails");
        dev.write_at(&[2; 512], 0, false).unwrap();
        dev.flush().unwrap();
        assert_eq!(read(raw.as_ref(), 0, 512), vec![0; 512]);
    }

    #[test]
    fn lose_all_keeps_exactly_the_flushed_and_fua_data() {
        let raw = mem(8192);
        let power = Power::new(PowerConfig { volatile: Volatile::LoseAll, ..Default::default() });
        let dev = power.wrap(raw.clone(), true);
        dev.write_at(&[1; 1024], 0, false).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[2; 512], 0, false).unwrap(); // unflushed overwrite: lost
        dev.write_at(&[3; 512], 2048, true).unwrap(); // FUA: kept
        dev.write_at(&[4; 512], 2048, false).unwrap(); // unflushed overwrite of FUA: lost
        dev.write_at(&[5; 512], 4096, false).unwrap(); // lost
        assert_eq!(read(dev.as_ref(), 0, 512), vec![2; 512], "before the cut, reads see the cache");
        power.cut();
        assert_eq!(read(raw.as_ref(), 0, 1024), vec![1; 1024]);
        assert_eq!(read(raw.as_ref(), 2048, 512), vec![3; 512]);
        assert_eq!(read(raw.as_ref(), 4096, 512), vec![0; 512]);
    }

    #[test]
    fn random_sectors_leave_each_sector_with_one_written_version() {
        for seed in 0..50 {
            let raw = mem(8192);
            let power = Power::new(PowerConfig { volatile: Volatile::RandomSectors, seed, ..Default::default() });
            let dev = power.wrap(raw.clone(), true);
            dev.write_at(&[1; 4096], 0, false).unwrap();
            dev.flush().unwrap();
            dev.write_at(&[2; 4096], 0, false).unwrap();
            dev.write_at(&[3; 2048], 1024, false).unwrap();
            power.cut();
            let got = read(raw.as_ref(), 0, 4096);
            for (s, chunk) in got.chunks(512).enumerate() {
                let v = chunk[0];
                assert!(chunk.iter().all(|&b| b == v), "seed {seed}: sector {s} is mixed");
                let allowed: &[u8] = if (2..6).contains(&s) { &[1, 2, 3] } else { &[1, 2] };
                assert!(allowed.contains(&v), "seed {seed}: sector {s} holds {v}");
            }
        }
    }

    #[test]
    fn random_sectors_eventually_produce_every_outcome() {
        // The model must really lose data sometimes, and keep it sometimes.
        let mut seen = std::collections::HashSet::new();
        for seed in 0..64 {
            let raw = mem(1024);
            let power = Power::new(PowerConfig { volatile: Volatile::RandomSectors, seed, ..Default::default() });
            let dev = power.wrap(raw.clone(), true);
            dev.write_at(&[9; 1024], 0, false).unwrap();
            power.cut();
            let got = read(raw.as_ref(), 0, 1024);
            seen.insert((got[0], got[512]));
        }
        assert_eq!(seen.len(), 4, "{seen:?}");
    }

    #[test]
    fn torn_dying_write_persists_a_sector_subset() {
        let mut partial = false;
        for seed in 0..32 {
            let raw = mem(4096);
            let power = Power::new(PowerConfig { crash_at: Some(1), dying_write: DyingWrite::Torn, seed, ..Default::default() });
            let dev = power.wrap(raw.clone(), true);
            assert!(dev.write_at(&[5; 2048], 0, false).is_err());
            let got = read(raw.as_ref(), 0, 2048);
            let kept = got.chunks(512).filter(|c| c[0] == 5).count();
            assert!(got.chunks(512).all(|c| c.iter().all(|&b| b == c[0]) && (c[0] == 0 || c[0] == 5)));
            partial |= kept > 0 && kept < 4;
        }
        assert!(partial, "some seed must tear the write");
    }

    #[test]
    fn the_cut_reaches_uncounted_devices_too() {
        let meta_raw = mem(4096);
        let data_raw = mem(4096);
        let power = Power::new(PowerConfig { crash_at: Some(2), volatile: Volatile::LoseAll, ..Default::default() });
        let meta = power.wrap(meta_raw.clone(), true);
        let data = power.wrap(data_raw.clone(), false);
        data.write_at(&[1; 512], 0, false).unwrap();
        meta.write_at(&[1; 512], 0, false).unwrap();
        assert!(meta.flush().is_err(), "the flush is event 2: power fails");
        assert!(data.write_at(&[2; 512], 0, false).is_err());
        assert_eq!(read(data_raw.as_ref(), 0, 512), vec![0; 512], "unflushed data write lost");
        assert_eq!(read(meta_raw.as_ref(), 0, 512), vec![0; 512]);
    }

    // --- the harness on a good and a bad persistent structure ---

    /// Good: a checksummed record in two alternating slots, flushed.
    fn encode(gen: u64, val: u64) -> Vec<u8> {
        let mut b = vec![0u8; 600]; // spans two sectors, so tearing matters
        b[..8].copy_from_slice(&gen.to_le_bytes());
        b[8..16].copy_from_slice(&val.to_le_bytes());
        for (i, x) in b[16..592].iter_mut().enumerate() {
            *x = (val as usize + i) as u8;
        }
        let sum: u64 = b[..592].iter().map(|&x| x as u64).sum::<u64>() ^ 0xabcdef;
        b[592..].copy_from_slice(&sum.to_le_bytes());
        b
    }
    fn decode(b: &[u8]) -> Option<(u64, u64)> {
        let w = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let (gen, val) = (w(0), w(8));
        (gen > 0 && encode(gen, val) == b).then_some((gen, val))
    }
    fn load_slots(dev: &dyn BlockDev) -> Option<(u64, u64)> {
        (0..2).filter_map(|s| decode(&read(dev, s * 1024, 600))).max()
    }
    fn store_slots(dev: &dyn BlockDev, gen: u64, val: u64) -> Result<()> {
        dev.write_at(&encode(gen, val), (gen % 2) * 1024, false)?;
        dev.flush()
    }

    fn slots_fixture() -> Arc<dyn BlockDev> {
        let d = mem(4096);
        store_slots(d.as_ref(), 1, 100).unwrap();
        store_slots(d.as_ref(), 2, 200).unwrap();
        d
    }

    /// Acknowledged => new value; otherwise old or new; never anything else.
    fn old_or_new(dev: &dyn BlockDev, acked: bool) -> std::result::Result<(), String> {
        match (acked, load_slots(dev)) {
            (true, Some((3, 300))) | (false, Some((2, 200))) | (false, Some((3, 300))) => Ok(()),
            (a, got) => Err(format!("acked={a}, recovered {got:?}")),
        }
    }

    #[test]
    fn alternating_checksummed_slots_survive_every_crash_point() {
        for volatile in [Volatile::Off, Volatile::LoseAll, Volatile::RandomWrites, Volatile::RandomSectors] {
            for dying_write in [DyingWrite::Dropped, DyingWrite::Torn] {
                let cfg = EnumConfig { volatile, dying_write, variants: 8, ..Default::default() };
                let report = enumerate(
                    &cfg,
                    slots_fixture,
                    |m, p| store_slots(p.wrap(m.clone(), true).as_ref(), 3, 300).is_ok(),
                    |m, _, acked| old_or_new(m.as_ref(), acked),
                )
                .unwrap_or_else(|e| panic!("{volatile:?}/{dying_write:?}: {e}"));
                assert_eq!(report.events, 2);
                assert!(report.runs >= 3);
            }
        }
    }

    #[test]
    fn in_place_update_is_caught_by_torn_writes() {
        // Bad: overwrite the single record in place. A torn write destroys it.
        let store_in_place = |dev: &dyn BlockDev, gen: u64, val: u64| -> Result<()> {
            dev.write_at(&encode(gen, val), 0, false)?;
            dev.flush()
        };
        let err = enumerate(
            &EnumConfig { volatile: Volatile::Off, dying_write: DyingWrite::Torn, variants: 16, ..Default::default() },
            || {
                let d = mem(4096);
                store_in_place(d.as_ref(), 2, 200).unwrap();
                d
            },
            |m, p| store_in_place(p.wrap(m.clone(), true).as_ref(), 3, 300).is_ok(),
            |m, _, acked| match (acked, decode(&read(m.as_ref(), 0, 600))) {
                (true, Some((3, 300))) | (false, Some((2, 200))) | (false, Some((3, 300))) => Ok(()),
                (a, got) => Err(format!("acked={a}, recovered {got:?}")),
            },
        )
        .unwrap_err();
        assert!(err.contains("crash at event 1/2"), "{err}");
    }

    #[test]
    fn acknowledging_without_flush_is_caught_by_the_volatile_model() {
        // Bad: "commit" returns success without a flush.
        let err = enumerate(
            &EnumConfig { volatile: Volatile::LoseAll, ..Default::default() },
            slots_fixture,
            |m, p| p.wrap(m.clone(), true).write_at(&encode(3, 300), 1024, false).is_ok(),
            |m, _, acked| old_or_new(m.as_ref(), acked),
        )
        .unwrap_err();
        assert!(err.contains("after return"), "{err}");
    }

    #[test]
    fn nondeterministic_operation_is_reported() {
        let calls = std::cell::Cell::new(0u64);
        let err = enumerate(
            &EnumConfig { volatile: Volatile::Off, dying_write: DyingWrite::Dropped, ..Default::default() },
            || mem(4096),
            |m, p| {
                calls.set(calls.get() + 1);
                let d = p.wrap(m.clone(), true);
                // First (counting) run writes 3 times, later runs once.
                let n = if calls.get() == 1 { 3 } else { 1 };
                for i in 0..n {
                    let _ = d.write_at(&[1; 8], i * 8, false);
                }
            },
            |_, _, _| Ok(()),
        )
        .unwrap_err();
        assert!(err.contains("never reached"), "{err}");
    }
}
