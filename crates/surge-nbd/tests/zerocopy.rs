//! Zero-copy reads (sendfile) and writes (splice through a pipe) for plain
//! connections to file exports: byte-exact in every reply style, counted by the
//! layer above the file, a client leaving mid-payload changes nothing, and a
//! file that fails while being sent gives an error chunk, not bad data; a
//! copy-on-write volume takes these paths only for ranges in its overlay. A
//! file on tmpfs takes write payloads through a mapping, with the same
//! guarantees, and falls back to splice where the mapping cannot take them.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use surge_block::cow::{CowConfig, CowDev};
use surge_block::{BlockDev, Counted, FileDev, FileSpan, MemoryDev};
use surge_nbd::client::{Client, ClientOptions, ReadChunk};
use surge_nbd::proto::*;
use surge_nbd::{Export, Listen, Server, ServerConfig, MAX_BLOCK};

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8).collect()
}

fn serve(dev: Arc<dyn BlockDev>, dir: &Path) -> (Server, std::path::PathBuf) {
    let sock = dir.join("s");
    let server = Server::start(ServerConfig::new(vec![Export::new("f", dev)])).unwrap();
    server.listen(&Listen::Unix(sock.clone())).unwrap();
    (server, sock)
}

fn connect(sock: &Path, structured: bool) -> Client {
    Client::connect_unix(sock, &ClientOptions { structured_replies: structured, block_status: structured, ..Default::default() }).unwrap()
}

/// A directory on tmpfs, where file exports take payloads through a mapping.
fn tmpfs_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").expect("/dev/shm (tmpfs) is needed for the mapped write path")
}

/// Whether this process maps `path` (the server runs in it).
fn mapped(path: &Path) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|l| l.ends_with(path.to_str().unwrap()))
}

/// KiB of `path`'s mapping in this process that are in memory (its pages
/// faulted in through the mapping), or `None` if it is not mapped.
fn mapped_kib(path: &Path) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut lines = smaps.lines().skip_while(|l| !l.ends_with(path.to_str().unwrap()));
    lines.next()?;
    let rss = lines.find(|l| l.starts_with("Rss:"))?;
    rss.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn large_reads_and_writes_of_a_file_export_skip_the_copy_and_stay_byte_exact() {
    large_io_round_trip(&tempfile::tempdir().unwrap());
}

#[test]
fn large_writes_to_a_file_on_tmpfs_go_through_a_mapping_and_stay_byte_exact() {
    let dir = tmpfs_dir();
    large_io_round_trip(&dir);
    assert!(!mapped(&dir.path().join("img")), "the mapping outlives its connection");
}

