//! `NAME=TYPE:SIZE[,key=value...]`: a volume of the local emulated cloud
//! (gp2, gp3, io1, ...) served through its performance model, with its
//! credits, cost and live modification on the control API.

use crate::control::Controllable;
use crate::stack::{BuildContext, Built, SpecError};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use surge_block::model::ModelDev;
use surge_cloud::{Delays, LocalConfig, LocalProvider, Provider, VolumeSpec};

/// The local cloud of a surge data directory.
pub fn cloud_dir(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("cloud")
}

/// How the local emulated cloud behaves (`surge serve --local-scale`,
/// `--local-modify-rules`). Full scale and no modification rules by default.
///
/// At reduced scale (experiments) every volume serves its type's rates x
/// `rate`, holds `rate x time` of its size, and bills each second as
/// 1/`time` seconds; the daemon's durations (attach delay, utilization
/// window, inactivity delay, EBS's modification rules) run x `time` and its
/// cache sizes x `rate x time`. Timing between requests (the cache's idle
/// gap, the flusher's poll) is not scaled: request sizes are not. Specs, limits and prices, and
/// every value written in a spec, stay full-scale: the daemon at scale f
/// behaves as the full-scale daemon with time running 1/f times faster.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LocalCloud {
    pub scale: surge_block::model::Scale,
    /// EBS's volume-modification rules, full-scale.
    pub modify_rules: surge_cloud::ModifyRules,
    /// The instance's EBS limits (`--local-instance TYPE`): every volume of the
    /// daemon's local cloud together is held to them, and `cache=auto` never
    /// buys more than they let through.
    pub instance: Option<surge_cloud::cost::InstanceEbs>,
}

impl LocalCloud {
    /// The provider config for `data_dir`, with `delays` (full-scale) scaled.
    pub fn config(&self, data_dir: &std::path::Path, delays: Delays) -> LocalConfig {
        let t = self.scale.time;
        LocalConfig {
            delays: Delays { create: delays.create.mul_f64(t), attach: delays.attach.mul_f64(t), detach: delays.detach.mul_f64(t), delete: delays.delete.mul_f64(t) },
            scale: self.scale,
            modify_rules: self.modify_rules.scaled(t),
            instance: self.instance,
            ..LocalConfig::new(cloud_dir(data_dir))
        }
    }

    /// A full-scale duration at this scale.
    pub fn duration(&self, d: std::time::Duration) -> std::time::Duration {
        d.mul_f64(self.scale.time)
    }

    /// Parse `time=F[,rate=R]` (`rate` 1 when left out).
    pub fn parse_scale(s: &str) -> Result<surge_block::model::Scale, String> {
        let mut sc = surge_block::model::Scale::FULL;
        for item in s.split(',').filter(|x| !x.trim().is_empty()) {
            let (k, v) = item.split_once('=').ok_or_else(|| format!("{item:?}: expected time=F or rate=R"))?;
            let f: f64 = v.trim().parse().map_err(|_| format!("{item:?}: {v:?} is not a number"))?;
            if !(f > 0.0 && f <= 1.0) {
                return Err(format!("{item:?}: a scale factor is in (0, 1]"));
            }
            match k.trim() {
                "time" => sc.time = f,
                "rate" => sc.rate = f,
                other => return Err(format!("unknown scale {other:?} (time=F, rate=R)")),
            }
        }
        Ok(sc)
    }

    /// The EBS limits of instance type `name` from the price table.
    pub fn parse_instance(name: &str) -> Result<surge_cloud::cost::InstanceEbs, String> {
        surge_cloud::PriceTable::default().instance_ebs(name.trim()).map_err(|e| e.to_string())
    }

    /// `none`, `ebs-6h` (one modification per 6 hours) or `ebs-24h` (four per
    /// rolling 24 hours, each after the previous one completed).
    pub fn parse_rules(s: &str) -> Result<surge_cloud::ModifyRules, String> {
        surge_cloud::ModifyRules::parse(s)
    }
}

