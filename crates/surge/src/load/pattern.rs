//! What each job of `surge load` does, decided before it runs: the sequence
//! of (offset, length, tag) of its I/Os, the bytes each write carries, and
//! for writes, which bytes the volume must hold afterwards.
//!
//! Everything follows from the configuration and the seed, so a harness can
//! check a volume without keeping a copy: [`Expected`] replays the writes
//! (last writer wins) into a map of extents, and [`fill`] regenerates any
//! byte. A write's bytes depend on its tag and on their own position, so data
//! written to the wrong place or left stale by a lost write does not match.

use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

/// The order of a job's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    /// Sequential writes through the job's region (cyclic).
    Write,
    /// Uniformly random writes in the job's region.
    Randwrite,
    /// Sequential reads.
    Read,
    /// Uniformly random reads.
    Randread,
}

impl Rw {
    pub fn writes(self) -> bool {
        matches!(self, Rw::Write | Rw::Randwrite)
    }
    pub fn random(self) -> bool {
        matches!(self, Rw::Randwrite | Rw::Randread)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Rw::Write => "write",
            Rw::Randwrite => "randwrite",
            Rw::Read => "read",
            Rw::Randread => "randread",
        }
    }
}

/// Request sizes and their weights (`4k/70:8k/20:16k/10`, fio's `bssplit`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Sizes(pub Vec<(u64, u32)>);

impl Sizes {
    pub fn one(bs: u64) -> Self {
        Sizes(vec![(bs, 100)])
    }
    pub fn min(&self) -> u64 {
        self.0.iter().map(|x| x.0).min().unwrap_or(0)
    }
    pub fn max(&self) -> u64 {
        self.0.iter().map(|x| x.0).max().unwrap_or(0)
    }
    fn pick(&self, rng: &mut impl Rng) -> u64 {
        if self.0.len() == 1 {
            return self.0[0].0;
        }
        let total: u32 = self.0.iter().map(|x| x.1).sum();
        let mut r = rng.gen_range(0..total);
        for &(s, p) in &self.0 {
            if r < p {
                return s;
            }
            r -= p;
        }
        self.0[self.0.len() - 1].0
    }
}

impl std::str::FromStr for Sizes {
    type Err = String;
    /// `4k` or `4k/70:8k/20:16k/10` (weights are relative, fio's bssplit).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut v = Vec::new();
        for part in s.split(':') {
            let (size, w) = match part.split_once('/') {
                Some((a, b)) => (a, b.trim().parse::<u32>().map_err(|_| format!("{part:?}: the weight after / must be a whole number"))?),
                None => (part, 100),
            };
            let size = surge_block::units::parse_size(size).map_err(|e| format!("{part:?}: {e}"))?;
            if size == 0 || size % 512 != 0 {
                return Err(format!("{part:?}: request sizes must be positive multiples of 512 bytes"));
            }
            if size > super::MAX_REQUEST {
                return Err(format!("{part:?}: at most {} per request", surge_block::units::format_size(super::MAX_REQUEST)));
            }
            if w > 0 {
                v.push((size, w));
            }
        }
        if v.is_empty() {
            return Err(format!("{s:?}: no request size with a positive weight"));
        }
        Ok(Sizes(v))
    }
}

impl std::fmt::Display for Sizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(s, w)| format!("{s}/{w}")).collect();
        f.write_str(&parts.join(":"))
    }
}

/// One I/O of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    pub offset: u64,
    pub len: u64,
    /// What the bytes of a write are made from (unique per job and index).
    pub tag: u64,
}

/// The region and order of one job's I/Os.
#[derive(Debug, Clone)]
pub struct JobPattern {
    pub rw: Rw,
    pub sizes: Sizes,
    pub align: u64,
    /// The job's region: `[start, start + len)`.
    pub start: u64,
    pub len: u64,
    pub seed: u64,
    pub job: u32,
}

/// A 64-bit mix (SplitMix64's finaliser): neighbouring inputs give unrelated outputs.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The bytes a write with `tag` puts at `offset..offset + buf.len()`
/// (`offset` and the length multiples of 8).
pub fn fill(tag: u64, offset: u64, buf: &mut [u8]) {
    debug_assert!(offset % 8 == 0 && buf.len() % 8 == 0);
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&mix(tag ^ (offset + 8 * i as u64)).to_le_bytes());
    }
}

impl JobPattern {
    /// The job's I/Os in order, endless (sequential ones wrap around the region).
    pub fn ops(&self) -> Ops {
        Ops { p: self.clone(), rng: rand::rngs::StdRng::seed_from_u64(mix(self.seed ^ ((self.job as u64 + 1) << 40))), pos: 0, index: 0 }
    }
}

/// Iterator over a job's I/Os.
pub struct Ops {
    p: JobPattern,
    rng: rand::rngs::StdRng,
    pos: u64,
    index: u64,
}

