//! `share:POOL,...`: fair sharing in the daemon.
//!
//! The export kind puts a tenant of the pool's fair queue
//! (`surge_block::fairq`) behind an export; the first share of a pool creates
//! the queue. Each tenant is a control target `qos/TENANT` whose status carries
//! its share and recent I/O and whose settings change it live (`surge qos`).
//!
//! Tenants are named by the export a client opens, or, as the paper's proxies
//! did, by the client's address: a tenant given `clients=RANGES` serves every
//! connection from those addresses to any share export of its pool (the most
//! specific matching range wins), whichever export the client opened. Ranges
//! change live (`surge qos set TENANT clients=...`) and apply to the next
//! request, also on connections already open.
//!
//! With `global=on` (the default when the daemon has `--coop-peer`s) the pool's
//! queue cooperates with the same pool of other daemons (see `crate::coop`):
//! shares, reservations and limits then hold over the total service.

use crate::control::Controllable;
use crate::stack::{parse_rate, parse_size, BuildContext, Built, Opts, SpecError};
use parking_lot::{Mutex, RwLock};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use surge_block::fairq::{AdaptiveConfig, Anticipate, FairQueue, GlobalConfig, SchedConfig, Tenant, TenantConfig};
use surge_block::{BlockDev, Caps, Extent, ZeroMode};
use surge_nbd::{AllowRule, Peer, PeerRoute};

/// The shares of a daemon: pools, the routes of their exports, and the
/// cooperation timing (set when the daemon has peers).
#[derive(Default)]
pub struct Shares {
    pub pools: BTreeMap<String, Arc<PoolShare>>,
    /// By export name: how its connections find their tenant.
    pub routes: BTreeMap<String, Arc<dyn PeerRoute>>,
    pub coop: Option<CoopTiming>,
}

/// Report period and peer timeout of the daemon's cooperation, and how many
/// peers it has (a pool remembers no more senders than that).
#[derive(Debug, Clone, Copy)]
pub struct CoopTiming {
    pub period: Duration,
    pub peer_timeout: Duration,
    pub max_peers: usize,
}

/// Fair queues by pool name, shared by every `share:` export of a daemon.
pub type Queues = Arc<Mutex<Shares>>;

/// One pool: its fair queue and the tenants that claim client addresses.
pub struct PoolShare {
    pub queue: Arc<FairQueue>,
    clients: RwLock<Vec<Claim>>,
}

struct Claim {
    tenant: Arc<Tenant>,
    rules: Vec<AllowRule>,
}

impl PoolShare {
    /// The tenant whose ranges contain `peer` most specifically (on a tie, the
    /// one whose ranges were set first).
    fn tenant_for(&self, peer: &Peer) -> Option<Arc<Tenant>> {
        let claims = self.clients.read();
        let mut best: Option<(u8, &Claim)> = None;
        for c in claims.iter() {
            let Some(len) = c.rules.iter().filter(|r| r.matches(peer)).map(specificity).max() else { continue };
            if best.is_none_or(|(b, _)| len > b) {
                best = Some((len, c));
            }
        }
        best.map(|(_, c)| c.tenant.clone())
    }

    fn set_clients(&self, tenant: &Arc<Tenant>, rules: Vec<AllowRule>) {
        let mut claims = self.clients.write();
        let name = tenant.name();
        match claims.iter().position(|c| c.tenant.name() == name) {
            Some(i) if rules.is_empty() => {
                claims.remove(i);
            }
            Some(i) => claims[i].rules = rules,
            None if rules.is_empty() => {}
            None => claims.push(Claim { tenant: tenant.clone(), rules }),
        }
    }

    fn clients_of(&self, tenant: &str) -> Vec<String> {
        let claims = self.clients.read();
        claims.iter().filter(|c| c.tenant.name() == tenant).flat_map(|c| c.rules.iter().map(|r| r.to_string())).collect()
    }
}

fn specificity(r: &AllowRule) -> u8 {
    match r {
        AllowRule::Unix => 0,
        AllowRule::Net(n) => n.prefix_len(),
    }
}

/// The pools of `queues`, for the cooperation service.
pub fn pools(queues: &Queues) -> Vec<(String, Arc<FairQueue>)> {
    queues.lock().pools.iter().map(|(n, p)| (n.clone(), p.queue.clone())).collect()
}

