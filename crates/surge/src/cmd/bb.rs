//! `surge bb`: the burst buffer (crate surge-bb). I/O nodes, FUSE mounts,
//! status, import, and a local redis-server for a one-machine setup.

use anyhow::Context;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use surge_bb::client::{Client, ClientConfig};
use surge_bb::fuse::MountConfig;
use surge_bb::node::NodeConfig;
use surge_bb::rebalance::RebalanceConfig;
use surge_bb::s3::S3Config;
use surge_bb::store::StoreConfig;
use surge_bb::tier::TierConfig;
use surge_bb::writeback::WritebackConfig;
use surge_block::units::{parse_duration, parse_size};

#[derive(clap::Args, Debug)]
#[command(
    about = "Burst buffer: a shared memory tier in front of S3 (I/O nodes, FUSE mount)",
    after_long_help = "One machine:\n  surge bb redis --dir /tmp/bb-redis &\n  export SURGE_BB_REDIS_USER=surge SURGE_BB_REDIS_PASSWORD_FILE=/tmp/bb-redis/password\n  export SURGE_BB_S3_ENDPOINT=http://127.0.0.1:9000 SURGE_BB_BUCKET=bb\n  surge bb node --listen 127.0.0.1:7401 &\n  surge bb node --listen 127.0.0.1:7402 &\n  surge bb mount /mnt/bb &\n  surge bb status /\n\nAcross machines (docs/security.md): nodes off loopback need --tls-dir DIR\n(ca-cert.pem, node-cert.pem, node-key.pem; every node and client holds a\ncertificate of the same CA), Redis an ACL user and password\n(--redis-user, --redis-password-file; rediss:// with --redis-tls-dir), etcd\n--etcd-user/--etcd-password-file (https:// with --etcd-tls-dir)."
)]
pub struct Args {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// Metadata store (Redis URL: redis://HOST:PORT/ or, with TLS, rediss://;
    /// a Redis Cluster: redis+cluster://HOST:PORT,HOST:PORT,.../).
    /// Put no password in it on the command line (every user sees it in `ps`):
    /// use --redis-password-file, or SURGE_BB_REDIS in the environment.
    #[arg(long, env = "SURGE_BB_REDIS", default_value = "redis://127.0.0.1:6379/")]
    pub redis: String,
    /// Redis ACL user to log in as (with --redis-password-file).
    #[arg(long, env = "SURGE_BB_REDIS_USER")]
    pub redis_user: Option<String>,
    /// File holding the Redis password (its first line; keep it mode 0600).
    #[arg(long, env = "SURGE_BB_REDIS_PASSWORD_FILE")]
    pub redis_password_file: Option<PathBuf>,
    /// For rediss:// URLs: a directory with ca-cert.pem (the CA of Redis's
    /// certificate) and, if Redis asks for one, client-cert.pem + client-key.pem.
    #[arg(long, env = "SURGE_BB_REDIS_TLS_DIR")]
    pub redis_tls_dir: Option<PathBuf>,
    /// etcd user (etcd auth; with --etcd-password-file).
    #[arg(long, env = "SURGE_BB_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// File holding the etcd password (its first line).
    #[arg(long, env = "SURGE_BB_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// For etcd:https:// endpoints: ca-cert.pem, and client-cert.pem +
    /// client-key.pem for an etcd started with --client-cert-auth.
    #[arg(long, env = "SURGE_BB_ETCD_TLS_DIR")]
    pub etcd_tls_dir: Option<PathBuf>,
    /// The node protocol over mutual TLS: a directory with ca-cert.pem (the
    /// burst buffer's CA), node-cert.pem and node-key.pem (this process's
    /// certificate, subjectAltName DNS:surge-bb). Nodes and clients alike.
    #[arg(long, env = "SURGE_BB_TLS_DIR")]
    pub tls_dir: Option<PathBuf>,
    /// File-system name (several may share one Redis).
    #[arg(long, env = "SURGE_BB_FS", default_value = "default")]
    pub fs: String,
    /// Node membership: `redis` (leases in the metadata store), `etcd:http://HOST:PORT`
    /// or `static:ADDR,ADDR`.
    #[arg(long, env = "SURGE_BB_MEMBERSHIP", default_value = "redis")]
    pub membership: String,
    /// S3-compatible endpoint (unset: AWS). Credentials come from AWS_ACCESS_KEY_ID /
    /// AWS_SECRET_ACCESS_KEY.
    #[arg(long, env = "SURGE_BB_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,
    /// Bucket behind the buffer (unset: no write-back; data lives only on the nodes).
    #[arg(long, env = "SURGE_BB_BUCKET")]
    pub bucket: Option<String>,
    #[arg(long, env = "AWS_REGION", default_value = "us-east-1")]
    pub region: String,
    /// Copies of each dirty chunk on distinct I/O nodes before a write is acknowledged.
    #[arg(long, env = "SURGE_BB_REPLICAS", default_value_t = 2)]
    pub replicas: usize,
    /// Chunk size (fixed when the file system is first used).
    #[arg(long, default_value = "4MiB", value_parser = parse_size)]
    pub chunk_size: u64,
}

