//! `surge serve` configuration: the TOML file (`--config FILE`), listener
//! addresses, and the defaults used when nothing is given.
//!
//! ```toml
//! data_dir = "/var/lib/surge"          # optional
//! control = "/run/surge/control.sock"  # optional
//! workers = 8                          # optional
//! listen = ["unix:/run/surge/nbd.sock", "tcp:127.0.0.1:10809"]
//! tls = "require"                      # optional: off (default), allow, require
//! tls_certs = "/etc/surge/tls"         # server-cert.pem, server-key.pem
//! tls_verify_peer = false              # optional: clients need a certificate from tls_certs/ca-cert.pem
//! log = "warn,surge_policy=info"       # optional: as --log (reloaded on SIGHUP)
//! metrics = "127.0.0.1:9100"           # optional: Prometheus endpoint (/metrics)
//! metrics_allow = ["10.0.0.5"]         # optional: scrapers that may read it (others: 403)
//! max_connections = 512                # optional: NBD connections at once
//! max_connections_per_address = 64     # optional: ... from one client address
//! provider = "local"                   # optional: local (default) or aws
//!
//! [[pool]]                             # shared devices (for share: exports)
//! name = "shared"
//! spec = "file:/srv/shared.img"
//!
//! [coop]                               # optional: shares over several daemons (docs/fairshare.md)
//! listen = "tcp:10.0.0.1:10900"
//! peers = ["tcp:10.0.0.2:10900", "tcp:10.0.0.3:10900"]
//! period = "20ms"                      # optional
//! peer_timeout = "500ms"               # optional
//! key_file = "/etc/surge/coop.key"     # reports signed (HMAC-SHA256) with this shared secret
//!
//! [[export]]                           # in order: the first also answers to ""
//! name = "disk"
//! spec = "file:/var/lib/surge/disk.img,create=10GiB"
//! read_only = false                    # optional
//! allow = ["127.0.0.1", "10.0.0.0/8", "unix"]  # optional: who may use it
//!
//! [aws]                                # optional: settings of provider = "aws"
//! region = "eu-west-1"
//! ```
//! Spec strings are exactly those of `--export NAME=SPEC`.

use crate::stack::{validate_name, ExportSpec, SpecError};
use anyhow::Context as _;
use serde::Deserialize;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use surge_nbd::{AllowList, TlsMode};

/// Default NBD port (IANA).
pub const NBD_PORT: u16 = 10809;
/// Size of the `default` export created when none is given.
pub const DEFAULT_EXPORT_SIZE: &str = "1GiB";

