//! `NAME=TYPE:SIZE[,...]` on a real cloud (`surge serve --provider aws`): the
//! volume tagged with name NAME, created if missing, attached to this
//! instance and served as the block device that appears; detached (not
//! deleted) when the daemon stops.

use crate::control::Controllable;
use crate::stack::Built;
use anyhow::Context as _;
use serde_json::json;
use std::sync::Arc;
use surge_cloud::{CreateRequest, Provider, VolumeSpec};

/// `surge status` entry of a volume on a real cloud: spec, credits, cost;
/// `surge set NAME/volume spec=...` modifies it (ModifyVolume).
struct RemoteVolumeControl {
    export: String,
    id: String,
    provider: Arc<dyn Provider>,
}

impl Controllable for RemoteVolumeControl {
    fn name(&self) -> String {
        format!("{}/volume", self.export)
    }
    fn kind(&self) -> String {
        "volume".into()
    }
    fn status(&self) -> serde_json::Value {
        match self.provider.describe(&self.id) {
            Ok(v) => {
                let usd = self.provider.cost().ok().map(|r| r.volumes.iter().filter(|c| c.id == self.id).map(|c| c.usd).sum::<f64>());
                json!({ "id": self.id, "spec": v.spec, "credits": v.credits, "burst_balance_percent": v.credits.percent(), "usd_so_far": usd })
            }
            Err(e) => json!({ "id": self.id, "error": e.to_string() }),
        }
    }
    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        if key != "spec" {
            return Err(format!("{} has no setting {key:?} (try spec=TYPE:SIZE,...)", self.name()));
        }
        let new: VolumeSpec = value.parse().map_err(|e| format!("{e}"))?;
        self.provider.modify(&self.id, new).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// Detaches the volume when the export's stack is dropped (daemon exit).
struct Detach {
    inner: Arc<dyn surge_block::BlockDev>,
    id: String,
    provider: Arc<dyn Provider>,
}

impl Drop for Detach {
    fn drop(&mut self) {
        if let Err(e) = self.provider.detach(&self.id) {
            tracing::error!(volume = %self.id, "detaching at exit: {e}");
        }
    }
}

impl surge_block::BlockDev for Detach {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> surge_block::Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: surge_block::ZeroMode) -> surge_block::Result<()> {
        self.inner.write_zeroes(offset, len, mode)
    }
    fn block_status(&self, offset: u64, len: u64) -> surge_block::Result<Vec<surge_block::Extent>> {
        self.inner.block_status(offset, len)
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.inner.may_wait_remote(offset, len, write)
    }
}

pub fn build_remote_volume(name: &str, spec: &VolumeSpec, provider: Arc<dyn Provider>) -> anyhow::Result<Built> {
    let existing = provider.list()?.into_iter().find(|v| v.name.as_deref() == Some(name));
    let (id, created) = match existing {
        Some(v) => {
            if v.spec != spec.to_string() {
                tracing::warn!(volume = %v.id, "volume {name} is {} (the export asks for {spec}); serving it as it is", v.spec);
            }
            (v.id, false)
        }
        None => (provider.create(CreateRequest { spec: spec.clone(), name: Some(name.to_string()) })?.id, true),
    };
    let dev = match provider.attach(&id) {
        Ok(d) => d,
        Err(e) => {
            // Never leave behind a volume this call made and could not use.
            if created {
                if let Err(d) = provider.delete(&id) {
                    tracing::error!(volume = %id, "deleting the volume made for {name} failed: {d}");
                }
            }
            return Err(e).with_context(|| format!("attaching volume {id} for export {name}"));
        }
    };
    let control = Arc::new(RemoteVolumeControl { export: name.to_string(), id: id.clone(), provider: provider.clone() });
    let dev = Arc::new(Detach { inner: dev, id: id.clone(), provider });
    Ok(Built {
        dev,
        description: format!("{spec} (cloud volume {id})"),
        detail: json!({ "volume": id, "spec": spec.to_string() }),
        controls: vec![control],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::VirtualClock;
    use surge_cloud::{Delays, LocalConfig, LocalProvider};

    #[test]
    fn a_named_volume_is_made_once_attached_and_detached_when_dropped() {
        let d = tempfile::tempdir().unwrap();
        let mut cfg = LocalConfig::new(d.path());
        cfg.delays = Delays::none();
        let p: Arc<dyn Provider> = Arc::new(LocalProvider::open(cfg, Arc::new(VirtualClock::new())).unwrap());
        let b = build_remote_volume("v", &"gp2:1GiB".parse().unwrap(), p.clone()).unwrap();
        b.dev.write_at(b"x", 0, true).unwrap();
        assert_eq!(b.controls[0].status()["spec"], "gp2:1GiB");
        assert!(build_remote_volume("v", &"gp2:1GiB".parse().unwrap(), p.clone()).is_err(), "attached once");
        assert_eq!(p.list().unwrap().len(), 1, "a failed attach of an existing volume deletes nothing");
        drop(b);
        assert_eq!(p.list().unwrap()[0].state, surge_cloud::VolumeState::Available, "detached on drop");
        let b = build_remote_volume("v", &"gp2:1GiB".parse().unwrap(), p.clone()).unwrap();
        let mut buf = [0u8; 1];
        b.dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"x");
    }
}
