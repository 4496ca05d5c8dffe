//! The figures of a run, in fio's shapes: `--output-format json` gives
//! `{"jobs": [{"jobname", "error", "job_runtime", "read": {...}, "write": {...}}]}`
//! with `io_bytes`, `io_kbytes`, `bw_bytes`, `bw` (KiB/s), `iops`, `runtime`
//! (ms), `total_ios` and `clat_ns`/`lat_ns` (`min`, `max`, `mean`, `stddev`,
//! `N`, `percentile` keyed `"99.000000"`) as fio writes them, plus a `surge`
//! section per job (the bursts' times, think times, requests issued, bytes
//! verified). Latencies are completion latencies measured by the client.

use super::{LoadConfig, OutputFormat};
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use std::time::Duration;

/// fio's default percentile list.
const PERCENTILES: [f64; 17] = [1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99];

/// One job's completions.
#[derive(Debug, Clone)]
pub struct JobStats {
    pub ios: u64,
    pub bytes: u64,
    /// Requests sent (all completed): how far into its sequence the job got.
    pub ios_issued: u64,
    lat_ns: Histogram<u64>,
}

impl JobStats {
    pub fn new() -> Self {
        // 1 us .. 1 h, 3 significant digits.
        JobStats { ios: 0, bytes: 0, ios_issued: 0, lat_ns: Histogram::new_with_bounds(1_000, 3_600_000_000_000, 3).expect("valid bounds") }
    }

    pub fn record(&mut self, len: u64, lat: Duration) {
        self.ios += 1;
        self.bytes += len;
        let ns = (lat.as_nanos() as u64).clamp(1_000, 3_600_000_000_000);
        self.lat_ns.record(ns).expect("clamped into the bounds");
    }

    fn merge(&mut self, o: &JobStats) {
        self.ios += o.ios;
        self.bytes += o.bytes;
        self.ios_issued += o.ios_issued;
        self.lat_ns.add(&o.lat_ns).expect("same bounds");
    }
}

impl Default for JobStats {
    fn default() -> Self {
        Self::new()
    }
}

/// One burst as the application saw it: from its start to the last job's
/// last completion (and flush).
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct Burst {
    pub start_s: f64,
    pub end_s: f64,
    pub ios: u64,
    pub bytes: u64,
}

/// Everything `surge load` reports.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub name: String,
    pub writes: bool,
    /// CLOCK_MONOTONIC at the start (comparable across processes of one machine).
    pub started_ns: u64,
    pub runtime: Duration,
    pub jobs: Vec<JobStats>,
    pub bursts: Vec<Burst>,
    pub think_s: Vec<f64>,
    pub verified_bytes: Option<u64>,
    pub group: bool,
    pub format: OutputFormat,
}

