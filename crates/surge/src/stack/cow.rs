//! Streaming volumes, the paper's two kinds:
//!
//! - `cow:` (alias `ephemeral:`): a read-only base, usually a remote NBD export
//!   streamed on demand, under a local copy-on-write overlay file
//!   (`surge_block::cow`), with optional copy-on-read and a background stream
//!   job that makes the overlay independent of the base.
//!   `cow:base=nbd://storage:10809/base,overlay=file:/var/lib/surge/vm1.ovl`
//!   plus `granularity=4KiB`, `cor`, `readahead=512KiB` (largest read-ahead window
//!   for sequential base reads; 0 = none), `stream`, `rate=50MB/s`, `cache=on|off`
//!   (host page cache for the overlay: off = O_DIRECT), `fresh` (forget an
//!   existing overlay), and for a remote base `connections=N`, `retry=60s`,
//!   `timeout=60s`. The base may also be `file:PATH` (opened read-only).
//! - `remote:` (alias `persistent:`): a remote raw volume used directly,
//!   `remote:nbd://storage:10809/vm1[,connections=N,retry=60s,timeout=60s]`.
//!
//! Control targets: `NAME/cow` (blocks per state, bytes fetched, the stream
//! job's progress and ETA; `surge set NAME/cow cor=on|off`, `rate=50MB/s`,
//! `stream=start|stop`) and `NAME/remote` (connections, retries, reconnects).

use crate::control::Controllable;
use crate::stack::{parse_rate, parse_size, BuildContext, Built, Opts, SpecError};
use parking_lot::Mutex;
use serde_json::json;
use std::path::Path;
use std::sync::{Arc, Weak};
use surge_block::cow::{CowConfig, CowDev, StreamConfig, StreamJob, StreamState};
use surge_block::{BlockDev, Clock, FileDev, FileOptions};
use surge_nbd::{NbdUri, RemoteDev, RemoteOptions};

fn err(kind: &str, msg: impl Into<String>) -> SpecError {
    SpecError::Args { kind: kind.into(), msg: msg.into() }
}

/// The options shared by every remote device (`connections`, `retry`, `timeout`).
fn remote_options(kind: &str, o: &mut Opts) -> Result<RemoteOptions, SpecError> {
    let mut r = RemoteOptions::default();
    if let Some(n) = o.take("connections") {
        r.connections = n.parse().ok().filter(|&n: &usize| (1..=64).contains(&n)).ok_or_else(|| err(kind, format!("connections={n}: expected 1..64")))?;
    }
    let dur = |k: &str, v: String| surge_block::units::parse_duration(&v).map_err(|e| err(kind, format!("{k}={v}: {e}")));
    if let Some(v) = o.take("retry") {
        r.reconnect_timeout = dur("retry", v)?;
    }
    if let Some(v) = o.take("timeout") {
        r.request_timeout = dur("timeout", v)?;
    }
    Ok(r)
}

fn open_remote(kind: &str, uri: &str, opts: RemoteOptions) -> Result<Arc<RemoteDev>, SpecError> {
    let parsed: NbdUri = uri.parse().map_err(|e: surge_nbd::remote::UriError| err(kind, e.to_string()))?;
    RemoteDev::open(&parsed, opts).map(Arc::new).map_err(|e| err(kind, format!("cannot open the remote export: {e}")))
}

/// `remote:URI[,connections=N][,retry=DUR][,timeout=DUR]`
pub fn build_remote(name: &str, args: &str) -> Result<Built, SpecError> {
    // The URI may hold '=' (…?socket=PATH): it runs up to the first comma.
    let (uri, rest) = args.split_once(',').unwrap_or((args, ""));
    if uri.trim().is_empty() {
        return Err(err("remote", "missing URI: write remote:nbd://HOST:PORT/EXPORT[,options]"));
    }
    let mut o = Opts::parse("remote", rest)?;
    let ropts = remote_options("remote", &mut o)?;
    o.finish(&["connections", "retry", "timeout"])?;
    let dev = open_remote("remote", uri.trim(), ropts)?;
    let control = Arc::new(RemoteControl { target: format!("{name}/remote"), dev: Arc::downgrade(&dev) });
    Ok(Built {
        description: format!("remote volume {}", dev.uri()),
        detail: json!({ "uri": dev.uri().to_string() }),
        dev,
        controls: vec![control],
    })
}

