//! The "guest" side of a volume: the NBD export as a file (nbdfuse), a loop
//! device on it (direct I/O, so the loop adds no page cache of its own), and
//! the ext4 file system mounted from it. This machine has no nbd kernel
//! module, so this is the kernel block device path the applications use.
//! Unmounted and detached when dropped.

use super::proc::{sh, Proc};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub struct Guest {
    fuse_dir: PathBuf,
    pub mnt: PathBuf,
    loopdev: Option<String>,
    mounted: bool,
    nbdfuse: Option<Proc>,
}

impl Guest {
    /// Attach `uri` under `dir` and mount it on `dir/mnt`.
    pub fn attach(uri: &str, dir: &Path) -> anyhow::Result<Guest> {
        let fuse_dir = dir.join("fuse");
        let mnt = dir.join("mnt");
        std::fs::create_dir_all(&fuse_dir)?;
        std::fs::create_dir_all(&mnt)?;
        let mut g = Guest { fuse_dir: fuse_dir.clone(), mnt, loopdev: None, mounted: false, nbdfuse: None };
        let mut p = Proc::spawn("nbdfuse", Command::new("nbdfuse").arg(&fuse_dir).arg(uri), &dir.join("nbdfuse.log"))?;
        p.wait_for_path(&fuse_dir.join("nbd"), Duration::from_secs(30))?;
        g.nbdfuse = Some(p);
        let out = sh(Command::new("losetup").args(["--find", "--show", "--direct-io=on"]).arg(fuse_dir.join("nbd")))?;
        g.loopdev = Some(String::from_utf8_lossy(&out.stdout).trim().to_string());
        g.mount()?;
        Ok(g)
    }

    pub fn mount(&mut self) -> anyhow::Result<()> {
        let dev = self.loopdev.as_ref().expect("attached");
        sh(Command::new("mount").args(["-t", "ext4", dev]).arg(&self.mnt))?;
        self.mounted = true;
        Ok(())
    }

    pub fn umount(&mut self) -> anyhow::Result<()> {
        if self.mounted {
            sh(Command::new("umount").arg(&self.mnt))?;
            self.mounted = false;
        }
        Ok(())
    }

    /// Unmount and mount again: the guest's page cache for the volume is gone.
    pub fn remount(&mut self) -> anyhow::Result<()> {
        self.umount()?;
        self.mount()
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if self.mounted && Command::new("umount").arg(&self.mnt).status().map(|s| !s.success()).unwrap_or(true) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        if let Some(dev) = self.loopdev.take() {
            let _ = Command::new("losetup").args(["-d", &dev]).status();
        }
        // The loop device lets go of the FUSE file asynchronously: retry a while.
        for _ in 0..50 {
            if Command::new("fusermount3").arg("-u").arg(&self.fuse_dir).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.nbdfuse.take();
    }
}
