//! Serves one export on a unix socket until killed, for trying real clients and
//! quick benchmarks without the CLI:
//! `serve SOCKET (file:PATH | mem:MIB) [WORKERS]`
use std::sync::Arc;
use surge_block::{BlockDev, FileDev, FileOptions, MemoryDev};
use surge_nbd::{Export, Listen, Server, ServerConfig};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(sock), Some(spec)) = (args.first(), args.get(1)) else {
        eprintln!("usage: serve SOCKET (file:PATH | mem:MIB) [WORKERS]");
        std::process::exit(2);
    };
    let dev: Arc<dyn BlockDev> = match spec.split_once(':') {
        Some(("file", p)) => Arc::new(FileDev::open(p, &FileOptions::default()).expect("open file")),
        Some(("mem", m)) => Arc::new(MemoryDev::new(m.parse::<u64>().expect("MiB") << 20)),
        _ => panic!("bad export spec {spec}"),
    };
    let mut cfg = ServerConfig::new(vec![Export::new("disk", dev)]);
    if let Some(w) = args.get(2) {
        cfg.threads_per_connection = w.parse().expect("workers");
    }
    // SURGE_TLS_DIR=DIR (server-cert.pem, server-key.pem) requires TLS.
    if let Ok(dir) = std::env::var("SURGE_TLS_DIR") {
        cfg.tls = Some(surge_nbd::tls::server_config_from_dir(dir.as_ref()).expect("TLS certificate"));
        cfg.tls_mode = surge_nbd::TlsMode::Require;
    }
    let server = Server::start(cfg).expect("start");
    server.listen(&Listen::Unix(sock.into())).expect("listen");
    loop {
        std::thread::park();
    }
}
