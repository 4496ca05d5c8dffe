//! The simulation engine: replays a block I/O trace ([`surge_trace`]) on
//! virtual time through the real device-model layer of `surge-block`
//! ([`surge_block::model::ModelDev`], with the instance's EBS limits as its
//! shared `Link`), and prices each run with `surge-cloud`'s price table.
//!
//! - [`clock`]: [`clock::ReplayClock`], the event-driven virtual clock a replay
//!   runs the layers on.
//! - [`replay`]: one trace on one device stack: completion time and timeline.
//! - [`candidates`]: the configurations worth trying for a trace, sized from
//!   its demand (gp2, gp3 with chosen IOPS/MB/s, io2, st1, sc1).
//! - [`modify`]: the modify-volume candidate: `surge-policy`'s ModifyPolicy
//!   driving a gp3 volume between a base and a peak spec under EBS's rolling
//!   rule, with the local cloud's optimizing ramp, billed by the cost meter.
//! - [`stripe`]: the burstable-stripe candidate: N small gp2 volumes striped
//!   by `surge-block`'s `Stripe`, each on its own credits (sizing; the event
//!   replay, without swaps, where the threaded harness cannot run it).
//! - [`burstable`]: the same candidate with its swaps: the daemon's
//!   `BurstableVolume` (surge-controller) with the daemon's defaults for its
//!   `burstable:` spec, replayed on the threaded harness.
//! - [`plan`]: every candidate replayed and priced, a recommendation, and what
//!   is not simulated yet (listed, never guessed).
//! - [`fleet`]: N VMs running the recorded application with their own phase
//!   offsets on one account: each candidate's cost per VM and per run, the
//!   volumes attached at once, and the EC2 API calls against the account's
//!   request buckets and storage quotas (event driven).
//! - [`elastic`]: the elastic-cache candidate: the daemon's `ElasticVolume`
//!   (surge-controller) with the daemon's defaults for its `elastic:` spec,
//!   over gp3, st1 or the burstable stripe, replayed on the threaded harness.
//! - [`threaded_replay`]: a trace replayed with [`replay::drive`]'s
//!   application model on any device whose layers have threads, every thread
//!   on one `SimClock`.
//! - [`plot`]: the recommended candidate's timeline as SVG.
//! - [`threaded`]: the other engine, for layers with threads of their own
//!   (mirror rebuilds, cache writeback, controllers): every thread on one
//!   `SimClock`, closed-loop workers, a sampler, the scaled local cloud; the
//!   burstable experiment's virtual-time figures run on it.
//!
//! It depends on no network code and not on the `surge` binary (the
//! controllers come from the library crate `surge-controller`).

pub mod burstable;
pub mod candidates;
pub mod clock;
pub mod elastic;
pub mod fleet;
pub mod modify;
pub mod plan;
pub mod plot;
pub mod replay;
pub mod stripe;
pub mod threaded;
pub mod threaded_replay;

pub use plan::{plan_workload, Objective, PlanOptions, WorkloadPlan};
pub use replay::{replay, replay_observed, Observer, ReplayOptions, ReplayResult};
