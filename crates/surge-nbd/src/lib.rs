//! surge-nbd: the NBD protocol for surge, written from NetworkBlockDevice/nbd
//! `doc/proto.md`.
//!
//! * [`Server`] serves [`Export`]s (any `Arc<dyn BlockDev>`) over unix sockets and
//!   TCP: fixed newstyle handshake (GO, INFO, LIST, ABORT, EXPORT_NAME,
//!   STRUCTURED_REPLY, EXTENDED_HEADERS (64-bit lengths, BLOCK_STATUS_EXT; clients
//!   that do not ask keep compact headers), LIST/SET_META_CONTEXT with
//!   `base:allocation`), commands
//!   READ, WRITE(+FUA), FLUSH, TRIM, WRITE_ZEROES(+NO_HOLE, FAST_ZERO), CACHE,
//!   BLOCK_STATUS and DISC, many requests in flight per connection with replies
//!   out of order, transmission flags advertised from the device's [`Caps`],
//!   optional TLS (NBD_OPT_STARTTLS).
//! * [`client::Client`] is a small blocking client (used by tests, torture tests
//!   and experiments).
//! * [`RemoteDev`] ([`remote`]) is a remote export as a `BlockDev`: many
//!   requests in flight over several connections, block status, TLS,
//!   reconnect with retry and replay of unflushed writes; `nbd://`,
//!   `nbd+unix://`, `nbds://` URIs.
//! * [`proto`] holds the wire constants and pure parsers; [`fuzz_handshake`] and
//!   [`fuzz_requests`] feed arbitrary bytes to the real server code.
//!
//! ```no_run
//! use std::sync::Arc;
//! use surge_nbd::{Export, Listen, Server, ServerConfig};
//! let dev = Arc::new(surge_block::MemoryDev::new(64 << 20));
//! let server = Server::start(ServerConfig::new(vec![Export::new("disk", dev)])).unwrap();
//! server.listen(&Listen::Unix("/tmp/surge.sock".into())).unwrap();
//! // ... later, e.g. on SIGTERM: stop accepting, finish in-flight requests, flush.
//! server.shutdown().unwrap();
//! ```
//!
//! Request flow: an acceptor thread per listener (unix or TCP with
//! TCP_NODELAY) → one thread per connection runs the handshake (and STARTTLS)
//! → it and `threads_per_connection - 1` peers serve the connection leader/follower
//! style: whoever holds the connection's input reads the next request header
//! (buffered) and its complete payload into a pooled buffer, then runs it on the
//! device; a small read/write on a fast export (measured) runs without giving up
//! the input, anything else after handing the input to a peer, so slow requests
//! overlap and replies go out of order. Replies queue per connection and
//! whichever thread finds the queue unattended sends all of it with one
//! `writev` (device I/O never happens under the writer lock). At most
//! `max_in_flight` requests per connection are read ahead (backpressure).
//!
//! TLS: [`tls`] (rustls, X.509; `ServerConfig::tls_mode`/`tls`).
//!
//! Access: [`Export::allow`] takes an [`AllowList`] of client addresses
//! (networks, addresses, `unix`); a client outside it does not see the export in
//! NBD_OPT_LIST, gets NBD_REP_ERR_POLICY on NBD_OPT_INFO/GO/LIST_META_CONTEXT/
//! SET_META_CONTEXT, and is disconnected on NBD_OPT_EXPORT_NAME (which cannot
//! carry an error).
//!
//! Errors: device errors go on the wire as `BlockError::errno()` mapped by
//! [`proto::wire_errno`]; reads, TRIM, CACHE and BLOCK_STATUS past the end get
//! EINVAL, writes and WRITE_ZEROES past the end ENOSPC (as the spec says),
//! writes to read-only exports EPERM, FAST_ZERO on an export that does not
//! advertise it EINVAL (ENOTSUP only answers a fast zero the device cannot do
//! fast); structured reads longer than [`MAX_BLOCK`] come back in chunks of at
//! most [`MAX_BLOCK`] (EOVERFLOW with NBD_CMD_FLAG_DF, or past
//! [`HARD_MAX_PAYLOAD`]); the connection stays usable. Garbage magic or a write
//! payload over [`HARD_MAX_PAYLOAD`] closes only that connection.
//!
//! [`Caps`]: surge_block::Caps

pub mod access;
pub mod client;
mod fuzz;
mod handshake;
mod io;
pub mod proto;
pub mod remote;
mod server;
pub mod tls;
mod transmission;
mod zerocopy;

pub use access::{AllowList, AllowRule, Peer};
pub use fuzz::{fuzz_handshake, fuzz_requests};
pub use io::{bind_unix, Socket};
pub use remote::{NbdUri, RemoteDev, RemoteError, RemoteOptions, RemoteStats};
pub use server::{Export, ExportStats, PeerRoute, Listen, Result, Server, ServerConfig, ServerError, ServerStats, GRACE_OVER, UNIX_SOCKET_MODE};
pub use tls::TlsMode;
pub use transmission::{HARD_MAX_PAYLOAD, MAX_BLOCK};
