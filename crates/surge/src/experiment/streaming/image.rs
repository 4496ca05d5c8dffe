//! The base image: a real ext4 file system made with `mkfs.ext4 -d` from a
//! directory of real files (programs, libraries and data of this machine's
//! /usr, hard-linked into a staging tree, so nothing is copied twice), and the
//! "boot set": files spread over the tree that a booting system would read.

use super::proc::sh;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct BaseImage {
    pub path: PathBuf,
    pub size: u64,
    pub files: u64,
    pub file_bytes: u64,
    /// Paths relative to the file system root, and their sizes.
    pub boot: Vec<(PathBuf, u64)>,
    pub boot_bytes: u64,
    /// Every file in the image, in path order, with its size.
    pub chosen: Vec<(PathBuf, u64)>,
    /// Where the files came from (to verify what a volume returns).
    pub staged: PathBuf,
}

const SOURCES: &[&str] = &["/usr/lib", "/usr/share", "/usr/bin", "/usr/sbin", "/usr/libexec"];

/// Regular files under `root`, sorted by path (deterministic), with sizes.
fn walk(root: &Path, out: &mut Vec<(PathBuf, u64)>) {
    let Ok(rd) = std::fs::read_dir(root) else { return };
    let mut entries: Vec<_> = rd.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            walk(&e.path(), out);
        } else if ft.is_file() {
            if let Ok(m) = e.metadata() {
                out.push((e.path(), m.len()));
            }
        }
    }
}

/// A stable pseudo-random pick (FNV-1a of the path).
fn picked(path: &Path, one_in: u64) -> bool {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in path.as_os_str().as_encoded_bytes() {
        h = (h ^ *b as u64).wrapping_mul(0x100_0000_01b3);
    }
    h.is_multiple_of(one_in)
}

/// Stage about `file_bytes` of real files, make an ext4 image of `size`
/// bytes from them, and pick a boot set of about `boot_bytes`.
pub fn build(dir: &Path, size: u64, file_bytes: u64, boot_bytes: u64) -> anyhow::Result<BaseImage> {
    let staged = dir.join("staged");
    let _ = std::fs::remove_dir_all(&staged);
    let mut all = Vec::new();
    for s in SOURCES {
        walk(Path::new(s), &mut all);
    }
    let mut total = 0;
    let mut chosen = Vec::new();
    for (src, len) in all {
        if total >= file_bytes {
            break;
        }
        let rel = src.strip_prefix("/").expect("absolute").to_path_buf();
        let dst = staged.join(&rel);
        std::fs::create_dir_all(dst.parent().expect("has a parent"))?;
        if std::fs::hard_link(&src, &dst).is_err() && std::fs::copy(&src, &dst).is_err() {
            continue; // unreadable: leave it out
        }
        total += len;
        chosen.push((rel, len));
    }
    anyhow::ensure!(total >= file_bytes / 2, "found only {total} bytes of files under {SOURCES:?}");
    // Boot set: small and middle-sized files from all over the tree.
    let mut boot = Vec::new();
    let mut boot_total = 0;
    for one_in in [8, 4, 2, 1] {
        for (rel, len) in &chosen {
            if boot_total >= boot_bytes {
                break;
            }
            if *len > 0 && *len <= 4 << 20 && picked(rel, one_in) && !boot.iter().any(|(p, _)| p == rel) {
                boot.push((rel.clone(), *len));
                boot_total += len;
            }
        }
    }
    let path = dir.join("base.img");
    let _ = std::fs::remove_file(&path);
    std::fs::File::create(&path)?.set_len(size)?;
    sh(Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096", "-L", "base", "-d"]).arg(&staged).arg(&path))?;
    Ok(BaseImage { path, size, files: chosen.len() as u64, file_bytes: total, boot, boot_bytes: boot_total, chosen, staged })
}

/// Write the boot set as NUL-separated relative paths (for `xargs -0`).
pub fn write_boot_list(img: &BaseImage, path: &Path) -> anyhow::Result<()> {
    write_list(&img.boot, path)
}

/// Write `files` as NUL-separated relative paths (for `xargs -0`).
pub fn write_list(files: &[(PathBuf, u64)], path: &Path) -> anyhow::Result<()> {
    let mut b = Vec::new();
    for (p, _) in files {
        b.extend_from_slice(p.as_os_str().as_encoded_bytes());
        b.push(0);
    }
    std::fs::write(path, b)?;
    Ok(())
}

/// Every boot file on the mounted volume equals its source.
pub fn verify_boot_set(img: &BaseImage, mnt: &Path) -> anyhow::Result<u64> {
    verify_files(img, mnt, &img.boot)
}

/// Every one of `files` on the mounted volume equals its source.
pub fn verify_files(img: &BaseImage, mnt: &Path, files: &[(PathBuf, u64)]) -> anyhow::Result<u64> {
    let mut n = 0;
    for (rel, _) in files {
        let got = std::fs::read(mnt.join(rel))?;
        let want = std::fs::read(img.staged.join(rel))?;
        anyhow::ensure!(got == want, "{} differs on the volume from its source", rel.display());
        n += got.len() as u64;
    }
    Ok(n)
}