/// Where to listen for NBD clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl FromStr for ListenAddr {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let shape = || format!("listen address {s:?} must be unix:PATH or tcp:HOST:PORT (e.g. tcp:127.0.0.1:10809)");
        let (scheme, rest) = s.split_once(':').with_context(shape)?;
        match scheme {
            "unix" if !rest.is_empty() => Ok(ListenAddr::Unix(PathBuf::from(rest))),
            "tcp" => {
                let addr = rest
                    .to_socket_addrs()
                    .with_context(|| format!("{}: cannot resolve {rest:?}", shape()))?
                    .next()
                    .with_context(|| format!("{rest:?} resolves to no address"))?;
                Ok(ListenAddr::Tcp(addr))
            }
            _ => anyhow::bail!(shape()),
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// What guards the NBD listeners (for [`ListenAddr::check_exposure`]).
#[derive(Debug, Clone)]
pub struct Exposure {
    /// `--insecure`: every host that can reach the listeners is trusted.
    pub insecure: bool,
    pub tls: TlsSetting,
    /// `--tls-verify-peer`: TLS clients present a certificate from the CA.
    pub verify_peer: bool,
    /// Exports without an allow-list.
    pub open_exports: Vec<String>,
}

impl ListenAddr {
    /// NBD off the machine needs every client encrypted (`--tls require`) and
    /// told apart from strangers: by a client certificate
    /// (`--tls-verify-peer`) or by an allow-list on every export; or the user
    /// says `--insecure`. Loopback and unix listeners pass.
    pub fn check_exposure(&self, e: &Exposure) -> anyhow::Result<()> {
        let ListenAddr::Tcp(a) = self else { return Ok(()) };
        if a.ip().is_loopback() || e.insecure {
            return Ok(());
        }
        if e.tls != TlsSetting::Require {
            anyhow::bail!(
                "refusing to listen on {a}: it is not a loopback address and plaintext NBD is \
                 unencrypted and unauthenticated; pass --tls require --tls-certs DIR to encrypt every \
                 connection (--tls allow still admits plaintext clients), with --tls-verify-peer or \
                 --allow for every export to tell clients apart, or --insecure if every host that can \
                 reach it is trusted"
            );
        }
        if !e.verify_peer && !e.open_exports.is_empty() {
            anyhow::bail!(
                "refusing to listen on {a}: --tls require encrypts but does not authenticate, so any host \
                 that completes STARTTLS could read and write {}; pass --tls-verify-peer (clients present a \
                 certificate signed by the CA in <tls-certs>/ca-cert.pem), or --allow NAME=RULES for each of \
                 them, or --insecure if every host that can reach it is trusted",
                e.open_exports.iter().map(|n| format!("export {n:?}")).collect::<Vec<_>>().join(", ")
            );
        }
        Ok(())
    }

    /// A cooperation listener off the machine takes reports that steer every
    /// tenant's share: it needs a report key (`--coop-key`), or `--insecure`.
    /// (The NBD TLS settings do not cover it.)
    pub fn check_coop_exposure(&self, keyed: bool, insecure: bool) -> anyhow::Result<()> {
        match self {
            ListenAddr::Tcp(a) if !a.ip().is_loopback() && !keyed && !insecure => anyhow::bail!(
                "refusing to hear cooperating daemons on {a}: it is not a loopback address and unsigned \
                 reports would let any host that reaches it change every tenant's share; pass --coop-key FILE \
                 (a secret shared by the peers; reports are signed with HMAC-SHA256) or --insecure"
            ),
            _ => Ok(()),
        }
    }
}

/// The metrics endpoint off the machine shows export names, sizes and I/O to
/// whoever connects: it needs an allow-list of scrapers (`--metrics-allow`)
/// or `--insecure`.
pub fn check_metrics_exposure(addr: &SocketAddr, allow: Option<&AllowList>, insecure: bool) -> anyhow::Result<()> {
    if addr.ip().is_loopback() || allow.is_some() || insecure {
        return Ok(());
    }
    anyhow::bail!(
        "refusing to serve metrics on {addr}: it is not a loopback address and any host that reaches it \
         would read export names, sizes and I/O counters; pass --metrics-allow RULES (the scrapers' \
         addresses or networks, e.g. 10.0.0.5,10.1.0.0/16) or --insecure"
    )
}

/// `--tls` / `tls =`: whether clients may or must use NBD_OPT_STARTTLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TlsSetting {
    /// Plaintext only (STARTTLS is refused).
    #[default]
    Off,
    /// Clients may upgrade to TLS; plaintext clients are served too.
    Allow,
    /// Every client must upgrade to TLS before anything else.
    Require,
}

impl TlsSetting {
    pub fn mode(self) -> TlsMode {
        match self {
            TlsSetting::Off => TlsMode::Off,
            TlsSetting::Allow => TlsMode::Allow,
            TlsSetting::Require => TlsMode::Require,
        }
    }
}

impl fmt::Display for TlsSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsSetting::Off => "off",
            TlsSetting::Allow => "allow",
            TlsSetting::Require => "require",
        })
    }
}

/// `--allow NAME=RULE,RULE,...`: the clients that may use export NAME.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportAllow {
    pub name: String,
    pub list: AllowList,
}

impl FromStr for ExportAllow {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let (name, rules) = s.split_once('=').with_context(|| {
            format!("--allow {s:?} must be NAME=RULE[,RULE...], e.g. disk=127.0.0.1,10.0.0.0/8,unix")
        })?;
        validate_name(name)?;
        Ok(ExportAllow { name: name.to_string(), list: rules.parse()? })
    }
}

/// One `[[export]]` table.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ExportEntry {
    pub name: String,
    pub spec: String,
    #[serde(default)]
    pub read_only: bool,
    /// Client addresses that may use the export (as `--allow NAME=...`); absent: everyone.
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    /// Record every request into this directory (as `--record NAME=DIR`).
    #[serde(default)]
    pub record: Option<PathBuf>,
}