impl Common {
    /// The same settings as command-line arguments (for the nodes a pool
    /// starts), but the Redis URL, which may hold a password: it goes in
    /// their environment ([`Common::child_env`]). Paths of secret files are
    /// no secret.
    fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            "--fs".into(), self.fs.clone(),
            "--membership".into(), self.membership.clone(),
            "--region".into(), self.region.clone(),
            "--replicas".into(), self.replicas.to_string(),
            "--chunk-size".into(), self.chunk_size.to_string(),
        ];
        if let Some(e) = &self.s3_endpoint {
            v.extend(["--s3-endpoint".into(), e.clone()]);
        }
        if let Some(b) = &self.bucket {
            v.extend(["--bucket".into(), b.clone()]);
        }
        let path = |flag: &str, p: &Option<PathBuf>| p.as_ref().map(|p| [flag.to_string(), p.display().to_string()]);
        for (flag, p) in [
            ("--redis-password-file", &self.redis_password_file),
            ("--redis-tls-dir", &self.redis_tls_dir),
            ("--etcd-password-file", &self.etcd_password_file),
            ("--etcd-tls-dir", &self.etcd_tls_dir),
            ("--tls-dir", &self.tls_dir),
        ] {
            v.extend(path(flag, p).into_iter().flatten());
        }
        for (flag, u) in [("--redis-user", &self.redis_user), ("--etcd-user", &self.etcd_user)] {
            if let Some(u) = u {
                v.extend([flag.to_string(), u.clone()]);
            }
        }
        v
    }

    /// What the nodes a pool starts get in their environment.
    fn child_env(&self) -> Vec<(String, String)> {
        vec![("SURGE_BB_REDIS".into(), self.redis.clone())]
    }

    /// Passwords from their files, certificates from their directories.
    fn access(&self) -> anyhow::Result<surge_bb::tier::Access> {
        let password = |f: &Option<PathBuf>, what: &str| {
            f.as_ref().map(|p| surge_bb::meta::redis::RedisAuth::read_password(p).with_context(|| format!("reading the {what} password"))).transpose()
        };
        if surge_bb::meta::redis::redact(&self.redis) != self.redis && std::env::args().any(|a| a.contains(&self.redis)) {
            tracing::warn!("the Redis password is on the command line (--redis), where every user of this machine can read it: use --redis-password-file");
        }
        let node_tls = self
            .tls_dir
            .as_ref()
            .map(|d| surge_bb::tls::NodeTls::from_dir(d).map(Arc::new).with_context(|| format!("--tls-dir {}", d.display())))
            .transpose()?;
        Ok(surge_bb::tier::Access {
            node_tls,
            redis: surge_bb::meta::redis::RedisAuth {
                user: self.redis_user.clone(),
                password: password(&self.redis_password_file, "Redis")?,
                tls_dir: self.redis_tls_dir.clone(),
            },
            etcd: surge_bb::membership::EtcdAuth {
                user: self.etcd_user.clone(),
                password: password(&self.etcd_password_file, "etcd")?,
                tls_dir: self.etcd_tls_dir.clone(),
            },
        })
    }

    fn tier(&self) -> anyhow::Result<Arc<surge_bb::tier::Tier>> {
        let s3 = self.bucket.as_ref().map(|b| S3Config {
            endpoint: self.s3_endpoint.clone(),
            bucket: b.clone(),
            region: self.region.clone(),
            access_key: std::env::var("AWS_ACCESS_KEY_ID").ok(),
            secret_key: std::env::var("AWS_SECRET_ACCESS_KEY").ok(),
        });
        let cfg = TierConfig {
            redis: self.redis.clone(),
            fs: self.fs.clone(),
            membership: self.membership.clone(),
            s3,
            replicas: self.replicas,
            chunk_size: self.chunk_size,
            access: self.access()?,
        };
        Ok(cfg.open()?)
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Run an I/O node: hold chunks in memory, write dirty ones back to S3.
    Node {
        #[command(flatten)]
        common: Common,
        /// Address to serve chunks on (loopback by default).
        #[arg(long, default_value = "127.0.0.1:7400")]
        listen: String,
        /// Memory for chunks.
        #[arg(long, default_value = "1GiB", value_parser = parse_size)]
        memory: u64,
        /// Directory (an SSD) that evicted clean chunks spill to.
        #[arg(long)]
        spill_dir: Option<PathBuf>,
        #[arg(long, default_value = "10GiB", value_parser = parse_size)]
        spill_size: u64,
        /// A dirty chunk waits this long before write-back (rewrites coalesce).
        #[arg(long, default_value = "500ms", value_parser = parse_duration)]
        writeback_delay: std::time::Duration,
        /// A chunk dirty longer than this is logged as late.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        writeback_deadline: std::time::Duration,
        /// A file whose holes exceed both this and its data gets no export
        /// object in the bucket (only its chunks and manifest): S3 objects
        /// have no holes, so `truncate -s 5T` would upload 5 TiB of zeros.
        #[arg(long, default_value = "1GiB", value_parser = parse_size)]
        export_holes_max: u64,
        /// Bytes per second at most this node copies to a node that joined
        /// (rebalancing its clean chunks); 0 turns rebalancing off.
        #[arg(long, default_value = "128MiB", value_parser = parse_size)]
        rebalance_rate: u64,
        /// Rebalance only once this node has taken no write for this long: its
        /// copies would take the CPU and network a write burst needs.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        rebalance_quiet: std::time::Duration,
        /// Do not map the memory budget at start. By default a node maps it
        /// (at idle CPU priority) so that a write burst's chunks land in
        /// memory already mapped instead of faulting in fresh pages.
        #[arg(long)]
        no_prefault: bool,
        /// Serve off loopback without --tls-dir: any host that reaches the
        /// node can read, overwrite, delete and drain its chunks.
        #[arg(long)]
        insecure: bool,
    },
    /// Mount the burst buffer at DIR (FUSE) until unmounted or signalled.
    Mount {
        dir: PathBuf,
        #[command(flatten)]
        common: Common,
        /// Direct-I/O opens: read-after-write across mounts (default: close-to-open).
        #[arg(long)]
        strict: bool,
        /// fsync returns only once the file is persisted in S3.
        #[arg(long)]
        fsync_s3: bool,
        /// Write-behind budget.
        #[arg(long, default_value = "64MiB", value_parser = parse_size)]
        write_behind: u64,
        /// Chunks prefetched ahead of sequential readers.
        #[arg(long, default_value_t = 4)]
        read_ahead: u64,
        /// How long the kernel caches names and attributes (a `stat` may be
        /// this old; an open always checks them). Default 1s, and 0s with
        /// --strict (every stat asks metadata).
        #[arg(long, value_parser = parse_duration)]
        attr_ttl: Option<std::time::Duration>,
        /// Import the bucket's existing objects into the namespace first.
        #[arg(long)]
        import: bool,
        /// How long a write waits for room when the I/O nodes are full
        /// (write-back frees memory, the pool grows) before ENOSPC.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        full_wait: std::time::Duration,
        /// Do not map the chunk memory (write-behind budget plus the 256 MiB
        /// cache) at start; by default it is mapped at idle CPU priority so
        /// that a write burst fills chunks in memory already mapped.
        #[arg(long)]
        no_prefault: bool,
    },
    /// Pool and write-back state; with PATH, whether each file is persisted in S3.
    Status {
        path: Option<String>,
        #[command(flatten)]
        common: Common,
        #[arg(long)]
        json: bool,
    },
    /// Remove I/O node ADDR from the pool safely: it stops taking new chunks,
    /// hands its dirty chunks to other nodes (or writes them back), leaves and exits.
    Drain {
        addr: String,
        #[command(flatten)]
        common: Common,
        /// Give up waiting after this long (the node keeps draining).
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        timeout: std::time::Duration,
    },
    /// Keep the pool of I/O nodes sized to demand: start nodes (local processes,
    /// or EC2 instances with --nodes ec2) under a write backlog, drain them when
    /// demand stays low; prices every node-second and S3 request. SIGTERM drains
    /// and stops every node; after a crash, a new pool adopts the EC2 nodes still serving.
    Pool {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 2)]
        min: usize,
        #[arg(long, default_value_t = 8)]
        max: usize,
        /// Chunk memory of each node started.
        #[arg(long, default_value = "512MiB", value_parser = parse_size)]
        node_memory: u64,
        /// How often demand is measured and the policy applied.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: std::time::Duration,
        /// Demand must stay low this long before a node is drained.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        shrink_after: std::time::Duration,
        /// Grow when projected dirty bytes pass this share of the pool's memory.
        #[arg(long, default_value_t = 0.5)]
        high_water: f64,
        /// Shrink only while projected dirty bytes stay below this share of the smaller pool.
        #[arg(long, default_value_t = 0.25)]
        low_water: f64,
        /// EC2 instance each node is billed as (list price, us-east-1; r5.large: 16 GiB, $0.126/h).
        #[arg(long, default_value = "r5.large")]
        instance: String,
        /// Extra argument for every node started (repeat), e.g. --node-arg=--writeback-delay=2s.
        #[arg(long, allow_hyphen_values = true)]
        node_arg: Vec<String>,
        /// The address local nodes listen on (each on a port of its own): an
        /// address of this machine the clients reach. Off loopback the nodes
        /// need --tls-dir (or --node-arg=--insecure on a trusted network).
        #[arg(long, default_value = "127.0.0.1")]
        node_listen: std::net::IpAddr,
        /// Where nodes run: `local` (processes on this machine) or `ec2`
        /// (instances of --instance type; needs a surge built with `aws`).
        #[arg(long, default_value = "local", value_parser = ["local", "ec2"])]
        nodes: String,
        /// `dedicated`: each node a machine of its own (--nodes), billed as
        /// --instance. `co-located`: the nodes run on the job's compute nodes
        /// (--compute-host), billed nothing (those are paid for anyway) and
        /// taking --node-memory each from them: for short jobs.
        #[arg(long, default_value = "dedicated", value_parser = ["dedicated", "co-located"])]
        placement: String,
        /// A compute node of the job for co-located nodes, NAME=IP or IP
        /// (repeat). With two or more, one node per host (any two replicas on
        /// two machines); a single host takes every node.
        #[arg(long)]
        compute_host: Vec<surge_bb::pool::ComputeHost>,
        /// How a co-located node is started on a compute host: these words
        /// (`{host}`: its NAME) then `surge bb node --listen IP:0 ...`.
        /// Empty: on this machine.
        #[arg(long, default_value = "ssh {host}")]
        launcher: String,
        #[command(flatten)]
        ec2: Ec2PoolArgs,
    },
    /// Add the bucket's existing objects (outside .surge/) to the namespace.
    Import {
        #[command(flatten)]
        common: Common,
        #[arg(long)]
        prefix: Option<String>,
    },
    /// Run a local redis-server (append-only, fsync always) for a one-machine
    /// setup, on 127.0.0.1. Only ACL user `surge` may log in, with the
    /// password in DIR/password (made if missing, mode 0600).
    Redis {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 6379)]
        port: u16,
        /// The address to listen on (single server): 127.0.0.1, or an
        /// address other machines reach (only the ACL user gets in).
        #[arg(long, default_value = "127.0.0.1")]
        bind: std::net::IpAddr,
        /// No user and no password: every local user can read and change the
        /// metadata (owners and modes of every file included).
        #[arg(long)]
        no_auth: bool,
        /// A Redis Cluster of N masters instead (N >= 1; no replicas), on
        /// ports PORT..PORT+N-1, cluster bus on each port + 10000, files in
        /// DIR/node-I. Prints the redis+cluster:// URL to give --redis.
        #[arg(long, value_name = "N")]
        cluster: Option<usize>,
    },
    /// Measure file creates per second against Redis Cluster masters (local
    /// clusters of each size, several creating client processes each in a
    /// directory of its own, as mdtest -u): the paper's Fig. 10.
    BenchMeta(crate::experiment::burstbuffer::meta_bench::BenchMetaArgs),
    /// One creating client of `bench-meta`.
    #[command(hide = true)]
    BenchMetaClient(crate::experiment::burstbuffer::meta_bench::BenchMetaClientArgs),
}

