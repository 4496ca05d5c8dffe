//! [`Ec2Nodes`]: the pool's I/O nodes as EC2 instances (`surge bb pool
//! --nodes ec2`). Each node is an instance launched from an AMI or a launch
//! template, whose user-data starts `surge bb node`; surge-aws's
//! `PoolInstances` makes the calls and tags the instances with the owner,
//! `surge:role=bb-node` and the pool's name.
//!
//! A node serves once its address is in the pool's membership. Its address is
//! the instance's `surge:node-addr` tag if set, else its private IP and the
//! node port. After a restart of the pool, the instances of the pool whose
//! node is in membership are adopted; those that are not, and are older than
//! the serve timeout, are orphans (a launch that never served, a node that
//! left without its instance ending) and are terminated, with a log line.

use crate::pool::{NodeProvider, PoolError};
use crate::tier::Tier;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use surge_aws::instances::{LaunchSpec, PoolInstance, PoolInstances};
use surge_aws::AwsConfig;

#[derive(Debug, Clone)]
pub struct Ec2NodesConfig {
    /// Region, endpoint, credentials chain, owner tag, retries, `poll` (the
    /// interval of DescribeInstances while waiting for nodes to serve).
    pub aws: AwsConfig,
    /// Value of the `surge:pool` tag (the file-system name by default).
    pub pool: String,
    pub launch: LaunchSpec,
    /// Port a node listens on at its private IP.
    pub node_port: u16,
    /// A launched instance whose node is not in membership by then is terminated.
    pub serve_timeout: Duration,
    /// How often the pool's instances are listed for orphans and nodes to adopt.
    pub sweep_every: Duration,
}

pub struct Ec2Nodes {
    ec2: PoolInstances,
    tier: Arc<Tier>,
    cfg: Ec2NodesConfig,
    /// Address -> instance id of the nodes started or adopted by this provider.
    nodes: BTreeMap<String, String>,
    last_sweep: Option<Instant>,
}

impl Ec2Nodes {
    /// `tier` is the pool's: its membership says which nodes serve.
    pub fn connect(cfg: Ec2NodesConfig, tier: Arc<Tier>) -> Result<Ec2Nodes, PoolError> {
        let ec2 = PoolInstances::connect(&cfg.aws, &cfg.pool).map_err(|e| PoolError::Start(e.to_string()))?;
        Ok(Ec2Nodes { ec2, tier, cfg, nodes: BTreeMap::new(), last_sweep: None })
    }

    /// The instance behind a node this provider knows.
    pub fn instance_of(&self, addr: &str) -> Option<&str> {
        self.nodes.get(addr).map(String::as_str)
    }

    fn live(&self) -> BTreeSet<String> {
        self.tier.forget_live_cache();
        self.tier.live_nodes().into_iter().collect()
    }

    /// Terminates what was launched and did not serve, saying why.
    fn give_up(&self, ids: &[String], why: &str) {
        if let Err(e) = self.ec2.terminate(ids) {
            tracing::error!("pool: terminating {} ({why}): {e}; they are tagged for pool {}: a later sweep terminates them", ids.join(", "), self.ec2.pool());
        }
    }

    /// Polls the launched instances until each serves, ends, or the serve
    /// timeout passes. Returns the serving ones (address, id) and an error
    /// for each of the others, which are terminated.
    fn wait_serving(&self, mut waiting: Vec<String>) -> Vec<Result<(String, String), PoolError>> {
        let start = Instant::now();
        let mut out = Vec::new();
        let mut last: BTreeMap<String, PoolInstance> = BTreeMap::new();
        while !waiting.is_empty() {
            match self.ec2.describe(&waiting) {
                Ok(found) => last.extend(found.into_iter().map(|i| (i.id.clone(), i))),
                Err(e) => tracing::warn!("pool: waiting for instances {}: {e}", waiting.join(", ")),
            }
            let live = self.live();
            waiting.retain(|id| match last.get(id) {
                Some(i) if i.alive() => match i.addr(self.cfg.node_port).filter(|a| live.contains(a)) {
                    Some(addr) => {
                        out.push(Ok((addr, id.clone())));
                        false
                    }
                    None => true,
                },
                Some(i) => {
                    out.push(Err(PoolError::Start(format!("instance {id} ended ({}) before its node served; see its console output", i.state))));
                    false
                }
                None => true,
            });
            if !waiting.is_empty() && start.elapsed() >= self.cfg.serve_timeout {
                let why = format!("its node did not join the pool's membership within {:?}", self.cfg.serve_timeout);
                self.give_up(&waiting, &why);
                for id in waiting.drain(..) {
                    let seen = last.get(&id).map_or("not yet described".to_string(), |i| {
                        format!("{}, node address {}", i.state, i.addr(self.cfg.node_port).unwrap_or_else(|| "unknown".into()))
                    });
                    out.push(Err(PoolError::Start(format!("instance {id} ({seen}): {why}; terminated it (see its console output and user-data)"))));
                }
            }
            if !waiting.is_empty() {
                std::thread::sleep(self.cfg.aws.poll);
            }
        }
        out
    }

