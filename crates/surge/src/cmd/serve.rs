//! `surge serve`: build the exports from specs, serve them over NBD, answer the
//! control API, and shut down gracefully on SIGINT/SIGTERM.

use crate::config::{self, ExportAllow, FileConfig, ListenAddr, TlsSetting, NBD_PORT};
use crate::control::{self, Controllable, ControlServer, Registry};
use crate::coop::{Coop, CoopConfig};
use crate::stack::share::{self, CoopTiming};
use crate::stack::volume::LocalCloud;
use crate::stack::{self, BuildContext, ExportSpec};
use anyhow::Context as _;
use parking_lot::RwLock;
use serde_json::json;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use surge_block::{BlockDev, Counted, SystemClock};
use surge_nbd::{AllowList, Export, Listen, Peer, PeerRoute, Server, ServerConfig};

const ABOUT: &str = "Export volumes over NBD (unix socket and TCP)";

const LONG_ABOUT: &str = "\
Export block volumes over the NBD protocol to qemu, nbd-client (/dev/nbdX), \
nbdfuse, nbdinfo/nbdcopy and fio's nbd engine.

With no arguments, surge serves one export named `default`: a sparse 1 GiB file \
<data-dir>/default.img (created if missing), on the unix socket <data-dir>/surge.sock \
and on tcp:127.0.0.1:10809 if that port is free, and prints how to connect.

An export is NAME=KIND:ARGS. Kinds:
  file:PATH[,direct][,create=SIZE][,ro]   a file or block device; create=SIZE makes a
                                          sparse file if PATH is missing; direct uses
                                          O_DIRECT for 4 KiB-aligned requests
  memory:SIZE                             a sparse in-memory volume (lost on exit)
  share:POOL[,weight=N][,limit=RATE][,reservation=RATE][,tenant=NAME][,depth=D][,adaptive=on|off|MS]
                                          a weighted share (SFQ(D)) of the device declared with
                                          --pool POOL=KIND:ARGS; `surge qos` shows and changes it live
Relative paths are taken from the data directory. Sizes: 4096, 512KiB, 64MiB, 1GiB, \
100G (= GiB), 10GB (= 10^9 bytes).

