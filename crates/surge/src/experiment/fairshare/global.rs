//! The parallel-store part of `surge experiment fairshare` (issue 17): the
//! paper's actual setting, where a proxy on every data server schedules only
//! its own server and striped clients with one request outstanding leave the
//! favoured application short of its share (Fig. 4: 5.8:1 for 16:1), and an
//! application using more servers than another cannot be held to its share at
//! all. Per-server SFQ(D) ("local only": the proxies' cooperation switched off
//! live) against cooperating proxies, every client its own process.

use super::procs::{AppLoad, Backend, Completions, LoadSpec, ServerSpec, Store};
use super::{achieved_ratio, throughput, KIB, MB, MIB};
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

/// Settings of the global part; quick mode keeps the proportions, runs less.
#[derive(Debug, Clone, Serialize)]
pub struct GlobalPlan {
    pub servers: ServerSpec,
    pub backend: Backend,
    /// Clients (processes) per application: `--clients`, by default the
    /// paper's 32, in quick mode [`Self::QUICK_CLIENTS`] (4 until issue 40).
    pub clients: usize,
    pub chunk: u64,
    pub request: u64,
    /// The paper's Fig. 5 request size: smaller than `chunk`, so each request
    /// lands on one server, and a client's sequential requests move on to the
    /// next server every `chunk / small_request` requests (IOR writing its file
    /// in order over a 256 KiB stripe unit).
    pub small_request: u64,
    /// Requests each client keeps in flight in the backlogged variant.
    pub backlog: usize,
    /// Clients per application in the backlogged variant: as many requests
    /// in flight per application as the paper's 32 clients with one each.
    /// 32 clients with 4 each (128 streams per application, 2,048
    /// connections) is more than this 2-core machine holds: the lighter
    /// tenant's streams at 16:1 would each complete one request in ~17 s,
    /// too few to count in a run (quick: b got 0.9 MB/s, load average 45).
    pub backlog_clients: usize,
    pub targets: Vec<u32>,
    /// Targets run with `small_request` (one outstanding request per client).
    pub small_targets: Vec<u32>,
    pub backlogged_targets: Vec<u32>,
    pub run_s: f64,
    pub warmup_s: f64,
    pub cooldown_s: f64,
    /// Runs of every case (each local-only run followed by its cooperative one).
    pub reps: usize,
    /// The hold bound checked on a second workload (issue 40 item 13).
    pub hold_check: HoldCheckPlan,
}

/// The second workload of the hold bound's check (issue 40 item 13): the
/// default `hold_stretch` was calibrated on the 64 KiB, one request per
/// client, 16:1 case; here 32 KiB requests (one server each), 4 clients per
/// application with 2 streams each (8 in flight per application, as the
/// quick run's 8 IOR clients), every stream thinking 4 ms after each request
/// (an application computing between its I/Os), at 4:1 and 16:1; the same
/// in quick and full runs. The same workload as `fairq/global_tests.rs`,
/// `on_off_32k_requests_keep_their_targets_with_the_default_hold_stretch`.
#[derive(Debug, Clone, Serialize)]
pub struct HoldCheckPlan {
    pub request: u64,
    pub clients: usize,
    /// Streams (requests in flight) per client.
    pub streams: usize,
    pub think_us: u64,
    pub targets: Vec<u32>,
    /// The default `hold_stretch`, and the setting it is compared with (1: not stretched).
    pub stretches: [u32; 2],
}

impl HoldCheckPlan {
    fn new(clients: usize) -> Self {
        HoldCheckPlan {
            request: 32 * KIB,
            clients: 4.min(clients),
            streams: 2,
            think_us: 4000,
            targets: vec![4, 16],
            stretches: [surge_block::fairq::global::HOLD_STRETCH, 1],
        }
    }
}

impl GlobalPlan {
    pub fn new(quick: bool, servers: usize, clients: Option<usize>) -> Self {
        let clients = clients.unwrap_or(if quick { Self::QUICK_CLIENTS } else { Self::PAPER_CLIENTS });
        GlobalPlan {
            // 4 MiB per client and server (128 MiB for 32): every client's
            // region holds at least 4 requests, an application on half of 8
            // servers included.
            servers: ServerSpec { count: servers, bw: 16_000_000, latency_us: 1000, size: (clients as u64 * 4 * MIB).max(64 * MIB) },
            backend: Backend::available(),
            clients,
            chunk: 256 * KIB,
            request: MIB,
            small_request: 64 * KIB,
            backlog: 4,
            backlog_clients: (Self::PAPER_CLIENTS / 4).min(clients),
            targets: vec![2, 4, 8, 16],
            // Quick: the end of the range where the paper fell short at 64 KiB.
            small_targets: if quick { vec![16] } else { vec![2, 4, 8, 16] },
            // Backlogged, local SFQ(D) alone holds the ratio: the ends of the
            // range show it. Not gated, and with the paper's 32 clients the
            // IOR cases keep as many requests in flight: quick mode leaves it
            // out to stay within the CI step's time.
            backlogged_targets: if quick { vec![] } else { vec![2, 16] },
            run_s: if quick { 4.0 } else { 10.0 },
            warmup_s: 0.5,
            cooldown_s: 0.25,
            reps: if quick { 1 } else { 3 },
            hold_check: HoldCheckPlan::new(clients),
        }
    }

    /// Seconds of one run at a:b = `target`:1 with requests of `request`
    /// bytes. The lighter tenant's share shrinks with the target, and a ratio
    /// is only as precise as the number of its completions counted (1 MiB at
    /// 16:1 in a 4 s quick run: about 24, one more or fewer moves the ratio by
    /// 4 %, most of the 5 % the gate allows). So beyond 8:1 at 1 MiB a run
    /// lasts in proportion to the target: the lighter tenant completes about
    /// as many requests at 16:1 as at 8:1. Smaller requests complete that many
    /// sooner (64 KiB: 16 times as many per second), so they need no more.
    pub fn run_s_for(&self, target: u32, request: u64) -> f64 {
        let fewer = target as f64 / Self::FULL_LENGTH_UP_TO as f64 * request as f64 / MIB as f64;
        self.run_s * fewer.max(1.0)
    }

