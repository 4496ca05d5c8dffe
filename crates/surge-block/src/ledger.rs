//! Which acknowledged writes a flush made durable, and what a failed flush may
//! have lost.
//!
//! A device below may drop its buffered writes when a flush fails: Linux marks
//! the pages clean after a writeback error, later reads may return the old
//! data, and the next `fsync` succeeds. A layer that flushes the device below
//! (for its user's FLUSH, or for its own metadata) must then never acknowledge
//! a later FLUSH as if those writes were durable. [`FlushLedger`] counts the
//! writes started and finished, and the ones finished before the start of the
//! last flush that succeeded; a flush that fails while some write is not known
//! to be durable records a *loss*, and every later [`FlushLedger::check`] fails
//! until the loss is acknowledged (a user's decision: the data is gone).
//!
//! The counts say *whether* something may be lost, not *what*: a layer that can
//! redo or undo a change (a copy from a base, a zeroing) tracks those itself and
//! keeps them out of the ledger.

use crate::error::{BlockError, Result};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

#[derive(Debug, Default)]
pub struct FlushLedger {
    started: AtomicU64,
    done: AtomicU64,
    /// `done` at the start of the last flush that succeeded.
    synced: AtomicU64,
    /// Flushes that failed so far.
    failures: AtomicU64,
    loss: Mutex<Option<String>>,
    /// One flush at a time: a flush that succeeds while another one is
    /// failing would otherwise count as durable the writes the failing one
    /// just dropped.
    serial: Mutex<()>,
}

/// One write in flight; finished when dropped (whether it succeeded or not:
/// a failed write was not acknowledged, so only its range is undefined).
pub struct InFlight<'a>(&'a FlushLedger);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.done.fetch_add(1, SeqCst);
    }
}

impl FlushLedger {
    pub fn new() -> Self {
        Self::default()
    }

    /// Count a write from now until the guard drops.
    pub fn begin(&self) -> InFlight<'_> {
        self.started.fetch_add(1, SeqCst);
        InFlight(self)
    }

    /// Run `flush` (a flush of the device below, described by `what`) and
    /// settle its outcome: success makes every write finished before it
    /// started durable; failure while any write is not known durable records
    /// a loss. Returns what `flush` returned.
    pub fn flush(&self, what: &str, flush: impl FnOnce() -> Result<()>) -> Result<()> {
        self.flush_settled(what, flush, |_| {})
    }

    /// As [`FlushLedger::flush`]; `settle` sees the outcome before the next
    /// flush may start (a layer records there what a failure may have
    /// dropped, so that a later flush cannot race past it).
    pub fn flush_settled(&self, what: &str, flush: impl FnOnce() -> Result<()>, settle: impl FnOnce(&Result<()>)) -> Result<()> {
        let _one = self.serial.lock();
        let done = self.done.load(SeqCst);
        let r = flush();
        match &r {
            Ok(()) => {
                self.synced.fetch_max(done, SeqCst);
            }
            Err(e) => {
                self.failures.fetch_add(1, SeqCst);
                if self.unsynced() {
                    self.flag(format!("{what} failed ({e}) with acknowledged writes not yet durable; they may be lost"));
                }
            }
        }
        settle(&r);
        r
    }

    /// Flushes of the device below that failed so far. A write made durable
    /// by a flush of its own (FUA) is durable only if none failed between
    /// the write and that flush: the failed one may have dropped it.
    pub fn failures(&self) -> u64 {
        self.failures.load(SeqCst)
    }

    /// Some write may not be durable yet.
    pub fn unsynced(&self) -> bool {
        self.started.load(SeqCst) > self.synced.load(SeqCst)
    }

    /// Record a loss (the first reason is kept).
    pub fn flag(&self, reason: String) {
        let mut l = self.loss.lock();
        if l.is_none() {
            tracing::error!("{reason}; every FLUSH fails until the loss is acknowledged");
            *l = Some(reason);
        }
    }

    /// Why acknowledged writes may have been lost, if they may.
    pub fn loss(&self) -> Option<String> {
        self.loss.lock().clone()
    }

    /// `Ok` unless a loss is pending: a FLUSH must fail then, or it would
    /// claim the lost writes durable.
    pub fn check(&self) -> Result<()> {
        match self.loss.lock().as_ref() {
            None => Ok(()),
            Some(why) => Err(lost(why)),
        }
    }

    /// The user accepts the loss: FLUSH works again. Returns what was lost.
    pub fn acknowledge(&self) -> Option<String> {
        self.loss.lock().take()
    }
}

/// The error of a FLUSH refused because earlier writes may have been lost.
pub fn lost(why: &str) -> BlockError {
    BlockError::Flush(io::Error::other(format!("acknowledged writes may have been lost: {why}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failing() -> Result<()> {
        Err(BlockError::io("flush", 0, 0, io::Error::from_raw_os_error(libc::EIO)))
    }

    #[test]
    fn a_flush_failing_after_an_unflushed_write_fails_every_later_check_until_acknowledged() {
        let l = FlushLedger::new();
        drop(l.begin());
        assert!(l.flush("flush", failing).is_err());
        assert!(l.flush("flush", || Ok(())).is_ok(), "the device's own flush now succeeds");
        assert!(l.check().is_err(), "but the ledger remembers the loss");
        assert!(l.acknowledge().is_some());
        assert!(l.check().is_ok());
    }

    #[test]
    fn a_flush_failing_with_every_write_durable_loses_nothing() {
        let l = FlushLedger::new();
        drop(l.begin());
        l.flush("flush", || Ok(())).unwrap();
        assert!(l.flush("flush", failing).is_err());
        assert!(l.check().is_ok());
    }

    #[test]
    fn a_write_still_in_flight_at_a_successful_flush_is_not_durable() {
        let l = FlushLedger::new();
        let w = l.begin();
        l.flush("flush", || Ok(())).unwrap();
        drop(w);
        assert!(l.unsynced());
        assert!(l.flush("flush", failing).is_err());
        assert!(l.check().is_err());
    }
}
