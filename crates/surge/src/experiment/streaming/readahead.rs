//! The cow layer's read-ahead default checked on workloads that played no
//! part in choosing it (issue 40 item 13). The default (a window from 1 MiB
//! into a stream of misses, doubling from 128 KiB to 512 KiB) was chosen on
//! the boot set: reading ahead sooner made the boot fetch 153 MB from the base
//! for its 110 MB (`surge_block::cow::readahead`). Here the default runs
//! beside no read-ahead and a window 8x larger, on the boot set and on two
//! workloads of other shapes:
//! - `scan`: one reader reading a subtree's files whole, in path order (a
//!   backup or a virus scan; files of every size, mostly small);
//! - `large`: files over 4 MiB read whole one after another by one reader (a
//!   program loading its data; the boot set has no file that large).
//!
//! Every run is a fresh surge-cow volume (nothing cached on either side),
//! timed from the first read to the last, with the bytes the storage node
//! sent over the link in that time; what was read is compared with its source.

use super::proc::shell;
use super::{guest, image, report, work, Rig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

/// The settings compared: name, and the cow options they add.
pub const SETTINGS: [(&str, &str); 3] = [("off", ",readahead=0"), ("default", ""), ("4MiB", ",readahead=4MiB")];

/// Files above this size are the `large` workload's (the boot set stops there).
const LARGE: u64 = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Boot,
    Scan,
    Large,
}

impl Workload {
    pub const ALL: [Workload; 3] = [Workload::Boot, Workload::Scan, Workload::Large];

    fn name(self) -> &'static str {
        match self {
            Workload::Boot => "boot",
            Workload::Scan => "scan",
            Workload::Large => "large",
        }
    }

    fn describe(self) -> String {
        match self {
            Workload::Boot => format!("the boot set, {} `cat`s at once (the calibration workload)", work::BOOT_READERS),
            Workload::Scan => "a subtree's files read whole in path order by one `cat` at a time (not used in calibration)".into(),
            Workload::Large => format!("files over {} MiB read whole one after another (not used in calibration)", LARGE >> 20),
        }
    }

    fn readers(self) -> u32 {
        if self == Workload::Boot {
            work::BOOT_READERS
        } else {
            1
        }
    }
}

/// One timed run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RaSample {
    pub workload: Workload,
    pub setting: String,
    pub round: usize,
    /// Bytes of files read.
    pub bytes: u64,
    pub seconds: f64,
    /// Bytes the storage node sent while the files were read.
    pub link_bytes: u64,
}

/// The files of each workload, and their list files for `xargs -0`.
struct Sets {
    files: BTreeMap<Workload, Vec<(PathBuf, u64)>>,
    lists: BTreeMap<Workload, PathBuf>,
}

/// `scan`: a run of consecutive files from the middle of the tree, none in
/// the boot set; `large`: the large files after that run. About `bytes` each.
fn pick(img: &image::BaseImage, bytes: u64) -> (Vec<(PathBuf, u64)>, Vec<(PathBuf, u64)>) {
    let in_boot = |p: &PathBuf| img.boot.iter().any(|(b, _)| b == p);
    let mid = img.chosen.len() / 2;
    let mut scan = Vec::new();
    let mut total = 0;
    let mut end = img.chosen.len();
    for (i, (p, len)) in img.chosen.iter().enumerate().skip(mid) {
        if total >= bytes {
            end = i;
            break;
        }
        if *len > 0 && !in_boot(p) {
            scan.push((p.clone(), *len));
            total += len;
        }
    }
    let mut large = Vec::new();
    total = 0;
    // After the scan's run, wrapping round to the start of the tree.
    for (p, len) in img.chosen[end..].iter().chain(&img.chosen[..mid]) {
        if total >= bytes {
            break;
        }
        if *len > LARGE {
            large.push((p.clone(), *len));
            total += len;
        }
    }
    (scan, large)
}

fn sets(rig: &Rig, bytes: u64) -> anyhow::Result<Sets> {
    let (scan, large) = pick(&rig.image, bytes);
    anyhow::ensure!(!large.is_empty(), "the image holds no file over {} MiB for the read-ahead check", LARGE >> 20);
    let mut files = BTreeMap::new();
    let mut lists = BTreeMap::new();
    lists.insert(Workload::Boot, rig.boot_list.clone());
    files.insert(Workload::Boot, rig.image.boot.clone());
    for (w, f) in [(Workload::Scan, scan), (Workload::Large, large)] {
        let list = rig.work.join(format!("{}.list", w.name()));
        image::write_list(&f, &list)?;
        lists.insert(w, list);
        files.insert(w, f);
    }
    Ok(Sets { files, lists })
}

/// Runs of the check to make (for the progress bar).
pub fn runs(reps: usize) -> u64 {
    (reps * Workload::ALL.len() * SETTINGS.len()) as u64
}

