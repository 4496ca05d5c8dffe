//! A provider that plans instead of acting (`surge serve --dry-run`): read-only
//! calls (list, describe, credits, cost, attachment slots) go to the inner
//! provider; create, attach, detach, delete and modify are recorded, with the
//! volume's list price, and answered as if they had happened, on volumes that
//! live only in this record. A stack built over it makes every call it would
//! make on the real cloud, and none reaches it.

use crate::cost::PriceTable;
use crate::provider::{Action, AttachmentSlots, CloudError, CreateRequest, CreditSample, Provider, Result, VolumeInfo, VolumeState};
use crate::{CostReport, VolumeSpec};
use parking_lot::Mutex;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;
use surge_block::model::CreditBalance;
use surge_block::{BlockDev, Caps};

/// One call the stack would have made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedCall {
    /// The EBS API it is (`CreateVolume`, `AttachVolume`, ...); the local cloud's calls are the same steps.
    pub api: &'static str,
    /// Volume id (`dry-N` for volumes the plan creates).
    pub volume: String,
    pub name: Option<String>,
    pub spec: Option<String>,
    /// List price per month of a volume the call creates or modifies to.
    pub usd_month: Option<f64>,
}

#[derive(Default)]
struct State {
    calls: Vec<PlannedCall>,
    /// Volumes the plan created (id -> what describe says).
    planned: HashMap<String, VolumeInfo>,
    /// Real volumes the plan deleted.
    deleted: Vec<String>,
    next: u64,
}

pub struct DryRunProvider {
    inner: Arc<dyn Provider>,
    prices: PriceTable,
    state: Mutex<State>,
}

impl DryRunProvider {
    pub fn new(inner: Arc<dyn Provider>, prices: PriceTable) -> Self {
        DryRunProvider { inner, prices, state: Mutex::new(State::default()) }
    }

    /// Every call recorded so far, in order.
    pub fn calls(&self) -> Vec<PlannedCall> {
        self.state.lock().calls.clone()
    }

    fn record(&self, api: &'static str, volume: &str, name: Option<String>, spec: Option<&VolumeSpec>) {
        let usd_month = spec.map(|s| self.prices.usd_month(s));
        self.state.lock().calls.push(PlannedCall { api, volume: volume.to_string(), name, spec: spec.map(|s| s.to_string()), usd_month });
    }

    fn info(&self, id: &str) -> Result<VolumeInfo> {
        if let Some(v) = self.state.lock().planned.get(id) {
            return Ok(v.clone());
        }
        self.inner.describe(id)
    }
}

/// Lines for humans: each call with its volume, name, spec and price, then the
/// monthly list price of what the plan would create.
pub fn render(calls: &[PlannedCall]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for c in calls {
        let _ = write!(s, "  {:<14} {}", c.api, c.volume);
        if let Some(n) = &c.name {
            let _ = write!(s, " name={n}");
        }
        if let Some(sp) = &c.spec {
            let _ = write!(s, " {sp}");
        }
        if let Some(p) = c.usd_month {
            let _ = write!(s, " ${p:.2}/month");
        }
        s.push('\n');
    }
    s
}

/// Monthly list price of the volumes `calls` create (and keep).
pub fn created_usd_month(calls: &[PlannedCall]) -> f64 {
    let deleted: Vec<&str> = calls.iter().filter(|c| c.api == "DeleteVolume").map(|c| c.volume.as_str()).collect();
    calls.iter().filter(|c| c.api == "CreateVolume" && !deleted.contains(&c.volume.as_str())).filter_map(|c| c.usd_month).sum()
}

impl Provider for DryRunProvider {
    fn create(&self, req: CreateRequest) -> Result<VolumeInfo> {
        if let Some(n) = &req.name {
            if let Some(v) = self.list()?.into_iter().find(|v| v.name.as_ref() == Some(n)) {
                return Err(CloudError::NameTaken { action: Action::Create, name: n.clone(), id: v.id });
            }
        }
        let id = {
            let mut st = self.state.lock();
            st.next += 1;
            format!("dry-{}", st.next)
        };
        let info = VolumeInfo {
            id: id.clone(),
            name: req.name.clone(),
            spec: req.spec.to_string(),
            kind: req.spec.kind().to_string(),
            size: req.spec.size,
            state: VolumeState::Available,
            created_unix_ms: 0,
            credits: CreditBalance::default(),
        };
        self.record("CreateVolume", &id, req.name.clone(), Some(&req.spec));
        self.state.lock().planned.insert(id, info.clone());
        Ok(info)
    }

    fn attach(&self, id: &str) -> Result<Arc<dyn BlockDev>> {
        let v = self.info(id)?;
        self.record("AttachVolume", &v.id, v.name.clone(), None);
        if let Some(p) = self.state.lock().planned.get_mut(&v.id) {
            p.state = VolumeState::Attached;
        }
        Ok(Arc::new(NullDev { size: v.size }))
    }

