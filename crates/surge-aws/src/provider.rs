//! [`AwsProvider`]: surge's [`Provider`] on EBS, with the official AWS SDK.
//!
//! Every call blocks on a private single-thread tokio runtime; the SDK
//! retries throttled and transient failures with exponential backoff
//! (`max_attempts`, `initial_backoff`). Waits (volume available, attachment
//! attached, volume detached, device visible) poll with their own timeouts
//! and, when they expire, undo what surge started and say so in the error.

use crate::device;
use crate::ebs;
use crate::error::map;
use crate::modification::History;
use aws_config::BehaviorVersion;
use aws_sdk_ec2::types::{Filter, ResourceType, Tag, TagSpecification, Volume, VolumeAttachmentState, VolumeType};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use surge_block::model::CreditBalance;
use surge_block::{BlockDev, FileDev, FileOptions};
use surge_cloud::cost::{report, UsageRecord};
use surge_cloud::{Action, Attachment, CloudError, CostReport, CreateRequest, Modification, ModifyRules, PriceTable, Provider, VolumeInfo, VolumeSpec, VolumeState};

/// Tag that marks a volume as surge's; its value is [`AwsConfig::owner`].
pub const OWNER_TAG: &str = "surge:owner";
/// Tag with the surge name of a volume (exports find their volumes by name).
pub const NAME_TAG: &str = "surge:name";

/// Settings of the AWS provider (`[aws]` in the TOML config).
#[derive(Debug, Clone)]
pub struct AwsConfig {
    /// Region; `None`: the usual chain (AWS_REGION, the profile, IMDS).
    pub region: Option<String>,
    /// Endpoint override (an EC2/CloudWatch-compatible server, a VPC endpoint).
    pub endpoint_url: Option<String>,
    /// This instance; `None`: asked from the instance metadata service when first needed.
    pub instance_id: Option<String>,
    /// Where to create volumes; `None`: the instance's zone.
    pub availability_zone: Option<String>,
    /// Value of the `surge:owner` tag: several surge deployments in one
    /// account keep apart by using different owners.
    pub owner: String,
    /// Root of the device tree (`/`; tests point it at a fake tree).
    pub device_root: PathBuf,
    /// Open devices with O_DIRECT for aligned requests (no double caching).
    pub direct_io: bool,
    pub create_timeout: Duration,
    pub attach_timeout: Duration,
    pub detach_timeout: Duration,
    pub device_timeout: Duration,
    /// Interval between DescribeVolumes polls while waiting.
    pub poll: Duration,
    /// Attempts per API call, throttled or transient failures included.
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub prices: PriceTable,
    /// EBS's modification limit surge keeps to (AWS enforces its own; surge
    /// does not send a ModifyVolume it knows will be refused): the newer
    /// four per rolling 24 hours, each once the previous completed, by default.
    pub modify_rules: ModifyRules,
    /// After AWS refuses a modification, how long surge waits before asking again.
    pub modify_retry: Duration,
}

impl Default for AwsConfig {
    fn default() -> Self {
        AwsConfig {
            region: None,
            endpoint_url: None,
            instance_id: None,
            availability_zone: None,
            owner: "surge".into(),
            device_root: PathBuf::from("/"),
            direct_io: true,
            create_timeout: Duration::from_secs(120),
            attach_timeout: Duration::from_secs(60),
            detach_timeout: Duration::from_secs(120),
            device_timeout: Duration::from_secs(30),
            poll: Duration::from_secs(1),
            max_attempts: 8,
            initial_backoff: Duration::from_millis(200),
            prices: PriceTable::default(),
            modify_rules: ModifyRules::ebs_rolling(),
            modify_retry: Duration::from_secs(600),
        }
    }
}

/// This instance: where volumes attach.
#[derive(Debug, Clone)]
struct Instance {
    id: String,
    az: String,
}

pub struct AwsProvider {
    rt: tokio::runtime::Runtime,
    ec2: aws_sdk_ec2::Client,
    cw: aws_sdk_cloudwatch::Client,
    cfg: AwsConfig,
    http: aws_smithy_runtime_api::client::http::SharedHttpClient,
    instance: OnceLock<Instance>,
    /// What this process attached: the handed-out device and the file under it.
    attached: Mutex<HashMap<String, (Arc<Attachment>, Arc<FileDev>)>>,
    /// Billing of volumes this process deleted (live ones bill from their create time).
    deleted: Mutex<Vec<UsageRecord>>,
    /// Device names of attaches in flight: concurrent attaches (a stripe's
    /// members) must not pick the same free name before AWS lists it.
    naming: Mutex<Vec<String>>,
    /// Each volume's modifications, for [`AwsConfig::modify_rules`].
    modified: Mutex<HashMap<String, History>>,
    /// DescribeVolumesModifications failed once (logged once; the rule's
    /// expected duration stands in for the state from then on).
    no_modification_state: std::sync::atomic::AtomicBool,
    /// Per volume (name or id as asked): its id if its type has a burst
    /// bucket (gp2, st1, sc1), else `None`. Learnt once, so that a
    /// BurstBalance read is one CloudWatch call and still works while EC2's
    /// API throttles (the services have separate limits); a modification
    /// forgets it (the type may change).
    burst_ids: Mutex<HashMap<String, Option<String>>>,
}

