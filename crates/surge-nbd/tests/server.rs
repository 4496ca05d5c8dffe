//! The server against the crate's own client over real sockets.

use std::path::PathBuf;
use std::sync::Arc;
use surge_block::{BlockDev, MemoryDev};
use surge_nbd::client::{Client, ClientOptions, Handshake};
use surge_nbd::proto::*;
use surge_nbd::{Export, Listen, Server, ServerConfig};

struct Running {
    server: Option<Server>,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(cfg: ServerConfig) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nbd.sock");
        let server = Server::start(cfg).unwrap();
        server.listen(&Listen::Unix(sock.clone())).unwrap();
        Running { server: Some(server), sock, _dir: dir }
    }

    fn one(dev: Arc<dyn BlockDev>) -> Running {
        Running::start(ServerConfig::new(vec![Export::new("disk", dev)]))
    }

    fn client(&self) -> Client {
        Client::connect_unix(&self.sock, &ClientOptions::default()).unwrap()
    }

    fn client_with(&self, opts: ClientOptions) -> Client {
        Client::connect_unix(&self.sock, &opts).unwrap()
    }

    fn handshake(&self) -> Handshake {
        Handshake::connect_unix(&self.sock).unwrap()
    }

    fn stop(mut self) {
        self.server.take().unwrap().shutdown().unwrap();
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn write_then_read_back_with_structured_and_simple_replies() {
    let srv = Running::one(Arc::new(MemoryDev::new(4 << 20)));
    let mut c = srv.client();
    assert!(c.structured());
    let data = pattern(100_000, 7);
    c.write(12345, &data, false).unwrap();
    c.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(12345, &mut back).unwrap();
    assert_eq!(back, data);
    c.disconnect().unwrap();

    let mut simple = srv.client_with(ClientOptions { structured_replies: false, block_status: false, ..Default::default() });
    assert!(!simple.structured());
    let mut back = vec![0u8; data.len()];
    simple.read(12345, &mut back).unwrap();
    assert_eq!(back, data);
    simple.disconnect().unwrap();
    srv.stop();
}
