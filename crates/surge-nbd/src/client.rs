//! A small blocking NBD client.
//!
//! Two stages: [`Handshake`] speaks the option phase (LIST, INFO, STRUCTURED_REPLY,
//! meta contexts, raw options), and its [`Handshake::go`] turns into a [`Client`]
//! for the transmission phase. [`Client::connect_unix`] / [`Client::connect_tcp`]
//! do the usual sequence in one call: structured replies, `base:allocation`
//! (when asked), GO.
//!
//! The client pipelines: [`Client::submit`] sends a request and returns its
//! cookie, [`Client::wait`] / [`Client::wait_any`] collect replies in whatever
//! order the server sends them. The synchronous helpers (`read`, `write`, ...)
//! are submit + wait. One `Client` is one connection and is used from one
//! thread; open several for parallel connections. `submit` writes without
//! reading replies, so keep what is submitted but not yet collected moderate
//! (the server stops reading after its in-flight limit, 64 by default, and a
//! client that never collects replies can block on a full socket). TLS:
//! [`Handshake::starttls`]. It does not refuse requests
//! the server did not advertise (tests use that to probe the server), and it
//! checks the server's replies strictly (unknown cookies, chunks outside the
//! request, reads not fully covered are protocol errors).

use crate::io::{write_all_parts, Socket};
use crate::proto::*;
use crate::tls;
use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::Path;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    #[error("server broke the protocol: {0}")]
    Protocol(String),
    #[error("server refused option {option} with reply {reply:#x}: {message}")]
    OptionRefused { option: u32, reply: u32, message: String },
    #[error("request failed with errno {errno}: {message}")]
    Request { errno: u32, message: String },
    #[error("TLS: {0}")]
    Tls(String),
}

impl ClientError {
    /// The NBD errno of a failed request.
    pub fn errno(&self) -> Option<u32> {
        match self {
            ClientError::Request { errno, .. } => Some(*errno),
            _ => None,
        }
    }
    /// The option reply type of a refused option.
    pub fn option_reply(&self) -> Option<u32> {
        match self {
            ClientError::OptionRefused { reply, .. } => Some(*reply),
            _ => None,
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

fn protocol(msg: impl Into<String>) -> ClientError {
    ClientError::Protocol(msg.into())
}

/// How [`Client::connect_unix`] negotiates.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub export: String,
    /// Ask for structured replies (as libnbd and qemu do); off = like the kernel.
    pub structured_replies: bool,
    /// Select `base:allocation` (needs structured replies).
    pub block_status: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions { export: String::new(), structured_replies: true, block_status: true }
    }
}

/// One option reply as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub reply: u32,
    pub data: Vec<u8>,
}

impl OptionReply {
    pub fn is_error(&self) -> bool {
        self.reply & (1 << 31) != 0
    }
}

/// What the server says about an export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    pub name: Option<String>,
    pub description: Option<String>,
    /// (minimum, preferred, maximum) block sizes.
    pub block_size: Option<(u32, u32, u32)>,
}

impl ExportInfo {
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
    pub fn read_only(&self) -> bool {
        self.has(FLAG_READ_ONLY)
    }
    pub fn multi_conn(&self) -> bool {
        self.has(FLAG_CAN_MULTI_CONN)
    }
}

/// An entry of NBD_OPT_LIST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportEntry {
    pub name: String,
    pub description: String,
}

/// A byte stream of a connection: the plain socket or TLS over it.
pub(crate) type BoxRead = Box<dyn Read + Send>;
pub(crate) type BoxWrite = Box<dyn Write + Send>;

/// The option phase of a connection.
pub struct Handshake {
    reader: BufReader<BoxRead>,
    writer: BoxWrite,
    socket: Socket,
    /// Handshake flags the server sent.
    pub server_flags: u16,
    structured: bool,
    meta_context: Option<u32>,
}