/// How connections to `export` find their tenant (share exports only).
pub fn route_for(ctx: &BuildContext, export: &str) -> Option<Arc<dyn PeerRoute>> {
    ctx.fair_queues.lock().routes.get(export).cloned()
}

/// Turn cooperation on by default for pools built from now on.
pub fn set_coop(ctx: &BuildContext, timing: Option<CoopTiming>) {
    ctx.fair_queues.lock().coop = timing;
}

const KEYS: &[&str] =
    &["tenant", "weight", "reservation", "limit", "depth", "overhead", "adaptive", "clients", "global", "lag", "anticipate", "hold_stretch"];

/// `share:POOL[,tenant=NAME][,weight=N][,reservation=RATE][,limit=RATE][,clients=RANGE+RANGE...]`
/// and pool-wide `[,depth=D][,overhead=SIZE][,adaptive=on|off|MS][,global=on|off][,lag=SIZE][,anticipate=auto|off|DURATION][,hold_stretch=N]`.
/// The tenant defaults to the export name; pool-wide options apply to the
/// pool's queue (the first export that names them sets them).
pub fn build_share(export: &str, args: &str, ctx: &BuildContext) -> Result<Built, SpecError> {
    let mut o = Opts::parse("share", args)?;
    let pool = o.positional_required("POOL")?;
    let tenant = o.take("tenant").unwrap_or_else(|| export.to_string());
    let cfg = TenantConfig {
        weight: o.take("weight").map(|w| parse_weight(&w)).transpose().map_err(|m| share_err(&m))?.unwrap_or(1),
        reservation: o.take_rate("reservation")?,
        limit: o.take_rate("limit")?,
    };
    let clients = o.take("clients").map(|c| parse_clients(&c)).transpose().map_err(|m| share_err(&m))?;
    let timing = ctx.fair_queues.lock().coop;
    let mut sched = SchedConfig::default();
    if let Some(d) = o.take("depth") {
        sched.depth = parse_depth(&d).map_err(|m| share_err(&m))?;
    }
    if let Some(overhead) = o.take_size("overhead")? {
        sched.overhead = overhead;
    }
    if let Some(v) = o.take("adaptive") {
        sched.adaptive = parse_adaptive(&v).map_err(|m| share_err(&m))?;
    }
    let global_on = match o.take("global") {
        Some(v) => parse_on_off(&v).map_err(|m| share_err(&format!("global: {m}")))?,
        None => timing.is_some(),
    };
    let mut global = global_config(timing);
    if let Some(lag) = o.take_size("lag")? {
        global.lag = lag;
    }
    if let Some(a) = o.take("anticipate") {
        global.anticipate = parse_anticipate(&a).map_err(|m| share_err(&m))?;
    }
    if let Some(n) = o.take("hold_stretch") {
        global.hold_stretch = parse_hold_stretch(&n).map_err(|m| share_err(&m))?;
    }
    sched.global = global_on.then_some(global);
    o.finish(KEYS)?;
    if tenant.is_empty() {
        return Err(share_err("name the tenant with tenant=NAME"));
    }
    crate::stack::validate_name(&tenant)?;
    let dev = ctx.pool("share", &pool)?;
    let share = pool_for(&ctx.fair_queues, &pool, dev, sched, ctx);
    let queue = share.queue.clone();
    let is_new = !queue.tenant_names().contains(&tenant);
    let handle = queue.tenant(&tenant, cfg);
    if let Some(rules) = clients {
        share.set_clients(&handle, rules);
    }
    let route: Arc<dyn PeerRoute> = Arc::new(TenantRoute { pool: share.clone(), default: handle.clone() });
    ctx.fair_queues.lock().routes.insert(export.to_string(), route);
    let detail = json!({
        "pool": pool,
        "tenant": tenant,
        "share": queue.tenant_config(&tenant).ok(),
        "clients": share.clients_of(&tenant),
        "global": queue.stats().config.global.is_some(),
    });
    let mut built = Built {
        dev: handle.clone(),
        description: format!("share of pool {pool} (tenant {tenant})"),
        detail,
        controls: Vec::new(),
    };
    if is_new {
        built.controls.push(Arc::new(TenantControl { pool, share, handle }));
    }
    Ok(built)
}

