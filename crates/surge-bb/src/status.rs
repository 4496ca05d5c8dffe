//! What `surge bb status` shows: the pool (live nodes, memory, dirty bytes),
//! the write-back backlog, and for files whether they are persisted in S3.

use crate::meta::{self, Attr, DrainProgress, Ino, Kind};
use crate::tier::{DataError, Tier};

#[derive(Debug, serde::Serialize)]
pub struct NodeStatus {
    pub addr: String,
    pub reachable: bool,
    pub stat: Option<crate::store::StoreStat>,
}

#[derive(Debug, serde::Serialize)]
pub struct PoolStatus {
    pub chunk_size: u64,
    pub replicas: usize,
    pub nodes: Vec<NodeStatus>,
    /// Chunk versions not yet in S3.
    pub dirty_chunks: u64,
    /// Age of the oldest of them, seconds.
    pub oldest_dirty_s: Option<f64>,
    /// Files whose manifest/export object is not written yet.
    pub publish_pending: u64,
    /// The pool as a whole: node states, and the pool daemon's view if one runs.
    pub pool: PoolView,
}

/// One node of the pool, for `status --json` consumers (experiments sample it).
#[derive(Debug, serde::Serialize)]
pub struct PoolNode {
    pub addr: String,
    /// `live`, `draining N%`, `rebalancing N%` (`(paused: taking writes)`
    /// while the node takes writes) or `unreachable`.
    pub state: String,
    pub chunks: u64,
    pub used_bytes: u64,
    pub dirty_bytes: u64,
    pub capacity_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainProgress>,
    /// Moving chunks to a node that joined (`rebalance.rs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rebalance: Option<DrainProgress>,
}

#[derive(Debug, serde::Serialize)]
pub struct PoolView {
    /// Live nodes (draining ones included).
    pub size: usize,
    pub nodes: Vec<PoolNode>,
    pub buffered_bytes: u64,
    pub dirty_bytes: u64,
    /// Dollars so far, from the pool daemon (null without one).
    pub cost_usd: Option<f64>,
    pub daemon: Option<serde_json::Value>,
}

fn node_state(n: &crate::meta::NodeInfo, reachable: bool) -> String {
    match (&n.draining, &n.rebalancing) {
        (Some(p), _) => format!("draining {}%", p.percent()),
        _ if !reachable => "unreachable".into(),
        (None, Some(p)) if p.paused => format!("rebalancing {}% (paused: taking writes)", p.percent()),
        (None, Some(p)) => format!("rebalancing {}%", p.percent()),
        (None, None) => "live".into(),
    }
}

#[derive(Debug, serde::Serialize)]
pub struct FileStatus {
    pub path: String,
    pub ino: Ino,
    pub size: u64,
    pub generation: u64,
    pub persisted_generation: u64,
    pub dirty_chunks: u64,
    /// The current content is in S3 (chunks, manifest and export object).
    pub persisted: bool,
}

pub fn pool(tier: &Tier) -> Result<PoolStatus, DataError> {
    tier.forget_live_cache();
    let info = tier.live_info();
    let nodes: Vec<NodeStatus> = info
        .iter()
        .map(|n| {
            let stat = tier.pool.stat(&n.addr).ok();
            NodeStatus { reachable: stat.is_some(), addr: n.addr.clone(), stat }
        })
        .collect();
    let pool_nodes: Vec<PoolNode> = info
        .iter()
        .zip(&nodes)
        .map(|(i, n)| {
            let st = n.stat.clone().unwrap_or_default();
            PoolNode {
                addr: n.addr.clone(),
                state: node_state(i, n.reachable),
                chunks: st.chunks,
                used_bytes: st.used_bytes,
                dirty_bytes: st.dirty_bytes,
                capacity_bytes: st.capacity_bytes,
                drain: i.draining,
                rebalance: i.rebalancing,
            }
        })
        .collect();
    let daemon: Option<serde_json::Value> = tier.meta.pool_report()?.and_then(|j| serde_json::from_str(&j).ok());
    let pool = PoolView {
        size: pool_nodes.len(),
        buffered_bytes: pool_nodes.iter().map(|n| n.used_bytes).sum(),
        dirty_bytes: pool_nodes.iter().map(|n| n.dirty_bytes).sum(),
        cost_usd: daemon.as_ref().and_then(|d| d["cost_usd"].as_f64()),
        nodes: pool_nodes,
        daemon,
    };
    let oldest = tier.meta.dirty_oldest(1)?;
    Ok(PoolStatus {
        chunk_size: tier.params.chunk_size,
        replicas: tier.replicas,
        nodes,
        dirty_chunks: tier.meta.dirty_count()?,
        oldest_dirty_s: oldest.first().map(|(_, t)| (crate::now_ms() - t).max(0) as f64 / 1000.0),
        publish_pending: tier.meta.publish_pending()?,
        pool,
    })
}