impl Handshake {
    pub fn connect_unix(path: impl AsRef<Path>) -> Result<Handshake> {
        Handshake::from_socket(Socket::Unix(UnixStream::connect(path)?))
    }

    pub fn connect_tcp(addr: impl ToSocketAddrs) -> Result<Handshake> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        Handshake::from_socket(Socket::Tcp(s))
    }

    /// Reads the greeting and answers with fixed-newstyle and no-zeroes flags.
    pub fn from_socket(socket: Socket) -> Result<Handshake> {
        let mut writer: BoxWrite = Box::new(socket.try_clone()?);
        let mut reader = BufReader::new(Box::new(socket.try_clone()?) as BoxRead);
        let mut g = [0u8; 18];
        reader.read_exact(&mut g)?;
        let (magic, opt) = (u64::from_be_bytes(g[0..8].try_into().unwrap()), u64::from_be_bytes(g[8..16].try_into().unwrap()));
        if magic != NBDMAGIC || opt != IHAVEOPT {
            return Err(protocol("not a newstyle NBD server"));
        }
        let server_flags = u16::from_be_bytes([g[16], g[17]]);
        if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(protocol("server does not speak fixed newstyle"));
        }
        let mut cf = FLAG_C_FIXED_NEWSTYLE;
        if server_flags & FLAG_NO_ZEROES != 0 {
            cf |= FLAG_C_NO_ZEROES;
        }
        writer.write_all(&cf.to_be_bytes())?;
        Ok(Handshake { reader, writer, socket, server_flags, structured: false, meta_context: None })
    }

    /// NBD_OPT_STARTTLS, then the TLS handshake: every later byte is encrypted.
    /// The server's certificate must match `server_name` and chain to a CA of
    /// `cfg` (see [`tls::client_config_from_ca`]).
    pub fn starttls(mut self, cfg: std::sync::Arc<rustls::ClientConfig>, server_name: &str) -> Result<Handshake> {
        self.option(OPT_STARTTLS, &[])?;
        if !self.reader.buffer().is_empty() {
            return Err(protocol("server sent bytes after accepting STARTTLS"));
        }
        let session = tls::connect(cfg, server_name, &self.socket).map_err(|e| ClientError::Tls(e.to_string()))?;
        self.reader = BufReader::new(Box::new(tls::TlsReader::new(session.clone(), self.socket.try_clone()?)));
        self.writer = Box::new(tls::TlsWriter::new(session, self.socket.try_clone()?));
        Ok(self)
    }

    /// Sends any option and returns every reply up to the final one (ACK or an
    /// error). Errors are returned as replies, not as `Err`.
    pub fn option_raw(&mut self, option: u32, data: &[u8]) -> Result<Vec<OptionReply>> {
        write_all_parts(&mut self.writer, &[&encode_option_header(option, data.len() as u32), data])?;
        let mut out = Vec::new();
        loop {
            let mut h = [0u8; 20];
            self.reader.read_exact(&mut h)?;
            let h = parse_option_reply_header(&h).map_err(|e| protocol(format!("option reply: {e}")))?;
            if h.option != option {
                return Err(protocol(format!("reply for option {} while waiting for {option}", h.option)));
            }
            if h.len > 16 << 20 {
                return Err(protocol(format!("option reply of {} bytes", h.len)));
            }
            let mut d = vec![0u8; h.len as usize];
            self.reader.read_exact(&mut d)?;
            let r = OptionReply { option, reply: h.reply, data: d };
            let last = r.reply == REP_ACK || r.is_error();
            out.push(r);
            if last {
                return Ok(out);
            }
        }
    }

    /// Like `option_raw`, but a final error becomes `Err(OptionRefused)`.
    fn option(&mut self, option: u32, data: &[u8]) -> Result<Vec<OptionReply>> {
        let mut replies = self.option_raw(option, data)?;
        let last = replies.pop().expect("at least one reply");
        if last.is_error() {
            return Err(ClientError::OptionRefused {
                option,
                reply: last.reply,
                message: String::from_utf8_lossy(&last.data).into_owned(),
            });
        }
        Ok(replies)
    }

    /// NBD_OPT_STRUCTURED_REPLY. `Ok(false)` if the server does not support it.
    pub fn structured_replies(&mut self) -> Result<bool> {
        match self.option(OPT_STRUCTURED_REPLY, &[]) {
            Ok(_) => {
                self.structured = true;
                Ok(true)
            }
            Err(ClientError::OptionRefused { reply: REP_ERR_UNSUP, .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// NBD_OPT_SET_META_CONTEXT; returns the (id, name) of each selected context.
    pub fn set_meta_context(&mut self, export: &str, queries: &[&str]) -> Result<Vec<(u32, String)>> {
        let replies = self.option(OPT_SET_META_CONTEXT, &encode_meta_context_request(export, queries))?;
        let ctxs = parse_meta_replies(&replies)?;
        self.meta_context = ctxs.iter().find(|(_, n)| n == BASE_ALLOCATION).map(|(id, _)| *id);
        Ok(ctxs)
    }

    /// NBD_OPT_LIST_META_CONTEXT; returns the context names.
    pub fn list_meta_contexts(&mut self, export: &str, queries: &[&str]) -> Result<Vec<String>> {
        let replies = self.option(OPT_LIST_META_CONTEXT, &encode_meta_context_request(export, queries))?;
        Ok(parse_meta_replies(&replies)?.into_iter().map(|(_, n)| n).collect())
    }

    /// NBD_OPT_LIST.
    pub fn list(&mut self) -> Result<Vec<ExportEntry>> {
        let replies = self.option(OPT_LIST, &[])?;
        replies
            .iter()
            .filter(|r| r.reply == REP_SERVER)
            .map(|r| {
                let d = &r.data;
                let n = d.get(0..4).map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize).ok_or_else(|| protocol("short REP_SERVER"))?;
                let name = d.get(4..4 + n).ok_or_else(|| protocol("REP_SERVER name overruns the reply"))?;
                Ok(ExportEntry {
                    name: String::from_utf8_lossy(name).into_owned(),
                    description: String::from_utf8_lossy(&d[4 + n..]).into_owned(),
                })
            })
            .collect()
    }

    /// NBD_OPT_INFO, asking for name, description and block sizes.
    pub fn info(&mut self, export: &str) -> Result<ExportInfo> {
        let replies = self.option(OPT_INFO, &encode_info_request(export, &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]))?;
        parse_info_replies(&replies)
    }

    /// NBD_OPT_GO: enters transmission on `export`.
    pub fn go(mut self, export: &str) -> Result<Client> {
        let replies = self.option(OPT_GO, &encode_info_request(export, &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]))?;
        let info = parse_info_replies(&replies)?;
        Ok(self.into_client(info))
    }

    /// NBD_OPT_EXPORT_NAME (the old way in; the server closes if the name is unknown).
    pub fn export_name(mut self, export: &str) -> Result<Client> {
        write_all_parts(&mut self.writer, &[&encode_option_header(OPT_EXPORT_NAME, export.len() as u32), export.as_bytes()])?;
        let mut b = [0u8; 10];
        self.reader.read_exact(&mut b)?;
        if self.server_flags & FLAG_NO_ZEROES == 0 {
            let mut z = [0u8; 124];
            self.reader.read_exact(&mut z)?;
        }
        let info = ExportInfo {
            size: u64::from_be_bytes(b[0..8].try_into().unwrap()),
            flags: u16::from_be_bytes([b[8], b[9]]),
            ..Default::default()
        };
        Ok(self.into_client(info))
    }

    /// NBD_OPT_ABORT: ends the session politely.
    pub fn abort(mut self) -> Result<()> {
        let _ = self.option_raw(OPT_ABORT, &[]);
        Ok(())
    }

    fn into_client(self, info: ExportInfo) -> Client {
        Client {
            reader: self.reader,
            writer: self.writer,
            socket: self.socket,
            info,
            structured: self.structured,
            meta_context: self.meta_context,
            next_cookie: 1,
            pending: HashMap::new(),
            done: HashMap::new(),
        }
    }
}