impl Iterator for Ops {
    type Item = Op;
    fn next(&mut self) -> Option<Op> {
        let p = &self.p;
        let len = p.sizes.pick(&mut self.rng).min(p.len);
        let rel = if p.rw.random() {
            let slots = (p.len - len) / p.align + 1;
            self.rng.gen_range(0..slots) * p.align
        } else {
            if self.pos + len > p.len {
                self.pos = 0;
            }
            let at = self.pos;
            self.pos += len;
            at
        };
        let tag = mix(p.seed ^ mix(((p.job as u64) << 48) ^ self.index));
        self.index += 1;
        Some(Op { offset: p.start + rel, len, tag })
    }
}

/// What a volume holds after a set of writes: extents `start -> (end, tag)`,
/// the last write to a byte winning. Bytes never written are not checked.
#[derive(Debug, Default, Clone)]
pub struct Expected {
    map: BTreeMap<u64, (u64, u64)>,
}

impl Expected {
    /// The writes of the first `ios` I/Os of each job (`(pattern, ios)`), in
    /// issue order within a job. Jobs' regions must not overlap (their
    /// relative order is not fixed); checked.
    pub fn of(jobs: &[(JobPattern, u64)]) -> Result<Expected, String> {
        let mut spans: Vec<(u64, u64)> = jobs.iter().filter(|(p, n)| *n > 0 && p.rw.writes()).map(|(p, _)| (p.start, p.start + p.len)).collect();
        spans.sort_unstable();
        if spans.windows(2).any(|w| w[1].0 < w[0].1) {
            return Err("jobs' regions overlap: what they leave behind depends on timing, so it cannot be checked".into());
        }
        let mut e = Expected::default();
        for (p, n) in jobs.iter().filter(|(p, _)| p.rw.writes()) {
            for op in p.ops().take(*n as usize) {
                e.write(op);
            }
        }
        Ok(e)
    }

    /// Record a write (it replaces whatever it overlaps).
    pub fn write(&mut self, op: Op) {
        let (s, e) = (op.offset, op.offset + op.len);
        // An extent starting before s that reaches into [s, e): keep its head (and tail).
        if let Some((&ps, &(pe, pt))) = self.map.range(..s).next_back() {
            if pe > s {
                self.map.insert(ps, (s, pt));
                if pe > e {
                    self.map.insert(e, (pe, pt));
                }
            }
        }
        let inside: Vec<u64> = self.map.range(s..e).map(|(&k, _)| k).collect();
        for k in inside {
            let (ke, kt) = self.map.remove(&k).expect("present");
            if ke > e {
                self.map.insert(e, (ke, kt));
            }
        }
        self.map.insert(s, (e, op.tag));
    }

    /// Bytes covered.
    pub fn bytes(&self) -> u64 {
        self.map.iter().map(|(s, (e, _))| e - s).sum()
    }

    /// Extents in order: (start, end, tag).
    pub fn extents(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.map.iter().map(|(&s, &(e, t))| (s, e, t))
    }

