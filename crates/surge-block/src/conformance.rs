//! The shared conformance suite: random operation sequences run against a device
//! and a byte-exact reference model. Every layer runs it (`run`), with unaligned
//! and boundary requests, including ones past the end that must fail cleanly and
//! change nothing.
//!
//! Use from another crate's tests with the `conformance` feature:
//! `surge_block::conformance::run("my-layer", |size| Arc::new(MyLayer::new(..)))`.
//! `SURGE_CONFORMANCE_CASES` sets the number of sequences (default 48).

use crate::dev::{BlockDev, ZeroMode};
use crate::error::BlockError;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use std::sync::Arc;

/// One request of a sequence. Offsets may point past the end on purpose.
#[derive(Debug, Clone)]
pub enum Op {
    Read { offset: u64, len: u64 },
    Write { offset: u64, len: u64, seed: u8, fua: bool },
    Flush,
    Discard { offset: u64, len: u64 },
    WriteZeroes { offset: u64, len: u64, may_trim: bool },
}

/// What the device must contain: `None` where a discard left the contents undefined.
#[derive(Debug, Clone)]
pub struct Model {
    pub bytes: Vec<Option<u8>>,
}

impl Model {
    pub fn new(size: u64) -> Self {
        Model { bytes: vec![Some(0); size as usize] }
    }

    pub fn size(&self) -> u64 {
        self.bytes.len() as u64
    }

    pub fn in_range(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.size())
    }

    /// Apply a successful op to the model.
    pub fn apply(&mut self, op: &Op) {
        match *op {
            Op::Write { offset, len, seed, .. } => {
                let data = pattern(seed, offset, len);
                for (i, b) in data.into_iter().enumerate() {
                    self.bytes[offset as usize + i] = Some(b);
                }
            }
            Op::Discard { offset, len } => self.bytes[offset as usize..(offset + len) as usize].fill(None),
            Op::WriteZeroes { offset, len, .. } => self.bytes[offset as usize..(offset + len) as usize].fill(Some(0)),
            Op::Read { .. } | Op::Flush => {}
        }
    }

    /// First byte of `got` (read at `offset`) that contradicts the model.
    pub fn mismatch(&self, offset: u64, got: &[u8]) -> Option<(u64, u8, u8)> {
        got.iter().enumerate().find_map(|(i, &g)| match self.bytes[offset as usize + i] {
            Some(want) if want != g => Some((offset + i as u64, want, g)),
            _ => None,
        })
    }
}

/// Deterministic data for a write: depends on seed and absolute position, so a
/// misplaced write is caught.
pub fn pattern(seed: u8, offset: u64, len: u64) -> Vec<u8> {
    (offset..offset + len)
        .map(|p| (p.wrapping_mul(31) ^ (p >> 8) ^ seed as u64).wrapping_add(seed as u64 * 7) as u8 | 1)
        .collect()
}

/// Run one op against the device and the model; error if they disagree.
pub fn check_op(dev: &dyn BlockDev, model: &mut Model, op: &Op) -> Result<(), String> {
    let (offset, len) = match *op {
        Op::Read { offset, len } | Op::Discard { offset, len } | Op::WriteZeroes { offset, len, .. } => (offset, len),
        Op::Write { offset, len, .. } => (offset, len),
        Op::Flush => (0, 0),
    };
    let result = match *op {
        Op::Read { .. } => {
            let mut buf = vec![0xAAu8; len as usize];
            let r = dev.read_at(&mut buf, offset);
            if r.is_ok() {
                if let Some((at, want, got)) = model.mismatch(offset, &buf) {
                    return Err(format!("{op:?}: byte {at} is {got:#x}, model says {want:#x}"));
                }
            }
            r
        }
        Op::Write { seed, fua, .. } => dev.write_at(&pattern(seed, offset, len), offset, fua),
        Op::Flush => dev.flush(),
        Op::Discard { .. } => dev.discard(offset, len),
        Op::WriteZeroes { may_trim, .. } => dev.write_zeroes(offset, len, ZeroMode { may_trim, fast_only: false }),
    };
    match (result, model.in_range(offset, len)) {
        (Ok(()), true) => {
            model.apply(op);
            Ok(())
        }
        (Err(BlockError::OutOfRange { .. }), false) => Ok(()),
        (Ok(()), false) => Err(format!("{op:?} past the end (size {}) succeeded", model.size())),
        (Err(e), _) => Err(format!("{op:?} failed: {e}")),
    }
}

