//! Test support: threads doing I/O through a layer whose device below fails
//! writes and flushes ([`crate::fault::FaultDev`]), with per-sector bookkeeping
//! of what each sector may read afterwards, live and after a crash.
//!
//! Each thread owns whole groups of sectors (group `k` belongs to thread
//! `k % threads`), so every sector has one writer and its history is exact,
//! while neighbouring groups of different threads still share metadata words,
//! members and flushes. A sector's content is `pattern(seed, offset, 512)`;
//! seed 0 stands for the initial contents, [`ZEROES`] for zeroes.
//!
//! A failed FLUSH may undo what was written since the last good one (the
//! device below may have dropped it, and a layer must not map a block to
//! bytes that may not be there), so after it every such sector may read its
//! durable content or any write since; a read that overlaps a FLUSH which
//! fails is judged the same way.

use crate::conformance::pattern;
use crate::dev::{BlockDev, ZeroMode};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub const SECTOR: u64 = 512;
/// The seed of zeroed sectors (write-zeroes); writes use seeds below it.
const ZEROES: u8 = 255;

/// Seeds each sector may show: now, after a crash (durable plus since).
struct Sector {
    now: Vec<u8>,
    durable: Vec<u8>,
    since: Vec<u8>,
    /// `Flushes::failed` when it was last written.
    written_at: u64,
}

pub struct Workload {
    pub threads: usize,
    pub ops_per_thread: usize,
    /// Sectors per group (the unit a thread owns; writes stay inside one).
    pub group: u64,
    pub seed: u64,
}

/// What the workers saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    pub writes_ok: u64,
    pub writes_failed: u64,
    pub flushes_ok: u64,
    pub flushes_failed: u64,
}

pub struct SectorModel {
    sectors: Mutex<Vec<Sector>>,
    initial: Vec<u8>,
    flushes: Flushes,
}

/// FLUSHes in flight, and FLUSHes that failed so far.
#[derive(Default)]
struct Flushes {
    running: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
}

impl Sector {
    /// What it may read once what was written since its durable content is
    /// undone, or not.
    fn undone(&self) -> Vec<u8> {
        let mut v = self.now.clone();
        for &x in self.durable.iter().chain(&self.since) {
            if !v.contains(&x) {
                v.push(x);
            }
        }
        v
    }
}

impl SectorModel {
    /// A device of `initial.len()` bytes (a multiple of the sector) holding `initial`.
    pub fn new(initial: Vec<u8>) -> Self {
        let n = initial.len() as u64 / SECTOR;
        let sectors = (0..n).map(|_| Sector { now: vec![0], durable: vec![0], since: vec![], written_at: 0 }).collect();
        SectorModel { sectors: Mutex::new(sectors), initial, flushes: Flushes::default() }
    }

    fn content(&self, seed: u8, sector: u64) -> Vec<u8> {
        let off = sector * SECTOR;
        if seed == 0 {
            self.initial[off as usize..(off + SECTOR) as usize].to_vec()
        } else if seed == ZEROES {
            vec![0; SECTOR as usize]
        } else {
            pattern(seed, off, SECTOR)
        }
    }

    /// Run the workload on `dev`: random reads (checked against what each
    /// sector may show now), writes (some FUA) and write-zeroes inside owned
    /// groups, and flushes, recording each result. `check` sees every write's range and
    /// result, write-zeroes included (for layer-specific assertions on which calls must fail).
    /// `after_failed_flush` runs after each FLUSH that failed (a test
    /// acknowledges a loss there, as a user would).
    pub fn run_with(&self, dev: &dyn BlockDev, w: &Workload, check: &(dyn Fn(u64, u64, bool) + Sync), after_failed_flush: &(dyn Fn() + Sync)) -> Result<Outcome, String> {
        use std::sync::atomic::Ordering::SeqCst;
        let groups = dev.size() / SECTOR / w.group;
        let outcomes: Vec<Outcome> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..w.threads)
                .map(|t| {
                    s.spawn(move || {
                        let mut rng = StdRng::seed_from_u64(w.seed ^ ((t as u64 + 1) * 0x9E37_79B9));
                        let owned: Vec<u64> = (0..groups).filter(|k| k % w.threads as u64 == t as u64).collect();
                        let mut o = Outcome::default();
                        for _ in 0..w.ops_per_thread {
                            let pick = rng.gen_range(0..100);
                            let g = owned[rng.gen_range(0..owned.len())];
                            let start = g * w.group + rng.gen_range(0..w.group);
                            let end = rng.gen_range(start + 1..=(g + 1) * w.group);
                            if pick < 15 {
                                // Reads may fail (copy-on-read writes below); what they return must fit.
                                let mut buf = vec![0u8; ((end - start) * SECTOR) as usize];
                                let flushing = self.flushes.running.load(SeqCst) > 0;
                                if dev.read_at(&mut buf, start * SECTOR).is_ok() {
                                    let flushing = flushing || self.flushes.running.load(SeqCst) > 0;
                                    let failed = self.flushes.failed.load(SeqCst);
                                    self.check_range(start, &buf, |s| if flushing || failed > s.written_at { s.undone() } else { s.now.clone() }, "read during the faults")?;
                                }
                                continue;
                            }
                            if pick < 30 {
                                self.flushes.running.fetch_add(1, SeqCst);
                                let ok = dev.flush().is_ok();
                                if ok {
                                    o.flushes_ok += 1;
                                    self.settle(&owned, w.group);
                                } else {
                                    o.flushes_failed += 1;
                                    self.flush_failed();
                                    after_failed_flush();
                                }
                                self.flushes.running.fetch_sub(1, SeqCst);
                                continue;
                            }
                            let failed_before = self.flushes.failed.load(SeqCst);
                            let (seed, fua, ok) = if pick < 40 {
                                let ok = dev.write_zeroes(start * SECTOR, (end - start) * SECTOR, ZeroMode::default()).is_ok();
                                (ZEROES, false, ok)
                            } else {
                                let seed: u8 = rng.gen_range(1..ZEROES);
                                let fua = rng.gen_bool(0.1);
                                let data: Vec<u8> = (start..end).flat_map(|p| self.content(seed, p)).collect();
                                // A FUA write flushes: judged as a FLUSH too.
                                if fua {
                                    self.flushes.running.fetch_add(1, SeqCst);
                                }
                                let ok = dev.write_at(&data, start * SECTOR, fua).is_ok();
                                if fua {
                                    if !ok {
                                        self.flush_failed();
                                        after_failed_flush();
                                    }
                                    self.flushes.running.fetch_sub(1, SeqCst);
                                }
                                (seed, fua, ok)
                            };
                            check(start * SECTOR, (end - start) * SECTOR, ok);
                            self.wrote(start..end, seed, ok, failed_before);
                            if ok {
                                o.writes_ok += 1;
                                if fua {
                                    self.settle_range(start..end);
                                }
                            } else {
                                o.writes_failed += 1;
                            }
                        }
                        Ok::<_, String>(o)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("worker panicked")).collect::<Result<Vec<_>, String>>()
        })?;
        Ok(outcomes.iter().fold(Outcome::default(), |a, o| Outcome {
            writes_ok: a.writes_ok + o.writes_ok,
            writes_failed: a.writes_failed + o.writes_failed,
            flushes_ok: a.flushes_ok + o.flushes_ok,
            flushes_failed: a.flushes_failed + o.flushes_failed,
        }))
    }

