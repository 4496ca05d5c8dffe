//! Prometheus metrics (`surge serve --metrics 127.0.0.1:9100`, GET /metrics).
//!
//! Most values are read at scrape time from what the control API already
//! knows (the status of every registered [`Controllable`]), so layers need no
//! metrics code: a collector turns each target's status JSON into metric
//! families. Only request latency is measured on the I/O path, by a thin
//! [`Timed`] layer on each export (lock-free power-of-two buckets). Names and
//! labels are documented in docs/metrics.md; keep the two in step.

use crate::control::{Registry as Control, TargetStatus};
use anyhow::Context as _;
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;
use surge_block::{BlockDev, Caps, Extent, ZeroMode};

/// Latency buckets: upper bounds 2^k microseconds, k = 0..=BUCKETS-2 (1 µs ..
/// ~16.8 s), and +Inf.
const BUCKETS: usize = 26;

/// A latency histogram updated with atomics only (no lock on the I/O path).
#[derive(Debug, Default)]
pub struct Hist {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Hist {
    pub fn observe(&self, ns: u64) {
        let us = ns.div_ceil(1000).max(1);
        // Smallest k with us <= 2^k.
        let k = (64 - (us - 1).leading_zeros()) as usize;
        self.buckets[k.min(BUCKETS - 1)].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(ns, Relaxed);
    }

    /// (sum in seconds, count, per-bucket (upper bound in seconds, count)).
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let b = (0..BUCKETS)
            .map(|k| {
                let le = if k == BUCKETS - 1 { f64::INFINITY } else { (1u64 << k) as f64 / 1e6 };
                (le, self.buckets[k].load(Relaxed))
            })
            .collect();
        (self.sum_ns.load(Relaxed) as f64 / 1e9, self.count.load(Relaxed), b)
    }
}

/// Per-export request latency, by operation.
#[derive(Debug, Default)]
pub struct Latency {
    read: Hist,
    write: Hist,
    flush: Hist,
    other: Hist,
}

/// A layer that times every request of the device below.
pub struct Timed {
    inner: Arc<dyn BlockDev>,
    lat: Arc<Latency>,
}

impl Timed {
    fn time<T>(&self, h: &Hist, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        h.observe(t.elapsed().as_nanos() as u64);
        r
    }
}