fn now_unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn tag<'a>(v: &'a Volume, key: &str) -> Option<&'a str> {
    v.tags().iter().find(|t| t.key() == Some(key)).and_then(|t| t.value())
}

/// The runtime, SDK settings (credentials chain, region, endpoint, retries)
/// and HTTP client every surge AWS client is made from. Nothing is called on AWS.
pub(crate) fn sdk_setup(cfg: &AwsConfig) -> Result<(tokio::runtime::Runtime, aws_config::SdkConfig, aws_smithy_runtime_api::client::http::SharedHttpClient), CloudError> {
    let setup = |why: String| CloudError::Remote { action: Action::List, volume: String::new(), why };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| setup(format!("starting the AWS client runtime: {e}")))?;
    use aws_smithy_http_client::tls;
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    let retry = aws_config::retry::RetryConfig::standard()
        .with_max_attempts(cfg.max_attempts.max(1))
        .with_initial_backoff(cfg.initial_backoff)
        .with_max_backoff(Duration::from_secs(20));
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).http_client(http.clone()).retry_config(retry);
    if let Some(r) = &cfg.region {
        loader = loader.region(aws_config::Region::new(r.clone()));
    }
    if let Some(u) = &cfg.endpoint_url {
        loader = loader.endpoint_url(u.clone());
    }
    let sdk = rt.block_on(loader.load());
    if sdk.region().is_none() {
        return Err(setup("no AWS region: set AWS_REGION, a profile's region, or `region` under [aws] in the config".into()));
    }
    Ok((rt, sdk, http))
}

/// The EC2 client, with capacity and limit refusals left to surge's own retries.
pub(crate) fn ec2_client(sdk: &aws_config::SdkConfig) -> aws_sdk_ec2::Client {
    aws_sdk_ec2::Client::from_conf(aws_sdk_ec2::config::Builder::from(sdk).retry_classifier(crate::error::NoTightRetry).build())
}

impl AwsProvider {
    /// Load credentials and region the usual way (environment, profiles, SSO,
    /// instance profile) and make the clients. Nothing is called on AWS yet.
    pub fn connect(cfg: AwsConfig) -> Result<Self, CloudError> {
        let (rt, sdk, http) = sdk_setup(&cfg)?;
        let ec2 = ec2_client(&sdk);
        let cw = aws_sdk_cloudwatch::Client::new(&sdk);
        let instance = OnceLock::new();
        if let (Some(id), Some(az)) = (&cfg.instance_id, &cfg.availability_zone) {
            let _ = instance.set(Instance { id: id.clone(), az: az.clone() });
        }
        Ok(AwsProvider { rt, ec2, cw, cfg, http, instance, attached: Mutex::new(HashMap::new()), deleted: Mutex::new(Vec::new()), naming: Mutex::new(Vec::new()), modified: Mutex::new(HashMap::new()), no_modification_state: Default::default(), burst_ids: Mutex::new(HashMap::new()) })
    }

    pub fn config(&self) -> &AwsConfig {
        &self.cfg
    }

    fn attempts(&self) -> u32 {
        self.cfg.max_attempts.max(1)
    }

