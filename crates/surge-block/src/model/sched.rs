//! The pure scheduler of a device model: given an I/O of `bytes` at `now`, the
//! time at which it may complete. No I/O, no clock: time is passed in, so it is
//! exact on virtual time and shared by the device layer and simulators.
//!
//! A [`Shape`] is a conjunction of token buckets: an IOPS ceiling, a throughput
//! ceiling, and optional burst-credit buckets (in operations, like gp2 and Azure
//! premium, or in bytes, like st1/sc1). A credit bucket refills at the baseline
//! rate and every charged unit takes one credit, so with credits the volume runs
//! at the peak rate and without them at the baseline: exactly AWS's burst model.

use super::bucket::Bucket;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What an I/O does. Today all kinds are charged alike (EBS and Azure meter reads
/// and writes the same way); the kind is kept for models that will not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    /// `write_zeroes` that really writes.
    Zero,
}

/// A burst-credit bucket: holds up to `capacity` units, refills at `baseline`
/// units/s, starts with `initial`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credits {
    pub capacity: u64,
    pub baseline: u64,
    pub initial: u64,
}

/// How a volume serves I/O. Rates are integers: operations/s and bytes/s.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Shape {
    /// Peak operations per second (the burst rate when `op_credits` is set).
    pub iops: Option<u64>,
    /// Peak bytes per second (the burst rate when `byte_credits` is set).
    pub bps: Option<u64>,
    /// An I/O larger than this counts as several operations (EBS SSD: 256 KiB).
    pub op_size: Option<u64>,
    /// Bytes are charged in whole units of this size, at least one per I/O
    /// (st1/sc1: every I/O up to 1 MiB counts as 1 MiB). 0 or 1: exact bytes.
    pub byte_unit: u64,
    /// Burst credits in operations (gp2, Azure premium).
    pub op_credits: Option<Credits>,
    /// Burst credits in bytes (st1, sc1, Azure premium).
    pub byte_credits: Option<Credits>,
    /// Added to every I/O's completion; does not consume capacity.
    pub latency: Duration,
    /// Physically sequential I/Os are merged into one operation up to the
    /// largest operation (`op_size`/`byte_unit`), as AWS documents for EBS
    /// ("when small I/O operations are physically sequential, Amazon EBS
    /// attempts to merge them into a single I/O operation up to the maximum
    /// I/O size": 8 contiguous 32 KiB I/Os on an SSD volume count as one
    /// operation, 8 random ones as 8). Set for every EBS type: it decides
    /// whether the 32 KiB pieces of a 1 MiB read cost 1 MiB or 32 MiB of st1
    /// credits, and 4 or 32 gp2 operations. A merged piece pays no operation,
    /// but still its bytes where bytes are charged exactly (the SSD throughput
    /// ceiling holds). Only [`Scheduler::reserve_at`] (which knows offsets) merges.
    #[serde(default)]
    pub merge_sequential: bool,
}

/// What one I/O is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub ops: u64,
    pub bytes: u64,
}

impl Shape {
    pub fn charge(&self, bytes: u64) -> Charge {
        if bytes == 0 {
            return Charge { ops: 0, bytes: 0 };
        }
        let ops = match self.op_size {
            Some(s) if s > 0 => bytes.div_ceil(s),
            _ => 1,
        };
        let bytes = if self.byte_unit > 1 { bytes.div_ceil(self.byte_unit) * self.byte_unit } else { bytes };
        Charge { ops, bytes }
    }
}

/// Remaining burst credits, where the shape has a credit bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CreditBalance {
    /// Operation credits (gp2: I/O credits).
    pub ops: Option<u64>,
    pub ops_capacity: Option<u64>,
    /// Byte credits (st1/sc1 throughput credits).
    pub bytes: Option<u64>,
    pub bytes_capacity: Option<u64>,
}

