//! The options of a `burstable:` export and the [`BurstableParams`] the
//! daemon runs them with. Parsed here, not in the binary, so that the
//! simulator (`surge plan workload`) runs exactly the export spec it prints,
//! with the daemon's defaults for everything the spec leaves out.

use super::BurstableParams;
use std::path::Path;
use std::time::Duration;
use surge_block::mirror::MirrorConfig;
use surge_block::model::{Shape, VolumeModel};
use surge_cloud::spec::{parse_duration, parse_rate, parse_size};
use surge_cloud::{Delays, VolumeSpec};
use surge_policy::burstable::{BurstableConfig, Mode, Strategy};

/// The spec's items: the leading mode, then `key=value` pairs and bare flags
/// (keys lowercased, each at most once); what is not taken is refused by name.
struct Items {
    positional: Option<String>,
    pairs: Vec<(String, Option<String>)>,
}

impl Items {
    fn parse(args: &str) -> Result<Items, String> {
        let (mut positional, mut pairs) = (None, Vec::<(String, Option<String>)>::new());
        for (i, item) in args.split(',').map(str::trim).enumerate() {
            if item.is_empty() {
                if args.is_empty() {
                    break;
                }
                return Err(format!("empty item in {args:?} (stray comma?)"));
            }
            let pair = match item.split_once('=') {
                Some((k, _)) if k.is_empty() => return Err(format!("option {item:?} has no key")),
                Some((k, v)) => (k.to_ascii_lowercase(), Some(v.to_string())),
                None if i == 0 => {
                    positional = Some(item.to_string());
                    continue;
                }
                None => (item.to_ascii_lowercase(), None),
            };
            if pairs.iter().any(|(k, _)| *k == pair.0) {
                return Err(format!("option {:?} given twice", pair.0));
            }
            pairs.push(pair);
        }
        Ok(Items { positional, pairs })
    }

    fn take(&mut self, key: &str) -> Result<Option<String>, String> {
        match self.pairs.iter().position(|(k, _)| k == key) {
            None => Ok(None),
            Some(i) => self.pairs.remove(i).1.map(Some).ok_or_else(|| format!("{key} needs a value: {key}=...")),
        }
    }

    fn size(&mut self, key: &str) -> Result<Option<u64>, String> {
        self.take(key)?.map(|v| parse_size(&v).map_err(|e| format!("{key}={v}: {e}"))).transpose()
    }

    fn duration(&mut self, key: &str, default: Duration) -> Result<Duration, String> {
        Ok(self.take(key)?.map(|v| parse_duration(&v).map_err(|e| format!("{key}={v}: {e}"))).transpose()?.unwrap_or(default))
    }

    fn count(&mut self, key: &str, default: usize) -> Result<usize, String> {
        Ok(self.take(key)?.map(|v| v.parse().map_err(|_| format!("{key}={v}: expected a count"))).transpose()?.unwrap_or(default))
    }

    /// A bare flag (`keep`) or `flag=true|false|on|off|1|0`.
    fn flag(&mut self, key: &str) -> Result<bool, String> {
        let Some(i) = self.pairs.iter().position(|(k, _)| k == key) else { return Ok(false) };
        match self.pairs.remove(i).1.as_deref() {
            None | Some("true" | "on" | "yes" | "1") => Ok(true),
            Some("false" | "off" | "no" | "0") => Ok(false),
            Some(v) => Err(format!("{key}={v}: expected true or false")),
        }
    }

    fn finish(self, allowed: &[&str]) -> Result<(), String> {
        match self.pairs.first() {
            Some((k, _)) => Err(format!("unknown option {k:?} (allowed: {})", allowed.join(", "))),
            None => Ok(()),
        }
    }
}