/// `surge bb pool --nodes ec2` (docs/burst-buffer.md, "Pool nodes on EC2").
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "EC2 nodes (--nodes ec2)")]
#[cfg_attr(not(feature = "aws"), allow(dead_code))]
pub struct Ec2PoolArgs {
    /// AMI with surge installed (or give --ec2-launch-template).
    #[arg(long)]
    pub ec2_ami: Option<String>,
    /// Launch template, by id (lt-...) or name; --instance overrides its type.
    #[arg(long)]
    pub ec2_launch_template: Option<String>,
    /// Its version ($Latest, $Default or a number; default: the template's default).
    #[arg(long)]
    pub ec2_launch_template_version: Option<String>,
    #[arg(long)]
    pub ec2_subnet: Option<String>,
    /// Security group id (repeat); it must let the clients and the other nodes reach --node-port.
    #[arg(long)]
    pub ec2_security_group: Vec<String>,
    /// Instance profile (name or ARN): where the nodes' S3 credentials come from.
    #[arg(long)]
    pub ec2_instance_profile: Option<String>,
    /// File with the nodes' user-data, sent as is. Default: a script that runs
    /// `--ec2-surge-path bb node --listen PRIVATE_IP:--node-port` with the
    /// pool's settings, then powers off. No secrets in it: it is readable on
    /// the instance and through the EC2 API.
    #[arg(long)]
    pub ec2_user_data: Option<PathBuf>,
    /// Path of surge on the image (default user-data).
    #[arg(long, default_value = "/usr/local/bin/surge")]
    pub ec2_surge_path: String,
    /// Port the nodes listen on at their private IP.
    #[arg(long, default_value_t = 7400)]
    pub node_port: u16,
    /// A launched instance whose node has not joined the pool by then is terminated.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub ec2_serve_timeout: std::time::Duration,
    /// Value of the surge:owner tag (several deployments in one account keep apart).
    #[arg(long, default_value = "surge")]
    pub ec2_owner: String,
    /// Value of the surge:pool tag (default: the file-system name, --fs).
    #[arg(long)]
    pub ec2_pool: Option<String>,
    /// EC2 endpoint override (a VPC endpoint; tests: moto).
    #[arg(long, env = "SURGE_EC2_ENDPOINT")]
    pub ec2_endpoint: Option<String>,
}

