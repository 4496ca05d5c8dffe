//! The instance's attachment slots from `DescribeInstances` and
//! `DescribeInstanceTypes` (pure: the SDK's types in, surge's out).
//!
//! - `MaximumEbsAttachments` with `AttachmentLimitType` `shared` (Nitro before
//!   the 7th generation): the slots are shared with network interfaces and
//!   NVMe instance store; AWS's figure is with the primary interface attached
//!   (m5.large: 27 of Nitro's 28), so every further interface and every
//!   instance-store disk takes one.
//! - `dedicated` (newer types): the figure is for EBS volumes alone.
//! - No figure (older API answers, emulators): Nitro's 28 shared slots when
//!   the hypervisor is `nitro`, else unknown (the stack's `attach_limit`).
//!
//! Every volume attached now (the root volume too) takes a slot. surge's
//! attachment names (`device::device_names`, 73 of them) bound what it can
//! attach as well, on instance types with more dedicated slots than that.

use aws_sdk_ec2::types::{Instance, InstanceTypeInfo};
use surge_cloud::AttachmentSlots;

use crate::device::DEVICE_NAMES;

/// Slots of `inst`, given its type's description (if AWS gave one).
pub fn slots(inst: &Instance, info: Option<&InstanceTypeInfo>) -> Option<AttachmentSlots> {
    let kind = inst.instance_type().map_or("?", |t| t.as_str()).to_string();
    let attached: Vec<String> = inst.block_device_mappings().iter().filter_map(|m| m.ebs().and_then(|e| e.volume_id()).map(str::to_string)).collect();
    let enis = inst.network_interfaces().len().max(1);
    let store: usize = info.and_then(|i| i.instance_storage_info()).map_or(0, |s| s.disks().iter().map(|d| d.count().unwrap_or(0).max(0) as usize).sum());
    let ebs = info.and_then(|i| i.ebs_info());
    let max = ebs.and_then(|e| e.maximum_ebs_attachments()).filter(|m| *m > 0).map(|m| m as usize);
    let shared = ebs.and_then(|e| e.attachment_limit_type()).is_none_or(|t| t.as_str() == "shared");
    let nitro = info.and_then(|i| i.hypervisor()).is_some_and(|h| h.as_str() == "nitro");
    let (total, taken, source) = match (max, shared) {
        (Some(m), true) => (m, enis - 1 + store, format!("DescribeInstanceTypes {kind}: {m} slots shared with network interfaces and instance store ({enis} interfaces, {store} instance-store disks)")),
        (Some(m), false) => (m, 0, format!("DescribeInstanceTypes {kind}: {m} slots dedicated to EBS")),
        (None, _) if nitro => (28, enis + store, format!("{kind} is a Nitro instance without an EBS attachment figure: Nitro's 28 slots, shared with {enis} interfaces and {store} instance-store disks")),
        (None, _) => return None,
    };
    // surge's device names bound it too: names in use are the attached volumes'.
    let by_names = taken + attached.len() + DEVICE_NAMES.saturating_sub(attached.len().saturating_sub(1));
    let (total, source) = if by_names < total {
        (by_names, format!("{source}; surge has {DEVICE_NAMES} attachment names (/dev/sdf../dev/sdz, /dev/xvdba../dev/xvdcz), which leaves {by_names}"))
    } else {
        (total, source)
    };
    Some(AttachmentSlots { total, taken_by_others: taken, attached_volumes: attached, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{
        AttachmentLimitType, DiskInfo, EbsInfo, EbsInstanceBlockDevice, InstanceBlockDeviceMapping, InstanceNetworkInterface, InstanceStorageInfo, InstanceType,
        InstanceTypeHypervisor,
    };

    fn instance(kind: &str, volumes: &[&str], enis: usize) -> Instance {
        let mut b = Instance::builder().instance_type(InstanceType::from(kind));
        for (i, v) in volumes.iter().enumerate() {
            let name = if i == 0 { "/dev/xvda".to_string() } else { format!("/dev/sd{}", (b'f' + i as u8 - 1) as char) };
            b = b.block_device_mappings(InstanceBlockDeviceMapping::builder().device_name(name).ebs(EbsInstanceBlockDevice::builder().volume_id(*v).build()).build());
        }
        for _ in 0..enis {
            b = b.network_interfaces(InstanceNetworkInterface::builder().build());
        }
        b.build()
    }

    fn info(max: Option<i32>, limit: Option<&str>, hv: &str, store: i32) -> InstanceTypeInfo {
        let mut ebs = EbsInfo::builder();
        if let Some(m) = max {
            ebs = ebs.maximum_ebs_attachments(m);
        }
        if let Some(l) = limit {
            ebs = ebs.attachment_limit_type(AttachmentLimitType::from(l));
        }
        let mut b = InstanceTypeInfo::builder().ebs_info(ebs.build()).hypervisor(InstanceTypeHypervisor::from(hv));
        if store > 0 {
            b = b.instance_storage_info(InstanceStorageInfo::builder().disks(DiskInfo::builder().count(store).build()).build());
        }
        b.build()
    }

    #[test]
    fn shared_slots_count_extra_interfaces_instance_store_and_attached_volumes() {
        // m5d.large as moto describes m5.large (27, shared), with 2 NVMe disks and 2 interfaces.
        let s = slots(&instance("m5d.large", &["vol-root"], 2), Some(&info(Some(27), Some("shared"), "nitro", 2))).unwrap();
        assert_eq!((s.total, s.taken_by_others), (27, 3), "{s:?}");
        assert!(!s.source.contains("attachment names"), "surge's 73 names do not bound it: {}", s.source);
        assert_eq!(s.free_for(&[]), 23, "27 - 1 more interface - 2 disks - the root volume");
        let s = slots(&instance("m5d.large", &["vol-root"], 2), Some(&info(Some(12), Some("shared"), "nitro", 2))).unwrap();
        assert_eq!((s.total, s.free_for(&[])), (12, 8), "12 - 1 more interface - 2 disks - the root volume");
        // Without the name limit (a dedicated-limit type with few slots): the figure itself.
        let s = slots(&instance("m7i.large", &["vol-root", "vol-a"], 1), Some(&info(Some(8), Some("dedicated"), "nitro", 0))).unwrap();
        assert_eq!((s.total, s.taken_by_others), (8, 0));
        assert_eq!(s.free_for(&["vol-a".into()]), 7, "the stack's own volume counts as free for it");
        assert!(s.source.contains("dedicated"));
        // More dedicated slots than surge has names: the names bound it.
        let s = slots(&instance("u7i-12tb.224xlarge", &["vol-root"], 1), Some(&info(Some(128), Some("dedicated"), "nitro", 0))).unwrap();
        assert_eq!((s.total, s.free_for(&[])), (74, 73), "{s:?}");
        assert!(s.source.contains("73 attachment names"), "{}", s.source);
    }

    #[test]
    fn without_a_figure_nitro_gets_28_shared_slots_and_others_are_unknown() {
        let s = slots(&instance("c5.xlarge", &["vol-root"], 1), Some(&info(None, None, "nitro", 0))).unwrap();
        assert_eq!(s.taken_by_others, 1, "the interface");
        assert!(s.source.contains("Nitro's 28"), "{}", s.source);
        assert!(slots(&instance("m1.small", &["vol-root"], 1), Some(&info(None, None, "xen", 0))).is_none());
        assert!(slots(&instance("m1.small", &["vol-root"], 1), None).is_none());
    }
}