    const FULL_LENGTH_UP_TO: u32 = 8;

    /// IOR clients per application in the paper.
    pub const PAPER_CLIENTS: usize = 32;

    /// Clients per application of the quick run (CI), fewer than the paper's:
    /// with 32 (64 client processes beside 16 servers and proxies on this
    /// shared 2-core machine, load average ~23 from other sessions) the CI
    /// step failed the proxies' overhead gate in both attempts (proxied
    /// medians 113.9 and 122.3 MB/s against 128.7 and 132.3 direct); with 8
    /// it passed on its retry. See docs/results/fairshare.md (issue 40).
    pub const QUICK_CLIENTS: usize = 8;

    fn window(run_s: f64, warmup_s: f64, cooldown_s: f64) -> (Duration, Duration) {
        (Duration::from_secs_f64(warmup_s), Duration::from_secs_f64(run_s - cooldown_s))
    }

    fn all_servers(&self) -> Vec<usize> {
        (0..self.servers.count).collect()
    }

    fn load(&self, outstanding: usize, narrow_b: bool, via_proxies: bool, run_s: f64) -> LoadSpec {
        self.load_of(self.request, outstanding, narrow_b, via_proxies, run_s)
    }

    fn load_of(&self, request: u64, outstanding: usize, narrow_b: bool, via_proxies: bool, run_s: f64) -> LoadSpec {
        let half: Vec<usize> = (0..self.servers.count.div_ceil(2)).collect();
        let clients = if outstanding > 1 { self.backlog_clients } else { self.clients };
        LoadSpec {
            apps: [
                AppLoad { clients, servers: self.all_servers(), outstanding },
                AppLoad { clients, servers: if narrow_b { half } else { self.all_servers() }, outstanding },
            ],
            via_proxies,
            chunk: self.chunk,
            request,
            think: Duration::ZERO,
            duration: Duration::from_secs_f64(run_s),
        }
    }

    /// The hold check's workload, through the proxies.
    fn hold_check_load(&self) -> LoadSpec {
        let h = &self.hold_check;
        let app = || AppLoad { clients: h.clients, servers: self.all_servers(), outstanding: h.streams };
        LoadSpec {
            apps: [app(), app()],
            via_proxies: true,
            chunk: self.chunk,
            request: h.request,
            think: Duration::from_micros(h.think_us),
            duration: Duration::from_secs_f64(self.run_s),
        }
    }
}

/// One case over its runs: the median and the spread.
#[derive(Debug, Clone, Serialize)]
pub struct RatioEntry {
    pub target: u32,
    /// Median a:b over the runs.
    pub achieved: f64,
    pub request_bytes: u64,
    pub outstanding: usize,
    pub runs: Vec<f64>,
    pub min: f64,
    pub max: f64,
    /// Median MB/s of a and b.
    pub mbps: [f64; 2],
}

#[derive(Debug, Clone, Serialize, Default)]
pub struct ModeResults {
    /// One request outstanding per client (the paper's IOR setting): 1 MiB
    /// striped (Fig. 4) and 64 KiB (Fig. 5), told apart by `request_bytes`.
    pub ratios: Vec<RatioEntry>,
    pub backlogged_ratios: Vec<RatioEntry>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AsymEntry {
    /// (narrow : wide achieved) / (narrow : wide target); 1 is exact.
    pub achieved_over_target: f64,
    pub runs: Vec<f64>,
    pub min: f64,
    pub max: f64,
    /// Median MB/s of the wide (all servers) and the narrow (half) application.
    pub mbps: [f64; 2],
}

#[derive(Debug, Clone, Serialize)]
pub struct Asymmetric {
    /// Weights wide:narrow (the target ratio of their total service).
    pub weights: [u32; 2],
    pub narrow_servers: usize,
    pub local_only: AsymEntry,
    pub cooperative: AsymEntry,
}

#[derive(Debug, Clone, Serialize)]
pub struct Overhead {
    /// Median total MB/s with clients talking to the servers directly, and through cooperating proxies.
    pub direct_mbps: f64,
    pub proxied_mbps: f64,
    pub direct_runs: Vec<f64>,
    pub proxied_runs: Vec<f64>,
}

/// One target and `hold_stretch` of the hold check, over its runs.
#[derive(Debug, Clone, Serialize)]
pub struct HoldCheckEntry {
    pub target: u32,
    pub hold_stretch: u32,
    /// Median a:b over the runs, and the runs.
    pub achieved: f64,
    pub runs: Vec<f64>,
    pub min: f64,
    pub max: f64,
    /// Median MB/s of a and b.
    pub mbps: [f64; 2],
    /// Holds that ran out their bound, summed over the proxies, per run.
    pub holds_expired: Vec<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HoldCheck {
    pub entries: Vec<HoldCheckEntry>,
    /// What the runs say, per target (see [`HoldCheck::verdicts`]).
    pub verdicts: Vec<HoldVerdict>,
    /// How long the check took (what it adds to a run).
    pub elapsed_s: f64,
}

/// How the default did at one target against the unstretched bound.
#[derive(Debug, Clone, Serialize)]
pub struct HoldVerdict {
    pub target: u32,
    /// |achieved / target - 1| of the default and of the unstretched bound.
    pub default_error: f64,
    pub unstretched_error: f64,
    /// The default within [`HoldCheck::CLOSE`] of the target.
    pub default_close: bool,
    /// The default's error at most the unstretched one's plus [`HoldCheck::CLOSE`] / 2.
    pub default_no_worse: bool,
}

impl HoldCheck {
    /// Within 5 % of the target: the gate of the 1 MiB cases.
    pub const CLOSE: f64 = 0.05;

