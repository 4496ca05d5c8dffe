//! The device a provider hands out from `attach`: the volume's device until
//! `detach`, then a device that fails every request (a detached volume is
//! gone from the machine; a stale handle must not reach it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use surge_block::{BlockDev, BlockError, Caps, Extent, ZeroMode};

pub struct Attachment {
    id: String,
    dev: Arc<dyn BlockDev>,
    gone: AtomicBool,
    /// Run before each request (the local cloud advances a modification's
    /// performance ramp on the I/O path).
    before_each: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Attachment {
    pub fn new(id: &str, dev: Arc<dyn BlockDev>) -> Self {
        Attachment { id: id.to_string(), dev, gone: AtomicBool::new(false), before_each: None }
    }

    /// Run `f` before each request reaches the device.
    pub fn before_each_request(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.before_each = Some(Box::new(f));
        self
    }

    /// Every request fails from now on.
    pub fn detach(&self) {
        self.gone.store(true, Ordering::Release);
    }

    fn check(&self) -> surge_block::Result<()> {
        if self.gone.load(Ordering::Acquire) {
            Err(BlockError::Gone(format!("volume {} was detached", self.id)))
        } else {
            if let Some(f) = &self.before_each {
                f();
            }
            Ok(())
        }
    }
}

impl BlockDev for Attachment {
    fn size(&self) -> u64 {
        self.dev.size()
    }
    fn caps(&self) -> Caps {
        self.dev.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.check()?;
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.check()?;
        self.dev.write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.check()?;
        self.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.check()?;
        self.dev.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> surge_block::Result<()> {
        self.check()?;
        self.dev.write_zeroes(offset, len, mode)
    }
    fn block_status(&self, offset: u64, len: u64) -> surge_block::Result<Vec<Extent>> {
        self.check()?;
        self.dev.block_status(offset, len)
    }
    fn prefetch(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.check()?;
        self.dev.prefetch(offset, len)
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.dev.may_wait_remote(offset, len, write)
    }
}