    /// This instance's id and zone: from the config, else DescribeInstances on
    /// the id from the instance metadata service.
    fn instance(&self, action: Action, volume: &str) -> Result<Instance, CloudError> {
        if let Some(i) = self.instance.get() {
            return Ok(i.clone());
        }
        let id = match &self.cfg.instance_id {
            Some(id) => id.clone(),
            None => {
                let pc = aws_config::provider_config::ProviderConfig::without_region().with_http_client(self.http.clone());
                let imds = aws_config::imds::Client::builder().configure(&pc).build();
                let id = self.rt.block_on(imds.get("/latest/meta-data/instance-id")).map_err(|e| CloudError::Remote {
                    action,
                    volume: volume.into(),
                    why: format!(
                        "cannot learn this instance's id from the instance metadata service ({e}); \
                         outside EC2 set `instance_id` (and `availability_zone`) under [aws]"
                    ),
                })?;
                id.as_ref().to_string()
            }
        };
        let az = match &self.cfg.availability_zone {
            Some(az) => az.clone(),
            None => {
                let out = self
                    .rt
                    .block_on(self.ec2.describe_instances().instance_ids(&id).send())
                    .map_err(|e| map(action, volume, "DescribeInstances", self.attempts(), e))?;
                out.reservations()
                    .iter()
                    .flat_map(|r| r.instances())
                    .find_map(|i| i.placement().and_then(|p| p.availability_zone()).map(str::to_string))
                    .ok_or_else(|| CloudError::Remote { action, volume: volume.into(), why: format!("instance {id} has no availability zone in DescribeInstances") })?
            }
        };
        Ok(self.instance.get_or_init(|| Instance { id, az }).clone())
    }

    /// DescribeVolumes of one id; `None` if AWS does not know it (any more).
    fn describe_raw(&self, action: Action, id: &str) -> Result<Option<Volume>, CloudError> {
        match self.rt.block_on(self.ec2.describe_volumes().volume_ids(id).send()) {
            Ok(out) => Ok(out.volumes().first().cloned()),
            Err(e) if e.as_service_error().and_then(|s| aws_sdk_ec2::error::ProvideErrorMetadata::code(s)) == Some("InvalidVolume.NotFound") => Ok(None),
            Err(e) => Err(map(action, id, "DescribeVolumes", self.attempts(), e)),
        }
    }

    /// A surge volume by id or `surge:name`.
    fn find(&self, action: Action, key: &str) -> Result<Volume, CloudError> {
        if key.starts_with("vol-") {
            if let Some(v) = self.describe_raw(action, key)? {
                if tag(&v, OWNER_TAG) == Some(self.cfg.owner.as_str()) {
                    return Ok(v);
                }
                return Err(CloudError::Busy {
                    action,
                    volume: key.into(),
                    why: format!("not a surge volume (no {OWNER_TAG}={} tag); surge leaves it alone", self.cfg.owner),
                });
            }
        }
        let by_name = self.list_raw(action, Some(key))?;
        by_name.into_iter().next().ok_or_else(|| CloudError::NotFound { action, volume: key.into() })
    }

