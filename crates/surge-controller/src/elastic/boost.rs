//! Price-aware cache volumes (`elastic:...,cache=auto`): the controller's side
//! of `surge_policy::boost`. The elastic policy decides *when* a burst needs a
//! cache; this module decides *which* volume (type, IOPS, throughput, size) or
//! none, from the demand it observes, logs every plan with its price
//! comparison, and once the burst is over modifies the cache to the planner's
//! cheaper drain spec (one modification of a fresh volume, as EBS allows).
//!
//! Demand: request sizes and rates are observed through the volume; the rate a
//! burst *wants* is the configured ceiling (`max_iops`, `max_throughput`) until a
//! boosted burst used less than half of what its cache could serve, then the
//! rate it really reached (plus 25 %). Everything handed to the planner is full-scale:
//! an experiment at reduced scale divides observed rates by the rate scale,
//! durations by the time scale and amounts by both.

use super::ElasticVolume;
use serde::Serialize;
use std::time::Duration;
use surge_block::model::{Scale, Shape, MIB};
use surge_cloud::{PriceTable, VolumeSpec};
use surge_policy::boost::{self, Candidate, Demand, Kind, Plan, PlannerConfig, Worth};
use surge_policy::window::UtilWindow;
use surge_policy::{Decision, ElasticConfig};

/// What `cache=auto` needs to know beyond the elastic policy's settings.
#[derive(Debug, Clone)]
pub struct BoostSettings {
    pub worth: Worth,
    pub kinds: Vec<Kind>,
    /// The most the application may ask for (requests/s, bytes/s, full
    /// scale): the first burst's demand and the ceiling of learned ones.
    pub max_iops: f64,
    pub max_bps: f64,
    /// Modify the cache to the cheapest spec that drains as fast after a burst.
    pub lower_for_drain: bool,
    pub prices: PriceTable,
    /// Emulated to full scale (experiments); `Scale::FULL` in the daemon.
    pub scale: Scale,
    /// The instance's EBS limits (`surge serve --local-instance`): no cache
    /// volume beyond them.
    pub instance: Option<surge_cloud::cost::InstanceEbs>,
}

impl BoostSettings {
    /// Every type; demand up to gp3's ceilings (16,000 IOPS, 1,000 MiB/s).
    pub fn new(worth: Worth) -> Self {
        BoostSettings {
            worth,
            kinds: Kind::ALL.to_vec(),
            max_iops: 16_000.0,
            max_bps: 1_000.0 * MIB as f64,
            lower_for_drain: true,
            prices: PriceTable::default(),
            scale: Scale::FULL,
            instance: None,
        }
    }

    /// Apply one `elastic:` option that belongs to `cache=auto`; `None` if
    /// `key` is not one of them.
    pub fn parse_option(s: &mut BoostSettings, key: &str, v: &str) -> Option<Result<(), String>> {
        let num = |v: &str| v.trim().replace('_', "").parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0).ok_or_else(|| format!("{key}={v}: expected a number"));
        let r = match key {
            "value_per_hour" => num(v).map(|x| s.worth = Worth::PerHour(x)),
            "target" => surge_cloud::spec::parse_duration(v).map(|d| s.worth = Worth::Deadline(d.as_secs_f64())).map_err(|e| format!("target={v}: {e}")),
            "types" => v.split('+').map(|t| t.parse::<Kind>()).collect::<Result<Vec<_>, _>>().map(|k| s.kinds = k),
            "max_iops" => num(v).map(|x| s.max_iops = x),
            "max_throughput" => surge_cloud::spec::parse_rate(v).map(|r| s.max_bps = r as f64).map_err(|e| format!("max_throughput={v}: {e}")),
            "lower" => {
                s.lower_for_drain = matches!(v, "true" | "on" | "yes" | "1");
                Ok(())
            }
            _ => return None,
        };
        Some(r)
    }
}