fn large_io_round_trip(dir: &tempfile::TempDir) {
    let size = 80u64 << 20;
    let file: Arc<dyn BlockDev> = Arc::new(FileDev::create(dir.path().join("img"), size).unwrap());
    let counted = Arc::new(Counted::new(file));
    let (server, sock) = serve(counted.clone(), dir.path());
    let mut model = vec![0u8; size as usize];
    // Disjoint: NBD does not order requests in flight, so two pipelined
    // writes of one range may land in either order (an overlap here once
    // made the check fail with the older write's bytes).
    let writes: [(u64, usize); 5] = [(0, 1 << 20), ((1 << 20) + 4096 + 3, 200_000), ((8 << 20) - 100, 64 * 1024), (20 << 20, 40 << 20), (size - (1 << 20), 1 << 20)];
    for (i, structured) in [true, false].into_iter().enumerate() {
        let mut c = connect(&sock, structured);
        // Twice each (on tmpfs the second time goes through the mapping).
        // Pipelined, so the next headers often sit in the read buffer with part of a payload.
        for pass in 0..2 {
            let cookies: Vec<u64> = writes
                .iter()
                .enumerate()
                .map(|(j, &(off, len))| {
                    let data = pattern(len, (i * 10 + j + 100 * pass) as u32);
                    model[off as usize..off as usize + len].copy_from_slice(&data);
                    c.submit(CMD_WRITE, 0, off, len as u32, &data).unwrap()
                })
                .collect();
            for k in cookies {
                c.wait(k).unwrap().into_result().unwrap();
            }
        }
        let on_tmpfs = dir.path().starts_with("/dev/shm");
        assert_eq!(mapped(&dir.path().join("img")), on_tmpfs, "a file export is mapped exactly when its file is on tmpfs");
        if on_tmpfs {
            let kib = mapped_kib(&dir.path().join("img")).unwrap();
            assert!(kib >= 1 << 10, "the rewrites did not go through the mapping ({kib} KiB of it in memory)");
        }
        c.write(5 << 20, b"small, copied", true).unwrap();
        model[5 << 20..(5 << 20) + 13].copy_from_slice(b"small, copied");
        for &(off, len) in &writes {
            let r = c.read_reply(off, len as u32, 0).unwrap();
            assert_eq!(r.data, &model[off as usize..off as usize + len], "read at {off}+{len}, structured {structured}");
            if structured {
                assert!(r.chunks.iter().all(|ch| matches!(ch, ReadChunk::Data { len, .. } if *len <= MAX_BLOCK)), "{:?}", r.chunks);
            }
        }
        c.disconnect().unwrap();
    }
    let st = server.stats().exports[0].clone();
    assert!(st.zero_copy_reads >= 8 && st.zero_copy_writes >= 8, "the zero-copy paths were not used: {st:?}");
    // The counting layer above the file saw the bypassed I/O too. It hears
    // of a zero-copy read once the bytes are sent, which may be after the
    // client has the reply: compare once the server has stopped.
    server.shutdown().unwrap();
    let io = counted.stats();
    assert_eq!(io.writes, st.writes, "{io:?} vs {st:?}");
    assert_eq!(io.write_bytes, st.bytes_written);
    assert_eq!(io.read_bytes, st.bytes_read);
    let on_disk = std::fs::read(dir.path().join("img")).unwrap();
    assert!(on_disk == model, "the file differs from what was written");
}

#[test]
fn memory_exports_keep_the_copying_path() {
    let dir = tempfile::tempdir().unwrap();
    let (server, sock) = serve(Arc::new(MemoryDev::new(4 << 20)), dir.path());
    let mut c = connect(&sock, true);
    c.write(0, &pattern(1 << 20, 1), false).unwrap();
    let mut b = vec![0u8; 1 << 20];
    c.read(0, &mut b).unwrap();
    assert_eq!(b, pattern(1 << 20, 1));
    c.disconnect().unwrap();
    let st = server.stats().exports[0].clone();
    assert_eq!((st.zero_copy_reads, st.zero_copy_writes), (0, 0));
    server.shutdown().unwrap();
}

#[test]
fn a_client_leaving_mid_payload_changes_nothing_on_the_spliced_path() {
    client_leaving_mid_payload_changes_nothing(&tempfile::tempdir().unwrap());
}

#[test]
fn a_client_leaving_mid_payload_changes_nothing_on_the_mapped_path() {
    client_leaving_mid_payload_changes_nothing(&tmpfs_dir());
}