/// Cooperation settings from the daemon's timing (or the defaults).
fn global_config(timing: Option<CoopTiming>) -> GlobalConfig {
    let mut g = GlobalConfig::default();
    if let Some(t) = timing {
        g.period = t.period;
        g.peer_timeout = t.peer_timeout;
        g.max_peers = t.max_peers.max(1);
    }
    g
}

fn pool_for(queues: &Queues, pool: &str, dev: Arc<dyn BlockDev>, sched: SchedConfig, ctx: &BuildContext) -> Arc<PoolShare> {
    let mut q = queues.lock();
    if let Some(existing) = q.pools.get(pool) {
        return existing.clone();
    }
    let queue = FairQueue::new(dev, sched, ctx.clock.clone());
    let share = Arc::new(PoolShare { queue, clients: RwLock::new(Vec::new()) });
    q.pools.insert(pool.to_string(), share.clone());
    share
}

/// Connections to a share export: each request goes to the tenant that claims
/// the client's address now, else to the export's own tenant.
struct TenantRoute {
    pool: Arc<PoolShare>,
    default: Arc<Tenant>,
}

impl PeerRoute for TenantRoute {
    fn device_for(&self, peer: &Peer) -> Option<Arc<dyn BlockDev>> {
        Some(Arc::new(Classified { pool: self.pool.clone(), peer: *peer, default: self.default.clone() }))
    }
}

/// One connection's view of a pool, classified by its client's address per request.
struct Classified {
    pool: Arc<PoolShare>,
    peer: Peer,
    default: Arc<Tenant>,
}

impl Classified {
    fn tenant(&self) -> Arc<Tenant> {
        self.pool.tenant_for(&self.peer).unwrap_or_else(|| self.default.clone())
    }
}

impl BlockDev for Classified {
    fn size(&self) -> u64 {
        self.default.size()
    }
    fn caps(&self) -> Caps {
        self.default.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> surge_block::Result<()> {
        self.tenant().read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> surge_block::Result<()> {
        self.tenant().write_at(buf, offset, fua)
    }
    fn flush(&self) -> surge_block::Result<()> {
        self.tenant().flush()
    }
    fn discard(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.tenant().discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, mode: ZeroMode) -> surge_block::Result<()> {
        self.tenant().write_zeroes(offset, len, mode)
    }
    fn block_status(&self, offset: u64, len: u64) -> surge_block::Result<Vec<Extent>> {
        self.tenant().block_status(offset, len)
    }
    fn prefetch(&self, offset: u64, len: u64) -> surge_block::Result<()> {
        self.tenant().prefetch(offset, len)
    }
    fn may_wait_remote(&self, offset: u64, len: u64, write: bool) -> bool {
        self.tenant().may_wait_remote(offset, len, write)
    }
}

fn share_err(msg: &str) -> SpecError {
    SpecError::Args { kind: "share".into(), msg: msg.to_string() }
}

fn parse_weight(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(w) if (1..=1_000_000).contains(&w) => Ok(w),
        _ => Err(format!("weight {s:?} must be a whole number from 1 to 1000000")),
    }
}

fn parse_depth(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(d) if (1..=4096).contains(&d) => Ok(d),
        _ => Err(format!("depth {s:?} must be a whole number from 1 to 4096")),
    }
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("{s:?}: use on or off")),
    }
}

/// `RANGE+RANGE...` (addresses, networks, `unix`), or `none`.
pub fn parse_clients(s: &str) -> Result<Vec<AllowRule>, String> {
    if matches!(s, "none" | "off") {
        return Ok(Vec::new());
    }
    s.split('+').map(|r| r.parse::<AllowRule>().map_err(|e| format!("clients: {e} (join ranges with +)"))).collect()
}

/// `auto`, `off` or a duration (`5ms`).
fn parse_anticipate(s: &str) -> Result<Anticipate, String> {
    match s {
        "auto" => Ok(Anticipate::Auto),
        "off" | "0" => Ok(Anticipate::Off),
        d => surge_block::units::parse_duration(d)
            .map(|d| Anticipate::Micros(d.as_micros() as u64))
            .map_err(|e| format!("anticipate: {e} (or auto, off)")),
    }
}

/// How many times a hold may be stretched by the held tenant's lead, 1..=64 (1: not stretched).
fn parse_hold_stretch(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if (1..=64).contains(&n) => Ok(n),
        _ => Err(format!("hold_stretch {s:?}: use a whole number 1..64 (1: not stretched; default {})", surge_block::fairq::global::HOLD_STRETCH)),
    }
}