    fn detach(&self, id: &str) -> Result<()> {
        let v = self.info(id)?;
        self.record("DetachVolume", &v.id, v.name.clone(), None);
        if let Some(p) = self.state.lock().planned.get_mut(&v.id) {
            p.state = VolumeState::Available;
        }
        Ok(())
    }

    fn delete(&self, id: &str) -> Result<()> {
        let v = self.info(id)?;
        self.record("DeleteVolume", &v.id, v.name.clone(), None);
        let mut st = self.state.lock();
        if st.planned.remove(&v.id).is_none() {
            st.deleted.push(v.id);
        }
        Ok(())
    }

    fn list(&self) -> Result<Vec<VolumeInfo>> {
        let mut v = self.inner.list()?;
        let st = self.state.lock();
        v.retain(|x| !st.deleted.contains(&x.id));
        let mut planned: Vec<VolumeInfo> = st.planned.values().cloned().collect();
        planned.sort_by(|a, b| a.id.cmp(&b.id));
        v.extend(planned);
        Ok(v)
    }

    fn describe(&self, id: &str) -> Result<VolumeInfo> {
        self.info(id)
    }

    fn credits(&self, id: &str) -> Result<CreditBalance> {
        if self.state.lock().planned.contains_key(id) {
            return Ok(CreditBalance::default());
        }
        self.inner.credits(id)
    }

    fn credits_sampled(&self) -> bool {
        self.inner.credits_sampled()
    }

    fn credit_sample(&self, id: &str) -> Result<Option<CreditSample>> {
        if self.state.lock().planned.contains_key(id) {
            return Ok(None);
        }
        self.inner.credit_sample(id)
    }

    fn attachment_slots(&self) -> Result<Option<AttachmentSlots>> {
        self.inner.attachment_slots()
    }

    fn cost(&self) -> Result<CostReport> {
        self.inner.cost()
    }

    fn modify(&self, id: &str, spec: VolumeSpec) -> Result<VolumeInfo> {
        let mut v = self.info(id)?;
        self.record("ModifyVolume", &v.id, v.name.clone(), Some(&spec));
        v.spec = spec.to_string();
        v.size = spec.size;
        Ok(v)
    }

    /// A read: the real volume's latest modification (a planned one has none).
    fn modification(&self, id: &str) -> Result<Option<crate::Modification>> {
        if self.state.lock().planned.contains_key(id) {
            return Ok(None);
        }
        self.inner.modification(id)
    }
}

/// The device of a planned attachment: reads zeroes, drops writes. Nothing
/// is kept, so a plan of terabytes costs nothing.
struct NullDev {
    size: u64,
}

impl BlockDev for NullDev {
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        Caps::default()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        surge_block::check_range(self.size, offset, buf.len() as u64)?;
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> surge_block::Result<()> {
        surge_block::check_range(self.size, offset, buf.len() as u64)
    }
    fn flush(&self) -> surge_block::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Delays, LocalConfig, LocalProvider};
    use surge_block::VirtualClock;

    #[test]
    fn mutating_calls_are_recorded_with_prices_and_never_reach_the_cloud() {
        let d = tempfile::tempdir().unwrap();
        let mut cfg = LocalConfig::new(d.path());
        cfg.delays = Delays::none();
        let real: Arc<dyn Provider> = Arc::new(LocalProvider::open(cfg, Arc::new(VirtualClock::new())).unwrap());
        let kept = real.create(CreateRequest { spec: "gp3:8GiB".parse().unwrap(), name: Some("kept".into()) }).unwrap();
        let dry = DryRunProvider::new(real.clone(), PriceTable::default());
        let v = dry.create(CreateRequest { spec: "gp2:100GiB".parse().unwrap(), name: Some("n".into()) }).unwrap();
        let dev = dry.attach(&v.id).unwrap();
        assert_eq!(dev.size(), 100 << 30);
        dev.write_at(&[1u8; 4096], 0, true).unwrap();
        assert!(dry.create(CreateRequest { spec: "gp2:1GiB".parse().unwrap(), name: Some("kept".into()) }).is_err(), "names of the real cloud count");
        dry.attach("kept").unwrap();
        dry.detach(&kept.id).unwrap();
        dry.delete(&kept.id).unwrap();
        let apis: Vec<&str> = dry.calls().iter().map(|c| c.api).collect();
        assert_eq!(apis, ["CreateVolume", "AttachVolume", "AttachVolume", "DetachVolume", "DeleteVolume"]);
        assert!((dry.calls()[0].usd_month.unwrap() - 10.0).abs() < 1e-9, "100 GiB gp2 at $0.10");
        assert!((created_usd_month(&dry.calls()) - 10.0).abs() < 1e-9);
        assert!(render(&dry.calls()).contains("CreateVolume   dry-1 name=n gp2:100GiB $10.00/month"), "{}", render(&dry.calls()));
        // The real cloud saw none of it.
        let live = real.list().unwrap();
        assert_eq!(live.len(), 1);
        assert_eq!((live[0].id.as_str(), live[0].state), (kept.id.as_str(), VolumeState::Available));
        assert!(dry.list().unwrap().iter().all(|v| v.id != kept.id), "the plan deleted it");
    }
}