/// Every workload under every setting, `reps` rounds, the settings' order
/// rotated each round.
pub fn run(rig: &mut Rig, bar: &indicatif::ProgressBar) -> anyhow::Result<Vec<RaSample>> {
    let sets = sets(rig, rig.plan.readahead_check_bytes)?;
    let mut out = Vec::new();
    for round in 0..rig.plan.reps {
        for w in Workload::ALL {
            let mut order = SETTINGS.to_vec();
            order.rotate_left(round % SETTINGS.len());
            for setting in order {
                bar.set_message(format!("read-ahead check (round {}): {} with read-ahead {}", round + 1, w.name(), setting.0));
                let s = run_one(rig, w, setting, round, &sets)?;
                report::say(bar, format!("  read-ahead {:<8} {:<6} {:>6.2} s, {:>6.1} MB over the link", setting.0, w.name(), s.seconds, s.link_bytes as f64 / 1e6));
                out.push(s);
                bar.inc(1);
            }
        }
    }
    Ok(out)
}

fn run_one(rig: &mut Rig, w: Workload, (setting, opts): (&str, &str), round: usize, sets: &Sets) -> anyhow::Result<RaSample> {
    let dir = rig.work.join(format!("ra{round}-{}-{setting}", w.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let (mut server, uri) = super::serve_cow(rig, &dir, opts)?;
    super::ready(&mut server, &dir.join("vm.sock"))?;
    let guest = guest::Guest::attach(&uri, &dir)?;
    shell("sync")?;
    let tx0 = rig.link_tx_bytes();
    let t = Instant::now();
    work::read_files(&guest.mnt, &sets.lists[&w], w.readers())?;
    let seconds = t.elapsed().as_secs_f64();
    let link_bytes = rig.link_tx_bytes().saturating_sub(tx0);
    let bytes = image::verify_files(&rig.image, &guest.mnt, &sets.files[&w])?;
    drop(guest);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(RaSample { workload: w, setting: setting.into(), round, bytes, seconds, link_bytes })
}

fn median(v: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let mut v: Vec<f64> = v.collect();
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (report::median(&mut v), lo, hi)
}

/// Median seconds of each (workload, setting).
fn medians(samples: &[RaSample]) -> BTreeMap<(Workload, &str), f64> {
    let mut m = BTreeMap::new();
    for w in Workload::ALL {
        for (s, _) in SETTINGS {
            let runs = samples.iter().filter(|x| x.workload == w && x.setting == s);
            if runs.clone().next().is_some() {
                m.insert((w, s), median(runs.map(|x| x.seconds)).0);
            }
        }
    }
    m
}

/// How the default did on `w`: its time against the best setting's, as a
/// fraction slower (0 when it is the best).
pub fn default_behind_best(samples: &[RaSample], w: Workload) -> Option<(f64, &'static str)> {
    let m = medians(samples);
    let d = *m.get(&(w, "default"))?;
    let (best, name) = SETTINGS.iter().filter_map(|(s, _)| m.get(&(w, *s)).map(|v| (*v, *s))).min_by(|a, b| a.0.total_cmp(&b.0))?;
    Some((d / best - 1.0, name))
}

/// The default's median link bytes on `w` against read-ahead off's, as a
/// fraction more (what reading ahead costs on the link).
pub fn default_link_over_off(samples: &[RaSample], w: Workload) -> Option<f64> {
    let link = |set: &str| {
        let runs: Vec<f64> = samples.iter().filter(|x| x.workload == w && x.setting == set).map(|x| x.link_bytes as f64).collect();
        (!runs.is_empty()).then(|| median(runs.into_iter()).0)
    };
    Some(link("default")? / link("off")? - 1.0)
}

/// results.json's `readahead_check`.
pub fn to_json(samples: &[RaSample]) -> serde_json::Value {
    let mut workloads = serde_json::Map::new();
    for w in Workload::ALL {
        let mut o = serde_json::Map::new();
        for (s, _) in SETTINGS {
            let runs: Vec<&RaSample> = samples.iter().filter(|x| x.workload == w && x.setting == s).collect();
            if runs.is_empty() {
                continue;
            }
            let (sec, lo, hi) = median(runs.iter().map(|x| x.seconds));
            let (link, _, _) = median(runs.iter().map(|x| x.link_bytes as f64));
            o.insert(s.into(), serde_json::json!({ "seconds": sec, "spread": [lo, hi], "link_bytes": link, "bytes": runs[0].bytes }));
        }
        if let Some((behind, best)) = default_behind_best(samples, w) {
            o.insert("default_behind_best".into(), serde_json::json!(behind));
            o.insert("best".into(), serde_json::json!(best));
        }
        if let Some(more) = default_link_over_off(samples, w) {
            o.insert("default_link_over_off".into(), serde_json::json!(more));
        }
        workloads.insert(w.name().into(), serde_json::Value::Object(o));
    }
    serde_json::json!({ "settings": SETTINGS.iter().map(|(s, o)| serde_json::json!({"name": s, "cow_options": o.trim_start_matches(',')})).collect::<Vec<_>>(), "workloads": workloads, "samples": samples })
}

/// report.md's section.
pub fn section(s: &mut String, samples: &[RaSample]) {
    if samples.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## Read-ahead on workloads it was not tuned on (median [min, max]; MB over the link)\n");
    let _ = writeln!(s, "The cow read-ahead default (a window from 1 MiB into a stream, 128 KiB doubling to 512 KiB) was chosen on the boot set. Each run is a fresh surge-cow volume, timed from the first read to the last.\n");
    let _ = writeln!(s, "| workload | MiB read | read-ahead off (`readahead=0`) | default | 4 MiB (`readahead=4MiB`) | the default |");
    let _ = writeln!(s, "|---|---:|---|---|---|---|");
    for w in Workload::ALL {
        let runs = |set: &'static str| samples.iter().filter(move |x| x.workload == w && x.setting == set);
        let Some(first) = runs("default").next() else { continue };
        let _ = write!(s, "| {} | {:.0} |", w.name(), first.bytes as f64 / (1 << 20) as f64);
        for (set, _) in SETTINGS {
            let (sec, lo, hi) = median(runs(set).map(|x| x.seconds));
            let (link, _, _) = median(runs(set).map(|x| x.link_bytes as f64));
            let _ = write!(s, " {sec:.2} s [{lo:.2}, {hi:.2}], {:.0} MB |", link / 1e6);
        }
        let mut verdict = match default_behind_best(samples, w) {
            Some((_, "default")) => "the fastest".to_string(),
            Some((behind, best)) => format!("{:.1} % slower than {best}", behind * 100.0),
            None => "-".into(),
        };
        if let Some(more) = default_link_over_off(samples, w) {
            let _ = write!(verdict, "; {:+.1} % link bytes against off", more * 100.0);
        }
        let _ = writeln!(s, " {verdict} |");
    }
    let _ = writeln!(s);
    for w in Workload::ALL {
        let _ = writeln!(s, "- `{}`: {}.", w.name(), w.describe());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(w: Workload, setting: &str, seconds: f64) -> RaSample {
        RaSample { workload: w, setting: setting.into(), round: 0, bytes: 1 << 20, seconds, link_bytes: (seconds * 1e6) as u64 }
    }

    #[test]
    fn the_default_is_judged_against_the_best_setting_of_each_workload() {
        let v = vec![
            sample(Workload::Boot, "off", 2.0),
            sample(Workload::Boot, "default", 1.0),
            sample(Workload::Boot, "4MiB", 1.5),
            sample(Workload::Large, "off", 4.0),
            sample(Workload::Large, "default", 3.0),
            sample(Workload::Large, "4MiB", 2.0),
        ];
        assert_eq!(default_behind_best(&v, Workload::Boot), Some((0.0, "default")));
        let (behind, best) = default_behind_best(&v, Workload::Large).unwrap();
        assert_eq!(best, "4MiB");
        assert!((behind - 0.5).abs() < 1e-9);
        assert_eq!(default_behind_best(&v, Workload::Scan), None);
        let mut s = String::new();
        section(&mut s, &v);
        assert!(s.contains("| large | 1 |") && s.contains("50.0 % slower than 4MiB"), "{s}");
        assert!(s.contains("the fastest; -50.0 % link bytes against off"), "{s}");
        assert!((default_link_over_off(&v, Workload::Large).unwrap() + 0.25).abs() < 1e-9);
        let j = to_json(&v);
        assert_eq!(j["workloads"]["large"]["best"], "4MiB");
    }

    #[test]
    fn the_scan_and_large_sets_leave_out_the_boot_set_and_each_other() {
        let chosen: Vec<(PathBuf, u64)> = (0..40).map(|i| (PathBuf::from(format!("usr/f{i:02}")), if i % 5 == 0 { 8 << 20 } else { 1 << 20 })).collect();
        let boot = vec![chosen[21].clone(), chosen[3].clone()];
        let img = image::BaseImage { path: "x".into(), size: 0, files: 40, file_bytes: 0, boot, boot_bytes: 0, chosen, staged: "s".into() };
        let (scan, large) = pick(&img, 12 << 20);
        let names = |v: &[(PathBuf, u64)]| v.iter().map(|(p, _)| p.display().to_string()).collect::<Vec<_>>();
        assert_eq!(names(&scan), ["usr/f20", "usr/f22", "usr/f23", "usr/f24", "usr/f25"]);
        assert_eq!(names(&large), ["usr/f30", "usr/f35"]);
    }
}