/// One plan, as logged for `surge status` and reports.
#[derive(Debug, Clone, Serialize)]
pub struct LoggedPlan {
    pub at_s: f64,
    pub chosen: Option<String>,
    pub drain_spec: Option<String>,
    pub reason: String,
    pub plan: Plan,
}

/// What the last burst showed, in full-scale units.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct BurstSeen {
    pub bytes: u64,
    pub requests: u64,
    pub peak_requests_per_s: f64,
    /// Requests per second the cache in place could serve, if there was one.
    pub served_requests_per_s: Option<f64>,
}

#[derive(Debug)]
struct BurstObs {
    bytes0: u64,
    ops0: u64,
    peak_rps: f64,
    served_rps: Option<f64>,
    last_above: Duration,
}

/// The controller's boost state (lives under the elastic volume's lock order:
/// taken alone, never while holding the policy).
pub(super) struct Booster {
    s: BoostSettings,
    planner: PlannerConfig,
    /// The backing's full-scale shape (a stripe's: its members' bursts together).
    backing: Shape,
    ut: f64,
    backing_bw: f64,
    backing_iops: Option<f64>,
    window: UtilWindow,
    burst: Option<BurstObs>,
    last: Option<BurstSeen>,
    /// Mean request size seen over the latest full window with I/O.
    request: Option<u64>,
    /// Cumulative application bytes at the latest observation.
    last_bytes: u64,
    current: Option<Candidate>,
    /// This burst was declined already (log it once).
    declined: bool,
    plans: Vec<LoggedPlan>,
}

impl Booster {
    pub(super) fn new(s: BoostSettings, pol: &ElasticConfig, block: u64, backing: Shape) -> Self {
        let f = s.scale.time;
        let full = |d: Duration| d.div_f64(f);
        let planner = PlannerConfig {
            kinds: s.kinds.clone(),
            worth: s.worth,
            block,
            attach_delay: full(pol.attach_delay),
            detach_delay: full(pol.attach_delay),
            detect_delay: full(pol.window),
            lead: full(pol.attach_delay + 2 * pol.window),
            settle: full(pol.inactivity_delay + pol.window),
            lower_for_drain: s.lower_for_drain,
            instance: s.instance.map(|i| i.sustained()),
        };
        Booster {
            planner,
            backing,
            ut: pol.ut,
            backing_bw: pol.backing_bw,
            backing_iops: pol.backing_iops,
            window: UtilWindow::new(pol.window),
            burst: None,
            last: None,
            request: None,
            last_bytes: 0,
            current: None,
            declined: false,
            plans: Vec::new(),
            s,
        }
    }

    fn full_amount(&self, a: u64) -> u64 {
        (a as f64 / (self.s.scale.rate * self.s.scale.time)).round() as u64
    }

    /// Feed the application's cumulative bytes and requests.
    pub(super) fn observe(&mut self, now: Duration, bytes: u64, ops: u64) {
        self.last_bytes = bytes;
        let (b0, o0) = (self.window.first_bytes(), self.window.first_ops());
        let Some(r) = self.window.push(now, bytes, ops) else { return };
        // Mean request size: over the burst so far, else the last window with I/O.
        let (b0, o0) = self.burst.as_ref().map_or((b0, o0), |b| (b.bytes0, b.ops0));
        if ops > o0 {
            self.request = Some(((bytes - b0) / (ops - o0)).max(1));
        }
        let above = r.utilization(self.backing_bw, self.backing_iops) > self.ut;
        let served = self.current.as_ref().map(|c| boost::served_rate(&c.spec, self.request.unwrap_or(MIB), self.planner.block));
        if above {
            let start = (self.window.first_bytes(), self.window.first_ops());
            let b = self.burst.get_or_insert(BurstObs { bytes0: start.0, ops0: start.1, peak_rps: 0.0, served_rps: None, last_above: now });
            b.peak_rps = b.peak_rps.max(r.ops_per_s / self.s.scale.rate);
            b.served_rps = served.or(b.served_rps);
            b.last_above = now;
        } else if self.burst.as_ref().is_some_and(|b| now.saturating_sub(b.last_above) >= self.window.span()) {
            let b = self.burst.take().expect("checked");
            self.last = Some(BurstSeen {
                bytes: self.full_amount(bytes.saturating_sub(b.bytes0)),
                requests: self.full_amount(ops.saturating_sub(b.ops0)),
                peak_requests_per_s: b.peak_rps,
                served_requests_per_s: b.served_rps,
            });
            self.declined = false;
        }
    }

