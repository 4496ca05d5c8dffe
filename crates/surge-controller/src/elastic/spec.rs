//! The options of an `elastic:` export and the [`ElasticParams`] the daemon
//! runs them with. Parsed here, not in the binary, so that the simulator
//! (`surge plan workload`) runs exactly the export spec it prints, with the
//! daemon's defaults for everything the spec leaves out.

use super::{fences_path, BoostSettings, ElasticFaults, ElasticParams, CREDIT_HORIZON};
use std::path::Path;
use std::time::Duration;
use surge_block::cache::CacheConfig;
use surge_block::fault::FaultRules;
use surge_block::model::Scale;
use surge_cloud::spec::{parse_duration, parse_rate, parse_size};
use surge_cloud::{Delays, VolumeSpec};
use surge_policy::ElasticConfig;

/// An `elastic:` spec's settings, full-scale, as written (defaults for the rest).
#[derive(Debug, Clone)]
pub struct ElasticSpec {
    pub backing: VolumeSpec,
    /// `cache=auto`: the planner chooses each cache volume.
    pub auto: bool,
    /// Reserved bandwidth of `cache=reserved` volumes (0 with `cache=auto`).
    pub cache_bw: u64,
    /// The policy, its backing rates taken from the backing's spec.
    pub policy: ElasticConfig,
    pub cache: CacheConfig,
    /// `cache=auto`'s settings (`None` otherwise).
    pub boost: Option<BoostSettings>,
    /// `attach_delay=`: the provider's attach and detach delay, and the policy's first estimate.
    pub attach_delay: Option<Duration>,
    pub faults: ElasticFaults,
    /// `backing=burstable:SIZE,members=N`: the backing is a persistent
    /// burstable stripe with the daemon's defaults (`burstable:persistent,size=SIZE,members=N`),
    /// swapped by its own controller; `backing` is then its member's spec.
    pub stripe: Option<crate::burstable::BurstableParams>,
}

/// Where the volumes of an elastic export live.
#[derive(Debug, Clone, Copy)]
pub enum Cloud {
    /// The daemon's real cloud (`--provider aws`): full scale.
    Real,
    /// A local cloud at `scale`, whose attach takes `attach_delay` (provider
    /// time), its volumes behind `instance`'s EBS limits.
    Local { scale: Scale, instance: Option<surge_cloud::cost::InstanceEbs>, attach_delay: Duration },
}

/// A full-scale amount of bytes at `scale`, in whole 4 KiB.
pub fn scaled_bytes(scale: Scale, b: u64) -> u64 {
    if scale.is_full() {
        return b;
    }
    ((b as f64 * scale.rate * scale.time) as u64).div_ceil(4096).max(1) * 4096
}

/// The policy of a full-scale spec on a local cloud at `scale`: durations x
/// time, cache sizes x rate x time, the backing's rates x rate.
pub fn scaled_policy(pol: ElasticConfig, scale: Scale, attach_delay: Duration) -> ElasticConfig {
    let rate = scale.rate;
    ElasticConfig {
        window: pol.window.mul_f64(scale.time),
        inactivity_delay: pol.inactivity_delay.mul_f64(scale.time),
        attach_delay,
        backing_bw: pol.backing_bw * rate,
        backing_iops: pol.backing_iops.map(|i| i * rate),
        initial_cache: scaled_bytes(scale, pol.initial_cache),
        min_cache: scaled_bytes(scale, pol.min_cache),
        max_cache: scaled_bytes(scale, pol.max_cache),
        granularity: scaled_bytes(scale, pol.granularity),
        ..pol
    }
}