impl BlockDev for Timed {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.time(&self.lat.read, || self.inner.read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.time(&self.lat.write, || self.inner.write_at(buf, offset, fua))
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.time(&self.lat.flush, || self.inner.flush())
    }
    fn discard(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.time(&self.lat.other, || self.inner.discard(offset, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> surge_block::Result<()> {
        self.time(&self.lat.other, || self.inner.write_zeroes(offset, len, mode))
    }
    fn block_status(&self, offset: u64, len: u64) -> surge_block::Result<Vec<Extent>> {
        self.inner.block_status(offset, len)
    }
    fn prefetch(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.inner.prefetch(offset, len)
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.inner.may_wait_remote(offset, len, write)
    }
}

/// Latency histograms by export name.
type Latencies = Arc<Mutex<Vec<(String, Arc<Latency>)>>>;

/// Everything the endpoint shows: the control registry and the exports' latencies.
#[derive(Clone)]
pub struct Metrics {
    control: Arc<Control>,
    latency: Latencies,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Metrics {
    pub fn new(control: Arc<Control>) -> Self {
        Metrics { control, latency: Default::default() }
    }

    /// Wrap export `name`'s device so its request latency is measured.
    pub fn timed(&self, name: &str, dev: Arc<dyn BlockDev>) -> Arc<dyn BlockDev> {
        let lat = Arc::new(Latency::default());
        self.latency.lock().push((name.to_string(), lat.clone()));
        Arc::new(Timed { inner: dev, lat })
    }

    /// The text exposition of every metric now.
    pub fn render(&self) -> String {
        let mut reg = prometheus_client::registry::Registry::default();
        reg.register_collector(Box::new(self.clone()));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        out
    }
}

type Labels = Vec<(String, String)>;

/// One metric family being gathered: name, help, type and its samples.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    samples: Vec<(Labels, f64)>,
}

/// Families collected from the status of every target.
#[derive(Default)]
struct Families(Vec<Family>);

impl Families {
    fn add(&mut self, name: &'static str, help: &'static str, kind: MetricType, labels: Labels, v: Option<f64>) {
        let Some(v) = v.filter(|v| v.is_finite()) else { return };
        let i = match self.0.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.0.push(Family { name, help, kind, samples: Vec::new() });
                self.0.len() - 1
            }
        };
        self.0[i].samples.push((labels, v));
    }
    fn gauge(&mut self, name: &'static str, help: &'static str, labels: Labels, v: Option<f64>) {
        self.add(name, help, MetricType::Gauge, labels, v);
    }
    fn counter(&mut self, name: &'static str, help: &'static str, labels: Labels, v: Option<f64>) {
        self.add(name, help, MetricType::Counter, labels, v);
    }
}

fn num(v: &Value, path: &[&str]) -> Option<f64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_f64()
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// Phases and states a layer can be in, for the one-hot state gauges.
const PHASES: &[&str] = &["boost", "drain", "detached"];

/// The metrics of one target's status (see docs/metrics.md).
fn collect_target(t: &TargetStatus, f: &mut Families) {
    let s = &t.status;
    let name = t.name.as_str();
    match t.kind.as_str() {
        "export" => {
            let l = |op: &str| labels(&[("export", name), ("op", op)]);
            for (op, key) in [("read", "reads"), ("write", "writes"), ("flush", "flushes"), ("discard", "discards"), ("zeroes", "zeroes")] {
                f.counter("surge_export_ops", "Requests served, by operation", l(op), num(s, &["io", key]));
            }
            for (op, key) in [("read", "read_bytes"), ("write", "write_bytes")] {
                f.counter("surge_export_bytes", "Bytes read and written by clients", l(op), num(s, &["io", key]));
            }
            let e = labels(&[("export", name)]);
            f.counter("surge_export_errors", "Requests that failed", e.clone(), num(s, &["io", "errors"]));
            f.gauge("surge_export_size_bytes", "Export size", e.clone(), num(s, &["size_bytes"]));
            f.gauge("surge_export_connections", "Clients connected now", e, num(s, &["connections", "active"]));
        }
        "elastic" => {
            let l = labels(&[("layer", name)]);
            let phase = s.get("phase").and_then(Value::as_str).unwrap_or("detached");
            for p in PHASES {
                let on = if *p == phase || (*p == "detached" && s["phase"].is_null()) { 1.0 } else { 0.0 };
                f.gauge("surge_cache_phase", "1 for the cache's current phase (boost, drain, detached)", labels(&[("layer", name), ("phase", p)]), Some(on));
            }
            if let Some(state) = s.get("state").and_then(Value::as_str) {
                f.gauge("surge_elastic_state", "1 for the elastic policy's current state", labels(&[("layer", name), ("state", state)]), Some(1.0));
            }
            f.gauge("surge_elastic_utilization", "Backing utilization in the last window (0..1+)", l.clone(), num(s, &["utilization"]));
            f.gauge("surge_cache_size_bytes", "Size of the attached cache volume (0: none)", l.clone(), num(s, &["cache_size"]));
            f.gauge("surge_cache_dirty_bytes", "Bytes in the cache not yet written back", l.clone(), num(s, &["dirty_bytes"]));
            f.gauge("surge_cache_used_bytes", "Bytes of the cache holding data", l.clone(), num(s, &["stats", "used_bytes"]));
            f.counter("surge_cache_hits", "Cache hits (since the cache was built)", l.clone(), num(s, &["stats", "hits"]));
            f.counter("surge_cache_misses", "Cache misses", l.clone(), num(s, &["stats", "misses"]));
            f.counter("surge_cache_flushed_bytes", "Bytes written back to the backing volume", l.clone(), num(s, &["stats", "flushed_bytes"]));
            f.counter("surge_cache_bypassed_bytes", "Bytes written around the cache", l.clone(), num(s, &["stats", "bypassed_bytes"]));
            // On a real cloud: provisioning failures (backing speed meanwhile),
            // volumes whose detach or delete is being retried, attach times.
            let failures = s.get("provision_failure").map_or(Some(0.0), |f| Some(f["attempts"].as_f64().unwrap_or(0.0)));
            f.gauge("surge_elastic_provision_failures", "Cache provisionings failed in a row (0: the last one worked)", l.clone(), failures);
            let doomed = s.get("volumes_to_delete").and_then(Value::as_array).map(|a| a.len() as f64);
            f.gauge("surge_elastic_volumes_to_delete", "Cache volumes whose detach or delete is being retried", l.clone(), doomed);
            f.gauge("surge_elastic_attach_estimate_seconds", "Expected create + attach time of a cache volume (as observed)", l.clone(), num(s, &["attach_time", "estimate_s"]));
            f.gauge("surge_elastic_backing_capacity_bytes_per_second", "What the backing provides now (credits included)", l.clone(), num(s, &["backing_capacity", "now", "bytes_per_s"]));
            f.gauge("surge_cost_dollars", "Dollars spent so far (list prices)", l.clone(), num(s, &["cost", "usd"]));
            f.gauge("surge_cost_agbs", "Adjusted GB-seconds so far (MB/s x GiB x s)", l, num(s, &["cost", "agbs"]));
        }
        "burstable" => {
            let l = labels(&[("layer", name)]);
            // A swap the cloud refused: the old members keep serving meanwhile.
            let failures = s.get("swap_failure").map_or(Some(0.0), |f| Some(f["attempts"].as_f64().unwrap_or(0.0)));
            f.gauge("surge_burstable_swap_failures", "Member swaps refused by the cloud in a row (0: the last one started)", l.clone(), failures);
            f.counter("surge_burstable_swaps", "Member swaps finished (since start)", l.clone(), num(s, &["swaps_done"]));
            f.gauge("surge_burstable_rebuilds", "Rebuilds onto fresh members in flight", l, num(s, &["rebuilds_in_flight"]));
            top_level(t, f);
        }
        "tenant" => {
            let pool = s.get("pool").and_then(Value::as_str).unwrap_or("");
            let l = labels(&[("tenant", name), ("pool", pool)]);
            f.gauge("surge_fairshare_queued", "Requests of the tenant waiting in the fair queue", l.clone(), num(s, &["tenant", "queued"]));
            f.gauge("surge_fairshare_in_flight", "Requests of the tenant at the device", l.clone(), num(s, &["tenant", "in_flight"]));
            f.counter("surge_fairshare_ops", "Requests the tenant was served", l.clone(), num(s, &["tenant", "ops"]));
            f.counter("surge_fairshare_bytes", "Bytes the tenant moved", l.clone(), num(s, &["tenant", "bytes"]));
            f.gauge("surge_fairshare_weight", "The tenant's weight", l, num(s, &["tenant", "config", "weight"]));
            let p = labels(&[("pool", pool)]);
            // One sample per pool, however many tenants report it.
            if !f.0.iter().any(|x| x.name == "surge_fairshare_depth" && x.samples.iter().any(|(ls, _)| *ls == p)) {
                f.gauge("surge_fairshare_depth", "Depth D of the pool's SFQ(D) now", p.clone(), num(s, &["pool_depth"]));
                f.gauge("surge_fairshare_outstanding", "Requests of the pool at the device now", p, num(s, &["pool_outstanding"]));
            }
        }
        "volume" => {
            let l = labels(&[("layer", name)]);
            f.gauge("surge_volume_burst_balance_percent", "Burst credits left, percent of the bucket (CloudWatch BurstBalance)", l.clone(), num(s, &["burst_balance_percent"]));
            f.gauge("surge_volume_credits", "Burst credits left (gp2: I/O credits, st1/sc1: bytes)", labels(&[("layer", name), ("unit", "ops")]), num(s, &["credits", "ops"]));
            f.gauge("surge_volume_credits", "Burst credits left (gp2: I/O credits, st1/sc1: bytes)", labels(&[("layer", name), ("unit", "bytes")]), num(s, &["credits", "bytes"]));
            f.gauge("surge_cost_dollars", "Dollars spent so far (list prices)", l, num(s, &["usd_so_far"]));
        }
        _ => top_level(t, f),
    }
}

/// Kinds added later (and burstable, which had only these first) show their top-level numbers.
fn top_level(t: &TargetStatus, f: &mut Families) {
    if let Some(obj) = t.status.as_object() {
        for (k, v) in obj {
            f.gauge("surge_target_value", "Top-level numbers of targets the names above do not cover", labels(&[("target", &t.name), ("kind", &t.kind), ("field", k)]), v.as_f64());
        }
    }
}

impl Collector for Metrics {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut f = Families::default();
        for t in self.control.snapshot() {
            collect_target(&t, &mut f);
        }
        for fam in &f.0 {
            let mut m = enc.encode_descriptor(fam.name, fam.help, None, fam.kind)?;
            for (ls, v) in &fam.samples {
                let fm = m.encode_family(ls)?;
                // Whole numbers print as integers (byte and op counts stay exact).
                let whole = v.fract() == 0.0 && v.abs() < 9e15;
                match (fam.kind, whole) {
                    (MetricType::Counter, true) => ConstCounter::new(*v as u64).encode(fm)?,
                    (MetricType::Counter, false) => ConstCounter::new(*v).encode(fm)?,
                    (_, true) => ConstGauge::new(*v as i64).encode(fm)?,
                    (_, false) => ConstGauge::new(*v).encode(fm)?,
                }
            }
        }
        let lat = self.latency.lock();
        if !lat.is_empty() {
            let mut m = enc.encode_descriptor("surge_export_latency_seconds", "Request latency seen by clients, by operation", None, MetricType::Histogram)?;
            for (export, l) in lat.iter() {
                for (op, h) in [("read", &l.read), ("write", &l.write), ("flush", &l.flush), ("other", &l.other)] {
                    let (sum, count, buckets) = h.snapshot();
                    let ls = labels(&[("export", export), ("op", op)]);
                    m.encode_family(&ls)?.encode_histogram::<Labels>(sum, count, &buckets, None)?;
                }
            }
        }
        Ok(())
    }
}