/// `surge status` entry of a served cloud volume: its credits and spec; `surge
/// set NAME/volume spec=TYPE:SIZE,...` modifies the volume (same size; the type
/// may change, as EBS allows), live and in the provider's state.
struct VolumeControl {
    export: String,
    id: String,
    provider: Arc<LocalProvider>,
    model: Arc<ModelDev>,
}

impl Controllable for VolumeControl {
    fn name(&self) -> String {
        format!("{}/volume", self.export)
    }
    fn kind(&self) -> String {
        "volume".into()
    }
    fn status(&self) -> serde_json::Value {
        let c = self.model.credits();
        let spec = self.provider.describe(&self.id).map(|v| v.spec).unwrap_or_else(|e| e.to_string());
        // Cost so far of this volume (all its billing segments).
        let (usd, agbs) = self.provider.cost().map_or((None, None), |r| {
            let mine = r.volumes.iter().filter(|v| v.id == self.id);
            (Some(mine.clone().map(|v| v.usd).sum::<f64>()), mine.map(|v| v.agbs).sum::<Option<f64>>())
        });
        json!({ "id": self.id, "spec": spec, "credits": c, "burst_balance_percent": c.percent(), "usd_so_far": usd, "agbs_so_far": agbs })
    }
    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        if key != "spec" {
            return Err(format!("{} has no setting {key:?} (try spec=TYPE:SIZE,...)", self.name()));
        }
        let new: VolumeSpec = value.parse().map_err(|e| format!("{e}"))?;
        let cur = self.provider.describe(&self.id).map_err(|e| e.to_string())?;
        if new.size != cur.size {
            return Err(format!("only the parameters can change while served, not the size (now {})", cur.spec));
        }
        // EBS changes the type in place (gp3 to io2 and back); the export's
        // spec then names the old type, so a restarted daemon needs the new one.
        if new.kind() != cur.kind {
            tracing::warn!(export = %self.export, from = %cur.kind, to = %new.kind(), "volume type changed in place: restart the daemon with the new spec");
        }
        self.provider.modify(&self.id, new).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// `NAME=TYPE:SIZE[,key=value...]` for `surge serve`: the local-cloud volume
/// named NAME in `<data-dir>/cloud`, created if missing, attached at once (the
/// daemon starts with its volumes attached; the attach delay models hot-plug).
pub fn build_volume(name: &str, kind: &str, args: &str, ctx: &BuildContext) -> Result<Built, SpecError> {
    let err = |msg: String| SpecError::Args { kind: kind.to_string(), msg };
    let spec: VolumeSpec = format!("{kind}:{args}").parse().map_err(|e| err(format!("{e}")))?;
    for w in spec.warnings() {
        tracing::warn!("{w}");
    }
    if let Some(cloud) = &ctx.cloud {
        return super::remote::build_remote_volume(name, &spec, cloud.clone()).map_err(|e| err(format!("{e:#}")));
    }
    let cfg = ctx.local.config(&ctx.data_dir, Delays::none());
    let p = Arc::new(LocalProvider::open(cfg, ctx.clock.clone()).map_err(|e| err(e.to_string()))?);
    let dev = p.open_export(name, &spec).map_err(|e| err(e.to_string()))?;
    let id = p.list().map_err(|e| err(e.to_string()))?.into_iter().find(|v| v.name.as_deref() == Some(name)).map(|v| v.id).unwrap_or_default();
    let model = p.model(&id).ok_or_else(|| err(format!("volume {id} is not attached")))?;
    let detail = json!({ "volume": id, "spec": spec.to_string(), "cloud_dir": cloud_dir(&ctx.data_dir) });
    let control = Arc::new(VolumeControl { export: name.to_string(), id: id.clone(), provider: p, model });
    Ok(Built { dev, description: format!("{spec} (local cloud volume {id})"), detail, controls: vec![control] })
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::{SystemClock, VirtualClock};

    fn ctx(dir: &std::path::Path) -> BuildContext {
        BuildContext::new(dir.to_path_buf(), Arc::new(VirtualClock::new()))
    }

    #[test]
    fn an_export_spec_makes_a_named_volume_and_finds_it_again() {
        let d = tempfile::tempdir().unwrap();
        let b = build_volume("d", "gp2", "8GiB", &ctx(d.path())).unwrap();
        assert_eq!(b.dev.size(), 8 << 30);
        b.dev.write_at(b"kept", 0, true).unwrap();
        let st = b.controls[0].status();
        assert_eq!(st["credits"]["ops"], 5_400_000 - 1);
        // 60 s minimum of 8 GiB at $0.10/GB-month.
        assert!((st["usd_so_far"].as_f64().unwrap() - 0.8 * 60.0 / 2_592_000.0).abs() < 1e-12, "{st}");
        drop(b);
        // A restarted daemon finds the same volume and its data.
        let b = build_volume("d", "gp2", "8GiB", &ctx(d.path())).unwrap();
        let mut buf = [0u8; 4];
        b.dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"kept");
        let p = LocalProvider::open(LocalConfig::new(cloud_dir(d.path())), Arc::new(SystemClock::new())).unwrap();
        assert_eq!(p.list().unwrap().len(), 1);
    }