Security (docs/security.md): --tls require makes every client upgrade to TLS \
(NBD_OPT_STARTTLS) before it can see or use an export; --tls allow lets clients \
choose; --tls off (the default) refuses STARTTLS. --tls-certs DIR holds the \
server's X.509 certificate and key in the layout qemu, nbdkit and libnbd use:
  DIR/server-cert.pem   the server certificate (then any intermediates), PEM
  DIR/server-key.pem    its private key, PEM (PKCS#8, PKCS#1 or SEC1)
Clients verify it with the CA certificate: put ca-cert.pem in a directory of \
their own and use nbds:// or nbds+unix:// URIs with ?tls-certificates=THAT_DIR \
(libnbd), or qemu's --object tls-creds-x509,dir=THAT_DIR,endpoint=client. \
To make a test CA and server certificate with openssl:
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \\
    -keyout ca-key.pem -out ca-cert.pem -days 365 -subj /CN=my-surge-ca
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \\
    -keyout server-key.pem -out server.csr -subj /CN=HOSTNAME
  printf 'subjectAltName=DNS:HOSTNAME,IP:ADDRESS\\nextendedKeyUsage=serverAuth\\n' > ext.cnf
  openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem \\
    -CAcreateserial -days 365 -extfile ext.cnf -out server-cert.pem
(or with GnuTLS certtool: see docs/security.md). --tls-verify-peer (mutual TLS, \
as nbdkit names it) also makes every client present a certificate signed by the \
CA in DIR/ca-cert.pem: others are refused during the TLS handshake. Clients keep \
client-cert.pem and client-key.pem beside their ca-cert.pem (libnbd's \
tls-certificates=DIR, qemu's tls-creds-x509 dir). rustls has no server-side PSK, \
so TLS-PSK is not offered. A TCP listener on a non-loopback address is refused \
unless --tls require is set and clients are told apart, by --tls-verify-peer or an \
--allow list on every export, or --insecure is passed (--tls allow is not enough). \
Certificates are re-read on SIGHUP. Connections are capped (--max-connections, \
--max-connections-per-address) and a handshake must finish within 30 s.

--allow NAME=RULES limits export NAME to clients whose address matches one of \
RULES (comma-separated: 127.0.0.1, ::1, 10.0.0.0/8, fd00::/8, or `unix` for \
unix-socket clients); others do not see it in the export list and are refused \
(NBD_REP_ERR_POLICY). Without --allow an export is open to every client that \
reaches a listener. Repeat --allow for more exports or more rules.

Shares over several servers (docs/fairshare.md): daemons each in front of one \
storage server, with a `share:` pool of the same name, cooperate when given \
--coop-listen ADDR (where this daemon hears its peers) and --coop-peer ADDR for \
each other daemon. Every --coop-period (20ms) each sends the others what each \
tenant was served; weights, reservations and limits then hold over the total. \
A peer unheard for --coop-timeout (500ms) stops counting: its pools fall back \
to local SFQ(D); I/O never waits for a peer. --coop-key FILE (a secret every \
peer holds, mode 0600) signs reports (HMAC-SHA256) and drops unsigned ones; a \
--coop-listen address off loopback needs it (or --insecure). A tenant with clients=RANGE+RANGE \
serves every connection from those client addresses to its pool's exports.

SIGINT or SIGTERM stops accepting connections, finishes the requests already \
received (for 2 s newer requests get ESHUTDOWN, which tells clients to \
disconnect), flushes every export and exits 0; a second signal, or 30 s \
passing, exits 1 at once. `surge status` shows exports, I/O \
counters and connections through the control socket.";

const EXAMPLES: &str = "\
Examples:
  surge serve
  surge serve --listen unix:/tmp/nbd.sock --export disk=file:/srv/disk.img,create=10GiB
  surge serve --listen tcp:127.0.0.1:10809 --export scratch=memory:4GiB \\
              --export base=file:/srv/base.img --read-only base
  surge serve --config /etc/surge.toml
  surge serve --listen tcp:0.0.0.0:10809 --tls require --tls-certs /etc/surge/tls \\
              --export disk=file:/srv/disk.img --allow disk=10.0.0.0/8
Then, for instance:
  qemu-img info 'nbd+unix:///disk?socket=/tmp/nbd.sock'
  nbdinfo nbd://127.0.0.1:10809/scratch
  nbdinfo 'nbds://server.example:10809/disk?tls-certificates=/etc/surge/client-ca'

A --config file (TOML) holds the same things; flags add to it:
  listen = [\"unix:/run/surge/nbd.sock\", \"tcp:127.0.0.1:10809\"]
  workers = 8
  tls = \"allow\"
  tls_certs = \"/etc/surge/tls\"
  [[export]]
  name = \"disk\"
  spec = \"file:/srv/disk.img,create=10GiB\"
  read_only = false
  allow = [\"127.0.0.1\", \"10.0.0.0/8\", \"unix\"]";

#[derive(clap::Args, Debug)]
#[command(about = ABOUT, long_about = LONG_ABOUT, after_long_help = EXAMPLES)]
pub struct Args {
    /// Where to accept NBD clients: unix:PATH or tcp:HOST:PORT (repeatable).
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<ListenAddr>,
    /// An export, NAME=KIND:ARGS, e.g. disk=file:/srv/disk.img or tmp=memory:64MiB (repeatable).
    #[arg(long = "export", value_name = "NAME=KIND:ARGS")]
    pub exports: Vec<ExportSpec>,
    /// A shared device that several exports build on, NAME=KIND:ARGS (repeatable).
    #[arg(long = "pool", value_name = "NAME=KIND:ARGS")]
    pub pools: Vec<ExportSpec>,
    /// Serve this export read-only (repeatable).
    #[arg(long = "read-only", value_name = "NAME")]
    pub read_only: Vec<String>,
    /// Directory for default volumes and sockets [default: $XDG_DATA_HOME/surge or ~/.local/share/surge].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// TOML file with listeners, pools and exports (flags add to it).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Control socket for `surge status` / `surge set` [default: <data-dir>/control.sock].
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Threads serving each connection: this many requests of one connection can
    /// be at the device at once; 0 or 1 serves them one at a time on the
    /// connection's own thread [default: 8].
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Allow TCP listeners on non-loopback addresses without `--tls require`
    /// and client authentication (plaintext NBD: anyone on the path can read
    /// and change the data), and coop and metrics listeners without their guards.
    #[arg(long)]
    pub insecure: bool,
    /// NBD connections open at once; more are closed before the greeting [default: 512].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// NBD connections open at once from one client address [default: 64].
    #[arg(long, value_name = "N")]
    pub max_connections_per_address: Option<usize>,
    /// TLS (NBD_OPT_STARTTLS): off refuses it, allow lets clients choose, require
    /// makes every client upgrade first [default: off].
    #[arg(long, value_enum, value_name = "MODE")]
    pub tls: Option<TlsSetting>,
    /// Directory with server-cert.pem and server-key.pem (needed by --tls allow|require).
    #[arg(long, value_name = "DIR")]
    pub tls_certs: Option<PathBuf>,
    /// Mutual TLS: TLS clients must present a certificate signed by the CA in
    /// <tls-certs>/ca-cert.pem; others are refused.
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Only clients at these addresses may use export NAME: NAME=RULE[,RULE...]
    /// with RULE an address (127.0.0.1, ::1), a network (10.0.0.0/8) or `unix`
    /// (repeatable; without it an export is open to every client).
    #[arg(long = "allow", value_name = "NAME=RULES")]
    pub allow: Vec<ExportAllow>,
    /// Always copy data through surge, even for large reads and writes of plain
    /// file exports over plain sockets (which otherwise use sendfile/splice).
    #[arg(long)]
    pub no_zero_copy: bool,
    /// Hear cooperating daemons' reports here (unix:PATH or tcp:HOST:PORT);
    /// `share:` pools then hold their shares over all of them.
    #[arg(long, value_name = "ADDR")]
    pub coop_listen: Option<ListenAddr>,
    /// Another cooperating daemon's --coop-listen address (repeatable).
    #[arg(long = "coop-peer", value_name = "ADDR")]
    pub coop_peers: Vec<ListenAddr>,
    /// This daemon's name among its peers [default: its --coop-listen address].
    #[arg(long, value_name = "NAME")]
    pub coop_name: Option<String>,
    /// How often to report to peers [default: 20ms].
    #[arg(long, value_name = "DURATION")]
    pub coop_period: Option<String>,
    /// A peer unheard this long no longer counts [default: 500ms].
    #[arg(long, value_name = "DURATION")]
    pub coop_timeout: Option<String>,
    /// Sign reports to peers and accept only signed ones (HMAC-SHA256 with the
    /// secret in FILE, which every peer holds; mode 0600).
    #[arg(long, value_name = "FILE")]
    pub coop_key: Option<PathBuf>,
    /// Serve Prometheus metrics on HOST:PORT at /metrics (docs/metrics.md).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Only these scrapers may read the metrics (RULE[,RULE...]: addresses or
    /// networks); others get 403. Needed for a non-loopback --metrics address.
    #[arg(long, value_name = "RULES")]
    pub metrics_allow: Option<AllowList>,
    /// Cloud of volume exports (NAME=gp3:100GiB,...): local (emulated, in the
    /// data dir) or aws (EBS; settings under [aws] in the config, README) [default: local].
    #[arg(long, value_enum, value_name = "PROVIDER")]
    pub provider: Option<crate::cloud::ProviderKind>,
    /// Run the local cloud at reduced scale, for experiments: `time=F,rate=R`.
    /// Volumes serve their type's rates x R and hold R x F of their size; the
    /// daemon's durations (attach delay, windows, ID, EBS's modification
    /// rules) run x F, its cache sizes x R x F, and billing counts each second
    /// as 1/F; timing between requests (idle gap, polls) is not scaled. Specs and prices stay full-scale [default: full scale].
    #[arg(long, value_name = "time=F,rate=R", value_parser = LocalCloud::parse_scale)]
    pub local_scale: Option<surge_block::model::Scale>,
    /// EBS's volume-modification rules in the local cloud: none, ebs-6h (one
    /// modification per 6 hours) or ebs-24h (four per rolling 24 hours, each
    /// after the previous one completed) [default: none].
    #[arg(long, value_name = "RULES", value_parser = LocalCloud::parse_rules)]
    pub local_modify_rules: Option<surge_cloud::ModifyRules>,
    /// The instance type the local cloud's volumes are attached to (e.g.
    /// r5.12xlarge): all of them together are held to its EBS bandwidth and
    /// IOPS (the price table's `instance_ebs`) [default: no instance limit].
    #[arg(long, value_name = "TYPE", value_parser = LocalCloud::parse_instance)]
    pub local_instance: Option<surge_cloud::cost::InstanceEbs>,
    /// Print the volumes and cloud API calls the exports would make, with
    /// their list prices, make none of them, and exit (nothing is served).
    #[arg(long)]
    pub dry_run: bool,
    /// Record every request of export NAME into DIR (a new directory; gzip
    /// segments, oldest deleted past --record-max-size): NAME=DIR, repeatable.
    /// Read it with `surge trace show DIR`, plan with `surge plan workload --trace DIR`.
    /// On a running daemon: `surge set NAME record=on|off` (and `record_dir=DIR`).
    #[arg(long = "record", value_name = "NAME=DIR")]
    pub record: Vec<String>,
    /// Disk space a recording keeps at most (its oldest segments are deleted);
    /// default 1GiB.
    #[arg(long, value_name = "SIZE")]
    pub record_max_size: Option<String>,
}

/// Everything `serve` will do, resolved from flags, the config file and defaults.
#[derive(Debug)]
pub struct Plan {
    pub data_dir: PathBuf,
    pub control: PathBuf,
    pub workers: Option<usize>,
    pub listeners: Vec<ListenAddr>,
    /// The default TCP listener is skipped (not an error) if its port is taken.
    pub optional_tcp: Option<ListenAddr>,
    pub pools: Vec<ExportSpec>,
    pub exports: Vec<(ExportSpec, bool)>,
    pub tls: TlsSetting,
    /// Where server-cert.pem and server-key.pem are (set whenever `tls` is not off).
    pub tls_certs: Option<PathBuf>,
    /// Clients must present a certificate signed by `tls_certs`/ca-cert.pem.
    pub tls_verify_peer: bool,
    pub zero_copy: bool,
    /// Allow-lists by export name (config entries and flags for one name are merged).
    pub allow: Vec<(String, AllowList)>,
    pub coop: Option<CoopConfig>,
    pub metrics: Option<std::net::SocketAddr>,
    /// Scrapers allowed to read the metrics (`None`: anyone who reaches it).
    pub metrics_allow: Option<AllowList>,
    pub max_connections: Option<usize>,
    pub max_connections_per_address: Option<usize>,
    pub provider: crate::cloud::ProviderKind,
    /// How the local cloud behaves (scale, modification rules).
    pub local: LocalCloud,
    /// The config file and what it said at start (SIGHUP compares against it).
    pub config: Option<(PathBuf, FileConfig)>,
    /// Exports whose requests are recorded, and where.
    pub record: Vec<(String, PathBuf)>,
    pub record_limits: surge_trace::Limits,
}

/// Merge flags over the config file, then fill in defaults.
pub fn plan(args: Args) -> anyhow::Result<Plan> {
    let file = match &args.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let data_dir = match args.data_dir.or(file.data_dir.clone()) {
        Some(d) => d,
        None => config::default_data_dir()?,
    };
    let control = args.control.or(file.control.clone()).unwrap_or_else(|| data_dir.join("control.sock"));
    let tls = args.tls.or(file.tls).unwrap_or_default();
    let tls_certs = args.tls_certs.or(file.tls_certs.clone());
    if tls != TlsSetting::Off && tls_certs.is_none() {
        anyhow::bail!(
            "--tls {tls} needs --tls-certs DIR (a directory holding server-cert.pem and server-key.pem; \
             see `surge serve --help` for how to make them)"
        );
    }
    let tls_verify_peer = args.tls_verify_peer || file.tls_verify_peer;
    if tls_verify_peer && tls == TlsSetting::Off {
        anyhow::bail!("--tls-verify-peer checks TLS client certificates: it needs --tls allow or --tls require");
    }
    let insecure = args.insecure || file.insecure;

    let mut listeners: Vec<ListenAddr> =
        file.listen.iter().map(|s| s.parse()).collect::<anyhow::Result<_>>().context("config: listen")?;
    listeners.extend(args.listen);
    let mut optional_tcp = None;
    if listeners.is_empty() {
        listeners.push(ListenAddr::Unix(data_dir.join("surge.sock")));
        optional_tcp = Some(ListenAddr::Tcp(([127, 0, 0, 1], NBD_PORT).into()));
    }
    let mut exports = file.export_specs()?;
    exports.extend(args.exports.into_iter().map(|s| (s, false)));
    if exports.is_empty() {
        exports.push((config::default_export(&data_dir), false));
    }
    apply_read_only(&mut exports, &args.read_only)?;
    check_unique(exports.iter().map(|(s, _)| s.name.as_str()), "export")?;
    let allow = merge_allows(file.export_allows()?.into_iter().chain(args.allow), &exports)?;
    // Off the machine: TLS for every client, who must be told apart (by a
    // client certificate or an allow-list), or an explicit --insecure.
    let exposure = config::Exposure {
        insecure,
        tls,
        verify_peer: tls_verify_peer,
        open_exports: exports.iter().map(|(s, _)| s.name.clone()).filter(|n| !allow.iter().any(|(a, _)| a == n)).collect(),
    };
    for l in &listeners {
        l.check_exposure(&exposure)?;
    }

    let mut pools = file.pool_specs()?;
    pools.extend(args.pools);
    check_unique(pools.iter().map(|s| s.name.as_str()), "pool")?;
    let coop_key = args.coop_key.or(file.coop.as_ref().and_then(|c| c.key_file.clone()));
    let coop = coop_plan(&args.coop_listen, &args.coop_peers, &args.coop_name, &args.coop_period, &args.coop_timeout, coop_key.as_deref(), file.coop.as_ref())?;
    if let Some(c) = &coop {
        c.listen.check_coop_exposure(c.key.is_some(), insecure).context("--coop-listen")?;
    }

    let metrics = args.metrics.or(file.metrics);
    let metrics_allow = match (args.metrics_allow, &file.metrics_allow) {
        (Some(a), _) => Some(a),
        (None, Some(rules)) => Some(rules.join(",").parse().context("config: metrics_allow")?),
        (None, None) => None,
    };
    if let Some(m) = &metrics {
        config::check_metrics_exposure(m, metrics_allow.as_ref(), insecure)?;
    }
    let provider = args.provider.or(file.provider).unwrap_or_default();
    let local = LocalCloud { scale: args.local_scale.unwrap_or_default(), modify_rules: args.local_modify_rules.unwrap_or_default(), instance: args.local_instance };
    let record = record_plan(file.export_records(), &args.record, &exports)?;
    let record_limits = record_limits(args.record_max_size.as_deref().or(file.record_max_size.as_deref()).unwrap_or("1GiB"))?;
    Ok(Plan {
        record,
        record_limits,
        metrics,
        metrics_allow,
        max_connections: args.max_connections.or(file.max_connections),
        max_connections_per_address: args.max_connections_per_address.or(file.max_connections_per_address),
        provider,
        local,
        config: args.config.map(|p| (p, file.clone())),
        data_dir,
        control,
        workers: args.workers.or(file.workers),
        listeners,
        optional_tcp,
        pools,
        exports,
        tls,
        tls_certs: tls_certs.filter(|_| tls != TlsSetting::Off),
        tls_verify_peer,
        zero_copy: !args.no_zero_copy,
        allow,
        coop,
    })
}

/// The config file's `record = DIR` of each export, then `--record NAME=DIR`
/// (every NAME an export, each flag given once; a flag overrides the file).
fn record_plan(from_file: Vec<(String, PathBuf)>, flags: &[String], exports: &[(ExportSpec, bool)]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut v = from_file;
    let mut flagged: Vec<&str> = Vec::new();
    for f in flags {
        let (name, dir) = f.split_once('=').filter(|(n, d)| !n.is_empty() && !d.is_empty()).ok_or_else(|| anyhow::anyhow!("--record {f}: expected NAME=DIR"))?;
        if !exports.iter().any(|(s, _)| s.name == name) {
            let known: Vec<&str> = exports.iter().map(|(s, _)| s.name.as_str()).collect();
            anyhow::bail!("--record {name}: no such export (exports: {})", known.join(", "));
        }
        anyhow::ensure!(!flagged.contains(&name), "--record {name}: given twice");
        flagged.push(name);
        v.retain(|(n, _)| n != name);
        v.push((name.to_string(), PathBuf::from(dir)));
    }
    Ok(v)
}

fn record_limits(max: &str) -> anyhow::Result<surge_trace::Limits> {
    let max_bytes = surge_block::units::parse_size(max).map_err(|e| anyhow::anyhow!("--record-max-size {max}: {e}"))?;
    anyhow::ensure!(max_bytes >= 1 << 20, "--record-max-size {max}: at least 1MiB");
    // Four segments or more, so rotation deletes a quarter at a time at most.
    Ok(surge_trace::Limits { segment_bytes: (max_bytes / 4).min(64 << 20), max_bytes })
}

/// Flags over the `[coop]` table; nothing without a listen address.
fn coop_plan(
    listen: &Option<ListenAddr>,
    peers: &[ListenAddr],
    name: &Option<String>,
    period: &Option<String>,
    timeout: &Option<String>,
    key_file: Option<&Path>,
    file: Option<&config::CoopEntry>,
) -> anyhow::Result<Option<CoopConfig>> {
    let listen = match (listen, file) {
        (Some(l), _) => l.clone(),
        (None, Some(f)) => f.listen.parse().context("config [coop] listen")?,
        (None, None) => {
            anyhow::ensure!(peers.is_empty(), "--coop-peer needs --coop-listen (where this daemon hears its peers)");
            return Ok(None);
        }
    };
    let mut all: Vec<ListenAddr> = match file {
        Some(f) => f.peers.iter().map(|p| p.parse()).collect::<anyhow::Result<_>>().context("config [coop] peers")?,
        None => Vec::new(),
    };
    all.extend(peers.iter().cloned());
    all.retain(|p| *p != listen);
    let dur = |flag: &Option<String>, file: Option<&String>, default: &str, what: &str| -> anyhow::Result<Duration> {
        let v = flag.as_deref().or(file.map(String::as_str)).unwrap_or(default);
        let d = surge_block::units::parse_duration(v).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        anyhow::ensure!(!d.is_zero(), "{what} must be more than 0");
        Ok(d)
    };
    let period = dur(period, file.and_then(|f| f.period.as_ref()), "20ms", "--coop-period")?;
    let peer_timeout = dur(timeout, file.and_then(|f| f.peer_timeout.as_ref()), "500ms", "--coop-timeout")?;
    anyhow::ensure!(peer_timeout > period, "--coop-timeout ({peer_timeout:?}) must be longer than --coop-period ({period:?})");
    let name = name.clone().or(file.and_then(|f| f.name.clone())).unwrap_or_else(|| listen.to_string());
    let key = key_file.map(crate::coop::CoopKey::from_file).transpose().context("--coop-key")?;
    Ok(Some(CoopConfig { name, listen, peers: all, period, peer_timeout, key }))
}

/// One allow-list per export (rules for the same name add up); every name must be an export.
fn merge_allows(
    given: impl Iterator<Item = ExportAllow>,
    exports: &[(ExportSpec, bool)],
) -> anyhow::Result<Vec<(String, AllowList)>> {
    let mut out: Vec<(String, AllowList)> = Vec::new();
    for a in given {
        if !exports.iter().any(|(s, _)| s.name == a.name) {
            let known: Vec<_> = exports.iter().map(|(s, _)| s.name.as_str()).collect();
            anyhow::bail!("--allow {}: no such export (exports: {})", a.name, known.join(", "));
        }
        match out.iter_mut().find(|(n, _)| *n == a.name) {
            Some((_, l)) => l.0.extend(a.list.0),
            None => out.push((a.name, a.list)),
        }
    }
    Ok(out)
}

fn apply_read_only(exports: &mut [(ExportSpec, bool)], names: &[String]) -> anyhow::Result<()> {
    for name in names {
        let Some(i) = exports.iter().position(|(s, _)| &s.name == name) else {
            let known: Vec<_> = exports.iter().map(|(s, _)| s.name.as_str()).collect();
            anyhow::bail!("--read-only {name}: no such export (exports: {})", known.join(", "));
        };
        exports[i].1 = true;
    }
    Ok(())
}

fn check_unique<'a>(names: impl Iterator<Item = &'a str>, what: &str) -> anyhow::Result<()> {
    let mut seen = std::collections::HashSet::new();
    for n in names {
        anyhow::ensure!(seen.insert(n), "{what} name {n:?} is used twice");
    }
    Ok(())
}

/// The running server, shared with status reporters; taken out at shutdown.
type ServerCell = Arc<RwLock<Option<Server>>>;

/// What `surge status` shows for one export.
struct ExportControl {
    name: String,
    kind: String,
    description: String,
    detail: serde_json::Value,
    read_only: bool,
    /// The export's allow-list as given (`None`: every client).
    allow: Option<String>,
    counted: Arc<Counted>,
    server: ServerCell,
    /// `record=on|off`, `record_dir=`.
    recording: Arc<crate::recording::Recording>,
}

impl Controllable for ExportControl {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn kind(&self) -> String {
        "export".into()
    }
    fn status(&self) -> serde_json::Value {
        let conns = self.server.read().as_ref().and_then(|s| s.stats().exports.into_iter().find(|e| e.name == self.name));
        json!({
            "kind": self.kind,
            "description": self.description,
            "size_bytes": self.counted.size(),
            "read_only": self.read_only,
            "allow": self.allow,
            "detail": self.detail,
            "io": self.counted.stats(),
            "connections": {
                "active": conns.as_ref().map_or(0, |c| c.active_connections),
                "total": conns.as_ref().map_or(0, |c| c.connections),
            },
            "record": self.recording.status(),
        })
    }
    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        self.recording.set(key, value)
    }
}

/// One export, built and counted, before the server owns it.
struct Prepared {
    export: Export,
    control: Arc<ExportControl>,
    extra: Vec<Arc<dyn Controllable>>,
    recording: Arc<crate::recording::Recording>,
}

/// `--dry-run`: the plan of every export on the daemon's provider (stack::dryrun).
fn print_dry_run(plan: &Plan) -> anyhow::Result<()> {
    let aws = plan.config.as_ref().and_then(|(_, f)| f.aws.as_ref());
    let cloud = crate::cloud::open(plan.provider, aws, &plan.data_dir)?;
    let mut base = BuildContext::new(plan.data_dir.clone(), Arc::new(SystemClock::new()));
    base.local = plan.local;
    let specs: Vec<ExportSpec> = plan.exports.iter().map(|(s, _)| s.clone()).collect();
    print!("{}", stack::dryrun::plan(&specs, cloud, &plan.data_dir, &base)?);
    Ok(())
}

/// The pools, and their own controls (a `remote:` pool's connection counters).
fn build_context(plan: &Plan) -> anyhow::Result<(BuildContext, Vec<Arc<dyn Controllable>>)> {
    let mut ctx = BuildContext::new(plan.data_dir.clone(), Arc::new(SystemClock::new()));
    ctx.local = plan.local;
    if plan.provider != crate::cloud::ProviderKind::Local {
        let aws = plan.config.as_ref().and_then(|(_, f)| f.aws.as_ref());
        ctx.cloud = Some(crate::cloud::open(plan.provider, aws, &plan.data_dir)?);
    }
    let mut controls = Vec::new();
    for p in &plan.pools {
        let built = stack::build(p, &ctx).with_context(|| format!("pool {}", p.name))?;
        ctx.pools.insert(p.name.clone(), built.dev);
        controls.extend(built.controls.into_iter().map(|c| Arc::new(PoolControl(c)) as Arc<dyn Controllable>));
    }
    Ok((ctx, controls))
}

/// A pool's control as `surge status` lists it: `pool/NAME...`, apart from the
/// exports' names.
struct PoolControl(Arc<dyn Controllable>);

impl Controllable for PoolControl {
    fn name(&self) -> String {
        format!("pool/{}", self.0.name())
    }
    fn kind(&self) -> String {
        self.0.kind()
    }
    fn status(&self) -> serde_json::Value {
        self.0.status()
    }
    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        self.0.set(key, value)
    }
}