impl CreditBalance {
    /// Fullest-relative balance in percent (CloudWatch's BurstBalance), if any bucket.
    pub fn percent(&self) -> Option<f64> {
        let pct = |v: Option<u64>, c: Option<u64>| match (v, c) {
            (Some(v), Some(c)) if c > 0 => Some(v as f64 * 100.0 / c as f64),
            _ => None,
        };
        match (pct(self.ops, self.ops_capacity), pct(self.bytes, self.bytes_capacity)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The IOPS bucket holds one operation and the throughput bucket one largest
/// operation (`op_size`, else 1 MiB): a request after idle starts at once, so a
/// small I/O is not delayed by its transfer time, but nothing more is saved up
/// and the ceilings hold over any window.
const RATE_CAP: u64 = 1;

impl Shape {
    fn byte_cap(&self) -> u64 {
        self.op_size.unwrap_or(1 << 20).max(self.byte_unit).max(1)
    }
}

/// An open sequential run: the next I/O starting at `end` continues it, and
/// `paid` bytes after `end` are already charged (the rest of the merged op).
#[derive(Debug, Clone, Copy)]
struct Run<T> {
    end: u64,
    paid: u64,
    tag: T,
}

/// Sequential runs remembered per device (several streams interleave).
const RUNS: usize = 64;

/// EBS's merging of physically sequential I/O ([`Shape::merge_sequential`]):
/// the runs recently issued to one volume, each with what its merged
/// operation already paid past its end. The scheduler tags a run with its
/// completion (an I/O continuing it completes no earlier); a meter that only
/// counts operations tags it with nothing.
#[derive(Debug, Clone)]
pub struct SeqMerge<T = ()> {
    runs: std::collections::VecDeque<Run<T>>,
}

impl<T> Default for SeqMerge<T> {
    fn default() -> Self {
        SeqMerge { runs: std::collections::VecDeque::new() }
    }
}

/// One I/O's charge under [`SeqMerge`], to be remembered once its tag is known.
#[derive(Debug, Clone, Copy)]
pub struct Merged<T> {
    pub charge: Charge,
    /// The tag of the run it continues, if it continues one.
    pub after: Option<T>,
    end: u64,
    paid: u64,
}

impl<T: Copy> SeqMerge<T> {
    /// Charges an I/O of `bytes` at `offset` on `shape`: only what the merged
    /// operation it continues does not already cover (bytes in full where
    /// they are charged exactly). [`SeqMerge::remember`] then keeps it as a run.
    pub fn charge(&mut self, shape: &Shape, offset: u64, bytes: u64) -> Merged<T> {
        let run = self.runs.iter().position(|r| r.end == offset).and_then(|i| self.runs.remove(i));
        let paid = run.map_or(0, |r| r.paid.min(bytes));
        let extra = bytes - paid;
        let exact_bytes = shape.byte_unit <= 1;
        let (charge, left) = if extra == 0 {
            // Inside the merged operation: no operation; bytes only where
            // they are not charged in whole units (those units are paid).
            (Charge { ops: 0, bytes: if exact_bytes { bytes } else { 0 } }, run.map_or(0, |r| r.paid) - bytes)
        } else {
            let mut c = shape.charge(extra);
            let covered = c.bytes.max(c.ops * shape.op_size.unwrap_or(0));
            if exact_bytes {
                c.bytes = bytes;
            }
            (c, covered - extra)
        };
        Merged { charge, after: run.map(|r| r.tag), end: offset + bytes, paid: left }
    }

    /// Keeps `m` as an open run tagged `tag`.
    pub fn remember(&mut self, m: Merged<T>, tag: T) {
        self.runs.push_front(Run { end: m.end, paid: m.paid, tag });
        self.runs.truncate(RUNS);
    }
}

#[derive(Debug, Clone)]
pub struct Scheduler {
    merge: SeqMerge<Duration>,
    shape: Shape,
    iops: Option<Bucket>,
    bps: Option<Bucket>,
    op_credits: Option<Bucket>,
    byte_credits: Option<Bucket>,
}

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

fn credit_bucket(c: &Option<Credits>, now: u64) -> Option<Bucket> {
    c.map(|c| Bucket::new(c.baseline, c.capacity, c.initial, now))
}

impl Scheduler {
    pub fn new(shape: Shape, now: Duration) -> Self {
        let now = ns(now);
        Scheduler {
            merge: SeqMerge::default(),
            iops: shape.iops.map(|r| Bucket::new(r, RATE_CAP, RATE_CAP, now)),
            bps: shape.bps.map(|r| Bucket::new(r, shape.byte_cap(), shape.byte_cap(), now)),
            op_credits: credit_bucket(&shape.op_credits, now),
            byte_credits: credit_bucket(&shape.byte_credits, now),
            shape,
        }
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// Reserve service for an I/O of `bytes` submitted at `now`; returns when it
    /// completes (including the base latency). Requests complete in the order
    /// they are reserved.
    pub fn reserve(&mut self, now: Duration, _kind: IoKind, bytes: u64) -> Duration {
        self.reserve_charge(now, self.shape.charge(bytes))
    }

    /// Reserve the buckets for charge `c` (a bucket charged nothing is not
    /// asked, so a merged piece does not queue behind its operation count).
    fn reserve_charge(&mut self, now: Duration, c: Charge) -> Duration {
        let now_ns = ns(now);
        if c.ops == 0 && c.bytes == 0 {
            return now + self.shape.latency;
        }
        let mut t = now_ns;
        for (b, n) in self.buckets(c) {
            if n > 0 {
                t = t.max(b.ready(now_ns, n));
            }
        }
        for (b, n) in self.buckets_mut(c) {
            if n > 0 {
                b.take(now_ns, t, n);
            }
        }
        Duration::from_nanos(t) + self.shape.latency
    }

    /// [`Scheduler::reserve`] for an I/O at `offset`: with `merge_sequential`,
    /// an I/O continuing a recent one at its end pays only for what the merged
    /// operation does not already cover (bytes in full where they are charged
    /// exactly), and completes no earlier than it.
    pub fn reserve_at(&mut self, now: Duration, kind: IoKind, offset: u64, bytes: u64) -> Duration {
        if !self.shape.merge_sequential || bytes == 0 {
            return self.reserve(now, kind, bytes);
        }
        let m = self.merge.charge(&self.shape, offset, bytes);
        let done = self.reserve_charge(now, m.charge).max(m.after.unwrap_or_default());
        self.merge.remember(m, done);
        done
    }

    fn buckets(&self, c: Charge) -> impl Iterator<Item = (&Bucket, u64)> {
        [(&self.iops, c.ops), (&self.op_credits, c.ops), (&self.bps, c.bytes), (&self.byte_credits, c.bytes)]
            .into_iter()
            .filter_map(|(b, n)| b.as_ref().map(|b| (b, n)))
    }

    fn buckets_mut(&mut self, c: Charge) -> impl Iterator<Item = (&mut Bucket, u64)> {
        [(&mut self.iops, c.ops), (&mut self.op_credits, c.ops), (&mut self.bps, c.bytes), (&mut self.byte_credits, c.bytes)]
            .into_iter()
            .filter_map(|(b, n)| b.as_mut().map(|b| (b, n)))
    }

    /// Credits left at `now` (after all reservations so far).
    pub fn credits(&self, now: Duration) -> CreditBalance {
        let now = ns(now);
        CreditBalance {
            ops: self.op_credits.as_ref().map(|b| b.balance(now)),
            ops_capacity: self.op_credits.as_ref().map(|b| b.capacity()),
            bytes: self.byte_credits.as_ref().map(|b| b.balance(now)),
            bytes_capacity: self.byte_credits.as_ref().map(|b| b.capacity()),
        }
    }

    /// Set the credit balances (e.g. restored after a restart); `None` leaves one as is.
    pub fn set_credits(&mut self, now: Duration, ops: Option<u64>, bytes: Option<u64>) {
        let now = ns(now);
        if let (Some(b), Some(v)) = (self.op_credits.as_mut(), ops) {
            b.set_balance(now, v);
        }
        if let (Some(b), Some(v)) = (self.byte_credits.as_mut(), bytes) {
            b.set_balance(now, v);
        }
    }

    /// Live parameter change (resize, new provisioned IOPS...): rates change from
    /// `now`, credit balances carry over (clamped to the new capacity); a bucket
    /// the new shape adds starts at its `initial`.
    pub fn update(&mut self, now: Duration, shape: Shape) {
        let t = ns(now);
        fn upd(slot: &mut Option<Bucket>, rate: Option<u64>, cap: u64, initial: u64, t: u64) {
            match (slot.as_mut(), rate) {
                (Some(b), Some(r)) => b.update(t, r, cap),
                (None, Some(r)) => *slot = Some(Bucket::new(r, cap, initial, t)),
                (_, None) => *slot = None,
            }
        }
        upd(&mut self.iops, shape.iops, RATE_CAP, RATE_CAP, t);
        upd(&mut self.bps, shape.bps, shape.byte_cap(), shape.byte_cap(), t);
        let oc = shape.op_credits;
        upd(&mut self.op_credits, oc.map(|c| c.baseline), oc.map_or(0, |c| c.capacity), oc.map_or(0, |c| c.initial), t);
        let bc = shape.byte_credits;
        upd(&mut self.byte_credits, bc.map(|c| c.baseline), bc.map_or(0, |c| c.capacity), bc.map_or(0, |c| c.initial), t);
        self.shape = shape;
    }
}