fn lat_json(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return json!({"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0});
    }
    let pct: serde_json::Map<String, Value> = PERCENTILES.iter().map(|&p| (format!("{p:.6}"), json!(h.value_at_quantile(p / 100.0)))).collect();
    json!({"min": h.min(), "max": h.max(), "mean": h.mean(), "stddev": h.stdev(), "N": h.len(), "percentile": pct})
}

fn io_json(s: &JobStats, runtime: Duration) -> Value {
    let secs = runtime.as_secs_f64().max(1e-9);
    let ms = runtime.as_millis() as u64;
    let lat = lat_json(&s.lat_ns);
    json!({
        "io_bytes": s.bytes, "io_kbytes": s.bytes / 1024,
        "bw_bytes": (s.bytes as f64 / secs) as u64, "bw": (s.bytes as f64 / secs / 1024.0) as u64,
        "iops": s.ios as f64 / secs, "runtime": ms, "total_ios": s.ios, "short_ios": 0, "drop_ios": 0,
        "clat_ns": lat.clone(), "lat_ns": lat,
    })
}

impl Outcome {
    pub fn new(cfg: &LoadConfig, started_ns: u64, runtime: Duration, jobs: Vec<JobStats>, bursts: Vec<Burst>, think_s: Vec<f64>, verified_bytes: Option<u64>) -> Self {
        Outcome { name: cfg.name.clone(), writes: cfg.rw.writes(), started_ns, runtime, jobs, bursts, think_s, verified_bytes, group: cfg.group_reporting, format: cfg.output_format }
    }

    /// All jobs together.
    pub fn total(&self) -> JobStats {
        let mut t = JobStats::new();
        for j in &self.jobs {
            t.merge(j);
        }
        t
    }

    /// fio's JSON shape (see the module comment).
    pub fn json(&self) -> Value {
        let idle = json!({"io_bytes": 0, "io_kbytes": 0, "bw_bytes": 0, "bw": 0, "iops": 0.0, "runtime": 0, "total_ios": 0, "short_ios": 0, "drop_ios": 0, "clat_ns": lat_json(&JobStats::new().lat_ns), "lat_ns": lat_json(&JobStats::new().lat_ns)});
        let job = |name: String, s: &JobStats| {
            let io = io_json(s, self.runtime);
            let (read, write) = if self.writes { (idle.clone(), io) } else { (io, idle.clone()) };
            json!({
                "jobname": name, "groupid": 0, "error": 0, "job_runtime": self.runtime.as_millis() as u64,
                "read": read, "write": write,
                "surge": {
                    "started_monotonic_ns": self.started_ns,
                    "ios_issued": s.ios_issued,
                    "ios_issued_per_job": self.jobs.iter().map(|j| j.ios_issued).collect::<Vec<_>>(),
                    "bursts": self.bursts, "think_s": self.think_s, "verified_bytes": self.verified_bytes,
                },
            })
        };
        let jobs: Vec<Value> = if self.group { vec![job(self.name.clone(), &self.total())] } else { self.jobs.iter().enumerate().map(|(i, s)| job(format!("{}.{i}", self.name), s)).collect() };
        json!({"fio version": concat!("surge-load-", env!("CARGO_PKG_VERSION")), "jobs": jobs})
    }

    /// A few lines for people.
    pub fn text(&self) -> String {
        let t = self.total();
        let secs = self.runtime.as_secs_f64().max(1e-9);
        let q = |p: f64| t.lat_ns.value_at_quantile(p) as f64 / 1e3;
        let mut s = format!(
            "{}: {} {} requests, {} in {:.2} s: {:.1} MB/s, {:.0} IOPS; completion latency p50 {:.0} us, p99 {:.0} us, max {:.0} us\n",
            self.name,
            t.ios,
            if self.writes { "write" } else { "read" },
            surge_block::units::format_size(t.bytes),
            secs,
            t.bytes as f64 / secs / 1e6,
            t.ios as f64 / secs,
            q(0.5),
            q(0.99),
            t.lat_ns.max() as f64 / 1e3
        );
        for (i, b) in self.bursts.iter().enumerate().filter(|_| self.bursts.len() > 1) {
            let d = (b.end_s - b.start_s).max(1e-9);
            s.push_str(&format!("  burst {}: {:.2}-{:.2} s, {:.1} MB/s\n", i + 1, b.start_s, b.end_s, b.bytes as f64 / d / 1e6));
        }
        if let Some(v) = self.verified_bytes {
            s.push_str(&format!("  verified: {} read back and matched\n", surge_block::units::format_size(v)));
        }
        s
    }

    pub fn print(&self) -> anyhow::Result<()> {
        use std::io::Write;
        let text = match self.format {
            OutputFormat::Json => serde_json::to_string_pretty(&self.json())? + "\n",
            OutputFormat::Normal => self.text(),
        };
        match std::io::stdout().lock().write_all(text.as_bytes()) {
            // A reader that stopped reading (`| head`) is not an error of the run.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            r => Ok(r?),
        }
    }
}

/// The parts of `surge load --output-format json` a harness reads back.
#[derive(Debug, Clone, serde::Deserialize)]
#[allow(dead_code)] // what harnesses may read; not all of it is read by all of them
pub struct Parsed {
    pub jobs: Vec<ParsedJob>,
}

#[derive(Debug, Clone, serde::Deserialize)]
#[allow(dead_code)]
pub struct ParsedJob {
    pub write: ParsedIo,
    pub read: ParsedIo,
    pub surge: ParsedSurge,
}

#[derive(Debug, Clone, serde::Deserialize)]
#[allow(dead_code)]
pub struct ParsedIo {
    pub io_bytes: u64,
    pub bw_bytes: u64,
    pub iops: f64,
    pub runtime: u64,
    pub total_ios: u64,
}

#[derive(Debug, Clone, serde::Deserialize)]
#[allow(dead_code)]
pub struct ParsedSurge {
    pub started_monotonic_ns: u64,
    pub ios_issued_per_job: Vec<u64>,
    pub bursts: Vec<Burst>,
    pub think_s: Vec<f64>,
    pub verified_bytes: Option<u64>,
}

impl Parsed {
    pub fn from_output(text: &str) -> anyhow::Result<Parsed> {
        let i = text.find('{').ok_or_else(|| anyhow::anyhow!("no JSON in surge load's output: {}", text.chars().take(300).collect::<String>()))?;
        Ok(serde_json::from_str(&text[i..])?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_fios_fields_with_fios_units() {
        let mut cfg = LoadConfig::new("nbd://h/e");
        cfg.group_reporting = true;
        let mut s = JobStats::new();
        for us in 1..=100u64 {
            s.record(4096, Duration::from_micros(us * 10));
        }
        s.ios_issued = 100;
        let o = Outcome::new(&cfg, 5, Duration::from_secs(2), vec![s], vec![], vec![], None);
        let j = o.json();
        let w = &j["jobs"][0]["write"];
        assert_eq!(w["io_bytes"], 409_600);
        assert_eq!(w["bw"], 200, "KiB/s: 400 KiB over 2 s");
        assert_eq!(w["runtime"], 2000);
        assert!((w["iops"].as_f64().unwrap() - 50.0).abs() < 1e-9);
        let p50 = w["clat_ns"]["percentile"]["50.000000"].as_u64().unwrap();
        assert!((495_000..=505_000).contains(&p50), "{p50}");
        assert_eq!(j["jobs"][0]["read"]["total_ios"], 0);
        let parsed = Parsed::from_output(&serde_json::to_string(&j).unwrap()).unwrap();
        assert_eq!(parsed.jobs[0].write.total_ios, 100);
        assert_eq!(parsed.jobs[0].surge.ios_issued_per_job, vec![100]);
    }
}