/// `cow:base=URI|file:PATH,overlay=[file:]PATH[,...]`
pub fn build_cow(name: &str, args: &str, ctx: &BuildContext) -> Result<Built, SpecError> {
    let mut o = Opts::parse("cow", args)?;
    let base_spec = o.take("base").ok_or_else(|| err("cow", "missing base=URI (nbd://HOST:PORT/EXPORT, nbd+unix:///EXPORT?socket=PATH, nbds://...) or base=file:PATH"))?;
    let overlay_spec = o.take("overlay").ok_or_else(|| err("cow", "missing overlay=file:PATH (the local copy-on-write file, created if missing)"))?;
    let mut cfg = CowConfig::default();
    if let Some(g) = o.take_size("granularity")? {
        cfg.granularity = g;
    }
    cfg.copy_on_read = o.flag("cor")?;
    if let Some(w) = o.take_size("readahead")? {
        cfg.readahead.max_window = w;
    }
    let stream = o.flag("stream")?;
    let rate = o.take_rate("rate")?;
    let direct = match o.take("cache").as_deref() {
        None | Some("on") => false,
        Some("off") => true,
        Some(v) => return Err(err("cow", format!("cache={v}: expected on (host page cache) or off (O_DIRECT)"))),
    };
    let fresh = o.flag("fresh")?;
    let ropts = remote_options("cow", &mut o)?;
    o.finish(&["base", "overlay", "granularity", "cor", "readahead", "stream", "rate", "cache", "fresh", "connections", "retry", "timeout"])?;

    let overlay_path = ctx.resolve(overlay_spec.strip_prefix("file:").unwrap_or(&overlay_spec));
    if fresh {
        let _ = std::fs::remove_file(&overlay_path);
    }
    // An overlay that no longer needs its base opens without it.
    if let Some(dev) = open_independent(&overlay_path, direct, &cfg)? {
        let dev = Arc::new(dev);
        return Ok(assemble(name, dev, None, &base_spec, &overlay_path, direct, None, ctx.clock.clone()));
    }
    let (base, remote): (Arc<dyn BlockDev>, Option<Weak<RemoteDev>>) = match base_spec.strip_prefix("file:") {
        Some(p) => {
            let path = ctx.resolve(p);
            let f = FileDev::open(&path, &FileOptions { read_only: true, ..Default::default() })
                .map_err(|source| SpecError::Open { kind: "cow".into(), path: path.clone(), source })?;
            (Arc::new(f), None)
        }
        None => {
            let r = open_remote("cow", &base_spec, RemoteOptions { read_only: true, ..ropts })?;
            let weak = Arc::downgrade(&r);
            (r, Some(weak))
        }
    };
    let need = CowDev::overlay_size_for(base.size(), &cfg);
    let overlay = open_overlay(&overlay_path, need, direct)?;
    let dev = CowDev::open_or_create(Some(base), overlay, &cfg).map_err(|e| err("cow", format!("{}: {e}", overlay_path.display())))?;
    let dev = Arc::new(dev);
    let job = stream.then(|| StreamConfig { rate, ..StreamConfig::default() });
    Ok(assemble(name, dev, remote, &base_spec, &overlay_path, direct, job, ctx.clock.clone()))
}

/// The overlay file, created sparse (or grown) to `size` bytes.
fn open_overlay(path: &Path, size: u64, direct: bool) -> Result<Arc<dyn BlockDev>, SpecError> {
    let open_err = |source| SpecError::Open { kind: "cow".into(), path: path.to_path_buf(), source };
    if let Ok(m) = std::fs::metadata(path) {
        if m.len() < size {
            std::fs::OpenOptions::new().write(true).open(path).and_then(|f| f.set_len(size)).map_err(open_err)?;
        }
    }
    let f = FileDev::open(path, &FileOptions { direct, create_size: Some(size), read_only: false }).map_err(open_err)?;
    Ok(Arc::new(f))
}

/// Open the overlay without a base if it says it no longer needs one.
fn open_independent(path: &Path, direct: bool, cfg: &CowConfig) -> Result<Option<CowDev>, SpecError> {
    if !path.exists() {
        return Ok(None);
    }
    let f = FileDev::open(path, &FileOptions { direct, ..Default::default() }).map_err(|source| SpecError::Open { kind: "cow".into(), path: path.to_path_buf(), source })?;
    Ok(CowDev::open(None, Arc::new(f), cfg).ok())
}

