//! Fixed newstyle option haggling, from the greeting to the transmission phase.

use crate::access::Peer;
use crate::proto::*;
use crate::server::{ExportState, Shared};
use crate::tls::TlsMode;
use crate::transmission::{HARD_MAX_PAYLOAD, MAX_BLOCK};
use std::io::{self, Read, Write};
use std::sync::atomic::Ordering;
use tracing::debug;

/// Option data larger than this is discarded unread and answered NBD_REP_ERR_TOO_BIG.
const MAX_OPTION_DATA: u32 = 64 * 1024;
/// Option data larger than this closes the connection (denial of service).
const MAX_DISCARDABLE_OPTION: u32 = 16 << 20;
/// Metadata context id of `base:allocation` on this server.
pub(crate) const BASE_ALLOCATION_ID: u32 = 1;

/// The result of a successful handshake.
#[derive(Debug, Clone)]
pub(crate) struct Negotiated {
    pub export: usize,
    /// Replies in chunks: structured replies or extended headers.
    pub structured: bool,
    /// Extended headers: 32-byte requests with 64-bit lengths, every reply an extended chunk.
    pub extended: bool,
    /// Context id of `base:allocation` if the client selected it for this export.
    pub meta_context: Option<u32>,
}

pub(crate) struct State {
    no_zeroes: bool,
    /// NBD_OPT_EXTENDED_HEADERS was acknowledged (implies `structured`).
    extended: bool,
    /// The client set NBD_FLAG_C_FIXED_NEWSTYLE: only then may TLS be negotiated.
    fixed: bool,
    structured: bool,
    /// Export for which `base:allocation` was selected, if any.
    meta_export: Option<usize>,
    tls_active: bool,
    /// The client's address, for export allow-lists.
    peer: Peer,
}

impl State {
    /// After STARTTLS: options negotiated in plain text no longer count.
    pub(crate) fn tls_started(&mut self) {
        self.structured = false;
        self.extended = false;
        self.meta_export = None;
        self.tls_active = true;
    }
}

/// How option haggling ended.
pub(crate) enum Outcome {
    Transmission(Negotiated),
    /// EOF or NBD_OPT_ABORT.
    Closed,
    /// NBD_OPT_STARTTLS was acknowledged: upgrade the stream, then call
    /// [`options`] again.
    StartTls,
}

