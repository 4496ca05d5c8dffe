//! Read-ahead for base reads: a remote base answers in round trips, and a
//! file system reading a booting system's files issues many small reads in
//! mostly ascending order. Misses that continue an earlier one are fetched
//! with a window that doubles up to `max_window` (as Linux read-ahead does);
//! isolated misses fetch just the blocks asked for. Fetched data waits in a
//! small LRU cache in memory (never in the overlay: that is copy-on-read's
//! job). The base is read-only, so cached data is never stale; the cow layer
//! asks only for blocks still in the `Base` state.

use crate::dev::BlockDev;
use crate::error::Result;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

#[derive(Debug, Clone, Copy)]
pub struct ReadaheadConfig {
    /// Cache unit (power of two).
    pub unit: u64,
    /// Largest window fetched ahead of a sequential miss (0: no read-ahead).
    pub max_window: u64,
    /// Bytes of cache.
    pub cache_bytes: u64,
}

impl Default for ReadaheadConfig {
    fn default() -> Self {
        ReadaheadConfig { unit: 64 << 10, max_window: 1 << 20, cache_bytes: 64 << 20 }
    }
}

/// A run of misses moving forward: where the next one is expected, and the
/// window it gets.
#[derive(Debug, Clone, Copy)]
struct Stream {
    next: u64,
    window: u64,
}

#[derive(Default)]
struct State {
    cache: HashMap<u64, Arc<Vec<u8>>>,
    lru: VecDeque<u64>,
    streams: VecDeque<Stream>,
}

pub struct Readahead {
    cfg: ReadaheadConfig,
    state: Mutex<State>,
}

const STREAMS: usize = 16;

impl Readahead {
    pub fn new(cfg: ReadaheadConfig) -> Readahead {
        Readahead { cfg, state: Mutex::new(State::default()) }
    }

    fn units(&self) -> usize {
        (self.cfg.cache_bytes / self.cfg.unit).max(1) as usize
    }

    /// Copy `[pos, pos+buf.len())` from cached units if all are there.
    fn from_cache(&self, st: &mut State, buf: &mut [u8], pos: u64) -> bool {
        let u = self.cfg.unit;
        let end = pos + buf.len() as u64;
        let (first, last) = (pos / u, (end - 1) / u);
        if !(first..=last).all(|i| st.cache.contains_key(&i)) {
            return false;
        }
        for i in first..=last {
            let data = &st.cache[&i];
            let (lo, hi) = ((i * u).max(pos), ((i + 1) * u).min(end));
            buf[(lo - pos) as usize..(hi - pos) as usize].copy_from_slice(&data[(lo - i * u) as usize..(hi - i * u) as usize]);
        }
        true
    }

    /// How far past `end` to fetch for a miss at `start` (and note the stream).
    fn extra(&self, st: &mut State, start: u64, end: u64) -> u64 {
        let max = self.cfg.max_window;
        if max == 0 {
            return 0;
        }
        let near = |s: &Stream| start + max >= s.next && start <= s.next + max;
        let (window, i) = match st.streams.iter().position(near) {
            Some(i) => ((st.streams[i].window * 2).clamp(self.cfg.unit, max), Some(i)),
            None => (0, None),
        };
        if let Some(i) = i {
            st.streams.remove(i);
        }
        // A first miss starts a stream with a small window for its successor.
        let next_window = if window == 0 { self.cfg.unit } else { window };
        st.streams.push_front(Stream { next: end + window, window: next_window });
        st.streams.truncate(STREAMS);
        window
    }

