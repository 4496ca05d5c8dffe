//! Fuzz entry points (wrapped by cargo-fuzz targets elsewhere, and run for a
//! bounded number of cases in this crate's tests). Each feeds arbitrary bytes to
//! the real handshake and transmission code, with requests executed inline on
//! small in-memory exports; replies go to a sink. A panic is the only failure.

use crate::handshake::{self, Negotiated, Outcome, BASE_ALLOCATION_ID};
use crate::server::{Export, ServerConfig, Shared};
use crate::transmission;
use std::io::{BufReader, Cursor};
use std::sync::Arc;
use surge_block::MemoryDev;

fn fuzz_server() -> Shared {
    let dev = |size| Arc::new(MemoryDev::new(size));
    let mut ro = Export::new("ro", dev(64 * 1024));
    ro.read_only = true;
    let mut cfg = ServerConfig::new(vec![Export::new("disk", dev(1 << 20)), ro]);
    cfg.threads_per_connection = 1;
    cfg.max_in_flight = 4;
    Shared::new(cfg)
}

/// Runs the whole server conversation (greeting, options, then requests if the
/// bytes get that far) on `data` as the client's side of the stream.
pub fn fuzz_handshake(data: &[u8]) {
    let shared = fuzz_server();
    let mut reader = BufReader::new(Cursor::new(data));
    let mut out = Vec::new();
    let Ok(Some(mut st)) = handshake::greet(&mut reader, &mut out, crate::access::Peer::Unix) else { return };
    // TLS is off here, so STARTTLS is refused and never ends the haggling.
    if let Ok(Outcome::Transmission(neg)) = handshake::options(&shared, &mut st, &mut reader, &mut out) {
        let dev = shared.exports[neg.export].export.dev.clone();
        let _ = transmission::serve(&shared, None, &neg, &*dev, reader, Box::new(std::io::sink()), None, 1, false);
    }
}

/// Runs the transmission phase on `data[1..]`; bits of `data[0]` choose the
/// negotiated state (bit 0: structured replies, bit 1: base:allocation,
/// bit 2: the read-only export, bit 3: extended headers).
pub fn fuzz_requests(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let shared = fuzz_server();
    let extended = mode & 8 != 0;
    let structured = mode & 1 != 0 || extended;
    let neg = Negotiated {
        export: usize::from(mode & 4 != 0),
        structured,
        extended,
        meta_context: (structured && mode & 2 != 0).then_some(BASE_ALLOCATION_ID),
    };
    let reader = BufReader::new(Cursor::new(rest));
    let dev = shared.exports[neg.export].export.dev.clone();
    let _ = transmission::serve(&shared, None, &neg, &*dev, reader, Box::new(std::io::sink()), None, 1, false);
}
