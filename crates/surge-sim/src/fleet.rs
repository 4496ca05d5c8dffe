//! `surge sim fleet`: N VMs each running the recorded application back to
//! back for H hours, with their own phase offsets, on one account.
//!
//! One VM's behaviour per candidate comes from the plan's replays (the real
//! layers on `ReplayClock`, [`crate::plan`]): an iteration of the application
//! takes the candidate's completion time and costs its storage dollars. What
//! the VMs share is the account: EC2's per-API request buckets (token
//! buckets, RequestLimitExceeded when empty) and the EBS storage quotas. The
//! fleet is an event-driven simulation of every VM's API calls against them:
//! the volumes created and attached when a VM starts, detached and deleted
//! when it stops, and for modify-volume a ModifyVolume at each of the policy's
//! modifications in every iteration, under EBS's rolling rule per volume.
//!
//! What a VM does when throttled is what surge's AWS provider does: the call
//! is retried with exponential backoff (8 attempts from 200 ms); after the
//! last it fails and the controller serves on what it has. For modify-volume
//! that is the base volume: an iteration whose raise was refused (by the rule
//! or by throttling) runs as the base spec's replay does. The delay of a raise
//! that succeeded after retries is reported but not fed back into the
//! iteration's time (first order). Provisioning that fails is retried until it
//! succeeds; the VM's application starts late by that much.

use crate::plan::{self, PlanError, Row, WorkloadPlan};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;
use surge_cloud::{ModifyRules, PriceTable, VolumeSpec};
use surge_policy::modify::ModifyAction;
use surge_trace::Trace;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Offsets {
    /// Every VM starts at once (a job array, a fleet rolled out together).
    Aligned,
    /// Each VM starts at a uniformly random point of one run of the trace.
    Random,
}

impl std::str::FromStr for Offsets {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "aligned" => Ok(Offsets::Aligned),
            "random" => Ok(Offsets::Random),
            _ => Err(format!("offsets {s:?}: aligned or random")),
        }
    }
}

#[derive(Debug, Clone)]
pub struct FleetOptions {
    pub vms: u32,
    pub offsets: Offsets,
    pub hours: f64,
    /// The random offsets' seed (the same seed, the same fleet).
    pub seed: u64,
    pub limits: AccountLimits,
}

/// An EC2 API's request bucket: `capacity` tokens, `refill` a second.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Bucket {
    pub capacity: f64,
    pub refill_per_s: f64,
}

/// The account limits the fleet runs into, and the client's retry schedule.
#[derive(Debug, Clone, Serialize)]
pub struct AccountLimits {
    /// Per API (request rate limiting: each API its own bucket).
    pub api: BTreeMap<Api, Bucket>,
    /// Storage quota per volume type, in bytes (Service Quotas, adjustable).
    pub storage: BTreeMap<String, u64>,
    pub max_attempts: u32,
    pub initial_backoff_s: f64,
    pub max_backoff_s: f64,
    pub source: &'static str,
}

impl Default for AccountLimits {
    /// EC2's documented default for mutating actions (a bucket of 200
    /// tokens refilled at 5 a second, per API and account and Region),
    /// EBS's default storage quota of 50 TiB per volume type, and surge's
    /// AWS provider's retries (`AwsConfig::max_attempts`, `initial_backoff`;
    /// the SDK's standard mode caps a backoff at 20 s).
    fn default() -> Self {
        let mutating = Bucket { capacity: 200.0, refill_per_s: 5.0 };
        let api = Api::ALL.iter().map(|&a| (a, mutating)).collect();
        let storage = ["gp2", "gp3", "io1", "io2", "st1", "sc1"].iter().map(|k| (k.to_string(), 50u64 << 40)).collect();
        AccountLimits {
            api,
            storage,
            max_attempts: 8,
            initial_backoff_s: 0.2,
            max_backoff_s: 20.0,
            source: "EC2 API request throttling, mutating actions (200 tokens, 5/s per API); EBS Service Quotas default 50 TiB per volume type; surge-aws retries (8 attempts from 200 ms)",
        }
    }
}

