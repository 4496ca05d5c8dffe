//! Volume stacks and their builders: `NAME=KIND:ARGS`, the one-line form
//! shared by `surge serve --export`, `--pool`, the config file and `surge
//! torture`. `cmd/` calls into this module; nothing here depends on `cmd/`.
//!
//! Each KIND has one builder function, chosen by the `match` in [`build_kind`];
//! a new kind (cloud volume types, `share:`, `elastic:`, ...) adds one arm and one
//! function. ARGS are a comma-separated list: a leading positional value (a
//! path, a size, a pool name) followed by `key=value` options and bare flags,
//! parsed with [`Opts`]. Sizes and rates use [`parse_size`] / [`parse_rate`].

pub mod cow;
pub mod burstable;
pub mod dryrun;
pub mod elastic;
pub mod fault;
pub mod modify;
pub mod remote;
pub mod share;
pub mod volume;

use crate::control::Controllable;
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use surge_block::{BlockDev, Clock, FileDev, FileOptions, MemoryDev};

/// Why a spec string could not be parsed or built.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("export spec {spec:?} must look like NAME=KIND:ARGS (e.g. disk=file:/path/disk.img or scratch=memory:64MiB)")]
    Shape { spec: String },
    #[error("export name {name:?} is invalid: use letters, digits, '-', '_' or '.' (at most 64 characters)")]
    Name { name: String },
    #[error("unknown export kind {kind:?}; known kinds: {known}")]
    UnknownKind { kind: String, known: String },
    #[error("{kind}: {msg}")]
    Args { kind: String, msg: String },
    #[error("invalid size {input:?}: {why} (examples: 4096, 512KiB, 64MiB, 1GiB, 100G, 10GB)")]
    Size { input: String, why: String },
    #[error("invalid rate {input:?}: {why} (examples: 33MB/s, 128MiB/s, 1GiB/s)")]
    Rate { input: String, why: String },
    #[error("{kind}: cannot open {path}: {source}")]
    Open {
        kind: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

type Result<T, E = SpecError> = std::result::Result<T, E>;

/// A parsed `NAME=KIND:ARGS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    pub name: String,
    pub kind: String,
    pub args: String,
}

impl FromStr for ExportSpec {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self> {
        let shape = || SpecError::Shape { spec: s.to_string() };
        let (name, rest) = s.split_once('=').ok_or_else(shape)?;
        let (kind, args) = rest.split_once(':').ok_or_else(shape)?;
        validate_name(name)?;
        if kind.is_empty() {
            return Err(shape());
        }
        Ok(ExportSpec { name: name.to_string(), kind: kind.to_ascii_lowercase(), args: args.to_string() })
    }
}

impl fmt::Display for ExportSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}:{}", self.name, self.kind, self.args)
    }
}

/// Export names travel in the NBD handshake and in URIs: keep them plain.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(SpecError::Name { name: name.to_string() })
    }
}

/// What builders may use: where to keep files, what time it is, shared devices.
#[derive(Clone)]
pub struct BuildContext {
    pub data_dir: PathBuf,
    #[allow(dead_code)] // for kinds that model time (cloud volume types)
    pub clock: Arc<dyn Clock>,
    /// Devices declared with `--pool NAME=SPEC`, shared by several exports.
    pub pools: BTreeMap<String, Arc<dyn BlockDev>>,
    /// Fair queues of pools shared by `share:` exports (see cmd::qos).
    pub fair_queues: share::Queues,
    /// The real cloud of cloud volume exports (`--provider aws`); `None`: the
    /// local cloud of the data directory.
    pub cloud: Option<Arc<dyn surge_cloud::Provider>>,
    /// How the local cloud behaves (scale, modification rules).
    pub local: volume::LocalCloud,
}

impl BuildContext {
    pub fn new(data_dir: PathBuf, clock: Arc<dyn Clock>) -> Self {
        BuildContext { data_dir, clock, pools: BTreeMap::new(), fair_queues: Default::default(), cloud: None, local: Default::default() }
    }

    /// Relative paths in specs are taken from the data directory.
    pub fn resolve(&self, path: &str) -> PathBuf {
        let p = Path::new(path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.data_dir.join(p)
        }
    }