fn parse_meta_replies(replies: &[OptionReply]) -> Result<Vec<(u32, String)>> {
    replies
        .iter()
        .filter(|r| r.reply == REP_META_CONTEXT)
        .map(|r| {
            if r.data.len() < 4 {
                return Err(protocol("short REP_META_CONTEXT"));
            }
            let id = u32::from_be_bytes(r.data[0..4].try_into().unwrap());
            Ok((id, String::from_utf8_lossy(&r.data[4..]).into_owned()))
        })
        .collect()
}

fn parse_info_replies(replies: &[OptionReply]) -> Result<ExportInfo> {
    let mut info = ExportInfo::default();
    let mut got_export = false;
    for r in replies.iter().filter(|r| r.reply == REP_INFO) {
        let d = &r.data;
        if d.len() < 2 {
            return Err(protocol("short REP_INFO"));
        }
        let body = &d[2..];
        match u16::from_be_bytes([d[0], d[1]]) {
            INFO_EXPORT if body.len() == 10 => {
                info.size = u64::from_be_bytes(body[0..8].try_into().unwrap());
                info.flags = u16::from_be_bytes([body[8], body[9]]);
                got_export = true;
            }
            INFO_NAME => info.name = Some(String::from_utf8_lossy(body).into_owned()),
            INFO_DESCRIPTION => info.description = Some(String::from_utf8_lossy(body).into_owned()),
            INFO_BLOCK_SIZE if body.len() == 12 => {
                let w = |i: usize| u32::from_be_bytes(body[i..i + 4].try_into().unwrap());
                info.block_size = Some((w(0), w(4), w(8)));
            }
            INFO_EXPORT | INFO_BLOCK_SIZE => return Err(protocol("REP_INFO of the wrong length")),
            _ => {}
        }
    }
    if !got_export {
        return Err(protocol("no NBD_INFO_EXPORT in the reply"));
    }
    Ok(info)
}

