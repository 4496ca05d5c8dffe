//! Controllers: the parts of surge that turn a pure policy's decisions
//! (`surge-policy`) into volumes, attachments and layer changes through a
//! cloud [`surge_cloud::Provider`], on whatever [`surge_block::Clock`] they
//! are given. The daemon wires them from export specs (`surge`'s `stack/`);
//! the simulator (`surge-sim`) runs the same code on virtual time.
//!
//! - [`elastic`]: a backing volume plus short-lived cache volumes.
//! - [`burstable`]: a stripe over credit-carrying volumes, swapped as credits run out.

pub mod burstable;
pub mod elastic;

/// Something `surge status` shows and `surge set` changes. Every controller
/// exposes itself this way; the daemon's control socket serves the registry.
pub trait Controllable: Send + Sync {
    /// Unique target name, e.g. the export name or `export/cache`.
    fn name(&self) -> String;
    /// What it is: "export", "cache", "tenant", "cost", ...
    fn kind(&self) -> String;
    /// Current state as JSON (numbers as numbers, so clients can compute).
    fn status(&self) -> serde_json::Value;
    /// Change one setting live.
    fn set(&self, key: &str, _value: &str) -> Result<(), String> {
        Err(format!("{} has no setting {key:?}", self.name()))
    }
}

pub(crate) use surge_block::spawn_registered;