fn client_leaving_mid_payload_changes_nothing(dir: &tempfile::TempDir) {
    let (server, sock) = serve(Arc::new(FileDev::create(dir.path().join("img"), 8 << 20).unwrap()), dir.path());
    let first = pattern(1 << 20, 1);
    {
        let mut c = connect(&sock, true);
        // Written whole first, so that the half-sent write below is a rewrite
        // (on tmpfs, one the mapping would take).
        c.write(4096, &first, false).unwrap();
        let hdr = encode_request(&Request { flags: 0, cmd: CMD_WRITE, cookie: 7, offset: 4096, len: 1 << 20 });
        c.send_raw(&hdr).unwrap();
        c.send_raw(&vec![0xaau8; 700_000]).unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let mut c = connect(&sock, true);
    let mut back = vec![1u8; 1 << 20];
    c.read(4096, &mut back).unwrap();
    assert!(back == first, "a half-received write must not be applied");
    // The connection's pipes still work for the next client.
    c.write(0, &pattern(1 << 20, 5), false).unwrap();
    c.read(0, &mut back).unwrap();
    assert_eq!(back, pattern(1 << 20, 5));
    c.disconnect().unwrap();
    assert_eq!(server.stats().exports[0].writes, 2);
    server.shutdown().unwrap();
}

#[test]
fn a_file_that_fails_while_being_sent_gives_an_error_not_wrong_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img");
    let (server, sock) = serve(Arc::new(FileDev::create(&path, 8 << 20).unwrap()), dir.path());
    let mut c = connect(&sock, true);
    c.write(0, &pattern(2 << 20, 9), false).unwrap();
    // Cut the file short behind the server's back: sendfile runs out of data.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(1 << 20).unwrap();
    let r = c.read_reply(0, 2 << 20, 0).unwrap_err();
    assert_eq!(r.errno(), Some(EIO), "{r}");
    // The structured connection survives (the chunk was padded to its length).
    let mut b = vec![0u8; 4096];
    c.read(0, &mut b).unwrap();
    assert_eq!(b, pattern(2 << 20, 9)[..4096]);
    c.disconnect().unwrap();
    // Simple replies cannot carry a late error: the server closes instead.
    let mut simple = connect(&sock, false);
    let k = simple.submit(CMD_READ, 0, 0, 2 << 20, &[]).unwrap();
    assert!(simple.wait(k).is_err(), "a simple reply with wrong data must not be delivered");
    server.shutdown().unwrap();
}

