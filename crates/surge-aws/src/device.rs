//! Finding an attached EBS volume inside the instance.
//!
//! Nitro instances expose EBS volumes as NVMe namespaces; udev names them
//! `/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123...` (the volume id
//! without its dash), which is the only reliable link between a volume and
//! its `/dev/nvmeXn1` (the kernel numbers them in attach order). Xen instances
//! show the device name given at attach, `/dev/sdf`, as `/dev/xvdf`. All paths
//! are taken under `root`, so tests feed a fake tree.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error(
        "volume {volume} is attached as {device} but no block device appeared within {waited:?} \
         (looked for {looked}); is udev running, and is this the instance it was attached to?"
    )]
    Timeout { volume: String, device: String, waited: Duration, looked: String },
}

/// The by-id link name of an EBS volume on NVMe.
pub fn nvme_link_name(volume_id: &str) -> String {
    format!("nvme-Amazon_Elastic_Block_Store_{}", volume_id.replace('-', ""))
}

/// Where the device of `volume_id`, attached as `device` (e.g. `/dev/sdf`), may
/// appear, best first.
pub fn candidates(root: &Path, volume_id: &str, device: &str) -> Vec<PathBuf> {
    let under = |p: &str| root.join(p.trim_start_matches('/'));
    let mut out = vec![under("/dev/disk/by-id").join(nvme_link_name(volume_id))];
    if let Some(letter) = device.strip_prefix("/dev/sd") {
        out.push(under(&format!("/dev/xvd{letter}")));
    }
    out.push(under(device));
    out
}

/// A link target under `root`: absolute targets are re-rooted (a fake tree's
/// `/dev/nvme1n1` means `root/dev/nvme1n1`), relative ones are joined as is.
fn resolve(root: &Path, link: &Path) -> Option<PathBuf> {
    let meta = std::fs::symlink_metadata(link).ok()?;
    if !meta.file_type().is_symlink() {
        return Some(link.to_path_buf());
    }
    let target = std::fs::read_link(link).ok()?;
    let path = if target.is_absolute() {
        root.join(target.strip_prefix("/").ok()?)
    } else {
        link.parent()?.join(target)
    };
    path.exists().then_some(path)
}

/// Look once.
pub fn find(root: &Path, volume_id: &str, device: &str) -> Option<PathBuf> {
    candidates(root, volume_id, device).iter().find_map(|c| resolve(root, c))
}

/// Look until the device shows up or `timeout` passes (udev needs a moment
/// after EBS reports the attachment).
pub fn wait_for(root: &Path, volume_id: &str, device: &str, timeout: Duration, poll: Duration) -> Result<PathBuf, DiscoverError> {
    let start = Instant::now();
    loop {
        if let Some(p) = find(root, volume_id, device) {
            return Ok(p);
        }
        if start.elapsed() >= timeout {
            let looked = candidates(root, volume_id, device).iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
            return Err(DiscoverError::Timeout { volume: volume_id.into(), device: device.into(), waited: timeout, looked });
        }
        std::thread::sleep(poll);
    }
}

/// A free device name for AttachVolume (`/dev/sdf` .. `/dev/sdp`, as AWS
/// recommends for EBS), given the names the instance already uses.
pub fn free_device_name(used: &[String]) -> Option<String> {
    let taken = |l: char| {
        used.iter().any(|u| {
            let u = u.trim_start_matches("/dev/");
            u == format!("sd{l}") || u == format!("xvd{l}")
        })
    };
    ('f'..='p').find(|&l| !taken(l)).map(|l| format!("/dev/sd{l}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("dev/disk/by-id")).unwrap();
        d
    }

    #[test]
    fn nvme_by_id_links_name_the_volume_and_lead_to_the_namespace() {
        let d = tree();
        std::fs::write(d.path().join("dev/nvme2n1"), b"").unwrap();
        symlink("../../nvme2n1", d.path().join("dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0abc")).unwrap();
        assert_eq!(find(d.path(), "vol-0abc", "/dev/sdf"), Some(d.path().join("dev/disk/by-id/../../nvme2n1")));
        // Another volume's link does not match.
        assert_eq!(find(d.path(), "vol-0abd", "/dev/sdg"), None);
    }

    #[test]
    fn absolute_link_targets_stay_inside_the_root() {
        let d = tree();
        std::fs::write(d.path().join("dev/nvme1n1"), b"").unwrap();
        symlink("/dev/nvme1n1", d.path().join("dev/disk/by-id").join(nvme_link_name("vol-1"))).unwrap();
        assert_eq!(find(d.path(), "vol-1", "/dev/sdf"), Some(d.path().join("dev/nvme1n1")));
    }

    #[test]
    fn xen_instances_show_sd_names_as_xvd() {
        let d = tree();
        std::fs::write(d.path().join("dev/xvdg"), b"").unwrap();
        assert_eq!(find(d.path(), "vol-1", "/dev/sdg"), Some(d.path().join("dev/xvdg")));
        assert_eq!(find(d.path(), "vol-1", "/dev/sdh"), None);
    }

    #[test]
    fn a_dangling_link_is_not_a_device() {
        let d = tree();
        symlink("../../nvme9n1", d.path().join("dev/disk/by-id").join(nvme_link_name("vol-1"))).unwrap();
        assert_eq!(find(d.path(), "vol-1", "/dev/sdf"), None);
    }

    #[test]
    fn waiting_sees_a_late_device_and_times_out_naming_where_it_looked() {
        let d = tree();
        let root = d.path().to_path_buf();
        let maker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::write(root.join("dev/xvdf"), b"").unwrap();
        });
        let p = wait_for(d.path(), "vol-1", "/dev/sdf", Duration::from_secs(10), Duration::from_millis(10)).unwrap();
        maker.join().unwrap();
        assert_eq!(p, d.path().join("dev/xvdf"));
        let e = wait_for(d.path(), "vol-2", "/dev/sdk", Duration::from_millis(50), Duration::from_millis(10)).unwrap_err().to_string();
        assert!(e.contains("within 50ms") && e.contains("nvme-Amazon_Elastic_Block_Store_vol2") && e.contains("xvdk"), "{e}");
    }

    #[test]
    fn device_names_skip_those_in_use() {
        assert_eq!(free_device_name(&[]).as_deref(), Some("/dev/sdf"));
        let used = ["/dev/xvda".to_string(), "/dev/sdf".into(), "xvdg".into()];
        assert_eq!(free_device_name(&used).as_deref(), Some("/dev/sdh"));
        let all: Vec<String> = ('f'..='p').map(|l| format!("/dev/sd{l}")).collect();
        assert_eq!(free_device_name(&all), None);
    }
}
