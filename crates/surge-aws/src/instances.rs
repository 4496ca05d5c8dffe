//! EC2 instances of a burst-buffer pool: the I/O nodes `surge bb pool
//! --nodes ec2` runs (surge-bb's `Ec2Nodes` drives them). RunInstances from
//! an AMI or a launch template, with user-data that starts `surge bb node`;
//! TerminateInstances; DescribeInstances by the pool's tags. Every instance
//! carries `surge:owner`, `surge:role=bb-node` and `surge:pool`, so that a
//! pool restarted finds its running nodes and nothing else.
//!
//! Blocking calls on a private single-thread runtime, with the SDK's retries
//! (as [`AwsProvider`](crate::AwsProvider)).

use crate::error::{kind_of_code, map, Kind};
use crate::provider::{ec2_client, sdk_setup, AwsConfig, OWNER_TAG};
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_ec2::types::{
    Filter, IamInstanceProfileSpecification, Instance, InstanceType, LaunchTemplateSpecification, ResourceType, ShutdownBehavior, Tag, TagSpecification,
};
use std::time::{SystemTime, UNIX_EPOCH};
use surge_cloud::{Action, CloudError};

/// What the instance is to surge; the value is [`ROLE_BB_NODE`].
pub const ROLE_TAG: &str = "surge:role";
pub const ROLE_BB_NODE: &str = "bb-node";
/// The pool the instance belongs to (several pools share an owner).
pub const POOL_TAG: &str = "surge:pool";
/// Where the instance's node serves, when not at its private IP and the
/// pool's node port: set by whatever started the node (the tests' fake agent
/// sets its local node's 127.0.0.1:PORT; a node behind a proxy could set it).
pub const NODE_ADDR_TAG: &str = "surge:node-addr";

/// How to launch one I/O node.
#[derive(Debug, Clone, Default)]
pub struct LaunchSpec {
    /// AMI with `surge` installed (or given by the launch template).
    pub image_id: Option<String>,
    /// Launch template: an id (`lt-...`) or a name.
    pub launch_template: Option<String>,
    /// Its version (`$Latest`, `$Default` or a number); `None`: the default.
    pub launch_template_version: Option<String>,
    /// Overrides the template's: the pool bills each node as this type.
    pub instance_type: String,
    pub subnet_id: Option<String>,
    pub security_group_ids: Vec<String>,
    /// Instance profile (name or ARN): the node's S3 credentials come from it.
    pub instance_profile: Option<String>,
    /// The script run at boot (plain text; sent base64-encoded). It is
    /// readable by anything on the instance and by ec2:DescribeInstanceAttribute:
    /// no secret goes in it.
    pub user_data: Option<String>,
}

/// One instance of the pool, as DescribeInstances shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolInstance {
    pub id: String,
    /// pending, running, shutting-down, terminated, stopping, stopped.
    pub state: String,
    pub instance_type: String,
    pub private_ip: Option<String>,
    /// The [`NODE_ADDR_TAG`] tag, if set.
    pub node_addr: Option<String>,
    pub launch_unix_ms: u64,
}

impl PoolInstance {
    /// Pending or running: billed, and its node may serve.
    pub fn alive(&self) -> bool {
        matches!(self.state.as_str(), "pending" | "running")
    }

    /// Where its node serves: the [`NODE_ADDR_TAG`] tag, else the private IP
    /// and `port`; `None` while it has neither.
    pub fn addr(&self, port: u16) -> Option<String> {
        self.node_addr.clone().or_else(|| self.private_ip.as_ref().map(|ip| format!("{ip}:{port}")))
    }

    /// Milliseconds since its launch (0 if the clock or AWS disagree).
    pub fn age_ms(&self) -> u64 {
        now_unix_ms().saturating_sub(self.launch_unix_ms)
    }
}

/// An EC2 call that failed, with what to do about it (`why` names the call).
#[derive(Debug, thiserror::Error)]
#[error("{why}")]
pub struct InstanceError {
    pub api: &'static str,
    pub kind: Kind,
    pub why: String,
}

fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn tag<'a>(i: &'a Instance, key: &str) -> Option<&'a str> {
    i.tags().iter().find(|t| t.key() == Some(key)).and_then(|t| t.value())
}