    /// Every surge volume (optionally only those named `name`), all pages.
    fn list_raw(&self, action: Action, name: Option<&str>) -> Result<Vec<Volume>, CloudError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut req = self.ec2.describe_volumes().filters(Filter::builder().name(format!("tag:{OWNER_TAG}")).values(&self.cfg.owner).build());
            if let Some(n) = name {
                req = req.filters(Filter::builder().name(format!("tag:{NAME_TAG}")).values(n).build());
            }
            let page = self.rt.block_on(req.set_next_token(token.take()).send()).map_err(|e| map(action, "", "DescribeVolumes", self.attempts(), e))?;
            out.extend(page.volumes().iter().cloned());
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(out),
            }
        }
    }

    fn info(&self, v: &Volume) -> Result<VolumeInfo, CloudError> {
        let id = v.volume_id().unwrap_or_default().to_string();
        let spec = ebs::spec_of(v.volume_type().map_or("", |t| t.as_str()), v.size().unwrap_or(0), v.iops(), v.throughput())
            .map_err(|e| CloudError::Remote { action: Action::Describe, volume: id.clone(), why: e.to_string() })?;
        let state = match v.state().map(|s| s.as_str()) {
            Some("available") => VolumeState::Available,
            _ => VolumeState::Attached,
        };
        Ok(VolumeInfo {
            name: tag(v, NAME_TAG).map(str::to_string),
            kind: spec.kind().to_string(),
            size: spec.size,
            spec: spec.to_string(),
            state,
            created_unix_ms: v.create_time().map_or(0, |t| t.to_millis().unwrap_or(0).max(0) as u64),
            credits: CreditBalance::default(),
            id,
        })
    }

    /// Poll DescribeVolumes until `done` says yes or `timeout` passes; the
    /// error then says what the volume was doing.
    fn wait(&self, action: Action, id: &str, timeout: Duration, what: &str, done: impl Fn(Option<&Volume>) -> bool) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let v = self.describe_raw(action, id).map_err(|e| e.to_string())?;
            if done(v.as_ref()) {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(format!("{what} did not happen within {timeout:?} (volume state: {})", describe_state(v.as_ref())));
            }
            std::thread::sleep(self.cfg.poll);
        }
    }

    /// Best-effort delete of a volume surge just made and cannot use.
    fn undo_create(&self, id: &str) -> String {
        match self.rt.block_on(self.ec2.delete_volume().volume_id(id).send()) {
            Ok(_) => format!("surge deleted {id} again"),
            Err(e) => format!(
                "deleting {id} again failed too ({}); it is tagged {OWNER_TAG}={}: `surge cloud gc --provider aws` removes it",
                map(Action::Delete, id, "DeleteVolume", self.attempts(), e),
                self.cfg.owner
            ),
        }
    }

    /// Best-effort detach of an attachment surge cannot use.
    fn undo_attach(&self, id: &str, instance: &str) -> String {
        match self.rt.block_on(self.ec2.detach_volume().volume_id(id).instance_id(instance).force(true).send()) {
            Ok(_) => format!("surge asked AWS to detach {id} again (it stays, detached: delete it or run `surge cloud gc`)"),
            Err(e) => format!("detaching {id} again failed too: {}", map(Action::Detach, id, "DetachVolume", self.attempts(), e)),
        }
    }

    /// Wait for the device of `id` (attached to `inst` as `device`) and open
    /// it. `undo`: a failure detaches the volume again (this call attached
    /// it); a volume taken over from a previous run is left as it is.
    fn open_attached(&self, v: &Volume, id: &str, inst: &Instance, device: &str, undo: bool) -> Result<Arc<dyn BlockDev>, CloudError> {
        let a = Action::Attach;
        let undo_why = |this: &Self| if undo { this.undo_attach(id, &inst.id) } else { "the volume stays attached".to_string() };
        let want = device::Expect { volume_id: id, size_bytes: (v.size().unwrap_or(0).max(0) as u64) << 30 };
        let path = match device::wait_for(&self.cfg.device_root, want, device, self.cfg.device_timeout, self.cfg.poll.min(Duration::from_millis(200))) {
            Ok(p) => p,
            Err(e) => return Err(CloudError::Remote { action: a, volume: id.into(), why: format!("{e}; {}", undo_why(self)) }),
        };
        let opts = FileOptions { direct: self.cfg.direct_io, read_only: false, create_size: None };
        let dev = match FileDev::open(&path, &opts) {
            Ok(d) => d,
            Err(source) => {
                tracing::error!(volume = %id, "{}", undo_why(self));
                return Err(CloudError::Io { action: a, volume: id.into(), what: "opening device", path, source });
            }
        };
        tracing::debug!(volume = %id, device = %path.display(), "attached EBS volume");
        let file = Arc::new(dev);
        let att = Arc::new(Attachment::new(id, file.clone()));
        self.attached.lock().insert(id.to_string(), (att.clone(), file));
        Ok(att)
    }

    /// BurstBalance (percent) of the last 10 minutes from CloudWatch, if AWS has any.
    pub fn burst_balance(&self, id: &str) -> Result<Option<f64>, CloudError> {
        Ok(self.burst_balance_point(id)?.map(|p| p.percent))
    }

    /// DescribeVolumesModifications of one volume: its latest modification
    /// (`None`: never modified; EBS answers that with
    /// `InvalidVolumeModification.NotFound`, moto with an empty list).
    fn latest_modification(&self, action: Action, id: &str) -> Result<Option<Modification>, CloudError> {
        match self.rt.block_on(self.ec2.describe_volumes_modifications().volume_ids(id).send()) {
            Ok(out) => Ok(crate::modification::latest(out.volumes_modifications(), id)),
            Err(e) if e.as_service_error().and_then(|s| aws_sdk_ec2::error::ProvideErrorMetadata::code(s)) == Some("InvalidVolumeModification.NotFound") => Ok(None),
            Err(e) => Err(map(action, id, "DescribeVolumesModifications", self.attempts(), e)),
        }
    }

    /// The latest BurstBalance point of the last 10 minutes (the minimum of
    /// its minute), dated at the end of its minute: a draining balance is at
    /// its lowest there, so the point errs low.
    pub fn burst_balance_point(&self, id: &str) -> Result<Option<surge_cloud::CreditSample>, CloudError> {
        use aws_sdk_cloudwatch::primitives::DateTime;
        use aws_sdk_cloudwatch::types::{Dimension, Statistic};
        let now = SystemTime::now();
        let out = self
            .rt
            .block_on(
                self.cw
                    .get_metric_statistics()
                    .namespace("AWS/EBS")
                    .metric_name("BurstBalance")
                    .dimensions(Dimension::builder().name("VolumeId").value(id).build())
                    .start_time(DateTime::from(now - Duration::from_secs(600)))
                    .end_time(DateTime::from(now + Duration::from_secs(60)))
                    .period(60)
                    .statistics(Statistic::Minimum)
                    .send(),
            )
            .map_err(|e| map(Action::Describe, id, "GetMetricStatistics", self.attempts(), e))?;
        let latest = out.datapoints().iter().filter(|d| d.minimum().is_some()).max_by_key(|d| d.timestamp().map_or(0, |t| t.secs()));
        Ok(latest.and_then(|d| {
            let at = d.timestamp()?.to_millis().ok()?.max(0) as u64 + 60_000;
            Some(surge_cloud::CreditSample { at_unix_ms: at.min(now_unix_ns() / 1_000_000), percent: d.minimum()? })
        }))
    }

    /// Drop what `burst_ids` knows of a volume (modified or deleted).
    fn forget_burst_id(&self, key: &str, id: &str) {
        self.burst_ids.lock().retain(|k, cached| k != key && k != id && cached.as_deref() != Some(id));
    }

    /// This instance and its type's description (`None` if AWS has none).
    fn instance_and_type(&self) -> Result<(aws_sdk_ec2::types::Instance, Option<aws_sdk_ec2::types::InstanceTypeInfo>), CloudError> {
        let a = Action::Describe;
        let inst = self.instance(a, "")?;
        let out = self.rt.block_on(self.ec2.describe_instances().instance_ids(&inst.id).send()).map_err(|e| map(a, "", "DescribeInstances", self.attempts(), e))?;
        let i = out.reservations().iter().flat_map(|r| r.instances()).next().cloned().ok_or_else(|| CloudError::Remote {
            action: a,
            volume: String::new(),
            why: format!("DescribeInstances does not know instance {}", inst.id),
        })?;
        let Some(kind) = i.instance_type().cloned() else { return Ok((i, None)) };
        // Without ec2:DescribeInstanceTypes (or on an emulator without it) the
        // stack falls back to its configured attach_limit.
        let info = match self.rt.block_on(self.ec2.describe_instance_types().instance_types(kind.clone()).send()) {
            Ok(o) => o.instance_types().first().cloned(),
            Err(e) => {
                tracing::warn!("DescribeInstanceTypes {}: {}; using the configured attachment limit", kind.as_str(), map(a, "", "DescribeInstanceTypes", self.attempts(), e));
                None
            }
        };
        Ok((i, info))
    }

    /// The EC2 client, for callers that need a call surge does not make
    /// (tests start instances with it); run its futures with [`Self::block_on`].
    pub fn ec2(&self) -> &aws_sdk_ec2::Client {
        &self.ec2
    }

    pub fn cloudwatch(&self) -> &aws_sdk_cloudwatch::Client {
        &self.cw
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }
}