    /// Full-scale bytes the burst running now has moved: it is expected to
    /// last at least as long again (the median guess when only its start is known).
    fn so_far(&self) -> u64 {
        self.burst.as_ref().map_or(0, |b| self.full_amount(self.last_bytes.saturating_sub(b.bytes0)))
    }

    /// Requests per second the next burst is expected to want (full scale).
    fn wanted_rate(&self, request: u64) -> f64 {
        let ceiling = self.s.max_iops.min(self.s.max_bps / request as f64);
        match self.last {
            // A boost the application used less than half of shows its real
            // demand (a busy CPU or a short window can hide up to half of it).
            Some(BurstSeen { peak_requests_per_s: p, served_requests_per_s: Some(cap), .. }) if p > 0.0 && p < 0.5 * cap => (p * 1.25).min(ceiling),
            _ => ceiling,
        }
    }

    /// Plan the cache for a burst the policy wants `size` (emulated bytes) for.
    /// `Ok(spec)`: provision it; `Err(Some(note))`: declined, log `note`;
    /// `Err(None)`: declined again in the same burst (already logged).
    pub(super) fn plan(&mut self, now: Duration, size: u64, pre_provisioned: bool) -> Result<(VolumeSpec, String), Option<String>> {
        if self.declined {
            return Err(None);
        }
        // The last whole burst knows the request sizes best; the first burst
        // only has what it has done so far.
        let last_mean = self.last.filter(|l| l.requests > 0).map(|l| l.bytes / l.requests);
        let request = last_mean.or(self.request).unwrap_or(self.planner.block).max(1);
        let rate = self.wanted_rate(request);
        let footprint = self.full_amount(size);
        let d = Demand {
            iops: rate,
            bps: rate * request as f64,
            request,
            burst_bytes: self.last.map_or(footprint, |l| l.bytes.max(1)).max(2 * self.so_far()),
            footprint,
            pre_provisioned,
        };
        let p = boost::plan_on(&self.planner, &self.s.prices, &self.backing, &d);
        let reason = p.reason.clone();
        let chosen = p.choice.clone();
        self.plans.push(LoggedPlan {
            at_s: now.as_secs_f64(),
            chosen: chosen.as_ref().map(|c| c.spec.to_string()),
            drain_spec: chosen.as_ref().and_then(|c| c.drain_spec.as_ref()).map(|s| s.to_string()),
            reason: reason.clone(),
            plan: p,
        });
        match chosen {
            Some(c) => {
                let spec = c.spec.clone();
                self.current = Some(c);
                Ok((spec, reason))
            }
            None => {
                self.declined = true;
                Err(Some(reason))
            }
        }
    }

    /// The burst is over: the spec to modify the cache to, if cheaper.
    pub(super) fn drain_spec(&mut self) -> Option<VolumeSpec> {
        self.current.as_mut().and_then(|c| c.drain_spec.take())
    }

    /// The cache volume is gone (deleted, failed or never attached).
    pub(super) fn released(&mut self) {
        self.current = None;
    }

    #[cfg(test)]
    pub(super) fn plans(&self) -> &[LoggedPlan] {
        &self.plans
    }

    pub(super) fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "worth": self.s.worth,
            "types": self.s.kinds,
            "max_iops": self.s.max_iops,
            "max_throughput_mib_s": self.s.max_bps / MIB as f64,
            "cache_spec": self.current.as_ref().map(|c| c.spec.to_string()),
            "last_burst": self.last,
            "plans": self.plans.iter().rev().take(4).collect::<Vec<_>>(),
        })
    }
}