impl Ec2PoolArgs {
    /// What must hold before anything is opened or launched.
    fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.ec2_ami.is_some() || self.ec2_launch_template.is_some(), "--nodes ec2 needs --ec2-ami or --ec2-launch-template");
        Ok(())
    }
}

/// The nodes' user-data: --ec2-user-data's file, else the default script
/// with the pool's node arguments and the Redis URL (refused if it holds a
/// password: user-data is readable through the EC2 API).
#[cfg(feature = "aws")]
fn ec2_user_data(common: &Common, e: &Ec2PoolArgs, node_args: Vec<String>) -> anyhow::Result<String> {
    if let Some(f) = &e.ec2_user_data {
        return std::fs::read_to_string(f).with_context(|| format!("--ec2-user-data {}", f.display()));
    }
    anyhow::ensure!(
        surge_bb::meta::redis::redact(&common.redis) == common.redis,
        "--nodes ec2: the Redis URL holds a password, which would be in the nodes' user-data (readable through the EC2 API): \
         give the nodes --redis-password-file (a path on their image) instead"
    );
    let mut args = vec!["--redis".to_string(), common.redis.clone()];
    args.extend(node_args);
    Ok(surge_bb::ec2::default_user_data(&e.ec2_surge_path, e.node_port, &args))
}