    /// Read every written byte with `read(offset, buf)` and compare; bytes checked.
    pub fn check(&self, mut read: impl FnMut(u64, &mut [u8]) -> anyhow::Result<()>) -> anyhow::Result<u64> {
        const PIECE: u64 = 1 << 20;
        let mut got = vec![0u8; PIECE as usize];
        let mut want = vec![0u8; PIECE as usize];
        let mut n = 0;
        for (s, e, tag) in self.extents() {
            let mut off = s;
            while off < e {
                let l = (e - off).min(PIECE) as usize;
                read(off, &mut got[..l])?;
                fill(tag, off, &mut want[..l]);
                if let Some(i) = (0..l).find(|&i| got[i] != want[i]) {
                    anyhow::bail!("byte {} differs from what the last write there (tag {tag:#x}) put: read {:#04x}, expected {:#04x}", off + i as u64, got[i], want[i]);
                }
                off += l as u64;
                n += l as u64;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pat(rw: Rw, sizes: &str, len: u64) -> JobPattern {
        JobPattern { rw, sizes: sizes.parse().unwrap(), align: 4096, start: 1 << 20, len, seed: 7, job: 0 }
    }

    #[test]
    fn sequential_writes_walk_the_region_and_wrap() {
        let ops: Vec<Op> = pat(Rw::Write, "64k", 192 << 10).ops().take(4).collect();
        let offs: Vec<u64> = ops.iter().map(|o| o.offset - (1 << 20)).collect();
        assert_eq!(offs, vec![0, 64 << 10, 128 << 10, 0]);
        assert!(ops.iter().all(|o| o.len == 64 << 10));
        assert_ne!(ops[0].tag, ops[3].tag, "a rewrite carries new bytes");
    }

    #[test]
    fn random_offsets_stay_aligned_inside_the_region() {
        let p = pat(Rw::Randwrite, "4k/70:8k/20:16k/10", 1 << 20);
        let mut seen = std::collections::BTreeMap::new();
        for o in p.ops().take(10_000) {
            assert_eq!(o.offset % 4096, 0);
            assert!(o.offset >= p.start && o.offset + o.len <= p.start + p.len, "{o:?}");
            *seen.entry(o.len).or_insert(0u32) += 1;
        }
        // bssplit weights 70/20/10, within a few per cent.
        assert!((6_600..7_400).contains(&seen[&4096]), "{seen:?}");
        assert!((1_700..2_300).contains(&seen[&8192]), "{seen:?}");
    }

    #[test]
    fn the_same_seed_gives_the_same_ops_and_another_job_others() {
        let p = pat(Rw::Randwrite, "4k", 1 << 20);
        let a: Vec<Op> = p.ops().take(100).collect();
        assert_eq!(a, p.ops().take(100).collect::<Vec<_>>());
        let q = JobPattern { job: 1, ..p };
        assert_ne!(a, q.ops().take(100).collect::<Vec<_>>());
    }

    #[test]
    fn sizes_parse_like_fio_bssplit_and_reject_nonsense() {
        assert_eq!("4k/70:8k/20:16k/10".parse::<Sizes>().unwrap().0, vec![(4096, 70), (8192, 20), (16384, 10)]);
        assert_eq!("256KiB".parse::<Sizes>().unwrap(), Sizes::one(256 << 10));
        for bad in ["", "0", "100", "4k/x", "4k/0", "64MiB", "4k/70:"] {
            assert!(bad.parse::<Sizes>().is_err(), "{bad}");
        }
    }

    #[test]
    fn expected_keeps_the_last_write_of_each_byte() {
        let mut e = Expected::default();
        e.write(Op { offset: 0, len: 100, tag: 1 });
        e.write(Op { offset: 40, len: 20, tag: 2 });
        e.write(Op { offset: 90, len: 20, tag: 3 });
        let x: Vec<_> = e.extents().collect();
        assert_eq!(x, vec![(0, 40, 1), (40, 60, 2), (60, 90, 1), (90, 110, 3)]);
        assert_eq!(e.bytes(), 110);
    }

    #[test]
    fn a_check_fails_on_a_stale_or_misplaced_byte() {
        let p = pat(Rw::Randwrite, "4k/50:8k/50", 64 << 10);
        let e = Expected::of(&[(p.clone(), 200)]).unwrap();
        let mut vol = vec![0u8; (2 << 20) as usize];
        for o in p.ops().take(200) {
            fill(o.tag, o.offset, &mut vol[o.offset as usize..(o.offset + o.len) as usize]);
        }
        fn read(vol: &[u8]) -> impl FnMut(u64, &mut [u8]) -> anyhow::Result<()> + '_ {
            move |off, b| {
                b.copy_from_slice(&vol[off as usize..off as usize + b.len()]);
                Ok(())
            }
        }
        assert_eq!(e.check(read(&vol)).unwrap(), e.bytes());
        // The 200th write lost: its bytes are the older ones.
        let mut lost = vec![0u8; vol.len()];
        for o in p.ops().take(199) {
            fill(o.tag, o.offset, &mut lost[o.offset as usize..(o.offset + o.len) as usize]);
        }
        assert!(e.check(read(&lost)).is_err());
        // Misplaced by one page: wrong bytes too.
        let mut moved = vol.clone();
        moved.rotate_right(4096);
        assert!(e.check(read(&moved)).is_err());
    }

    #[test]
    fn overlapping_jobs_cannot_be_checked() {
        let a = pat(Rw::Write, "4k", 1 << 20);
        let b = JobPattern { job: 1, start: a.start + 4096, ..a.clone() };
        assert!(Expected::of(&[(a.clone(), 10), (b, 10)]).is_err());
        let c = JobPattern { job: 1, start: a.start + a.len, ..a.clone() };
        assert!(Expected::of(&[(a, 10), (c, 10)]).is_ok());
    }

    proptest! {
        #[test]
        fn expected_matches_a_byte_array_replay(ops in proptest::collection::vec((0u64..64, 1u64..16), 1..60)) {
            let mut e = Expected::default();
            let mut bytes = vec![0u64; 80];
            for (i, (o, l)) in ops.iter().enumerate() {
                e.write(Op { offset: *o, len: *l, tag: i as u64 + 1 });
                for b in &mut bytes[*o as usize..(*o + *l) as usize] {
                    *b = i as u64 + 1;
                }
            }
            let mut from_map = vec![0u64; 80];
            for (s, en, t) in e.extents() {
                prop_assert!(s < en);
                for b in &mut from_map[s as usize..en as usize] {
                    *b = t;
                }
            }
            prop_assert_eq!(from_map, bytes);
        }

        #[test]
        fn sizes_parse_or_fail_without_panicking(s in "[0-9kKmMiB/:]{0,16}") {
            let _ = s.parse::<Sizes>();
        }
    }
}