fn prepare(
    spec: &ExportSpec,
    read_only: bool,
    allow: Option<AllowList>,
    ctx: &BuildContext,
    server: &ServerCell,
    metrics: Option<&crate::metrics::Metrics>,
    record: (Option<&Path>, surge_trace::Limits),
) -> anyhow::Result<Prepared> {
    let built = stack::build(spec, ctx).with_context(|| format!("export {}", spec.name))?;
    // Every export can be recorded from the control socket; off it costs a load.
    let (dev, switch) = surge_trace::record::switchable(built.dev, &spec.name);
    let recording = Arc::new(crate::recording::Recording::new(&spec.name, switch, record.1, &ctx.data_dir));
    if let Some(dir) = record.0 {
        recording.start(Some(dir)).map_err(anyhow::Error::msg).with_context(|| format!("--record {}", spec.name))?;
    }
    let dev = match metrics {
        Some(m) => m.timed(&spec.name, dev),
        None => dev,
    };
    let counted = Arc::new(Counted::new(dev));
    let read_only = read_only || counted.caps().read_only;
    let allow_text = allow.as_ref().map(|a| a.to_string());
    // Connections routed to another tenant by address are counted here too.
    let route = share::route_for(ctx, &spec.name)
        .map(|route| Arc::new(CountedRoute { route, counted: counted.clone() }) as Arc<dyn PeerRoute>);
    let export = Export {
        name: spec.name.clone(),
        description: built.description.clone(),
        dev: counted.clone(),
        read_only,
        allow,
        route,
    };
    let control = Arc::new(ExportControl {
        name: spec.name.clone(),
        kind: spec.kind.clone(),
        description: built.description,
        detail: built.detail,
        read_only,
        allow: allow_text,
        counted,
        server: server.clone(),
        recording: recording.clone(),
    });
    Ok(Prepared { export, control, extra: built.controls, recording })
}