    /// Read `buf` at `pos` from `base`, through the cache; `limit` bounds the
    /// read-ahead (the end of the run of blocks still in the base). Returns the
    /// bytes fetched from the base.
    pub fn read(&self, base: &dyn BlockDev, buf: &mut [u8], pos: u64, limit: u64) -> Result<u64> {
        if buf.is_empty() {
            return Ok(0);
        }
        let u = self.cfg.unit;
        let size = base.size();
        let (start, end) = (pos / u * u, (pos + buf.len() as u64).div_ceil(u) * u);
        let extra = {
            let mut st = self.state.lock();
            if self.from_cache(&mut st, buf, pos) {
                return Ok(0);
            }
            self.extra(&mut st, start, end)
        };
        let fetch_end = (end + extra).min(limit.div_ceil(u) * u).max(end).min(size);
        let mut data = vec![0u8; (fetch_end - start) as usize];
        base.read_at(&mut data, start)?;
        buf.copy_from_slice(&data[(pos - start) as usize..(pos - start) as usize + buf.len()]);
        let mut st = self.state.lock();
        for (k, chunk) in data.chunks(u as usize).enumerate() {
            let idx = start / u + k as u64;
            if st.cache.insert(idx, Arc::new(chunk.to_vec())).is_none() {
                st.lru.push_back(idx);
            }
        }
        while st.lru.len() > self.units() {
            if let Some(old) = st.lru.pop_front() {
                st.cache.remove(&old);
            }
        }
        Ok(data.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::pattern;
    use crate::counted::Counted;
    use crate::memory::MemoryDev;

    fn base(size: u64) -> Arc<Counted> {
        let m = MemoryDev::new(size);
        m.write_at(&pattern(3, 0, size), 0, false).unwrap();
        Arc::new(Counted::new(Arc::new(m)))
    }

    #[test]
    fn sequential_misses_grow_the_window_and_hit_the_cache() {
        let b = base(8 << 20);
        let ra = Readahead::new(ReadaheadConfig::default());
        let mut buf = vec![0u8; 4096];
        let mut fetched = Vec::new();
        for i in 0..256u64 {
            let pos = i * 4096;
            fetched.push(ra.read(b.as_ref(), &mut buf, pos, 8 << 20).unwrap());
            assert_eq!(buf, pattern(3, pos, 4096));
        }
        let reads = b.stats().reads;
        assert!(reads <= 6, "1 MiB read 4 KiB at a time took {reads} base reads: {:?}", fetched.iter().filter(|&&f| f > 0).collect::<Vec<_>>());
    }

    #[test]
    fn isolated_misses_fetch_only_their_units() {
        let b = base(64 << 20);
        let ra = Readahead::new(ReadaheadConfig::default());
        let mut buf = vec![0u8; 4096];
        for pos in [40u64 << 20, 3 << 20, 50 << 20, 10 << 20] {
            assert_eq!(ra.read(b.as_ref(), &mut buf, pos + 8192, 64 << 20).unwrap(), 64 << 10);
            assert_eq!(buf, pattern(3, pos + 8192, 4096));
        }
    }

    #[test]
    fn read_ahead_stops_at_the_limit_and_the_device_end() {
        let b = base((1 << 20) + 1000);
        let ra = Readahead::new(ReadaheadConfig::default());
        let mut buf = vec![0u8; 100];
        ra.read(b.as_ref(), &mut buf, 0, 1 << 30).unwrap();
        let n = ra.read(b.as_ref(), &mut buf, 70 << 10, 200 << 10).unwrap();
        assert!(n <= 200 << 10, "{n}");
        let n = ra.read(b.as_ref(), &mut buf, (1 << 20) + 900, 1 << 30).unwrap();
        assert_eq!(n, 1000, "only up to the end");
        assert_eq!(buf, pattern(3, (1 << 20) + 900, 100));
    }

    #[test]
    fn the_cache_is_bounded() {
        let b = base(16 << 20);
        let ra = Readahead::new(ReadaheadConfig { cache_bytes: 256 << 10, ..ReadaheadConfig::default() });
        let mut buf = vec![0u8; 65536];
        for i in 0..200u64 {
            ra.read(b.as_ref(), &mut buf, (i * 65536) % (16 << 20), 16 << 20).unwrap();
        }
        assert!(ra.state.lock().cache.len() <= 4);
    }
}