#[allow(clippy::too_many_arguments)]
fn assemble(
    name: &str,
    dev: Arc<CowDev>,
    remote: Option<Weak<RemoteDev>>,
    base_spec: &str,
    overlay: &Path,
    direct: bool,
    stream: Option<StreamConfig>,
    clock: Arc<dyn Clock>,
) -> Built {
    let control = Arc::new(CowControl {
        target: format!("{name}/cow"),
        dev: dev.clone(),
        remote,
        stream: Mutex::new(None),
        stream_cfg: Mutex::new(stream.clone().unwrap_or_default()),
        clock,
    });
    if stream.is_some() && !dev.is_independent() {
        control.start_stream();
    }
    let detail = json!({
        "base": base_spec,
        "overlay": overlay,
        "granularity": dev.granularity(),
        "copy_on_read": dev.copy_on_read(),
        "page_cache": !direct,
    });
    let description = format!("copy-on-write over {base_spec}, overlay {}", overlay.display());
    Built { dev, description, detail, controls: vec![control] }
}

/// A copy-on-write volume on the control API.
pub struct CowControl {
    target: String,
    dev: Arc<CowDev>,
    remote: Option<Weak<RemoteDev>>,
    stream: Mutex<Option<StreamJob>>,
    stream_cfg: Mutex<StreamConfig>,
    clock: Arc<dyn Clock>,
}

impl CowControl {
    fn start_stream(&self) {
        let mut s = self.stream.lock();
        if s.as_ref().is_some_and(|j| j.progress().state == StreamState::Running) {
            return;
        }
        let job = StreamJob::start(self.dev.clone(), self.stream_cfg.lock().clone(), self.clock.clone());
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            show_progress(&self.target, &job);
        }
        *s = Some(job);
    }
}

/// An indicatif bar for a stream job on the terminal, until the job ends.
fn show_progress(target: &str, job: &StreamJob) {
    let p = job.progress();
    let bar = indicatif::ProgressBar::new(p.total_bytes);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{prefix} streaming [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_prefix(target.to_string());
    let watch = job.watcher();
    std::thread::spawn(move || loop {
        let p = watch.progress();
        bar.set_position(p.total_bytes - p.remaining_bytes);
        if p.state != StreamState::Running {
            bar.finish_with_message(format!("{:?}", p.state));
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    });
}

impl Controllable for CowControl {
    fn name(&self) -> String {
        self.target.clone()
    }
    fn kind(&self) -> String {
        "cow".into()
    }
    fn status(&self) -> serde_json::Value {
        let stats = self.dev.stats();
        let stream = self.stream.lock().as_ref().map(|j| {
            let p = j.progress();
            let mut v = serde_json::to_value(&p).unwrap_or_default();
            v["percent"] = json!((p.fraction() * 1000.0).round() / 10.0);
            v
        });
        let remote = self.remote.as_ref().and_then(Weak::upgrade).map(|r| serde_json::to_value(r.stats()).unwrap_or_default());
        json!({
            "blocks": stats,
            "base_bytes_left": self.dev.base_bytes(),
            "needs_base": !self.dev.is_independent(),
            "base_attached": self.dev.has_base(),
            "copy_on_read": self.dev.copy_on_read(),
            "stream": stream,
            "remote": remote,
            "failure": stats.loss.as_ref().map(|loss| json!({
                "loss": loss,
                "lost_blocks": stats.lost_blocks,
                "action": format!("every FLUSH fails (and reads of the lost blocks) until the loss is acknowledged: surge set {} ack_lost=true", self.target),
            })),
        })
    }
    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "cor" => match value {
                "on" | "true" | "1" => self.dev.set_copy_on_read(true),
                "off" | "false" | "0" => self.dev.set_copy_on_read(false),
                _ => return Err(format!("cor={value}: expected on or off")),
            },
            "rate" => {
                let rate = if value == "0" || value == "unlimited" { 0 } else { parse_rate(value).map_err(|e| e.to_string())? };
                self.stream_cfg.lock().rate = (rate > 0).then_some(rate);
                if let Some(j) = self.stream.lock().as_ref() {
                    j.set_rate(rate);
                }
            }
            "stream" => match value {
                "start" => {
                    if !self.dev.has_base() {
                        return Err("the volume no longer needs its base: nothing to stream".into());
                    }
                    self.start_stream()
                }
                "stop" => {
                    if let Some(j) = self.stream.lock().as_ref() {
                        j.stop();
                    }
                }
                _ => return Err(format!("stream={value}: expected start or stop")),
            },
            "chunk" => self.stream_cfg.lock().chunk = parse_size(value).map_err(|e| e.to_string())?.max(4096),
            "ack_lost" => match value {
                "true" | "yes" | "1" => {
                    if self.dev.acknowledge_loss().is_none() {
                        return Err("no loss to acknowledge".into());
                    }
                }
                _ => return Err("ack_lost=true acknowledges writes a failed overlay flush may have dropped (FLUSH works again; their blocks read what they held before)".into()),
            },
            _ => return Err(format!("{} has no setting {key:?} (settings: cor, rate, stream, chunk, ack_lost)", self.target)),
        }
        Ok(())
    }
}