impl ElasticSpec {
    /// Parse the options after `elastic:` (see `surge`'s `stack::elastic::build_elastic`).
    pub fn parse(args: &str) -> Result<ElasticSpec, String> {
        let (mut backing, mut cache_kind, mut cache_bw) = (None::<String>, None::<String>, None::<u64>);
        let mut pol = ElasticConfig::default();
        let mut cache = CacheConfig::default();
        let mut attach_delay = None;
        let mut boost = BoostSettings::new(surge_policy::Worth::PerHour(0.0));
        let (mut boost_keys, mut worth_given) = (Vec::new(), false);
        let ratio = |v: &str| v.parse::<f64>().map_err(|_| format!("ut={v}: expected a fraction like 0.3"));
        let mut faults = ElasticFaults::default();
        let mut members = None::<String>;
        for item in args.split(',').filter(|s| !s.is_empty()) {
            if let Some((dev, rule)) = item.split_once('.').filter(|(d, _)| matches!(*d, "backing_fault" | "cache_fault")) {
                // One rule of surge_block::fault, e.g. cache_fault.write.fail_prob=0.01 or backing_fault.volatile.
                let rules = if dev == "backing_fault" { &mut faults.backing } else { &mut faults.cache };
                let (key, value) = match rule.split_once('=') {
                    Some((k, v)) => (k, Some(v)),
                    None => (rule, None),
                };
                rules.get_or_insert_with(FaultRules::default).apply(key, value).map_err(|e| format!("{dev}.{e}"))?;
                continue;
            }
            let (k, v) = item.split_once('=').ok_or_else(|| format!("{item:?} is not key=value"))?;
            let size = || parse_size(v).map_err(|e| format!("{k}={v}: {e}"));
            let dur = || parse_duration(v).map_err(|e| format!("{k}={v}: {e}"));
            if let Some(r) = BoostSettings::parse_option(&mut boost, k, v) {
                r?;
                worth_given |= matches!(k, "value_per_hour" | "target");
                boost_keys.push(k.to_string());
                continue;
            }
            match k {
                "backing" => backing = Some(v.to_string()),
                "members" => members = Some(v.to_string()),
                "bw" | "iops" | "lat" => match &mut backing {
                    Some(b) => b.push_str(&format!(",{k}={v}")),
                    None => return Err(format!("{k}= must follow backing=")),
                },
                "cache" => cache_kind = Some(v.to_string()),
                "cache_bw" => cache_bw = Some(parse_rate(v).map_err(|e| format!("cache_bw={v}: {e}"))?),
                "ut" => pol.ut = ratio(v)?,
                "window" => pol.window = dur()?,
                "id" => pol.inactivity_delay = dur()?,
                "initial" => pol.initial_cache = size()?,
                "min" => pol.min_cache = size()?,
                "max" => pol.max_cache = size()?,
                "granularity" => pol.granularity = size()?,
                "learn" => pol.learn_period = matches!(v, "true" | "on" | "yes" | "1"),
                "attach_delay" => attach_delay = Some(dur()?),
                "block" => cache.block_size = size()?,
                "mode" => cache.mode = v.parse()?,
                "seq_bypass" => cache.seq_bypass = Some(size()?),
                _ => return Err(format!("unknown option {k:?}")),
            }
        }
        let backing = backing.ok_or("backing=TYPE:SIZE is required")?;
        let stripe = match (backing.strip_prefix("burstable:"), members) {
            (Some(size), members) => {
                let args = format!("persistent,size={size}{}", members.map(|m| format!(",members={m}")).unwrap_or_default());
                Some(crate::burstable::parse_params("", &args, Path::new("")).map_err(|e| format!("backing=burstable:{size}: {e}"))?)
            }
            (None, Some(_)) => return Err("members= is for a stripe backing (backing=burstable:SIZE,members=N)".into()),
            (None, None) => None,
        };
        let backing: VolumeSpec = match &stripe {
            Some(bp) => bp.member.clone(),
            None => backing.parse().map_err(|e| format!("backing: {e}"))?,
        };
        let auto = match cache_kind.as_deref().unwrap_or("reserved") {
            "reserved" => false,
            "auto" => true,
            other => return Err(format!("cache={other}: cache volumes are cache=reserved,cache_bw=RATE or cache=auto (chosen by price)")),
        };
        if !auto && !boost_keys.is_empty() {
            return Err(format!("{} only apply with cache=auto", boost_keys.join(", ")));
        }
        if auto && !worth_given {
            return Err("cache=auto needs value_per_hour=USD (what an hour of the application's time costs) or target=DURATION (how long a burst may take)".into());
        }
        let cache_bw = match (auto, cache_bw) {
            (_, Some(bw)) => bw,
            (true, None) => 0,
            (false, None) => return Err("cache_bw=RATE is required (e.g. 128MB/s)".into()),
        };
        if !cache.block_size.is_power_of_two() || cache.block_size < 4096 {
            return Err("block must be a power of two >= 4KiB".into());
        }
        let shape = match &stripe {
            Some(bp) => crate::burstable::stripe_shape(bp).ok_or("backing: the stripe's members have no volume model")?,
            None => backing.shape().map_err(|e| format!("backing: {e}"))?,
        };
        pol.backing_bw = shape.bps.ok_or("the backing volume needs a throughput limit (e.g. bw=RATE) to measure utilization")? as f64;
        pol.backing_iops = shape.iops.map(|i| i as f64);
        Ok(ElasticSpec { backing, auto, cache_bw, policy: pol, cache, boost: auto.then_some(boost), attach_delay, faults, stripe })
    }