/// One `[[pool]]` table.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PoolEntry {
    pub name: String,
    pub spec: String,
}

/// The TOML file as written.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    pub control: Option<PathBuf>,
    pub workers: Option<usize>,
    #[serde(default)]
    pub insecure: bool,
    pub tls: Option<TlsSetting>,
    pub tls_certs: Option<PathBuf>,
    /// Mutual TLS: clients need a certificate signed by tls_certs/ca-cert.pem.
    #[serde(default)]
    pub tls_verify_peer: bool,
    #[serde(default)]
    pub listen: Vec<String>,
    #[serde(default, rename = "pool")]
    pub pools: Vec<PoolEntry>,
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportEntry>,
    /// Log filter, as `--log`; the one setting besides live layer settings
    /// that SIGHUP reloads (see `crate::reload`).
    pub log: Option<String>,
    /// Prometheus endpoint, as `--metrics HOST:PORT`.
    pub metrics: Option<SocketAddr>,
    /// Scrapers that may read it (as `--metrics-allow`); others get 403.
    pub metrics_allow: Option<Vec<String>>,
    /// Connections at once, in all and per client address (as `--max-connections*`).
    pub max_connections: Option<usize>,
    pub max_connections_per_address: Option<usize>,
    /// Cloud provider of cloud volume exports, as `--provider`.
    pub provider: Option<crate::cloud::ProviderKind>,
    /// Settings of the AWS provider.
    pub aws: Option<crate::cloud::AwsSection>,
    /// Cooperation with other daemons' pools (as `--coop-*`).
    #[serde(default)]
    pub coop: Option<CoopEntry>,
    /// Disk space a recording keeps at most (as `--record-max-size`).
    pub record_max_size: Option<String>,
}

/// The `[coop]` table.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CoopEntry {
    pub listen: String,
    #[serde(default)]
    pub peers: Vec<String>,
    pub name: Option<String>,
    pub period: Option<String>,
    pub peer_timeout: Option<String>,
    /// A file holding the secret every peer signs its reports with (as `--coop-key`).
    pub key_file: Option<PathBuf>,
}

impl FileConfig {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading config {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parsing config {}", path.display()))
    }

    /// The exports as specs, with their read-only flags.
    pub fn export_specs(&self) -> Result<Vec<(ExportSpec, bool)>, SpecError> {
        self.exports.iter().map(|e| Ok((entry_spec(&e.name, &e.spec)?, e.read_only))).collect()
    }

    /// The exports recorded from the start, and where (`record = DIR`).
    pub fn export_records(&self) -> Vec<(String, PathBuf)> {
        self.exports.iter().filter_map(|e| Some((e.name.clone(), e.record.clone()?))).collect()
    }

    /// The `allow` lists of the exports that have one.
    pub fn export_allows(&self) -> anyhow::Result<Vec<ExportAllow>> {
        let mut out = Vec::new();
        for e in &self.exports {
            if let Some(rules) = &e.allow {
                let list = rules.join(",").parse().with_context(|| format!("config: export {:?}: allow", e.name))?;
                out.push(ExportAllow { name: e.name.clone(), list });
            }
        }
        Ok(out)
    }

    pub fn pool_specs(&self) -> Result<Vec<ExportSpec>, SpecError> {
        self.pools.iter().map(|p| entry_spec(&p.name, &p.spec)).collect()
    }
}

fn entry_spec(name: &str, spec: &str) -> Result<ExportSpec, SpecError> {
    validate_name(name)?;
    format!("{name}={spec}").parse()
}

/// `$XDG_DATA_HOME/surge`, else `~/.local/share/surge`.
pub fn default_data_dir() -> anyhow::Result<PathBuf> {
    dirs::data_dir()
        .map(|d| d.join("surge"))
        .context("cannot find a data directory ($XDG_DATA_HOME or $HOME); pass --data-dir DIR")
}

