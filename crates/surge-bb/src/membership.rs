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

/// How to log in to etcd: a user and password (etcd's auth), and for
/// `https://` endpoints the CA to check it with (and a client certificate,
/// for an etcd started with --client-cert-auth). `Debug` hides the password.
#[derive(Clone, Default)]
pub struct EtcdAuth {
    pub user: Option<String>,
    pub password: Option<String>,
    /// `ca-cert.pem`, and optionally `client-cert.pem` + `client-key.pem`.
    pub tls_dir: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuth").field("user", &self.user).field("password", &self.password.as_ref().map(|_| "***")).field("tls_dir", &self.tls_dir).finish()
    }
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
    /// The registration last put (re-put when it changes, e.g. drain progress).
    last: parking_lot::Mutex<String>,
}

impl Etcd {
    pub fn connect(url: &str, fs: &str) -> Result<Etcd, MembershipError> {
        Self::connect_with(url, fs, &EtcdAuth::default())
    }

    /// [`Etcd::connect`], logging in and checking TLS as `auth` says.
    pub fn connect_with(url: &str, fs: &str, auth: &EtcdAuth) -> Result<Etcd, MembershipError> {
        let unreachable = |e: etcd_client::Error| MembershipError::EtcdUnreachable { url: url.into(), why: e.to_string() };
        let mut opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5));
        if let (Some(u), Some(p)) = (&auth.user, &auth.password) {
            opts = opts.with_user(u.clone(), p.clone());
        }
        if let Some(dir) = &auth.tls_dir {
            if !url.starts_with("https://") {
                return Err(MembershipError::EtcdUnreachable { url: url.into(), why: "etcd TLS is configured but the endpoint is not https://".into() });
            }
            let read = |f: &str| std::fs::read(dir.join(f)).map_err(|e| MembershipError::EtcdUnreachable { url: url.into(), why: format!("{}: {e}", dir.join(f).display()) });
            let mut tls = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(read("ca-cert.pem")?));
            if dir.join("client-cert.pem").exists() {
                tls = tls.identity(etcd_client::Identity::from_pem(read("client-cert.pem")?, read("client-key.pem")?));
            }
            opts = opts.with_tls(tls);
        }
        let client = crate::s3::RT.block_on(etcd_client::Client::connect([url], Some(opts))).map_err(unreachable)?;
        let e = Etcd { url: url.into(), prefix: format!("/surge-bb/{fs}/nodes/"), client: tokio::sync::Mutex::new(client), lease: Default::default(), last: Default::default() };
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
        let info = serde_json::to_string(node).unwrap_or_default();
        crate::s3::RT.block_on(async {
            let mut c = self.client.lock().await;
            if let Some(id) = lease {
                let (mut keeper, mut stream) = c.lease_keep_alive(id).await.map_err(|e| self.unreachable(e))?;
                keeper.keep_alive().await.map_err(|e| self.unreachable(e))?;
                if let Some(r) = stream.message().await.map_err(|e| self.unreachable(e))? {
                    if r.ttl() > 0 {
                        if *self.last.lock() != info {
                            c.put(format!("{}{}", self.prefix, node.addr), info.clone(), Some(etcd_client::PutOptions::new().with_lease(id)))
                                .await
                                .map_err(|e| self.unreachable(e))?;
                            *self.last.lock() = info;
                        }
                        return Ok(());
                    }
                }
            }
            // No lease yet, or it expired: take a new one and register under it.
            let l = c.lease_grant(LEASE.as_secs() as i64, None).await.map_err(|e| self.unreachable(e))?;
            c.put(format!("{}{}", self.prefix, node.addr), info.clone(), Some(etcd_client::PutOptions::new().with_lease(l.id())))
                .await
                .map_err(|e| self.unreachable(e))?;
            *self.lease.lock() = Some(l.id());
            *self.last.lock() = info;
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
    open_with(spec, fs, meta, &EtcdAuth::default())
}

/// [`open`], logging in to etcd (`etcd:https://...` with TLS) as `etcd` says.
pub fn open_with(spec: &str, fs: &str, meta: Arc<dyn MetaStore>, etcd: &EtcdAuth) -> Result<Arc<dyn Membership>, MembershipError> {
    if let Some(list) = spec.strip_prefix("static:") {
        let nodes = list.split(',').filter(|s| !s.is_empty()).map(|a| NodeInfo::new(a, 0)).collect();
        Ok(Arc::new(Static(nodes)))
    } else if let Some(url) = spec.strip_prefix("etcd:") {
        #[cfg(feature = "etcd")]
        return Ok(Arc::new(Etcd::connect_with(url, fs, etcd)?));
        #[cfg(not(feature = "etcd"))]
        return {
            let _ = (fs, etcd); // the etcd key prefix and login, unused without etcd
            Err(MembershipError::EtcdNotBuilt { spec: format!("etcd:{url}") })
        };
    } else {
        Ok(Arc::new(MetaMembership(meta)))
    }
}
