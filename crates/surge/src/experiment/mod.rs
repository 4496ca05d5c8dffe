//! Experiments: one module each, run by `surge experiment NAME`.

pub mod burstable;
pub mod burstbuffer;
pub mod daemon;
pub mod fairshare;
pub mod plan;
pub mod elastic;
pub mod progress;
pub mod stat;
pub mod streaming;
pub mod topology;
pub mod elastic_priced;
