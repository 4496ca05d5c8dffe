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
#[cfg(feature = "aws")]
pub mod ec2;
pub mod fuse;
pub mod kcache;
pub mod local;
pub mod membership;
pub mod meta;
pub mod node;
pub mod placement;
pub mod pool;
pub mod proto;
pub mod rebalance;
pub mod s3;
pub mod spare;
pub mod status;
pub mod store;
pub mod tier;
pub mod tls;
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

/// A log line that repeats (S3 down, a full node refusing every retry) is
/// written at most every 5 s; `due` says whether to write it now and how
/// many times it happened since the last line (this one included).
#[derive(Default)]
pub(crate) struct LogEvery5s(parking_lot::Mutex<(Option<std::time::Instant>, u64)>);

impl LogEvery5s {
    pub(crate) fn due(&self) -> Option<u64> {
        let mut g = self.0.lock();
        g.1 += 1;
        if g.0.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(5)) {
            return None;
        }
        let n = g.1;
        *g = (Some(std::time::Instant::now()), 0);
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_repeating_line_is_due_once_then_counted_until_the_next() {
        let log = super::LogEvery5s::default();
        assert_eq!(log.due(), Some(1), "the first occurrence is logged");
        assert_eq!(log.due(), None);
        assert_eq!(log.due(), None);
        // Five seconds later the next line carries the count since the last.
        log.0.lock().0 = Some(std::time::Instant::now() - std::time::Duration::from_secs(6));
        assert_eq!(log.due(), Some(3));
        assert_eq!(log.due(), None);
    }
}
