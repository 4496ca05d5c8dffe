//! [`RecordDev`]: a layer that records every request it passes down while
//! its [`RecordSwitch`] is on.
//!
//! The request is recorded once it completed (its submission time and how
//! long it took), failed ones too: the trace is what the application asked
//! for. Recording costs a clock read and a non-blocking queue push; while
//! the switch is off the layer costs one relaxed atomic load.
//!
//! The switch is flipped while the export serves (`surge set EXPORT
//! record=on|off`), so every export has the layer. Zero-copy front ends
//! need a plain file below (`file_span`): the layer passes the file on, but
//! while recording it refuses every range (`in_file_span`,
//! `write_via_span`), so each request goes through `read_at` / `write_at`
//! and is seen. A request already on the zero-copy path when recording
//! starts is not recorded, as if it had completed just before.

use crate::format::{Header, Op, Rec, Source, TraceError};
use crate::writer::{Limits, Recorder, RecorderStats};
use arc_swap::ArcSwapOption;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use surge_block::{BlockDev, Caps, Extent, FileSpan, Result, ZeroMode};

/// Whether, and where, an export's requests are being recorded.
pub struct RecordSwitch {
    name: String,
    size: u64,
    /// Checked first on every request: off costs nothing more.
    on: AtomicBool,
    cur: ArcSwapOption<Recorder>,
    /// Serializes start and stop (the request path never takes it).
    flip: parking_lot::Mutex<()>,
}

/// A recording that was stopped: where it is and what it holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Stopped {
    pub dir: PathBuf,
    pub stats: RecorderStats,
}

impl RecordSwitch {
    pub fn new(name: &str, size: u64) -> Arc<Self> {
        Arc::new(RecordSwitch { name: name.to_string(), size, on: AtomicBool::new(false), cur: ArcSwapOption::empty(), flip: parking_lot::Mutex::new(()) })
    }

    /// Start recording into `dir` (a new trace directory, see
    /// [`crate::SegmentWriter::create`]). Refused while already recording.
    pub fn start(&self, dir: &Path, limits: Limits) -> std::result::Result<Arc<Recorder>, TraceError> {
        let _g = self.flip.lock();
        if let Some(r) = self.cur.load_full() {
            return Err(TraceError::Invalid(format!("export {} is already recording into {}", self.name, r.dir().display())));
        }
        let mut h = Header::new(Source::SurgeRecord, &self.name);
        h.device_size = self.size;
        h.note = "recorded by surge serve".into();
        let r = Recorder::start(dir, h, limits, Arc::new(surge_block::SystemClock::new()))?;
        self.cur.store(Some(r.clone()));
        self.on.store(true, Relaxed);
        Ok(r)
    }

    /// Stop recording: what is queued is written and the trace closed.
    /// `None` if it was not recording.
    pub fn stop(&self) -> Option<Stopped> {
        let _g = self.flip.lock();
        self.on.store(false, Relaxed);
        let r = self.cur.swap(None)?;
        // A request that loaded the recorder before the swap may still push:
        // `Recorder::record` ignores it once stopped.
        r.stop();
        Some(Stopped { dir: r.dir().to_path_buf(), stats: r.stats() })
    }

    /// The recording in progress, if any.
    pub fn current(&self) -> Option<Arc<Recorder>> {
        self.cur.load_full()
    }

    fn recording(&self) -> bool {
        self.on.load(Relaxed)
    }
}

impl Drop for RecordSwitch {
    fn drop(&mut self) {
        self.stop();
    }
}

pub struct RecordDev {
    inner: Arc<dyn BlockDev>,
    sw: Arc<RecordSwitch>,
}

impl RecordDev {
    pub fn new(inner: Arc<dyn BlockDev>, sw: Arc<RecordSwitch>) -> Self {
        RecordDev { inner, sw }
    }

    pub fn switch(&self) -> &Arc<RecordSwitch> {
        &self.sw
    }

    fn run<T>(&self, op: Op, offset: u64, len: u64, fua: bool, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if !self.sw.recording() {
            return f();
        }
        let guard = self.sw.cur.load();
        let Some(rec) = guard.as_ref() else { return f() };
        let t = rec.now_ns();
        let r = f();
        let dur_ns = rec.now_ns().saturating_sub(t);
        rec.record(Rec { t_ns: t, op, offset, len, fua, dur_ns });
        r
    }
}

/// `dev` under a recording layer for the export `name`, and its switch
/// (off; [`RecordSwitch::start`] turns it on).
pub fn switchable(dev: Arc<dyn BlockDev>, name: &str) -> (Arc<dyn BlockDev>, Arc<RecordSwitch>) {
    let sw = RecordSwitch::new(name, dev.size());
    (Arc::new(RecordDev::new(dev, sw.clone())), sw)
}

