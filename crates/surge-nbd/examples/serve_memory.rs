//! Serves a memory export on a unix socket until killed (for trying real clients):
//! `cargo run -p surge-nbd --example serve_memory -- /tmp/s.sock 64`
use std::sync::Arc;
use surge_nbd::{Export, Listen, Server, ServerConfig};

fn main() {
    let mut args = std::env::args().skip(1);
    let sock = args.next().unwrap_or_else(|| "/tmp/surge-nbd.sock".into());
    let mib: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(64);
    let mut e = Export::new("mem", Arc::new(surge_block::MemoryDev::new(mib << 20)));
    e.description = "a memory export".into();
    let server = Server::start(ServerConfig::new(vec![e])).expect("start");
    server.listen(&Listen::Unix(sock.into())).expect("listen");
    loop {
        std::thread::park();
    }
}