impl ElasticVolume {
    /// Before a decision is applied: with `cache=auto`, a provisioning gets its
    /// volume from the planner, its reason the price comparison; a declined one
    /// goes back to the policy (logged once per burst). `None`: nothing to apply.
    pub(super) fn boost_decision(&self, mut d: Decision) -> Option<Decision> {
        let Some(b) = &self.booster else { return Some(d) };
        let surge_policy::Action::Provision { size } = d.action else { return Some(d) };
        let pre = {
            let pol = self.policy.lock();
            pol.last_utilization() <= pol.config().ut
        };
        let planned = b.lock().plan(self.clock.now(), size, pre);
        match planned {
            Ok((spec, reason)) => {
                d.reason = format!("{}; {reason}", d.reason);
                *self.next_spec.lock() = Some(spec);
                Some(d)
            }
            Err(note) => {
                if let Some(note) = note {
                    d.reason = format!("{}; declined: {note}", d.reason);
                    self.record(&d);
                }
                self.policy.lock().provision_failed(self.clock.now());
                None
            }
        }
    }

    /// The burst is over (phase 2): modify the cache to the cheaper drain spec.
    pub(super) fn boost_drain(&self) {
        let Some(b) = &self.booster else { return };
        let Some(spec) = b.lock().drain_spec() else { return };
        let Some(id) = self.vol.lock().as_ref().map(|v| v.id.clone()) else { return };
        match self.provider.modify(&id, spec.clone()) {
            Ok(_) => self.log.lock().push(super::LoggedDecision {
                at_s: self.clock.now().as_secs_f64(),
                action: surge_policy::Action::StartDrain,
                reason: format!("burst over: cache {id} modified to {spec} for the drain (the planner's cheaper drain spec)"),
            }),
            Err(e) => tracing::warn!(volume = %id, "could not lower the cache for the drain: {e}"),
        }
    }

    pub(super) fn boost_observe(&self, now: Duration, bytes: u64, ops: u64) {
        if let Some(b) = &self.booster {
            b.lock().observe(now, bytes, ops);
        }
    }

    /// The attach time observed on this provider (provider time): the
    /// planner's attach, detach and lead follow it.
    pub(super) fn boost_attach_delay(&self, attach: Duration, window: Duration) {
        if let Some(b) = &self.booster {
            let mut b = b.lock();
            let f = b.s.scale.time;
            b.planner.attach_delay = attach.div_f64(f);
            b.planner.detach_delay = attach.div_f64(f);
            b.planner.lead = (attach + 2 * window).div_f64(f);
        }
    }

    /// The backing's capacity now (its credits may have run out).
    pub(super) fn boost_backing(&self, bytes_per_s: f64, ops_per_s: Option<f64>) {
        if let Some(b) = &self.booster {
            let mut b = b.lock();
            b.backing_bw = bytes_per_s;
            b.backing_iops = ops_per_s;
        }
    }

    pub(super) fn boost_released(&self) {
        if let Some(b) = &self.booster {
            b.lock().released();
        }
    }

    /// Every plan so far (reports).
    #[cfg(test)]
    pub fn boost_plans(&self) -> Vec<LoggedPlan> {
        self.booster.as_ref().map_or_else(Vec::new, |b| b.lock().plans().to_vec())
    }

    pub(super) fn boost_status(&self) -> serde_json::Value {
        self.booster.as_ref().map_or(serde_json::Value::Null, |b| b.lock().status())
    }
}

#[cfg(test)]
mod tests {
    use super::super::ElasticParams;
    use super::*;
    use std::sync::Arc;
    use surge_block::cache::CacheConfig;
    use surge_block::{BlockDev, VirtualClock};
    use surge_cloud::Provider;

    fn settings() -> BoostSettings {
        BoostSettings::new(Worth::PerHour(0.34))
    }

