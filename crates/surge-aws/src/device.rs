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
    #[error(
        "volume {volume} is attached as {device}, and {path} is there but is not that volume ({why}); \
         not opening it: another disk may sit at that name"
    )]
    NotThatVolume { volume: String, device: String, path: PathBuf, why: String },
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

/// What the volume looks like to [`find`]: its id and size.
#[derive(Debug, Clone, Copy)]
pub struct Expect<'a> {
    pub volume_id: &'a str,
    pub size_bytes: u64,
}

/// Whether the block device at `path` (not the by-id link, which names the
/// volume itself) is the volume: an NVMe namespace's serial in sysfs is the
/// volume id without its dash; a device without one (Xen's xvd) must at
/// least have the volume's size. A device sysfs says nothing of is refused:
/// opening the wrong disk read-write would destroy it.
pub fn check_identity(root: &Path, path: &Path, want: Expect<'_>) -> Result<(), String> {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let name = real.file_name().map(|n| n.to_string_lossy().into_owned()).ok_or("no device name")?;
    let sys = root.join("sys/class/block").join(&name);
    let read = |f: &str| std::fs::read_to_string(sys.join(f)).ok().map(|s| s.trim().to_string());
    if let Some(serial) = read("device/serial") {
        let id = want.volume_id.replace('-', "");
        return if serial == id { Ok(()) } else { Err(format!("its serial is {serial:?}, not {id:?}")) };
    }
    let Some(sectors) = read("size") else {
        return Err(format!("{} says nothing of it (no serial, no size)", sys.display()));
    };
    let bytes = sectors.parse::<u64>().map_err(|_| format!("{}/size is {sectors:?}", sys.display()))?.saturating_mul(512);
    if bytes == want.size_bytes {
        Ok(())
    } else {
        Err(format!("it has {bytes} bytes, the volume {}", want.size_bytes))
    }
}

/// Look once: the by-id link, or another candidate whose identity checks
/// ([`check_identity`]). `Err` lists candidates that exist but are another disk.
pub fn find(root: &Path, want: Expect<'_>, device: &str) -> Result<Option<PathBuf>, Vec<(PathBuf, String)>> {
    let mut wrong = Vec::new();
    for (i, c) in candidates(root, want.volume_id, device).iter().enumerate() {
        let Some(p) = resolve(root, c) else { continue };
        // The by-id link is named after the volume id: that is the check.
        if i == 0 {
            return Ok(Some(p));
        }
        match check_identity(root, &p, want) {
            Ok(()) => return Ok(Some(p)),
            Err(why) => wrong.push((p, why)),
        }
    }
    if wrong.is_empty() {
        Ok(None)
    } else {
        Err(wrong)
    }
}

/// Look until the device shows up or `timeout` passes (udev needs a moment
/// after EBS reports the attachment). A candidate that is there but is
/// another disk is never returned; if that is all there is at the end, the
/// error says so.
pub fn wait_for(root: &Path, want: Expect<'_>, device: &str, timeout: Duration, poll: Duration) -> Result<PathBuf, DiscoverError> {
    let start = Instant::now();
    loop {
        let wrong = match find(root, want, device) {
            Ok(Some(p)) => return Ok(p),
            Ok(None) => Vec::new(),
            Err(w) => w,
        };
        if start.elapsed() >= timeout {
            if let Some((path, why)) = wrong.into_iter().next() {
                return Err(DiscoverError::NotThatVolume { volume: want.volume_id.into(), device: device.into(), path, why });
            }
            let looked = candidates(root, want.volume_id, device).iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
            return Err(DiscoverError::Timeout { volume: want.volume_id.into(), device: device.into(), waited: timeout, looked });
        }
        std::thread::sleep(poll);
    }
}

