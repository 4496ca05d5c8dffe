//! Randomized fault + power-cut stress test of the mirror under a rebuild
//! (issue 37): two writers while the rebuild copies the source onto a fresh
//! target; the source, the target and the metadata device each sit on a
//! volatile cache that fails writes and flushes (dropping what it held); the
//! target tears writes and vanishes; idle intent bits are cleared; losses are
//! acknowledged. After a power cut at a random event the mirror is reopened
//! on the raw media as a restart would: a target on record as failed is
//! abandoned (the source alone is checked), else the data is checked through
//! the mirror, the rebuild finished, and both legs must then agree.

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use surge_block::crashpoint::{Power, PowerConfig, Volatile};
use surge_block::fault::FaultDev;
use surge_block::mirror::{meta, Mirror, MirrorConfig, MirrorError, Step};
use surge_block::stress::{self, injected, random_rules, Budget, Plan, Subject, Tally, SECTOR};
use surge_block::{BlockDev, MemoryDev, SystemClock};

const TAG: u64 = 0x5eed_37;

/// The source's sectors before the writers start.
fn source_tag(sector: u64) -> u32 {
    0x5000_0000 | sector as u32
}

struct Mirrored {
    m: Arc<Mirror>,
    source: Arc<FaultDev>,
    target: Arc<FaultDev>,
    meta: Arc<FaultDev>,
    rules: Mutex<StdRng>,
}

impl Subject for Mirrored {
    fn dev(&self) -> &dyn BlockDev {
        self.m.as_ref()
    }

    fn control(&self, rng: &mut StdRng) {
        match rng.gen_range(0..100) {
            0..=49 => {
                let _ = self.m.rebuild_step();
            }
            50..=57 => {
                let _ = self.m.clear_idle();
            }
            58..=67 => {
                // A flush that fails once, after a random spin.
                let d = [&self.source, &self.target, &self.meta][rng.gen_range(0..3)];
                let mut r = d.rules();
                r.apply("flush.fail_nth", Some("1")).unwrap();
                r.apply("flush.spin", Some("30us")).unwrap();
                d.set_rules(r);
            }
            68..=73 => self.target.set_rules(random_rules(&mut self.rules.lock(), true)),
            74..=77 => self.source.set_rules(random_rules(&mut self.rules.lock(), false)),
            78..=81 => {
                let rules = if rng.gen_bool(0.5) { "volatile,flush.fail_loses,write.fail_prob=0.05" } else { "volatile,flush.fail_loses" };
                self.meta.set_rules(rules.parse().unwrap());
            }
            _ => std::thread::yield_now(),
        }
    }

    fn faults(&self) -> u64 {
        injected(&self.source) + injected(&self.target) + injected(&self.meta)
    }

    fn loss(&self) -> Option<String> {
        self.m.loss()
    }

    fn acknowledge_loss(&self) {
        self.m.acknowledge_loss();
    }

    fn describe(&self) -> String {
        format!("{:?}; source {:?}; target {:?}; meta {:?}", self.m.progress(), self.source.stats(), self.target.stats(), self.meta.stats())
    }
}

static TALLY: std::sync::LazyLock<Tally> = std::sync::LazyLock::new(Tally::default);

fn read_all(d: &dyn BlockDev, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    d.read_at(&mut b, 0).unwrap();
    b
}

