//! One transmission-phase connection shared by many threads: callers send
//! requests under a writer lock and wait on their own channel; one reader
//! thread per connection reads replies (simple or structured, in any order)
//! and hands each to its caller. When the connection breaks, every caller
//! waiting on it is told so at once (to retry elsewhere).

use crate::client::{apply_chunk, BoxRead, BoxWrite, ClientParts, ExportInfo, Pending, Reply, HARD_MAX_PAYLOAD_CLIENT};
use crate::io::{write_all_parts, Socket};
use crate::proto::*;
use crossbeam_channel::{bounded, Receiver, Sender};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;

/// How a request ended without a reply.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// The connection broke (or was closed): the request may or may not have
    /// reached the server; it may be sent again on another connection.
    Broken(String),
    /// The server's reply to *this* request broke the protocol: not retried.
    Protocol(String),
}

type Outcome = Result<Reply, Failure>;

struct Waiter {
    pending: Pending,
    tx: Sender<Outcome>,
}

#[derive(Default)]
struct Inflight {
    waiters: HashMap<u64, Waiter>,
    broken: Option<String>,
}

pub(crate) struct Conn {
    writer: Mutex<BoxWrite>,
    socket: Socket,
    inflight: Mutex<Inflight>,
    next_cookie: AtomicU64,
    dead: AtomicBool,
    pub(crate) info: ExportInfo,
    pub(crate) structured: bool,
    pub(crate) block_status: bool,
}

impl Conn {
    /// Take over a negotiated connection and start its reader thread.
    pub(crate) fn start(parts: ClientParts, name: &str) -> std::io::Result<Arc<Conn>> {
        let ClientParts { reader, writer, socket, info, structured, meta_context } = parts;
        let conn = Arc::new(Conn {
            writer: Mutex::new(writer),
            socket,
            inflight: Mutex::new(Inflight::default()),
            next_cookie: AtomicU64::new(1),
            dead: AtomicBool::new(false),
            info,
            structured,
            block_status: meta_context.is_some(),
        });
        let c = conn.clone();
        std::thread::Builder::new().name(format!("nbd-reply {name}")).spawn(move || c.read_replies(reader))?;
        Ok(conn)
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.dead.load(Acquire)
    }

    /// Send one request; the receiver gets its reply or why there is none.
    pub(crate) fn send(&self, cmd: u16, flags: u16, offset: u64, len: u32, payload: &[u8]) -> Result<Receiver<Outcome>, Failure> {
        let (tx, rx) = bounded(1);
        let cookie = self.next_cookie.fetch_add(1, Relaxed);
        {
            let mut inf = self.inflight.lock();
            if let Some(why) = &inf.broken {
                return Err(Failure::Broken(why.clone()));
            }
            // The chunk parser bounds what a reply may describe by the request
            // (block status: the last descriptor may reach past it, and the
            // caller clamps it).
            inf.waiters.insert(cookie, Waiter { pending: Pending::new(cookie, cmd, offset, len), tx });
        }
        let hdr = encode_request(&Request { flags, cmd, cookie, offset, len });
        let sent = write_all_parts(&mut *self.writer.lock(), &[&hdr, payload]);
        if let Err(e) = sent {
            let why = format!("sending a request: {e}");
            self.fail(&why);
            return Err(Failure::Broken(why));
        }
        Ok(rx)
    }

    /// Close the connection (a request waited too long, or we are done):
    /// callers waiting on it get `Broken`.
    pub(crate) fn kill(&self, why: &str) {
        self.fail(why);
    }

    /// Polite goodbye, then close.
    pub(crate) fn disconnect(&self) {
        if !self.is_broken() {
            let hdr = encode_request(&Request { flags: 0, cmd: CMD_DISC, cookie: 0, offset: 0, len: 0 });
            let _ = write_all_parts(&mut *self.writer.lock(), &[&hdr]);
        }
        self.fail("disconnected");
    }

    fn fail(&self, why: &str) {
        self.dead.store(true, Release);
        let waiters = {
            let mut inf = self.inflight.lock();
            inf.broken.get_or_insert_with(|| why.to_string());
            std::mem::take(&mut inf.waiters)
        };
        for (_, w) in waiters {
            let _ = w.tx.send(Err(Failure::Broken(why.to_string())));
        }
        let _ = self.socket.shutdown(Shutdown::Both);
    }

    fn read_replies(self: Arc<Self>, mut reader: BufReader<BoxRead>) {
        loop {
            if let Err((cookie, why)) = self.read_one(&mut reader) {
                // The reply that broke the protocol fails for good; the others retry.
                if let Some(w) = cookie.and_then(|c| self.inflight.lock().waiters.remove(&c)) {
                    let _ = w.tx.send(Err(Failure::Protocol(why.clone())));
                }
                self.fail(&why);
                return;
            }
        }
    }

    /// Read one reply message. Errors carry the cookie to blame, if any.
    fn read_one(&self, r: &mut BufReader<BoxRead>) -> Result<(), (Option<u64>, String)> {
        let io = |e: std::io::Error| (None, format!("reading a reply: {e}"));
        let mut h = [0u8; CHUNK_HEADER_LEN];
        r.read_exact(&mut h[..4]).map_err(io)?;
        let n = reply_header_len(&h[..4].try_into().expect("4 bytes")).map_err(|e| (None, format!("reply: {e}")))?;
        r.read_exact(&mut h[4..n]).map_err(io)?;
        match parse_reply_header(&h[..n]).map_err(|e| (None, e.to_string()))? {
            ReplyHeader::Simple { error, cookie } => {
                let w = self.inflight.lock().waiters.remove(&cookie);
                let mut w = w.ok_or((None, format!("reply to unknown cookie {cookie}")))?;
                let reply = &mut w.pending.reply;
                reply.simple = true;
                if error != 0 {
                    reply.error = Some((error, String::new()));
                } else if w.pending.cmd == CMD_READ {
                    if self.structured {
                        return Err((Some(cookie), "simple reply to a read after structured replies were negotiated".into()));
                    }
                    reply.data = vec![0u8; w.pending.len as usize];
                    r.read_exact(&mut reply.data).map_err(io)?;
                }
                let _ = w.tx.send(Ok(w.pending.reply));
            }
            ReplyHeader::Chunk { flags, kind, cookie, len } => {
                if !self.structured || len > HARD_MAX_PAYLOAD_CLIENT {
                    return Err((Some(cookie), format!("unexpected structured chunk of {len} bytes")));
                }
                let mut payload = vec![0u8; len as usize];
                r.read_exact(&mut payload).map_err(io)?;
                let mut inf = self.inflight.lock();
                let w = inf.waiters.get_mut(&cookie).ok_or((None, format!("chunk for unknown cookie {cookie}")))?;
                apply_chunk(&mut w.pending, kind, &payload).map_err(|e| (Some(cookie), e.to_string()))?;
                if flags & REPLY_FLAG_DONE != 0 {
                    let w = inf.waiters.remove(&cookie).expect("present");
                    drop(inf);
                    let reply = w.pending.finish().map_err(|e| (Some(cookie), e.to_string()))?;
                    let _ = w.tx.send(Ok(reply));
                }
            }
        }
        Ok(())
    }
}