/// A route whose devices count in the export's counters.
struct CountedRoute {
    route: Arc<dyn PeerRoute>,
    counted: Arc<Counted>,
}

impl PeerRoute for CountedRoute {
    fn device_for(&self, peer: &Peer) -> Option<Arc<dyn BlockDev>> {
        self.route.device_for(peer).map(|d| Arc::new(self.counted.sharing(d)) as Arc<dyn BlockDev>)
    }
}

fn to_listen(l: &ListenAddr) -> Listen {
    match l {
        ListenAddr::Unix(p) => Listen::Unix(p.clone()),
        ListenAddr::Tcp(a) => Listen::Tcp(*a),
    }
}

/// Bind every listener; the default TCP one only if its port is free.
fn start_listeners(server: &Server, plan: &Plan) -> anyhow::Result<Vec<ListenAddr>> {
    let mut bound = Vec::new();
    for l in &plan.listeners {
        if let ListenAddr::Unix(p) = l {
            control::remove_stale_socket(p)?;
        }
        server.listen(&to_listen(l)).with_context(|| format!("listening on {l}"))?;
        bound.push(l.clone());
    }
    if let Some(l) = &plan.optional_tcp {
        match server.listen(&to_listen(l)) {
            Ok(()) => bound.push(l.clone()),
            Err(e) => tracing::warn!("not listening on {l}: {e}"),
        }
    }
    Ok(bound)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // Catch signals before anything listens, so an early SIGTERM is graceful too.
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("installing signal handlers")?;
    let dry_run = args.dry_run;
    let plan = plan(args)?;
    if dry_run {
        return print_dry_run(&plan);
    }
    std::fs::create_dir_all(&plan.data_dir).with_context(|| format!("creating data dir {}", plan.data_dir.display()))?;

    let (ctx, pool_controls) = build_context(&plan)?;
    share::set_coop(&ctx, plan.coop.as_ref().map(|c| CoopTiming { period: c.period, peer_timeout: c.peer_timeout, max_peers: c.peers.len() }));
    let cell: ServerCell = Arc::new(RwLock::new(None));
    let registry = Registry::new();
    let metrics = plan.metrics.map(|_| crate::metrics::Metrics::new(registry.clone()));
    let allow_of = |name: &str| plan.allow.iter().find(|(n, _)| n == name).map(|(_, l)| l.clone());
    let prepared: Vec<Prepared> = plan
        .exports
        .iter()
        .map(|(s, ro)| {
            let rec = (plan.record.iter().find(|(n, _)| *n == s.name).map(|(_, d)| d.as_path()), plan.record_limits);
            prepare(s, *ro, allow_of(&s.name), &ctx, &cell, metrics.as_ref(), rec)
        })
        .collect::<anyhow::Result<_>>()?;

    let mut exports = Vec::new();
    let recordings: Vec<_> = prepared.iter().map(|p| p.recording.clone()).collect();
    for c in pool_controls {
        registry.register(c)?;
    }
    for p in prepared {
        registry.register(p.control.clone())?;
        for c in p.extra {
            registry.register(c)?;
        }
        exports.push(p.export);
    }
    let summary: Vec<ExportSummary> = exports.iter().map(ExportSummary::of).collect();

    let mut cfg = ServerConfig::new(exports);
    if let Some(w) = plan.workers {
        cfg.threads_per_connection = w;
    }
    cfg.tls_mode = plan.tls.mode();
    cfg.zero_copy = plan.zero_copy;
    if let Some(n) = plan.max_connections {
        cfg.max_connections = n;
    }
    if let Some(n) = plan.max_connections_per_address {
        cfg.max_connections_per_address = n;
    }
    if let Some(dir) = &plan.tls_certs {
        cfg.tls = Some(load_tls(dir, plan.tls_verify_peer)?);
        tracing::info!(mode = %plan.tls, certs = %dir.display(), verify_peer = plan.tls_verify_peer, "TLS enabled");
    }
    let server = Server::start(cfg).context("starting the NBD server")?;
    let bound = start_listeners(&server, &plan);
    *cell.write() = Some(server);
    let bound = match bound {
        Ok(b) => b,
        Err(e) => {
            let _ = shutdown(&cell);
            return Err(e);
        }
    };
    let control = ControlServer::start(&plan.control, registry.clone());
    let control = match control {
        Ok(c) => c,
        Err(e) => {
            let _ = shutdown(&cell);
            return Err(e);
        }
    };
    let coop = match plan.coop.clone().map(|c| Coop::start(c, ctx.fair_queues.clone())).transpose() {
        Ok(c) => c,
        Err(e) => {
            let _ = shutdown(&cell);
            return Err(e);
        }
    };
    if let Some(c) = &coop {
        registry.register(c.control())?;
    }
    let metrics_server = match (plan.metrics, metrics) {
        (Some(addr), Some(m)) => match crate::metrics::MetricsServer::start(addr, m, plan.metrics_allow.clone()) {
            Ok(s) => Some(s),
            Err(e) => {
                drop(control);
                let _ = shutdown(&cell);
                return Err(e);
            }
        },
        _ => None,
    };
    print_instructions(&summary, &bound, control.path());
    if let Some(m) = &metrics_server {
        println!("Metrics: curl http://{}/metrics", m.addr());
    }
    if plan.tls != TlsSetting::Off {
        let mut out = std::io::stdout().lock();
        let note = tls_note(plan.tls, plan.tls_verify_peer, &bound, &summary[0].name);
        let _ = out.write_all(note.as_bytes()).and_then(|_| out.flush());
    }

    let mut running = plan.config.clone();
    let sig = signals.forever().find(|&sig| {
        if sig != SIGHUP {
            return true;
        }
        reload_config(&mut running, &registry);
        reload_certificates(&plan, &cell);
        false
    });
    tracing::info!(signal = ?sig, "shutting down: finishing in-flight requests and flushing");
    exit_if_shutdown_hangs(signals, SHUTDOWN_LIMIT);
    drop(metrics_server);
    drop(control);
    drop(coop);
    let done = shutdown(&cell).context("shutting down");
    // After the last request: close each trace (queued records written).
    for r in &recordings {
        r.stop();
    }
    done?;
    Ok(())
}