/// A remote device on the control API.
pub struct RemoteControl {
    target: String,
    dev: Weak<RemoteDev>,
}

impl Controllable for RemoteControl {
    fn name(&self) -> String {
        self.target.clone()
    }
    fn kind(&self) -> String {
        "remote".into()
    }
    fn status(&self) -> serde_json::Value {
        self.dev.upgrade().map(|d| serde_json::to_value(d.stats()).unwrap_or_default()).unwrap_or(json!({ "closed": true }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::{build, ExportSpec};
    use surge_block::SystemClock;

    fn ctx(dir: &Path) -> BuildContext {
        BuildContext::new(dir.to_path_buf(), Arc::new(SystemClock::new()))
    }

    fn spec(s: &str) -> ExportSpec {
        s.parse().unwrap()
    }

    #[test]
    fn cow_over_a_file_base_creates_its_overlay_and_reopens_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("base.img"), vec![7u8; 1 << 20]).unwrap();
        let b = build(&spec("vm=cow:base=file:base.img,overlay=file:vm.ovl,granularity=8KiB"), &ctx(dir.path())).unwrap();
        assert_eq!(b.dev.size(), 1 << 20);
        b.dev.write_at(&[1; 100], 5000, false).unwrap();
        b.dev.flush().unwrap();
        assert_eq!(b.controls[0].name(), "vm/cow");
        assert_eq!(b.controls[0].status()["blocks"]["granularity"], 8192);
        drop(b);
        let b = build(&spec("vm=cow:base=file:base.img,overlay=vm.ovl"), &ctx(dir.path())).unwrap();
        let mut buf = vec![0u8; 200];
        b.dev.read_at(&mut buf, 4950).unwrap();
        assert_eq!(&buf[..50], &[7; 50]);
        assert_eq!(&buf[50..150], &[1; 100]);
        assert_eq!(std::fs::read(dir.path().join("base.img")).unwrap(), vec![7u8; 1 << 20], "the base is never written");
        // fresh forgets it.
        let b = build(&spec("vm=cow:base=file:base.img,overlay=vm.ovl,fresh"), &ctx(dir.path())).unwrap();
        b.dev.read_at(&mut buf, 4950).unwrap();
        assert_eq!(buf, vec![7u8; 200]);
    }

    #[test]
    fn a_streamed_overlay_opens_without_its_base() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("base.img"), vec![3u8; 256 << 10]).unwrap();
        let b = build(&spec("vm=cow:base=file:base.img,overlay=vm.ovl,stream,cache=off"), &ctx(dir.path())).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        // The job marks itself done just after the volume stops needing the base.
        while b.controls[0].status()["needs_base"] == true || b.controls[0].status()["stream"]["state"] != "done" {
            assert!(std::time::Instant::now() < deadline, "stream job did not finish: {}", b.controls[0].status());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let st = b.controls[0].status();
        assert_eq!(st["stream"]["state"], "done", "{st}");
        assert_eq!(st["stream"]["percent"], 100.0, "{st}");
        drop(b);
        std::fs::remove_file(dir.path().join("base.img")).unwrap();
        let b = build(&spec("vm=cow:base=file:base.img,overlay=vm.ovl"), &ctx(dir.path())).unwrap();
        let mut buf = vec![0u8; 4096];
        b.dev.read_at(&mut buf, 100 << 10).unwrap();
        assert_eq!(buf, vec![3u8; 4096], "the base is gone and the data is all local");
    }

    #[test]
    fn spec_mistakes_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = |s: &str| build(&spec(s), &ctx(dir.path())).err().expect(s).to_string();
        assert!(e("vm=cow:overlay=x.ovl").contains("missing base="));
        assert!(e("vm=cow:base=file:none.img").contains("missing overlay="));
        assert!(e("vm=cow:base=file:none.img,overlay=x,cache=maybe").contains("cache=maybe"));
        assert!(e("vm=cow:base=ftp://x/y,overlay=x").contains("unknown scheme"));
        assert!(e("vm=cow:base=file:none.img,overlay=x,bogus=1").contains("bogus"));
        assert!(e("vm=remote:").contains("missing URI"));
        assert!(e("vm=remote:nbd://127.0.0.1:1/x,connections=0").contains("connections=0"));
        assert!(e("vm=remote:nbd+unix:///x?socket=/nonexistent/s").contains("cannot open the remote export"));
        assert!(e("vm=cow:base=file:none.img,overlay=x").contains("none.img"));
    }
}