/// `off`, `on` (default target) or a mean-latency target in milliseconds.
fn parse_adaptive(s: &str) -> Result<Option<AdaptiveConfig>, String> {
    match s {
        "off" | "false" | "no" => Ok(None),
        "on" | "true" | "yes" => Ok(Some(AdaptiveConfig::default())),
        ms => match ms.trim_end_matches("ms").parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Some(AdaptiveConfig { latency_target_us: ms * 1000, ..AdaptiveConfig::default() })),
            _ => Err(format!("adaptive {s:?}: use on, off or a latency target in ms (e.g. 20ms)")),
        },
    }
}

/// `off`/`none` or a rate.
fn parse_optional_rate(s: &str) -> Result<Option<u64>, String> {
    match s {
        "off" | "none" | "0" => Ok(None),
        r => parse_rate(r).map(Some).map_err(|e| e.to_string()),
    }
}

/// One tenant on the control API.
struct TenantControl {
    pool: String,
    share: Arc<PoolShare>,
    handle: Arc<Tenant>,
}

impl Controllable for TenantControl {
    fn name(&self) -> String {
        format!("qos/{}", self.handle.name())
    }

    fn kind(&self) -> String {
        "tenant".into()
    }

    fn status(&self) -> serde_json::Value {
        let q = self.handle.queue().stats();
        let me = q.tenants.iter().find(|t| t.name == self.handle.name());
        json!({
            "pool": self.pool,
            "tenant": me,
            "clients": self.share.clients_of(&self.handle.name()),
            "pool_depth": q.depth,
            "pool_outstanding": q.outstanding,
            "pool_config": q.config,
            "pool_tenants": q.tenants.iter().map(|t| &t.name).collect::<Vec<_>>(),
            "pool_peers": q.peers,
            "pool_holds_expired": q.holds_expired,
            "pool_holds_started": q.holds_started,
            "pool_hold_time_us": q.hold_time_us,
            "pool_rebased": q.rebased,
        })
    }

    fn set(&self, key: &str, value: &str) -> Result<(), String> {
        let q = self.handle.queue();
        let name = self.handle.name();
        let mut cfg = q.tenant_config(&name).map_err(|e| e.to_string())?;
        match key {
            "weight" => cfg.weight = parse_weight(value)?,
            "reservation" => cfg.reservation = parse_optional_rate(value)?,
            "limit" => cfg.limit = parse_optional_rate(value)?,
            "depth" => {
                q.set_depth(parse_depth(value)?);
                return Ok(());
            }
            "overhead" => {
                q.set_overhead(parse_size(value).map_err(|e| e.to_string())?);
                return Ok(());
            }
            "adaptive" => {
                q.set_adaptive(parse_adaptive(value)?);
                return Ok(());
            }
            "clients" => {
                self.share.set_clients(&self.handle, parse_clients(value)?);
                return Ok(());
            }
            "global" | "lag" | "anticipate" | "hold_stretch" => {
                let current = q.stats().config.global;
                let mut g = current.clone().unwrap_or_default();
                let on = match key {
                    "global" => parse_on_off(value)?,
                    "lag" => {
                        g.lag = parse_size(value).map_err(|e| e.to_string())?;
                        current.is_some()
                    }
                    "hold_stretch" => {
                        g.hold_stretch = parse_hold_stretch(value)?;
                        current.is_some()
                    }
                    _ => {
                        g.anticipate = parse_anticipate(value)?;
                        current.is_some()
                    }
                };
                q.set_global(on.then_some(g));
                return Ok(());
            }
            other => {
                return Err(format!(
                    "{} has no setting {other:?} (weight, reservation, limit, clients; pool-wide: depth, overhead, adaptive, global, lag, anticipate, hold_stretch)",
                    self.name()
                ))
            }
        }
        q.set_tenant(&name, cfg).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use surge_block::{BlockDev, MemoryDev, SystemClock};

    fn ctx() -> BuildContext {
        let mut c = BuildContext::new(PathBuf::from("/nonexistent"), Arc::new(SystemClock::new()));
        c.pools.insert("pool".into(), Arc::new(MemoryDev::new(1 << 20)));
        c
    }

    #[test]
    fn shares_of_one_pool_join_one_queue_and_register_each_tenant_once() {
        let c = ctx();
        let a = build_share("a", "pool,weight=4,depth=3", &c).unwrap();
        let b = build_share("b", "pool,weight=1,limit=10MB/s", &c).unwrap();
        let a2 = build_share("a2", "pool,tenant=a", &c).unwrap();
        assert_eq!((a.controls.len(), b.controls.len(), a2.controls.len()), (1, 1, 0));
        let q = c.fair_queues.lock().pools.get("pool").map(|p| p.queue.clone()).unwrap();
        assert_eq!(q.tenant_names(), vec!["a", "b"]);
        assert_eq!(q.stats().depth, 3);
        assert_eq!(q.tenant_config("a").unwrap().weight, 4);
        assert_eq!(q.tenant_config("b").unwrap().limit, Some(10_000_000));
        a.dev.write_at(&[1u8; 4096], 0, false).unwrap();
        let mut buf = [0u8; 4096];
        a2.dev.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [1u8; 4096], "both handles reach the same device");
    }

