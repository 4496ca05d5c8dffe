//! Randomized fault + power-cut stress test of the NBD client device
//! (`RemoteDev`, issue 37): two writers through a proxy to an in-process
//! surge server while a control thread cuts the connections, restarts the
//! server (it loses its process cache, the unflushed writes a replay must
//! bring back) and changes the faults of the server's disk (failing writes,
//! failing flushes that drop what they held, torn writes). The server's disk
//! sits in a power domain; the power fails at a random event, the client dies
//! with it (its replay log is gone), and every sector on the raw medium must
//! hold what the client's acknowledged FLUSHes made durable.
//!
//! Connection cuts and restarts are not faults: the client hides them, so
//! reads stay exact through them. Only the disk's injected faults make reads
//! lenient (see `surge_block::stress`).

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use surge_block::crashpoint::{Power, PowerConfig, Volatile};
use surge_block::fault::FaultDev;
use surge_block::stress::{self, injected, random_rules, Budget, Plan, Subject, Tally};
use surge_block::{BlockDev, MemoryDev, SystemClock};
use surge_nbd::{RemoteDev, RemoteOptions};

mod support;
use support::{opts, uri_for, InProcess, Proxy, VolatileDisk};

struct Remote {
    dev: Arc<RemoteDev>,
    cache: Arc<VolatileDisk>,
    disk: Arc<FaultDev>,
    proxy: Proxy,
    rules: Mutex<StdRng>,
    restarts: AtomicU64,
    lost_by_restarts: AtomicU64,
}

impl Subject for Remote {
    fn dev(&self) -> &dyn BlockDev {
        self.dev.as_ref()
    }

    fn control(&self, rng: &mut StdRng) {
        match rng.gen_range(0..100) {
            0..=5 => self.proxy.cut(),
            6..=11 => {
                // The server restarts: connections drop, its cache is gone,
                // and it is back after a pause.
                self.proxy.down();
                self.lost_by_restarts.fetch_add(self.cache.lose() as u64, SeqCst);
                self.restarts.fetch_add(1, SeqCst);
                std::thread::sleep(Duration::from_micros(rng.gen_range(0..3000)));
                self.proxy.resume();
            }
            12..=21 => {
                let mut r = self.disk.rules();
                r.apply("flush.fail_nth", Some("1")).unwrap();
                self.disk.set_rules(r);
            }
            22..=26 => self.disk.set_rules(random_rules(&mut self.rules.lock(), false)),
            27..=31 => self.disk.set_rules("volatile,flush.fail_loses".parse().unwrap()),
            // A cut costs a reconnect (a handshake, and 50 ms when the server is
            // not back yet): the writers get some time between them.
            _ => std::thread::sleep(Duration::from_millis(1)),
        }
    }

    fn faults(&self) -> u64 {
        injected(&self.disk)
    }

    /// The client keeps what a failed server FLUSH may have dropped and sends
    /// it again: it never has a loss to acknowledge.
    fn loss(&self) -> Option<String> {
        None
    }

    fn acknowledge_loss(&self) {}

    fn describe(&self) -> String {
        format!("{:?}; disk {:?}; restarts {}", self.dev.stats(), self.disk.stats(), self.restarts.load(SeqCst))
    }
}

static TALLY: std::sync::LazyLock<Tally> = std::sync::LazyLock::new(Tally::default);

fn iteration(seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = Plan { writers: 2, blocks_each: 16, ops: rng.gen_range(20..400), discard: false, seed };
    let medium = Arc::new(MemoryDev::new(plan.region()));
    let power = Power::new(PowerConfig { crash_at: Some(rng.gen_range(20..1500)), volatile: Volatile::RandomSectors, seed, ..PowerConfig::default() });
    let disk = Arc::new(FaultDev::new(power.wrap(medium.clone(), true), "volatile,flush.fail_loses".parse().unwrap(), Arc::new(SystemClock::new())));
    let cache = Arc::new(VolatileDisk::new(disk.clone()));
    let server = InProcess::start(cache.clone());
    let dir = tempfile::tempdir().unwrap();
    let proxy = Proxy::start(dir.path().join("proxy.sock"), server.sock.clone());
    let options = RemoteOptions { connections: rng.gen_range(1..4), replay_limit: [64 << 10, 8 << 20][rng.gen_range(0..2)], ..opts() };
    let dev = Arc::new(RemoteDev::open(&uri_for(&proxy.path, "disk"), options).map_err(|e| format!("open: {e}"))?);
    let s = Remote { dev: dev.clone(), cache, disk, proxy, rules: Mutex::new(StdRng::seed_from_u64(seed ^ 0x5eed)), restarts: AtomicU64::new(0), lost_by_restarts: AtomicU64::new(0) };
    let models = stress::run(&s, &power, plan, &|_| stress::ZERO_TAG);
    let t = &*TALLY;
    let st = dev.stats();
    t.count("iterations", true);
    t.count("power cut mid-run", power.is_dead());
    t.count("reconnected", st.reconnects > 0);
    t.count("replayed", st.replayed > 0);
    t.count("a restart lost writes", s.lost_by_restarts.load(SeqCst) > 0);
    t.count("server flushes failed", s.disk.stats().injected[2] > 0);
    let models = models?;
    // The power fails; the client dies with it, and its log of unflushed
    // writes with it.
    power.cut();
    drop(s);
    drop(dev);
    drop(server);
    models.check_after_restart(medium.as_ref())
}

#[test]
fn the_nbd_client_keeps_every_flushed_sector_through_cuts_restarts_server_faults_and_a_power_cut() {
    let n = Budget::from_env(2000, 20).run("remote stress", Duration::from_secs(60), iteration);
    eprintln!("  {}", TALLY.report());
    assert!(n > 0);
}
