//! Randomized fault + power-cut stress test of a whole persistent burstable
//! volume through member swaps (issue 37): two writers over a stripe of four
//! local-cloud members while the controller steps, swaps are requested and
//! rebuilt, and the members (and swap targets) fail writes and flushes
//! (dropping what they held), tear writes and vanish; losses are
//! acknowledged. Every attached volume sits in one power domain; after a cut
//! at a random event the volume is reopened from its state file on a fresh
//! provider (as a restart would: interrupted swaps resumed or abandoned,
//! leftovers deleted) and every sector checked. The state file and mirror
//! records are plain files outside the power domain (a process crash for
//! them, a power cut for the volumes).

use super::*;
use std::time::Duration;
use crate::control::Controllable;
use surge_block::Clock;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use surge_block::crashpoint::{Power, PowerConfig, Volatile};
use surge_block::stress::{self, injected, random_rules, Budget, Plan, Subject, Tally};
use surge_cloud::{Delays, FaultyProvider, LocalConfig, LocalProvider};

const SPEC: &str = "persistent,size=4GiB,members=4,chunk=4KiB,rebuild_rate=off";

fn local(dir: &Path, clock: Arc<dyn Clock>) -> Arc<LocalProvider> {
    let mut cfg = LocalConfig::new(dir.join("cloud"));
    cfg.delays = Delays::none();
    cfg.epoch_unix_ns = Some(0);
    // 1 GiB members hold 1 MiB, and run 100 times faster than gp2: the test is
    // about what survives, not about credits.
    cfg.scale = surge_block::model::Scale { rate: 100.0, time: 1.0 / 102_400.0 };
    Arc::new(LocalProvider::open(cfg, clock).unwrap())
}

fn params(dir: &Path) -> BurstableParams {
    let mut p = parse_params("v", SPEC, dir).unwrap();
    p.progress_bars = false;
    p.mirror.region = 16 << 10;
    p.mirror.persist_every = 32 << 10;
    p.mirror.persist_interval = Duration::from_millis(2);
    p
}

struct Stack {
    v: Arc<BurstableVolume>,
    prov: Arc<FaultyProvider>,
    rules: parking_lot::Mutex<StdRng>,
}

impl Subject for Stack {
    fn dev(&self) -> &dyn BlockDev {
        self.v.as_ref()
    }

    fn control(&self, rng: &mut StdRng) {
        match rng.gen_range(0..100) {
            0..=29 => {
                let _ = self.v.step();
            }
            30..=37 => self.v.request_swap(vec![rng.gen_range(0..4)]),
            38..=55 => {
                // A volume's flush fails once, after a random spin.
                let faults = self.prov.faults();
                if let Some((_, f)) = faults.get(rng.gen_range(0..faults.len().max(1))) {
                    let mut r = f.rules();
                    r.apply("flush.fail_nth", Some("1")).unwrap();
                    r.apply("flush.spin", Some("30us")).unwrap();
                    f.set_rules(r);
                }
            }
            56..=63 => {
                let faults = self.prov.faults();
                if let Some((_, f)) = faults.get(rng.gen_range(0..faults.len().max(1))) {
                    f.set_rules(random_rules(&mut self.rules.lock(), true));
                }
            }
            _ => std::thread::sleep(Duration::from_micros(200)),
        }
    }

    fn faults(&self) -> u64 {
        self.prov.every_fault().iter().map(|f| injected(f)).sum()
    }

    fn loss(&self) -> Option<String> {
        self.v.loss()
    }

    fn acknowledge_loss(&self) {
        self.v.acknowledge_loss();
    }

    fn describe(&self) -> String {
        format!("{}", self.v.status())
    }
}

static TALLY: std::sync::LazyLock<Tally> = std::sync::LazyLock::new(Tally::default);

fn iteration(seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = Plan { writers: 2, blocks_each: 16, ops: rng.gen_range(20..300), discard: false, seed };
    let dir = tempfile::tempdir().unwrap();
    let clock: Arc<dyn Clock> = Arc::new(surge_block::SystemClock::new());
    let power = Power::new(PowerConfig { crash_at: Some(rng.gen_range(50..3000)), volatile: Volatile::RandomSectors, seed, ..PowerConfig::default() });
    let p2 = power.clone();
    let prov = Arc::new(FaultyProvider::with_wrap(local(dir.path(), clock.clone()), clock.clone(), Box::new(move |d| p2.wrap(d, true))));
    prov.set_initial_rules("volatile,flush.fail_loses".parse().unwrap());
    let v = BurstableVolume::open(params(dir.path()), prov.clone(), clock.clone()).map_err(|e| format!("open: {e:#}"))?;
    let s = Stack { v: v.clone(), prov: prov.clone(), rules: parking_lot::Mutex::new(StdRng::seed_from_u64(seed ^ 0x5eed)) };
    let models = stress::run(&s, &power, plan, &|_| stress::ZERO_TAG);
    let t = &*TALLY;
    t.count("iterations", true);
    t.count("power cut mid-run", power.is_dead());
    t.count("swaps completed", v.swaps().iter().any(|r| r.ok));
    t.count("swaps abandoned", v.swaps().iter().any(|r| !r.ok));
    t.count("swap in flight at the cut", !v.rebuilds().is_empty());
    t.count("loss flagged", v.loss().is_some());
    let models = models?;
    power.cut();
    v.stop();
    drop(s);
    drop(v);
    drop(prov);
    let r = BurstableVolume::open(params(dir.path()), local(dir.path(), clock.clone()), clock.clone()).map_err(|e| format!("reopen after the cut: {e:#}"))?;
    models.check_after_restart(r.as_ref())?;
    // Whatever swap the restart resumed finishes and still reads the same.
    let mut got = vec![0u8; plan.region() as usize];
    r.read_at(&mut got, 0).map_err(|e| e.to_string())?;
    for _ in 0..200 {
        r.step().map_err(|e| format!("step after the restart: {e:#}"))?;
        if r.rebuilds().is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    t.count("restart: swaps finished", r.rebuilds().is_empty());
    models.check_after_restart(r.as_ref())?;
    r.stop();
    Ok(())
}

#[test]
fn a_burstable_volume_keeps_every_flushed_sector_through_faults_swaps_and_a_power_cut() {
    let n = Budget::from_env(300, 20).run("burstable stress", Duration::from_secs(120), iteration);
    eprintln!("  {}", TALLY.report());
    assert!(n > 0);
}
