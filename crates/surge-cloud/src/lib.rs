//! surge-cloud: the cloud as surge sees it.
//!
//! - [`Provider`]: create, attach, detach, delete and list volumes, read their
//!   burst credits and cost. [`LocalProvider`] is the embedded default: volumes
//!   are sparse files under a data directory, served through the device model
//!   of their type (`surge_block::model`), with EBS-like attach delays.
//! - [`VolumeSpec`]: `TYPE:SIZE[,key=value...]`, e.g. `gp2:100GiB`,
//!   `reserved:10GiB,bw=33MB/s`.
//! - [`cost`]: list prices and the per-second cost meter, with the
//!   elastic-cache paper's AGBs.
//! - [`plan`]: burstable-volume planning: every layout that meets a capacity
//!   and an IOPS or throughput target, and its monthly cost.

pub mod attachment;
pub mod cost;
pub mod dryrun;
pub mod faulty;
pub mod gc;
pub mod local;
pub mod plan;
pub mod provider;
pub mod spec;

pub use attachment::Attachment;
pub use dryrun::DryRunProvider;
pub use faulty::FaultyProvider;
pub use cost::{CostMeter, CostReport, PriceTable, S3Price, S3Usage, VolumeCost, WallClock};
pub use local::{Delays, LocalConfig, LocalProvider, ModifyRules, Optimizing};
pub use provider::{Action, AttachmentSlots, CloudError, CreateRequest, CreditSample, Modification, ModificationState, Provider, VolumeInfo, VolumeState};
pub use spec::{SpecError, VolumeSpec};
