//! Randomized fault + power-cut stress test of the copy-on-write overlay
//! (issue 37): two writers over a base image whose overlay sits on a volatile
//! cache that fails writes and flushes (dropping what it held), tears writes
//! and vanishes; meanwhile the stream job copies the base (as a thread, or in
//! steps), copy-on-read turns on and off, commits run, the base is detached
//! once nothing needs it, and losses are acknowledged. The power fails at a
//! random event; the overlay is reopened on the raw medium and every sector
//! checked (`surge_block::stress`).

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use surge_block::cow::{CowConfig, CowDev, ReadaheadConfig, StreamConfig, StreamJob, StreamState};
use surge_block::crashpoint::{Power, PowerConfig, Volatile};
use surge_block::fault::{FaultDev, FaultRules};
use surge_block::stress::{self, injected, random_rules, Budget, Plan, Subject, Tally, BS, SECTOR};
use surge_block::{BlockDev, MemoryDev, SystemClock};

/// The base's sectors: never zero, never a writer's tag.
fn base_tag(sector: u64) -> u32 {
    0xB000_0000 | sector as u32
}

struct Cow {
    dev: Arc<CowDev>,
    overlay: Arc<FaultDev>,
    base: Arc<FaultDev>,
    job: Mutex<Option<StreamJob>>,
    rules: Mutex<StdRng>,
    blocks: u64,
}

impl Subject for Cow {
    fn dev(&self) -> &dyn BlockDev {
        self.dev.as_ref()
    }

    fn control(&self, rng: &mut StdRng) {
        match rng.gen_range(0..100) {
            0..=29 => {
                let _ = self.dev.stream_step(rng.gen_range(0..self.blocks), rng.gen_range(1..6) * BS);
            }
            30..=41 => {
                let _ = self.dev.commit();
            }
            42..=49 => self.dev.set_copy_on_read(rng.gen_bool(0.5)),
            50..=59 => {
                // An overlay flush that fails once, after a random spin.
                let mut r = self.overlay.rules();
                r.apply("flush.fail_nth", Some("1")).unwrap();
                r.apply("flush.spin", Some("30us")).unwrap();
                self.overlay.set_rules(r);
            }
            60..=66 => self.overlay.set_rules(random_rules(&mut self.rules.lock(), true)),
            67..=70 => {
                // The remote base fails a few reads now and then.
                let rules = if rng.gen_bool(0.5) { "read.fail_prob=0.02" } else { "" };
                self.base.set_rules(rules.parse().unwrap());
            }
            71..=78 => {
                let mut job = self.job.lock();
                match job.take() {
                    Some(j) => drop(j), // stops it
                    None => {
                        let cfg = StreamConfig { chunk: 2 * BS, commit_every: 8 * BS, commit_interval: Duration::from_millis(2), detach_base: rng.gen_bool(0.5), yield_to_guest: Duration::ZERO, ..StreamConfig::default() };
                        *job = Some(StreamJob::start(self.dev.clone(), cfg, Arc::new(SystemClock::new())));
                    }
                }
            }
            79..=81 => {
                if self.dev.is_independent() {
                    let _ = self.dev.detach_base();
                }
            }
            _ => std::thread::yield_now(),
        }
    }

    fn faults(&self) -> u64 {
        injected(&self.overlay) + injected(&self.base)
    }

    fn loss(&self) -> Option<String> {
        self.dev.loss()
    }

    fn acknowledge_loss(&self) {
        self.dev.acknowledge_loss();
    }

    fn describe(&self) -> String {
        format!("{:?}; overlay {:?}", self.dev.stats(), self.overlay.stats())
    }

    fn describe_block(&self, b: u64) -> String {
        self.dev.describe_range(b * BS, BS)
    }
}

static TALLY: std::sync::LazyLock<Tally> = std::sync::LazyLock::new(Tally::default);

fn iteration(seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = Plan { writers: 2, blocks_each: 8, ops: rng.gen_range(20..300), discard: true, seed };
    let size = plan.region();
    let granularity = [512u64, BS][rng.gen_range(0..2)];
    let cfg = CowConfig {
        granularity,
        copy_on_read: rng.gen_bool(0.3),
        journal_len: [2048u64, 8192][rng.gen_range(0..2)],
        learn_base_holes: false,
        readahead: ReadaheadConfig { max_window: [0, 8192][rng.gen_range(0..2)], min_stream: 4096, min_window: 4096, cache_bytes: 64 << 10 },
    };
    let base_raw = Arc::new(MemoryDev::new(size));
    base_raw.write_at(&stress::tagged(size / SECTOR, base_tag), 0, false).unwrap();
    let base = Arc::new(FaultDev::new(base_raw.clone(), FaultRules::default(), Arc::new(SystemClock::new())));
    let overlay_raw: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(CowDev::overlay_size_for(size, &cfg)));
    let power = Power::new(PowerConfig { crash_at: Some(rng.gen_range(20..1500)), volatile: Volatile::RandomSectors, seed, ..PowerConfig::default() });
    let overlay = Arc::new(FaultDev::new(power.wrap(overlay_raw.clone(), true), "volatile".parse().unwrap(), Arc::new(SystemClock::new())));
    let dev = Arc::new(CowDev::create(base.clone(), overlay.clone(), &cfg).map_err(|e| format!("create: {e}"))?);
    let mut rules = StdRng::seed_from_u64(seed ^ 0x5eed);
    overlay.set_rules(random_rules(&mut rules, false));
    let s = Cow { dev: dev.clone(), overlay: overlay.clone(), base, job: Mutex::new(None), rules: Mutex::new(rules), blocks: size / granularity };
    let models = stress::run(&s, &power, plan, &base_tag);
    let job = s.job.lock().take();
    if let Some(j) = job {
        j.stop();
        if let StreamState::Failed(e) = j.wait() {
            TALLY.count("stream job failed", !e.is_empty());
        }
    }
    let t = &*TALLY;
    t.count("iterations", true);
    t.count("power cut mid-run", power.is_dead());
    t.count("loss flagged", dev.loss().is_some());
    t.count("overlay flushes failed", overlay.stats().injected[2] > 0);
    t.count("base detached", !dev.has_base());
    t.count("independent", dev.is_independent());
    let models = models?;
    drop(s);
    drop(dev);
    power.cut();
    let r = CowDev::open(Some(base_raw), overlay_raw, &cfg).map_err(|e| format!("reopen after the cut: {e}"))?;
    models.check_after_restart(&r)
}

#[test]
fn cow_keeps_every_flushed_sector_through_faults_a_stream_job_and_a_power_cut() {
    let n = Budget::from_env(3000, 20).run("cow stress", Duration::from_secs(60), iteration);
    eprintln!("  {}", TALLY.report());
    assert!(n > 0);
}