/// Longest a graceful shutdown may take (the server's own phases take a few
/// seconds; this bounds a device that hangs on the final flush).
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(30);

/// Shutdown always ends: a second SIGINT/SIGTERM, or `limit` passing, exits at
/// once with status 1 and says what was skipped.
fn exit_if_shutdown_hangs(mut signals: signal_hook::iterator::Signals, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    let watchdog = move || loop {
        if let Some(sig) = signals.pending().find(|&s| s != signal_hook::consts::SIGHUP) {
            eprintln!("surge: signal {sig} during shutdown: exiting now, without waiting for requests or the final flush");
            std::process::exit(1);
        }
        if std::time::Instant::now() >= deadline {
            eprintln!("surge: shutdown did not finish within {limit:?}: exiting without it");
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    if let Err(e) = std::thread::Builder::new().name("shutdown-watchdog".into()).spawn(watchdog) {
        tracing::warn!("no shutdown watchdog: {e}");
    }
}

/// SIGHUP: re-read the config file and apply what can change live (`crate::reload`).
fn reload_config(running: &mut Option<(PathBuf, FileConfig)>, registry: &Registry) {
    let Some((path, old)) = running.as_mut() else {
        tracing::warn!("SIGHUP: no --config file to reload");
        return;
    };
    let new = match FileConfig::load(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("SIGHUP: config not reloaded, the running settings stay: {e:#}");
            return;
        }
    };
    let r = crate::reload::diff(old, &new);
    for line in crate::reload::apply(&r, registry) {
        if line.contains("not applied") {
            tracing::warn!("SIGHUP {}: {line}", path.display());
        } else {
            tracing::info!("SIGHUP {}: {line}", path.display());
        }
    }
    // What was applied is now the running state; what needs a restart is not.
    let mut next = old.clone();
    next.log = new.log.clone();
    for e in next.exports.iter_mut() {
        if let Some(n) = new.exports.iter().find(|n| n.name == e.name) {
            if r.changes.iter().any(|c| c.target == format!("{}/volume", e.name) || share_target(&e.spec, &e.name) == c.target) {
                e.spec = n.spec.clone();
            }
        }
    }
    *old = next;
}

/// The server certificate and key in `dir` (and the CA of client
/// certificates with `verify_peer`).
fn load_tls(dir: &Path, verify_peer: bool) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    surge_nbd::tls::server_config(dir, verify_peer).with_context(|| {
        let ca = if verify_peer { ", and ca-cert.pem for --tls-verify-peer" } else { "" };
        format!("--tls-certs {}: loading server-cert.pem and server-key.pem{ca}", dir.display())
    })
}