/// Parse `burstable:ARGS` for export `name`, its state under
/// `DATA_DIR/burstable/NAME` (see the module docs of [`super`] for the options).
pub fn parse_params(name: &str, args: &str, data_dir: &Path) -> Result<BurstableParams, String> {
    let mut o = Items::parse(args)?;
    let mode: Mode = o.positional.take().ok_or("missing MODE: write burstable:MODE[,options]")?.parse()?;
    let size = o.size("size")?.ok_or("size=SIZE is required (the striped capacity, e.g. size=100GiB)")?;
    let members = o.count("members", 10)?;
    if members == 0 {
        return Err("members must be at least 1".into());
    }
    let kind = o.take("type")?.unwrap_or_else(|| "gp2".into());
    let gib = (size.div_ceil(members as u64)).div_ceil(1 << 30).max(1);
    let member: VolumeSpec = format!("{kind}:{gib}GiB").parse().map_err(|e| format!("member volumes: {e}"))?;
    if !matches!(member.model, VolumeModel::Gp2 | VolumeModel::AzurePremium) {
        tracing::warn!("burstable members of type {kind} carry no operation credits: the policy will never swap them");
    }
    let chunk = o.size("chunk")?;
    let tick = o.duration("tick", Duration::from_secs(5))?;
    let swap_setup = o.duration("attach_delay", Duration::from_secs(3))?;
    let min_interval = o.duration("min_interval", Duration::from_secs(60))?;
    let ephemeral_idle = o.duration("idle", Duration::from_secs(5))?;
    let cloudwatch_every = o.duration("cloudwatch_every", Duration::from_secs(60))?;
    let strategy: Strategy = o.take("strategy")?.map(|v| v.parse()).transpose()?.unwrap_or(Strategy::AllAtOnce);
    let swap_below = match o.take("swap_below")?.as_deref() {
        None | Some("auto") => None,
        Some(v) => {
            let pct: f64 = v.trim_end_matches('%').parse().map_err(|_| format!("swap_below={v}: expected auto or a percentage like 20%"))?;
            if !(0.0..=100.0).contains(&pct) {
                return Err(format!("swap_below={v}: a percentage between 0 and 100"));
            }
            Some(pct / 100.0)
        }
    };
    let margin: f64 = o.take("margin")?.map(|v| v.parse().map_err(|_| format!("margin={v}: expected a number like 1.5"))).transpose()?.unwrap_or(1.5);
    let rebuild_rate = match o.take("rebuild_rate")?.as_deref() {
        Some("off") => None,
        Some(v) => Some(parse_rate(v).map_err(|e| format!("rebuild_rate={v}: {e}"))?),
        None => Some(64 << 20),
    };
    let region = o.size("region")?.unwrap_or(1 << 20);
    let attach_limit = o.count("attach_limit", 27)?;
    let backing: Option<VolumeSpec> = o.take("backing")?.map(|v| v.parse().map_err(|e| format!("backing={v}: {e}"))).transpose()?;
    let cache_block = o.size("block")?.unwrap_or(32 << 10);
    // A cache stripes at its block size: a block never straddles two members,
    // and consecutive blocks (a request's) rotate over all of them.
    let chunk = chunk.unwrap_or(if mode == Mode::Cache { cache_block } else { 64 << 10 });
    let keep = o.flag("keep")?;
    o.finish(&[
        "size", "members", "type", "chunk", "tick", "attach_delay", "min_interval", "idle", "strategy", "swap_below", "margin", "rebuild_rate", "region", "attach_limit",
        "backing", "block", "keep", "cloudwatch_every",
    ])?;
    if mode == Mode::Cache && backing.is_none() {
        return Err("cache mode needs backing=TYPE:SIZE (e.g. backing=st1:2TiB)".into());
    }
    if mode != Mode::Cache && backing.is_some() {
        return Err("backing= is for cache mode only".into());
    }
    if keep && mode != Mode::Ephemeral {
        return Err("keep is for ephemeral mode only".into());
    }
    if strategy == Strategy::OneAtATime && mode != Mode::Persistent {
        return Err("strategy=one is for persistent mode: a cache or scratch stripe is replaced as a whole (see docs/burstable.md)".into());
    }
    if !chunk.is_power_of_two() || chunk < 4096 || !region.is_power_of_two() || region < 4096 || !cache_block.is_power_of_two() || cache_block < 4096 {
        return Err("chunk, region and block must be powers of two of at least 4KiB".into());
    }
    let policy = BurstableConfig {
        mode,
        strategy,
        member_size: member.size,
        swap_below,
        margin,
        auto_floor: 0.05,
        rebuild_rate: rebuild_rate.unwrap_or(member.shape().ok().and_then(|s| s.bps).unwrap_or(128 << 20)),
        op_size: surge_block::model::SSD_OP,
        swap_setup,
        attach_limit,
        min_interval,
        ephemeral_idle,
        tick,
    };
    Ok(BurstableParams {
        name: name.to_string(),
        mode,
        size,
        members,
        member,
        chunk,
        policy,
        mirror: MirrorConfig { region, ..MirrorConfig::default() },
        rebuild_rate,
        backing,
        cache_block,
        keep,
        tick,
        state_dir: data_dir.join("burstable").join(name),
        parallel: true,
        progress_bars: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        cloudwatch_every,
        epoch_unix_ns: None,
    })
}

/// The daemon's local cloud for a burstable export (no `--provider`): an
/// attach takes the spec's `attach_delay` (what the policy plans a swap's
/// setup with), a detach nothing.
pub fn local_delays(p: &BurstableParams) -> Delays {
    Delays { attach: p.policy.swap_setup, detach: Duration::ZERO, ..Delays::default() }
}

/// What a persistent stripe serves while its controller swaps members before
/// their credits run out: every member's burst rate together, with no credit
/// bucket of its own (an elastic cache's policy measures such a backing
/// against this). `None`: a member type without a shape.
pub fn stripe_shape(p: &BurstableParams) -> Option<Shape> {
    let m = p.member.shape().ok()?;
    let n = p.members as u64;
    Some(Shape { iops: m.iops.map(|i| i * n), bps: m.bps.map(|b| b * n), op_credits: None, byte_credits: None, ..m })
}