    #[test]
    fn an_existing_name_takes_the_new_spec_unless_type_or_shrink_differs() {
        let d = tempfile::tempdir().unwrap();
        drop(build_volume("d", "gp2", "8GiB", &ctx(d.path())).unwrap());
        let e = build_volume("d", "gp2", "7GiB", &ctx(d.path())).err().unwrap().to_string();
        assert!(e.contains("exists as gp2:8GiB, not gp2:7GiB"), "{e}");
        let e = build_volume("d", "gp3", "8GiB", &ctx(d.path())).err().unwrap().to_string();
        assert!(e.contains("exists as gp2:8GiB, not gp3:8GiB"), "{e}");
        // Same type, larger: the volume is grown to the spec given.
        assert_eq!(build_volume("d", "gp2", "9GiB", &ctx(d.path())).unwrap().dev.size(), 9 << 30);
        let e = build_volume("x", "io1", "100GiB", &ctx(d.path())).err().unwrap().to_string();
        assert!(e.contains("provisioned IOPS are required"), "{e}");
    }

    #[test]
    fn parameters_change_live_through_the_control_api() {
        let d = tempfile::tempdir().unwrap();
        let b = build_volume("g", "gp3", "8GiB", &ctx(d.path())).unwrap();
        let c = &b.controls[0];
        c.set("spec", "gp3:8GiB,iops=6000").unwrap();
        assert_eq!(c.status()["spec"], "gp3:8GiB,iops=6000");
        assert!(c.set("spec", "gp3:9GiB").unwrap_err().contains("not the size"));
        assert!(c.set("iops", "1").is_err());
        drop(b);
        let b = build_volume("g", "gp3", "8GiB,iops=6000", &ctx(d.path())).unwrap();
        assert_eq!(b.controls[0].status()["spec"], "gp3:8GiB,iops=6000", "the change was saved");
        // The type changes in place, as EBS's modify-volume does.
        b.controls[0].set("spec", "io2:8GiB,iops=16000").unwrap();
        assert_eq!(b.controls[0].status()["spec"], "io2:8GiB,iops=16000");
    }

    #[test]
    fn a_scaled_local_cloud_serves_scaled_volumes_with_full_scale_specs() {
        let d = tempfile::tempdir().unwrap();
        let mut c = ctx(d.path());
        c.local.scale = surge_block::model::Scale { rate: 0.25, time: 0.5 };
        let b = build_volume("g", "gp3", "8GiB", &c).unwrap();
        assert_eq!(b.dev.size(), 1 << 30, "8 GiB x 0.25 x 0.5");
        assert_eq!(b.controls[0].status()["spec"], "gp3:8GiB");
        assert_eq!(LocalCloud::parse_scale("time=0.05,rate=0.0625").unwrap(), surge_block::model::Scale { rate: 0.0625, time: 0.05 });
        assert!(LocalCloud::parse_scale("time=2").is_err());
        assert!(LocalCloud::parse_scale("speed=0.5").is_err());
        assert_eq!(LocalCloud::parse_rules("ebs-24h").unwrap(), surge_cloud::ModifyRules::ebs_rolling());
        assert!(LocalCloud::parse_rules("weekly").is_err());
    }
}
