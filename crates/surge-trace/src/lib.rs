//! Block I/O traces: what an application asked of a volume, in time order.
//!
//! - [`format`]: the on-disk format (a directory of size-bounded, rotating,
//!   gzip-compressed segment files, each with a versioned header).
//! - [`writer`]: [`writer::SegmentWriter`] (synchronous, for importers) and
//!   [`writer::Recorder`] (fed from the request path through a bounded
//!   lock-free queue drained by a thread; when full it drops and counts).
//! - [`record`]: [`record::RecordDev`], a `BlockDev` layer that records every
//!   request passing through it while its [`record::RecordSwitch`] is on
//!   (switched while the export serves).
//! - [`reader`]: reads a trace back, with clear errors on malformed input.
//! - [`import`]: blkparse text, fio iologs (v2, v3) and `iostat -x` (aggregate
//!   only, labelled so) into the same format.
//! - [`summary`] and [`plot`]: what `surge trace show` prints and draws.

pub mod format;
pub mod import;
pub mod plot;
pub mod reader;
pub mod record;
pub mod summary;
pub mod writer;

pub use format::{Header, Op, Rec, Source, TraceError};
pub use reader::Trace;
pub use record::{RecordDev, RecordSwitch};
pub use writer::{Limits, Recorder, SegmentWriter};
