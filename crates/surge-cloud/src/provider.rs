//! The cloud provider interface: what surge's control plane asks of a cloud.
//!
//! Calls block (on the provider's `Clock`) for as long as the cloud takes, e.g.
//! a few seconds for an EBS attach, and fail with a [`CloudError`] that names
//! the action and the volume. A failed call leaves nothing half-made behind.

use crate::cost::CostReport;
use crate::spec::VolumeSpec;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use surge_block::model::CreditBalance;
use surge_block::BlockDev;

/// Provider calls, for error messages and fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Create,
    Attach,
    Detach,
    Delete,
    List,
    Describe,
    Cost,
    Modify,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Create => "create",
            Action::Attach => "attach",
            Action::Detach => "detach",
            Action::Delete => "delete",
            Action::List => "list",
            Action::Describe => "describe",
            Action::Cost => "cost",
            Action::Modify => "modify",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    #[error("{action} {volume}: no such volume")]
    NotFound { action: Action, volume: String },
    #[error("{action} {volume}: {why}")]
    Busy { action: Action, volume: String, why: String },
    #[error("{action}: name {name:?} is already used by volume {id}")]
    NameTaken { action: Action, name: String, id: String },
    #[error("{action}: {source}")]
    Spec {
        action: Action,
        #[source]
        source: crate::spec::SpecError,
    },
    #[error("{action} {volume}: {what} {path}: {source}")]
    Io {
        action: Action,
        volume: String,
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{action} {volume}: timed out after {waited:?} (the call would take {needed:?}); nothing was changed")]
    Timeout { action: Action, volume: String, waited: Duration, needed: Duration },
    #[error("{action} {volume}: injected failure at step {step}; nothing was changed")]
    Injected { action: Action, volume: String, step: u32 },
    #[error("{action}: state file {path} is unreadable: {why}")]
    State { action: Action, path: PathBuf, why: String },
    /// A real cloud refused or could not finish the call (throttled after
    /// retries, credentials expired, a wait that timed out); `why` says what
    /// happened and what surge did about it.
    #[error("{action} {volume}: {why}")]
    Remote { action: Action, volume: String, why: String },
}

impl CloudError {
    pub fn action(&self) -> Action {
        match self {
            CloudError::NotFound { action, .. }
            | CloudError::Busy { action, .. }
            | CloudError::NameTaken { action, .. }
            | CloudError::Spec { action, .. }
            | CloudError::Io { action, .. }
            | CloudError::Timeout { action, .. }
            | CloudError::Injected { action, .. }
            | CloudError::State { action, .. }
            | CloudError::Remote { action, .. } => *action,
        }
    }
}

pub type Result<T, E = CloudError> = std::result::Result<T, E>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeState {
    Available,
    /// Attached to a process (this one or another on the same data dir).
    Attached,
}

/// What a provider knows about a volume.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VolumeInfo {
    pub id: String,
    /// Optional user-given name, unique among live volumes (export names use it).
    pub name: Option<String>,
    /// Canonical `TYPE:SIZE[,key=value...]`.
    pub spec: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    pub state: VolumeState,
    /// Creation time, ms since the UNIX epoch on the provider's clock.
    pub created_unix_ms: u64,
    /// Burst credits now (gp2 I/O credits, st1/sc1 throughput credits).
    pub credits: CreditBalance,
}

/// One lagging credit reading of a real cloud (CloudWatch's `BurstBalance`):
/// the balance in percent of the bucket, and when it held.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CreditSample {
    pub at_unix_ms: u64,
    pub percent: f64,
}

/// The instance's attachment slots, as the provider learned them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentSlots {
    /// Volumes this instance can have attached at once, counting what holds a
    /// slot now (network interfaces, the root volume, other volumes).
    pub total: usize,
    /// Slots taken now by things that are not volumes (extra network
    /// interfaces, instance store), when they share the limit.
    pub taken_by_others: usize,
    /// Volumes attached now (the root volume and surge's own included).
    pub attached_volumes: Vec<String>,
    /// Where `total` comes from, for error messages and `surge status`.
    pub source: String,
}

impl AttachmentSlots {
    /// Slots a stack may use, not counting the volumes in `own` (already its own).
    pub fn free_for(&self, own: &[String]) -> usize {
        let others = self.attached_volumes.iter().filter(|v| !own.contains(v)).count();
        self.total.saturating_sub(self.taken_by_others + others)
    }
}