    fn pool_of(c: &BuildContext) -> Arc<FairQueue> {
        c.fair_queues.lock().pools.get("pool").map(|p| p.queue.clone()).unwrap()
    }

    fn tcp(ip: &str) -> Peer {
        Peer::tcp(ip.parse().unwrap())
    }

    fn bytes_of(q: &FairQueue, tenant: &str) -> u64 {
        q.stats().tenants.iter().find(|t| t.name == tenant).map_or(0, |t| t.bytes)
    }

    #[test]
    fn connections_are_served_as_the_tenant_that_claims_their_address() {
        let c = ctx();
        build_share("a", "pool,weight=16,clients=127.0.1.0/24", &c).unwrap();
        build_share("b", "pool,weight=1,clients=127.0.2.0/24+127.0.1.7", &c).unwrap();
        let anyone = build_share("pfs", "pool", &c).unwrap();
        let route = route_for(&c, "pfs").unwrap();
        let q = pool_of(&c);
        for (ip, tenant) in [("127.0.1.3", "a"), ("127.0.2.200", "b"), ("127.0.1.7", "b"), ("10.1.1.1", "pfs")] {
            let dev = route.device_for(&tcp(ip)).unwrap();
            let before = bytes_of(&q, tenant);
            dev.write_at(&[1u8; 4096], 0, false).unwrap();
            assert_eq!(bytes_of(&q, tenant) - before, 4096, "{ip} should be served as {tenant}");
        }
        // Unix clients match no range: the export's own tenant.
        let before = bytes_of(&q, "pfs");
        route.device_for(&Peer::Unix).unwrap().write_at(&[1u8; 512], 0, false).unwrap();
        assert_eq!(bytes_of(&q, "pfs") - before, 512);
        assert_eq!(anyone.dev.size(), 1 << 20);
    }

    #[test]
    fn client_ranges_change_live_even_for_open_connections() {
        let c = ctx();
        let a = build_share("a", "pool,clients=127.0.1.0/24", &c).unwrap();
        build_share("b", "pool", &c).unwrap();
        let q = pool_of(&c);
        let conn = route_for(&c, "b").unwrap().device_for(&tcp("127.0.1.9")).unwrap();
        conn.write_at(&[1u8; 4096], 0, false).unwrap();
        assert_eq!((bytes_of(&q, "a"), bytes_of(&q, "b")), (4096, 0));
        a.controls[0].set("clients", "127.0.3.0/24").unwrap();
        conn.write_at(&[1u8; 4096], 0, false).unwrap();
        assert_eq!((bytes_of(&q, "a"), bytes_of(&q, "b")), (4096, 4096), "the next request follows the new ranges");
        assert_eq!(a.controls[0].status()["clients"], json!(["127.0.3.0/24"]));
        a.controls[0].set("clients", "none").unwrap();
        assert_eq!(a.controls[0].status()["clients"], json!([]));
        assert!(a.controls[0].set("clients", "127.0.1.1/24").unwrap_err().contains("host bits"));
    }