    #[test]
    fn options_parse_into_settings() {
        let mut s = settings();
        for (k, v) in [("value_per_hour", "2.016"), ("types", "gp3+io2"), ("max_iops", "32_000"), ("max_throughput", "500MiB/s"), ("lower", "false")] {
            BoostSettings::parse_option(&mut s, k, v).unwrap().unwrap();
        }
        assert_eq!(s.worth, Worth::PerHour(2.016));
        assert_eq!(s.kinds, vec![Kind::Gp3, Kind::Io2]);
        assert_eq!((s.max_iops, s.max_bps, s.lower_for_drain), (32_000.0, 500.0 * MIB as f64, false));
        BoostSettings::parse_option(&mut s, "target", "90s").unwrap().unwrap();
        assert!(BoostSettings::parse_option(&mut s, "max_throughput", "fast").unwrap().unwrap_err().contains("max_throughput"));
        assert_eq!(s.worth, Worth::Deadline(90.0));
        assert!(BoostSettings::parse_option(&mut s, "types", "gp9").unwrap().unwrap_err().contains("gp9"));
        assert!(BoostSettings::parse_option(&mut s, "value_per_hour", "-1").unwrap().is_err());
        assert!(BoostSettings::parse_option(&mut s, "window", "1s").is_none());
    }

    fn booster(scale: Scale) -> Booster {
        // The policy works in emulated units (rates x rate, durations x time);
        // the planner in full-scale ones.
        let f = scale.time;
        let d = ElasticConfig::default();
        let pol = ElasticConfig {
            backing_bw: 125.0 * MIB as f64 * scale.rate,
            backing_iops: Some(3_000.0 * scale.rate),
            window: d.window.mul_f64(f),
            inactivity_delay: d.inactivity_delay.mul_f64(f),
            attach_delay: d.attach_delay.mul_f64(f),
            ..d
        };
        Booster::new(BoostSettings { scale, ..settings() }, &pol, 64 << 10, "gp3:100GiB".parse::<VolumeSpec>().unwrap().shape().unwrap())
    }

    #[test]
    fn a_burst_is_observed_and_planned_at_full_scale() {
        // At rate 1/8 and time 1/4 the gp3 backing serves 15.625 MiB/s: one
        // 1 MiB write every 64 ms saturates it.
        let scale = Scale { rate: 0.125, time: 0.25 };
        let mut b = booster(scale);
        let (mut t, mut bytes, mut ops) = (Duration::ZERO, 0u64, 0u64);
        for _ in 0..400 {
            t += Duration::from_millis(64);
            bytes += MIB;
            ops += 1;
            b.observe(t, bytes, ops);
        }
        assert!(b.burst.is_some(), "saturating the backing is a burst");
        assert_eq!(b.request, Some(MIB));
        // The policy asks for 16 GiB at full scale (x 1/32 emulated).
        let (spec, reason) = b.plan(t, (16u64 << 30) / 32, true).unwrap();
        assert_eq!(spec.to_string(), "gp3:32GiB,iops=16000,throughput=1000MiB/s", "{reason}");
        assert!(reason.contains("saves"), "{reason}");
        // Quiet for two windows: the burst is recorded in full-scale units
        // (399 of the 400 MiB emulated: from the start of the window that saw it).
        for _ in 0..100 {
            t += Duration::from_millis(64);
            b.observe(t, bytes, ops);
        }
        let last = b.last.unwrap();
        assert!(last.bytes >= 12_700 * MIB && last.bytes <= 12_800 * MIB, "{last:?}");
        assert!((last.peak_requests_per_s - 125.0).abs() < 1.0, "{last:?}");
        assert_eq!(last.served_requests_per_s, Some(1_000.0));
        assert_eq!(b.drain_spec().map(|s| s.to_string()), Some("gp3:32GiB".into()));
        assert_eq!(b.drain_spec(), None, "one modification");
    }