    fn new(entries: Vec<HoldCheckEntry>, stretches: [u32; 2], elapsed_s: f64) -> Self {
        let verdicts = Self::verdicts(&entries, stretches);
        HoldCheck { entries, verdicts, elapsed_s }
    }

    fn verdicts(entries: &[HoldCheckEntry], [default, plain]: [u32; 2]) -> Vec<HoldVerdict> {
        let error = |e: &HoldCheckEntry| (e.achieved / e.target as f64 - 1.0).abs();
        let find = |t: u32, k: u32| entries.iter().find(|e| e.target == t && e.hold_stretch == k);
        let mut targets: Vec<u32> = entries.iter().map(|e| e.target).collect();
        targets.dedup();
        targets
            .into_iter()
            .filter_map(|t| {
                let (d, p) = (error(find(t, default)?), error(find(t, plain)?));
                Some(HoldVerdict { target: t, default_error: d, unstretched_error: p, default_close: d <= Self::CLOSE, default_no_worse: d <= p + Self::CLOSE / 2.0 })
            })
            .collect()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct GlobalResults {
    pub plan: GlobalPlan,
    pub local_only: ModeResults,
    pub cooperative: ModeResults,
    pub asymmetric: Asymmetric,
    pub overhead: Overhead,
    /// (direct - proxied) / direct, in percent.
    pub overhead_pct: f64,
    /// The default hold bound against the unstretched one on the second workload.
    pub hold_bound_check: HoldCheck,
    /// Holds that ran out their anticipation bound and requests held back, summed over proxies, per tenant.
    pub proxy_counters: serde_json::Value,
    pub elapsed_s: f64,
}

pub(super) fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub(super) fn spread(v: &[f64]) -> (f64, f64) {
    (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max))
}

struct Runner<'a> {
    plan: &'a GlobalPlan,
    store: Store,
}

/// What one run measured.
struct Measured {
    ratio: f64,
    mbps: [f64; 2],
    /// What the proxies did during the run (summed over them): requests of a
    /// and b held back, holds that ran out their bound.
    holds: Holds,
}

#[derive(Debug, Clone, Copy, Default)]
struct Holds {
    held: [u64; 2],
    expired: u64,
}

impl Holds {
    /// Saturating: a proxy that does not answer a status call drops out of a sum.
    fn since(self, before: Holds) -> Holds {
        Holds { held: [0, 1].map(|t| self.held[t].saturating_sub(before.held[t])), expired: self.expired.saturating_sub(before.expired) }
    }
}

impl std::fmt::Display for Holds {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "held a {} b {}, {} holds expired", self.held[0], self.held[1], self.expired)
    }
}