/// Frees a device name reserved for an attach when the attach is over.
struct Release<'a>(&'a Mutex<Vec<String>>, String);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.lock().retain(|n| *n != self.1);
    }
}

fn describe_state(v: Option<&Volume>) -> String {
    match v {
        None => "gone".into(),
        Some(v) => {
            let att: Vec<String> = v
                .attachments()
                .iter()
                .map(|a| format!("{} on {}", a.state().map_or("?", |s| s.as_str()), a.instance_id().unwrap_or("?")))
                .collect();
            let s = v.state().map_or("?", |s| s.as_str()).to_string();
            if att.is_empty() {
                s
            } else {
                format!("{s}, attachment {}", att.join(", "))
            }
        }
    }
}

/// Credits from a BurstBalance percentage, sized like the volume type's bucket.
fn credits_from_percent(spec: &VolumeSpec, pct: f64) -> CreditBalance {
    let shape = spec.shape().unwrap_or_default();
    let ops_capacity = shape.op_credits.map(|c| c.capacity);
    let bytes_capacity = shape.byte_credits.map(|c| c.capacity);
    let scale = |c: Option<u64>| c.map(|c| (c as f64 * pct.clamp(0.0, 100.0) / 100.0).round() as u64);
    CreditBalance { ops: scale(ops_capacity), ops_capacity, bytes: scale(bytes_capacity), bytes_capacity }
}