    pub fn pool(&self, kind: &str, name: &str) -> Result<Arc<dyn BlockDev>> {
        self.pools.get(name).cloned().ok_or_else(|| SpecError::Args {
            kind: kind.to_string(),
            msg: format!(
                "no pool named {name:?}; declare it with --pool {name}=KIND:ARGS (known pools: {})",
                if self.pools.is_empty() { "none".to_string() } else { self.pools.keys().cloned().collect::<Vec<_>>().join(", ") }
            ),
        })
    }
}

/// An export's device that runs `at_exit` once the server drops it (after
/// the final flush): on a real cloud a stack detaches its volumes there, so a
/// restart finds them by name. Every request goes to `dev` unchanged.
pub struct AtExit<D: BlockDev> {
    dev: Arc<D>,
    at_exit: Box<dyn Fn(&D) + Send + Sync>,
}

impl<D: BlockDev> AtExit<D> {
    pub fn new(dev: Arc<D>, at_exit: impl Fn(&D) + Send + Sync + 'static) -> Self {
        AtExit { dev, at_exit: Box::new(at_exit) }
    }
}

impl<D: BlockDev> Drop for AtExit<D> {
    fn drop(&mut self) {
        (self.at_exit)(&self.dev);
    }
}

impl<D: BlockDev> BlockDev for AtExit<D> {
    fn size(&self) -> u64 {
        self.dev.size()
    }
    fn caps(&self) -> surge_block::Caps {
        self.dev.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.dev.write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.dev.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.dev.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: surge_block::ZeroMode) -> surge_block::Result<()> {
        self.dev.write_zeroes(offset, len, mode)
    }
    fn block_status(&self, offset: u64, len: u64) -> surge_block::Result<Vec<surge_block::Extent>> {
        self.dev.block_status(offset, len)
    }
    fn prefetch(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.dev.prefetch(offset, len)
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.dev.may_wait_remote(offset, len, write)
    }
}

/// A device built from a spec, with what `surge status` shows about it and the
/// layers it wants on the control API.
pub struct Built {
    pub dev: Arc<dyn BlockDev>,
    /// One line for humans and the NBD export description, e.g. "file /x.img".
    pub description: String,
    /// Kind-specific facts for `surge status` (path, options, ...).
    pub detail: serde_json::Value,
    /// Layers to register on the control API (cache phase, tenant stats, ...).
    pub controls: Vec<Arc<dyn Controllable>>,
}

impl Built {
    fn plain(dev: Arc<dyn BlockDev>, description: String, detail: serde_json::Value) -> Self {
        Built { dev, description, detail, controls: Vec::new() }
    }
}

/// Kinds [`build`] knows, for error messages and `--help`.
pub const KINDS: &[&str] = &["file", "memory", "fault", "reserved", "gp2", "gp3", "io1", "io2", "st1", "sc1", "azure-premium", "share", "elastic", "modify", "cow", "ephemeral", "remote", "persistent", "burstable"];

/// Build the device of one spec: one arm per kind; add yours here and to
/// [`KINDS`]. Builders that name things after the export (cloud volumes,
/// tenants, caches) take the export name too.
pub fn build(spec: &ExportSpec, ctx: &BuildContext) -> Result<Built> {
    let (name, args) = (spec.name.as_str(), spec.args.as_str());
    match spec.kind.as_str() {
        "file" => build_file(args, ctx),
        "memory" => build_memory(args),
        "fault" => fault::build_fault(args, ctx),
        "share" => share::build_share(name, args, ctx),
        "elastic" => elastic::build_elastic(name, args, ctx),
        "modify" => modify::build_modify(name, args, ctx),
        "cow" | "ephemeral" => cow::build_cow(name, args, ctx),
        "remote" | "persistent" => cow::build_remote(name, args),
        "burstable" => burstable::build_burstable(name, args, ctx),
        kind if surge_cloud::spec::is_volume_type(kind) => volume::build_volume(name, kind, args, ctx),
        other => Err(SpecError::UnknownKind { kind: other.to_string(), known: KINDS.join(", ") }),
    }
}

