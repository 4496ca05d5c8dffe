//! Randomized fault + power-cut stress test of the stripe with online member
//! replacement (issue 37): two writers over three members, each on a
//! volatile cache that fails writes and flushes (dropping what it held), tears
//! writes and vanishes; meanwhile a member is replaced by a copy of itself on
//! a fresh device (as a finished migration does), with requests to it held
//! off; losses are acknowledged. After a power cut at a random event the
//! stripe is rebuilt on the raw members the slots held at the cut.

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::time::Duration;
use surge_block::crashpoint::{Power, PowerConfig, Volatile};
use surge_block::fault::FaultDev;
use surge_block::stress::{self, injected, random_rules, Budget, Plan, Subject, Tally, BS};
use surge_block::stripe::{Stripe, StripeConfig, StripeError};
use surge_block::{BlockDev, MemoryDev, SystemClock};

const MEMBERS: usize = 3;

struct Striped {
    stripe: Stripe,
    power: Arc<Power>,
    member_size: u64,
    /// Per slot: the raw medium and the fault layer over it, now.
    slots: Mutex<Vec<(Arc<MemoryDev>, Arc<FaultDev>)>>,
    /// Fault layers of replaced members (their faults still count).
    retired: Mutex<Vec<Arc<FaultDev>>>,
    rules: Mutex<StdRng>,
    replaced: std::sync::atomic::AtomicU64,
}

impl Striped {
    fn new_member(&self) -> (Arc<MemoryDev>, Arc<FaultDev>) {
        new_member(&self.power, self.member_size)
    }

    /// Replace member `i` by a copy of it on a fresh device, with requests to
    /// it held off: the copy reads what the member holds now (its cache
    /// included) and is flushed before it takes the slot.
    fn replace(&self, i: usize) {
        let (raw, fresh) = self.new_member();
        let r = self.stripe.replace_with::<StripeError>(i, |old| {
            let mut buf = vec![0u8; self.member_size as usize];
            if old.read_at(&mut buf, 0).is_err() || fresh.write_at(&buf, 0, false).is_err() || fresh.flush().is_err() {
                return Ok(None);
            }
            Ok(Some(fresh.clone()))
        });
        if let Ok(Some(_)) = r {
            let old = std::mem::replace(&mut self.slots.lock()[i], (raw, fresh));
            self.retired.lock().push(old.1);
            self.replaced.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

fn new_member(power: &Arc<Power>, size: u64) -> (Arc<MemoryDev>, Arc<FaultDev>) {
    let raw = Arc::new(MemoryDev::new(size));
    let f = Arc::new(FaultDev::new(power.wrap(raw.clone(), true), "volatile,flush.fail_loses".parse().unwrap(), Arc::new(SystemClock::new())));
    (raw, f)
}

impl Subject for Striped {
    fn dev(&self) -> &dyn BlockDev {
        &self.stripe
    }

    fn control(&self, rng: &mut StdRng) {
        let i = rng.gen_range(0..MEMBERS);
        match rng.gen_range(0..100) {
            0..=14 => self.replace(i),
            15..=34 => {
                // A member flush that fails once, after a random spin.
                let f = self.slots.lock()[i].1.clone();
                let mut r = f.rules();
                r.apply("flush.fail_nth", Some("1")).unwrap();
                r.apply("flush.spin", Some("30us")).unwrap();
                f.set_rules(r);
            }
            35..=44 => {
                let f = self.slots.lock()[i].1.clone();
                f.set_rules(random_rules(&mut self.rules.lock(), true));
            }
            _ => std::thread::yield_now(),
        }
    }

    fn faults(&self) -> u64 {
        self.slots.lock().iter().map(|(_, f)| injected(f)).sum::<u64>() + self.retired.lock().iter().map(|f| injected(f)).sum::<u64>()
    }

    fn loss(&self) -> Option<String> {
        self.stripe.loss()
    }

    fn acknowledge_loss(&self) {
        self.stripe.acknowledge_loss();
    }
}

static TALLY: std::sync::LazyLock<Tally> = std::sync::LazyLock::new(Tally::default);

fn iteration(seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let plan = Plan { writers: 2, blocks_each: 12, ops: rng.gen_range(20..300), discard: false, seed };
    let chunk = [BS, 2 * BS][rng.gen_range(0..2)];
    let member_size = (plan.region() / MEMBERS as u64).div_ceil(chunk) * chunk;
    let power = Power::new(PowerConfig { crash_at: Some(rng.gen_range(20..1500)), volatile: Volatile::RandomSectors, seed, ..PowerConfig::default() });
    let slots: Vec<_> = (0..MEMBERS).map(|_| new_member(&power, member_size)).collect();
    let stripe = Stripe::new(slots.iter().map(|(_, f)| f.clone() as Arc<dyn BlockDev>).collect(), StripeConfig { chunk, parallel: rng.gen_bool(0.5) }).map_err(|e| e.to_string())?;
    let mut rules = StdRng::seed_from_u64(seed ^ 0x5eed);
    for (_, f) in &slots {
        f.set_rules(random_rules(&mut rules, false));
    }
    let s = Striped { stripe, power: power.clone(), member_size, slots: Mutex::new(slots), retired: Mutex::new(Vec::new()), rules: Mutex::new(rules), replaced: 0.into() };
    let models = stress::run(&s, &power, plan, &|_| stress::ZERO_TAG);
    let t = &*TALLY;
    t.count("iterations", true);
    t.count("power cut mid-run", power.is_dead());
    t.count("members replaced", s.replaced.load(std::sync::atomic::Ordering::SeqCst) > 0);
    t.count("loss flagged", s.stripe.loss().is_some());
    let models = models?;
    power.cut();
    let raws: Vec<Arc<dyn BlockDev>> = s.slots.lock().iter().map(|(raw, _)| raw.clone() as Arc<dyn BlockDev>).collect();
    let config = s.stripe.config();
    drop(s);
    let r = Stripe::new(raws, config).map_err(|e| e.to_string())?;
    models.check_after_restart(&r)
}

#[test]
fn stripe_keeps_every_flushed_sector_through_faults_member_replacements_and_a_power_cut() {
    let n = Budget::from_env(3000, 20).run("stripe stress", Duration::from_secs(60), iteration);
    eprintln!("  {}", TALLY.report());
    assert!(n > 0);
}
