//! surge-bb: the burst buffer. A shared, strongly consistent memory tier in
//! front of an S3-compatible object store:
//! - metadata (namespace, attributes, chunk maps, dirty log) in a transactional
//!   store behind [`meta::MetaStore`] (Redis by default),
//! - file data in chunks held in memory by I/O nodes ([`node`]), replicated
//!   and placed by rendezvous hashing ([`placement`]), reached over persistent
//!   multiplexed connections ([`conn`], wire format in [`proto`]),
//! - write-back of dirty chunks to S3 as immutable objects ([`writeback`], [`s3`]),
//! - clients: a Rust API ([`client`]) and a FUSE mount ([`fuse`]).
//!
//! docs/burst-buffer.md describes the architecture, consistency and durability.

pub mod client;
pub mod conn;
pub mod drain;
pub mod fuse;
pub mod local;
pub mod membership;
pub mod meta;
pub mod node;
pub mod placement;
pub mod pool;
pub mod proto;
pub mod rebalance;
pub mod s3;
pub mod status;
pub mod store;
pub mod tier;
pub mod workers;
pub mod writeback;

/// Wall-clock nanoseconds since the epoch (file times).
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Wall-clock milliseconds since the epoch (dirty-log ages).
pub fn now_ms() -> i64 {
    now_ns() / 1_000_000
}