/// SIGHUP: re-read the TLS certificates (same directory, same client
/// verification as at start); new sessions use them. A file that fails to
/// load leaves the running certificates in place.
fn reload_certificates(plan: &Plan, cell: &ServerCell) {
    let Some(dir) = &plan.tls_certs else { return };
    let loaded = load_tls(dir, plan.tls_verify_peer).and_then(|tls| match cell.read().as_ref() {
        Some(server) => server.set_tls(tls).map_err(anyhow::Error::from),
        None => Ok(()),
    });
    match loaded {
        Ok(()) => tracing::info!(certs = %dir.display(), "SIGHUP: TLS certificates reloaded; new sessions use them"),
        Err(e) => tracing::error!("SIGHUP: TLS certificates not reloaded, the running ones stay: {e:#}"),
    }
}

/// The control target of a `share:` export's tenant.
fn share_target(spec: &str, export: &str) -> String {
    let tenant = spec.split(',').find_map(|kv| kv.strip_prefix("tenant=")).unwrap_or(export);
    format!("qos/{tenant}")
}

fn shutdown(cell: &ServerCell) -> anyhow::Result<()> {
    match cell.write().take() {
        Some(s) => s.shutdown().map_err(Into::into),
        None => Ok(()),
    }
}

/// What the connection instructions need to know about an export.
struct ExportSummary {
    name: String,
    size: u64,
    description: String,
    read_only: bool,
}

impl ExportSummary {
    fn of(e: &Export) -> Self {
        ExportSummary { name: e.name.clone(), size: e.dev.size(), description: e.description.clone(), read_only: e.read_only }
    }
}

/// Tell the user, on stdout, exactly how to reach what is being served.
fn print_instructions(exports: &[ExportSummary], bound: &[ListenAddr], control: &Path) {
    let text = instructions(exports, bound, control);
    let mut out = std::io::stdout().lock();
    // A closed stdout must not take the server down.
    let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
}

pub fn nbd_uri(listen: &ListenAddr, export: &str) -> String {
    match listen {
        ListenAddr::Unix(p) => format!("nbd+unix:///{export}?socket={}", p.display()),
        ListenAddr::Tcp(a) => format!("nbd://{a}/{export}"),
    }
}

/// How TLS clients connect (the plain URIs above fail when TLS is required).
fn tls_note(tls: TlsSetting, verify_peer: bool, bound: &[ListenAddr], first: &str) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = match tls {
        TlsSetting::Require => writeln!(s, "TLS is required: plaintext clients are refused. With TLS:"),
        _ => writeln!(s, "TLS is allowed. With TLS:"),
    };
    for l in bound {
        let uri = nbd_uri(l, first).replacen("nbd", "nbds", 1);
        let sep = if uri.contains('?') { '&' } else { '?' };
        let _ = writeln!(s, "  nbdinfo '{uri}{sep}tls-certificates=DIR'   # DIR holds ca-cert.pem, the CA that signed the server certificate");
    }
    if verify_peer {
        let _ = writeln!(s, "  and DIR also holds client-cert.pem + client-key.pem: a client certificate signed by the CA in the server's ca-cert.pem");
    }
    s
}

