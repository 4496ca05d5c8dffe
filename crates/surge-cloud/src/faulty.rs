//! A provider that puts a fault-injection layer (`surge_block::fault`) under
//! every volume it attaches: for tests and stress runs of whole stacks over a
//! cloud, where a member, a cache or a swap target fails writes, drops
//! flushes or vanishes while the stack runs. Everything else is the inner
//! provider's.

use crate::provider::{CloudError, CreateRequest, Provider, Result, VolumeInfo};
use crate::{CostReport, VolumeSpec};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use surge_block::fault::{FaultDev, FaultRules};
use surge_block::{BlockDev, Clock};

/// Puts something between an attached device and its fault layer (a power
/// domain for crash tests, say).
pub type Wrap = Box<dyn Fn(Arc<dyn BlockDev>) -> Arc<dyn BlockDev> + Send + Sync>;

pub struct FaultyProvider {
    inner: Arc<dyn Provider>,
    clock: Arc<dyn Clock>,
    wrap: Option<Wrap>,
    /// Rules a volume's layer starts with when it is attached.
    initial: Mutex<FaultRules>,
    attached: Mutex<HashMap<String, Arc<FaultDev>>>,
    /// Every fault layer made, detached ones too (their faults still count).
    all: Mutex<Vec<Arc<FaultDev>>>,
}

impl FaultyProvider {
    pub fn new(inner: Arc<dyn Provider>, clock: Arc<dyn Clock>) -> Self {
        FaultyProvider { inner, clock, wrap: None, initial: Mutex::new(FaultRules::default()), attached: Mutex::new(HashMap::new()), all: Mutex::new(Vec::new()) }
    }

    /// As `new`, with `wrap` applied to every attached device under its fault layer.
    pub fn with_wrap(inner: Arc<dyn Provider>, clock: Arc<dyn Clock>, wrap: Wrap) -> Self {
        FaultyProvider { wrap: Some(wrap), ..Self::new(inner, clock) }
    }

    /// Every fault layer made so far, detached volumes' too.
    pub fn every_fault(&self) -> Vec<Arc<FaultDev>> {
        self.all.lock().clone()
    }

    /// Rules for volumes attached from now on.
    pub fn set_initial_rules(&self, rules: FaultRules) {
        *self.initial.lock() = rules;
    }

    /// The fault layer of an attached volume.
    pub fn fault(&self, id: &str) -> Option<Arc<FaultDev>> {
        self.attached.lock().get(id).cloned()
    }

    /// Every attached volume's fault layer, by id.
    pub fn faults(&self) -> Vec<(String, Arc<FaultDev>)> {
        self.attached.lock().iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

impl Provider for FaultyProvider {
    fn create(&self, req: CreateRequest) -> Result<VolumeInfo> {
        self.inner.create(req)
    }
    fn attach(&self, id: &str) -> Result<Arc<dyn BlockDev>> {
        let mut dev = self.inner.attach(id)?;
        if let Some(w) = &self.wrap {
            dev = w(dev);
        }
        let f = Arc::new(FaultDev::new(dev, self.initial.lock().clone(), self.clock.clone()));
        self.attached.lock().insert(id.to_string(), f.clone());
        self.all.lock().push(f.clone());
        Ok(f)
    }
    fn detach(&self, id: &str) -> Result<()> {
        self.inner.detach(id)?;
        self.attached.lock().remove(id);
        Ok(())
    }
    fn delete(&self, id: &str) -> Result<()> {
        self.inner.delete(id)
    }
    fn list(&self) -> Result<Vec<VolumeInfo>> {
        self.inner.list()
    }
    fn describe(&self, id: &str) -> Result<VolumeInfo> {
        self.inner.describe(id)
    }
    fn credits(&self, id: &str) -> Result<surge_block::model::CreditBalance> {
        self.inner.credits(id)
    }
    fn credits_sampled(&self) -> bool {
        self.inner.credits_sampled()
    }
    fn credit_sample(&self, id: &str) -> Result<Option<crate::CreditSample>> {
        self.inner.credit_sample(id)
    }
    fn attachment_slots(&self) -> Result<Option<crate::AttachmentSlots>> {
        self.inner.attachment_slots()
    }
    fn cost(&self) -> Result<CostReport> {
        self.inner.cost()
    }
    fn modify(&self, id: &str, spec: VolumeSpec) -> std::result::Result<VolumeInfo, CloudError> {
        self.inner.modify(id, spec)
    }
    fn modification(&self, id: &str) -> Result<Option<crate::Modification>> {
        self.inner.modification(id)
    }
}
