//! surge-policy: pure decision logic. No I/O; time is passed in, so the daemon,
//! the experiments and a simulator run the same code.

pub mod burstable;
pub mod elastic;

pub use elastic::{Action, BurstRecord, CacheObs, Decision, ElasticConfig, ElasticPolicy, State};
