//! Helpers shared by the cache test crates.

use std::sync::Arc;
use surge_block::{BlockDev, MemoryDev};

/// A copy of a device's bytes: the state a crash at this instant leaves
/// (`MemoryDev` has no volatile cache, so every completed write survived).
pub fn image(dev: &dyn BlockDev) -> Arc<dyn BlockDev> {
    let mut buf = vec![0u8; dev.size() as usize];
    dev.read_at(&mut buf, 0).unwrap();
    let copy = MemoryDev::new(dev.size());
    copy.write_at(&buf, 0, false).unwrap();
    Arc::new(copy)
}
