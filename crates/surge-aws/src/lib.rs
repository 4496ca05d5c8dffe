//! surge-aws: the AWS EBS [`Provider`](surge_cloud::Provider), with the
//! official AWS SDK for Rust.
//!
//! - [`AwsProvider`]: CreateVolume / AttachVolume / DetachVolume /
//!   DeleteVolume / DescribeVolumes / ModifyVolume with waiters and timeouts,
//!   `surge:owner` tags on everything surge creates, BurstBalance from
//!   CloudWatch, retries with backoff (the SDK's standard retry mode).
//! - [`instances`]: the EC2 instances of a burst-buffer pool (RunInstances,
//!   TerminateInstances, DescribeInstances by the pool's tags), for surge-bb's
//!   `Ec2Nodes`.
//! - [`device`]: finding the attached volume inside the instance (NVMe by-id
//!   links, xvd names) under an injectable root.
//! - [`ebs`]: surge volume specs <-> EBS parameters (pure).
//! - [`modification`]: DescribeVolumesModifications as surge's `Modification`
//!   (pure), and the history that keeps ModifyVolume within the modification rule.
//!
//! Its own crate so that the rest of surge builds without the SDK.

pub mod device;
pub mod ebs;
pub mod error;
pub mod instances;
pub mod limits;
pub mod modification;
pub mod provider;

pub use provider::{AwsConfig, AwsProvider, NAME_TAG, OWNER_TAG};