fn pool_instance(i: &Instance) -> PoolInstance {
    PoolInstance {
        id: i.instance_id().unwrap_or_default().to_string(),
        state: i.state().and_then(|s| s.name()).map_or("unknown", |s| s.as_str()).to_string(),
        instance_type: i.instance_type().map_or("", |t| t.as_str()).to_string(),
        private_ip: i.private_ip_address().map(str::to_string),
        node_addr: tag(i, NODE_ADDR_TAG).map(str::to_string),
        launch_unix_ms: i.launch_time().map_or(0, |t| t.to_millis().unwrap_or(0).max(0) as u64),
    }
}

/// The instances of one pool (`surge:owner` + `surge:pool`).
pub struct PoolInstances {
    rt: tokio::runtime::Runtime,
    ec2: aws_sdk_ec2::Client,
    owner: String,
    pool: String,
    attempts: u32,
}

impl PoolInstances {
    /// Credentials, region and endpoint from `cfg` (as the EBS provider);
    /// nothing is called on AWS yet.
    pub fn connect(cfg: &AwsConfig, pool: &str) -> Result<PoolInstances, CloudError> {
        let (rt, sdk, _) = sdk_setup(cfg)?;
        Ok(PoolInstances { rt, ec2: ec2_client(&sdk), owner: cfg.owner.clone(), pool: pool.to_string(), attempts: cfg.max_attempts.max(1) })
    }