/// One block status descriptor of `base:allocation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusExtent {
    pub len: u32,
    /// `proto::STATE_HOLE` | `proto::STATE_ZERO`.
    pub flags: u32,
}

/// Which kind of content chunk answered part of a read (structured replies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadChunk {
    Data { offset: u64, len: u32 },
    Hole { offset: u64, len: u32 },
}

/// A completed request.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub cookie: u64,
    /// `(errno, message)` if the server reported an error.
    pub error: Option<(u32, String)>,
    /// Read data, assembled (holes as zeroes).
    pub data: Vec<u8>,
    /// The content chunks of a structured read, in arrival order.
    pub chunks: Vec<ReadChunk>,
    /// Block status descriptors.
    pub extents: Vec<StatusExtent>,
    /// The reply was a simple reply.
    pub simple: bool,
}

impl Reply {
    pub fn into_result(self) -> Result<Reply> {
        match self.error {
            Some((errno, message)) => Err(ClientError::Request { errno, message }),
            None => Ok(self),
        }
    }
}

/// A request in flight, as its replies are folded in.
pub(crate) struct Pending {
    pub(crate) cmd: u16,
    pub(crate) offset: u64,
    pub(crate) len: u32,
    pub(crate) reply: Reply,
    pub(crate) covered: u64,
}

impl Pending {
    pub(crate) fn new(cookie: u64, cmd: u16, offset: u64, len: u32) -> Pending {
        Pending { cmd, offset, len, reply: Reply { cookie, ..Default::default() }, covered: 0 }
    }