    #[test]
    fn cooperation_is_on_with_peers_and_switches_live() {
        let c = ctx();
        let solo = build_share("a", "pool", &c).unwrap();
        assert!(pool_of(&c).stats().config.global.is_none(), "no peers: local SFQ(D)");
        solo.controls[0].set("global", "on").unwrap();
        solo.controls[0].set("lag", "4MiB").unwrap();
        solo.controls[0].set("anticipate", "3ms").unwrap();
        assert_eq!(pool_of(&c).stats().config.global.unwrap().hold_stretch, surge_block::fairq::global::HOLD_STRETCH, "default");
        solo.controls[0].set("hold_stretch", "1").unwrap();
        assert!(solo.controls[0].set("hold_stretch", "0").unwrap_err().contains("hold_stretch"));
        let g = pool_of(&c).stats().config.global.unwrap();
        assert_eq!((g.lag, g.anticipate, g.hold_stretch), (4 << 20, Anticipate::Micros(3000), 1));
        solo.controls[0].set("global", "off").unwrap();
        assert!(pool_of(&c).stats().config.global.is_none());

        let c = ctx();
        set_coop(&c, Some(CoopTiming { period: Duration::from_millis(10), peer_timeout: Duration::from_millis(300), max_peers: 2 }));
        build_share("a", "pool,lag=2MiB,anticipate=off,hold_stretch=2", &c).unwrap();
        let g = pool_of(&c).stats().config.global.unwrap();
        assert_eq!(g.hold_stretch, 2);
        assert_eq!((g.period, g.peer_timeout, g.lag, g.anticipate), (Duration::from_millis(10), Duration::from_millis(300), 2 << 20, Anticipate::Off));
        let c2 = ctx();
        set_coop(&c2, Some(CoopTiming { period: Duration::from_millis(10), peer_timeout: Duration::from_millis(300), max_peers: 2 }));
        build_share("a", "pool,global=off", &c2).unwrap();
        assert!(pool_of(&c2).stats().config.global.is_none());
        assert!(build_share("x", "pool,anticipate=soon", &c2).err().unwrap().to_string().contains("anticipate"));
        assert!(build_share("x", "pool,clients=300.1.1.1", &c2).err().unwrap().to_string().contains("clients"));
    }

    proptest::proptest! {
        #[test]
        fn client_lists_parse_or_fail_without_panicking(s in "[0-9a-z./:+]{0,40}") {
            let _ = parse_clients(&s);
        }

        #[test]
        fn printed_client_lists_parse_back(a in 0u8..=255, b in 0u8..=255, len in 8u8..=32) {
            let net = ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(10, a, b, 0), len).unwrap().trunc();
            let text = format!("{net}+unix+127.0.0.{a}");
            let rules = parse_clients(&text).unwrap();
            let back: Vec<String> = rules.iter().map(|r| r.to_string()).collect();
            proptest::prop_assert_eq!(parse_clients(&back.join("+")).unwrap(), rules);
        }
    }

    #[test]
    fn bad_share_specs_say_what_is_wrong() {
        let c = ctx();
        let e = build_share("a", "nopool", &c).err().unwrap().to_string();
        assert!(e.contains("no pool named"), "{e}");
        let e = build_share("a", "pool,weight=0", &c).err().unwrap().to_string();
        assert!(e.contains("weight"), "{e}");
        let e = build_share("a", "pool,colour=red", &c).err().unwrap().to_string();
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn tenant_targets_change_shares_live_and_report_stats() {
        let c = ctx();
        let built = build_share("a", "pool,weight=2", &c).unwrap();
        let t = built.controls[0].clone();
        assert_eq!(t.name(), "qos/a");
        t.set("weight", "7").unwrap();
        t.set("limit", "20MB/s").unwrap();
        t.set("depth", "5").unwrap();
        t.set("adaptive", "15ms").unwrap();
        assert!(t.set("weight", "0").is_err());
        assert!(t.set("colour", "red").unwrap_err().contains("weight, reservation, limit"));
        built.dev.write_at(&[2u8; 8192], 0, false).unwrap();
        let st = t.status();
        assert_eq!(st["tenant"]["config"]["weight"], 7);
        assert_eq!(st["tenant"]["config"]["limit"], 20_000_000);
        assert_eq!(st["tenant"]["bytes"], 8192);
        assert_eq!(st["pool_config"]["adaptive"]["latency_target_us"], 15_000);
        t.set("limit", "off").unwrap();
        assert!(t.status()["tenant"]["config"]["limit"].is_null());
    }
}
