//! surge-block: block devices stacked as layers.
//!
//! Every device, from a plain file to an elastic cache, implements [`BlockDev`]:
//! a synchronous, thread-safe trait with positional I/O. Layers own their children
//! as `Arc<dyn BlockDev>` and are themselves `BlockDev`s, so stacks compose freely.
//! Callers (the NBD server's worker pool, experiments, tests) issue requests from
//! many threads at once; a device must be safe under that concurrency.
//!
//! This crate knows nothing of NBD or clouds.

pub mod cache;
pub mod clock;
pub mod counted;
pub mod cow;
pub mod crashpoint;
pub mod dev;
pub mod error;
pub mod fairq;
pub mod fault;
pub mod file;
pub mod ledger;
pub mod memory;
pub mod mirror;
pub mod model;
pub mod simclock;
pub mod stress;
pub mod stripe;
pub mod units;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
#[cfg(test)]
mod faultcheck;

pub use clock::{spawn_registered, Clock, ClockThread, SystemClock, VirtualClock};
pub use simclock::{Hold, SimClock};
pub use counted::{Counted, IoStats};
pub use dev::{check_range, BlockDev, Caps, Extent, ExtentKind, FileSpan, SpanObserver, ZeroMode};
pub use error::{BlockError, Result};
pub use file::{FileDev, FileOptions, DATA_FILE_MODE};
pub use memory::MemoryDev;