fn iteration(seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = Plan { writers: 2, blocks_each: 8, ops: rng.gen_range(20..300), discard: false, seed };
    let size = plan.region();
    let region = [4096u64, 8192, 16384][rng.gen_range(0..3)];
    let cfg = MirrorConfig { region, persist_every: 2 * region, persist_interval: Duration::from_millis(2), skip_zero: rng.gen_bool(0.5), balance_reads: true };
    let clock: Arc<dyn surge_block::Clock> = Arc::new(SystemClock::new());
    let source_raw = Arc::new(MemoryDev::new(size));
    source_raw.write_at(&stress::tagged(size / SECTOR, source_tag), 0, false).unwrap();
    let target_raw = Arc::new(MemoryDev::new(size));
    let meta_raw = Arc::new(MemoryDev::new(meta::required_size(size, region)));
    let power = Power::new(PowerConfig { crash_at: Some(rng.gen_range(20..1500)), volatile: Volatile::RandomSectors, seed, ..PowerConfig::default() });
    let wrap = |raw: &Arc<MemoryDev>| Arc::new(FaultDev::new(power.wrap(raw.clone(), true), "volatile,flush.fail_loses".parse().unwrap(), clock.clone()));
    let (source, target, meta_f) = (wrap(&source_raw), wrap(&target_raw), wrap(&meta_raw));
    let m = Arc::new(Mirror::create(source.clone(), target.clone(), meta_f.clone(), cfg, TAG, clock.clone()).map_err(|e| format!("create: {e}"))?);
    let mut rules = StdRng::seed_from_u64(seed ^ 0x5eed);
    source.set_rules(random_rules(&mut rules, false));
    let s = Mirrored { m: m.clone(), source, target, meta: meta_f, rules: Mutex::new(rules) };
    let models = stress::run(&s, &power, plan, &source_tag);
    let t = &*TALLY;
    t.count("iterations", true);
    t.count("power cut mid-run", power.is_dead());
    t.count("target failed", m.is_failed());
    t.count("rebuild complete", m.is_complete());
    t.count("loss flagged", m.loss().is_some());
    let models = models?;
    drop(s);
    drop(m);
    power.cut();
    {
        // Invariant at the cut: every region the newest record calls copied and clean holds the same bytes on both legs.
        let nregions = size.div_ceil(region);
        let cl = meta::copy_len(nregions);
        let mut best: Option<meta::Record> = None;
        for copy in 0..2u64 {
            let mut b = vec![0u8; cl as usize];
            meta_raw.read_at(&mut b, copy * cl).unwrap();
            if let Ok(r) = meta::decode(&b) {
                if best.as_ref().is_none_or(|x| r.seq > x.seq) { best = Some(r); }
            }
        }
        let rec = best.unwrap();
        let (a, b) = (read_all(source_raw.as_ref(), size), read_all(target_raw.as_ref(), size));
        if !rec.failed() {
            for r in 0..rec.copied {
                let (lo, hi) = ((r * region) as usize, ((r + 1) * region).min(size) as usize);
                if !rec.is_dirty(r) && a[lo..hi] != b[lo..hi] {
                    let at = (lo..hi).find(|&i| a[i] != b[i]).unwrap();
                    return Err(format!("AT THE CUT: region {r} is copied and clean in record seq {} but the legs differ at {at}: source {:?} target {:?}; power died at {:?}", rec.seq, stress::decode(&a[at/512*512..at/512*512+512]), stress::decode(&b[at/512*512..at/512*512+512]), power.died_at()));
                }
            }
        }
    }
    // Restart on the raw media.
    match Mirror::open(source_raw.clone(), target_raw.clone(), meta_raw.clone(), cfg, TAG, clock.clone()) {
        Err(MirrorError::TargetFailed) => {
            t.count("restart: target abandoned", true);
            models.check_after_restart(source_raw.as_ref())
        }
        Err(e) => Err(format!("reopen after the cut: {e}")),
        Ok(r) => {
            let restart = r.progress();
            models.check_after_restart(&r)?;
            for _ in 0..100_000 {
                match r.rebuild_step() {
                    Ok(Step::Done) => break,
                    Ok(Step::Copied { .. }) => {}
                    Err(e) => return Err(format!("rebuild after the restart: {e}")),
                }
            }
            t.count("restart: rebuild finished", r.is_complete());
            models.check_after_restart(&r)?;
            let (a, b) = (read_all(source_raw.as_ref(), size), read_all(target_raw.as_ref(), size));
            if a != b {
                let at = a.iter().zip(&b).position(|(x, y)| x != y).unwrap();
                return Err(format!("after the rebuild the legs differ from byte {at} (region {}, source {:?} target {:?}); at the restart: {restart:?}", at as u64 / region, stress::decode(&a[at / 512 * 512..at / 512 * 512 + 512]), stress::decode(&b[at / 512 * 512..at / 512 * 512 + 512])));
            }
            Ok(())
        }
    }
}

#[test]
fn mirror_keeps_every_flushed_sector_through_faults_a_rebuild_and_a_power_cut() {
    let n = Budget::from_env(3000, 20).run("mirror stress", Duration::from_secs(60), iteration);
    eprintln!("  {}", TALLY.report());
    assert!(n > 0);
}