    /// Checks a finished structured reply against the request.
    pub(crate) fn finish(self) -> Result<Reply> {
        if self.cmd == CMD_READ && self.reply.error.is_none() && self.covered != self.len as u64 {
            return Err(protocol(format!("read reply covers {} of {} bytes", self.covered, self.len)));
        }
        if self.cmd == CMD_BLOCK_STATUS && self.reply.error.is_none() && self.reply.extents.is_empty() {
            return Err(protocol("block status reply without descriptors"));
        }
        Ok(self.reply)
    }
}

/// See [`Client::into_parts`].
pub(crate) struct ClientParts {
    pub(crate) reader: BufReader<BoxRead>,
    pub(crate) writer: BoxWrite,
    pub(crate) socket: Socket,
    pub(crate) info: ExportInfo,
    pub(crate) structured: bool,
    pub(crate) meta_context: Option<u32>,
}

/// Flags of NBD_CMD_WRITE_ZEROES.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZeroFlags {
    pub fua: bool,
    /// Allocate (do not punch holes).
    pub no_hole: bool,
    /// Fail with ENOTSUP rather than zero slowly.
    pub fast: bool,
}

/// The transmission phase of a connection.
pub struct Client {
    reader: BufReader<BoxRead>,
    writer: BoxWrite,
    socket: Socket,
    info: ExportInfo,
    structured: bool,
    meta_context: Option<u32>,
    next_cookie: u64,
    pending: HashMap<u64, Pending>,
    done: HashMap<u64, Reply>,
}

impl Client {
    /// Connects and negotiates as `opts` says (structured replies, base:allocation, GO).
    pub fn connect_unix(path: impl AsRef<Path>, opts: &ClientOptions) -> Result<Client> {
        Self::negotiate(Handshake::connect_unix(path)?, opts)
    }

    pub fn connect_tcp(addr: impl ToSocketAddrs, opts: &ClientOptions) -> Result<Client> {
        Self::negotiate(Handshake::connect_tcp(addr)?, opts)
    }

    fn negotiate(mut h: Handshake, opts: &ClientOptions) -> Result<Client> {
        if opts.structured_replies && h.structured_replies()? && opts.block_status {
            h.set_meta_context(&opts.export, &[BASE_ALLOCATION])?;
        }
        h.go(&opts.export)
    }

    pub fn info(&self) -> &ExportInfo {
        &self.info
    }
    pub fn size(&self) -> u64 {
        self.info.size
    }
    pub fn structured(&self) -> bool {
        self.structured
    }
    /// Whether `base:allocation` was negotiated.
    pub fn has_block_status(&self) -> bool {
        self.meta_context.is_some()
    }
    /// Requests sent and not yet collected.
    pub fn in_flight(&self) -> usize {
        self.pending.len() + self.done.len()
    }

    /// Sends a request (with `payload` for writes) and returns its cookie.
    pub fn submit(&mut self, cmd: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> Result<u64> {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let hdr = encode_request(&Request { flags, cmd, cookie, offset, len });
        write_all_parts(&mut self.writer, &[&hdr, payload])?;
        if cmd != CMD_DISC {
            self.pending.insert(cookie, Pending::new(cookie, cmd, offset, len));
        }
        Ok(cookie)
    }

    /// The connection's halves and what was negotiated, for a client that
    /// reads replies on its own thread (`remote`). Nothing may be in flight.
    pub(crate) fn into_parts(self) -> ClientParts {
        ClientParts {
            reader: self.reader,
            writer: self.writer,
            socket: self.socket,
            info: self.info,
            structured: self.structured,
            meta_context: self.meta_context,
        }
    }

    /// Sends raw bytes (for tests of malformed input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.writer.write_all(bytes)?;
        Ok(())
    }

    /// Waits for the reply to `cookie` (replies to others are kept for later).
    pub fn wait(&mut self, cookie: u64) -> Result<Reply> {
        loop {
            if let Some(r) = self.done.remove(&cookie) {
                return Ok(r);
            }
            if !self.pending.contains_key(&cookie) {
                return Err(protocol(format!("cookie {cookie} is not in flight")));
            }
            self.receive_one()?;
        }
    }

