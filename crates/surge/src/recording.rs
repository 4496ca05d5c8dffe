//! Recording an export's requests, switched while the daemon serves:
//! `surge set EXPORT record=on|off` and `record_dir=DIR` (the export's
//! control target), or from the start with `surge serve --record NAME=DIR`.
//!
//! Every export has a [`RecordSwitch`] layer (off by default, one relaxed
//! load per request); this is what the control socket flips. A recording
//! goes into a new directory each time: the one named with `record_dir=`
//! (used once), or `<data-dir>/traces/<export>-<unix ms>`.

use parking_lot::Mutex;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use surge_trace::record::Stopped;
use surge_trace::{Limits, RecordSwitch};

pub struct Recording {
    export: String,
    switch: Arc<RecordSwitch>,
    limits: Limits,
    data_dir: PathBuf,
    /// Where the next `record=on` writes (`record_dir=`), used once.
    next_dir: Mutex<Option<PathBuf>>,
    /// The last recording stopped, for `surge status`.
    last: Mutex<Option<Stopped>>,
}

impl Recording {
    pub fn new(export: &str, switch: Arc<RecordSwitch>, limits: Limits, data_dir: &Path) -> Self {
        Recording { export: export.to_string(), switch, limits, data_dir: data_dir.to_path_buf(), next_dir: Mutex::new(None), last: Mutex::new(None) }
    }

    /// Start into `dir`, or the next directory (see the module doc).
    pub fn start(&self, dir: Option<&Path>) -> Result<PathBuf, String> {
        if let Some(r) = self.switch.current() {
            return Err(format!("{} is already recording into {} (record=off first)", self.export, r.dir().display()));
        }
        let dir = match dir.map(Path::to_path_buf).or_else(|| self.next_dir.lock().take()) {
            Some(d) => d,
            None => {
                let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
                let d = self.data_dir.join("traces").join(format!("{}-{ms}", self.export));
                std::fs::create_dir_all(d.parent().expect("has a parent")).map_err(|e| format!("creating {}: {e}", self.data_dir.join("traces").display()))?;
                d
            }
        };
        self.switch.start(&dir, self.limits).map_err(|e| format!("recording {} into {}: {e} (name a new directory with record_dir=)", self.export, dir.display()))?;
        tracing::info!(export = %self.export, dir = %dir.display(), "recording requests");
        Ok(dir)
    }

    /// Stop and close the trace; `None` if it was not recording.
    pub fn stop(&self) -> Option<Stopped> {
        let st = self.switch.stop()?;
        tracing::info!(export = %self.export, dir = %st.dir.display(), recorded = st.stats.recorded, dropped = st.stats.dropped, "recording closed");
        *self.last.lock() = Some(st.clone());
        Some(st)
    }

    /// `record=on|off`, `record_dir=DIR` (relative: under the data dir).
    pub fn set(&self, key: &str, value: &str) -> Result<(), String> {
        match key {
            "record" => match value {
                "on" => self.start(None).map(|_| ()),
                "off" => {
                    self.stop();
                    Ok(())
                }
                v => Err(format!("record={v}: on or off")),
            },
            "record_dir" => {
                if value.is_empty() {
                    return Err("record_dir=: give a directory (a new one, or an empty one)".into());
                }
                if let Some(r) = self.switch.current() {
                    return Err(format!("{} is recording into {}; record=off first", self.export, r.dir().display()));
                }
                let p = Path::new(value);
                *self.next_dir.lock() = Some(if p.is_absolute() { p.to_path_buf() } else { self.data_dir.join(p) });
                Ok(())
            }
            _ => Err(format!("{} has no setting {key:?} (record, record_dir)", self.export)),
        }
    }

    pub fn status(&self) -> serde_json::Value {
        let next = self.next_dir.lock().clone();
        match self.switch.current() {
            Some(r) => json!({ "on": true, "dir": r.dir(), "stats": r.stats() }),
            None => json!({ "on": false, "next_dir": next, "last": *self.last.lock() }),
        }
    }
}
