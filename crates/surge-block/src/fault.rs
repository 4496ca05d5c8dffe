//! Fault injection: a layer that wraps any device and, per rule, fails the N-th
//! (or every N-th) operation of a kind, fails with a seeded probability, adds
//! latency (through the [`Clock`]), tears a write, lies (acknowledges without
//! doing), or makes the device vanish. Peers: nbdkit's error and delay filters,
//! qemu's blkdebug.
//!
//! Rules have a one-line form, e.g.
//! `write.fail_nth=100,read.fail_prob=0.01,latency=5ms,tear_nth=3,vanish_after=1000`
//! (see [`FaultRules`] for every key), and can be replaced or changed key by key
//! while I/O runs. Counters of "N-th" rules restart when rules change.
//!
//! Injected errors carry the errno the rule names (EIO by default, or ENOSPC), are
//! counted in [`FaultStats`], logged once per kind, and never acknowledged: a
//! failed write changes nothing below (except a torn write, which by design lands
//! partly and still fails).
//!
//! `volatile` turns the layer into a process-memory write cache: writes stay in
//! memory until FLUSH (or FUA), so killing the process loses them, as a power cut
//! loses a disk's cache. With `flush.drop` as well, flushes are acknowledged
//! without draining: a deliberately broken device, for proving that `surge
//! torture` catches losses.

use crate::clock::Clock;
use crate::dev::{check_range, BlockDev, Caps, Extent, ZeroMode};
use crate::error::{BlockError, Result};
use parking_lot::{Mutex, RwLock};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::fmt;
use std::io;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// The kinds of operation rules apply to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    Read,
    Write,
    Flush,
    Discard,
    Zeroes,
}

impl OpKind {
    pub const ALL: [OpKind; 5] = [OpKind::Read, OpKind::Write, OpKind::Flush, OpKind::Discard, OpKind::Zeroes];

    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Flush => "flush",
            OpKind::Discard => "discard",
            OpKind::Zeroes => "zeroes",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn parse(s: &str) -> Option<Self> {
        OpKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

/// The errno an injected failure reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FaultErrno {
    #[default]
    Eio,
    Enospc,
}

impl FaultErrno {
    fn raw(self) -> i32 {
        match self {
            FaultErrno::Eio => libc::EIO,
            FaultErrno::Enospc => libc::ENOSPC,
        }
    }
    fn name(self) -> &'static str {
        match self {
            FaultErrno::Eio => "eio",
            FaultErrno::Enospc => "enospc",
        }
    }
}

/// Rules for one kind of operation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindRule {
    /// Fail the N-th operation of this kind (1-based, counted since rules were set).
    pub fail_nth: Option<u64>,
    /// Fail every N-th operation of this kind.
    pub fail_every: Option<u64>,
    /// Fail each operation with this probability (seeded).
    pub fail_prob: f64,
    /// Extra latency for this kind, on top of the global latency.
    pub latency: Duration,
    pub errno: FaultErrno,
    /// Acknowledge without doing it (a lying device). Not for reads.
    pub drop: bool,
    /// Busy-wait a random real time in `[0, spin)` before deciding the op's fate:
    /// widens race windows in threaded tests (real time, not the [`Clock`]).
    pub spin: Duration,
    /// Flush only, volatile mode: a failed flush loses every buffered write
    /// (Linux after a writeback error: the pages count as clean, later reads
    /// may return the old data, a later flush does not write them).
    pub fail_loses: bool,
}

impl KindRule {
    fn is_default(&self) -> bool {
        *self == KindRule::default()
    }
}

/// Every rule of a [`FaultDev`]. `FromStr`/`Display` give the one-line form:
///
/// | key | meaning |
/// |---|---|
/// | `KIND.fail_nth=N` | fail the N-th op of KIND (read, write, flush, discard, zeroes) |
/// | `KIND.fail_every=N` | fail every N-th op of KIND |
/// | `KIND.fail_prob=P` | fail each op of KIND with probability P (0..=1) |
/// | `KIND.latency=DUR` | add latency to KIND (`5ms`, `200us`, `1s`) |
/// | `KIND.errno=eio\|enospc` | errno of KIND's injected failures |
/// | `KIND.drop` | acknowledge KIND without doing it (not read) |
/// | `KIND.spin=DUR` | busy-wait a random real time below DUR before KIND (widens races; not the clock) |
/// | `flush.fail_loses` | volatile mode: a failed flush loses every buffered write (a writeback error) |
/// | `latency=DUR` | add latency to every op |
/// | `tear_nth=N` | the N-th write lands only partly (first half, sector-rounded), then fails |
/// | `vanish_after=N` | after N ops, every op fails with "device is gone" |
/// | `volatile` | hold writes in memory until FLUSH/FUA (lost if the process dies) |
/// | `seed=S` | seed of the probability rules |
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultRules {
    pub kinds: [KindRule; 5],
    pub latency: Duration,
    pub tear_nth: Option<u64>,
    pub vanish_after: Option<u64>,
    pub volatile: bool,
    pub seed: u64,
}

impl FaultRules {
    pub fn kind(&self, k: OpKind) -> &KindRule {
        &self.kinds[k.index()]
    }

    pub fn kind_mut(&mut self, k: OpKind) -> &mut KindRule {
        &mut self.kinds[k.index()]
    }