/// The EC2 node provider for `surge bb pool --nodes ec2`.
#[cfg(feature = "aws")]
fn ec2_nodes(common: &Common, e: &Ec2PoolArgs, instance: &str, node_args: Vec<String>, tier: Arc<surge_bb::tier::Tier>) -> anyhow::Result<surge_bb::ec2::Ec2Nodes> {
    let user_data = ec2_user_data(common, e, node_args)?;
    let cfg = surge_bb::ec2::Ec2NodesConfig {
        aws: surge_aws::AwsConfig { region: Some(common.region.clone()), endpoint_url: e.ec2_endpoint.clone(), owner: e.ec2_owner.clone(), ..Default::default() },
        pool: e.ec2_pool.clone().unwrap_or_else(|| common.fs.clone()),
        launch: surge_aws::instances::LaunchSpec {
            image_id: e.ec2_ami.clone(),
            launch_template: e.ec2_launch_template.clone(),
            launch_template_version: e.ec2_launch_template_version.clone(),
            instance_type: instance.to_string(),
            subnet_id: e.ec2_subnet.clone(),
            security_group_ids: e.ec2_security_group.clone(),
            instance_profile: e.ec2_instance_profile.clone(),
            user_data: Some(user_data),
        },
        node_port: e.node_port,
        serve_timeout: e.ec2_serve_timeout,
        sweep_every: std::time::Duration::from_secs(30),
    };
    Ok(surge_bb::ec2::Ec2Nodes::connect(cfg, tier)?)
}

fn stop_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