/// The export served when none is configured: a sparse file in the data dir.
pub fn default_export(data_dir: &Path) -> ExportSpec {
    ExportSpec {
        name: "default".into(),
        kind: "file".into(),
        args: format!("{},create={DEFAULT_EXPORT_SIZE}", data_dir.join("default.img").display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse_unix_and_tcp() {
        assert_eq!("unix:/tmp/s.sock".parse::<ListenAddr>().unwrap(), ListenAddr::Unix("/tmp/s.sock".into()));
        assert_eq!(
            "tcp:127.0.0.1:10809".parse::<ListenAddr>().unwrap(),
            ListenAddr::Tcp("127.0.0.1:10809".parse().unwrap())
        );
        assert_eq!("tcp:[::1]:99".parse::<ListenAddr>().unwrap(), ListenAddr::Tcp("[::1]:99".parse().unwrap()));
        assert!(matches!("tcp:localhost:10809".parse::<ListenAddr>().unwrap(), ListenAddr::Tcp(a) if a.ip().is_loopback()));
        for bad in ["", "unix:", "tcp:", "tcp:127.0.0.1", "udp:1.2.3.4:5", "/tmp/x.sock"] {
            let e = bad.parse::<ListenAddr>().expect_err(bad).to_string();
            assert!(e.contains("unix:PATH or tcp:HOST:PORT"), "{bad}: {e}");
        }
    }

    fn exposure(insecure: bool, tls: TlsSetting, verify_peer: bool, open: &[&str]) -> Exposure {
        Exposure { insecure, tls, verify_peer, open_exports: open.iter().map(|s| s.to_string()).collect() }
    }

    #[test]
    fn non_loopback_tcp_needs_insecure() {
        let public: ListenAddr = "tcp:0.0.0.0:10809".parse().unwrap();
        let plain = exposure(false, TlsSetting::Off, false, &["d"]);
        assert!(public.check_exposure(&plain).unwrap_err().to_string().contains("--insecure"));
        public.check_exposure(&exposure(true, TlsSetting::Off, false, &["d"])).unwrap();
        "tcp:127.0.0.1:1".parse::<ListenAddr>().unwrap().check_exposure(&plain).unwrap();
        "unix:/x".parse::<ListenAddr>().unwrap().check_exposure(&plain).unwrap();
    }

    // Issue 38 item 3: TLS encrypts but does not say who connects.
    #[test]
    fn tls_require_off_loopback_also_needs_client_certificates_or_allow_lists() {
        let public: ListenAddr = "tcp:0.0.0.0:10809".parse().unwrap();
        let e = public.check_exposure(&exposure(false, TlsSetting::Require, false, &["a", "b"])).unwrap_err().to_string();
        assert!(e.contains("--tls-verify-peer") && e.contains("--allow") && e.contains("\"a\", export \"b\""), "{e}");
        public.check_exposure(&exposure(false, TlsSetting::Require, true, &["a"])).unwrap();
        public.check_exposure(&exposure(false, TlsSetting::Require, false, &[])).unwrap();
        public.check_exposure(&exposure(true, TlsSetting::Require, false, &["a"])).unwrap();
    }

    #[test]
    fn coop_and_metrics_listeners_off_loopback_need_their_own_guard() {
        let public: ListenAddr = "tcp:0.0.0.0:10900".parse().unwrap();
        assert!(public.check_coop_exposure(false, false).unwrap_err().to_string().contains("--coop-key"));
        public.check_coop_exposure(true, false).unwrap();
        public.check_coop_exposure(false, true).unwrap();
        "tcp:127.0.0.1:1".parse::<ListenAddr>().unwrap().check_coop_exposure(false, false).unwrap();
        let m: SocketAddr = "0.0.0.0:9100".parse().unwrap();
        assert!(check_metrics_exposure(&m, None, false).unwrap_err().to_string().contains("--metrics-allow"));
        check_metrics_exposure(&m, Some(&"10.0.0.0/8".parse().unwrap()), false).unwrap();
        check_metrics_exposure(&"127.0.0.1:9100".parse().unwrap(), None, false).unwrap();
    }

    #[test]
    fn config_file_keeps_export_order_and_flags() {
        let c: FileConfig = toml::from_str(
            r#"
            listen = ["unix:/tmp/a.sock"]
            workers = 4
            [[pool]]
            name = "p"
            spec = "memory:1GiB"
            [[export]]
            name = "b"
            spec = "memory:1MiB"
            [[export]]
            name = "a"
            spec = "file:/x.img,create=1GiB"
            read_only = true
            "#,
        )
        .unwrap();
        let specs = c.export_specs().unwrap();
        assert_eq!(specs.iter().map(|(s, _)| s.name.as_str()).collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(specs[1], ("a=file:/x.img,create=1GiB".parse().unwrap(), true));
        assert_eq!(c.pool_specs().unwrap()[0].kind, "memory");
        assert_eq!(c.workers, Some(4));
    }

    #[test]
    fn non_loopback_refusal_names_both_ways_out() {
        let e = "tcp:10.1.2.3:10809".parse::<ListenAddr>().unwrap().check_exposure(&exposure(false, TlsSetting::Off, false, &["d"])).unwrap_err().to_string();
        assert!(e.contains("--tls require") && e.contains("--insecure") && e.contains("10.1.2.3"), "{e}");
    }

    #[test]
    fn tls_and_allow_lists_in_the_config_file() {
        let c: FileConfig = toml::from_str(
            "tls = 'require'\ntls_certs = '/etc/surge/tls'\n[[export]]\nname='a'\nspec='memory:1M'\nallow=['127.0.0.1','10.0.0.0/8','unix']\n[[export]]\nname='b'\nspec='memory:1M'\n",
        )
        .unwrap();
        assert_eq!(c.tls, Some(TlsSetting::Require));
        assert_eq!(c.tls_certs.as_deref(), Some(Path::new("/etc/surge/tls")));
        let a = c.export_allows().unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].name.as_str(), a[0].list.to_string().as_str()), ("a", "127.0.0.1,10.0.0.0/8,unix"));
        let e = toml::from_str::<FileConfig>("tls = 'maybe'").unwrap_err().to_string();
        assert!(e.contains("maybe"), "{e}");
        let c: FileConfig = toml::from_str("[[export]]\nname='a'\nspec='memory:1M'\nallow=['10.0.0.0/33']").unwrap();
        let e = format!("{:#}", c.export_allows().unwrap_err());
        assert!(e.contains("export \"a\"") && e.contains("10.0.0.0/33"), "{e}");
    }

    #[test]
    fn allow_flags_parse_name_and_rules() {
        let a: ExportAllow = "disk=127.0.0.1,10.0.0.0/8,unix".parse().unwrap();
        assert_eq!(a.name, "disk");
        assert_eq!(a.list.0.len(), 3);
        for (bad, why) in [("disk", "NAME=RULE"), ("disk=", "empty"), ("disk=10.0.0.0/x", "not a number"), ("=1.2.3.4", "")] {
            let e = bad.parse::<ExportAllow>().expect_err(bad).to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn config_typos_are_errors_not_silently_ignored() {
        let e = toml::from_str::<FileConfig>("listn = []").unwrap_err().to_string();
        assert!(e.contains("listn"), "{e}");
        let e = toml::from_str::<FileConfig>("[[export]]\nname='a'\nspec='memory:1M'\nreadonly=true").unwrap_err().to_string();
        assert!(e.contains("readonly"), "{e}");
        let c: FileConfig = toml::from_str("[[export]]\nname='bad name'\nspec='memory:1M'").unwrap();
        assert!(c.export_specs().is_err());
        let c: FileConfig = toml::from_str("[[export]]\nname='a'\nspec='memory'").unwrap();
        assert!(c.export_specs().unwrap_err().to_string().contains("NAME=KIND:ARGS"));
    }

    #[test]
    fn load_names_the_file_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        assert!(format!("{:#}", FileConfig::load(&p).unwrap_err()).contains("c.toml"));
        std::fs::write(&p, "workers = 'many'").unwrap();
        assert!(format!("{:#}", FileConfig::load(&p).unwrap_err()).contains("c.toml"));
    }

    #[test]
    fn default_export_is_a_sparse_file_in_the_data_dir() {
        let s = default_export(Path::new("/d"));
        assert_eq!(s.to_string(), "default=file:/d/default.img,create=1GiB");
    }
}