fn instructions(exports: &[ExportSummary], bound: &[ListenAddr], control: &Path) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "surge is serving {} export(s):", exports.len());
    for e in exports {
        let ro = if e.read_only { ", read-only" } else { "" };
        let _ = writeln!(s, "  {:<12} {:>10}{ro}  {}", e.name, stack::format_size(e.size), e.description);
    }
    let _ = writeln!(s, "listening on: {}", bound.iter().map(|l| l.to_string()).collect::<Vec<_>>().join("  "));
    let first = &exports[0].name;
    let _ = writeln!(s, "\nConnect with:");
    for l in bound {
        let uri = nbd_uri(l, first);
        let _ = writeln!(s, "  nbdinfo '{uri}'");
        let _ = writeln!(s, "  qemu-img info '{uri}'");
    }
    let uri = nbd_uri(&bound[0], first);
    let _ = writeln!(s, "  fio --name=t --ioengine=nbd --uri='{uri}' --rw=randread --bs=4k --iodepth=32 --size=64M");
    let _ = writeln!(s, "  mkdir -p /tmp/nbd && nbdfuse /tmp/nbd '{uri}' &   # then: losetup -f --show /tmp/nbd/nbd");
    match bound.iter().find(|l| matches!(l, ListenAddr::Unix(_))) {
        Some(ListenAddr::Unix(p)) => {
            let _ = writeln!(s, "  nbd-client -unix {} /dev/nbd0 -N {first}   # where the nbd kernel module exists", p.display());
        }
        _ => {
            if let Some(ListenAddr::Tcp(a)) = bound.first() {
                let _ = writeln!(s, "  nbd-client {} {} /dev/nbd0 -N {first}   # where the nbd kernel module exists", a.ip(), a.port());
            }
        }
    }
    let _ = writeln!(s, "Status: surge status --control {}", control.display());
    let _ = writeln!(s, "Stop with Ctrl-C or SIGTERM: in-flight requests finish, data is flushed.");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: Args,
    }

    fn args(v: &[&str]) -> Args {
        T::try_parse_from(std::iter::once("serve").chain(v.iter().copied())).unwrap().a
    }

    #[test]
    fn no_arguments_serve_a_default_file_on_default_sockets() {
        let p = plan(args(&["--data-dir", "/d"])).unwrap();
        assert_eq!(p.listeners, [ListenAddr::Unix("/d/surge.sock".into())]);
        assert_eq!(p.optional_tcp, Some("tcp:127.0.0.1:10809".parse().unwrap()));
        assert_eq!(p.control, Path::new("/d/control.sock"));
        assert_eq!(p.exports, [("default=file:/d/default.img,create=1GiB".parse().unwrap(), false)]);
    }

    #[test]
    fn given_listeners_replace_the_defaults() {
        let p = plan(args(&["--data-dir", "/d", "--listen", "tcp:127.0.0.1:1", "--export", "m=memory:1M"])).unwrap();
        assert_eq!(p.listeners.len(), 1);
        assert_eq!(p.optional_tcp, None);
        assert_eq!(p.exports[0].0.name, "m");
    }

    #[test]
    fn read_only_must_name_an_export() {
        let p = plan(args(&["--data-dir", "/d", "--export", "a=memory:1M", "--read-only", "a"])).unwrap();
        assert!(p.exports[0].1);
        let e = plan(args(&["--data-dir", "/d", "--export", "a=memory:1M", "--read-only", "b"])).unwrap_err();
        assert!(e.to_string().contains("no such export") && e.to_string().contains("a"), "{e}");
    }

    #[test]
    fn record_must_name_an_export_once_with_a_sane_bound() {
        let p = plan(args(&["--data-dir", "/d", "--export", "a=memory:1M", "--record", "a=/t/a", "--record-max-size", "64MiB"])).unwrap();
        assert_eq!(p.record, vec![("a".to_string(), PathBuf::from("/t/a"))]);
        assert_eq!(p.record_limits, surge_trace::Limits { segment_bytes: 16 << 20, max_bytes: 64 << 20 });
        for (bad, why) in [
            (vec!["--record", "b=/t/b"], "no such export"),
            (vec!["--record", "a"], "NAME=DIR"),
            (vec!["--record", "a=/x", "--record", "a=/y"], "twice"),
            (vec!["--record", "a=/x", "--record-max-size", "4KiB"], "at least 1MiB"),
        ] {
            let mut a = vec!["--data-dir", "/d", "--export", "a=memory:1M"];
            a.extend(bad);
            let e = plan(args(&a)).unwrap_err().to_string();
            assert!(e.contains(why), "{a:?}: {e}");
        }
    }

    #[test]
    fn the_config_file_records_an_export_and_a_flag_overrides_it() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(
            &cfg,
            "record_max_size='8MiB'\n[[export]]\nname='a'\nspec='memory:1M'\nrecord='/t/a'\n[[export]]\nname='b'\nspec='memory:1M'\nrecord='/t/b'\n",
        )
        .unwrap();
        let c = cfg.to_str().unwrap();
        let p = plan(args(&["--data-dir", "/d", "--config", c])).unwrap();
        assert_eq!(p.record, vec![("a".to_string(), PathBuf::from("/t/a")), ("b".to_string(), PathBuf::from("/t/b"))]);
        assert_eq!(p.record_limits.max_bytes, 8 << 20);
        let p = plan(args(&["--data-dir", "/d", "--config", c, "--record", "b=/u/b", "--record-max-size", "2GiB"])).unwrap();
        assert_eq!(p.record, vec![("a".to_string(), PathBuf::from("/t/a")), ("b".to_string(), PathBuf::from("/u/b"))]);
        assert_eq!(p.record_limits.max_bytes, 2 << 30);
        std::fs::write(&cfg, "[[export]]\nname='a'\nspec='memory:1M'\nrecord=3\n").unwrap();
        let e = format!("{:#}", plan(args(&["--data-dir", "/d", "--config", c])).unwrap_err());
        assert!(e.contains("record"), "{e}");
    }

    #[test]
    fn duplicate_exports_and_public_tcp_are_refused() {
        let e = plan(args(&["--data-dir", "/d", "--export", "a=memory:1M", "--export", "a=memory:2M"])).unwrap_err();
        assert!(e.to_string().contains("used twice"));
        let e = plan(args(&["--data-dir", "/d", "--listen", "tcp:0.0.0.0:10809"])).unwrap_err();
        assert!(e.to_string().contains("--insecure"));
        plan(args(&["--data-dir", "/d", "--listen", "tcp:0.0.0.0:10809", "--insecure"])).unwrap();
    }

    #[test]
    fn tls_require_satisfies_the_exposure_rule_and_allow_does_not() {
        let base = ["--data-dir", "/d", "--listen", "tcp:0.0.0.0:10809", "--tls-certs", "/certs"];
        let p = plan(args(&[&base[..], &["--tls", "require", "--tls-verify-peer"]].concat())).unwrap();
        assert_eq!((p.tls, p.tls_certs.as_deref()), (TlsSetting::Require, Some(Path::new("/certs"))));
        // Encrypted but not authenticated: every export needs an allow-list then.
        let e = plan(args(&[&base[..], &["--tls", "require"]].concat())).unwrap_err().to_string();
        assert!(e.contains("--tls-verify-peer") && e.contains("\"default\""), "{e}");
        let allowed = ["--tls", "require", "--export", "a=memory:1M", "--export", "b=memory:1M", "--allow", "a=10.0.0.0/8"];
        let e = plan(args(&[&base[..], &allowed[..]].concat())).unwrap_err().to_string();
        assert!(e.contains("export \"b\"") && !e.contains("export \"a\""), "{e}");
        plan(args(&[&base[..], &allowed[..], &["--allow", "b=10.1.0.0/16"]].concat())).unwrap();
        plan(args(&[&base[..], &["--tls", "require", "--insecure"]].concat())).unwrap();
        let e = plan(args(&[&base[..], &["--tls", "allow"]].concat())).unwrap_err().to_string();
        assert!(e.contains("--tls require") && e.contains("--insecure"), "{e}");
        plan(args(&[&base[..], &["--tls", "allow", "--insecure"]].concat())).unwrap();
        let e = plan(args(&["--data-dir", "/d", "--listen", "tcp:0.0.0.0:10809"])).unwrap_err().to_string();
        assert!(e.contains("--tls require"), "{e}");
    }

    #[test]
    fn tls_needs_a_certificate_directory_and_defaults_to_off() {
        let e = plan(args(&["--data-dir", "/d", "--tls", "require"])).unwrap_err().to_string();
        assert!(e.contains("--tls-certs") && e.contains("server-cert.pem"), "{e}");
        let p = plan(args(&["--data-dir", "/d"])).unwrap();
        assert_eq!((p.tls, p.tls_certs), (TlsSetting::Off, None));
        let Err(e) = T::try_parse_from(["serve", "--tls", "maybe"]) else { panic!("accepted") };
        assert!(e.to_string().contains("require"), "{e}");
    }

    #[test]
    fn allow_lists_merge_per_export_and_must_name_an_export() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, "tls='allow'\ntls_certs='/c'\n[[export]]\nname='a'\nspec='memory:1M'\nallow=['unix']\n").unwrap();
        let p = plan(args(&[
            "--data-dir", "/d", "--config", cfg.to_str().unwrap(), "--export", "b=memory:1M",
            "--allow", "a=10.0.0.0/8", "--allow", "b=127.0.0.1",
        ]))
        .unwrap();
        let got: Vec<_> = p.allow.iter().map(|(n, l)| format!("{n}={l}")).collect();
        assert_eq!(got, ["a=unix,10.0.0.0/8", "b=127.0.0.1"]);
        assert_eq!(p.tls, TlsSetting::Allow);
        let e = plan(args(&["--data-dir", "/d", "--export", "a=memory:1M", "--allow", "b=unix"])).unwrap_err();
        assert!(e.to_string().contains("no such export") && e.to_string().contains("exports: a"), "{e}");
        let Err(e) = T::try_parse_from(["serve", "--allow", "a=10.0.0.0/40"]) else { panic!("accepted") };
        assert!(e.to_string().contains("10.0.0.0/40"), "{e}");
    }

    #[test]
    fn tls_note_gives_nbds_uris() {
        let bound = ["unix:/d/s.sock".parse().unwrap(), "tcp:127.0.0.1:10809".parse().unwrap()];
        let t = tls_note(TlsSetting::Require, false, &bound, "disk");
        assert!(!t.contains("client-cert.pem"), "{t}");
        assert!(tls_note(TlsSetting::Require, true, &bound, "disk").contains("client-cert.pem"));
        assert!(t.contains("nbds+unix:///disk?socket=/d/s.sock&tls-certificates=DIR"), "{t}");
        assert!(t.contains("nbds://127.0.0.1:10809/disk?tls-certificates=DIR") && t.contains("required"), "{t}");
    }

    #[test]
    fn bad_specs_fail_at_argument_parsing_with_the_shape() {
        let Err(e) = T::try_parse_from(["serve", "--export", "justaname"]) else { panic!("accepted") };
        assert!(e.to_string().contains("NAME=KIND:ARGS"), "{e}");
        let Err(e) = T::try_parse_from(["serve", "--listen", "10809"]) else { panic!("accepted") };
        assert!(e.to_string().contains("unix:PATH or tcp:HOST:PORT"), "{e}");
    }

    #[test]
    fn config_file_and_flags_combine() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, "listen=['unix:/x.sock']\nworkers=3\n[[export]]\nname='a'\nspec='memory:1M'\n").unwrap();
        let p = plan(args(&["--data-dir", "/d", "--config", cfg.to_str().unwrap(), "--export", "b=memory:2M"])).unwrap();
        assert_eq!(p.exports.iter().map(|(s, _)| s.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(p.workers, Some(3));
        assert_eq!(p.listeners, [ListenAddr::Unix("/x.sock".into())]);
    }

    #[test]
    fn the_sample_service_config_plans() {
        let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/../../dist/surge.toml");
        let p = plan(args(&["--config", cfg])).unwrap();
        assert_eq!(p.data_dir, Path::new("/var/lib/surge"));
        assert_eq!(p.metrics, Some("127.0.0.1:9100".parse().unwrap()));
        assert_eq!(p.exports.iter().map(|(s, _)| s.name.as_str()).collect::<Vec<_>>(), ["data", "scratch"]);
        assert_eq!(p.provider, crate::cloud::ProviderKind::Local);
        let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../dist/surge.service")).unwrap();
        assert!(unit.contains("ExecStart=/usr/local/bin/surge serve --config /etc/surge/surge.toml"));
        assert!(unit.contains("ExecReload=/bin/kill -HUP $MAINPID"));
        // Issue 38 item 9: private files, no capabilities, a closed device
        // list and the usual sandbox (docs/security.md has the score).
        for line in [
            "UMask=0077", "CapabilityBoundingSet=\n", "DevicePolicy=closed", "DeviceAllow=block-blkext rw", "NoNewPrivileges=yes",
            "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "SystemCallFilter=@system-service", "ProtectKernelTunables=yes",
            "ProtectKernelModules=yes", "ProtectKernelLogs=yes", "RestrictNamespaces=yes", "LockPersonality=yes", "RestrictSUIDSGID=yes",
        ] {
            assert!(unit.contains(line), "dist/surge.service lacks {line:?}");
        }
    }

    #[test]
    fn the_config_example_in_help_parses() {
        let toml_text: String = EXAMPLES
            .split_once("flags add to it:\n")
            .unwrap()
            .1
            .lines()
            .map(|l| l.trim_start().to_string() + "\n")
            .collect();
        let c: FileConfig = toml::from_str(&toml_text).unwrap();
        assert_eq!(c.export_specs().unwrap()[0].0.to_string(), "disk=file:/srv/disk.img,create=10GiB");
        assert_eq!(c.listen.len(), 2);
    }

    #[test]
    fn instructions_name_every_uri_and_the_control_socket() {
        let e = [ExportSummary { name: "default".into(), size: 1 << 30, description: "file /d/default.img".into(), read_only: false }];
        let bound = ["unix:/d/surge.sock".parse().unwrap(), "tcp:127.0.0.1:10809".parse().unwrap()];
        let t = instructions(&e, &bound, Path::new("/d/control.sock"));
        assert!(t.contains("nbdinfo 'nbd+unix:///default?socket=/d/surge.sock'"), "{t}");
        assert!(t.contains("qemu-img info 'nbd://127.0.0.1:10809/default'"), "{t}");
        assert!(t.contains("nbdfuse") && t.contains("nbd-client -unix /d/surge.sock"), "{t}");
        assert!(t.contains("1GiB") && t.contains("surge status --control /d/control.sock"), "{t}");
    }

    // Old-API variant of config.rs coop_and_metrics_listeners_off_loopback_need_their_own_guard
    // through the flags: a coop listener off loopback with NBD TLS (no key),
    // and a metrics listener off loopback, are refused.
    #[test]
    fn old_api_coop_and_metrics_listeners_off_loopback_need_their_own_guard() {
        let tls = ["--data-dir", "/d", "--tls", "require", "--tls-certs", "/certs", "--tls-verify-peer"];
        let coop = ["--coop-listen", "tcp:0.0.0.0:10900", "--coop-peer", "tcp:10.0.0.2:10900"];
        assert!(plan(args(&[&tls[..], &coop[..]].concat())).is_err(), "a coop listener off loopback is accepted with the NBD TLS settings");
        assert!(plan(args(&["--data-dir", "/d", "--metrics", "0.0.0.0:9100"])).is_err(), "a metrics listener off loopback is accepted");
    }
}