fn protocol_error(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean EOF before the first byte.
pub(crate) fn read_exact_or_eof(r: &mut (impl Read + ?Sized), buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Transmission flags advertised for `e`: exactly what the device does natively.
pub(crate) fn transmission_flags(e: &ExportState, structured: bool) -> u16 {
    let mut f = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_CACHE;
    if e.read_only {
        f |= FLAG_READ_ONLY;
    } else {
        f |= FLAG_SEND_FUA | FLAG_SEND_WRITE_ZEROES;
        if e.caps.discard {
            f |= FLAG_SEND_TRIM;
        }
        if e.caps.fast_zero {
            f |= FLAG_SEND_FAST_ZERO;
        }
    }
    if e.caps.multi_conn {
        f |= FLAG_CAN_MULTI_CONN;
    }
    if structured {
        f |= FLAG_SEND_DF;
    }
    f
}

/// Sends the greeting and reads the client flags. `Ok(None)`: the client left.
pub(crate) fn greet(r: &mut impl Read, w: &mut impl Write, peer: Peer) -> io::Result<Option<State>> {
    let mut greeting = [0u8; 18];
    greeting[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    greeting[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    greeting[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    w.write_all(&greeting)?;
    w.flush()?;
    let mut cf = [0u8; 4];
    if !read_exact_or_eof(r, &mut cf)? {
        return Ok(None);
    }
    let client_flags = u32::from_be_bytes(cf);
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(protocol_error(format!("unknown client flags {client_flags:#x}")));
    }
    Ok(Some(State {
        no_zeroes: client_flags & FLAG_C_NO_ZEROES != 0,
        fixed: client_flags & FLAG_C_FIXED_NEWSTYLE != 0,
        structured: false,
        extended: false,
        meta_export: None,
        tls_active: false,
        peer,
    }))
}

/// Option haggling until transmission, the client leaving, or STARTTLS.
/// `Err`: a protocol violation or I/O error; the caller closes the connection.
pub(crate) fn options(shared: &Shared, st: &mut State, r: &mut impl Read, w: &mut impl Write) -> io::Result<Outcome> {
    loop {
        let mut hdr = [0u8; OPTION_HEADER_LEN];
        if !read_exact_or_eof(r, &mut hdr)? {
            return Ok(Outcome::Closed);
        }
        let h = parse_option_header(&hdr).map_err(|e| protocol_error(format!("option header: {e}")))?;
        let Some(data) = read_option_data(r, w, h)? else { continue };
        if let Some(done) = handle_option(shared, st, w, h.option, &data)? {
            return Ok(done);
        }
    }
}

/// Reads the option's data, or discards an oversized one and answers TOO_BIG
/// (`Ok(None)`); closes on a size that only an attacker would send.
fn read_option_data(r: &mut impl Read, w: &mut impl Write, h: OptionHeader) -> io::Result<Option<Vec<u8>>> {
    if h.len > MAX_DISCARDABLE_OPTION {
        return Err(protocol_error(format!("option {} carries {} bytes", h.option, h.len)));
    }
    if h.option == OPT_EXPORT_NAME && h.len as usize > MAX_STRING {
        // No export has so long a name, and this option cannot take an error reply.
        return Err(protocol_error(format!("NBD_OPT_EXPORT_NAME of {} bytes", h.len)));
    }
    if h.len > MAX_OPTION_DATA {
        let skipped = io::copy(&mut r.take(h.len as u64), &mut io::sink())?;
        if skipped < h.len as u64 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        reply_error(w, h.option, REP_ERR_TOO_BIG, "option data too large")?;
        return Ok(None);
    }
    let mut data = vec![0u8; h.len as usize];
    r.read_exact(&mut data)?;
    Ok(Some(data))
}

fn reply(w: &mut impl Write, option: u32, rep: u32, data: &[u8]) -> io::Result<()> {
    let hdr = encode_option_reply_header(option, rep, data.len() as u32);
    crate::io::write_all_parts(w, &[&hdr, data])?;
    w.flush()
}

/// An error reply whose message (which may echo client input) is cut to the
/// spec's string limit.
fn reply_error(w: &mut impl Write, option: u32, rep: u32, msg: &str) -> io::Result<()> {
    debug!(option, rep, msg, "option refused");
    reply(w, option, rep, truncate_utf8(msg, MAX_STRING).as_bytes())
}

/// `Ok(Some(..))` ends this round of haggling; `Ok(None)` continues.
fn handle_option(shared: &Shared, st: &mut State, w: &mut impl Write, option: u32, data: &[u8]) -> io::Result<Option<Outcome>> {
    if shared.shutting_down.load(Ordering::Relaxed) && option != OPT_ABORT {
        if option == OPT_EXPORT_NAME {
            return Err(protocol_error("server is shutting down"));
        }
        reply_error(w, option, REP_ERR_SHUTDOWN, "server is shutting down")?;
        return Ok(None);
    }
    if option == OPT_STARTTLS {
        if !st.fixed {
            // The spec: NOTLS mode unless the client speaks fixed newstyle.
            let msg = "NBD_OPT_STARTTLS needs fixed newstyle (NBD_FLAG_C_FIXED_NEWSTYLE)";
            return reply_error(w, option, REP_ERR_INVALID, msg).map(|_| None);
        }
        return start_tls(shared, st, w, data);
    }
    if shared.tls_mode == TlsMode::Require && !st.tls_active && option != OPT_ABORT {
        if option == OPT_EXPORT_NAME {
            return Err(protocol_error("NBD_OPT_EXPORT_NAME without TLS on a TLS-only server"));
        }
        if !st.fixed {
            // TLS_REQD would invite a STARTTLS this client may not send.
            reply_error(w, option, REP_ERR_POLICY, "this server requires TLS, which needs fixed newstyle")?;
            return Ok(None);
        }
        reply_error(w, option, REP_ERR_TLS_REQD, "this server requires TLS: send NBD_OPT_STARTTLS first")?;
        return Ok(None);
    }
    match option {
        OPT_EXPORT_NAME => export_name(shared, st, w, data).map(|n| Some(Outcome::Transmission(n))),
        OPT_ABORT => {
            // The client may already have closed; a failed ACK is not an error.
            let _ = reply(w, option, REP_ACK, &[]);
            Ok(Some(Outcome::Closed))
        }
        OPT_LIST => list_exports(shared, st, w, data).map(|_| None),
        OPT_INFO | OPT_GO => info_or_go(shared, st, w, option, data),
        OPT_STRUCTURED_REPLY => {
            if !data.is_empty() {
                return reply_error(w, option, REP_ERR_INVALID, "NBD_OPT_STRUCTURED_REPLY takes no data").map(|_| None);
            }
            if st.extended {
                let msg = "extended headers are already negotiated and take precedence";
                return reply_error(w, option, REP_ERR_EXT_HEADER_REQD, msg).map(|_| None);
            }
            st.structured = true;
            reply(w, option, REP_ACK, &[]).map(|_| None)
        }
        OPT_EXTENDED_HEADERS => {
            if !data.is_empty() {
                return reply_error(w, option, REP_ERR_INVALID, "NBD_OPT_EXTENDED_HEADERS takes no data").map(|_| None);
            }
            st.extended = true;
            st.structured = true;
            reply(w, option, REP_ACK, &[]).map(|_| None)
        }
        OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => meta_context(shared, st, w, option, data).map(|_| None),
        other => reply_error(w, other, REP_ERR_UNSUP, &format!("option {other} is not supported")).map(|_| None),
    }
}

fn export_name(shared: &Shared, st: &State, w: &mut impl Write, data: &[u8]) -> io::Result<Negotiated> {
    if st.extended {
        return Err(protocol_error("NBD_OPT_EXPORT_NAME after NBD_OPT_EXTENDED_HEADERS (the spec forbids it)"));
    }
    let name = std::str::from_utf8(data).map_err(|_| protocol_error("export name is not UTF-8"))?;
    let idx = shared.find_export(name).ok_or_else(|| protocol_error(format!("no export named {name:?}")))?;
    let e = &shared.exports[idx];
    if !e.export.allows(&st.peer) {
        // EXPORT_NAME cannot carry an error: the spec says to close.
        return Err(protocol_error(refused_msg(e, &st.peer)));
    }
    let mut out = [0u8; 8 + 2 + 124];
    out[0..8].copy_from_slice(&e.size().to_be_bytes());
    out[8..10].copy_from_slice(&transmission_flags(e, st.structured).to_be_bytes());
    let n = if st.no_zeroes { 10 } else { out.len() };
    w.write_all(&out[..n])?;
    w.flush()?;
    Ok(negotiated(st, idx))
}

fn negotiated(st: &State, export: usize) -> Negotiated {
    let meta_context = (st.structured && st.meta_export == Some(export)).then_some(BASE_ALLOCATION_ID);
    Negotiated { export, structured: st.structured, extended: st.extended, meta_context }
}

/// The refusal sent to (and logged for) a client outside an export's allow-list.
fn refused_msg(e: &ExportState, peer: &Peer) -> String {
    tracing::info!(export = %e.export.name, %peer, "client refused by the export's allow-list");
    format!("export {:?} is not available to clients at {peer}", e.export.name)
}

fn list_exports(shared: &Shared, st: &State, w: &mut impl Write, data: &[u8]) -> io::Result<()> {
    if !data.is_empty() {
        return reply_error(w, OPT_LIST, REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
    }
    for e in shared.exports.iter().filter(|e| e.export.allows(&st.peer)) {
        let name = e.export.name.as_bytes();
        let mut d = Vec::with_capacity(4 + name.len() + e.export.description.len());
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name);
        d.extend_from_slice(truncate_utf8(&e.export.description, MAX_STRING).as_bytes());
        reply(w, OPT_LIST, REP_SERVER, &d)?;
    }
    reply(w, OPT_LIST, REP_ACK, &[])
}

/// The longest prefix of `s` of at most `max` bytes that ends on a char boundary.
pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn info_or_go(
    shared: &Shared,
    st: &mut State,
    w: &mut impl Write,
    option: u32,
    data: &[u8],
) -> io::Result<Option<Outcome>> {
    let req = match parse_info_request(data) {
        Ok(r) => r,
        Err(e) => return reply_error(w, option, REP_ERR_INVALID, &format!("malformed request: {e}")).map(|_| None),
    };
    let Some(idx) = shared.find_export(&req.name) else {
        return reply_error(w, option, REP_ERR_UNKNOWN, &format!("no export named {:?}", req.name)).map(|_| None);
    };
    let e = &shared.exports[idx];
    if !e.export.allows(&st.peer) {
        return reply_error(w, option, REP_ERR_POLICY, &refused_msg(e, &st.peer)).map(|_| None);
    }
    let mut info = Vec::with_capacity(12);
    info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    info.extend_from_slice(&e.size().to_be_bytes());
    info.extend_from_slice(&transmission_flags(e, st.structured).to_be_bytes());
    reply(w, option, REP_INFO, &info)?;
    if req.infos.contains(&INFO_NAME) {
        send_info_string(w, option, INFO_NAME, &e.export.name)?;
    }
    if req.infos.contains(&INFO_DESCRIPTION) && !e.export.description.is_empty() {
        send_info_string(w, option, INFO_DESCRIPTION, truncate_utf8(&e.export.description, MAX_STRING))?;
    }
    // Block sizes are sent unasked: they carry no constraint (minimum 1).
    let mut bs = Vec::with_capacity(14);
    bs.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    bs.extend_from_slice(&1u32.to_be_bytes());
    bs.extend_from_slice(&preferred_block(e).to_be_bytes());
    bs.extend_from_slice(&MAX_BLOCK.to_be_bytes());
    reply(w, option, REP_INFO, &bs)?;
    reply(w, option, REP_ACK, &[])?;
    if option == OPT_GO {
        return Ok(Some(Outcome::Transmission(negotiated(st, idx))));
    }
    Ok(None)
}

fn start_tls(shared: &Shared, st: &State, w: &mut impl Write, data: &[u8]) -> io::Result<Option<Outcome>> {
    let refuse = |w: &mut _, rep, msg| reply_error(w, OPT_STARTTLS, rep, msg).map(|_| None);
    if shared.tls_mode == TlsMode::Off || shared.tls().is_none() {
        return refuse(w, REP_ERR_POLICY, "TLS is not enabled on this server");
    }
    if st.tls_active {
        return refuse(w, REP_ERR_INVALID, "TLS is already active");
    }
    if !data.is_empty() {
        return refuse(w, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data");
    }
    reply(w, OPT_STARTTLS, REP_ACK, &[])?;
    Ok(Some(Outcome::StartTls))
}

fn preferred_block(e: &ExportState) -> u32 {
    let p = e.caps.preferred_block.clamp(512, 1 << 20);
    if p.is_power_of_two() {
        p
    } else {
        4096
    }
}

fn send_info_string(w: &mut impl Write, option: u32, kind: u16, s: &str) -> io::Result<()> {
    let mut d = Vec::with_capacity(2 + s.len());
    d.extend_from_slice(&kind.to_be_bytes());
    d.extend_from_slice(s.as_bytes());
    reply(w, option, REP_INFO, &d)
}

fn meta_context(shared: &Shared, st: &mut State, w: &mut impl Write, option: u32, data: &[u8]) -> io::Result<()> {
    if option == OPT_SET_META_CONTEXT {
        // "replaces all previously-set metadata contexts (including when this command fails)"
        st.meta_export = None;
    }
    if !st.structured {
        return reply_error(w, option, REP_ERR_INVALID, "negotiate structured replies first");
    }
    let req = match parse_meta_context_request(data) {
        Ok(r) => r,
        Err(e) => return reply_error(w, option, REP_ERR_INVALID, &format!("malformed request: {e}")),
    };
    let Some(idx) = shared.find_export(&req.export) else {
        return reply_error(w, option, REP_ERR_UNKNOWN, &format!("no export named {:?}", req.export));
    };
    if !shared.exports[idx].export.allows(&st.peer) {
        return reply_error(w, option, REP_ERR_POLICY, &refused_msg(&shared.exports[idx], &st.peer));
    }
    let (matches, id) = if option == OPT_SET_META_CONTEXT {
        let selected = req.queries.iter().any(|q| q == BASE_ALLOCATION);
        st.meta_export = selected.then_some(idx);
        (selected, BASE_ALLOCATION_ID)
    } else {
        let listed = req.queries.is_empty() || req.queries.iter().any(|q| q == "base:" || q == BASE_ALLOCATION);
        (listed, 0)
    };
    if matches {
        let mut d = Vec::with_capacity(4 + BASE_ALLOCATION.len());
        d.extend_from_slice(&id.to_be_bytes());
        d.extend_from_slice(BASE_ALLOCATION.as_bytes());
        reply(w, option, REP_META_CONTEXT, &d)?;
    }
    reply(w, option, REP_ACK, &[])
}

// The hard limit on payloads must admit everything advertised.
const _: () = assert!(HARD_MAX_PAYLOAD >= MAX_BLOCK);