impl Provider for AwsProvider {
    fn create(&self, req: CreateRequest) -> Result<VolumeInfo, CloudError> {
        let a = Action::Create;
        let p = ebs::params(&req.spec).map_err(|e| CloudError::Remote { action: a, volume: String::new(), why: e.to_string() })?;
        if let Some(n) = &req.name {
            if let Some(v) = self.list_raw(a, Some(n))?.first() {
                return Err(CloudError::NameTaken { action: a, name: n.clone(), id: v.volume_id().unwrap_or_default().into() });
            }
        }
        let az = match &self.cfg.availability_zone {
            Some(az) => az.clone(),
            None => self.instance(a, "")?.az,
        };
        let mut tags = TagSpecification::builder()
            .resource_type(ResourceType::Volume)
            .tags(Tag::builder().key(OWNER_TAG).value(&self.cfg.owner).build());
        if let Some(n) = &req.name {
            tags = tags.tags(Tag::builder().key(NAME_TAG).value(n).build()).tags(Tag::builder().key("Name").value(n).build());
        }
        // One token per request: a create the SDK retries after a lost reply
        // is the same create, never a second volume.
        let token = format!("surge-{}-{}", std::process::id(), now_unix_ns());
        let out = self
            .rt
            .block_on(
                self.ec2
                    .create_volume()
                    .availability_zone(az)
                    .size(p.size_gib)
                    .volume_type(VolumeType::from(p.volume_type))
                    .set_iops(p.iops)
                    .set_throughput(p.throughput_mibps)
                    .tag_specifications(tags.build())
                    .client_token(token)
                    .send(),
            )
            .map_err(|e| map(a, "", "CreateVolume", self.attempts(), e))?;
        let id = out.volume_id().unwrap_or_default().to_string();
        tracing::debug!(volume = %id, spec = %req.spec, "created EBS volume");
        if let Err(why) = self.wait(a, &id, self.cfg.create_timeout, "the volume becoming available", |v| {
            v.and_then(|v| v.state()).map(|s| s.as_str()) == Some("available")
        }) {
            let undo = self.undo_create(&id);
            return Err(CloudError::Remote { action: a, volume: id, why: format!("{why}; {undo}") });
        }
        self.describe(&id)
    }

    fn attach(&self, key: &str) -> Result<Arc<dyn BlockDev>, CloudError> {
        let a = Action::Attach;
        let v = self.find(a, key)?;
        let id = v.volume_id().unwrap_or_default().to_string();
        if self.attached.lock().contains_key(&id) {
            return Err(CloudError::Busy { action: a, volume: id, why: "already attached by this process".into() });
        }
        let inst = self.instance(a, &id)?;
        // Still attached to this instance but not by this process: a previous
        // run of surge here died (SIGKILL, crash) with it attached. Its device
        // is there; take it over instead of a detach and attach that EBS may
        // take minutes over.
        let here = v.attachments().iter().find(|x| x.instance_id() == Some(inst.id.as_str()) && x.state() == Some(&VolumeAttachmentState::Attached));
        if let (Some(att), Some("in-use")) = (here, v.state().map(|s| s.as_str())) {
            let device = att.device().unwrap_or_default().to_string();
            tracing::warn!(volume = %id, %device, "volume is still attached to this instance (left by a previous run); using it");
            return self.open_attached(&v, &id, &inst, &device, false);
        }
        if v.state().map(|s| s.as_str()) != Some("available") {
            return Err(CloudError::Busy { action: a, volume: id, why: format!("not available ({}); detach it first", describe_state(Some(&v))) });
        }
        let mut naming = self.naming.lock();
        let out = self
            .rt
            .block_on(self.ec2.describe_instances().instance_ids(&inst.id).send())
            .map_err(|e| map(a, &id, "DescribeInstances", self.attempts(), e))?;
        let mut used: Vec<String> = out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .flat_map(|i| i.block_device_mappings())
            .filter_map(|m| m.device_name().map(str::to_string))
            .collect();
        used.extend(naming.iter().cloned());
        let device = device::free_device_name(&used)
            .ok_or_else(|| CloudError::Busy { action: a, volume: id.clone(), why: format!("instance {} has none of surge's device names free (/dev/sdf../dev/sdz, /dev/xvdba../dev/xvdcz)", inst.id) })?;
        naming.push(device.clone());
        drop(naming);
        let _release = Release(&self.naming, device.clone());
        self.rt
            .block_on(self.ec2.attach_volume().volume_id(&id).instance_id(&inst.id).device(&device).send())
            .map_err(|e| map(a, &id, "AttachVolume", self.attempts(), e))?;
        let attached = |v: Option<&Volume>| {
            v.is_some_and(|v| v.attachments().iter().any(|x| x.instance_id() == Some(&inst.id) && x.state() == Some(&VolumeAttachmentState::Attached)))
        };
        if let Err(why) = self.wait(a, &id, self.cfg.attach_timeout, &format!("attaching to {} as {device}", inst.id), attached) {
            let undo = self.undo_attach(&id, &inst.id);
            return Err(CloudError::Remote { action: a, volume: id, why: format!("{why}; {undo}") });
        }
        self.open_attached(&v, &id, &inst, &device, true)
    }