impl Runner<'_> {
    fn measure(&self, c: &Completions, run_s: f64, holds: Holds) -> Measured {
        let w = GlobalPlan::window(run_s, self.plan.warmup_s, self.plan.cooldown_s);
        Measured { ratio: achieved_ratio(c, w), mbps: throughput(c, w), holds }
    }

    fn holds(&self) -> Holds {
        let sum = |tenant: &str, key: &str| -> u64 {
            self.store.tenant_status(tenant).iter().map(|s| s["tenant"][key].as_u64().unwrap_or(0)).sum()
        };
        let expired = self.store.tenant_status("a").iter().map(|s| s["pool_holds_expired"].as_u64().unwrap_or(0)).sum();
        Holds { held: [sum("a", "held"), sum("b", "held")], expired }
    }

    fn configure(&self, weights: [u32; 2], cooperative: bool) -> anyhow::Result<()> {
        self.store.set("a", "weight", &weights[0].to_string())?;
        self.store.set("b", "weight", &weights[1].to_string())?;
        self.store.set("a", "global", if cooperative { "on" } else { "off" })?;
        Ok(())
    }

    fn run(&self, weights: [u32; 2], cooperative: bool, load: &LoadSpec) -> anyhow::Result<Measured> {
        if load.via_proxies {
            self.configure(weights, cooperative)?;
        }
        let before = self.holds();
        let c = super::procs::run_clients(&self.store, load)?;
        Ok(self.measure(&c, load.duration.as_secs_f64(), self.holds().since(before)))
    }

    /// Every target, local only then cooperative, `reps` times interleaved.
    fn ratios(&self, request: u64, outstanding: usize, targets: &[u32]) -> anyhow::Result<[Vec<RatioEntry>; 2]> {
        let p = self.plan;
        let mut out = [Vec::new(), Vec::new()];
        for &target in targets {
            let load = p.load_of(request, outstanding, false, true, p.run_s_for(target, request));
            let mut runs: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
            for rep in 0..p.reps {
                for (mode, coop) in [false, true].into_iter().enumerate() {
                    let m = self.run([target, 1], coop, &load)?;
                    step(&format!(
                        "global {target}:1, {} KiB, {} outstanding, {} (run {}): {:.2}:1, {:.1} + {:.1} MB/s; {}",
                        request / KIB,
                        outstanding,
                        if coop { "cooperative" } else { "local only" },
                        rep + 1,
                        m.ratio,
                        m.mbps[0],
                        m.mbps[1],
                        m.holds
                    ));
                    runs[mode].push(m);
                }
            }
            for mode in 0..2 {
                let r: Vec<f64> = runs[mode].iter().map(|m| m.ratio).collect();
                let (min, max) = spread(&r);
                let mbps = [0, 1].map(|t| median(&runs[mode].iter().map(|m| m.mbps[t]).collect::<Vec<_>>()));
                out[mode].push(RatioEntry { target, achieved: median(&r), request_bytes: request, outstanding, runs: r, min, max, mbps });
            }
        }
        Ok(out)
    }

    /// The hold check (issue 40 item 13): every target, the default
    /// `hold_stretch` then the unstretched bound, `reps` times interleaved;
    /// the proxies are left at the default.
    fn hold_check(&self) -> anyhow::Result<HoldCheck> {
        let started = std::time::Instant::now();
        let p = self.plan;
        let h = &p.hold_check;
        let load = p.hold_check_load();
        let mut entries = Vec::new();
        for &target in &h.targets {
            let mut runs: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
            for rep in 0..p.reps {
                for (k, &stretch) in h.stretches.iter().enumerate() {
                    self.configure([target, 1], true)?;
                    self.store.set("a", "hold_stretch", &stretch.to_string())?;
                    let m = self.run([target, 1], true, &load);
                    self.store.set("a", "hold_stretch", &h.stretches[0].to_string())?;
                    let m = m?;
                    step(&format!(
                        "global hold check {target}:1, {} KiB, {} streams per client, {} ms think, hold_stretch={stretch} (run {}): {:.2}:1, {:.1} + {:.1} MB/s; {}",
                        h.request / KIB,
                        h.streams,
                        h.think_us as f64 / 1000.0,
                        rep + 1,
                        m.ratio,
                        m.mbps[0],
                        m.mbps[1],
                        m.holds
                    ));
                    runs[k].push(m);
                }
            }
            for (k, &stretch) in h.stretches.iter().enumerate() {
                let r: Vec<f64> = runs[k].iter().map(|m| m.ratio).collect();
                let (min, max) = spread(&r);
                let mbps = [0, 1].map(|t| median(&runs[k].iter().map(|m| m.mbps[t]).collect::<Vec<_>>()));
                let holds_expired = runs[k].iter().map(|m| m.holds.expired).collect();
                entries.push(HoldCheckEntry { target, hold_stretch: stretch, achieved: median(&r), runs: r, min, max, mbps, holds_expired });
            }
        }
        Ok(HoldCheck::new(entries, h.stretches, started.elapsed().as_secs_f64()))
    }

    /// a stripes over every server, b over half of them; equal weights.
    fn asymmetric(&self) -> anyhow::Result<Asymmetric> {
        let p = self.plan;
        let load = p.load(1, true, true, p.run_s);
        let weights = [1u32, 1];
        let mut runs: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
        for rep in 0..p.reps {
            for (mode, coop) in [false, true].into_iter().enumerate() {
                let m = self.run(weights, coop, &load)?;
                step(&format!(
                    "global asymmetric, {} (run {}): wide {:.1} MB/s, narrow {:.1} MB/s; {}",
                    if coop { "cooperative" } else { "local only" },
                    rep + 1,
                    m.mbps[0],
                    m.mbps[1],
                    m.holds
                ));
                runs[mode].push(m);
            }
        }
        let target = weights[1] as f64 / weights[0] as f64;
        let entry = |ms: &[Measured]| {
            let r: Vec<f64> = ms.iter().map(|m| (1.0 / m.ratio) / target).collect();
            let (min, max) = spread(&r);
            let mbps = [0, 1].map(|t| median(&ms.iter().map(|m| m.mbps[t]).collect::<Vec<_>>()));
            AsymEntry { achieved_over_target: median(&r), runs: r, min, max, mbps }
        };
        Ok(Asymmetric {
            weights,
            narrow_servers: p.servers.count.div_ceil(2),
            local_only: entry(&runs[0]),
            cooperative: entry(&runs[1]),
        })
    }

    /// Equal weights: clients straight to the servers vs through cooperating proxies, interleaved.
    fn overhead(&self) -> anyhow::Result<Overhead> {
        let p = self.plan;
        // At least 3: the median of 3 passes over one run slowed by the machine.
        let reps = p.reps.max(3);
        let (mut direct, mut proxied) = (Vec::new(), Vec::new());
        for rep in 0..reps {
            for via in [false, true] {
                let m = self.run([1, 1], true, &p.load(1, false, via, p.run_s))?;
                let total = m.mbps[0] + m.mbps[1];
                step(&format!(
                    "global overhead, {} (run {}): {total:.1} MB/s; {}",
                    if via { "through proxies" } else { "direct" },
                    rep + 1,
                    m.holds
                ));
                if via {
                    proxied.push(total);
                } else {
                    direct.push(total);
                }
            }
        }
        Ok(Overhead { direct_mbps: median(&direct), proxied_mbps: median(&proxied), direct_runs: direct, proxied_runs: proxied })
    }

    /// Investigation (issue 40): `reps` pairs of direct and proxied runs at
    /// equal weights, every proxy's status sampled every 100 ms during the
    /// proxied ones, written to `out/probe.jsonl`.
    fn probe(&self, reps: usize, out: &Path) -> anyhow::Result<()> {
        use std::io::Write as _;
        let p = self.plan;
        let mut f = std::fs::File::create(out.join("probe.jsonl"))?;
        for rep in 0..reps {
            for via in [false, true] {
                let load = p.load(1, false, via, p.run_s);
                if via {
                    self.configure([1, 1], true)?;
                }
                let stop = std::sync::atomic::AtomicBool::new(false);
                let t0 = std::time::Instant::now();
                let (c, samples) = super::procs::run_clients_with(&self.store, &load, || {
                    let mut v = Vec::new();
                    while via && t0.elapsed() < load.duration + Duration::from_millis(500) && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
                        let kb = |k: &str| meminfo.lines().find(|l| l.starts_with(k)).and_then(|l| l.split_whitespace().nth(1)).and_then(|x| x.parse::<u64>().ok());
                        fn find(v: &serde_json::Value, key: &str) -> u64 {
                            match v {
                                serde_json::Value::Object(m) => m.iter().map(|(k, x)| if k == key { x.as_u64().unwrap_or(0) } else { find(x, key) }).sum(),
                                serde_json::Value::Array(a) => a.iter().map(|x| find(x, key)).sum(),
                                _ => 0,
                            }
                        }
                        let flushes: Vec<u64> = self.store.statuses("server").into_iter().map(|s| s.map_or(0, |m| find(&serde_json::Value::Object(m), "flushes"))).collect();
                        v.push(serde_json::json!({ "t": t0.elapsed().as_secs_f64(), "dirty_kb": kb("Dirty:"), "writeback_kb": kb("Writeback:"), "server_flushes": flushes, "proxies": self.store.proxy_statuses().into_iter().map(|s| s.map(|m| {
                            let q = |n: &str| m.get(n).cloned().unwrap_or_default();
                            let (a, b, coop, remote) = (q("qos/a"), q("qos/b"), q("coop"), q("pool/pfs/remote"));
                            serde_json::json!({
                                "a": { "g": a["tenant"]["global_service"], "q": a["tenant"]["queued"], "f": a["tenant"]["in_flight"], "held": a["tenant"]["held"], "bytes": a["tenant"]["bytes"] },
                                "b": { "g": b["tenant"]["global_service"], "q": b["tenant"]["queued"], "f": b["tenant"]["in_flight"], "held": b["tenant"]["held"], "bytes": b["tenant"]["bytes"] },
                                "holds": a["pool_holds_started"], "hold_us": a["pool_hold_time_us"], "expired": a["pool_holds_expired"], "rebased": a["pool_rebased"],
                                "out": a["pool_outstanding"], "peer_age_us": a["pool_peers"].as_array().map(|v| v.iter().map(|p| p["age_us"].clone()).collect::<Vec<_>>()),
                                "late_rounds": coop["late_rounds"], "max_gap_us": coop["max_round_gap_us"],
                                "replay_mb": remote["replay_bytes"].as_u64().map(|b| b >> 20), "bounding": remote["bounding_flushes"], "waited": remote["waited_flushes"], "waited_us": remote["waited_flush_us"],
                            })
                        })).collect::<Vec<_>>() }));
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    v
                })?;
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                let m = self.measure(&c, p.run_s, Holds::default());
                let total = m.mbps[0] + m.mbps[1];
                step(&format!("probe {} (run {}): {total:.1} MB/s ({:.1} + {:.1}), load {}", if via { "through proxies" } else { "direct" }, rep + 1, m.mbps[0], m.mbps[1], std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()));
                writeln!(f, "{}", serde_json::json!({ "rep": rep, "via": via, "mbps": total, "samples": samples }))?;
            }
        }
        Ok(())
    }

    fn counters(&self) -> serde_json::Value {
        let sum = |tenant: &str| -> u64 {
            self.store.tenant_status(tenant).iter().map(|s| s["tenant"]["remote_cost"].as_u64().unwrap_or(0)).sum()
        };
        let h = self.holds();
        serde_json::json!({
            "held": { "a": h.held[0], "b": h.held[1] },
            "remote_cost": { "a": sum("a"), "b": sum("b") },
            "holds_expired": h.expired,
        })
    }
}