    /// Set one `key=value` (value `None` for a bare flag), as in the one-line form.
    pub fn apply(&mut self, key: &str, value: Option<&str>) -> std::result::Result<(), String> {
        let key = key.trim().to_ascii_lowercase();
        let need = |what: &str| value.map(str::trim).filter(|v| !v.is_empty()).ok_or_else(|| format!("{key} needs a value ({what})"));
        match key.as_str() {
            "latency" => self.latency = parse_duration(need("a duration like 5ms")?)?,
            "tear_nth" => self.tear_nth = parse_nth(&key, need("an operation number")?)?,
            "vanish_after" => self.vanish_after = Some(parse_u64(&key, need("an operation count")?)?),
            "volatile" => self.volatile = parse_flag(&key, value)?,
            "seed" => self.seed = parse_u64(&key, need("a number")?)?,
            _ => {
                let (kind, rule) = key.split_once('.').ok_or_else(|| unknown_key(&key))?;
                let kind = OpKind::parse(kind).ok_or_else(|| format!("{key}: unknown operation {kind:?}; known: read, write, flush, discard, zeroes"))?;
                let r = &mut self.kinds[kind.index()];
                match rule {
                    "fail_nth" => r.fail_nth = parse_nth(&key, need("an operation number")?)?,
                    "fail_every" => r.fail_every = parse_nth(&key, need("an operation count")?)?,
                    "fail_prob" => {
                        let v = need("a probability 0..1")?;
                        let p: f64 = v.parse().map_err(|_| format!("{key}={v}: not a number"))?;
                        if !(0.0..=1.0).contains(&p) {
                            return Err(format!("{key}={v}: a probability must be between 0 and 1"));
                        }
                        r.fail_prob = p;
                    }
                    "latency" => r.latency = parse_duration(need("a duration like 5ms")?)?,
                    "errno" => {
                        r.errno = match need("eio or enospc")?.to_ascii_lowercase().as_str() {
                            "eio" => FaultErrno::Eio,
                            "enospc" => FaultErrno::Enospc,
                            v => return Err(format!("{key}={v}: errno must be eio or enospc")),
                        }
                    }
                    "drop" => {
                        if kind == OpKind::Read {
                            return Err("read.drop: a read cannot be acknowledged without data; use read.fail_*".into());
                        }
                        r.drop = parse_flag(&key, value)?;
                    }
                    "spin" => r.spin = parse_duration(need("a duration like 50us")?)?,
                    "fail_loses" => {
                        if kind != OpKind::Flush {
                            return Err(format!("{key}: only a flush loses buffered writes when it fails; use flush.fail_loses"));
                        }
                        r.fail_loses = parse_flag(&key, value)?;
                    }
                    _ => return Err(unknown_key(&key)),
                }
            }
        }
        Ok(())
    }
}

fn unknown_key(key: &str) -> String {
    format!(
        "unknown fault rule {key:?}; known: KIND.fail_nth, KIND.fail_every, KIND.fail_prob, KIND.latency, KIND.errno, KIND.drop, \
         KIND.spin (KIND = read|write|flush|discard|zeroes), flush.fail_loses, latency, tear_nth, vanish_after, volatile, seed"
    )
}

fn parse_u64(key: &str, v: &str) -> std::result::Result<u64, String> {
    v.parse().map_err(|_| format!("{key}={v}: not a non-negative integer"))
}

/// An operation number: 0 switches the rule off.
fn parse_nth(key: &str, v: &str) -> std::result::Result<Option<u64>, String> {
    Ok(Some(parse_u64(key, v)?).filter(|&n| n > 0))
}

fn parse_flag(key: &str, v: Option<&str>) -> std::result::Result<bool, String> {
    match v.map(|s| s.trim().to_ascii_lowercase()).as_deref() {
        None | Some("true" | "on" | "yes" | "1") => Ok(true),
        Some("false" | "off" | "no" | "0") => Ok(false),
        Some(v) => Err(format!("{key}={v}: expected true or false")),
    }
}

/// A latency rule's duration (`5ms`, `200us`, `1.5s`, `2m`); at most an hour.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let d = crate::units::parse_duration(s)?;
    if d > Duration::from_secs(3600) {
        return Err(format!("{s:?}: latency above one hour is not a fault, it is an outage; use vanish_after"));
    }
    Ok(d)
}

fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns % 1_000_000_000 == 0 {
        format!("{}s", ns / 1_000_000_000)
    } else if ns % 1_000_000 == 0 {
        format!("{}ms", ns / 1_000_000)
    } else if ns % 1000 == 0 {
        format!("{}us", ns / 1000)
    } else {
        format!("{ns}ns")
    }
}

impl FromStr for FaultRules {
    type Err = String;

    /// Parse the one-line form; an empty string means no faults.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut rules = FaultRules::default();
        for item in s.split(',').map(str::trim) {
            if item.is_empty() {
                if s.trim().is_empty() {
                    continue;
                }
                return Err(format!("empty item in fault rules {s:?} (stray comma?)"));
            }
            match item.split_once('=') {
                Some((k, v)) => rules.apply(k, Some(v))?,
                None => rules.apply(item, None)?,
            }
        }
        Ok(rules)
    }
}

impl fmt::Display for FaultRules {
    /// The canonical one-line form; parses back to the same rules.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut items: Vec<String> = Vec::new();
        for k in OpKind::ALL {
            let r = self.kind(k);
            if r.is_default() {
                continue;
            }
            let n = k.name();
            if let Some(v) = r.fail_nth {
                items.push(format!("{n}.fail_nth={v}"));
            }
            if let Some(v) = r.fail_every {
                items.push(format!("{n}.fail_every={v}"));
            }
            if r.fail_prob > 0.0 {
                items.push(format!("{n}.fail_prob={}", r.fail_prob));
            }
            if !r.latency.is_zero() {
                items.push(format!("{n}.latency={}", format_duration(r.latency)));
            }
            if r.errno != FaultErrno::Eio {
                items.push(format!("{n}.errno={}", r.errno.name()));
            }
            if r.drop {
                items.push(format!("{n}.drop"));
            }
            if !r.spin.is_zero() {
                items.push(format!("{n}.spin={}", format_duration(r.spin)));
            }
            if r.fail_loses {
                items.push(format!("{n}.fail_loses"));
            }
        }
        if !self.latency.is_zero() {
            items.push(format!("latency={}", format_duration(self.latency)));
        }
        if let Some(v) = self.tear_nth {
            items.push(format!("tear_nth={v}"));
        }
        if let Some(v) = self.vanish_after {
            items.push(format!("vanish_after={v}"));
        }
        if self.volatile {
            items.push("volatile".into());
        }
        if self.seed != 0 {
            items.push(format!("seed={}", self.seed));
        }
        f.write_str(&items.join(","))
    }
}

