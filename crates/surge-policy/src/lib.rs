//! surge-policy: pure decision logic. No I/O; time is passed in, so the daemon,
//! the experiments and a simulator run the same code.
//!
//! Prices and volume limits come from `surge-cloud` and `surge-block` as plain
//! data (`PriceTable`, `VolumeSpec::shape`); nothing here calls a provider.

pub mod backing;
pub mod bb_pool;
pub mod burstable;
pub mod credits;
pub mod boost;
pub mod elastic;
pub mod modify;
pub mod window;

pub use bb_pool::{PoolConfig, PoolDecision, PoolDemand, PoolPolicy};
pub use boost::{Demand, Kind, Plan, PlannerConfig, Worth};
pub use elastic::{Action, BurstRecord, CacheObs, Decision, ElasticConfig, ElasticPolicy, State};
pub use modify::{ModifyAction, ModifyPolicy, ModifyRules};