    /// Lists the pool's instances: adopts those whose node serves, terminates
    /// the orphans. Returns the adopted addresses.
    fn sweep(&mut self, live: &BTreeSet<String>) -> Result<Vec<String>, PoolError> {
        let known: BTreeSet<&String> = self.nodes.values().collect();
        let found = self.ec2.list().map_err(|e| PoolError::Start(format!("listing the pool's instances: {e}")))?;
        let (mut adopted, mut orphans) = (Vec::new(), Vec::new());
        for i in found.iter().filter(|i| !known.contains(&i.id)) {
            let addr = i.addr(self.cfg.node_port);
            match addr.filter(|a| i.alive() && live.contains(a) && !self.nodes.contains_key(a)) {
                Some(a) => {
                    tracing::info!("pool: adopting instance {} (node {a}), running before this start", i.id);
                    adopted.push((a, i.id.clone()));
                }
                None if i.age_ms() > self.cfg.serve_timeout.as_millis() as u64 => {
                    tracing::warn!(
                        "pool: instance {} ({}, launched {} s ago, node {}) is tagged for pool {} but its node is not in the pool's membership: terminating it (orphan)",
                        i.id,
                        i.state,
                        i.age_ms() / 1000,
                        i.addr(self.cfg.node_port).unwrap_or_else(|| "unknown".into()),
                        self.ec2.pool()
                    );
                    orphans.push(i.id.clone());
                }
                // Young: may still be booting (a launch of the run before).
                None => {}
            }
        }
        self.give_up(&orphans, "orphans");
        let addrs = adopted.iter().map(|(a, _)| a.clone()).collect();
        self.nodes.extend(adopted);
        Ok(addrs)
    }
}

impl NodeProvider for Ec2Nodes {
    fn start(&mut self) -> Result<String, PoolError> {
        self.start_many(1).pop().unwrap_or_else(|| Err(PoolError::Start("EC2 launched no instance".into())))
    }

    /// One RunInstances for all, then one wait: they boot together.
    fn start_many(&mut self, n: usize) -> Vec<Result<String, PoolError>> {
        if n == 0 {
            return Vec::new();
        }
        let launched = match self.ec2.launch(&self.cfg.launch, n as u32) {
            Ok(v) => v,
            Err(e) => return vec![Err(PoolError::Start(e.to_string()))],
        };
        if launched.len() < n {
            tracing::warn!("pool: EC2 launched {} of {n} instances (capacity); the pool asks again at its next interval", launched.len());
        }
        let ids = launched.into_iter().map(|i| i.id).collect();
        let mut out = Vec::new();
        for r in self.wait_serving(ids) {
            out.push(r.map(|(addr, id)| {
                tracing::info!("pool: instance {id} serves as node {addr}");
                self.nodes.insert(addr.clone(), id);
                addr
            }));
        }
        out
    }

    /// Terminates the node's instance. One that cannot be terminated now
    /// stays tagged and is terminated by a later sweep (an orphan).
    fn stop(&mut self, addr: &str) {
        let Some(id) = self.nodes.remove(addr) else { return };
        match self.ec2.terminate(std::slice::from_ref(&id)) {
            Ok(()) => tracing::info!("pool: node {addr} stopped: instance {id} terminated"),
            Err(e) => tracing::error!("pool: terminating instance {id} of node {addr}: {e}; a later sweep terminates it (orphan)"),
        }
    }

    /// Its instance is pending or running (a node that ended powers the
    /// instance off; its user-data's `poweroff` terminates it). When AWS
    /// cannot be asked, it counts as running: the pool keeps it.
    fn running(&mut self, addr: &str) -> bool {
        let Some(id) = self.nodes.get(addr) else { return false };
        match self.ec2.describe(std::slice::from_ref(id)) {
            Ok(v) => v.iter().any(|i| i.alive()),
            Err(e) => {
                tracing::warn!("pool: is instance {id} of node {addr} running? {e}");
                true
            }
        }
    }

    fn adopt(&mut self, live: &BTreeSet<String>) -> Vec<String> {
        if self.last_sweep.is_some_and(|t| t.elapsed() < self.cfg.sweep_every) {
            return Vec::new();
        }
        self.last_sweep = Some(Instant::now());
        self.sweep(live).unwrap_or_else(|e| {
            tracing::warn!("pool: {e}");
            Vec::new()
        })
    }
}

/// The user-data of a node when none is given: a shell script that learns
/// the instance's private IP (IMDSv2), runs `program bb node --listen IP:PORT
/// ARGS`, and powers the instance off when the node ends (drained), which
/// terminates it. `args` must hold no secret: user-data is readable on the
/// instance and through the EC2 API.
pub fn default_user_data(program: &str, port: u16, args: &[String]) -> String {
    let args: Vec<String> = args.iter().map(|a| sh_quote(a)).collect();
    format!(
        "#!/bin/sh\n\
         # surge bb pool: one I/O node. No secrets here (user-data is readable on the instance and through the EC2 API).\n\
         T=$(curl -sfX PUT http://169.254.169.254/latest/api/token -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')\n\
         IP=$(curl -sf -H \"X-aws-ec2-metadata-token: $T\" http://169.254.169.254/latest/meta-data/local-ipv4)\n\
         {} bb node --listen \"$IP:{port}\" {}\n\
         poweroff\n",
        sh_quote(program),
        args.join(" ")
    )
}

/// One shell word.
fn sh_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+".contains(c)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_data_quotes_each_argument_and_listens_on_the_private_ip() {
        let u = default_user_data("/usr/local/bin/surge", 7400, &["--fs".into(), "a b".into(), "--x".into(), "it's".into()]);
        assert!(u.starts_with("#!/bin/sh\n"), "{u}");
        assert!(u.contains("/usr/local/bin/surge bb node --listen \"$IP:7400\" --fs 'a b' --x 'it'\\''s'\n"), "{u}");
        assert!(u.trim_end().ends_with("poweroff"), "{u}");
    }
}