fn step(msg: &str) {
    crate::experiment::progress::step(format!("fairshare: {msg}"), true);
}

pub fn run(plan: &GlobalPlan) -> anyhow::Result<GlobalResults> {
    let started = std::time::Instant::now();
    let dir = super::rig::scratch().join(format!("surge-fairshare-global-{}", std::process::id()));
    let result = Store::start(&dir, &plan.servers, plan.backend).and_then(|store| measure(plan, store, started));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Investigation only: see [`Runner::probe`].
pub fn probe(plan: &GlobalPlan, reps: usize, out: &Path) -> anyhow::Result<()> {
    let dir = super::rig::scratch().join(format!("surge-fairshare-probe-{}", std::process::id()));
    let result = Store::start(&dir, &plan.servers, plan.backend).and_then(|store| Runner { plan, store }.probe(reps, out));
    for k in 0..plan.servers.count {
        for role in ["proxy", "server"] {
            let _ = std::fs::copy(dir.join(format!("{role}{k}")).join("serve.log"), out.join(format!("{role}{k}.log")));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn measure(plan: &GlobalPlan, store: Store, started: std::time::Instant) -> anyhow::Result<GlobalResults> {
    let r = Runner { plan, store };
    let [mut lo, mut co] = r.ratios(plan.request, 1, &plan.targets)?;
    let [lo_s, co_s] = r.ratios(plan.small_request, 1, &plan.small_targets)?;
    lo.extend(lo_s);
    co.extend(co_s);
    let [lo_b, co_b] = r.ratios(plan.request, plan.backlog, &plan.backlogged_targets)?;
    let hold_bound_check = r.hold_check()?;
    let asymmetric = r.asymmetric()?;
    let overhead = r.overhead()?;
    let proxy_counters = r.counters();
    Ok(GlobalResults {
        plan: plan.clone(),
        local_only: ModeResults { ratios: lo, backlogged_ratios: lo_b },
        cooperative: ModeResults { ratios: co, backlogged_ratios: co_b },
        asymmetric,
        overhead_pct: (overhead.direct_mbps - overhead.proxied_mbps) / overhead.direct_mbps * 100.0,
        overhead,
        hold_bound_check,
        proxy_counters,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// The paper's Fig. 4 (1 MiB, 8 servers, per-server SFQ(2) proxies): achieved a:b by target.
pub const PAPER_FIG4: [(f64, f64); 2] = [(2.0, 1.9), (16.0, 5.8)];

/// What the paper reports for a target: Fig. 4 (1 MiB), Fig. 5 (64 KiB; its
/// text gives no numbers, only how it compares), nothing for the backlogged variant.
fn paper_says(backlogged: bool, request: u64, target: u32) -> &'static str {
    match (backlogged, request, target) {
        (true, _, _) => "-",
        (false, MIB, 2) => "1.9",
        (false, MIB, 16) => "5.8",
        (false, MIB, _) => "(falls off, Fig. 4)",
        (false, _, 16) => "< 16 (Fig. 5)",
        (false, _, _) => "better than 1 MiB (Fig. 5)",
    }
}

/// One mode's entries of one request size.
fn of_size(v: &[RatioEntry], request: u64) -> Vec<&RatioEntry> {
    v.iter().filter(|x| x.request_bytes == request).collect()
}

fn ratio_rows(s: &mut String, g: &GlobalResults, backlogged: bool, request: u64) {
    let (lo, co) = if backlogged {
        (of_size(&g.local_only.backlogged_ratios, request), of_size(&g.cooperative.backlogged_ratios, request))
    } else {
        (of_size(&g.local_only.ratios, request), of_size(&g.cooperative.ratios, request))
    };
    s.push_str("| target | outstanding / client | paper (local) | local only | cooperative | cooperative / target | MB/s a + b (local / coop) |\n|---|---|---|---|---|---|---|\n");
    for (l, c) in lo.into_iter().zip(co) {
        let paper = paper_says(backlogged, request, l.target);
        s.push_str(&format!(
            "| {}:1 | {} | {paper} | {:.2} ({:.2}..{:.2}) | {:.2} ({:.2}..{:.2}) | {:.3} | {:.1} + {:.1} / {:.1} + {:.1} |\n",
            l.target,
            l.outstanding,
            l.achieved,
            l.min,
            l.max,
            c.achieved,
            c.min,
            c.max,
            c.achieved / c.target as f64,
            l.mbps[0],
            l.mbps[1],
            c.mbps[0],
            c.mbps[1]
        ));
    }
}

/// The report's section on the parallel store (markdown).
pub fn report(g: &GlobalResults) -> String {
    let p = &g.plan;
    let n = p.servers.count;
    let mut s = String::new();
    s.push_str(&format!("## Across {n} servers: per-server SFQ(D) vs cooperating proxies (paper Figs. 4 and 5, issue 17)\n\n"));
    s.push_str("| | paper | here |\n|---|---|---|\n");
    s.push_str(&format!(
        "| data servers | 8 PVFS2 servers, a vPFS proxy (SFQ(2)) on each | {n} `surge serve` processes, each a `reserved:` volume of {:.0} MB/s, {} µs base latency ({} MiB), plus one proxy `surge serve` per server with a `share:` pool, tenants a and b by client address ({} and {}) |\n",
        p.servers.bw as f64 / MB,
        p.servers.latency_us,
        p.servers.size / MIB,
        super::procs::APP_NETS[0],
        super::procs::APP_NETS[1]
    ));
    let interposed = match p.backend {
        Backend::Remote => "each proxy's pool is a `remote:` NBD client of its storage server".to_string(),
        Backend::InProxy => "this build has no `remote:` (NBD client) export kind yet, so each proxy's pool is its server's emulated volume itself (same model and settings); the storage server processes serve the *direct* runs of the overhead comparison".to_string(),
    };
    s.push_str(&format!("| proxy in front of a server | user-level proxy forwarding to the PVFS2 server | {interposed} |\n"));
    s.push_str(&format!(
        "| clients | IOR over MPI-IO, 32 per application, 1 MiB requests striped as 4 x 256 KiB (Fig. 5: 64 KiB requests), 1 outstanding | {} `surge stripe-bench` processes per application ({}; `--clients N` sets it) (own NBD connections to every server it uses, bound to its application's address), {} KiB requests striped as {} x {} KiB chunks round robin over the servers, sent together, and {} KiB requests (Fig. 5; one server each); 1 outstanding per client; backlogged variant: {} clients per application with {} outstanding each |\n",
        p.clients,
        if p.clients == GlobalPlan::PAPER_CLIENTS {
            "the paper's count".to_string()
        } else if p.clients == GlobalPlan::QUICK_CLIENTS {
            format!("the paper had {}; quick runs use {}: with {} this shared 2-core machine did not hold the proxied throughput within the CI gate, see docs/results/fairshare.md", GlobalPlan::PAPER_CLIENTS, GlobalPlan::QUICK_CLIENTS, GlobalPlan::PAPER_CLIENTS)
        } else {
            format!("the paper had {}", GlobalPlan::PAPER_CLIENTS)
        },
        p.request / KIB,
        p.request / p.chunk,
        p.chunk / KIB,
        p.small_request / KIB,
        p.backlog_clients,
        p.backlog
    ));
    s.push_str("| local only | the paper's system | the same proxies with `global=off` (set live): each schedules only its own queue |\n");
    s.push_str("| cooperative | future work in the paper | `global=on`: each proxy reports what every tenant received to its peers every 20 ms over `--coop-peer` connections (default `--coop-period`), tags are delayed by service received elsewhere (DSFQ), a tenant running ahead of its share of the total by more than `lag` (1 MiB) yields to an owed tenant, and a server may keep a free slot for an owed tenant's next chunk as long as that tenant has been seen to take to send one there (`anticipate=auto`: smoothed mean + 4 deviations of its gaps, stretched by the held tenant's lead in lags up to 8 times, within 1..200 ms); a peer unheard for 500 ms no longer counts (local SFQ(D) for it, I/O never waits for a peer) |\n");
    s.push_str(&format!(
        "| runs | not stated | {} s per run ({} s at 16:1 with 1 MiB requests: beyond {}:1 a run lasts in proportion to the target, so that the lighter tenant completes as many requests as at {}:1; 64 KiB runs complete 16 times as many and keep the base length), first {} s and last {} s not measured; {} run(s) of every case, local only and cooperative interleaved; medians with (min..max) |\n\n",
        p.run_s, p.run_s_for(16, p.request), GlobalPlan::FULL_LENGTH_UP_TO, GlobalPlan::FULL_LENGTH_UP_TO, p.warmup_s, p.cooldown_s, p.reps
    ));
    s.push_str("### Proportional sharing, 1 MiB striped, one outstanding request per client (Fig. 4)\n\n");
    ratio_rows(&mut s, g, false, p.request);
    // Said from the measurement: whether local SFQ(D) fell short here depends
    // on the client count and this machine's timing.
    let local16 = of_size(&g.local_only.ratios, p.request).into_iter().find(|x| x.target == 16).map(|x| x.achieved);
    match local16 {
        Some(l) if l < 0.95 * 16.0 => s.push_str(&format!("\nLocal only fell short at 16:1 ({l:.2}:1; paper 5.8:1). With one request outstanding per client and its chunks spread over the servers, no single proxy sees the favoured application's requests waiting often enough for its weight to act: local SFQ(D) is work-conserving and gives the idle share away, as the paper found. Cooperating proxies charge each tenant for the service it received everywhere, so the favoured tenant's next chunk at any server starts ahead of the other's.\n\n")),
        Some(l) => s.push_str(&format!("\nThe paper's shortfall is not reproduced in this run: local only reached {l:.2}:1 at 16:1 (paper 5.8:1). With {} clients per application and one request each, {} chunks of each application are in flight over {n} servers, so each proxy mostly has both applications' chunks waiting and local SFQ(D) alone holds the weights; with 4 clients per application (until issue 40) it reached about 2:1 at 16:1. Cooperating proxies charge each tenant for the service it received everywhere.\n\n", p.clients, p.clients as u64 * p.request / p.chunk)),
        None => {}
    }
    if !p.small_targets.is_empty() {
        s.push_str(&format!(
            "### Small requests: {} KiB, one outstanding request per client (Fig. 5)\n\n",
            p.small_request / KIB
        ));
        ratio_rows(&mut s, g, false, p.small_request);
        s.push_str(&format!(
            "\nA {} KiB request is smaller than the {} KiB stripe unit: it goes to one server whole, and a client writing its region in order moves on to the next server every {} requests (the paper's IOR writes sequentially; it gives no other placement). Each client has one chunk in flight instead of {}, so each proxy sees fewer requests of either application at once. The paper's text gives no numbers for Fig. 5, only that it came out much better than Fig. 4 and still short at 16:1.\n\n",
            p.small_request / KIB,
            p.chunk / KIB,
            p.chunk / p.small_request,
            p.request / p.chunk
        ));
    }
    if !p.backlogged_targets.is_empty() {
        s.push_str("### Backlogged variant\n\n");
        ratio_rows(&mut s, g, true, p.request);
        s.push_str(&format!("\n{} clients per application with {} requests in flight each: {} in flight per application, as many as the paper's 32 clients with one each (32 clients with 4 each would be 2,048 connections and leave the lighter tenant's streams about one completion per 17 s at 16:1). With more in flight, each proxy sees both tenants queued more often and local SFQ(D) comes closer to the target; cooperation must hold the weights and not overshoot.\n\n", p.backlog_clients, p.backlog, p.backlog_clients * p.backlog));
    }
    hold_check_section(&mut s, g);
    let a = &g.asymmetric;
    s.push_str(&format!(
        "### Asymmetric server use: a over all {n} servers, b over {} of them, weights {}:{}\n\n",
        a.narrow_servers, a.weights[0], a.weights[1]
    ));
    s.push_str("| | (b:a achieved) / (b:a target) | runs | MB/s a (all servers) | MB/s b (half) |\n|---|---|---|---|---|\n");
    for (name, e) in [("local only", &a.local_only), ("cooperative", &a.cooperative)] {
        s.push_str(&format!(
            "| {name} | {:.3} | {:.3}..{:.3} | {:.1} | {:.1} |\n",
            e.achieved_over_target, e.min, e.max, e.mbps[0], e.mbps[1]
        ));
    }
    s.push_str("\nThe paper could not give such an application its share at all (\"requires cooperative scheduling across proxies\").\n\n");
    let o = &g.overhead;
    s.push_str(&format!(
        "### Overhead, equal weights, 1 outstanding per client\n\nClients straight to the storage servers: {:.1} MB/s (runs {}); through the cooperating proxies: {:.1} MB/s (runs {}): **{:.2} %** (paper: < 3 %).\n\n",
        o.direct_mbps,
        fmt_runs(&o.direct_runs),
        o.proxied_mbps,
        fmt_runs(&o.proxied_runs),
        g.overhead_pct
    ));
    s.push_str(&format!(
        "Proxy counters at the end (summed over proxies): {}. Plot: `global-ratios.svg`. This part took {:.0} s.\n",
        g.proxy_counters, g.elapsed_s
    ));
    s
}

/// The hold bound's check on the second workload, with what it found.
fn hold_check_section(s: &mut String, g: &GlobalResults) {
    let (p, c) = (&g.plan.hold_check, &g.hold_bound_check);
    let [default, plain] = p.stretches;
    s.push_str("### Hold bound on a second workload (issue 40 item 13)\n\n");
    s.push_str(&format!(
        "The default `hold_stretch={default}` (under `anticipate=auto` a hold lasts up to {default} times the owed tenant's gap estimate, by the held tenant's lead in lags, within 200 ms) was calibrated on the {} KiB, one request per client, 16:1 case above. Here a workload that played no part in it: {} KiB requests (one server each), {} clients per application with {} streams each, every stream waiting {} ms after each request before it sends the next, cooperative, the default against `hold_stretch={plain}` (no stretch, the bound before the calibration; set live with `surge qos set a hold_stretch=N`), {} run(s) of {} s each, interleaved.\n\n",
        g.plan.small_request / KIB,
        p.request / KIB,
        p.clients,
        p.streams,
        p.think_us as f64 / 1000.0,
        g.plan.reps,
        g.plan.run_s
    ));
    s.push_str("| target | hold_stretch | a:b (min..max) | / target | MB/s a + b | holds expired (per run) |\n|---|---|---|---|---|---|\n");
    for e in &c.entries {
        let expired: Vec<String> = e.holds_expired.iter().map(u64::to_string).collect();
        s.push_str(&format!(
            "| {}:1 | {}{} | {:.2} ({:.2}..{:.2}) | {:.3} | {:.1} + {:.1} | {} |\n",
            e.target,
            e.hold_stretch,
            if e.hold_stretch == default { " (default)" } else { "" },
            e.achieved,
            e.min,
            e.max,
            e.achieved / e.target as f64,
            e.mbps[0],
            e.mbps[1],
            expired.join(", ")
        ));
    }
    s.push('\n');
    for v in &c.verdicts {
        let close = if v.default_close { "within" } else { "NOT within" };
        let compared = if v.default_error + 0.005 < v.unstretched_error {
            "closer than"
        } else if v.default_error <= v.unstretched_error + 0.005 {
            "as close as"
        } else if v.default_no_worse {
            "slightly further off than"
        } else {
            "further off than"
        };
        s.push_str(&format!(
            "- {}:1: the default came {:.1} % from the target ({close} {:.0} %), {compared} the unstretched bound ({:.1} %).\n",
            v.target,
            v.default_error * 100.0,
            HoldCheck::CLOSE * 100.0,
            v.unstretched_error * 100.0
        ));
    }
    let all_close = c.verdicts.iter().all(|v| v.default_close);
    let no_worse = c.verdicts.iter().all(|v| v.default_no_worse);
    s.push_str(&format!(
        "\nHow the default did: {} on this workload, and {} than the unstretched bound (no worse: error at most {:.1} points above it), over {} run(s) per setting. This check took {:.0} s.\n\n",
        if all_close { "held every target" } else { "fell short of a target" },
        if no_worse { "no worse" } else { "worse" },
        HoldCheck::CLOSE * 50.0,
        g.plan.reps,
        c.elapsed_s
    ));
}

pub(super) fn fmt_runs(v: &[f64]) -> String {
    v.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", ")
}

/// Achieved vs target across the servers, 1 MiB beside the paper's Fig. 4 and
/// 64 KiB (Fig. 5, whose numbers the paper's text does not give).
pub fn plot(out: &Path, g: &GlobalResults) -> anyhow::Result<()> {
    use super::plot::{line_chart, Chart, Series};
    let p = &g.plan;
    let pts = |v: &[RatioEntry], request: u64| of_size(v, request).iter().map(|x| (x.target as f64, x.achieved)).collect();
    let small = format!("{} KiB", p.small_request / KIB);
    let title = format!("Achieved vs target over {} servers, 1 outstanding/client (Figs. 4, 5)", p.servers.count);
    line_chart(
        &out.join("global-ratios.svg"),
        &Chart { title: &title, x_label: "target a:b", y_label: "achieved a:b", log_x: false },
        &[
            Series { name: "per-server SFQ(D) (local only), 1 MiB striped".into(), points: pts(&g.local_only.ratios, p.request), reference: false },
            Series { name: "cooperating proxies, 1 MiB striped".into(), points: pts(&g.cooperative.ratios, p.request), reference: false },
            Series { name: "paper, Fig. 4 (1 MiB, per-server SFQ(2))".into(), points: PAPER_FIG4.to_vec(), reference: false },
            Series { name: format!("per-server SFQ(D) (local only), {small}"), points: pts(&g.local_only.ratios, p.small_request), reference: false },
            Series { name: format!("cooperating proxies, {small}"), points: pts(&g.cooperative.ratios, p.small_request), reference: false },
            Series { name: "ideal".into(), points: vec![(2.0, 2.0), (16.0, 16.0)], reference: true },
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(target: u32, hold_stretch: u32, achieved: f64) -> HoldCheckEntry {
        HoldCheckEntry { target, hold_stretch, achieved, runs: vec![achieved], min: achieved, max: achieved, mbps: [0.0; 2], holds_expired: vec![0] }
    }

    #[test]
    fn the_hold_check_says_whether_the_default_held_and_did_no_worse_than_no_stretch() {
        let entries = vec![entry(4, 8, 3.95), entry(4, 1, 3.97), entry(16, 8, 12.18), entry(16, 1, 13.46)];
        let c = HoldCheck::new(entries, [8, 1], 20.0);
        let v: Vec<(u32, bool, bool)> = c.verdicts.iter().map(|v| (v.target, v.default_close, v.default_no_worse)).collect();
        assert_eq!(v, vec![(4, true, true), (16, false, false)]);
        assert!((c.verdicts[1].default_error - (1.0 - 12.18 / 16.0)).abs() < 1e-9);
        let held = HoldCheck::new(vec![entry(16, 8, 15.5), entry(16, 1, 10.8)], [8, 1], 10.0);
        assert!(held.verdicts[0].default_close && held.verdicts[0].default_no_worse);
    }

    #[test]
    fn the_default_plan_runs_the_papers_clients_and_every_region_holds_four_requests() {
        assert_eq!(GlobalPlan::new(false, 8, None).clients, GlobalPlan::PAPER_CLIENTS);
        assert_eq!(GlobalPlan::new(true, 8, None).clients, GlobalPlan::QUICK_CLIENTS);
        assert_eq!(GlobalPlan::new(true, 8, Some(32)).clients, 32, "--clients wins");
        for quick in [true, false] {
            let p = GlobalPlan::new(quick, 8, Some(GlobalPlan::PAPER_CLIENTS));
            assert_eq!(p.backlog_clients * p.backlog, GlobalPlan::PAPER_CLIENTS, "as many in flight as the IOR cases");
            // As procs::run_clients sizes them: the wide application and the narrow one (half the servers).
            let total = 2 * p.clients as u64;
            for servers in [8u64, 4] {
                let width = servers * p.chunk;
                let region = p.servers.size * servers / total / width * width;
                assert!(region >= p.request * 4 + width, "{servers} servers: region {region}");
            }
        }
    }
}