fn file_status(tier: &Tier, path: &str, a: &Attr) -> Result<FileStatus, DataError> {
    let map = tier.meta.chunk_map(a.ino)?;
    let dirty = map.values().filter(|e| !e.persisted).count() as u64;
    Ok(FileStatus {
        path: path.to_string(),
        ino: a.ino,
        size: a.size,
        generation: a.gen,
        persisted_generation: a.pgen,
        dirty_chunks: dirty,
        persisted: a.persisted() && dirty == 0,
    })
}

/// Status of the file at `path`, or of every file below the directory at `path`.
pub fn files(tier: &Tier, path: &str) -> Result<Vec<FileStatus>, DataError> {
    let a = meta::resolve(tier.meta.as_ref(), path)?;
    let mut out = Vec::new();
    let mut stack = vec![(path.trim_matches('/').to_string(), a)];
    while let Some((p, a)) = stack.pop() {
        match a.kind {
            Kind::File => out.push(file_status(tier, &p, &a)?),
            Kind::Dir => {
                for e in tier.meta.readdir(a.ino)?.into_iter().rev() {
                    let child = tier.meta.getattr(e.ino)?;
                    let cp = if p.is_empty() { e.name.clone() } else { format!("{p}/{}", e.name) };
                    stack.push((cp, child));
                }
            }
        }
    }
    Ok(out)
}

/// Imports every object of the bucket (outside surge's own prefix) that is not
/// in the namespace yet, level by level: prefixes and directory markers
/// (`dir/`) become directories (empty ones included), objects files, each
/// name decoded as the bucket's [`KeyLayout`](crate::s3::KeyLayout) says.
/// Returns the count of files imported.
pub fn import(tier: &Tier, prefix: Option<&str>) -> Result<usize, DataError> {
    let s3 = tier.s3.as_ref().ok_or(DataError::NoS3("importing bucket objects"))?;
    let layout = s3.key_layout()?;
    let prefix = prefix.map(|p| p.trim_matches('/')).filter(|p| !p.is_empty());
    let mut top = meta::ROOT;
    if let Some(p) = prefix {
        // The directories along the prefix (its last segment too).
        for seg in p.split('/').filter(|s| !s.is_empty()) {
            top = import_dir(tier, top, &layout.name(seg))?;
        }
    }
    let mut n = 0;
    let mut levels = vec![(prefix.map(str::to_string), top)];
    while let Some((at, dir)) = levels.pop() {
        let level = s3.list_level(at.as_deref())?;
        for p in level.prefixes {
            if at.is_none() && p == crate::s3::INTERNAL_PREFIX {
                continue;
            }
            let Some(seg) = p.rsplit('/').next() else { continue };
            levels.push((Some(p.clone()), import_dir(tier, dir, &layout.name(seg))?));
        }
        for (key, size) in level.objects {
            // The marker `at/` itself, listed as `at`.
            if Some(key.as_str()) == at.as_deref() {
                continue;
            }
            let Some(seg) = key.rsplit('/').next() else { continue };
            let a = tier.meta.import_file(dir, &layout.name(seg), &key, size, crate::now_ns())?;
            if a.import.as_ref().is_some_and(|(k, _)| *k == key) {
                n += 1;
            }
        }
    }
    Ok(n)
}

/// The directory `name` in `parent`, created if it is not there.
fn import_dir(tier: &Tier, parent: Ino, name: &str) -> Result<Ino, DataError> {
    match tier.meta.create(parent, name, Kind::Dir, 0o755, 0, 0, crate::now_ns()) {
        Ok(a) => Ok(a.ino),
        Err(meta::MetaError::Exists) => Ok(tier.meta.lookup(parent, name)?.ino),
        Err(e) => Err(e.into()),
    }
}
