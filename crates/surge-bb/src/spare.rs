//! Chunk memory mapped ahead of use. A chunk is 4 MiB of fresh heap memory
//! by default; faulting in its pages was the largest single cost of an I/O
//! node in a write burst, and sat on the path of every FUSE write on the
//! mount. Nodes ([`crate::store`]) and clients ([`SpareBufs`]) keep the
//! memory of chunks they drop for the next one, and map some at start, in
//! a thread that only runs when a CPU would otherwise idle.

use parking_lot::Mutex;

/// A zeroed buffer of `size` bytes with every page mapped: written once,
/// with a value the compiler cannot see is the zero already there.
pub(crate) fn faulted_in(size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    v.iter_mut().step_by(4096).for_each(|b| *b = std::hint::black_box(0));
    v
}

/// Runs `map` in a thread of its own under `SCHED_IDLE`: it gets a CPU only
/// when nothing else wants it, so mapping memory ahead never slows a burst.
pub(crate) fn map_when_idle(what: &'static str, map: impl FnOnce() -> u64 + Send + 'static) {
    let _ = std::thread::Builder::new().name("bb-prefault".into()).spawn(move || {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: a plain syscall on the calling thread (pid 0) with a valid parameter.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
            tracing::debug!("SCHED_IDLE for mapping {what}: {}", std::io::Error::last_os_error());
        }
        let t = std::time::Instant::now();
        let n = map();
        tracing::info!("{what}: {} MiB mapped ahead of use in {:.1?}", n >> 20, t.elapsed());
    });
}

/// Empty buffers with room for one chunk, pages mapped, up to `max_bytes`:
/// a client fills one per chunk it writes, and its cache gives back the
/// memory of the chunks it evicts.
pub struct SpareBufs {
    size: usize,
    max: usize,
    bufs: Mutex<Vec<Vec<u8>>>,
}

impl SpareBufs {
    pub fn new(size: usize, max_bytes: u64) -> SpareBufs {
        let max = if size == 0 { 0 } else { (max_bytes / size as u64) as usize };
        SpareBufs { size, max, bufs: Mutex::new(Vec::new()) }
    }

    /// An empty buffer with capacity for a chunk, if one is spare.
    pub fn take(&self) -> Option<Vec<u8>> {
        self.bufs.lock().pop()
    }

    /// A buffer of `n` bytes to read into: a spare one (mapped; zeroed,
    /// which costs far less than faulting its pages in) when `n` is a
    /// chunk's size and one is left, else a new one.
    pub fn take_sized(&self, n: usize) -> Vec<u8> {
        match (n == self.size).then(|| self.take()).flatten() {
            Some(mut v) => {
                v.resize(n, 0);
                v
            }
            None => crate::proto::new_buffer(n),
        }
    }

    /// Keeps `v`'s memory for a later chunk, if it has a chunk's room and
    /// fewer than the most are kept.
    pub fn give(&self, v: Vec<u8>) {
        self.give_within(v, u64::MAX);
    }

    /// As [`SpareBufs::give`], and only while the spares stay within `room`
    /// bytes (the rest of the owner's memory budget).
    pub fn give_within(&self, mut v: Vec<u8>, room: u64) {
        if v.capacity() != self.size {
            return;
        }
        let mut g = self.bufs.lock();
        if g.len() < self.max && ((g.len() + 1) * self.size) as u64 <= room {
            v.clear();
            g.push(v);
        }
    }

    /// Maps buffers until the most are kept, but never more than the most
    /// in all: buffers taken meanwhile are not replaced (they are in use,
    /// and come back through `give`). Returns the bytes mapped.
    pub fn fill(&self) -> u64 {
        let mut done = 0;
        for _ in 0..self.max {
            if self.bufs.lock().len() >= self.max {
                break;
            }
            self.give(faulted_in(self.size));
            done += self.size as u64;
        }
        done
    }

    pub fn bytes(&self) -> u64 {
        (self.bufs.lock().len() * self.size) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spares for chunks of 64 bytes, up to two, holding one buffer of 7s;
    /// that buffer's address.
    fn one_spare() -> (SpareBufs, *const u8) {
        let s = SpareBufs::new(64, 128);
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&[7; 64]);
        let p = v.as_ptr();
        s.give(v);
        (s, p)
    }

    #[test]
    fn spare_buffers_come_back_empty_and_only_a_chunks_room_is_kept() {
        let (s, p) = one_spare();
        s.give(vec![1; 10]);
        assert_eq!(s.bytes(), 64, "a buffer of another size is dropped");
        let v = s.take().unwrap();
        assert!(v.is_empty() && v.capacity() == 64 && v.as_ptr() == p);
        assert!(s.take().is_none());
    }

    #[test]
    fn a_read_of_a_chunks_size_takes_a_spare_buffer_and_others_leave_them() {
        let (s, p) = one_spare();
        let other = s.take_sized(10);
        assert_eq!((other.len(), s.bytes()), (10, 64), "another length gets a new buffer, the spare stays");
        let v = s.take_sized(64);
        assert!(v.len() == 64 && v.as_ptr() == p && v.iter().all(|&b| b == 0), "the spare, its length set, zeroed");
        assert_eq!(s.bytes(), 0);
        assert_eq!(s.take_sized(64).len(), 64, "none left: a new buffer");
    }

    #[test]
    fn give_within_keeps_no_more_than_the_room_left() {
        let s = SpareBufs::new(64, 1024);
        s.give_within(Vec::with_capacity(64), 100);
        s.give_within(Vec::with_capacity(64), 100);
        assert_eq!(s.bytes(), 64, "a second buffer would pass the 100 bytes of room");
        s.give_within(Vec::with_capacity(64), 128);
        assert_eq!(s.bytes(), 128);
    }

    #[test]
    fn fill_maps_up_to_the_most_and_no_more() {
        let s = SpareBufs::new(64, 200);
        assert_eq!(s.fill(), 3 * 64);
        s.give(Vec::with_capacity(64));
        assert_eq!(s.bytes(), 3 * 64);
    }

    #[test]
    fn fill_does_not_replace_buffers_taken_while_it_maps() {
        // 64 MiB in 64 KiB buffers: mapping takes long enough for the
        // taker to run alongside.
        let (size, most) = (64 << 10, 1000u64);
        let s = std::sync::Arc::new(SpareBufs::new(size, size as u64 * most));
        let taker = {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut taken = Vec::new();
                while taken.len() < 500 {
                    taken.extend(s.take());
                }
                taken
            })
        };
        let mapped = s.fill();
        let taken = taker.join().unwrap();
        assert_eq!(mapped, size as u64 * most, "the most in all, however many were taken meanwhile");
        assert_eq!(s.bytes() + (size * taken.len()) as u64, size as u64 * most);
    }
}
