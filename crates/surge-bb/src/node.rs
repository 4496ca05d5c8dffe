//! An I/O node: serves its chunk store over the node protocol, keeps its
//! membership lease alive, and runs write-back and re-replication.

use crate::meta::NodeInfo;
use crate::proto::{self, Request, Response, Status};
use crate::store::{ChunkStore, StoreConfig};
use crate::tier::Tier;
use crate::writeback::{Writeback, WritebackConfig};
use parking_lot::Mutex;
use std::io::{BufReader, BufWriter, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// Address to listen on, e.g. 127.0.0.1:7400 (port 0: any free port).
    pub listen: String,
    pub store: StoreConfig,
    pub writeback: WritebackConfig,
}

pub struct NodeHandle {
    pub addr: String,
    pub store: Arc<ChunkStore>,
    stop: Arc<AtomicBool>,
    tier: Arc<Tier>,
}

impl NodeHandle {
    /// Leaves the membership and stops the background loops (the listener
    /// thread ends with the process).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.tier.members.leave(&self.addr);
    }
}

fn handle(store: &ChunkStore, req: Request) -> Response {
    let ok = |body: Vec<u8>| Response { status: Status::Ok, body };
    match req {
        Request::Put { chunk, dirty, data } => match store.put(chunk, data, dirty) {
            Ok(()) => ok(vec![]),
            Err(e) => {
                tracing::warn!("refusing chunk {}: {e}", chunk.member());
                Response { status: Status::NoSpace, body: e.to_string().into_bytes() }
            }
        },
        Request::Get { chunk } => match store.get(&chunk) {
            Some(d) => ok(d.to_vec()),
            None => Response { status: Status::NotFound, body: vec![] },
        },
        Request::Delete { chunk } => {
            store.delete(&chunk);
            ok(vec![])
        }
        Request::MarkClean { chunk } => {
            store.mark_clean(&chunk);
            ok(vec![])
        }
        Request::Stat => ok(serde_json::to_vec(&store.stat()).unwrap_or_default()),
    }
}

fn serve_conn(store: Arc<ChunkStore>, stream: TcpStream) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let _ = stream.set_nodelay(true);
    let Ok(w) = stream.try_clone() else { return };
    let writer = Mutex::new(BufWriter::with_capacity(1 << 20, w));
    let mut r = BufReader::with_capacity(1 << 20, stream);
    loop {
        let payload = match proto::read_frame(&mut r) {
            Ok(Some(p)) => p,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!("client {peer}: {e}");
                return;
            }
        };
        let (id, resp) = match proto::decode_request(&payload) {
            Ok((id, req)) => (id, handle(&store, req)),
            Err(e) => {
                tracing::warn!("client {peer} sent a bad request: {e}; closing");
                return;
            }
        };
        let mut w = writer.lock();
        if proto::write_frame(&mut *w, &proto::encode_response(id, &resp)).and_then(|_| w.flush()).is_err() {
            return;
        }
    }
}

/// Starts a node: listener, lease heartbeat, write-back and maintenance loops.
pub fn start(cfg: NodeConfig, tier: Arc<Tier>) -> std::io::Result<NodeHandle> {
    let listener = TcpListener::bind(&cfg.listen)?;
    let addr = listener.local_addr()?.to_string();
    let store = Arc::new(ChunkStore::new(cfg.store.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = store.clone();
    std::thread::Builder::new().name("bb-listen".into()).spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(c) => {
                    let s = s2.clone();
                    let _ = std::thread::Builder::new().name("bb-serve".into()).spawn(move || serve_conn(s, c));
                }
                Err(e) => tracing::warn!("accept: {e}"),
            }
        }
    })?;
    let info = NodeInfo { addr: addr.clone(), capacity: cfg.store.capacity };
    if let Err(e) = tier.members.heartbeat(&info) {
        return Err(std::io::Error::other(format!("registering node {addr}: {e}")));
    }
    {
        let (tier, stop) = (tier.clone(), stop.clone());
        std::thread::Builder::new().name("bb-lease".into()).spawn(move || {
            let mut failing = false;
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(crate::membership::LEASE / 3);
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                match tier.members.heartbeat(&info) {
                    Ok(()) if failing => {
                        tracing::info!("membership lease renewed again");
                        failing = false;
                    }
                    Ok(()) => {}
                    Err(e) if !failing => {
                        tracing::error!("renewing membership lease: {e}");
                        failing = true;
                    }
                    Err(_) => {}
                }
            }
        })?;
    }
    let wb = Arc::new(Writeback::new(tier.clone(), store.clone(), addr.clone(), cfg.writeback.clone()));
    {
        let (wb, stop) = (wb.clone(), stop.clone());
        std::thread::Builder::new().name("bb-writeback".into()).spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if wb.tick() == 0 {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        })?;
    }
    {
        let stop = stop.clone();
        std::thread::Builder::new().name("bb-maintain".into()).spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_secs(1));
                wb.maintain();
            }
        })?;
    }
    tracing::info!("I/O node {addr} serving ({} MiB of memory)", cfg.store.capacity >> 20);
    Ok(NodeHandle { addr, store, stop, tier })
}