    /// Waits for any reply.
    pub fn wait_any(&mut self) -> Result<Reply> {
        loop {
            if let Some(&c) = self.done.keys().next() {
                return Ok(self.done.remove(&c).expect("present"));
            }
            if self.pending.is_empty() {
                return Err(protocol("nothing in flight"));
            }
            self.receive_one()?;
        }
    }

    fn call(&mut self, cmd: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> Result<Reply> {
        let c = self.submit(cmd, flags, offset, len, payload)?;
        self.wait(c)?.into_result()
    }

    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let r = self.call(CMD_READ, 0, offset, buf.len() as u32, &[])?;
        buf.copy_from_slice(&r.data);
        Ok(())
    }

    /// A read returning the whole reply (chunks, data), with raw command flags.
    pub fn read_reply(&mut self, offset: u64, len: u32, flags: u16) -> Result<Reply> {
        self.call(CMD_READ, flags, offset, len, &[])
    }

    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.call(CMD_WRITE, flags, offset, data.len() as u32, data).map(|_| ())
    }

    pub fn flush(&mut self) -> Result<()> {
        self.call(CMD_FLUSH, 0, 0, 0, &[]).map(|_| ())
    }

    pub fn trim(&mut self, offset: u64, len: u32, fua: bool) -> Result<()> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.call(CMD_TRIM, flags, offset, len, &[]).map(|_| ())
    }

    pub fn write_zeroes(&mut self, offset: u64, len: u32, z: ZeroFlags) -> Result<()> {
        let mut flags = 0;
        if z.fua {
            flags |= CMD_FLAG_FUA;
        }
        if z.no_hole {
            flags |= CMD_FLAG_NO_HOLE;
        }
        if z.fast {
            flags |= CMD_FLAG_FAST_ZERO;
        }
        self.call(CMD_WRITE_ZEROES, flags, offset, len, &[]).map(|_| ())
    }

    pub fn cache(&mut self, offset: u64, len: u32) -> Result<()> {
        self.call(CMD_CACHE, 0, offset, len, &[]).map(|_| ())
    }

    /// `base:allocation` descriptors for `[offset, offset+len)`.
    pub fn block_status(&mut self, offset: u64, len: u32, req_one: bool) -> Result<Vec<StatusExtent>> {
        let flags = if req_one { CMD_FLAG_REQ_ONE } else { 0 };
        Ok(self.call(CMD_BLOCK_STATUS, flags, offset, len, &[])?.extents)
    }

    /// NBD_CMD_DISC, after collecting every reply still in flight.
    pub fn disconnect(mut self) -> Result<()> {
        while !self.pending.is_empty() {
            self.receive_one()?;
        }
        self.submit(CMD_DISC, 0, 0, 0, &[])?;
        let _ = self.socket.shutdown(std::net::Shutdown::Write);
        Ok(())
    }

    /// Reads one reply message (simple reply or one chunk).
    fn receive_one(&mut self) -> Result<()> {
        let mut magic = [0u8; 4];
        self.reader.read_exact(&mut magic)?;
        let n = reply_header_len(&magic).map_err(|e| protocol(format!("reply: {e}")))?;
        let mut h = [0u8; CHUNK_HEADER_LEN];
        h[..4].copy_from_slice(&magic);
        self.reader.read_exact(&mut h[4..n])?;
        match parse_reply_header(&h[..n]).map_err(|e| protocol(e.to_string()))? {
            ReplyHeader::Simple { error, cookie } => self.simple_reply(error, cookie),
            ReplyHeader::Chunk { flags, kind, cookie, len } => self.chunk(flags, kind, cookie, len),
        }
    }

    fn simple_reply(&mut self, error: u32, cookie: u64) -> Result<()> {
        let mut p = self.pending.remove(&cookie).ok_or_else(|| protocol(format!("reply to unknown cookie {cookie}")))?;
        p.reply.simple = true;
        if error != 0 {
            p.reply.error = Some((error, String::new()));
        } else if p.cmd == CMD_READ {
            if self.structured {
                return Err(protocol("simple reply to a read after structured replies were negotiated"));
            }
            p.reply.data = vec![0u8; p.len as usize];
            self.reader.read_exact(&mut p.reply.data)?;
        }
        self.done.insert(cookie, p.reply);
        Ok(())
    }

    fn chunk(&mut self, flags: u16, kind: u16, cookie: u64, len: u32) -> Result<()> {
        if !self.structured {
            return Err(protocol("structured reply without negotiation"));
        }
        if len > HARD_MAX_PAYLOAD_CLIENT {
            return Err(protocol(format!("chunk of {len} bytes")));
        }
        let p = self.pending.get_mut(&cookie).ok_or_else(|| protocol(format!("chunk for unknown cookie {cookie}")))?;
        let mut payload = vec![0u8; len as usize];
        self.reader.read_exact(&mut payload)?;
        apply_chunk(p, kind, &payload)?;
        if flags & REPLY_FLAG_DONE != 0 {
            let p = self.pending.remove(&cookie).expect("present");
            self.done.insert(cookie, p.finish()?);
        }
        Ok(())
    }
}

