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

/// `surge status` entry of a served cloud volume: its credits and spec; `surge
/// set NAME/volume spec=TYPE:SIZE,...` modifies the volume (same type and size),
/// live and in the provider's state.
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
    let mut cfg = LocalConfig::new(cloud_dir(&ctx.data_dir));
    cfg.delays = Delays::none();
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
        assert!(c.set("spec", "gp2:8GiB").unwrap_err().contains("cannot change the type"));
        assert!(c.set("spec", "gp3:9GiB").unwrap_err().contains("not the size"));
        assert!(c.set("iops", "1").is_err());
        drop(b);
        let b = build_volume("g", "gp3", "8GiB,iops=6000", &ctx(d.path())).unwrap();
        assert_eq!(b.controls[0].status()["spec"], "gp3:8GiB,iops=6000", "the change was saved");
    }
}
