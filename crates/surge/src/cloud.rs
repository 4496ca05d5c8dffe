//! Which cloud provider surge talks to: `local` (the emulated cloud of the
//! data directory, the default) or `aws` (EBS, via surge-aws; only in builds
//! with the `aws` feature). Chosen with `--provider` or `provider =` in the
//! config; `[aws]` in the config holds the AWS provider's settings.

use anyhow::Context as _;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use surge_block::SystemClock;
use surge_cloud::{LocalConfig, LocalProvider, Provider};

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// The emulated cloud in <data-dir>/cloud.
    #[default]
    Local,
    /// Amazon EBS, with the usual AWS credential chain and region.
    Aws,
}

/// `[aws]` in the config file. Durations as `30s`, `500ms`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AwsSection {
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
    pub instance_id: Option<String>,
    pub availability_zone: Option<String>,
    /// Value of the `surge:owner` tag (default `surge`).
    pub owner: Option<String>,
    /// Root of /dev (default `/`).
    pub device_root: Option<PathBuf>,
    pub direct_io: Option<bool>,
    pub create_timeout: Option<String>,
    pub attach_timeout: Option<String>,
    pub detach_timeout: Option<String>,
    pub device_timeout: Option<String>,
    pub poll: Option<String>,
    pub max_attempts: Option<u32>,
    pub initial_backoff: Option<String>,
    /// EBS's modification limit surge keeps to: `ebs-24h` (default: four per
    /// rolling 24 hours, each once the previous completed), `ebs-6h` or `none`.
    pub modify_rules: Option<String>,
    /// How long surge waits after AWS refused a modification (default 10m).
    pub modify_retry: Option<String>,
}

/// The provider to use, opened.
pub fn open(kind: ProviderKind, aws: Option<&AwsSection>, data_dir: &Path) -> anyhow::Result<Arc<dyn Provider>> {
    match kind {
        ProviderKind::Local => {
            let cfg = LocalConfig::new(crate::stack::volume::cloud_dir(data_dir));
            Ok(Arc::new(LocalProvider::open(cfg, Arc::new(SystemClock::new()))?))
        }
        ProviderKind::Aws => open_aws(aws.cloned().unwrap_or_default()),
    }
}

#[cfg(feature = "aws")]
fn open_aws(s: AwsSection) -> anyhow::Result<Arc<dyn Provider>> {
    let dur = |v: &Option<String>, key: &str, default: std::time::Duration| -> anyhow::Result<std::time::Duration> {
        match v {
            Some(t) => surge_block::units::parse_duration(t).map_err(|e| anyhow::anyhow!("[aws] {key} = {t:?}: {e}")),
            None => Ok(default),
        }
    };
    let d = surge_aws::AwsConfig::default();
    let cfg = surge_aws::AwsConfig {
        region: s.region,
        endpoint_url: s.endpoint_url,
        instance_id: s.instance_id,
        availability_zone: s.availability_zone,
        owner: s.owner.unwrap_or(d.owner.clone()),
        device_root: s.device_root.unwrap_or(d.device_root.clone()),
        direct_io: s.direct_io.unwrap_or(d.direct_io),
        create_timeout: dur(&s.create_timeout, "create_timeout", d.create_timeout)?,
        attach_timeout: dur(&s.attach_timeout, "attach_timeout", d.attach_timeout)?,
        detach_timeout: dur(&s.detach_timeout, "detach_timeout", d.detach_timeout)?,
        device_timeout: dur(&s.device_timeout, "device_timeout", d.device_timeout)?,
        poll: dur(&s.poll, "poll", d.poll)?,
        max_attempts: s.max_attempts.unwrap_or(d.max_attempts),
        initial_backoff: dur(&s.initial_backoff, "initial_backoff", d.initial_backoff)?,
        prices: d.prices,
        modify_rules: match &s.modify_rules {
            Some(r) => surge_cloud::ModifyRules::parse(r).map_err(|e| anyhow::anyhow!("[aws] modify_rules: {e}"))?,
            None => d.modify_rules,
        },
        modify_retry: dur(&s.modify_retry, "modify_retry", d.modify_retry)?,
    };
    Ok(Arc::new(surge_aws::AwsProvider::connect(cfg).context("connecting to AWS")?))
}

#[cfg(not(feature = "aws"))]
fn open_aws(_: AwsSection) -> anyhow::Result<Arc<dyn Provider>> {
    anyhow::bail!(
        "this surge was built without the AWS provider; build it with `cargo build --release -p surge --features aws`"
    )
}

/// `[aws]` from a config file, if any (for `surge cloud --config`).
pub fn load_section(config: Option<&Path>) -> anyhow::Result<(Option<ProviderKind>, Option<AwsSection>)> {
    let Some(p) = config else { return Ok((None, None)) };
    let c = crate::config::FileConfig::load(p).with_context(|| format!("config {}", p.display()))?;
    Ok((c.provider, c.aws))
}