/// The HTTP endpoint; dropping it stops the server.
///
/// Scrapers are answered by [`RESPONDERS`] threads, each write bounded by
/// [`SEND_TIMEOUT`] (set on the listening socket, which accepted sockets
/// inherit), so a client that does not read its response holds one of them
/// for a few seconds, not the endpoint; while all are busy, requests are
/// dropped unanswered (never a blocking write on the accepting thread), and
/// a client whose response timed out gets no more answers. With an
/// allow-list, other addresses get 403.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    threads: Vec<std::thread::JoinHandle<()>>,
    addr: SocketAddr,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

/// Threads answering scrapes.
pub const RESPONDERS: usize = 4;
/// How long writing one response may block (a stalled reader).
pub const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a connection may take to send a request (idle keep-alive included).
pub const RECV_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Client addresses whose response timed out, remembered (and ignored) at most.
const STALLED_REMEMBERED: usize = 1024;

impl MetricsServer {
    pub fn start(addr: SocketAddr, metrics: Metrics, allow: Option<surge_nbd::AllowList>) -> anyhow::Result<Self> {
        let bind = || -> std::io::Result<std::net::TcpListener> {
            let sock = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
            sock.set_reuse_address(true)?;
            sock.set_write_timeout(Some(SEND_TIMEOUT))?;
            sock.set_read_timeout(Some(RECV_TIMEOUT))?;
            sock.bind(&addr.into())?;
            sock.listen(128)?;
            Ok(sock.into())
        };
        let listener = bind().with_context(|| format!("--metrics {addr}: binding"))?;
        let server = Arc::new(tiny_http::Server::from_listener(listener, None).map_err(|e| anyhow::anyhow!("{e}")).with_context(|| format!("--metrics {addr}"))?);
        let addr = server.server_addr().to_ip().context("metrics server address")?;
        let (tx, rx) = crossbeam_channel::bounded::<(tiny_http::Request, bool)>(RESPONDERS * 4);
        let stalled: Arc<Mutex<std::collections::VecDeque<SocketAddr>>> = Arc::default();
        // Connections with a request being answered: a pipelining client gets
        // one responder, never all of them (its responses are written in
        // order, so the others would only wait on its stalled one).
        let answering: Arc<Mutex<std::collections::HashSet<SocketAddr>>> = Arc::default();
        let metrics = Arc::new(metrics);
        let mut threads = Vec::new();
        for i in 0..RESPONDERS {
            let (rx, metrics, stalled, answering) = (rx.clone(), metrics.clone(), stalled.clone(), answering.clone());
            let t = std::thread::Builder::new()
                .name(format!("metrics{i}"))
                .spawn(move || {
                    for (req, allowed) in rx {
                        let from = req.remote_addr().copied();
                        let failed = respond(req, allowed, &metrics).is_err();
                        if let Some(a) = from {
                            answering.lock().remove(&a);
                        }
                        if failed {
                            if let Some(a) = from {
                                let mut s = stalled.lock();
                                if s.len() >= STALLED_REMEMBERED {
                                    s.pop_front();
                                }
                                s.push_back(a);
                            }
                        }
                    }
                })
                .context("spawning a metrics thread")?;
            threads.push(t);
        }
        let s = server.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let accept = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                let mut woke = std::time::Instant::now();
                loop {
                    // The listener's receive timeout (there so that connections
                    // inherit it) also bounds accept(), and tiny_http's accept
                    // thread ends at the first accept error: a connection of our
                    // own at least every RECV_TIMEOUT / 2 keeps accept() from
                    // ever timing out.
                    if woke.elapsed() >= RECV_TIMEOUT / 2 {
                        wake_accept(addr);
                        woke = std::time::Instant::now();
                    }
                    let req = match s.recv_timeout((woke + RECV_TIMEOUT / 2).saturating_duration_since(std::time::Instant::now())) {
                        Ok(Some(req)) => req,
                        Ok(None) if stopping.load(std::sync::atomic::Ordering::Relaxed) => break,
                        Ok(None) => continue,
                        Err(e) => {
                            tracing::error!("metrics endpoint {addr} stopped: accepting a connection failed: {e}");
                            break;
                        }
                    };
                    let from = req.remote_addr().copied();
                    if from.is_some_and(|a| stalled.lock().contains(&a) || !answering.lock().insert(a)) {
                        discard(req);
                        continue;
                    }
                    let allowed = match &allow {
                        None => true,
                        Some(list) => from.is_some_and(|a| list.allows(&surge_nbd::Peer::tcp(a.ip()))),
                    };
                    if let Err(crossbeam_channel::TrySendError::Full((req, _))) = tx.try_send((req, allowed)) {
                        if let Some(a) = from {
                            answering.lock().remove(&a);
                        }
                        discard(req);
                    }
                }
            })
            .context("spawning the metrics thread")?;
        threads.push(accept);
        Ok(MetricsServer { server, threads, addr, stop })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// Answers one scrape (403 for a client outside the allow-list).