/// Counters of a [`FaultDev`], cumulative over rule changes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FaultStats {
    /// Operations seen, per kind: read, write, flush, discard, zeroes.
    pub ops: [u64; 5],
    /// Failures injected, per kind.
    pub injected: [u64; 5],
    /// Operations acknowledged without being done (`KIND.drop`).
    pub dropped: u64,
    pub torn: u64,
    /// Operations refused because the device vanished.
    pub gone: u64,
    /// Errors of the device below, passed up unchanged.
    pub passthrough_errors: u64,
    pub vanished: bool,
    /// Bytes held in the volatile buffer now.
    pub buffered_bytes: u64,
    /// Buffered bytes lost by failed flushes (`flush.fail_loses`).
    pub lost_bytes: u64,
}

#[derive(Default)]
struct Counters {
    ops: [AtomicU64; 5],
    injected: [AtomicU64; 5],
    dropped: AtomicU64,
    torn: AtomicU64,
    gone: AtomicU64,
    passthrough_errors: AtomicU64,
    lost_bytes: AtomicU64,
}

/// State that restarts when rules change.
struct Active {
    rules: FaultRules,
    /// Ops per kind since the rules were set ("N-th" counts these).
    seen: [AtomicU64; 5],
    total: AtomicU64,
    rng: Mutex<StdRng>,
    /// The first injected failure of each kind is logged at warn level.
    logged: [AtomicBool; 5],
}

impl Active {
    fn new(rules: FaultRules) -> Self {
        Active {
            rng: Mutex::new(StdRng::seed_from_u64(rules.seed)),
            rules,
            seen: Default::default(),
            total: AtomicU64::new(0),
            logged: Default::default(),
        }
    }
}

/// Flush the volatile buffer on its own beyond this (a disk writes back too).
const VOLATILE_LIMIT: u64 = 64 << 20;

/// Volatile mode buffers a zeroing up to this size; a larger one drains the
/// buffer and goes below as a zeroing.
const VOLATILE_ZEROES_MAX: u64 = 1 << 20;

/// The fault-injection layer. See the module docs.
pub struct FaultDev {
    inner: Arc<dyn BlockDev>,
    clock: Arc<dyn Clock>,
    active: RwLock<Arc<Active>>,
    c: Counters,
    vanished: AtomicBool,
    /// Volatile mode: unflushed writes in arrival order.
    buffer: Mutex<Vec<(u64, Vec<u8>)>>,
    buffered: AtomicU64,
}

/// What to do with an operation, decided before it runs.
enum Verdict {
    Pass,
    Fail(FaultErrno),
    Drop,
    Tear,
    Gone,
}

impl FaultDev {
    pub fn new(inner: Arc<dyn BlockDev>, rules: FaultRules, clock: Arc<dyn Clock>) -> Self {
        FaultDev {
            inner,
            clock,
            active: RwLock::new(Arc::new(Active::new(rules))),
            c: Counters::default(),
            vanished: AtomicBool::new(false),
            buffer: Mutex::new(Vec::new()),
            buffered: AtomicU64::new(0),
        }
    }

    pub fn rules(&self) -> FaultRules {
        self.active.read().rules.clone()
    }

    /// Replace every rule; "N-th" counters restart. A vanished device stays gone
    /// unless the new rules have no `vanish_after` (then it comes back).
    pub fn set_rules(&self, rules: FaultRules) {
        if rules.vanish_after.is_none() {
            self.vanished.store(false, Relaxed);
        }
        // The buffer lock orders this switch with every write (see do_write).
        let mut b = self.buffer.lock();
        if !rules.volatile {
            // Leaving volatile mode: what was buffered must not be lost by it.
            let _ = self.drain_locked(&mut b);
        }
        *self.active.write() = Arc::new(Active::new(rules));
        drop(b);
        tracing::info!(rules = %self.rules(), "fault rules changed");
    }

    /// Change one rule (`key=value` of the one-line form), keeping the others.
    pub fn set_rule(&self, key: &str, value: Option<&str>) -> std::result::Result<(), String> {
        let mut rules = self.rules();
        rules.apply(key, value)?;
        self.set_rules(rules);
        Ok(())
    }

    pub fn stats(&self) -> FaultStats {
        let load = |a: &[AtomicU64; 5]| std::array::from_fn(|i| a[i].load(Relaxed));
        FaultStats {
            ops: load(&self.c.ops),
            injected: load(&self.c.injected),
            dropped: self.c.dropped.load(Relaxed),
            torn: self.c.torn.load(Relaxed),
            gone: self.c.gone.load(Relaxed),
            passthrough_errors: self.c.passthrough_errors.load(Relaxed),
            vanished: self.vanished.load(Relaxed),
            buffered_bytes: self.buffered.load(Relaxed),
            lost_bytes: self.c.lost_bytes.load(Relaxed),
        }
    }

    /// Count the op, sleep its latency, and decide its fate.
    fn admit(&self, kind: OpKind) -> Verdict {
        let active = self.active.read().clone();
        let rules = &active.rules;
        let i = kind.index();
        self.c.ops[i].fetch_add(1, Relaxed);
        let total = active.total.fetch_add(1, Relaxed) + 1;
        if rules.vanish_after.is_some_and(|v| total > v) {
            self.vanished.store(true, Relaxed);
        }
        if self.vanished.load(Relaxed) {
            self.c.gone.fetch_add(1, Relaxed);
            return Verdict::Gone;
        }
        let n = active.seen[i].fetch_add(1, Relaxed) + 1;
        let rule = &rules.kinds[i];
        if !rule.spin.is_zero() {
            let spin = Duration::from_nanos(active.rng.lock().gen_range(0..rule.spin.as_nanos().max(1) as u64));
            let start = std::time::Instant::now();
            while start.elapsed() < spin {
                std::hint::spin_loop();
            }
        }
        let latency = rules.latency + rule.latency;
        if !latency.is_zero() {
            self.clock.sleep_until(self.clock.now() + latency);
        }
        let fail = rule.fail_nth == Some(n)
            || rule.fail_every.is_some_and(|e| n % e == 0)
            || (rule.fail_prob > 0.0 && active.rng.lock().gen_bool(rule.fail_prob));
        if fail {
            self.c.injected[i].fetch_add(1, Relaxed);
            if !active.logged[i].swap(true, Relaxed) {
                tracing::warn!(op = kind.name(), n, rules = %rules, "fault injected (further ones of this kind logged at debug)");
            } else {
                tracing::debug!(op = kind.name(), n, "fault injected");
            }
            return Verdict::Fail(rule.errno);
        }
        if kind == OpKind::Write && rules.tear_nth == Some(n) {
            return Verdict::Tear;
        }
        if rule.drop {
            self.c.dropped.fetch_add(1, Relaxed);
            return Verdict::Drop;
        }
        Verdict::Pass
    }