    fn detach(&self, key: &str) -> Result<(), CloudError> {
        let a = Action::Detach;
        let v = self.find(a, key)?;
        let id = v.volume_id().unwrap_or_default().to_string();
        let inst = self.instance(a, &id)?;
        if let Some((att, file)) = self.attached.lock().remove(&id) {
            // What was written reaches EBS before the volume goes away.
            let _ = file.flush();
            att.detach();
        }
        if v.state().map(|s| s.as_str()) == Some("available") {
            return Ok(());
        }
        self.rt
            .block_on(self.ec2.detach_volume().volume_id(&id).instance_id(&inst.id).send())
            .map_err(|e| map(a, &id, "DetachVolume", self.attempts(), e))?;
        let available = |v: Option<&Volume>| v.is_none_or(|v| v.state().map(|s| s.as_str()) == Some("available"));
        self.wait(a, &id, self.cfg.detach_timeout, "detaching", available).map_err(|why| CloudError::Busy {
            action: a,
            volume: id.clone(),
            why: format!(
                "volume stuck in-use: {why}; is its device still open or mounted on {}? \
                 surge stopped using it; detach it once free (aws ec2 detach-volume --volume-id {id})",
                inst.id
            ),
        })
    }

    fn delete(&self, key: &str) -> Result<(), CloudError> {
        let a = Action::Delete;
        let v = self.find(a, key)?;
        let id = v.volume_id().unwrap_or_default().to_string();
        self.forget_burst_id(key, &id);
        if v.state().map(|s| s.as_str()) != Some("available") {
            return Err(CloudError::Busy { action: a, volume: id, why: format!("{}; detach it first", describe_state(Some(&v))) });
        }
        let info = self.info(&v)?;
        self.rt.block_on(self.ec2.delete_volume().volume_id(&id).send()).map_err(|e| map(a, &id, "DeleteVolume", self.attempts(), e))?;
        if let Ok(spec) = info.spec.parse() {
            self.deleted.lock().push(UsageRecord {
                id: id.clone(),
                name: info.name,
                spec,
                start_unix_ns: info.created_unix_ms * 1_000_000,
                end_unix_ns: Some(now_unix_ns()),
                continued: false,
            });
        }
        tracing::debug!(volume = %id, "deleted EBS volume");
        Ok(())
    }

    fn list(&self) -> Result<Vec<VolumeInfo>, CloudError> {
        let mut v: Vec<VolumeInfo> = self.list_raw(Action::List, None)?.iter().map(|v| self.info(v)).collect::<Result<_, _>>()?;
        v.sort_by(|a, b| (a.created_unix_ms, &a.id).cmp(&(b.created_unix_ms, &b.id)));
        Ok(v)
    }

    fn describe(&self, key: &str) -> Result<VolumeInfo, CloudError> {
        let v = self.find(Action::Describe, key)?;
        let mut info = self.info(&v)?;
        info.credits = self.credits(&info.id)?;
        Ok(info)
    }

    /// From CloudWatch's BurstBalance (gp2, st1, sc1); none for types without credits
    /// or while CloudWatch has no data point yet.
    fn credits(&self, id: &str) -> Result<CreditBalance, CloudError> {
        let v = self.find(Action::Describe, id)?;
        let info = self.info(&v)?;
        let spec: VolumeSpec = info.spec.parse().map_err(|e| CloudError::Spec { action: Action::Describe, source: e })?;
        if !matches!(info.kind.as_str(), "gp2" | "st1" | "sc1") {
            return Ok(CreditBalance::default());
        }
        Ok(self.burst_balance(&info.id)?.map(|p| credits_from_percent(&spec, p)).unwrap_or_default())
    }

    fn credits_sampled(&self) -> bool {
        true
    }

    fn credit_sample(&self, key: &str) -> Result<Option<surge_cloud::CreditSample>, CloudError> {
        let known = self.burst_ids.lock().get(key).cloned();
        let id = match known {
            Some(id) => id,
            None => {
                let v = self.find(Action::Describe, key)?;
                let id = matches!(v.volume_type().map(|t| t.as_str()), Some("gp2" | "st1" | "sc1")).then(|| v.volume_id().unwrap_or_default().to_string());
                self.burst_ids.lock().insert(key.to_string(), id.clone());
                id
            }
        };
        match id {
            Some(id) => self.burst_balance_point(&id),
            None => Ok(None),
        }
    }