    #[test]
    fn a_declined_burst_is_reported_once() {
        let mut b = Booster::new(
            BoostSettings::new(Worth::PerHour(0.0)),
            &ElasticConfig { backing_bw: 125.0 * MIB as f64, ..ElasticConfig::default() },
            64 << 10,
            "gp3:100GiB".parse::<VolumeSpec>().unwrap().shape().unwrap(),
        );
        let note = b.plan(Duration::ZERO, 16 << 30, false).unwrap_err();
        assert!(note.unwrap().starts_with("no boost"));
        assert_eq!(b.plan(Duration::from_secs(1), 16 << 30, false).unwrap_err(), None);
        assert_eq!(b.plans().len(), 1);
    }

    /// An elastic volume with `cache=auto` on virtual time (no delays): a
    /// gp3 backing at 125 MiB/s, 1 s windows, ID 2 s, first cache 8 GiB;
    /// time worth `usd_h`.
    fn auto_volume(dir: &std::path::Path, usd_h: f64) -> (Arc<VirtualClock>, Arc<dyn Provider>, Arc<ElasticVolume>) {
        let clock = Arc::new(VirtualClock::new());
        let mut cfg = surge_cloud::LocalConfig::new(dir);
        cfg.delays = surge_cloud::Delays::none();
        let prov: Arc<dyn Provider> = Arc::new(surge_cloud::LocalProvider::open(cfg, clock.clone()).unwrap());
        let mib = 1u64 << 20;
        let p = ElasticParams {
            name: "v".into(),
            backing: "gp3:16GiB".parse().unwrap(),
            cache_bw: 0,
            policy: ElasticConfig {
                window: Duration::from_secs(1),
                inactivity_delay: Duration::from_secs(2),
                backing_bw: 125.0 * mib as f64,
                backing_iops: Some(3_000.0),
                initial_cache: 8192 * mib,
                min_cache: 256 * mib,
                granularity: 64 * mib,
                attach_delay: Duration::ZERO,
                ..ElasticConfig::default()
            },
            cache: CacheConfig::default(),
            boost: Some(BoostSettings { kinds: vec![Kind::Gp3, Kind::Io2], max_bps: 250.0 * mib as f64, ..BoostSettings::new(Worth::PerHour(usd_h)) }),
            tick: Duration::from_millis(100),
            flusher_poll: Duration::from_millis(1),
            fences: Some(dir.join("v.fences.json")),
            faults: Default::default(),
            scale: Default::default(),
            background_provision: false,
            credit_horizon: super::super::CREDIT_HORIZON,
            stripe: None,
        };
        let v = ElasticVolume::open(p, prov.clone(), clock.clone()).unwrap();
        (clock, prov, v)
    }

    /// 4 MiB writes back to back over 512 MiB (the backing model moves
    /// virtual time), a controller step after each.
    fn burst(v: &Arc<ElasticVolume>, writes: u64) {
        for i in 0..writes {
            v.write_at(&vec![i as u8 + 1; 4 << 20], (i % 128) * (4 << 20), false).unwrap();
            v.step().unwrap();
        }
    }