/// Read the whole device and compare with the model.
pub fn check_all(dev: &dyn BlockDev, model: &Model) -> Result<(), String> {
    let mut buf = vec![0u8; model.size() as usize];
    dev.read_at(&mut buf, 0).map_err(|e| format!("full read failed: {e}"))?;
    match model.mismatch(0, &buf) {
        Some((at, want, got)) => Err(format!("final read: byte {at} is {got:#x}, model says {want:#x}")),
        None => Ok(()),
    }
}

/// Offsets and lengths that favour boundaries: block edges, the device end, past it.
fn extent(size: u64) -> impl Strategy<Value = (u64, u64)> {
    let edge = prop_oneof![
        Just(0u64),
        Just(size),
        Just(size.saturating_sub(1)),
        (0..=size / 4096).prop_map(|b| b * 4096),
        0..=size,
        size..size + 8192,
    ];
    let len = prop_oneof![Just(0u64), 1u64..600, (1u64..40).prop_map(|b| b * 4096), 1u64..70_000];
    (edge, len).prop_map(move |(o, l)| {
        // Mostly in range: clamp three out of four long requests to the end.
        if o < size && o + l > size && l % 4 != 0 {
            (o, size - o)
        } else {
            (o, l)
        }
    })
}

pub fn op_strategy(size: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => extent(size).prop_map(|(offset, len)| Op::Read { offset, len }),
        5 => (extent(size), any::<u8>(), any::<bool>()).prop_map(|((offset, len), seed, fua)| Op::Write { offset, len, seed, fua }),
        1 => Just(Op::Flush),
        1 => extent(size).prop_map(|(offset, len)| Op::Discard { offset, len }),
        1 => (extent(size), any::<bool>()).prop_map(|((offset, len), may_trim)| Op::WriteZeroes { offset, len, may_trim }),
    ]
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![Just(512u64), Just(4096 * 3), Just(256 * 1024), 1u64..300_000]
}