    /// The provider's delays (full-scale): its defaults, `attach_delay=` for attach and detach.
    pub fn delays(&self) -> Delays {
        let mut d = Delays::default();
        if let Some(a) = self.attach_delay {
            d.attach = a;
            d.detach = a;
        }
        d
    }

    /// A stripe backing's parameters for export `name`: members `NAME-backing-sI-gG`,
    /// its state under `DATA_DIR/burstable/NAME-backing` (without a data
    /// directory, a run that never restarts: under the system's temporary
    /// directory, per process).
    fn stripe_params(&self, name: &str, data_dir: Option<&Path>) -> Option<crate::burstable::BurstableParams> {
        let mut bp = self.stripe.clone()?;
        bp.name = format!("{name}-backing");
        let root = data_dir.map_or_else(|| std::env::temp_dir().join(format!("surge-{}", std::process::id())), Path::to_path_buf);
        bp.state_dir = root.join("burstable").join(&bp.name);
        bp.progress_bars = false;
        Some(bp)
    }

    /// The controller's parameters as the daemon runs export `name` on
    /// `cloud`; the fence record under `data_dir` (`None`: in memory, for a
    /// run that never restarts).
    pub fn params(&self, name: &str, cloud: Cloud, data_dir: Option<&Path>) -> ElasticParams {
        let mut boost = self.boost.clone();
        let (pol, scale) = match cloud {
            // Full scale; attach times are what the cloud takes (`attach_delay=` is the first estimate only).
            Cloud::Real => (ElasticConfig { attach_delay: self.attach_delay.unwrap_or(Delays::default().attach), ..self.policy.clone() }, Scale::FULL),
            Cloud::Local { scale, instance, attach_delay } => {
                // Every value of the spec is full-scale; a local cloud at reduced scale runs them x its scale.
                // The idle gap is measured between requests, whose service times do not
                // scale (request sizes and, at rate 1, bandwidths are full-scale): not scaled.
                if let Some(b) = &mut boost {
                    b.instance = instance;
                }
                (scaled_policy(self.policy.clone(), scale, attach_delay), scale)
            }
        };
        if let Some(b) = &mut boost {
            b.scale = scale;
        }
        ElasticParams {
            name: name.to_string(),
            backing: self.backing.clone(),
            cache_bw: self.cache_bw,
            tick: pol.window / 10,
            policy: pol,
            cache: self.cache.clone(),
            boost,
            flusher_poll: Duration::from_millis(20),
            fences: data_dir.map(|d| fences_path(d, name)),
            faults: self.faults.clone(),
            scale,
            background_provision: true,
            credit_horizon: CREDIT_HORIZON.mul_f64(scale.time),
            stripe: self.stripe_params(name, data_dir),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burstable_stripe_backing_is_measured_at_its_members_bursts_together() {
        let s = ElasticSpec::parse("backing=burstable:100GiB,members=7,cache=auto,value_per_hour=1").unwrap();
        let bp = s.stripe.as_ref().expect("a stripe backing");
        assert_eq!((bp.members, bp.size, s.backing.to_string().as_str()), (7, 100 << 30, "gp2:15GiB"));
        assert_eq!(s.policy.backing_iops, Some(21_000.0), "seven gp2 bursts of 3,000 IOPS");
        let p = s.params("app", Cloud::Real, Some(Path::new("/d")));
        let bp = p.stripe.unwrap();
        assert_eq!((bp.name.as_str(), bp.state_dir.as_path()), ("app-backing", Path::new("/d/burstable/app-backing")));
        assert!(ElasticSpec::parse("backing=gp3:1GiB,members=2,cache=auto,value_per_hour=1").unwrap_err().contains("stripe backing"));
        assert!(ElasticSpec::parse("backing=burstable:1GiB,members=0,cache=auto,value_per_hour=1").unwrap_err().contains("at least 1"));
        assert!(ElasticSpec::parse("backing=gp3:1GiB,cache=auto,value_per_hour=1").unwrap().stripe.is_none());
    }
}