#[test]
fn a_tmpfs_file_cut_short_behind_the_server_still_takes_large_writes_whole() {
    let dir = tmpfs_dir();
    let path = dir.path().join("img");
    let (server, sock) = serve(Arc::new(FileDev::create(&path, 8 << 20).unwrap()), dir.path());
    let mut c = connect(&sock, true);
    c.write(512 << 10, &pattern(1 << 20, 3), false).unwrap();
    assert!(mapped(&path), "the first large write maps the file");
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(1 << 20).unwrap();
    // The rewrite goes through the mapping, whose pages past the new end
    // cannot be had: the kernel fails the copy into them, and the rest of the
    // payload goes by splice, which extends the file.
    let data = pattern(1 << 20, 4);
    c.write(512 << 10, &data, false).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(512 << 10, &mut back).unwrap();
    assert!(back == data, "a write across the file's new end lost bytes");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), (512 << 10) + (1 << 20));
    c.disconnect().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn a_payload_sent_in_small_pieces_is_taken_whole_though_it_fills_no_pipe() {
    // Each small send is a socket buffer of its own, and each becomes a pipe
    // slot holding a part of a page: 1 MiB in 1,000-byte sends needs 1,049
    // slots, a 1 MiB pipe has 256 (a TCP peer on a real network does the same
    // with one slot per packet). The server once waited forever for room.
    let dir = tempfile::tempdir().unwrap();
    let (server, sock) = serve(Arc::new(FileDev::create(dir.path().join("img"), 8 << 20).unwrap()), dir.path());
    let data = pattern(1 << 20, 8);
    let mut c = connect(&sock, true);
    c.send_raw(&encode_request(&Request { flags: 0, cmd: CMD_WRITE, cookie: 9, offset: 1 << 20, len: 1 << 20 })).unwrap();
    for piece in data.chunks(1000) {
        c.send_raw(piece).unwrap();
    }
    // The raw write's reply is not this client's to read: watch for the data
    // from a second connection instead.
    let mut other = connect(&sock, true);
    let mut back = vec![0u8; 1 << 20];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        other.read(1 << 20, &mut back).unwrap();
        if back == data {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the payload sent in pieces never landed: the server is stuck on a full pipe");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    other.disconnect().unwrap();
    drop(c);
    assert_eq!(server.stats().exports[0].writes, 1);
    server.shutdown().unwrap();
}

/// A tmpfs of a few MiB mounted on a fresh directory (root only), unmounted on drop.
struct SmallTmpfs {
    dir: tempfile::TempDir,
}

impl SmallTmpfs {
    fn mount(bytes: u64) -> Option<SmallTmpfs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"]).arg(dir.path()).status().is_ok_and(|s| s.success());
        ok.then_some(SmallTmpfs { dir })
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

#[test]
fn a_full_tmpfs_answers_large_writes_with_enospc_and_keeps_what_it_took() {
    let Some(fs) = SmallTmpfs::mount((3 << 20) + (512 << 10)) else {
        eprintln!("skipped: mounting a small tmpfs needs root and mount(8)");
        return;
    };
    let path = fs.dir.path().join("img");
    let (server, sock) = serve(Arc::new(FileDev::create(&path, 8 << 20).unwrap()), fs.dir.path());
    let mut c = connect(&sock, true);
    // MiB 0 is written, then trimmed (its pages freed), so that writing it
    // again is a rewrite, through the mapping, into pages that must be had anew.
    c.write(0, &pattern(1 << 20, 0), false).unwrap();
    c.trim(0, 1 << 20, false).unwrap();
    for i in 1..4u32 {
        c.write(u64::from(i) << 20, &pattern(1 << 20, i), false).unwrap();
    }
    let e = c.write(0, &pattern(1 << 20, 9), false).unwrap_err();
    // The mapping's page faults fail inside the kernel's copy; the splice
    // that takes over reports the file system's own error.
    assert_eq!(e.errno(), Some(ENOSPC), "{e}");
    let mut back = vec![0u8; 1 << 20];
    for i in 1..4u32 {
        c.read(u64::from(i) << 20, &mut back).unwrap();
        assert!(back == pattern(1 << 20, i), "MiB {i} changed after the device filled up");
    }
    c.disconnect().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn a_single_pass_of_writes_leaves_the_mapping_untouched_and_rewrites_use_it() {
    let dir = tmpfs_dir();
    let path = dir.path().join("img");
    let (server, sock) = serve(Arc::new(FileDev::create(&path, 16 << 20).unwrap()), dir.path());
    let mut c = connect(&sock, true);
    for i in 0..16u32 {
        c.write(u64::from(i) << 20, &pattern(1 << 20, i), false).unwrap();
    }
    assert_eq!(mapped_kib(&path), Some(0), "a first write of each MiB went through the mapping");
    c.write(5 << 20, &pattern(1 << 20, 99), false).unwrap();
    let kib = mapped_kib(&path).unwrap();
    assert!(kib > 0 && kib <= 1024, "a rewrite of 1 MiB brought {kib} KiB of the mapping in");
    let mut back = vec![0u8; 1 << 20];
    c.read(5 << 20, &mut back).unwrap();
    assert!(back == pattern(1 << 20, 99));
    c.disconnect().unwrap();
    server.shutdown().unwrap();
}

#[test]
fn a_cow_volume_skips_the_copy_for_ranges_that_need_nothing_from_its_base() {
    let dir = tempfile::tempdir().unwrap();
    let size = 16u64 << 20;
    let base_data = pattern(size as usize, 77);
    let base = MemoryDev::new(size);
    base.write_at(&base_data, 0, false).unwrap();
    let cfg = CowConfig::default();
    let overlay = FileDev::create(dir.path().join("ovl"), CowDev::overlay_size_for(size, &cfg)).unwrap();
    let cow = CowDev::create(Arc::new(base), Arc::new(overlay), &cfg).unwrap();
    let (server, sock) = serve(Arc::new(cow), dir.path());
    let mut model = base_data;
    let mut c = connect(&sock, true);
    let check = |c: &mut Client, off: usize, len: usize, model: &[u8]| {
        let mut b = vec![0u8; len];
        c.read(off as u64, &mut b).unwrap();
        assert!(b == model[off..off + len], "read at {off}+{len} differs");
    };
    // Unwritten: read from the base, copied.
    check(&mut c, 1 << 20, 1 << 20, &model);
    let st = server.stats().exports[0].clone();
    assert_eq!((st.zero_copy_reads, st.zero_copy_writes), (0, 0), "base ranges are not in the overlay");
    // First write of a range with partial blocks at both ends: they are
    // filled from the base, so the device writes it.
    let (off, len) = ((2 << 20) + 1000, 1 << 20);
    let data = pattern(len, 1);
    c.write(off as u64, &data, false).unwrap();
    model[off..off + len].copy_from_slice(&data);
    assert_eq!(server.stats().exports[0].zero_copy_writes, 0, "a write filling partial blocks is the device's");
    // A first write of whole blocks is spliced, and the blocks leave the base.
    let data = pattern(1 << 20, 3);
    c.write(8 << 20, &data, false).unwrap();
    model[8 << 20..9 << 20].copy_from_slice(&data);
    assert_eq!(server.stats().exports[0].zero_copy_writes, 1, "an allocating write of whole blocks");
    // Blocks made `Data` since the last FLUSH are fresh: a failed flush may
    // still take them back, so they are read through the device.
    check(&mut c, 8 << 20, 1 << 20, &model);
    assert_eq!(server.stats().exports[0].zero_copy_reads, 0, "fresh blocks are the device's to read");
    c.flush().unwrap();
    // Now settled in the overlay: reads and rewrites skip the copy.
    check(&mut c, 8 << 20, 1 << 20, &model);
    check(&mut c, off, len, &model);
    let data = pattern(len - 8192, 2);
    c.write(off as u64 + 4096, &data, false).unwrap();
    model[off + 4096..off + len - 4096].copy_from_slice(&data);
    check(&mut c, off, len, &model);
    // A read that reaches past the overlay's blocks into the base is copied.
    check(&mut c, off, 2 << 20, &model);
    c.flush().unwrap();
    c.disconnect().unwrap();
    let st = server.stats().exports[0].clone();
    assert_eq!((st.zero_copy_reads, st.zero_copy_writes), (3, 2), "{st:?}");
    server.shutdown().unwrap();
}

/// A file export whose ranges leave the file after `intake` answers: the
/// write's payload was spliced, then the range was no longer in the span.
struct LeavesTheSpan {
    file: FileDev,
    answers: AtomicUsize,
    intake: AtomicUsize,
}

impl BlockDev for LeavesTheSpan {
    fn size(&self) -> u64 {
        self.file.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.file.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.file.write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.file.flush()
    }
    fn file_span(&self) -> Option<FileSpan<'_>> {
        self.file.file_span()
    }
    fn in_file_span(&self, _offset: u64, _len: u64, _write: bool) -> bool {
        self.answers.fetch_add(1, Ordering::SeqCst) < self.intake.load(Ordering::SeqCst)
    }
}

#[test]
fn a_spliced_write_whose_range_left_the_file_is_written_by_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Arc::new(LeavesTheSpan { file: FileDev::create(dir.path().join("img"), 8 << 20).unwrap(), answers: AtomicUsize::new(0), intake: AtomicUsize::new(1) });
    let (server, sock) = serve(dev.clone(), dir.path());
    let mut c = connect(&sock, true);
    let data = pattern(3 << 18, 4);
    c.write(12345, &data, false).unwrap();
    assert_eq!(dev.answers.load(Ordering::SeqCst), 2, "asked at intake and again when the write ran");
    let st = server.stats().exports[0].clone();
    assert_eq!((st.writes, st.zero_copy_writes, st.errors), (1, 0, 0), "{st:?}");
    let mut back = vec![0u8; data.len()];
    c.read(12345, &mut back).unwrap();
    assert!(back == data, "the payload taken back from the pipe differs");
    // The pipe went back empty: the next write is spliced through it and lands whole.
    dev.intake.store(usize::MAX, Ordering::SeqCst);
    let data = pattern(1 << 19, 5);
    c.write(1 << 20, &data, false).unwrap();
    c.read(1 << 20, &mut back[..1 << 19]).unwrap();
    assert!(back[..1 << 19] == data[..], "a write through the reused pipe differs");
    assert_eq!(server.stats().exports[0].zero_copy_writes, 1);
    c.disconnect().unwrap();
    server.shutdown().unwrap();
}