fn respond(req: tiny_http::Request, allowed: bool, metrics: &Metrics) -> std::io::Result<()> {
    if !allowed {
        return req.respond(tiny_http::Response::from_string("surge: not allowed\n").with_status_code(403));
    }
    if req.url() == "/metrics" {
        let header = tiny_http::Header::from_bytes("Content-Type", "text/plain; version=0.0.4; charset=utf-8").expect("static header");
        req.respond(tiny_http::Response::from_string(metrics.render()).with_header(header))
    } else {
        req.respond(tiny_http::Response::from_string("surge: metrics are at /metrics\n").with_status_code(404))
    }
}

/// Connects to the metrics listener and hangs up at once: tiny_http accepts
/// the connection, reads nothing and closes it.
fn wake_accept(addr: SocketAddr) {
    let mut to = addr;
    if to.ip().is_unspecified() {
        to.set_ip(if to.is_ipv4() { std::net::Ipv4Addr::LOCALHOST.into() } else { std::net::Ipv6Addr::LOCALHOST.into() });
    }
    if let Err(e) = std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_secs(1)) {
        tracing::warn!("metrics endpoint {to}: keeping the listener awake: {e}");
    }
}

/// Leaves a request unanswered without writing anything (dropping it would
/// write a 500, which may block on a client that does not read).
fn discard(req: tiny_http::Request) {
    drop(req.into_writer());
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.server.unblock();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Controllable;
    use serde_json::json;

    struct Fake(&'static str, &'static str, Value);
    impl Controllable for Fake {
        fn name(&self) -> String {
            self.0.into()
        }
        fn kind(&self) -> String {
            self.1.into()
        }
        fn status(&self) -> Value {
            self.2.clone()
        }
    }

    #[test]
    fn histogram_buckets_are_powers_of_two_microseconds() {
        let h = Hist::default();
        h.observe(500); // 0.5 µs -> le 1 µs
        h.observe(3_000); // 3 µs -> le 4 µs
        h.observe(4_000); // exactly 4 µs -> le 4 µs
        h.observe(u64::MAX / 4); // beyond the last bound -> +Inf
        let (_, count, b) = h.snapshot();
        assert_eq!(count, 4);
        assert_eq!(b[0], (1e-6, 1));
        assert_eq!(b[2], (4e-6, 2));
        assert_eq!(b[BUCKETS - 1].1, 1);
        assert!(b[BUCKETS - 1].0.is_infinite());
    }

    #[test]
    fn status_becomes_named_metrics() {
        let c = Control::new();
        c.register(Arc::new(Fake("d", "export", json!({"io": {"reads": 3, "read_bytes": 12288, "writes": 1, "write_bytes": 4096, "errors": 0}, "size_bytes": 1024, "connections": {"active": 2}})))).unwrap();
        c.register(Arc::new(Fake("d/elastic", "elastic", json!({"phase": "drain", "state": "draining", "dirty_bytes": 77, "stats": {"hits": 5}, "cost": {"usd": 0.25}, "provision_failure": {"attempts": 3}, "volumes_to_delete": ["vol-1"], "attach_time": {"estimate_s": 12.5}})))).unwrap();
        c.register(Arc::new(Fake("qos/a", "tenant", json!({"pool": "p", "tenant": {"queued": 4, "config": {"weight": 2}}, "pool_depth": 8})))).unwrap();
        c.register(Arc::new(Fake("qos/b", "tenant", json!({"pool": "p", "tenant": {"queued": 1}, "pool_depth": 8})))).unwrap();
        c.register(Arc::new(Fake("v/volume", "volume", json!({"burst_balance_percent": 99.5, "credits": {"ops": 5000}, "usd_so_far": 0.5})))).unwrap();
        c.register(Arc::new(Fake("b/burstable", "burstable", json!({"swap_failure": {"attempts": 2}, "swaps_done": 4, "rebuilds_in_flight": 1})))).unwrap();
        c.register(Arc::new(Fake("new", "gizmo", json!({"widgets": 7, "label": "x"})))).unwrap();
        let m = Metrics::new(c);
        let d = m.timed("d", Arc::new(surge_block::MemoryDev::new(4096)));
        d.write_at(&[1; 512], 0, false).unwrap();
        let text = m.render();
        for line in [
            "surge_export_ops_total{export=\"d\",op=\"read\"} 3",
            "surge_export_bytes_total{export=\"d\",op=\"write\"} 4096",
            "surge_export_connections{export=\"d\"} 2",
            "surge_cache_phase{layer=\"d/elastic\",phase=\"drain\"} 1",
            "surge_cache_phase{layer=\"d/elastic\",phase=\"boost\"} 0",
            "surge_elastic_state{layer=\"d/elastic\",state=\"draining\"} 1",
            "surge_cache_dirty_bytes{layer=\"d/elastic\"} 77",
            "surge_cache_hits_total{layer=\"d/elastic\"} 5",
            "surge_cost_dollars{layer=\"d/elastic\"} 0.25",
            "surge_elastic_provision_failures{layer=\"d/elastic\"} 3",
            "surge_elastic_volumes_to_delete{layer=\"d/elastic\"} 1",
            "surge_elastic_attach_estimate_seconds{layer=\"d/elastic\"} 12.5",
            "surge_fairshare_queued{tenant=\"qos/a\",pool=\"p\"} 4",
            "surge_fairshare_depth{pool=\"p\"} 8",
            "surge_volume_burst_balance_percent{layer=\"v/volume\"} 99.5",
            "surge_volume_credits{layer=\"v/volume\",unit=\"ops\"} 5000",
            "surge_target_value{target=\"new\",kind=\"gizmo\",field=\"widgets\"} 7",
            "surge_burstable_swap_failures{layer=\"b/burstable\"} 2",
            "surge_burstable_swaps_total{layer=\"b/burstable\"} 4",
            "surge_target_value{target=\"b/burstable\",kind=\"burstable\",field=\"swaps_done\"} 4",
            "surge_export_latency_seconds_count{export=\"d\",op=\"write\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert_eq!(text.matches("surge_fairshare_depth{").count(), 1, "one sample per pool");
        assert!(text.contains("# TYPE surge_export_latency_seconds histogram"), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "OpenMetrics text ends with EOF");
    }

    /// One HTTP GET with `Connection: close`; the status line and body.
    fn scrape(addr: SocketAddr) -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(addr)?;
        c.set_read_timeout(Some(std::time::Duration::from_secs(20)))?;
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut out = String::new();
        c.read_to_string(&mut out)?;
        Ok(out)
    }

    // Issue 38 item 5: a client that asks and never reads held the one
    // thread that answered everyone, forever.
    #[test]
    fn a_client_that_never_reads_does_not_freeze_other_scrapes() {
        use std::io::Write;
        let c = Control::new();
        // A big status, so responses fill the socket buffers of a stalled reader.
        let big: serde_json::Map<String, Value> = (0..4000).map(|i| (format!("field{i}"), json!(i))).collect();
        c.register(Arc::new(Fake("g", "gizmo", Value::Object(big)))).unwrap();
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Metrics::new(c), None).unwrap();
        let addr = server.addr();
        let mut stalled = std::net::TcpStream::connect(addr).unwrap();
        for _ in 0..200 {
            stalled.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        for _ in 0..3 {
            let t = std::time::Instant::now();
            let out = scrape(addr).unwrap();
            assert!(out.starts_with("HTTP/1.1 200") && out.contains("field3999"), "{}", &out[..out.len().min(200)]);
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "a scrape took {:?}", t.elapsed());
        }
        drop(stalled);
    }

    // The listener's receive timeout also bounds accept(): the endpoint
    // stopped for good after RECV_TIMEOUT without a new connection.
    #[test]
    fn the_endpoint_still_answers_after_a_quiet_spell_longer_than_the_receive_timeout() {
        let c = Control::new();
        c.register(Arc::new(Fake("new", "gizmo", json!({"widgets": 7})))).unwrap();
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Metrics::new(c), None).unwrap();
        assert!(scrape(server.addr()).unwrap().contains("widgets"));
        std::thread::sleep(RECV_TIMEOUT + std::time::Duration::from_secs(2));
        assert!(scrape(server.addr()).unwrap().contains("widgets"));
    }

    #[test]
    fn scrapers_outside_the_allow_list_get_403() {
        let c = Control::new();
        c.register(Arc::new(Fake("b/burstable", "burstable", json!({"swap_failure": {"attempts": 2}, "swaps_done": 4, "rebuilds_in_flight": 1})))).unwrap();
        c.register(Arc::new(Fake("new", "gizmo", json!({"widgets": 7})))).unwrap();
        let only_elsewhere: surge_nbd::AllowList = "10.0.0.0/8".parse().unwrap();
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Metrics::new(c.clone()), Some(only_elsewhere)).unwrap();
        let out = scrape(server.addr()).unwrap();
        assert!(out.starts_with("HTTP/1.1 403") && !out.contains("widgets"), "{out}");
        let here: surge_nbd::AllowList = "127.0.0.1".parse().unwrap();
        let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), Metrics::new(c), Some(here)).unwrap();
        assert!(scrape(server.addr()).unwrap().contains("widgets"));
    }
}