/// `dev` with its requests recorded into `dir` (a new trace directory) under
/// the name `name`: the layer and its recorder (stop it after the last request).
pub fn recorded(dev: Arc<dyn BlockDev>, name: &str, dir: &Path, limits: Limits) -> std::result::Result<(Arc<dyn BlockDev>, Arc<Recorder>), TraceError> {
    let (dev, sw) = switchable(dev, name);
    let r = sw.start(dir, limits)?;
    Ok((dev, r))
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
    /// The file below, whose ranges are refused while recording (see the module doc).
    fn file_span(&self) -> Option<FileSpan<'_>> {
        self.inner.file_span()
    }
    fn in_file_span(&self, offset: u64, len: u64, write: bool) -> bool {
        !self.sw.recording() && self.inner.in_file_span(offset, len, write)
    }
    fn write_via_span(&self, offset: u64, len: u64, fill: &mut dyn FnMut() -> std::io::Result<()>) -> Result<bool> {
        if self.sw.recording() {
            return Ok(false);
        }
        self.inner.write_via_span(offset, len, fill)
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.inner.may_wait_remote(offset, len, write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::Trace;
    use surge_block::{FileDev, MemoryDev};

    fn shapes(t: &Trace) -> Vec<(Op, u64, u64, bool)> {
        t.records.iter().map(|r| (r.op, r.offset, r.len, r.fua)).collect()
    }

    #[test]
    fn every_request_is_recorded_with_its_shape() {
        let d = tempfile::tempdir().unwrap();
        let (dev, _r) = recorded(Arc::new(MemoryDev::new(1 << 20)), "m", d.path(), Limits::default()).unwrap();
        dev.write_at(&[1u8; 8192], 4096, true).unwrap();
        let mut b = [0u8; 512];
        dev.read_at(&mut b, 8192).unwrap();
        assert!(dev.read_at(&mut b, 1 << 20).is_err(), "past the end");
        dev.flush().unwrap();
        dev.discard(0, 4096).unwrap();
        drop(dev); // drops the switch: stops the recorder, drains and closes the trace
        drop(_r);
        let t = Trace::open(d.path()).unwrap();
        assert_eq!(
            shapes(&t),
            vec![(Op::Write, 4096, 8192, true), (Op::Read, 8192, 512, false), (Op::Read, 1 << 20, 512, false), (Op::Flush, 0, 0, false), (Op::Trim, 0, 4096, false)]
        );
        assert!(!t.truncated);
    }

    #[test]
    fn the_switch_records_only_while_on_and_each_recording_is_its_own_trace() {
        let d = tempfile::tempdir().unwrap();
        let (dev, sw) = switchable(Arc::new(MemoryDev::new(1 << 20)), "m");
        dev.write_at(&[1u8; 4096], 0, false).unwrap(); // off: not recorded
        assert!(sw.stop().is_none(), "nothing to stop");
        sw.start(&d.path().join("a"), Limits::default()).unwrap();
        let again = sw.start(&d.path().join("x"), Limits::default()).err().expect("refused while on").to_string();
        assert!(again.contains("already recording into") && again.contains("/a"), "{again}");
        dev.write_at(&[1u8; 4096], 8192, false).unwrap();
        let a = sw.stop().expect("was on");
        assert_eq!((a.dir.clone(), a.stats.recorded), (d.path().join("a"), 1));
        dev.write_at(&[1u8; 4096], 16384, false).unwrap(); // off again
        assert!(sw.start(&d.path().join("a"), Limits::default()).is_err(), "a directory that holds a trace is refused");
        sw.start(&d.path().join("b"), Limits::default()).unwrap();
        dev.flush().unwrap();
        sw.stop().unwrap();
        assert_eq!(shapes(&Trace::open(&d.path().join("a")).unwrap()), vec![(Op::Write, 8192, 4096, false)]);
        assert_eq!(shapes(&Trace::open(&d.path().join("b")).unwrap()), vec![(Op::Flush, 0, 0, false)]);
    }

    #[test]
    fn zero_copy_ranges_are_refused_only_while_recording() {
        let d = tempfile::tempdir().unwrap();
        let (dev, sw) = switchable(Arc::new(FileDev::create(d.path().join("f"), 1 << 20).unwrap()), "f");
        assert!(dev.file_span().is_some() && dev.in_file_span(0, 4096, false) && dev.in_file_span(0, 4096, true));
        sw.start(&d.path().join("t"), Limits::default()).unwrap();
        assert!(!dev.in_file_span(0, 4096, false) && !dev.in_file_span(0, 4096, true), "every request must reach read_at/write_at");
        assert!(!dev.write_via_span(0, 4096, &mut || panic!("not through the span")).unwrap());
        sw.stop();
        assert!(dev.in_file_span(0, 4096, true));
    }
}