impl AccountLimits {
    /// The wait before attempt `attempt + 1` (attempt counts from 1).
    fn backoff_s(&self, attempt: u32) -> f64 {
        (self.initial_backoff_s * 2f64.powi(attempt as i32 - 1)).min(self.max_backoff_s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Api {
    CreateVolume,
    AttachVolume,
    ModifyVolume,
    DetachVolume,
    DeleteVolume,
}

impl Api {
    pub const ALL: [Api; 5] = [Api::CreateVolume, Api::AttachVolume, Api::ModifyVolume, Api::DetachVolume, Api::DeleteVolume];
}

/// A token bucket on the simulated clock (seconds).
struct TokenBucket {
    b: Bucket,
    tokens: f64,
    at_s: f64,
}

impl TokenBucket {
    fn new(b: Bucket) -> Self {
        TokenBucket { b, tokens: b.capacity, at_s: 0.0 }
    }
    fn take(&mut self, now_s: f64) -> bool {
        self.tokens = (self.tokens + (now_s - self.at_s).max(0.0) * self.b.refill_per_s).min(self.b.capacity);
        self.at_s = self.at_s.max(now_s);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ApiStats {
    pub calls: u64,
    /// Attempts answered RequestLimitExceeded.
    pub throttled: u64,
    /// Calls that failed after the last attempt.
    pub failed: u64,
    /// From a call's first attempt to its success, at most.
    pub max_delay_s: f64,
    /// The most calls that succeeded within one second.
    pub peak_per_s: u64,
    #[serde(skip)]
    second: (u64, u64),
}

impl ApiStats {
    fn succeeded(&mut self, now_s: f64, delay_s: f64) {
        self.calls += 1;
        self.max_delay_s = self.max_delay_s.max(delay_s);
        let sec = now_s as u64;
        self.second = if self.second.0 == sec { (sec, self.second.1 + 1) } else { (sec, 1) };
        self.peak_per_s = self.peak_per_s.max(self.second.1);
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Spread {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

impl Spread {
    fn of(v: &[f64]) -> Spread {
        let n = v.len().max(1) as f64;
        Spread { min: v.iter().copied().fold(f64::INFINITY, f64::min), mean: v.iter().sum::<f64>() / n, max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max) }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct FleetRow {
    pub name: String,
    pub spec: String,
    /// Runs of the application each VM completed in its hours.
    pub iterations_per_vm: Spread,
    pub usd_per_vm: Spread,
    pub storage_usd: f64,
    pub compute_usd: f64,
    pub total_usd: f64,
    /// Total dollars over the runs completed: the price of the work.
    pub usd_per_iteration: f64,
    /// Volumes attached at once across the fleet, at most.
    pub peak_volumes: u64,
    /// Provisioned bytes per volume type at the peak, and the quota.
    pub peak_storage: BTreeMap<String, (u64, u64)>,
    pub over_quota: Vec<String>,
    pub api: BTreeMap<Api, ApiStats>,
    /// From a VM's start until its volumes were attached, at most.
    pub max_start_delay_s: f64,
    /// modify-volume: iterations whose raise the rolling rule refused, or
    /// throttling failed; they ran on the base spec.
    pub raises_refused_by_rule: u64,
    pub raises_failed_throttled: u64,
    /// Lowers refused or failed: the peak stays on until the next one (its
    /// dollars are billed as the replay's lower, which is not what happens).
    pub lowers_not_made: u64,
    /// Every run is timed on a fresh volume's credits; one run left this
    /// many percent (under 99.9: back-to-back runs would start lower and the
    /// figures after the first run are flattered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credits_end_pct: Option<f64>,
    /// With credits spent net per run: how many back-to-back runs until
    /// they are gone (a run from full leaves `credits_end_pct`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credits_dry_after_runs: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    pub figures: &'static str,
    pub trace: String,
    pub vms: u32,
    pub hours: f64,
    pub offsets: Offsets,
    pub seed: u64,
    pub instance: String,
    pub limits: AccountLimits,
    pub rows: Vec<FleetRow>,
    /// The row with the lowest dollars per completed run.
    pub cheapest: Option<usize>,
    pub not_simulated: Vec<String>,
    pub notes: Vec<String>,
}

/// One VM's view of a candidate: what an iteration takes and costs, and
/// (modify-volume) the calls in it.
struct Template {
    iteration_s: f64,
    iteration_usd: f64,
    volumes: Vec<VolumeSpec>,
    /// modify-volume: (offset in the iteration, raise?) and the base run.
    modifications: Vec<(f64, bool)>,
    base: Option<(f64, f64)>,
}

fn template(row: &Row, t: &Trace, plan: &WorkloadPlan, prices: &PriceTable) -> Result<Template, PlanError> {
    let iteration_s = row.completion_s.unwrap_or(0.0).max(1e-3);
    let mut tp = Template { iteration_s, iteration_usd: row.storage_usd.unwrap_or(0.0), volumes: row.volumes.clone(), modifications: Vec::new(), base: None };
    if let Some(mods) = &row.modifications {
        tp.modifications = mods.iter().map(|m| (m.at_s, m.action == ModifyAction::Raise)).collect();
        let base = row.volumes.first().ok_or_else(|| PlanError::Invalid("modify-volume row without its volume".into()))?;
        let ebs = prices.instance_ebs(&plan.instance)?;
        let (r, _) = plan::replay_spec(t, plan::MODIFY, base, ebs.shape(), plan.qd)?;
        let s = r.completion_ns.max(1) as f64 / 1e9;
        tp.base = Some((s, prices.usd_month(base) * s / prices.seconds_per_month as f64));
    }
    Ok(tp)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The VM tries its next provisioning or teardown call.
    Setup { vm: u32, attempt: u32 },
    IterationStart { vm: u32 },
    /// A modification of the iteration started at `iter_ns` (index into the template).
    Modify { vm: u32, idx: u32, attempt: u32 },
    IterationEnd { vm: u32 },
    Stop { vm: u32 },
}

struct Vm {
    start_s: f64,
    end_s: f64,
    /// Calls left of the provisioning (or teardown) sequence, and when the
    /// current one was first tried.
    setup: Vec<Api>,
    call_first_s: f64,
    iter_start_s: f64,
    /// This iteration runs on the base spec (its raise was not made).
    on_base: bool,
    modified: Vec<Duration>,
    iterations: f64,
    storage_usd: f64,
    attached: bool,
    stopping: bool,
}

struct Sim<'a> {
    tp: &'a Template,
    limits: &'a AccountLimits,
    rules: ModifyRules,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    buckets: BTreeMap<Api, TokenBucket>,
    stats: BTreeMap<Api, ApiStats>,
    vms: Vec<Vm>,
    attached_now: u64,
    peak_volumes: u64,
    max_start_delay_s: f64,
    refused_rule: u64,
    failed_throttled: u64,
    lowers_not_made: u64,
}

fn ns(s: f64) -> u64 {
    (s.max(0.0) * 1e9) as u64
}

impl<'a> Sim<'a> {
    fn at(&mut self, t_s: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((ns(t_s), self.seq, ev)));
    }

    /// One attempt of `api` at `now`: Ok(true) done, Ok(false) throttled with
    /// attempts left (retry scheduled by the caller), Err(()) failed.
    fn attempt(&mut self, api: Api, now_s: f64, first_s: f64, attempt: u32) -> Result<bool, ()> {
        if self.buckets.get_mut(&api).expect("every API has a bucket").take(now_s) {
            self.stats.entry(api).or_default().succeeded(now_s, now_s - first_s);
            return Ok(true);
        }
        let st = self.stats.entry(api).or_default();
        st.throttled += 1;
        if attempt >= self.limits.max_attempts {
            st.failed += 1;
            return Err(());
        }
        Ok(false)
    }

    fn run(&mut self) {
        while let Some(Reverse((t, _, ev))) = self.heap.pop() {
            let now = t as f64 / 1e9;
            match ev {
                Ev::Setup { vm, attempt } => self.setup(vm, attempt, now),
                Ev::IterationStart { vm } => self.iteration_start(vm, now),
                Ev::Modify { vm, idx, attempt } => self.modify(vm, idx, attempt, now),
                Ev::IterationEnd { vm } => self.iteration_end(vm, now),
                Ev::Stop { vm } => self.stop(vm, now),
            }
        }
    }

    fn setup(&mut self, vm: u32, attempt: u32, now: f64) {
        let Some(&api) = self.vms[vm as usize].setup.first() else { return };
        if attempt == 1 {
            self.vms[vm as usize].call_first_s = now;
        }
        let first = self.vms[vm as usize].call_first_s;
        match self.attempt(api, now, first, attempt) {
            Ok(true) => {
                let v = &mut self.vms[vm as usize];
                v.setup.remove(0);
                if api == Api::AttachVolume {
                    self.attached_now += 1;
                    self.peak_volumes = self.peak_volumes.max(self.attached_now);
                } else if api == Api::DetachVolume {
                    self.attached_now -= 1;
                }
                if !v.setup.is_empty() {
                    self.at(now, Ev::Setup { vm, attempt: 1 });
                } else if !v.stopping {
                    v.attached = true;
                    self.max_start_delay_s = self.max_start_delay_s.max(now - v.start_s);
                    self.at(now, Ev::IterationStart { vm });
                }
            }
            Ok(false) => {
                let wait = self.limits.backoff_s(attempt);
                self.at(now + wait, Ev::Setup { vm, attempt: attempt + 1 });
            }
            // The daemon serves on what it has and tries again later: a
            // volume it needs to start is asked for again after a backoff.
            Err(()) => self.at(now + self.limits.max_backoff_s, Ev::Setup { vm, attempt: 1 }),
        }
    }

    fn iteration_start(&mut self, vm: u32, now: f64) {
        let v = &mut self.vms[vm as usize];
        if v.stopping || now >= v.end_s {
            return;
        }
        let Some(&(at, _)) = self.tp.modifications.first() else {
            // No calls while it runs: every run until the stop at once.
            let runs = (v.end_s - now) / self.tp.iteration_s;
            v.iterations += runs;
            v.storage_usd += runs * self.tp.iteration_usd;
            return;
        };
        // The runs whose raise the rule would refuse are base runs, in one step.
        let raise_at = Duration::from_secs_f64(now + at);
        let allowed = self.rules.next_allowed(&v.modified, raise_at).as_secs_f64();
        if let Some((base_s, base_usd)) = self.tp.base.filter(|_| allowed > now + at) {
            let runs = ((allowed - now - at) / base_s).ceil().min((v.end_s - now) / base_s);
            v.iterations += runs;
            v.storage_usd += runs * base_usd;
            self.refused_rule += runs.ceil() as u64;
            let next = now + runs * base_s;
            if next < v.end_s {
                self.at(next, Ev::IterationStart { vm });
            }
            return;
        }
        v.iter_start_s = now;
        v.on_base = false;
        self.at(now + at, Ev::Modify { vm, idx: 0, attempt: 1 });
    }

    fn modify(&mut self, vm: u32, idx: u32, attempt: u32, now: f64) {
        let (at, raise) = self.tp.modifications[idx as usize];
        let v = &self.vms[vm as usize];
        if v.stopping {
            return;
        }
        let first = v.iter_start_s + at;
        if attempt == 1 && self.rules.refuses(&v.modified, Duration::from_secs_f64(now)).is_some() {
            return self.modification_not_made(vm, idx, raise, now, true);
        }
        match self.attempt(Api::ModifyVolume, now, first, attempt) {
            Ok(true) => {
                self.vms[vm as usize].modified.push(Duration::from_secs_f64(now));
                if idx == 0 {
                    let end = self.vms[vm as usize].iter_start_s + self.tp.iteration_s;
                    self.at(end, Ev::IterationEnd { vm });
                }
                self.next_modification(vm, idx, now);
            }
            Ok(false) => {
                let wait = self.limits.backoff_s(attempt);
                self.at(now + wait, Ev::Modify { vm, idx, attempt: attempt + 1 });
            }
            Err(()) => self.modification_not_made(vm, idx, raise, now, false),
        }
    }

    fn next_modification(&mut self, vm: u32, idx: u32, now: f64) {
        if let Some(&(at, _)) = self.tp.modifications.get(idx as usize + 1) {
            let t = (self.vms[vm as usize].iter_start_s + at).max(now);
            self.at(t, Ev::Modify { vm, idx: idx + 1, attempt: 1 });
        }
    }

    fn modification_not_made(&mut self, vm: u32, idx: u32, raise: bool, now: f64, by_rule: bool) {
        if idx == 0 && raise {
            // The first raise of the iteration was not made: it runs on the base spec.
            if by_rule {
                self.refused_rule += 1;
            } else {
                self.failed_throttled += 1;
            }
            let v = &mut self.vms[vm as usize];
            v.on_base = true;
            let end = v.iter_start_s + self.tp.base.map_or(self.tp.iteration_s, |b| b.0);
            self.at(end, Ev::IterationEnd { vm });
            return;
        }
        if !raise {
            self.lowers_not_made += 1;
        }
        self.next_modification(vm, idx, now);
    }

    fn iteration_end(&mut self, vm: u32, now: f64) {
        let (iter_s, usd) = match (self.vms[vm as usize].on_base, self.tp.base) {
            (true, Some(b)) => b,
            _ => (self.tp.iteration_s, self.tp.iteration_usd),
        };
        let v = &mut self.vms[vm as usize];
        // An iteration cut by the VM's stop counts for the part that ran.
        let ran = (v.end_s.min(now) - v.iter_start_s).clamp(0.0, iter_s);
        let frac = if iter_s > 0.0 { ran / iter_s } else { 1.0 };
        v.iterations += frac;
        v.storage_usd += usd * frac;
        if now < v.end_s {
            self.at(now, Ev::IterationStart { vm });
        }
    }

    fn stop(&mut self, vm: u32, now: f64) {
        let v = &mut self.vms[vm as usize];
        v.stopping = true;
        if v.attached {
            let n = self.tp.volumes.len();
            v.setup = std::iter::repeat_n(Api::DetachVolume, n).chain(std::iter::repeat_n(Api::DeleteVolume, n)).collect();
        } else {
            v.setup.clear();
        }
        self.at(now, Ev::Setup { vm, attempt: 1 });
    }
}

/// Plans `t` once (every candidate replayed for one run) and runs the fleet
/// on each simulated candidate.
pub fn simulate_fleet(t: &Trace, plan_opts: &plan::PlanOptions, o: &FleetOptions, prices: &PriceTable) -> Result<FleetReport, PlanError> {
    if o.vms == 0 || !(o.hours.is_finite() && o.hours > 0.0) {
        return Err(PlanError::Invalid("a fleet needs at least 1 VM and a positive number of hours".into()));
    }
    let mut popts = plan_opts.clone();
    popts.deadline = None;
    let p = plan::plan_workload(t, &popts, prices)?;
    let usd_hour = p.instance_usd_hour;
    let span_s = (t.span_ns() as f64 / 1e9).max(1.0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(o.seed);
    let offsets: Vec<f64> = (0..o.vms).map(|_| if o.offsets == Offsets::Random { rng.gen_range(0.0..span_s) } else { 0.0 }).collect();
    let mut rows = Vec::new();
    let mut not_simulated = Vec::new();
    for r in &p.rows {
        if !r.simulated {
            not_simulated.push(format!("{}: {}", r.name, r.why_lost.as_deref().unwrap_or("")));
            continue;
        }
        let tp = template(r, t, &p, prices)?;
        rows.push(run_candidate(r, &tp, &offsets, o, usd_hour));
    }
    let cheapest = rows.iter().enumerate().min_by(|a, b| a.1.usd_per_iteration.total_cmp(&b.1.usd_per_iteration)).map(|(i, _)| i);
    Ok(FleetReport {
        figures: "simulated on virtual time",
        trace: p.trace.clone(),
        vms: o.vms,
        hours: o.hours,
        offsets: o.offsets,
        seed: o.seed,
        instance: p.instance.clone(),
        limits: o.limits.clone(),
        rows,
        cheapest,
        not_simulated,
        notes: vec![
            "each VM repeats the application back to back; a run takes the candidate's replayed completion time".into(),
            "a throttled call is retried with backoff; a raise that fails runs the iteration on the base spec; delays of calls that succeeded are not fed back into the run's time".into(),
            "API calls take no time of their own (CreateVolume's minutes until available are not added to a VM's start)".into(),
        ],
    })
}

fn run_candidate(r: &Row, tp: &Template, offsets: &[f64], o: &FleetOptions, usd_hour: f64) -> FleetRow {
    let setup: Vec<Api> = std::iter::repeat_n(Api::CreateVolume, tp.volumes.len()).chain(std::iter::repeat_n(Api::AttachVolume, tp.volumes.len())).collect();
    let span = o.hours * 3_600.0;
    let mut sim = Sim {
        tp,
        limits: &o.limits,
        rules: ModifyRules::ebs_rolling(),
        heap: BinaryHeap::new(),
        seq: 0,
        buckets: o.limits.api.iter().map(|(&a, &b)| (a, TokenBucket::new(b))).collect(),
        stats: Api::ALL.iter().map(|&a| (a, ApiStats::default())).collect(),
        vms: Vec::with_capacity(offsets.len()),
        attached_now: 0,
        peak_volumes: 0,
        max_start_delay_s: 0.0,
        refused_rule: 0,
        failed_throttled: 0,
        lowers_not_made: 0,
    };
    for (i, &off) in offsets.iter().enumerate() {
        let vm = Vm { start_s: off, end_s: off + span, setup: setup.clone(), call_first_s: off, iter_start_s: off, on_base: false, modified: Vec::new(), iterations: 0.0, storage_usd: 0.0, attached: false, stopping: false };
        sim.vms.push(vm);
        sim.at(off, Ev::Setup { vm: i as u32, attempt: 1 });
        sim.at(off + span, Ev::Stop { vm: i as u32 });
    }
    sim.run();
    let iterations: Vec<f64> = sim.vms.iter().map(|v| v.iterations).collect();
    let compute_per_vm: Vec<f64> = sim.vms.iter().map(|v| (v.end_s - v.start_s) / 3_600.0 * usd_hour).collect();
    let usd_per_vm: Vec<f64> = sim.vms.iter().zip(&compute_per_vm).map(|(v, c)| v.storage_usd + c).collect();
    let storage_usd: f64 = sim.vms.iter().map(|v| v.storage_usd).sum();
    let compute_usd: f64 = compute_per_vm.iter().sum();
    let total_usd = storage_usd + compute_usd;
    let done: f64 = iterations.iter().sum();
    let mut peak_storage: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for v in &tp.volumes {
        let kind = v.to_string().split(':').next().unwrap_or("").to_string();
        let quota = o.limits.storage.get(&kind).copied().unwrap_or(u64::MAX);
        let e = peak_storage.entry(kind).or_insert((0, quota));
        // Every VM holds its volumes at once at the peak (its whole life).
        e.0 = e.0.saturating_add(v.size.saturating_mul(sim.peak_volumes / tp.volumes.len().max(1) as u64));
    }
    let over_quota = peak_storage.iter().filter(|(_, (used, quota))| used > quota).map(|(k, (used, quota))| format!("{k}: {:.1} TiB provisioned at once, quota {:.0} TiB", *used as f64 / (1u64 << 40) as f64, *quota as f64 / (1u64 << 40) as f64)).collect();
    FleetRow {
        name: r.name.clone(),
        spec: r.spec.clone().unwrap_or_default(),
        iterations_per_vm: Spread::of(&iterations),
        usd_per_vm: Spread::of(&usd_per_vm),
        storage_usd,
        compute_usd,
        total_usd,
        usd_per_iteration: if done > 0.0 { total_usd / done } else { f64::INFINITY },
        peak_volumes: sim.peak_volumes,
        peak_storage,
        over_quota,
        api: sim.stats,
        max_start_delay_s: sim.max_start_delay_s,
        raises_refused_by_rule: sim.refused_rule,
        raises_failed_throttled: sim.failed_throttled,
        lowers_not_made: sim.lowers_not_made,
        credits_end_pct: r.credits_end_pct,
        credits_dry_after_runs: r.credits_end_pct.filter(|&c| c < 99.9).map(|c| 100.0 / (100.0 - c).max(1e-9)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::tests::opts;

    fn fleet(vms: u32, offsets: Offsets, hours: f64) -> FleetOptions {
        FleetOptions { vms, offsets, hours, seed: 7, limits: AccountLimits::default() }
    }

    fn row<'a>(f: &'a FleetReport, name: &str) -> &'a FleetRow {
        f.rows.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no row {name}"))
    }

    #[test]
    fn an_aligned_start_of_a_thousand_vms_is_throttled_and_random_offsets_are_not() {
        let t = crate::modify::tests::bursty_with(5, 120, 1_800);
        let o = plan::PlanOptions { instance: "m5.4xlarge".into(), ..opts() };
        let p = PriceTable::default();
        let aligned = simulate_fleet(&t, &o, &fleet(1_000, Offsets::Aligned, 2.0), &p).unwrap();
        let gp3 = row(&aligned, "gp3");
        let create = &gp3.api[&Api::CreateVolume];
        assert_eq!(create.calls, 1_000, "{create:?}");
        // 200 at once, then 5 a second: the last VM waits about 160 s, over 8 attempts' 25 s of backoff.
        assert!(create.throttled > 800 && create.failed > 0, "{create:?}");
        assert!(gp3.max_start_delay_s > 150.0, "{}", gp3.max_start_delay_s);
        assert_eq!(gp3.peak_volumes, 1_000);
        assert_eq!(gp3.api[&Api::DeleteVolume].calls, 1_000, "every VM's volume deleted at its stop");
        let spread = simulate_fleet(&t, &o, &fleet(1_000, Offsets::Random, 2.0), &p).unwrap();
        let c = &row(&spread, "gp3").api[&Api::CreateVolume];
        // 1,000 starts over 32 minutes: 0.5 a second, within the refill.
        assert_eq!((c.calls, c.failed), (1_000, 0), "{c:?}");
        assert!(c.peak_per_s < 10, "{c:?}");
    }

    #[test]
    fn modify_volume_raises_only_as_often_as_the_rolling_rule_allows() {
        // A 2-minute burst every half hour for 12 hours: 24 bursts, 2 raises a day allowed.
        let t = crate::modify::tests::bursty_with(5, 120, 1_800);
        let o = plan::PlanOptions { instance: "m5.4xlarge".into(), ..opts() };
        let f = simulate_fleet(&t, &o, &fleet(3, Offsets::Random, 12.0), &PriceTable::default()).unwrap();
        let m = row(&f, plan::MODIFY);
        let mv = &m.api[&Api::ModifyVolume];
        // Four modifications per rolling 24 h: a raise and a lower, twice, per VM.
        assert_eq!(mv.calls, 3 * 4, "{m:?}");
        assert!(m.raises_refused_by_rule >= 3 * 18, "{m:?}");
        assert!(m.iterations_per_vm.mean > 15.0, "{m:?}");
        let gp3 = row(&f, "gp3");
        assert!(gp3.api[&Api::ModifyVolume].calls == 0);
        assert!(m.total_usd > 0.0 && m.usd_per_iteration.is_finite());
    }

    #[test]
    fn a_fleet_over_the_storage_quota_says_so() {
        let t = crate::modify::tests::bursty_with(5, 60, 600);
        let o = plan::PlanOptions { instance: "m5.4xlarge".into(), capacity: 200 << 30, ..opts() };
        let f = simulate_fleet(&t, &o, &fleet(300, Offsets::Random, 1.0), &PriceTable::default()).unwrap();
        let gp3 = row(&f, "gp3");
        assert_eq!(gp3.peak_storage["gp3"].0, 300 * (200 << 30));
        assert!(gp3.over_quota.iter().any(|q| q.starts_with("gp3: 58.6 TiB")), "{:?}", gp3.over_quota);
        assert!(simulate_fleet(&t, &o, &fleet(0, Offsets::Random, 1.0), &PriceTable::default()).is_err());
    }
}