    /// A FLUSH failed: whatever was written since a sector's durable content
    /// may be undone.
    fn flush_failed(&self) {
        let mut s = self.sectors.lock();
        self.flushes.failed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        for sec in s.iter_mut().filter(|s| !s.since.is_empty()) {
            sec.now = sec.undone();
        }
    }

    /// An acknowledged write shows alone; a failed one may show or not.
    /// `failed_before`: FLUSHes failed when the write was issued (one failing
    /// meanwhile may have undone it already).
    fn wrote(&self, range: std::ops::Range<u64>, seed: u8, ok: bool, failed_before: u64) {
        let mut s = self.sectors.lock();
        let failed = self.flushes.failed.load(std::sync::atomic::Ordering::SeqCst);
        for p in range {
            let sec = &mut s[p as usize];
            sec.written_at = failed_before;
            if ok {
                sec.now = vec![seed];
            } else {
                sec.now.push(seed);
            }
            sec.since.push(seed);
            if failed > failed_before {
                sec.now = sec.undone();
            }
        }
    }

    /// A FLUSH of the owner succeeded: whatever its sectors may show now is durable.
    fn settle(&self, owned: &[u64], group: u64) {
        for &g in owned {
            self.settle_range(g * group..(g + 1) * group);
        }
    }

    /// `range` is durable as it reads now (a FLUSH, or a FUA write of just it).
    fn settle_range(&self, range: std::ops::Range<u64>) {
        let mut s = self.sectors.lock();
        for p in range {
            let sec = &mut s[p as usize];
            sec.durable = sec.now.clone();
            sec.since.clear();
        }
    }

    /// Every sector reads a write it may show now (the live device).
    pub fn check_now(&self, dev: &dyn BlockDev) -> Result<(), String> {
        self.check(dev, |s| s.now.clone(), "now")
    }

    /// Every sector reads its durable content or a write issued since (after a crash).
    pub fn check_after_crash(&self, dev: &dyn BlockDev) -> Result<(), String> {
        self.check(dev, |s| s.durable.iter().chain(&s.since).copied().collect(), "after the crash")
    }

    fn check(&self, dev: &dyn BlockDev, allowed: impl Fn(&Sector) -> Vec<u8>, when: &str) -> Result<(), String> {
        let mut all = vec![0u8; self.initial.len()];
        dev.read_at(&mut all, 0).map_err(|e| format!("read {when}: {e}"))?;
        self.check_range(0, &all, allowed, when)
    }

    /// `got` (read from sector `first` on) shows, per sector, a seed `allowed` names.
    fn check_range(&self, first: u64, got: &[u8], allowed: impl Fn(&Sector) -> Vec<u8>, when: &str) -> Result<(), String> {
        let s = self.sectors.lock();
        for (i, got) in got.chunks(SECTOR as usize).enumerate() {
            let p = first + i as u64;
            let sec = &s[p as usize];
            let ok = allowed(sec);
            if !ok.iter().any(|&seed| self.content(seed, p) == got) {
                let initial = got == self.content(0, p).as_slice();
                return Err(format!(
                    "sector {p} {when}: reads {} but may only show seeds {ok:?} (0 = initial; now {:?}, durable {:?}, since {:?})",
                    if initial { "the initial contents".to_string() } else { format!("{:?}..", &got[..8]) },
                    sec.now,
                    sec.durable,
                    sec.since
                ));
            }
        }
        Ok(())
    }
}