/// `file:PATH[,direct][,create=SIZE][,ro]`
fn build_file(args: &str, ctx: &BuildContext) -> Result<Built> {
    let mut o = Opts::parse("file", args)?;
    let path = ctx.resolve(&o.positional_required("PATH")?);
    let opts = FileOptions {
        direct: o.flag("direct")?,
        read_only: o.flag("ro")?,
        create_size: o.take_size("create")?,
    };
    o.finish(&["direct", "ro", "create"])?;
    if opts.create_size.is_none() && !path.exists() {
        return Err(SpecError::Args {
            kind: "file".into(),
            msg: format!("{} does not exist; add ,create=SIZE to create it (e.g. ,create=1GiB)", path.display()),
        });
    }
    if let (Some(0), false) = (opts.create_size, path.exists()) {
        return Err(SpecError::Args { kind: "file".into(), msg: "create=0: a device needs at least one byte".into() });
    }
    let dev = FileDev::open(&path, &opts).map_err(|source| SpecError::Open { kind: "file".into(), path: path.clone(), source })?;
    let detail = json!({ "path": path, "direct": opts.direct, "read_only": opts.read_only });
    Ok(Built::plain(Arc::new(dev), format!("file {}", path.display()), detail))
}

/// `memory:SIZE`
fn build_memory(args: &str) -> Result<Built> {
    let mut o = Opts::parse("memory", args)?;
    let size = parse_size(&o.positional_required("SIZE")?)?;
    o.finish(&[])?;
    if size == 0 {
        return Err(SpecError::Args { kind: "memory".into(), msg: "size must be at least one byte".into() });
    }
    Ok(Built::plain(Arc::new(MemoryDev::new(size)), format!("memory {}", format_size(size)), json!({})))
}

/// ARGS of a spec: `POSITIONAL,key=value,flag,...`. Builders take what they
/// know and call [`Opts::finish`], which rejects anything left over by name.
#[derive(Debug)]
pub struct Opts {
    kind: String,
    positional: Option<String>,
    pairs: Vec<(String, Option<String>)>,
}

impl Opts {
    pub fn parse(kind: &str, args: &str) -> Result<Self> {
        let mut positional = None;
        let mut pairs = Vec::new();
        for (i, item) in args.split(',').enumerate() {
            let item = item.trim();
            if item.is_empty() {
                if args.is_empty() {
                    break;
                }
                return Err(SpecError::Args { kind: kind.into(), msg: format!("empty item in {args:?} (stray comma?)") });
            }
            match item.split_once('=') {
                Some((k, v)) if !k.is_empty() => pairs.push((k.to_ascii_lowercase(), Some(v.to_string()))),
                Some(_) => return Err(SpecError::Args { kind: kind.into(), msg: format!("option {item:?} has no key") }),
                None if i == 0 => positional = Some(item.to_string()),
                None => pairs.push((item.to_ascii_lowercase(), None)),
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (k, _) in &pairs {
            if !seen.insert(k.clone()) {
                return Err(SpecError::Args { kind: kind.into(), msg: format!("option {k:?} given twice") });
            }
        }
        Ok(Opts { kind: kind.to_string(), positional, pairs })
    }

    fn err(&self, msg: String) -> SpecError {
        SpecError::Args { kind: self.kind.clone(), msg }
    }

    /// The leading value (path, size, pool name), if any.
    pub fn positional(&mut self) -> Option<String> {
        self.positional.take()
    }

    pub fn positional_required(&mut self, what: &str) -> Result<String> {
        let kind = self.kind.clone();
        self.positional().ok_or_else(|| self.err(format!("missing {what}: write {kind}:{what}[,options]")))
    }

    /// Remove and return `key=value`; a bare `key` is an error here.
    pub fn take(&mut self, key: &str) -> Option<String> {
        let i = self.pairs.iter().position(|(k, _)| k == key)?;
        match self.pairs.remove(i) {
            (_, Some(v)) => Some(v),
            (k, None) => {
                // Put it back so finish() reports it with a hint.
                self.pairs.push((format!("{k} (needs a value: {k}=...)"), None));
                None
            }
        }
    }

    pub fn take_size(&mut self, key: &str) -> Result<Option<u64>> {
        self.take(key).map(|v| parse_size(&v)).transpose()
    }

    pub fn take_rate(&mut self, key: &str) -> Result<Option<u64>> {
        self.take(key).map(|v| parse_rate(&v)).transpose()
    }

    /// A bare flag (`direct`) or `flag=true|false|on|off|1|0`.
    pub fn flag(&mut self, key: &str) -> Result<bool> {
        let Some(i) = self.pairs.iter().position(|(k, _)| k == key) else { return Ok(false) };
        match self.pairs.remove(i).1.as_deref() {
            None | Some("true" | "on" | "yes" | "1") => Ok(true),
            Some("false" | "off" | "no" | "0") => Ok(false),
            Some(v) => Err(self.err(format!("{key}={v}: expected true or false"))),
        }
    }

    /// Error if anything was not taken, naming the allowed options.
    pub fn finish(self, allowed: &[&str]) -> Result<()> {
        if let Some(p) = &self.positional {
            return Err(self.err(format!("unexpected value {p:?}")));
        }
        if let Some((k, _)) = self.pairs.first() {
            let allowed = if allowed.is_empty() { "none".to_string() } else { allowed.join(", ") };
            return Err(self.err(format!("unknown option {k:?} (allowed: {allowed})")));
        }
        Ok(())
    }
}

/// Sizes: `4096`, `512KiB`, `64MiB`, `1GiB`, `100G` (GiB), `10GB` (10^9), `1.5GiB`.
pub fn parse_size(s: &str) -> Result<u64> {
    surge_block::units::parse_size(s).map_err(|why| SpecError::Size { input: s.to_string(), why })
}

/// Rates in bytes per second: `33MB/s`, `128MiB/s`, `1GiB/s` (`/s` required).
pub fn parse_rate(s: &str) -> Result<u64> {
    let err = |why: String| SpecError::Rate { input: s.to_string(), why };
    let q = s.trim().strip_suffix("/s").ok_or_else(|| err("missing \"/s\"".into()))?;
    let v = surge_block::units::parse_size(q).map_err(err)?;
    if v == 0 {
        return Err(err("a rate must be positive".into()));
    }
    Ok(v)
}

pub use surge_block::units::format_size;

#[cfg(test)]
mod tests {
    use super::*;
    use surge_block::SystemClock;

    fn ctx(dir: &Path) -> BuildContext {
        BuildContext::new(dir.to_path_buf(), Arc::new(SystemClock::new()))
    }

    #[test]
    fn sizes_follow_binary_short_units_and_decimal_b_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512KiB").unwrap(), 512 << 10);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("100G").unwrap(), 100 << 30);
        assert_eq!(parse_size("10GB").unwrap(), 10_000_000_000);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("2 TiB").unwrap(), 2 << 40);
        assert_eq!(parse_size("8k").unwrap(), 8192);
    }