    fn attachment_slots(&self) -> Result<Option<surge_cloud::AttachmentSlots>, CloudError> {
        let (i, info) = self.instance_and_type()?;
        Ok(crate::limits::slots(&i, info.as_ref()))
    }

    /// List prices over each live surge volume's life so far, plus what this
    /// process deleted (AWS's bill is the authority; this is surge's estimate).
    fn cost(&self) -> Result<CostReport, CloudError> {
        let mut records = self.deleted.lock().clone();
        for v in self.list()? {
            if let Ok(spec) = v.spec.parse() {
                records.push(UsageRecord { id: v.id, name: v.name, spec, start_unix_ns: v.created_unix_ms * 1_000_000, end_unix_ns: None, continued: false });
            }
        }
        Ok(report(&self.cfg.prices, &records, now_unix_ns()))
    }

    /// ModifyVolume: type parameters and growth, also while attached (EBS
    /// applies them online; the volume enters `optimizing`).
    fn modify(&self, key: &str, spec: VolumeSpec) -> Result<VolumeInfo, CloudError> {
        let a = Action::Modify;
        let v = self.find(a, key)?;
        let id = v.volume_id().unwrap_or_default().to_string();
        self.forget_burst_id(key, &id);
        let cur = self.info(&v)?;
        if spec.size < cur.size {
            return Err(CloudError::Busy { action: a, volume: id, why: format!("EBS volumes only grow (now {})", cur.spec) });
        }
        let mut p = ebs::params(&spec).map_err(|e| CloudError::Remote { action: a, volume: id.clone(), why: e.to_string() })?;
        // ModifyVolume keeps what it is not given: a gp3 spec without extras
        // means the included performance, so say so.
        if p.volume_type == "gp3" {
            p.iops.get_or_insert(ebs::GP3_BASE_IOPS as i32);
            p.throughput_mibps.get_or_insert(ebs::GP3_BASE_MIBPS as i32);
        }
        // Keep to the modification rule: whether the previous one completed
        // is what AWS reports; without ec2:DescribeVolumesModifications, the
        // rule's expected duration stands in.
        let rules = self.cfg.modify_rules;
        let latest = match self.latest_modification(a, &id) {
            Ok(m) => Ok(m),
            Err(e) => {
                if !self.no_modification_state.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(volume = %id, "cannot read modification states ({e}); assuming each modification completes in {:?}", rules.optimizing);
                }
                Err(())
            }
        };
        let now = Duration::from_nanos(now_unix_ns());
        let refused = self.modified.lock().entry(id.clone()).or_default().refuses(&rules, now, latest.as_ref().map(Option::as_ref).map_err(|_| ()), self.cfg.modify_retry);
        if let Some(why) = refused {
            return Err(CloudError::Busy { action: a, volume: id, why: format!("not asked of AWS: {why} (modification rule {})", rules.name()) });
        }
        let sent = self.rt
            .block_on(
                self.ec2
                    .modify_volume()
                    .volume_id(&id)
                    .size(p.size_gib)
                    .volume_type(VolumeType::from(p.volume_type))
                    .set_iops(p.iops)
                    .set_throughput(p.throughput_mibps)
                    .send(),
            );
        match sent {
            Ok(_) => self.modified.lock().entry(id.clone()).or_default().made(&rules, now),
            Err(e) => {
                let refused = crate::error::kind_of_code(aws_sdk_ec2::error::ProvideErrorMetadata::code(&e)) == crate::error::Kind::ModifyRefused;
                let e = map(a, &id, "ModifyVolume", self.attempts(), e);
                if refused {
                    // The caller reports the refusal (the modify controller warns once per
                    // distinct error); the next attempts are refused without a call until
                    // modify_retry passed.
                    tracing::debug!(volume = %id, "{e}");
                    self.modified.lock().entry(id.clone()).or_default().refused(now);
                }
                return Err(e);
            }
        }
        self.describe(&id)
    }

    fn modification(&self, key: &str) -> Result<Option<Modification>, CloudError> {
        let a = Action::Describe;
        let v = self.find(a, key)?;
        self.latest_modification(a, v.volume_id().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_balance_scales_the_type_bucket() {
        let c = credits_from_percent(&"gp2:100GiB".parse().unwrap(), 50.0);
        assert_eq!((c.ops, c.ops_capacity), (Some(2_700_000), Some(5_400_000)));
        assert_eq!(c.percent(), Some(50.0));
        let c = credits_from_percent(&"st1:1TiB".parse().unwrap(), 100.0);
        assert!(c.bytes.is_some() && c.bytes == c.bytes_capacity, "{c:?}");
    }
}
