//! Where every process of the experiment runs: each role a machine of its
//! own (a network namespace behind an emulated link, `experiment::topology`),
//! as in the paper's EC2 setting, or all on loopback when the topology is off.
//!
//! The links, from the paper's EC2 figures (`shared/papers/burst-buffer.txt`):
//! 8 I/O-node/client pairs moved 2,500 MB/s (Fig. 8), so a machine's link is
//! 2,500 Mbit/s (312 MB/s) each way; S3 gave 250-330 MB/s to 8 nodes, so S3
//! serves each connection at 320 Mbit/s (40 MB/s) on its own, whatever the
//! others do (S3 limits connections, not the aggregate). Intra-cluster links are 50 µs one way at each end (same
//! region), S3 is 2 ms farther. The ratio between a machine's link and its
//! path to S3 is 7.8:1, the paper's.

use crate::experiment::streaming::proc::sh;
use crate::experiment::topology::{PortSpec, Topology};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

pub const CLIENT: &str = "client";
/// The second client: fresh-mount reads and the read-after-write check.
pub const READER: &str = "reader";
pub const META: &str = "meta";
pub const JFS_META: &str = "jfs-meta";
pub const S3: &str = "s3";
/// `surge bb pool` and the nodes it starts (local processes of that machine).
pub const POOL: &str = "pool";

pub fn node(i: usize) -> String {
    format!("node-{i}")
}

/// One machine's link inside the cluster.
pub const CLUSTER_LINK: PortSpec = PortSpec { rate_mbit: 2500, delay_us: 50, per_peer_mbit: 0 };
/// S3: any aggregate, each connection at 40 MB/s, 2 ms away.
pub const S3_LINK: PortSpec = PortSpec { rate_mbit: 0, delay_us: 2000, per_peer_mbit: 320 };

/// The machines of a run, or loopback.
#[derive(Clone)]
pub struct Machines {
    topo: Option<Arc<Topology>>,
    /// TLS material every node and client holds (nodes off loopback need it).
    tls: Option<PathBuf>,
}

impl Machines {
    /// Everything on loopback (the earlier setting, `SURGE_BB_TOPOLOGY=off`).
    pub fn loopback() -> Machines {
        Machines { topo: None, tls: None }
    }

    /// A machine per role, `nodes` I/O nodes of their own besides the pool's.
    pub fn up(work: &Path, nodes: usize) -> anyhow::Result<Machines> {
        let mut roles: Vec<(String, PortSpec)> = [CLIENT, READER, META, JFS_META, POOL].iter().map(|r| (r.to_string(), CLUSTER_LINK)).collect();
        roles.extend((0..nodes).map(|i| (node(i), CLUSTER_LINK)));
        roles.push((S3.to_string(), S3_LINK));
        Self::with_roles(work, std::process::id(), &roles)
    }

    /// A machine per (name, link); `id` keeps two topologies of one run apart.
    pub fn with_roles(work: &Path, id: u32, roles: &[(String, PortSpec)]) -> anyhow::Result<Machines> {
        let named: Vec<(&str, PortSpec)> = roles.iter().map(|(n, l)| (n.as_str(), *l)).collect();
        let topo = Topology::up(id, &named)?;
        let tls = work.join(format!("tls-{id}"));
        make_certs(&tls)?;
        Ok(Machines { topo: Some(Arc::new(topo)), tls: Some(tls) })
    }

    pub fn topology(&self) -> Option<&Topology> {
        self.topo.as_deref()
    }

    /// `program` on machine `role` (here, on loopback).
    pub fn command(&self, role: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match &self.topo {
            Some(t) => t.command(role, program),
            None => Command::new(program),
        }
    }

    /// Where a server of machine `role` listens and runs (here: loopback).
    pub fn host(&self, role: &str) -> surge_bb::local::Host {
        match &self.topo {
            Some(t) => surge_bb::local::Host { bind: t.ip(role).into(), netns: Some(t.netns(role)) },
            None => surge_bb::local::Host { bind: std::net::Ipv4Addr::LOCALHOST.into(), netns: None },
        }
    }

    /// The address servers on `role` listen on.
    pub fn ip(&self, role: &str) -> String {
        match &self.topo {
            Some(t) => t.ip(role).to_string(),
            None => "127.0.0.1".into(),
        }
    }

    /// `SURGE_BB_TLS_DIR` for surge's processes, when they cross machines.
    pub fn tls_env(&self) -> Option<(String, String)> {
        self.tls.as_ref().map(|d| ("SURGE_BB_TLS_DIR".to_string(), d.display().to_string()))
    }
}

fn openssl(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    sh(Command::new("openssl").args(args).current_dir(dir))?;
    Ok(())
}

/// A CA and one member certificate for every machine (docs/security.md: every
/// node and client holds a certificate of the burst buffer's CA).
fn make_certs(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(dir, &[&["req", "-x509"], &ec[..], &["-keyout", "ca-key.pem", "-out", "ca-cert.pem", "-days", "2", "-subj", "/CN=bb-ca"]].concat())?;
    std::fs::write(dir.join("ext.cnf"), format!("subjectAltName=DNS:{}\nextendedKeyUsage=serverAuth,clientAuth\n", surge_bb::tls::SERVER_NAME))?;
    openssl(dir, &[&["req"], &ec[..], &["-keyout", "node-key.pem", "-out", "node.csr", "-subj", "/CN=member"]].concat())?;
    openssl(dir, &["x509", "-req", "-in", "node.csr", "-CA", "ca-cert.pem", "-CAkey", "ca-key.pem", "-CAcreateserial", "-days", "2", "-extfile", "ext.cnf", "-out", "node-cert.pem"])?;
    Ok(())
}