/// Where a volume's latest modification is (EBS's `modificationState`):
/// `modifying`, then `optimizing` (the new performance arrives gradually:
/// EBS "is in between the source and target configuration"), then
/// `completed`; or `failed` (the volume keeps its old configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModificationState {
    Modifying,
    Optimizing,
    Completed,
    Failed,
}

impl ModificationState {
    /// Still on its way: the next modification must wait for it (EBS's newer rule).
    pub fn in_flight(self) -> bool {
        matches!(self, ModificationState::Modifying | ModificationState::Optimizing)
    }
}

impl fmt::Display for ModificationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ModificationState::Modifying => "modifying",
            ModificationState::Optimizing => "optimizing",
            ModificationState::Completed => "completed",
            ModificationState::Failed => "failed",
        })
    }
}

/// A volume's latest modification, as the provider reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Modification {
    pub state: ModificationState,
    /// 0 to 100, if the provider says.
    pub progress_percent: Option<u32>,
    /// When it was requested and (once completed or failed) ended, ms since
    /// the UNIX epoch on the provider's clock.
    pub started_unix_ms: Option<u64>,
    pub ended_unix_ms: Option<u64>,
    /// The spec it moves to (`TYPE:SIZE[,...]`), when known.
    pub target: Option<String>,
    pub target_iops: Option<u64>,
    /// MiB/s.
    pub target_throughput_mibps: Option<u64>,
    /// The provider's status message (EBS's `statusMessage`, e.g. why it failed).
    pub message: Option<String>,
}

/// A volume to create.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub spec: VolumeSpec,
    pub name: Option<String>,
}

/// A cloud: creates, attaches, detaches and deletes volumes.
pub trait Provider: Send + Sync {
    /// Provision a volume (billing starts now).
    fn create(&self, req: CreateRequest) -> Result<VolumeInfo>;
    /// Attach a volume to this process; the device serves I/O through the
    /// model of the volume's type. A volume is attached at most once.
    fn attach(&self, id: &str) -> Result<Arc<dyn BlockDev>>;
    /// Detach: the device handed out by `attach` fails every request from now on
    /// (callers detach only when they no longer need it, e.g. a clean cache).
    fn detach(&self, id: &str) -> Result<()>;
    /// Delete a detached volume and its data (billing stops now).
    fn delete(&self, id: &str) -> Result<()>;
    fn list(&self) -> Result<Vec<VolumeInfo>>;
    /// One volume, by id or name.
    fn describe(&self, id: &str) -> Result<VolumeInfo>;
    /// Burst credits left now.
    fn credits(&self, id: &str) -> Result<CreditBalance> {
        Ok(self.describe(id)?.credits)
    }
    /// Whether [`Provider::credits`] is a lagging sample (CloudWatch's 1 to
    /// 5 minute points) rather than the exact balance: stacks then keep a
    /// model of the I/O they issue as well (`burstable:`).
    fn credits_sampled(&self) -> bool {
        false
    }
    /// The latest credit sample of a volume and when it held; `None`: none yet
    /// (or the provider's credits are exact: [`Provider::credits`]).
    fn credit_sample(&self, id: &str) -> Result<Option<CreditSample>> {
        let _ = id;
        Ok(None)
    }
    /// This instance's attachment slots; `None`: the provider cannot tell.
    fn attachment_slots(&self) -> Result<Option<AttachmentSlots>> {
        Ok(None)
    }
    /// Cost so far, per volume and in total (deleted volumes included).
    fn cost(&self) -> Result<CostReport>;
    /// Change a volume's parameters (EBS ModifyVolume): type, IOPS,
    /// throughput, bandwidth, latency; the size only grows, and only while
    /// detached. Billing follows the new parameters from now on.
    fn modify(&self, id: &str, spec: VolumeSpec) -> Result<VolumeInfo> {
        let _ = spec;
        Err(CloudError::Busy { action: Action::Modify, volume: id.to_string(), why: "this provider cannot modify volumes".into() })
    }
    /// The volume's latest modification and where it is (EBS:
    /// DescribeVolumesModifications); `None`: never modified, or the provider
    /// cannot tell (callers then fall back to the rule's expected duration).
    fn modification(&self, id: &str) -> Result<Option<Modification>> {
        let _ = id;
        Ok(None)
    }
}
