//! Which I/O nodes are alive. Nodes register with a lease and renew it; a node
//! whose lease lapses is dead to clients and write-back. Three sources:
//! - `Static`: a fixed list (one machine, no service at all),
//! - `Meta`: leases kept in the metadata store (the default: no extra service),
//! - `Etcd`: etcd leases through the `etcd-client` crate.

use crate::meta::{MetaStore, NodeInfo};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("etcd at {url} unreachable: {why}")]
    EtcdUnreachable { url: String, why: String },
    #[error("membership {spec:?}: this surge was built without etcd support; rebuild with `--features etcd` (needs protoc, Debian protobuf-compiler) or use `redis` or `static:ADDR,...`")]
    EtcdNotBuilt { spec: String },
    #[error("membership through metadata store: {0}")]
    Meta(#[from] crate::meta::MetaError),
}

/// How long a registration lives without renewal.
pub const LEASE: Duration = Duration::from_secs(3);

pub trait Membership: Send + Sync {
    /// Registers or renews `node` for one lease period.
    fn heartbeat(&self, node: &NodeInfo) -> Result<(), MembershipError>;
    fn live(&self) -> Result<Vec<NodeInfo>, MembershipError>;
    fn leave(&self, addr: &str) -> Result<(), MembershipError>;
}

pub struct Static(pub Vec<NodeInfo>);

impl Membership for Static {
    fn heartbeat(&self, _: &NodeInfo) -> Result<(), MembershipError> {
        Ok(())
    }
    fn live(&self) -> Result<Vec<NodeInfo>, MembershipError> {
        Ok(self.0.clone())
    }
    fn leave(&self, _: &str) -> Result<(), MembershipError> {
        Ok(())
    }
}

pub struct MetaMembership(pub Arc<dyn MetaStore>);

impl Membership for MetaMembership {
    fn heartbeat(&self, node: &NodeInfo) -> Result<(), MembershipError> {
        Ok(self.0.register_node(node, LEASE.as_millis() as u64)?)
    }
    fn live(&self) -> Result<Vec<NodeInfo>, MembershipError> {
        Ok(self.0.live_nodes()?)
    }
    fn leave(&self, addr: &str) -> Result<(), MembershipError> {
        Ok(self.0.deregister_node(addr)?)
    }
}

#[cfg(feature = "etcd")]
pub use etcd::Etcd;

#[cfg(feature = "etcd")]
mod etcd {
use super::*;

/// etcd: each node holds a lease (TTL = `LEASE`) and puts
/// `/surge-bb/{fs}/nodes/{addr}` under it; heartbeats renew the lease.
pub struct Etcd {
    url: String,
    prefix: String,
    client: tokio::sync::Mutex<etcd_client::Client>,
    lease: parking_lot::Mutex<Option<i64>>,
}

impl Etcd {
    pub fn connect(url: &str, fs: &str) -> Result<Etcd, MembershipError> {
        let unreachable = |e: etcd_client::Error| MembershipError::EtcdUnreachable { url: url.into(), why: e.to_string() };
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5));
        let client = crate::s3::RT.block_on(etcd_client::Client::connect([url], Some(opts))).map_err(unreachable)?;
        let e = Etcd { url: url.into(), prefix: format!("/surge-bb/{fs}/nodes/"), client: tokio::sync::Mutex::new(client), lease: Default::default() };
        // Connecting is lazy: ask something now so a wrong URL fails here.
        e.live()?;
        Ok(e)
    }

    fn unreachable(&self, e: etcd_client::Error) -> MembershipError {
        MembershipError::EtcdUnreachable { url: self.url.clone(), why: e.to_string() }
    }
}

impl Membership for Etcd {
    fn heartbeat(&self, node: &NodeInfo) -> Result<(), MembershipError> {
        let lease = *self.lease.lock();
        crate::s3::RT.block_on(async {
            let mut c = self.client.lock().await;
            if let Some(id) = lease {
                let (mut keeper, mut stream) = c.lease_keep_alive(id).await.map_err(|e| self.unreachable(e))?;
                keeper.keep_alive().await.map_err(|e| self.unreachable(e))?;
                if let Some(r) = stream.message().await.map_err(|e| self.unreachable(e))? {
                    if r.ttl() > 0 {
                        return Ok(());
                    }
                }
            }
            // No lease yet, or it expired: take a new one and register under it.
            let l = c.lease_grant(LEASE.as_secs() as i64, None).await.map_err(|e| self.unreachable(e))?;
            let info = serde_json::to_string(node).unwrap_or_default();
            c.put(format!("{}{}", self.prefix, node.addr), info, Some(etcd_client::PutOptions::new().with_lease(l.id())))
                .await
                .map_err(|e| self.unreachable(e))?;
            *self.lease.lock() = Some(l.id());
            Ok(())
        })
    }

    fn live(&self) -> Result<Vec<NodeInfo>, MembershipError> {
        crate::s3::RT.block_on(async {
            let mut c = self.client.lock().await;
            let r = c
                .get(self.prefix.clone(), Some(etcd_client::GetOptions::new().with_prefix()))
                .await
                .map_err(|e| self.unreachable(e))?;
            let mut v: Vec<NodeInfo> = r.kvs().iter().filter_map(|kv| serde_json::from_slice(kv.value()).ok()).collect();
            v.sort_by(|a, b| a.addr.cmp(&b.addr));
            Ok(v)
        })
    }

    fn leave(&self, addr: &str) -> Result<(), MembershipError> {
        crate::s3::RT.block_on(async {
            let mut c = self.client.lock().await;
            c.delete(format!("{}{addr}", self.prefix), None).await.map_err(|e| self.unreachable(e))?;
            Ok(())
        })
    }
}

}

/// `static:ADDR,ADDR` | `redis` (the metadata store) | `etcd:http://HOST:PORT`.
pub fn open(spec: &str, fs: &str, meta: Arc<dyn MetaStore>) -> Result<Arc<dyn Membership>, MembershipError> {
    if let Some(list) = spec.strip_prefix("static:") {
        let nodes = list.split(',').filter(|s| !s.is_empty()).map(|a| NodeInfo::new(a, 0)).collect();
        Ok(Arc::new(Static(nodes)))
    } else if let Some(url) = spec.strip_prefix("etcd:") {
        #[cfg(feature = "etcd")]
        return Ok(Arc::new(Etcd::connect(url, fs)?));
        #[cfg(not(feature = "etcd"))]
        return {
            let _ = fs; // names the etcd key prefix, unused without etcd
            Err(MembershipError::EtcdNotBuilt { spec: format!("etcd:{url}") })
        };
    } else {
        Ok(Arc::new(MetaMembership(meta)))
    }
}