    fn volatile(&self) -> bool {
        self.active.read().rules.volatile
    }

    fn injected(kind: OpKind, offset: u64, len: u64, errno: FaultErrno) -> BlockError {
        let source = io::Error::from_raw_os_error(errno.raw());
        match kind {
            OpKind::Flush => BlockError::Flush(source),
            _ => BlockError::io(kind.name(), offset, len, source),
        }
    }

    fn gone() -> BlockError {
        BlockError::Gone("fault injection: the device vanished".into())
    }

    /// Count errors from below; they go up unchanged.
    fn below<T>(&self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.c.passthrough_errors.fetch_add(1, Relaxed);
        }
        r
    }

    /// A failed flush with `flush.fail_loses`: the buffered writes are gone.
    fn lose_buffer(&self) {
        let mut b = self.buffer.lock();
        let lost: u64 = b.iter().map(|(_, d)| d.len() as u64).sum();
        b.clear();
        self.buffered.store(0, Relaxed);
        self.c.lost_bytes.fetch_add(lost, Relaxed);
    }

    /// Write the volatile buffer to the device below, oldest first.
    fn drain(&self) -> Result<()> {
        self.drain_locked(&mut self.buffer.lock())
    }

    fn drain_locked(&self, buf: &mut Vec<(u64, Vec<u8>)>) -> Result<()> {
        while !buf.is_empty() {
            let (off, data) = &buf[0];
            self.below(self.inner.write_at(data, *off, false))?;
            self.buffered.fetch_sub(data.len() as u64, Relaxed);
            buf.remove(0);
        }
        Ok(())
    }

    fn do_write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        // The mode is read under the buffer lock, which `set_rules` holds while
        // it drains and switches: a write can never land in the buffer after
        // the switch out of volatile mode (it would shadow newer writes).
        let mut b = self.buffer.lock();
        if self.volatile() && !fua {
            b.push((offset, buf.to_vec()));
            let over = self.buffered.fetch_add(buf.len() as u64, Relaxed) + buf.len() as u64 > VOLATILE_LIMIT;
            drop(b);
            return if over { self.drain() } else { Ok(()) };
        }
        if b.is_empty() {
            drop(b);
            return self.below(self.inner.write_at(buf, offset, fua));
        }
        // Straight to the device while older writes are buffered (a FUA write,
        // or rules that left volatile mode with a drain that failed): cut its
        // range out of them, so that neither reads (which overlay the buffer)
        // nor a later drain bring the older data back. A FUA write makes only
        // itself durable, as on a disk.
        self.below(self.inner.write_at(buf, offset, fua))?;
        let end = offset + buf.len() as u64;
        let mut kept = Vec::with_capacity(b.len());
        for (off, data) in b.drain(..) {
            let e = off + data.len() as u64;
            if e <= offset || off >= end {
                kept.push((off, data));
                continue;
            }
            if off < offset {
                kept.push((off, data[..(offset - off) as usize].to_vec()));
            }
            if e > end {
                kept.push((end, data[(end - off) as usize..].to_vec()));
            }
        }
        self.buffered.store(kept.iter().map(|(_, d)| d.len() as u64).sum(), Relaxed);
        *b = kept;
        Ok(())
    }
}