/// Largest chunk the client accepts (a 64 MiB read plus its offset).
pub(crate) const HARD_MAX_PAYLOAD_CLIENT: u32 = (64 << 20) + 8;

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().unwrap())
}

/// Folds one structured chunk into the pending reply, checking it against the request.
pub(crate) fn apply_chunk(p: &mut Pending, kind: u16, payload: &[u8]) -> Result<()> {
    match kind {
        REPLY_TYPE_NONE if payload.is_empty() => Ok(()),
        REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE if p.cmd == CMD_READ => {
            if payload.len() < 8 {
                return Err(protocol("short content chunk"));
            }
            let off = be64(payload);
            let (n, hole) = if kind == REPLY_TYPE_OFFSET_DATA {
                ((payload.len() - 8) as u64, false)
            } else if payload.len() == 12 {
                (be32(&payload[8..]) as u64, true)
            } else {
                return Err(protocol("hole chunk is not 12 bytes"));
            };
            let rel = off.checked_sub(p.offset).filter(|r| r + n <= p.len as u64 && n > 0);
            let rel = rel.ok_or_else(|| protocol(format!("chunk at {off}+{n} outside the read at {}+{}", p.offset, p.len)))?;
            // Chunks may not overlap, so together they cover at most the read:
            // a server repeating chunks would otherwise grow the reply forever.
            if p.covered + n > p.len as u64 {
                return Err(protocol(format!("chunks cover more than the {} bytes read (overlapping chunks)", p.len)));
            }
            if p.reply.data.len() != p.len as usize {
                p.reply.data = vec![0u8; p.len as usize];
            }
            let dst = &mut p.reply.data[rel as usize..(rel + n) as usize];
            if hole {
                dst.fill(0);
                p.reply.chunks.push(ReadChunk::Hole { offset: off, len: n as u32 });
            } else {
                dst.copy_from_slice(&payload[8..]);
                p.reply.chunks.push(ReadChunk::Data { offset: off, len: n as u32 });
            }
            p.covered += n;
            Ok(())
        }
        REPLY_TYPE_BLOCK_STATUS if p.cmd == CMD_BLOCK_STATUS => {
            if payload.len() < 12 || (payload.len() - 4) % 8 != 0 {
                return Err(protocol("malformed block status chunk"));
            }
            for d in payload[4..].chunks_exact(8) {
                let e = StatusExtent { len: be32(d), flags: be32(&d[4..]) };
                if e.len == 0 {
                    return Err(protocol("zero-length block status descriptor"));
                }
                // Descriptors (over every chunk of the reply) describe the
                // request; only the last may reach past its end (the spec
                // allows it), so their number is bounded by its length.
                if p.covered >= p.len as u64 {
                    return Err(protocol(format!("block status describes more than the {} bytes asked", p.len)));
                }
                p.covered += e.len as u64;
                p.reply.extents.push(e);
            }
            Ok(())
        }
        k if k & 0x8000 != 0 => {
            if payload.len() < 6 {
                return Err(protocol("short error chunk"));
            }
            let errno = be32(payload);
            let mlen = u16::from_be_bytes([payload[4], payload[5]]) as usize;
            let msg = payload.get(6..6 + mlen).ok_or_else(|| protocol("error message overruns the chunk"))?;
            if errno == 0 {
                return Err(protocol("error chunk with errno 0"));
            }
            p.reply.error = Some((errno, String::from_utf8_lossy(msg).into_owned()));
            Ok(())
        }
        other => Err(protocol(format!("unexpected chunk type {other} for command {}", p.cmd))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hole(off: u64, len: u32) -> Vec<u8> {
        [&off.to_be_bytes()[..], &len.to_be_bytes()].concat()
    }

    fn status(descriptors: &[(u32, u32)]) -> Vec<u8> {
        let mut p = 1u32.to_be_bytes().to_vec();
        for (len, flags) in descriptors {
            p.extend_from_slice(&len.to_be_bytes());
            p.extend_from_slice(&flags.to_be_bytes());
        }
        p
    }

    #[test]
    fn overlapping_hole_chunks_beyond_the_reads_coverage_are_refused() {
        let mut p = Pending::new(1, CMD_READ, 4096, 8192);
        apply_chunk(&mut p, REPLY_TYPE_OFFSET_HOLE, &hole(4096, 8192)).unwrap();
        // The same range again: a server that never stops would grow the reply without end.
        let e = apply_chunk(&mut p, REPLY_TYPE_OFFSET_HOLE, &hole(4096, 4096)).unwrap_err();
        assert!(e.to_string().contains("overlapping"), "{e}");
        assert_eq!(p.reply.chunks.len(), 1, "the refused chunk is not kept");
    }

    #[test]
    fn block_status_descriptors_stop_at_the_requests_coverage_over_all_chunks() {
        // Covered exactly by two chunks, then more: each extra chunk alone is
        // within the request (all a per-chunk check sees), together they are
        // not (the check before issue 38 took every one of them).
        let mut q = Pending::new(1, CMD_BLOCK_STATUS, 0, 8192);
        apply_chunk(&mut q, REPLY_TYPE_BLOCK_STATUS, &status(&[(4096, 0)])).unwrap();
        apply_chunk(&mut q, REPLY_TYPE_BLOCK_STATUS, &status(&[(4096, 3)])).unwrap();
        for _ in 0..3 {
            let e = apply_chunk(&mut q, REPLY_TYPE_BLOCK_STATUS, &status(&[(512, 0)])).unwrap_err();
            assert!(e.to_string().contains("more than the 8192 bytes"), "{e}");
        }
        assert_eq!(q.reply.extents.len(), 2);
        let mut p = Pending::new(1, CMD_BLOCK_STATUS, 0, 8192);
        apply_chunk(&mut p, REPLY_TYPE_BLOCK_STATUS, &status(&[(4096, 0)])).unwrap();
        // The last descriptor may reach past the request (the spec allows it).
        apply_chunk(&mut p, REPLY_TYPE_BLOCK_STATUS, &status(&[(1 << 20, 3)])).unwrap();
        // Anything after the request is covered is refused, chunk after chunk.
        for _ in 0..3 {
            let e = apply_chunk(&mut p, REPLY_TYPE_BLOCK_STATUS, &status(&[(512, 0)])).unwrap_err();
            assert!(e.to_string().contains("more than the 8192 bytes"), "{e}");
        }
        assert_eq!(p.reply.extents.len(), 2);
        assert_eq!(p.finish().unwrap().extents.len(), 2);
    }
}
