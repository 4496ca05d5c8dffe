//! Device models: a layer that serves I/O like a cloud volume type.
//!
//! [`ModelDev`] wraps any device. For each request it asks the pure
//! [`Scheduler`] when the request may complete (token buckets with burst
//! credits, integer arithmetic, reservation style so concurrent requests are
//! paced exactly), does the I/O on the device below, and sleeps on its
//! [`Clock`] until that time: real time in the daemon, a jump on a
//! `VirtualClock` in tests and simulations.
//!
//! Charged: reads, writes and `write_zeroes` that write (as writes of their
//! length). Free: flush, discard, `write_zeroes` that may deallocate, block status.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use surge_block::{MemoryDev, SystemClock, model::{ModelDev, VolumeModel, MB, GIB}};
//! let slow = VolumeModel::Reserved { bw: Some(33 * MB), iops: None }.shape(10 * GIB).unwrap();
//! let dev = ModelDev::new(Arc::new(MemoryDev::new(10 * GIB)), Arc::new(SystemClock::new()), slow);
//! ```

mod bucket;
mod scale;
mod sched;
mod types;

pub use bucket::Bucket;
pub use scale::Scale;
pub use sched::{Charge, CreditBalance, Credits, IoKind, Merged, Scheduler, SeqMerge, Shape};
pub use types::{azure_tier, with_latency, ModelError, VolumeModel, GIB, GP2_BURST_IOPS, GP2_CREDITS, KIB, MB, MIB, SSD_OP, TIB};

use crate::clock::Clock;
use crate::dev::{check_range, BlockDev, Caps, Extent, ZeroMode};
use crate::error::Result;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// A device served through a cloud volume model.
pub struct ModelDev {
    inner: Arc<dyn BlockDev>,
    clock: Arc<dyn Clock>,
    sched: Mutex<Scheduler>,
    /// The link every volume of one instance shares (its EBS bandwidth and
    /// IOPS), if modelled: an I/O completes when both it and the volume allow.
    link: Option<Link>,
}

/// The EBS limits of one instance, shared by the models of its volumes.
pub type Link = Arc<Mutex<Scheduler>>;

impl ModelDev {
    pub fn new(inner: Arc<dyn BlockDev>, clock: Arc<dyn Clock>, shape: Shape) -> Self {
        let sched = Mutex::new(Scheduler::new(shape, clock.now()));
        ModelDev { inner, clock, sched, link: None }
    }

    /// The same, its I/O also held to `link` (shared with the instance's other volumes).
    pub fn with_link(mut self, link: Option<Link>) -> Self {
        self.link = link;
        self
    }

    pub fn shape(&self) -> Shape {
        self.sched.lock().shape().clone()
    }

    /// Change the model's parameters live; credit balances carry over.
    pub fn set_shape(&self, shape: Shape) {
        self.sched.lock().update(self.clock.now(), shape);
    }

    /// Burst credits left now.
    pub fn credits(&self) -> CreditBalance {
        self.sched.lock().credits(self.clock.now())
    }

    /// Overwrite the credit balances (e.g. restored from saved state).
    pub fn set_credits(&self, ops: Option<u64>, bytes: Option<u64>) {
        self.sched.lock().set_credits(self.clock.now(), ops, bytes);
    }

    pub fn inner(&self) -> &Arc<dyn BlockDev> {
        &self.inner
    }

    /// Reserve service for a request submitted at `submitted` and wait for it.
    fn pace(&self, submitted: Duration, kind: IoKind, offset: u64, len: u64) {
        let mut done = self.sched.lock().reserve_at(submitted, kind, offset, len);
        if let Some(l) = &self.link {
            done = done.max(l.lock().reserve_at(submitted, kind, offset, len));
        }
        self.clock.sleep_until(done);
    }
}

impl BlockDev for ModelDev {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let t = self.clock.now();
        self.inner.read_at(buf, offset)?;
        self.pace(t, IoKind::Read, offset, buf.len() as u64);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        let t = self.clock.now();
        self.inner.write_at(buf, offset, fua)?;
        self.pace(t, IoKind::Write, offset, buf.len() as u64);
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.discard(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        check_range(self.size(), offset, len)?;
        let t = self.clock.now();
        self.inner.write_zeroes(offset, len, mode)?;
        if !mode.may_trim {
            self.pace(t, IoKind::Zero, offset, len);
        }
        Ok(())
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.inner.block_status(offset, len)
    }

    fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.prefetch(offset, len)
    }
}

#[cfg(test)]
mod tests;