    #[test]
    fn bad_sizes_are_rejected_with_the_reason() {
        for bad in ["", "GiB", "12XB", "1.2.3G", "-5M", "1.0000001B", "99999999999999999999P", ".5G", "5G/s"] {
            let e = parse_size(bad).expect_err(bad).to_string();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
        assert!(parse_size("12XB").unwrap_err().to_string().contains("unknown unit"));
        assert!(parse_size("0.5B").unwrap_err().to_string().contains("whole number"));
    }

    #[test]
    fn rates_need_per_second_and_use_the_same_units() {
        assert_eq!(parse_rate("33MB/s").unwrap(), 33_000_000);
        assert_eq!(parse_rate("128MiB/s").unwrap(), 128 << 20);
        assert_eq!(parse_rate("1GiB/s").unwrap(), 1 << 30);
        assert!(parse_rate("33MB").unwrap_err().to_string().contains("/s"));
        assert!(parse_rate("0MB/s").unwrap_err().to_string().contains("positive"));
        assert!(parse_rate("fastMB/s").is_err());
    }

    #[test]
    fn format_size_picks_the_largest_exact_unit() {
        assert_eq!(format_size(64 << 20), "64MiB");
        assert_eq!(format_size(1536 << 10), "1536KiB");
        assert_eq!(format_size(1 << 30), "1GiB");
        assert_eq!(format_size(1000), "1000B");
        assert_eq!(parse_size(&format_size(3 << 40)).unwrap(), 3 << 40);
    }

    #[test]
    fn spec_splits_name_kind_args() {
        let s: ExportSpec = "disk=file:/a/b.img,direct".parse().unwrap();
        assert_eq!(s, ExportSpec { name: "disk".into(), kind: "file".into(), args: "/a/b.img,direct".into() });
        assert_eq!(s.to_string(), "disk=file:/a/b.img,direct");
        // Only the first '=' and ':' split, so args may hold both.
        let s: ExportSpec = "e=elastic:backing=reserved:50GiB,bw=33MB/s".parse().unwrap();
        assert_eq!(s.kind, "elastic");
        assert_eq!(s.args, "backing=reserved:50GiB,bw=33MB/s");
    }

    #[test]
    fn malformed_specs_say_what_shape_is_expected() {
        for bad in ["disk", "disk=file", "=file:/x", "disk=:/x"] {
            let e = bad.parse::<ExportSpec>().expect_err(bad).to_string();
            assert!(e.contains("NAME=KIND:ARGS") || e.contains("invalid"), "{bad}: {e}");
        }
        assert!("a b=memory:1M".parse::<ExportSpec>().unwrap_err().to_string().contains("name"));
    }

    #[test]
    fn opts_take_known_keys_and_reject_the_rest_by_name() {
        let mut o = Opts::parse("x", "/p,direct,create=1GiB,bw=33MB/s").unwrap();
        assert_eq!(o.positional().as_deref(), Some("/p"));
        assert!(o.flag("direct").unwrap());
        assert!(!o.flag("absent").unwrap());
        assert_eq!(o.take_size("create").unwrap(), Some(1 << 30));
        assert_eq!(o.take_rate("bw").unwrap(), Some(33_000_000));
        o.finish(&[]).unwrap();

        let o = Opts::parse("file", "/p,bogus=1").unwrap();
        let mut o = o;
        o.positional();
        let e = o.finish(&["direct", "create"]).unwrap_err().to_string();
        assert!(e.contains("bogus") && e.contains("direct, create"), "{e}");

        assert!(Opts::parse("x", "/p,,direct").unwrap_err().to_string().contains("stray comma"));
        assert!(Opts::parse("x", "/p,a=1,a=2").unwrap_err().to_string().contains("twice"));
        assert!(Opts::parse("x", "/p,=3").unwrap_err().to_string().contains("no key"));
        let mut o = Opts::parse("x", "/p,direct=maybe").unwrap();
        assert!(o.flag("direct").unwrap_err().to_string().contains("true or false"));
    }

    #[test]
    fn a_key_without_its_value_is_reported() {
        let mut o = Opts::parse("file", "/p,create").unwrap();
        o.positional();
        assert_eq!(o.take("create"), None);
        let e = o.finish(&["create"]).unwrap_err().to_string();
        assert!(e.contains("needs a value"), "{e}");
    }

    #[test]
    fn file_kind_creates_a_sparse_file_and_resolves_relative_paths() {
        let dir = tempfile::tempdir().unwrap();
        let built = build(&"d=file:d.img,create=8MiB".parse().unwrap(), &ctx(dir.path())).unwrap();
        assert_eq!(built.dev.size(), 8 << 20);
        let meta = std::fs::metadata(dir.path().join("d.img")).unwrap();
        assert_eq!(meta.len(), 8 << 20);
        assert!(std::os::unix::fs::MetadataExt::blocks(&meta) < 64, "file should be sparse");
        assert!(built.description.contains("d.img"));
    }

    #[test]
    fn file_kind_without_create_needs_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let e = build(&"d=file:missing.img".parse().unwrap(), &ctx(dir.path())).err().unwrap().to_string();
        assert!(e.contains("does not exist") && e.contains("create=SIZE"), "{e}");
        let e = build(&"d=file:x.img,create=0".parse().unwrap(), &ctx(dir.path())).err().unwrap().to_string();
        assert!(e.contains("at least one byte"), "{e}");
        let e = build(&"d=file:x.img,create=1G,speed=9".parse().unwrap(), &ctx(dir.path())).err().unwrap().to_string();
        assert!(e.contains("unknown option \"speed\""), "{e}");
    }

    #[test]
    fn memory_kind_needs_a_positive_size() {
        let dir = tempfile::tempdir().unwrap();
        let b = build(&"m=memory:64MiB".parse().unwrap(), &ctx(dir.path())).unwrap();
        assert_eq!(b.dev.size(), 64 << 20);
        assert!(build(&"m=memory:0".parse().unwrap(), &ctx(dir.path())).is_err());
        assert!(build(&"m=memory:".parse().unwrap(), &ctx(dir.path())).err().unwrap().to_string().contains("missing SIZE"));
        assert!(build(&"m=memory:lots".parse().unwrap(), &ctx(dir.path())).is_err());
    }

    #[test]
    fn unknown_kinds_list_the_known_ones() {
        let dir = tempfile::tempdir().unwrap();
        let e = build(&"m=floppy:1M".parse().unwrap(), &ctx(dir.path())).err().unwrap().to_string();
        assert!(e.contains("floppy") && e.contains("file, memory"), "{e}");
    }

    #[test]
    fn missing_pools_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = ctx(dir.path()).pool("share", "p1").err().unwrap().to_string();
        assert!(e.contains("--pool p1="), "{e}");
    }
}