/// The names surge attaches EBS volumes under, in the order it uses them:
/// `/dev/sdf`..`/dev/sdz` (AWS's recommendation for EBS on HVM instances),
/// then `/dev/xvdba`..`/dev/xvdcz` (also valid on HVM): 73 names, more than
/// any instance's attachment slots surge plans for (Nitro's 28 shared).
pub fn device_names() -> impl Iterator<Item = String> {
    let sd = ('f'..='z').map(|l| format!("/dev/sd{l}"));
    let xvd = ['b', 'c'].into_iter().flat_map(|a| ('a'..='z').map(move |b| format!("/dev/xvd{a}{b}")));
    sd.chain(xvd)
}

/// How many names [`device_names`] gives.
pub const DEVICE_NAMES: usize = 21 + 52;

/// The kernel's name for an attachment name (Xen shows `/dev/sdf` as `xvdf`):
/// two names clash when these are equal.
fn kernel_name(name: &str) -> String {
    let n = name.trim_start_matches("/dev/");
    match n.strip_prefix("sd") {
        Some(rest) => format!("xvd{rest}"),
        None => n.to_string(),
    }
}

/// A free device name for AttachVolume, given the names the instance already uses.
pub fn free_device_name(used: &[String]) -> Option<String> {
    let taken: Vec<String> = used.iter().map(|u| kernel_name(u)).collect();
    device_names().find(|d| !taken.contains(&kernel_name(d)))
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

    fn want(volume_id: &str) -> Expect<'_> {
        Expect { volume_id, size_bytes: 1 << 30 }
    }

    /// sysfs of a block device named `name` under the tree: its size in 512-byte
    /// sectors, and an NVMe serial if given.
    fn sysfs(root: &Path, name: &str, bytes: u64, serial: Option<&str>) {
        let d = root.join("sys/class/block").join(name);
        std::fs::create_dir_all(d.join("device")).unwrap();
        std::fs::write(d.join("size"), format!("{}\n", bytes / 512)).unwrap();
        if let Some(s) = serial {
            std::fs::write(d.join("device/serial"), format!("{s}   \n")).unwrap();
        }
    }

    #[test]
    fn nvme_by_id_links_name_the_volume_and_lead_to_the_namespace() {
        let d = tree();
        std::fs::write(d.path().join("dev/nvme2n1"), b"").unwrap();
        symlink("../../nvme2n1", d.path().join("dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0abc")).unwrap();
        assert_eq!(find(d.path(), want("vol-0abc"), "/dev/sdf"), Ok(Some(d.path().join("dev/disk/by-id/../../nvme2n1"))));
        // Another volume's link does not match.
        assert_eq!(find(d.path(), want("vol-0abd"), "/dev/sdg"), Ok(None));
    }

    #[test]
    fn absolute_link_targets_stay_inside_the_root() {
        let d = tree();
        std::fs::write(d.path().join("dev/nvme1n1"), b"").unwrap();
        symlink("/dev/nvme1n1", d.path().join("dev/disk/by-id").join(nvme_link_name("vol-1"))).unwrap();
        assert_eq!(find(d.path(), want("vol-1"), "/dev/sdf"), Ok(Some(d.path().join("dev/nvme1n1"))));
    }

    #[test]
    fn xen_instances_show_sd_names_as_xvd() {
        let d = tree();
        std::fs::write(d.path().join("dev/xvdg"), b"").unwrap();
        sysfs(d.path(), "xvdg", 1 << 30, None);
        assert_eq!(find(d.path(), want("vol-1"), "/dev/sdg"), Ok(Some(d.path().join("dev/xvdg"))));
        assert_eq!(find(d.path(), want("vol-1"), "/dev/sdh"), Ok(None));
    }

    // Issue 38 item 11: without the by-id link, a device at the expected
    // name is opened only once it is shown to be the volume just attached.
    #[test]
    fn a_device_without_a_by_id_link_is_used_only_if_it_is_the_volume() {
        let d = tree();
        // Another disk of another size sits at /dev/xvdf.
        std::fs::write(d.path().join("dev/xvdf"), b"").unwrap();
        sysfs(d.path(), "xvdf", 8 << 30, None);
        let e = find(d.path(), want("vol-1"), "/dev/sdf").unwrap_err();
        assert!(e[0].1.contains("8589934592 bytes"), "{e:?}");
        let e = wait_for(d.path(), want("vol-1"), "/dev/sdf", Duration::from_millis(30), Duration::from_millis(10)).unwrap_err().to_string();
        assert!(e.contains("is not that volume") && e.contains("xvdf"), "{e}");
        // A device sysfs knows nothing of is not trusted either.
        std::fs::write(d.path().join("dev/xvdg"), b"").unwrap();
        assert!(find(d.path(), want("vol-1"), "/dev/sdg").unwrap_err()[0].1.contains("says nothing"));
        // An NVMe namespace at the attach name: its serial decides, not its size.
        std::fs::write(d.path().join("dev/nvme3n1"), b"").unwrap();
        symlink("nvme3n1", d.path().join("dev/sdh")).unwrap();
        sysfs(d.path(), "nvme3n1", 1 << 30, Some("vol0other"));
        assert!(find(d.path(), want("vol-0abc"), "/dev/sdh").unwrap_err()[0].1.contains("serial"));
        sysfs(d.path(), "nvme3n1", 1 << 30, Some("vol0abc"));
        let found = find(d.path(), want("vol-0abc"), "/dev/sdh").unwrap().unwrap();
        assert_eq!(std::fs::canonicalize(found).unwrap(), std::fs::canonicalize(d.path().join("dev/nvme3n1")).unwrap());
    }

    #[test]
    fn a_dangling_link_is_not_a_device() {
        let d = tree();
        symlink("../../nvme9n1", d.path().join("dev/disk/by-id").join(nvme_link_name("vol-1"))).unwrap();
        assert_eq!(find(d.path(), want("vol-1"), "/dev/sdf"), Ok(None));
    }

    #[test]
    fn waiting_sees_a_late_device_and_times_out_naming_where_it_looked() {
        let d = tree();
        let root = d.path().to_path_buf();
        sysfs(d.path(), "xvdf", 1 << 30, None);
        let maker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            std::fs::write(root.join("dev/xvdf"), b"").unwrap();
        });
        let p = wait_for(d.path(), want("vol-1"), "/dev/sdf", Duration::from_secs(10), Duration::from_millis(10)).unwrap();
        maker.join().unwrap();
        assert_eq!(p, d.path().join("dev/xvdf"));
        let e = wait_for(d.path(), want("vol-2"), "/dev/sdk", Duration::from_millis(50), Duration::from_millis(10)).unwrap_err().to_string();
        assert!(e.contains("within 50ms") && e.contains("nvme-Amazon_Elastic_Block_Store_vol2") && e.contains("xvdk"), "{e}");
    }

    #[test]
    fn device_names_skip_those_in_use() {
        assert_eq!(free_device_name(&[]).as_deref(), Some("/dev/sdf"));
        let used = ["/dev/xvda".to_string(), "/dev/sdf".into(), "xvdg".into()];
        assert_eq!(free_device_name(&used).as_deref(), Some("/dev/sdh"));
        let first: Vec<String> = ('f'..='z').map(|l| format!("/dev/sd{l}")).collect();
        assert_eq!(free_device_name(&first).as_deref(), Some("/dev/xvdba"), "past the recommended names");
        let mut xen = first.iter().map(|n| n.replace("/dev/sd", "xvd")).collect::<Vec<_>>();
        xen.push("/dev/xvdba".into());
        assert_eq!(free_device_name(&xen).as_deref(), Some("/dev/xvdbb"), "the kernel's names clash with the attachment names");
        let all: Vec<String> = device_names().collect();
        assert_eq!(all.len(), DEVICE_NAMES);
        assert_eq!(free_device_name(&all), None);
    }
}