    pub fn pool(&self) -> &str {
        &self.pool
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    fn error<E, R>(&self, api: &'static str, target: &str, err: SdkError<E, R>) -> InstanceError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug,
    {
        let kind = kind_of_code(err.code());
        let code = err.code().unwrap_or_default().to_string();
        let msg = err.message().unwrap_or_default().to_string();
        // The shared mapping words capacity and limits for volumes.
        let why = match kind {
            Kind::Capacity => format!("{api}: EC2 has no capacity for this instance type now ({code}: {msg}); the pool tries again at its next interval (another type or subnet may work)"),
            Kind::Limit => format!("{api}: an account limit is reached ({code}: {msg}); the pool tries again at its next interval; raise the quota (Service Quotas, EC2 vCPUs) or lower --max"),
            Kind::Permission => format!("{api}: not permitted ({code}: {msg}); the IAM policy needs ec2:{api} (docs/aws.md lists what `surge bb pool --nodes ec2` calls)"),
            _ => match map(Action::List, target, api, self.attempts, err) {
                CloudError::Remote { why, .. } => why,
                e => e.to_string(),
            },
        };
        InstanceError { api, kind, why }
    }

    fn tags(&self) -> TagSpecification {
        let t = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
        TagSpecification::builder()
            .resource_type(ResourceType::Instance)
            .tags(t(OWNER_TAG, &self.owner))
            .tags(t(ROLE_TAG, ROLE_BB_NODE))
            .tags(t(POOL_TAG, &self.pool))
            .tags(t("Name", &format!("surge-bb-{}", self.pool)))
            .build()
    }

    /// Launches `count` nodes in one call; when EC2 has no room for all of
    /// them, as many as it has room for (at least one, or an error).
    pub fn launch(&self, spec: &LaunchSpec, count: u32) -> Result<Vec<PoolInstance>, InstanceError> {
        let count = count.max(1);
        match self.run(spec, count, count) {
            Err(e) if e.kind == Kind::Capacity && count > 1 => {
                tracing::warn!(pool = %self.pool, "{e}; asking for 1 to {count} instances instead");
                self.run(spec, 1, count)
            }
            r => r,
        }
    }

    /// One RunInstances of `min..=max` instances (AWS starts the most it can).
    fn run(&self, spec: &LaunchSpec, min: u32, max: u32) -> Result<Vec<PoolInstance>, InstanceError> {
        let template = spec.launch_template.as_ref().map(|t| {
            let b = LaunchTemplateSpecification::builder().set_version(spec.launch_template_version.clone());
            if t.starts_with("lt-") { b.launch_template_id(t) } else { b.launch_template_name(t) }.build()
        });
        let profile = spec.instance_profile.as_ref().map(|p| {
            let b = IamInstanceProfileSpecification::builder();
            if p.starts_with("arn:") { b.arn(p) } else { b.name(p) }.build()
        });
        // One token per request: a launch the SDK retries after a lost reply
        // is the same launch, never a second set of instances.
        let token = format!("surge-bb-{}-{}", std::process::id(), SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
        let req = self
            .ec2
            .run_instances()
            .min_count(min as i32)
            .max_count(max as i32)
            .instance_type(InstanceType::from(spec.instance_type.as_str()))
            .set_image_id(spec.image_id.clone())
            .set_launch_template(template)
            .set_subnet_id(spec.subnet_id.clone())
            .set_security_group_ids((!spec.security_group_ids.is_empty()).then(|| spec.security_group_ids.clone()))
            .set_iam_instance_profile(profile)
            .set_user_data(spec.user_data.as_ref().map(|u| aws_smithy_types::base64::encode(u.as_bytes())))
            // A node that ends (drained by hand, then `poweroff` in its
            // user-data) stops being billed without the pool.
            .instance_initiated_shutdown_behavior(ShutdownBehavior::Terminate)
            .tag_specifications(self.tags())
            .client_token(token);
        let out = self.rt.block_on(req.send()).map_err(|e| self.error("RunInstances", "", e))?;
        let v: Vec<PoolInstance> = out.instances().iter().map(pool_instance).collect();
        tracing::info!(pool = %self.pool, "launched {} instances: {}", v.len(), v.iter().map(|i| i.id.as_str()).collect::<Vec<_>>().join(", "));
        Ok(v)
    }

    /// Terminates instances (already terminated ones are no error).
    pub fn terminate(&self, ids: &[String]) -> Result<(), InstanceError> {
        if ids.is_empty() {
            return Ok(());
        }
        let target = ids.join(",");
        self.rt
            .block_on(self.ec2.terminate_instances().set_instance_ids(Some(ids.to_vec())).send())
            .map_err(|e| self.error("TerminateInstances", &target, e))?;
        tracing::info!(pool = %self.pool, "terminated {target}");
        Ok(())
    }

    /// The pool's instances that are not terminated (or being terminated):
    /// pending, running, stopping and stopped ones; all pages.
    pub fn list(&self) -> Result<Vec<PoolInstance>, InstanceError> {
        let f = |k: String, v: &[&str]| Filter::builder().name(k).set_values(Some(v.iter().map(|s| s.to_string()).collect())).build();
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let req = self
                .ec2
                .describe_instances()
                .filters(f(format!("tag:{OWNER_TAG}"), &[&self.owner]))
                .filters(f(format!("tag:{ROLE_TAG}"), &[ROLE_BB_NODE]))
                .filters(f(format!("tag:{POOL_TAG}"), &[&self.pool]))
                .filters(f("instance-state-name".into(), &["pending", "running", "stopping", "stopped"]))
                .set_next_token(token.take());
            let page = self.rt.block_on(req.send()).map_err(|e| self.error("DescribeInstances", "", e))?;
            out.extend(page.reservations().iter().flat_map(|r| r.instances()).map(pool_instance));
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(out),
            }
        }
    }

    /// These instances as AWS shows them now; one AWS no longer knows is left out.
    pub fn describe(&self, ids: &[String]) -> Result<Vec<PoolInstance>, InstanceError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        match self.rt.block_on(self.ec2.describe_instances().set_instance_ids(Some(ids.to_vec())).send()) {
            Ok(out) => Ok(out.reservations().iter().flat_map(|r| r.instances()).map(pool_instance).collect()),
            // One unknown id fails the whole call: ask one by one.
            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") && ids.len() > 1 => {
                let mut v = Vec::new();
                for id in ids {
                    v.extend(self.describe(std::slice::from_ref(id))?);
                }
                Ok(v)
            }
            Err(e) if e.code() == Some("InvalidInstanceID.NotFound") => Ok(Vec::new()),
            Err(e) => Err(self.error("DescribeInstances", &ids.join(","), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(tag: Option<&str>, ip: Option<&str>, state: &str) -> PoolInstance {
        PoolInstance {
            id: "i-1".into(),
            state: state.into(),
            instance_type: "r5.large".into(),
            private_ip: ip.map(str::to_string),
            node_addr: tag.map(str::to_string),
            launch_unix_ms: 0,
        }
    }

    #[test]
    fn the_node_address_tag_wins_over_the_private_ip() {
        assert_eq!(inst(Some("127.0.0.1:4000"), Some("10.0.0.5"), "running").addr(7400).as_deref(), Some("127.0.0.1:4000"));
        assert_eq!(inst(None, Some("10.0.0.5"), "running").addr(7400).as_deref(), Some("10.0.0.5:7400"));
        assert_eq!(inst(None, None, "pending").addr(7400), None);
    }

    #[test]
    fn only_pending_and_running_instances_are_alive() {
        assert!(inst(None, None, "pending").alive() && inst(None, None, "running").alive());
        for s in ["shutting-down", "terminated", "stopping", "stopped"] {
            assert!(!inst(None, None, s).alive(), "{s}");
        }
    }
}