impl BlockDev for FaultDev {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn caps(&self) -> Caps {
        let mut caps = self.inner.caps();
        caps.volatile_cache |= self.volatile();
        caps
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let len = buf.len() as u64;
        check_range(self.size(), offset, len)?;
        match self.admit(OpKind::Read) {
            Verdict::Gone => return Err(Self::gone()),
            Verdict::Fail(e) => return Err(Self::injected(OpKind::Read, offset, len, e)),
            Verdict::Pass | Verdict::Drop | Verdict::Tear => {}
        }
        // Hold the buffer lock across the read so a concurrent drain cannot slip
        // between the device read and the overlay.
        let pending = self.buffer.lock();
        self.below(self.inner.read_at(buf, offset))?;
        for (off, data) in pending.iter() {
            let (start, end) = ((*off).max(offset), (off + data.len() as u64).min(offset + len));
            if start < end {
                buf[(start - offset) as usize..(end - offset) as usize].copy_from_slice(&data[(start - off) as usize..(end - off) as usize]);
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        let len = buf.len() as u64;
        check_range(self.size(), offset, len)?;
        match self.admit(OpKind::Write) {
            Verdict::Gone => Err(Self::gone()),
            Verdict::Fail(e) => Err(Self::injected(OpKind::Write, offset, len, e)),
            Verdict::Drop => Ok(()),
            Verdict::Tear => {
                // The first half, rounded down to a sector when there is one.
                let half = buf.len() / 2;
                let keep = if half >= 512 { half / 512 * 512 } else { half };
                self.c.torn.fetch_add(1, Relaxed);
                self.do_write(&buf[..keep], offset, true)?;
                Err(Self::injected(OpKind::Write, offset, len, FaultErrno::Eio))
            }
            Verdict::Pass => self.do_write(buf, offset, fua),
        }
    }

    fn flush(&self) -> Result<()> {
        match self.admit(OpKind::Flush) {
            Verdict::Gone => Err(Self::gone()),
            Verdict::Fail(e) => {
                if self.active.read().rules.kind(OpKind::Flush).fail_loses {
                    self.lose_buffer();
                }
                Err(Self::injected(OpKind::Flush, 0, 0, e))
            }
            Verdict::Drop => Ok(()),
            Verdict::Pass | Verdict::Tear => {
                self.drain()?;
                self.below(self.inner.flush())
            }
        }
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        check_range(self.size(), offset, len)?;
        match self.admit(OpKind::Discard) {
            Verdict::Gone => Err(Self::gone()),
            Verdict::Fail(e) => Err(Self::injected(OpKind::Discard, offset, len, e)),
            Verdict::Drop => Ok(()),
            Verdict::Pass | Verdict::Tear => {
                self.drain()?;
                self.below(self.inner.discard(offset, len))
            }
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> Result<()> {
        check_range(self.size(), offset, len)?;
        match self.admit(OpKind::Zeroes) {
            Verdict::Gone => Err(Self::gone()),
            Verdict::Fail(e) => Err(Self::injected(OpKind::Zeroes, offset, len, e)),
            Verdict::Drop => Ok(()),
            // A disk's cache holds a small zeroing like any write. Draining
            // here instead would persist every buffered write whenever one
            // arrives, and whether a lying flush is caught would hang on
            // thread timing.
            Verdict::Pass | Verdict::Tear if self.volatile() && len <= VOLATILE_ZEROES_MAX => self.do_write(&vec![0; len as usize], offset, false),
            Verdict::Pass | Verdict::Tear => {
                self.drain()?;
                self.below(self.inner.write_zeroes(offset, len, mode))
            }
        }
    }

    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        if self.vanished.load(Relaxed) {
            return Err(Self::gone());
        }
        if !self.buffer.lock().is_empty() {
            // Buffered writes are not visible below: report data, which is always true.
            check_range(self.size(), offset, len)?;
            return Ok(vec![Extent { len, kind: crate::dev::ExtentKind::Data }]);
        }
        self.below(self.inner.block_status(offset, len))
    }

    fn prefetch(&self, offset: u64, len: u64) -> Result<()> {
        if self.vanished.load(Relaxed) {
            return Err(Self::gone());
        }
        self.inner.prefetch(offset, len)
    }

    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.inner.may_wait_remote(offset, len, write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{SystemClock, VirtualClock};
    use crate::memory::MemoryDev;

    fn dev_with(rules: &str) -> (Arc<MemoryDev>, FaultDev) {
        let mem = Arc::new(MemoryDev::new(1 << 20));
        let f = FaultDev::new(mem.clone(), rules.parse().unwrap(), Arc::new(SystemClock::new()));
        (mem, f)
    }

    fn read(d: &dyn BlockDev, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        d.read_at(&mut b, off).unwrap();
        b
    }

    #[test]
    fn without_rules_the_layer_passes_conformance() {
        crate::conformance::run("fault(no rules)", |size| Arc::new(FaultDev::new(Arc::new(MemoryDev::new(size)), FaultRules::default(), Arc::new(SystemClock::new()))));
    }

    #[test]
    fn volatile_layer_passes_conformance() {
        crate::conformance::run("fault(volatile)", |size| {
            Arc::new(FaultDev::new(Arc::new(MemoryDev::new(size)), "volatile".parse().unwrap(), Arc::new(SystemClock::new())))
        });
    }

    #[test]
    fn one_line_form_round_trips() {
        let s = "write.fail_nth=100,read.fail_prob=0.01,latency=5ms,tear_nth=3,vanish_after=1000";
        let r: FaultRules = s.parse().unwrap();
        assert_eq!(r.kind(OpKind::Write).fail_nth, Some(100));
        assert_eq!(r.kind(OpKind::Read).fail_prob, 0.01);
        assert_eq!(r.latency, Duration::from_millis(5));
        assert_eq!(r.tear_nth, Some(3));
        assert_eq!(r.vanish_after, Some(1000));
        let again: FaultRules = r.to_string().parse().unwrap();
        assert_eq!(again, r);
        let all = "read.fail_every=7,flush.errno=enospc,flush.fail_nth=2,flush.spin=40us,flush.fail_loses,discard.drop,zeroes.latency=250us,volatile,seed=9";
        let r: FaultRules = all.parse().unwrap();
        assert_eq!(r.to_string().parse::<FaultRules>().unwrap(), r);
        assert_eq!("".parse::<FaultRules>().unwrap(), FaultRules::default());
    }

    #[test]
    fn bad_rules_get_clear_errors() {
        for (s, want) in [
            ("write.fail_nth=x", "not a non-negative integer"),
            ("wirte.fail_nth=1", "unknown operation \"wirte\""),
            ("write.explode=1", "unknown fault rule"),
            ("read.fail_prob=2", "between 0 and 1"),
            ("latency=5 parsecs", "unknown unit"),
            ("read.drop", "cannot be acknowledged"),
            ("write.errno=eperm", "eio or enospc"),
            ("write.fail_loses", "only a flush"),
            ("latency", "needs a value"),
            ("write.fail_nth=1,,latency=1ms", "stray comma"),
        ] {
            let e = s.parse::<FaultRules>().unwrap_err();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    #[test]
    fn fail_nth_fails_exactly_that_write_with_eio_and_changes_nothing() {
        let (mem, f) = dev_with("write.fail_nth=3");
        f.write_at(&[1; 100], 0, false).unwrap();
        f.write_at(&[2; 100], 100, false).unwrap();
        let e = f.write_at(&[3; 100], 200, false).unwrap_err();
        assert_eq!(e.errno(), libc::EIO, "{e}");
        f.write_at(&[4; 100], 300, false).unwrap();
        assert_eq!(read(mem.as_ref(), 200, 100), vec![0; 100], "the failed write must not land");
        assert_eq!(read(mem.as_ref(), 300, 100), vec![4; 100]);
        let s = f.stats();
        assert_eq!(s.ops[OpKind::Write.index()], 4);
        assert_eq!(s.injected[OpKind::Write.index()], 1);
        assert_eq!(s.injected.iter().sum::<u64>(), 1);
    }

    #[test]
    fn fail_every_and_errno_enospc() {
        let (_, f) = dev_with("flush.fail_every=2,flush.errno=enospc");
        assert!(f.flush().is_ok());
        let e = f.flush().unwrap_err();
        assert!(matches!(e, BlockError::Flush(_)));
        assert_eq!(e.errno(), libc::ENOSPC);
        assert!(f.flush().is_ok());
        assert!(f.flush().is_err());
        assert_eq!(f.stats().injected[OpKind::Flush.index()], 2);
    }

    #[test]
    fn fail_prob_is_seeded_and_roughly_right() {
        let outcomes = |seed: u64| {
            let (_, f) = dev_with(&format!("read.fail_prob=0.25,seed={seed}"));
            (0..2000).map(|_| f.read_at(&mut [0u8; 8], 0).is_err()).collect::<Vec<_>>()
        };
        let a = outcomes(5);
        assert_eq!(a, outcomes(5), "same seed, same failures");
        assert_ne!(a, outcomes(6));
        let fails = a.iter().filter(|&&x| x).count();
        assert!((400..600).contains(&fails), "{fails} failures of 2000 at p=0.25");
    }

    #[test]
    fn latency_uses_the_clock() {
        let clock = Arc::new(VirtualClock::new());
        let f = FaultDev::new(Arc::new(MemoryDev::new(4096)), "latency=5ms,write.latency=10ms".parse().unwrap(), clock.clone());
        f.read_at(&mut [0u8; 8], 0).unwrap();
        assert_eq!(clock.now(), Duration::from_millis(5));
        f.write_at(&[0u8; 8], 0, false).unwrap();
        assert_eq!(clock.now(), Duration::from_millis(20));
    }

    #[test]
    fn torn_write_lands_half_and_fails() {
        let (mem, f) = dev_with("tear_nth=2");
        f.write_at(&[1; 4096], 0, false).unwrap();
        let e = f.write_at(&[2; 4096], 0, false).unwrap_err();
        assert_eq!(e.errno(), libc::EIO);
        assert_eq!(read(mem.as_ref(), 0, 2048), vec![2; 2048]);
        assert_eq!(read(mem.as_ref(), 2048, 2048), vec![1; 2048]);
        assert_eq!(f.stats().torn, 1);
    }

    #[test]
    fn vanished_device_fails_everything_with_gone() {
        let (_, f) = dev_with("vanish_after=3");
        f.write_at(&[1; 10], 0, false).unwrap();
        f.read_at(&mut [0; 10], 0).unwrap();
        f.flush().unwrap();
        assert!(matches!(f.read_at(&mut [0; 10], 0), Err(BlockError::Gone(_))));
        assert!(matches!(f.write_at(&[0; 10], 0, false), Err(BlockError::Gone(_))));
        assert!(matches!(f.flush(), Err(BlockError::Gone(_))));
        assert!(matches!(f.discard(0, 10), Err(BlockError::Gone(_))));
        assert_eq!(f.read_at(&mut [0; 10], 0).unwrap_err().errno(), libc::EIO);
        let s = f.stats();
        assert!(s.vanished);
        assert_eq!(s.gone, 5);
        // Live change: lifting vanish_after brings it back.
        f.set_rules(FaultRules::default());
        f.read_at(&mut [0; 10], 0).unwrap();
    }

    #[test]
    fn rules_change_live_and_restart_nth_counters() {
        let (_, f) = dev_with("");
        for _ in 0..5 {
            f.write_at(&[1; 8], 0, false).unwrap();
        }
        f.set_rule("write.fail_nth", Some("2")).unwrap();
        f.write_at(&[1; 8], 0, false).unwrap();
        assert!(f.write_at(&[1; 8], 0, false).is_err(), "2nd write since the change");
        assert!(f.set_rule("write.fail_nth", Some("soon")).is_err());
        assert_eq!(f.rules().kind(OpKind::Write).fail_nth, Some(2), "a bad change keeps the old rules");
        f.set_rule("write.fail_nth", Some("0")).unwrap();
        for _ in 0..5 {
            f.write_at(&[1; 8], 0, false).unwrap();
        }
    }

    #[test]
    fn concurrent_io_under_probabilistic_faults_never_acknowledges_a_failed_write() {
        // Each thread owns a region; a write that returned Ok must read back, one
        // that failed must have left the previous value.
        let mem = Arc::new(MemoryDev::new(64 * 512));
        let f = Arc::new(FaultDev::new(mem.clone(), "write.fail_prob=0.3,read.fail_prob=0.1,seed=3".parse().unwrap(), Arc::new(SystemClock::new())));
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let f = f.clone();
                let mem = mem.clone();
                std::thread::spawn(move || {
                    let off = t as u64 * 8 * 512;
                    let mut current = 0u8;
                    for v in 1..=200u8 {
                        if f.write_at(&[v; 512], off, false).is_ok() {
                            current = v;
                        }
                        assert_eq!(read(mem.as_ref(), off, 512), vec![current; 512]);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = f.stats();
        assert!(s.injected[OpKind::Write.index()] > 300, "{s:?}");
    }

    #[test]
    fn volatile_mode_holds_writes_until_flush_and_fua_goes_through() {
        let (mem, f) = dev_with("volatile");
        f.write_at(&[1; 512], 0, false).unwrap();
        assert_eq!(read(&f, 0, 512), vec![1; 512], "reads see the cache");
        assert_eq!(read(mem.as_ref(), 0, 512), vec![0; 512], "not below yet");
        assert_eq!(f.stats().buffered_bytes, 512);
        f.write_at(&[2; 256], 256, true).unwrap();
        assert_eq!(read(mem.as_ref(), 0, 512), [vec![0; 256], vec![2; 256]].concat(), "FUA persists only itself");
        assert_eq!(read(&f, 0, 512), [vec![1; 256], vec![2; 256]].concat());
        f.write_at(&[3; 512], 512, false).unwrap();
        f.flush().unwrap();
        assert_eq!(read(mem.as_ref(), 0, 512), [vec![1; 256], vec![2; 256]].concat(), "the drain must not overwrite the FUA write");
        assert_eq!(read(mem.as_ref(), 512, 512), vec![3; 512]);
        assert_eq!(f.stats().buffered_bytes, 0);
    }

    #[test]
    fn fua_inside_a_buffered_write_splits_it() {
        let (mem, f) = dev_with("volatile");
        f.write_at(&[1; 1536], 0, false).unwrap();
        f.write_at(&[2; 512], 512, true).unwrap();
        assert_eq!(f.stats().buffered_bytes, 1024);
        assert_eq!(read(&f, 0, 1536), [vec![1; 512], vec![2; 512], vec![1; 512]].concat());
        f.flush().unwrap();
        assert_eq!(read(mem.as_ref(), 0, 1536), [vec![1; 512], vec![2; 512], vec![1; 512]].concat());
    }

    #[test]
    fn dropped_flush_leaves_volatile_writes_unpersisted() {
        let (mem, f) = dev_with("volatile,flush.drop");
        f.write_at(&[7; 512], 0, false).unwrap();
        f.flush().unwrap();
        assert_eq!(read(mem.as_ref(), 0, 512), vec![0; 512], "the lie: acknowledged, not persisted");
        assert_eq!(f.stats().dropped, 1);
    }

    #[test]
    fn volatile_mode_holds_small_zeroings_and_a_dropped_flush_loses_them() {
        let (mem, f) = dev_with("volatile,flush.drop");
        mem.write_at(&[5; 4096], 0, false).unwrap();
        f.write_zeroes(0, 512, ZeroMode::default()).unwrap();
        assert_eq!(read(&f, 0, 512), vec![0; 512], "reads see the cache");
        f.flush().unwrap();
        assert_eq!(read(mem.as_ref(), 0, 512), vec![5; 512], "held, and the lying flush leaves it unpersisted");
        let big = VOLATILE_ZEROES_MAX + 512;
        let mem = Arc::new(MemoryDev::new(4 << 20));
        let f = FaultDev::new(mem.clone(), "volatile".parse().unwrap(), Arc::new(SystemClock::new()));
        f.write_at(&[7; 512], 0, false).unwrap();
        f.write_zeroes(512, big, ZeroMode::default()).unwrap();
        assert_eq!(read(mem.as_ref(), 0, 512), vec![7; 512], "a large zeroing drains what was buffered before it");
        assert_eq!(f.stats().buffered_bytes, 0);
    }

    #[test]
    fn a_failed_flush_with_fail_loses_loses_the_buffered_writes() {
        let (mem, f) = dev_with("volatile,flush.fail_nth=1,flush.fail_loses");
        f.write_at(&[7; 512], 0, false).unwrap();
        assert!(f.flush().is_err());
        assert_eq!(read(&f, 0, 512), vec![0; 512], "after the failed flush the write is gone, as after a writeback error");
        f.flush().unwrap();
        assert_eq!(read(mem.as_ref(), 0, 512), vec![0; 512], "a later flush does not bring it back");
        assert_eq!((f.stats().lost_bytes, f.stats().buffered_bytes), (512, 0));
        // Without the flag a failed flush keeps the buffer for the next one.
        let (mem, f) = dev_with("volatile,flush.fail_nth=1");
        f.write_at(&[7; 512], 0, false).unwrap();
        assert!(f.flush().is_err());
        f.flush().unwrap();
        assert_eq!(read(mem.as_ref(), 0, 512), vec![7; 512]);
    }

    /// Writers racing live switches in and out of volatile mode: a write that
    /// returned never reads back older data (a write buffered just after the
    /// switch out of volatile mode used to shadow every later one).
    #[test]
    fn switching_volatile_mode_while_writes_run_never_shadows_a_newer_write() {
        let (_, f) = dev_with("volatile");
        let f = Arc::new(f);
        let stop = Arc::new(AtomicBool::new(false));
        let toggler = std::thread::spawn({
            let (f, stop) = (f.clone(), stop.clone());
            move || {
                let mut on = false;
                while !stop.load(Relaxed) {
                    f.set_rules(if on { "volatile" } else { "" }.parse().unwrap());
                    on = !on;
                }
            }
        });
        let writers: Vec<_> = (0..2u64)
            .map(|t| {
                let f = f.clone();
                std::thread::spawn(move || {
                    for v in 1..=100_000u32 {
                        let data = [(v % 251) as u8 + 1; 512];
                        f.write_at(&data, t * 512, false).unwrap();
                        assert_eq!(read(f.as_ref(), t * 512, 512), data.to_vec(), "writer {t}, write {v}: an older write shadows it");
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Relaxed);
        toggler.join().unwrap();
    }

    #[test]
    fn spin_waits_in_real_time_and_leaves_the_clock_alone() {
        let clock = Arc::new(VirtualClock::new());
        let f = FaultDev::new(Arc::new(MemoryDev::new(4096)), "flush.spin=2ms,seed=4".parse().unwrap(), clock.clone());
        let start = std::time::Instant::now();
        for _ in 0..20 {
            f.flush().unwrap();
        }
        assert!(start.elapsed() >= Duration::from_millis(5), "20 random spins below 2 ms: {:?}", start.elapsed());
        assert_eq!(clock.now(), Duration::ZERO);
    }

    #[test]
    fn dropped_writes_are_acknowledged_but_absent() {
        let (mem, f) = dev_with("write.drop");
        f.write_at(&[7; 512], 0, false).unwrap();
        assert_eq!(read(mem.as_ref(), 0, 512), vec![0; 512]);
    }

    #[test]
    fn errors_below_pass_through_counted() {
        let inner = Arc::new(FaultDev::new(Arc::new(MemoryDev::new(4096)), "read.fail_nth=1,read.errno=enospc".parse().unwrap(), Arc::new(SystemClock::new())));
        let outer = FaultDev::new(inner, FaultRules::default(), Arc::new(SystemClock::new()));
        assert_eq!(outer.read_at(&mut [0; 8], 0).unwrap_err().errno(), libc::ENOSPC);
        assert_eq!(outer.stats().passthrough_errors, 1);
        assert_eq!(outer.stats().injected, [0; 5]);
    }
}

/// The fault layer applied to the other layers: errors from below must surface
/// with their errno, never be acknowledged, never be retried forever, and never
/// make a layer serve stale data.
#[cfg(test)]
mod layer_tests {
    use super::*;
    use crate::cache::{CacheConfig, CacheMode, ElasticCache};
    use crate::clock::VirtualClock;
    use crate::memory::MemoryDev;

    const BS: u64 = 4096;

    fn faulty(size: u64) -> Arc<FaultDev> {
        Arc::new(FaultDev::new(Arc::new(MemoryDev::new(size)), FaultRules::default(), Arc::new(VirtualClock::new())))
    }

    fn cache_over(backing: Arc<dyn BlockDev>, cache_dev: Arc<dyn BlockDev>, mode: CacheMode) -> ElasticCache {
        let cfg = CacheConfig { block_size: BS, mode, flush_batch: 4, ..CacheConfig::default() };
        let c = ElasticCache::new(backing, cfg, Arc::new(VirtualClock::new()));
        c.attach(cache_dev).unwrap();
        c
    }

    fn read(d: &dyn BlockDev, off: u64) -> Vec<u8> {
        let mut b = vec![0u8; BS as usize];
        d.read_at(&mut b, off).unwrap();
        b
    }

    fn rules(s: &str) -> FaultRules {
        s.parse().unwrap()
    }

    #[test]
    fn writethrough_cache_surfaces_backing_write_errors_and_keeps_old_data() {
        let backing = faulty(1 << 20);
        let cache = cache_over(backing.clone(), Arc::new(MemoryDev::new(2 * 4096 + 8 * BS)), CacheMode::WriteThrough);
        cache.write_at(&[1; BS as usize], 0, false).unwrap();
        backing.set_rules(rules("write.fail_every=1,write.errno=enospc"));
        let e = cache.write_at(&[2; BS as usize], 0, false).unwrap_err();
        assert_eq!(e.errno(), libc::ENOSPC, "{e}");
        assert_eq!(read(&cache, 0), vec![1; BS as usize], "a failed write must not change what reads return");
        assert_eq!(backing.stats().injected[OpKind::Write.index()], 1);
    }

    #[test]
    fn writeback_cache_keeps_dirty_data_while_backing_fails_and_drains_after() {
        let backing = faulty(1 << 20);
        let cache = cache_over(backing.clone(), Arc::new(MemoryDev::new(2 * 4096 + 8 * BS)), CacheMode::WriteBack);
        cache.write_at(&[7; BS as usize], 0, false).unwrap();
        cache.flush().unwrap();
        backing.set_rules(rules("write.fail_every=1"));
        // Must fail (not spin, not detach, not drop the dirty block).
        let e = cache.drain_and_detach().err().expect("drain must fail while backing writes fail");
        assert!(e.to_string().contains("write"), "{e}");
        assert!(cache.is_attached());
        assert_eq!(cache.stats().dirty_bytes, BS);
        assert_eq!(read(&cache, 0), vec![7; BS as usize]);
        backing.set_rules(FaultRules::default());
        cache.drain_and_detach().unwrap();
        assert_eq!(read(backing.as_ref(), 0), vec![7; BS as usize], "drained after the backing recovered");
    }

    #[test]
    fn vanished_cache_device_never_serves_stale_backing_data() {
        let backing = faulty(1 << 20);
        let cache_dev = faulty(2 * 4096 + 8 * BS);
        let cache = cache_over(backing.clone(), cache_dev.clone(), CacheMode::WriteBack);
        cache.write_at(&[7; BS as usize], 0, false).unwrap();
        cache.flush().unwrap();
        cache_dev.set_rules(rules("vanish_after=0"));
        // The only copy of block 0 is on the vanished device: an error, or the
        // data, but never the stale zeroes of the backing volume.
        let mut b = vec![0u8; BS as usize];
        if cache.read_at(&mut b, 0).is_ok() {
            assert_eq!(b, vec![7; BS as usize], "stale backing data served after the cache device vanished");
        }
        // New writes: an error, or acknowledged and then durable and readable.
        if cache.write_at(&[9; BS as usize], 8 * BS, false).is_ok() && cache.flush().is_ok() {
            assert_eq!(read(&cache, 8 * BS), vec![9; BS as usize]);
        }
    }

    #[test]
    fn counted_layer_counts_errors_from_below() {
        let below = faulty(1 << 20);
        below.set_rules(rules("read.fail_nth=1,flush.fail_nth=1"));
        let c = crate::counted::Counted::new(below.clone());
        assert_eq!(c.read_at(&mut [0; 8], 0).unwrap_err().errno(), libc::EIO);
        assert!(c.flush().is_err());
        c.flush().unwrap();
        let s = c.stats();
        assert_eq!((s.errors, s.reads, s.flushes), (2, 0, 1));
    }

    #[test]
    fn file_device_below_a_fault_layer_sees_no_torn_write_as_success() {
        let dir = tempfile::tempdir().unwrap();
        let file = Arc::new(crate::file::FileDev::create(dir.path().join("f.img"), 1 << 20).unwrap());
        let f = FaultDev::new(file.clone(), rules("tear_nth=1"), Arc::new(VirtualClock::new()));
        assert!(f.write_at(&[5; 8192], 0, false).is_err(), "a torn write is reported as failed");
        assert_eq!(read(file.as_ref(), 0), vec![5; BS as usize], "first half landed");
        assert_eq!(read(file.as_ref(), BS), vec![0; BS as usize], "second half did not");
    }
}