    #[test]
    fn cache_auto_provisions_the_planned_volume_and_lowers_it_for_the_drain() {
        let d = tempfile::tempdir().unwrap();
        let (clock, prov, v) = auto_volume(d.path(), 100.0);
        v.step().unwrap();
        burst(&v, 128);
        assert!(v.cache().is_attached(), "{:?}", v.decisions());
        // 250 MiB/s in 64 KiB cache I/Os: 4,000 IOPS, 8 GiB at 500 IOPS/GiB.
        let want = "gp3:8GiB,iops=4000,throughput=250MiB/s";
        let vols: Vec<String> = prov.list().unwrap().into_iter().map(|v| v.spec).collect();
        assert!(vols.contains(&want.to_string()), "{vols:?}");
        assert!(v.decisions().iter().any(|d| d.reason.contains(&format!("boost {want}")) && d.reason.contains("also considered")), "{:?}", v.decisions());
        // Idle: drain (8 GiB expected at 125 MiB/s: past the 60 s minimum, so
        // the cache is modified to plain gp3 for it), flush, delete.
        for _ in 0..100 {
            clock.advance(Duration::from_millis(100));
            v.step().unwrap();
            v.cache().flush_step(usize::MAX).unwrap();
        }
        assert!(!v.cache().is_attached(), "{:?}", v.decisions());
        assert!(v.decisions().iter().any(|d| d.reason.contains("modified to gp3:8GiB for the drain")), "{:?}", v.decisions());
        let specs: Vec<String> = prov.cost().unwrap().volumes.iter().map(|c| c.spec.clone()).collect();
        assert_eq!(specs, vec!["gp3:16GiB".to_string(), want.to_string(), "gp3:8GiB".to_string()], "billed at the boost spec, then the drain spec");
        assert_eq!(v.boost_plans().len(), 1);
        assert_eq!(v.boost_status()["plans"][0]["chosen"], want);
    }

    #[test]
    fn cache_auto_declines_a_boost_not_worth_its_price_and_says_so_once() {
        let d = tempfile::tempdir().unwrap();
        let (_clock, prov, v) = auto_volume(d.path(), 0.01);
        v.step().unwrap();
        burst(&v, 64);
        assert!(!v.cache().is_attached());
        assert_eq!(prov.list().unwrap().len(), 1, "only the backing volume exists");
        let declined: Vec<_> = v.decisions().into_iter().filter(|d| d.reason.contains("declined: no boost")).collect();
        assert_eq!(declined.len(), 1, "logged once per burst: {:?}", v.decisions());
        let mut buf = vec![0u8; 4 << 20];
        v.read_at(&mut buf, 4 << 20).unwrap();
        assert!(buf.iter().all(|&b| b == 2 || b == 66), "data went to the backing volume");
    }

    #[test]
    fn a_boost_that_kept_up_with_room_to_spare_teaches_the_demand() {
        let mut b = booster(Scale::FULL);
        b.last = Some(BurstSeen { bytes: 4 << 30, requests: 4096, peak_requests_per_s: 200.0, served_requests_per_s: Some(1_000.0) });
        assert!((b.wanted_rate(MIB) - 250.0).abs() < 1e-9);
        b.last = Some(BurstSeen { bytes: 4 << 30, requests: 4096, peak_requests_per_s: 600.0, served_requests_per_s: Some(1_000.0) });
        assert!((b.wanted_rate(MIB) - 1_000.0).abs() < 1e-9, "60 %: maybe held back, keep the ceiling");
        b.last = Some(BurstSeen { bytes: 4 << 30, requests: 4096, peak_requests_per_s: 990.0, served_requests_per_s: Some(1_000.0) });
        assert!((b.wanted_rate(MIB) - 1_000.0).abs() < 1e-9, "saturated: the ceiling");
    }
}

#[cfg(test)]
mod parse_props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any value for any option: an answer, never a panic; numbers that
        /// parse are stored as given.
        #[test]
        fn options_never_panic(key in prop::sample::select(vec!["value_per_hour", "target", "types", "max_iops", "max_throughput", "lower", "other"]), v in ".{0,24}") {
            let mut s = BoostSettings::new(Worth::PerHour(1.0));
            let _ = BoostSettings::parse_option(&mut s, key, &v);
        }

        #[test]
        fn numbers_round_trip(x in 0.0f64..1e9) {
            let mut s = BoostSettings::new(Worth::PerHour(1.0));
            BoostSettings::parse_option(&mut s, "max_iops", &x.to_string()).unwrap().unwrap();
            prop_assert_eq!(s.max_iops, x);
            BoostSettings::parse_option(&mut s, "value_per_hour", &x.to_string()).unwrap().unwrap();
            prop_assert_eq!(s.worth, Worth::PerHour(x));
        }
    }
}