fn wait_for(stop: &AtomicBool) {
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.action {
        Action::Node { common, listen, memory, spill_dir, spill_size, writeback_delay, writeback_deadline, export_holes_max, rebalance_rate, rebalance_quiet, no_prefault, insecure } => {
            let tls = common.access()?.node_tls;
            surge_bb::node::check_exposure(&listen, tls.is_some(), insecure)?;
            let tier = common.tier()?;
            let cfg = NodeConfig {
                listen,
                store: StoreConfig { capacity: memory, spill_dir, spill_capacity: spill_size },
                writeback: WritebackConfig { delay: writeback_delay, deadline: writeback_deadline, export_holes_max, ..Default::default() },
                rebalance: RebalanceConfig { rate: rebalance_rate, quiet: rebalance_quiet, ..Default::default() },
                prefault: !no_prefault,
                tls,
                insecure,
            };
            let stop = stop_flag()?;
            let node = surge_bb::node::start(cfg, tier).context("starting the I/O node")?;
            println!("{}", node.addr);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && !node.drained() {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            if !node.drained() {
                node.stop();
            }
            Ok(())
        }
        Action::Mount { dir, common, strict, fsync_s3, write_behind, read_ahead, attr_ttl, import, full_wait, no_prefault } => {
            let tier = common.tier()?;
            if import {
                let n = surge_bb::status::import(&tier, None)?;
                tracing::info!("imported {n} objects from the bucket");
            }
            let ccfg = ClientConfig {
                write_behind,
                read_ahead,
                fsync_waits_for_s3: fsync_s3,
                cache_open_attrs: !strict,
                full_wait,
                prefault: !no_prefault,
                ..Default::default()
            };
            let client = Client::new(tier, ccfg)?;
            let stop = stop_flag()?;
            surge_bb::fuse::mount(client, &dir, MountConfig::new(strict, attr_ttl), stop)
                .with_context(|| format!("mounting {}", dir.display()))
        }
        Action::Status { path, common, json } => {
            let tier = common.tier()?;
            match path {
                None => {
                    let s = surge_bb::status::pool(&tier)?;
                    if json {
                        println!("{}", serde_json::to_string_pretty(&s)?);
                    } else {
                        println!("chunk size {} B, {} copies per dirty chunk", s.chunk_size, s.replicas);
                        println!("{:<24} {:<17} {:>10} {:>12} {:>12} {:>12}", "node", "state", "chunks", "used MiB", "dirty MiB", "memory MiB");
                        for n in &s.pool.nodes {
                            println!(
                                "{:<24} {:<17} {:>10} {:>12.1} {:>12.1} {:>12.1}",
                                n.addr,
                                n.state,
                                n.chunks,
                                n.used_bytes as f64 / 1048576.0,
                                n.dirty_bytes as f64 / 1048576.0,
                                n.capacity_bytes as f64 / 1048576.0
                            );
                        }
                        if let Some(d) = &s.pool.daemon {
                            println!(
                                "pool daemon: target {} nodes ({}..{}), ${:.6} so far, ${:.4}/h now; last: {}",
                                d["target"], d["min"], d["max"],
                                d["cost_usd"].as_f64().unwrap_or(0.0),
                                d["usd_per_hour"].as_f64().unwrap_or(0.0),
                                d["last_decision"].as_str().unwrap_or("-")
                            );
                        }
                        println!(
                            "dirty chunks: {} (oldest {}), files waiting for publish: {}",
                            s.dirty_chunks,
                            s.oldest_dirty_s.map_or("-".into(), |t| format!("{t:.1} s")),
                            s.publish_pending
                        );
                    }
                }
                Some(p) => {
                    let files = surge_bb::status::files(&tier, &p)?;
                    if json {
                        println!("{}", serde_json::to_string_pretty(&files)?);
                    } else {
                        println!("{:<14} {:>14} {:>6}  path", "state", "bytes", "dirty");
                        for f in &files {
                            let state = if f.persisted { "persisted" } else { "NOT persisted" };
                            println!("{state:<14} {:>14} {:>6}  {}", f.size, f.dirty_chunks, f.path);
                        }
                        let n = files.iter().filter(|f| !f.persisted).count();
                        println!("{} files, {} persisted, {} not yet", files.len(), files.len() - n, n);
                    }
                }
            }
            Ok(())
        }
        Action::Drain { addr, common, timeout } => {
            let tier = common.tier()?;
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template("draining {msg} [{bar:40}] {bytes}/{total_bytes} handed over")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar.set_message(addr.clone());
            surge_bb::drain::drain_node(&tier, &addr, timeout, |p| {
                bar.set_length(p.total_bytes);
                bar.set_position(p.total_bytes.saturating_sub(p.left_bytes));
            })?;
            bar.finish();
            println!("{addr} drained and left the pool");
            Ok(())
        }
        Action::Pool { common, min, max, node_memory, interval, shrink_after, high_water, low_water, instance, node_arg, node_listen, nodes, placement, compute_host, launcher, ec2 } => {
            anyhow::ensure!(min >= 1 && max >= min, "--min {min} --max {max}: need 1 <= min <= max");
            anyhow::ensure!(
                0.0 < low_water && low_water < high_water && high_water <= 1.0,
                "need 0 < --low-water ({low_water}) < --high-water ({high_water}) <= 1"
            );
            if nodes == "ec2" {
                ec2.check()?;
            }
            let placement = match placement.as_str() {
                "co-located" => surge_bb::pool::Placement::CoLocated,
                _ => surge_bb::pool::Placement::Dedicated,
            };
            let colocated = placement == surge_bb::pool::Placement::CoLocated;
            anyhow::ensure!(!colocated || nodes == "local", "--placement co-located starts nodes on --compute-host machines, not with --nodes {nodes}");
            anyhow::ensure!(colocated == !compute_host.is_empty(), "--compute-host goes with --placement co-located, and that needs at least one");
            let insecure = node_arg.iter().any(|a| a == "--insecure");
            let listen_ips: Vec<std::net::IpAddr> = if colocated { compute_host.iter().map(|h| h.ip).collect() } else { vec![node_listen] };
            if nodes == "local" {
                for ip in listen_ips {
                    surge_bb::node::check_exposure(&std::net::SocketAddr::new(ip, 0).to_string(), common.tls_dir.is_some(), insecure)?;
                }
            }
            let tier = common.tier()?;
            let mut args = vec!["--memory".to_string(), node_memory.to_string()];
            args.extend(common.to_args());
            args.extend(node_arg);
            let mut provider: Box<dyn surge_bb::pool::NodeProvider> = match nodes.as_str() {
                #[cfg(feature = "aws")]
                "ec2" => Box::new(ec2_nodes(&common, &ec2, &instance, args, tier.clone())?),
                #[cfg(not(feature = "aws"))]
                "ec2" => anyhow::bail!("--nodes ec2: this surge was built without the `aws` feature (cargo build --features aws)"),
                _ if colocated => Box::new(surge_bb::pool::CoLocatedNodes::new(std::env::current_exe()?, compute_host, &launcher, args, common.child_env())),
                _ => Box::new(surge_bb::pool::LocalNodes::new(std::env::current_exe()?, args).with_env(common.child_env()).listening_on(node_listen)),
            };
            let clock: Arc<dyn surge_block::Clock> = Arc::new(surge_block::SystemClock::new());
            let meter = surge_cloud::CostMeter::new(surge_cloud::PriceTable::default(), surge_cloud::WallClock::anchored(clock));
            let settings = surge_bb::pool::PoolSettings {
                policy: surge_policy::bb_pool::PoolConfig {
                    min_nodes: min,
                    max_nodes: max,
                    node_memory,
                    high_water,
                    low_water,
                    shrink_after,
                    ..Default::default()
                },
                interval,
                instance,
                drain_timeout: std::time::Duration::from_secs(120),
                placement,
            };
            let stop = stop_flag()?;
            surge_bb::pool::run(tier, provider.as_mut(), &meter, &settings, &stop)?;
            Ok(())
        }
        Action::Import { common, prefix } => {
            let tier = common.tier()?;
            let n = surge_bb::status::import(&tier, prefix.as_deref())?;
            println!("imported {n} objects");
            Ok(())
        }
        Action::BenchMeta(a) => crate::experiment::burstbuffer::meta_bench::run(&a).map(|_| ()),
        Action::BenchMetaClient(a) => crate::experiment::burstbuffer::meta_bench::client(&a),
        Action::Redis { dir, port, bind, no_auth, cluster } => {
            let stop = stop_flag()?;
            // Either server stops with this process (Drop kills it).
            let _single;
            let _cluster;
            anyhow::ensure!(bind.is_loopback() || (cluster.is_none() && !no_auth), "--bind {bind}: off loopback only a single server with its ACL user (not --cluster, not --no-auth)");
            match cluster {
                Some(n) => {
                    let ports = cluster_ports(port, n)?;
                    let c = surge_bb::local::LocalCluster::start(&dir, &ports, !no_auth)?;
                    println!("{}", c.url());
                    _cluster = c;
                }
                None => {
                    _single = if no_auth {
                        surge_bb::local::LocalRedis::start(&dir, port)?
                    } else {
                        surge_bb::local::LocalRedis::start_secured_on(&dir, bind, port)?
                    };
                    println!("redis://127.0.0.1:{port}/");
                }
            }
            if !no_auth {
                let pw = surge_bb::local::password_file(&dir);
                println!("export SURGE_BB_REDIS_USER={} SURGE_BB_REDIS_PASSWORD_FILE={}", surge_bb::local::ACL_USER, pw.display());
            }
            wait_for(&stop);
            Ok(())
        }
    }
}

/// `surge bb redis --cluster N --port P`: masters on P..P+N-1, each with
/// its cluster bus 10000 above (Redis's own convention).
fn cluster_ports(port: u16, n: usize) -> anyhow::Result<Vec<(u16, u16)>> {
    anyhow::ensure!(n >= 1, "--cluster {n}: a Redis Cluster needs at least 1 master");
    (0..n)
        .map(|i| {
            let p = (port as usize + i).try_into().ok().filter(|p: &u16| p.checked_add(10000).is_some());
            let p = p.ok_or_else(|| anyhow::anyhow!("--port {port} --cluster {n}: port {} or its bus port (+10000) is past 65535", port as usize + i))?;
            Ok((p, p + 10000))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        c: Common,
    }

    #[test]
    fn a_local_cluster_takes_consecutive_ports_with_buses_10000_above_and_at_least_1_master() {
        assert_eq!(cluster_ports(7000, 3).unwrap(), vec![(7000, 17000), (7001, 17001), (7002, 17002)]);
        assert_eq!(cluster_ports(7000, 1).unwrap(), vec![(7000, 17000)]);
        let e = cluster_ports(7000, 0).unwrap_err().to_string();
        assert!(e.contains("at least 1 master"), "{e}");
        let e = cluster_ports(55_534, 3).unwrap_err().to_string();
        assert!(e.contains("past 65535"), "{e}");
    }

    // Issue 38 item 2: the nodes a pool starts must not get the Redis URL
    // (which may hold a password) on their command line, where `ps` shows it
    // to every user: it goes in their environment.
    #[test]
    fn pool_nodes_get_the_redis_url_in_their_environment_not_their_arguments() {
        let t = T::try_parse_from(["x", "--redis", "redis://surge:s3cret@10.0.0.1:6379/", "--redis-user", "surge", "--redis-password-file", "/etc/bb/pw", "--tls-dir", "/etc/bb/tls"]).unwrap();
        let args = t.c.to_args();
        assert!(!args.iter().any(|a| a.contains("s3cret") || a.contains("10.0.0.1")), "{args:?}");
        for want in ["--redis-user", "--redis-password-file", "/etc/bb/pw", "--tls-dir", "/etc/bb/tls"] {
            assert!(args.iter().any(|a| a == want), "{want} missing: {args:?}");
        }
        assert_eq!(t.c.child_env(), [("SURGE_BB_REDIS".to_string(), "redis://surge:s3cret@10.0.0.1:6379/".to_string())]);
        // The arguments parse back as the same settings.
        let back = T::try_parse_from(std::iter::once("x".to_string()).chain(args)).unwrap().c;
        assert_eq!((back.redis_password_file, back.tls_dir, back.fs), (t.c.redis_password_file, t.c.tls_dir, t.c.fs));
    }

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        c: Common,
        #[command(flatten)]
        e: Ec2PoolArgs,
    }

    #[test]
    fn ec2_nodes_need_an_ami_or_a_launch_template() {
        let p = P::try_parse_from(["x"]).unwrap();
        assert!(p.e.check().unwrap_err().to_string().contains("--ec2-ami or --ec2-launch-template"));
        assert!(P::try_parse_from(["x", "--ec2-launch-template", "lt-1"]).unwrap().e.check().is_ok());
    }

    // No secrets in user-data: EC2 shows it to anyone allowed
    // DescribeInstanceAttribute, and to everything on the instance.
    #[test]
    #[cfg(feature = "aws")]
    fn ec2_user_data_refuses_a_redis_password_and_carries_the_node_settings() {
        let p = P::try_parse_from(["x", "--redis", "redis://surge:s3cret@10.0.0.1:6379/", "--ec2-ami", "ami-1"]).unwrap();
        let err = ec2_user_data(&p.c, &p.e, p.c.to_args()).unwrap_err().to_string();
        assert!(err.contains("password") && !err.contains("s3cret"), "{err}");
        let p = P::try_parse_from(["x", "--redis", "redis://10.0.0.1:6379/", "--redis-password-file", "/etc/bb/pw", "--ec2-ami", "ami-1", "--node-port", "7411"]).unwrap();
        let u = ec2_user_data(&p.c, &p.e, p.c.to_args()).unwrap();
        assert!(u.contains("/usr/local/bin/surge bb node --listen \"$IP:7411\" --redis redis://10.0.0.1:6379/ --fs default"), "{u}");
        assert!(u.contains("--redis-password-file /etc/bb/pw"), "{u}");
    }
}