pub fn cases() -> u32 {
    std::env::var("SURGE_CONFORMANCE_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48)
}

/// Run the suite against devices made by `make(size)`. Panics with the shrunk
/// failing sequence on the first disagreement.
pub fn run(name: &str, make: impl Fn(u64) -> Arc<dyn BlockDev>) {
    run_with_contents(name, |size| vec![0; size as usize], |size, _| make(size));
}

/// Like [`run`], for devices that start with contents of their own (a
/// copy-on-write layer over a base image): `contents(size)` gives the initial
/// bytes, `make(size, &contents)` a device that reads exactly them.
pub fn run_with_contents(name: &str, contents: impl Fn(u64) -> Vec<u8>, make: impl Fn(u64, &[u8]) -> Arc<dyn BlockDev>) {
    let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    let strategy = size_strategy().prop_flat_map(|size| (Just(size), proptest::collection::vec(op_strategy(size), 1..60)));
    let result = runner.run(&strategy, |(size, ops)| {
        let initial = contents(size);
        let dev = make(size, &initial);
        prop_assert_eq!(dev.size(), size);
        let mut model = Model { bytes: initial.into_iter().map(Some).collect() };
        for op in &ops {
            check_op(dev.as_ref(), &mut model, op).map_err(TestCaseError::fail)?;
        }
        check_all(dev.as_ref(), &model).map_err(TestCaseError::fail)?;
        Ok(())
    });
    if let Err(e) = result {
        panic!("{name}: conformance failed: {e}");
    }
}

/// What may be read after a crash: per byte, the value at the last acknowledged
/// FLUSH (None: anything, after a discard), or any value written since (an
/// unflushed or unacknowledged write may or may not have reached the medium).
/// Feed it every op in order: [`CrashModel::acked`] for successful ones,
/// [`CrashModel::maybe`] for failed or interrupted ones.
#[derive(Debug, Clone)]
pub struct CrashModel {
    durable: Vec<Option<u8>>,
    current: Vec<Option<u8>>,
    since: Vec<Vec<u8>>,
    /// Every completed write is durable (a process crash over devices without
    /// a volatile cache): acknowledged writes count as flushed.
    writes_durable: bool,
}

impl CrashModel {
    /// A device of `size` zero bytes where only FLUSH (and FUA) makes data durable.
    pub fn new(size: u64) -> Self {
        CrashModel { durable: vec![Some(0); size as usize], current: vec![Some(0); size as usize], since: vec![vec![]; size as usize], writes_durable: false }
    }

    /// A device where every acknowledged write survives the crash.
    pub fn every_ack_durable(size: u64) -> Self {
        CrashModel { writes_durable: true, ..Self::new(size) }
    }

    /// Start from known contents (all durable).
    pub fn with_contents(bytes: &[u8], writes_durable: bool) -> Self {
        let v: Vec<Option<u8>> = bytes.iter().map(|&b| Some(b)).collect();
        CrashModel { durable: v.clone(), current: v, since: vec![vec![]; bytes.len()], writes_durable }
    }

    fn range(op: &Op) -> Option<(u64, u64)> {
        match *op {
            Op::Write { offset, len, .. } | Op::WriteZeroes { offset, len, .. } | Op::Discard { offset, len } => Some((offset, len)),
            _ => None,
        }
    }

    /// The op may have been (partly) applied.
    pub fn maybe(&mut self, op: &Op) {
        let Some((offset, len)) = Self::range(op) else { return };
        if offset.checked_add(len).is_none_or(|e| e > self.durable.len() as u64) {
            return;
        }
        let data: Vec<Option<u8>> = match *op {
            Op::Write { seed, .. } => pattern(seed, offset, len).into_iter().map(Some).collect(),
            Op::WriteZeroes { .. } => vec![Some(0); len as usize],
            _ => vec![None; len as usize],
        };
        for (i, v) in data.into_iter().enumerate() {
            let p = offset as usize + i;
            match v {
                Some(v) => self.since[p].push(v),
                None => self.durable[p] = None,
            }
            self.current[p] = v;
        }
    }

    /// The op succeeded.
    pub fn acked(&mut self, op: &Op) {
        match *op {
            Op::Flush => self.settle(0, self.durable.len() as u64),
            Op::Write { offset, len, fua, .. } if offset + len <= self.durable.len() as u64 => {
                self.maybe(op);
                if fua || self.writes_durable {
                    self.settle(offset, len);
                }
            }
            _ => {
                self.maybe(op);
                if let (Some((offset, len)), true) = (Self::range(op), self.writes_durable) {
                    if offset + len <= self.durable.len() as u64 {
                        self.settle(offset, len);
                    }
                }
            }
        }
    }

    fn settle(&mut self, offset: u64, len: u64) {
        for p in offset as usize..(offset + len) as usize {
            self.durable[p] = self.current[p];
            self.since[p].clear();
        }
    }

    /// First byte of a full read that no crash could have left there.
    pub fn check(&self, got: &[u8]) -> Result<(), String> {
        for (p, &g) in got.iter().enumerate() {
            let ok = match self.durable[p] {
                None => true,
                Some(d) => d == g || self.since[p].contains(&g),
            };
            if !ok {
                return Err(format!("byte {p} is {g:#x}; durable {:?}, written since {:?}", self.durable[p], self.since[p]));
            }
        }
        Ok(())
    }
}
