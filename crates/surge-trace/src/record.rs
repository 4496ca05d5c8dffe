//! [`RecordDev`]: a layer that records every request it passes down.
//!
//! The request is recorded once it completed (its submission time and how
//! long it took), failed ones too: the trace is what the application asked
//! for. Recording costs a clock read and a non-blocking queue push.
//!
//! Zero-copy front ends need a plain file below (`file_span`); this layer
//! hides it, so a recorded export serves every request through `read_at` /
//! `write_at` and each one is seen.

use crate::format::{Op, Rec};
use crate::writer::Recorder;
use std::sync::Arc;
use surge_block::{BlockDev, Caps, Extent, Result, ZeroMode};

pub struct RecordDev {
    inner: Arc<dyn BlockDev>,
    rec: Arc<Recorder>,
}

impl RecordDev {
    pub fn new(inner: Arc<dyn BlockDev>, rec: Arc<Recorder>) -> Self {
        RecordDev { inner, rec }
    }

    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.rec
    }

    fn run<T>(&self, op: Op, offset: u64, len: u64, fua: bool, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = self.rec.now_ns();
        let r = f();
        let dur_ns = self.rec.now_ns().saturating_sub(t);
        self.rec.record(Rec { t_ns: t, op, offset, len, fua, dur_ns });
        r
    }
}

/// `dev` with its requests recorded into `dir` (a new trace directory) under
/// the name `name`: the layer and its recorder (stop it after the last request).
pub fn recorded(dev: Arc<dyn BlockDev>, name: &str, dir: &std::path::Path, limits: crate::Limits) -> std::result::Result<(Arc<dyn BlockDev>, Arc<Recorder>), crate::TraceError> {
    let mut h = crate::Header::new(crate::Source::SurgeRecord, name);
    h.device_size = dev.size();
    h.note = "recorded by surge serve".into();
    let r = Recorder::start(dir, h, limits, Arc::new(surge_block::SystemClock::new()))?;
    Ok((Arc::new(RecordDev::new(dev, r.clone())), r))
}

impl BlockDev for RecordDev {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        self.run(Op::Read, offset, len, false, || self.inner.read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.run(Op::Write, offset, buf.len() as u64, fua, || self.inner.write_at(buf, offset, fua))
    }
    fn flush(&self) -> Result<()> {
        self.run(Op::Flush, 0, 0, false, || self.inner.flush())
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.run(Op::Trim, offset, len, false, || self.inner.discard(offset, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        self.run(Op::Zero, offset, len, false, || self.inner.write_zeroes(offset, len, mode))
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.inner.block_status(offset, len)
    }
    fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.prefetch(offset, len)
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.inner.may_wait_remote(offset, len, write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Header, Source};
    use crate::reader::Trace;
    use crate::writer::Limits;
    use surge_block::{MemoryDev, SystemClock};

    #[test]
    fn every_request_is_recorded_with_its_shape() {
        let d = tempfile::tempdir().unwrap();
        let rec = Recorder::start(d.path(), Header::new(Source::SurgeRecord, "m"), Limits::default(), Arc::new(SystemClock::new())).unwrap();
        let dev = RecordDev::new(Arc::new(MemoryDev::new(1 << 20)), rec);
        dev.write_at(&[1u8; 8192], 4096, true).unwrap();
        let mut b = [0u8; 512];
        dev.read_at(&mut b, 8192).unwrap();
        assert!(dev.read_at(&mut b, 1 << 20).is_err(), "past the end");
        dev.flush().unwrap();
        dev.discard(0, 4096).unwrap();
        drop(dev); // stops the recorder: drains and closes the trace
        let t = Trace::open(d.path()).unwrap();
        let got: Vec<(Op, u64, u64, bool)> = t.records.iter().map(|r| (r.op, r.offset, r.len, r.fua)).collect();
        assert_eq!(
            got,
            vec![(Op::Write, 4096, 8192, true), (Op::Read, 8192, 512, false), (Op::Read, 1 << 20, 512, false), (Op::Flush, 0, 0, false), (Op::Trim, 0, 4096, false)]
        );
        assert!(!t.truncated);
    }
}
