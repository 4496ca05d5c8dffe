//! A discrete-event simulation of a parallel store for the global scheduler's
//! tests: several servers, each with its own scheduler and device, reached by
//! striping clients (a request is split into chunks on consecutive servers of
//! the client's list; it completes when its last chunk does), and schedulers
//! that report to each other every period over a link with a fixed delay.
//! A server can be made silent from some time on (its reports stop), and
//! chunks can be made to arrive late by a seeded pseudo-random delay (a busy
//! machine scheduling the client and proxy processes late). Virtual time,
//! deterministic: tests assert exact counts.

use super::global::{local_report, Ledger, Report};
use super::sched::{ReqId, Scheduler, TenantId};
use super::sim::Device;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

/// A closed-loop striping client.
#[derive(Debug, Clone)]
pub struct Striper {
    pub tenant: TenantId,
    /// Servers it stripes over, in stripe order.
    pub servers: Vec<usize>,
    pub chunk: u64,
    /// Chunks per request (on consecutive servers of the list).
    pub chunks: usize,
    /// Requests it keeps outstanding.
    pub outstanding: usize,
    /// Stripe position of its first chunk.
    pub start: usize,
    /// It issues no request from this time on.
    pub until: Option<Duration>,
    /// How long it waits after a request completes before it sends the next
    /// (think time: an application that computes between its I/Os).
    pub think: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// Client `c` issues a request.
    Issue(usize),
    /// A chunk reaches server `s`'s scheduler (request index).
    Arrive(usize, usize),
    Done(usize, ReqId),
    Tick,
    Deliver(usize, usize),
    Wake(usize),
}

struct Server {
    sched: Scheduler,
    ledger: Ledger,
    dev: Device,
    busy: usize,
    fifo: VecDeque<ReqId>,
    /// Chunk request id -> client request index.
    chunks: HashMap<ReqId, usize>,
    seq: u64,
    silent_from: Option<Duration>,
    wake_at: Option<Duration>,
}

struct Request {
    client: usize,
    left: usize,
    bytes: u64,
}

pub struct Cluster {
    servers: Vec<Server>,
    names: Vec<String>,
    clients: Vec<Striper>,
    pos: Vec<usize>,
    requests: Vec<Request>,
    heap: BinaryHeap<Reverse<(Duration, u64, Kind)>>,
    seq: u64,
    pub now: Duration,
    /// Report period and transit delay; `None`: no reports at all (local only).
    exchange: Option<(Duration, Duration)>,
    /// Reports in transit, by delivery key.
    in_transit: HashMap<usize, Report>,
    next_key: usize,
    /// Per tenant: client-level completions (time, bytes).
    pub done: Vec<Vec<(Duration, u64)>>,
    /// Per server and tenant: bytes completed there.
    pub served: Vec<Vec<u64>>,
    /// Largest extra delay of a chunk on its way to its server, and the
    /// state of the generator that draws it (xorshift64).
    jitter: Duration,
    rng: u64,
    /// Largest extra delay of a report on its way to a peer (its sender or
    /// receiver thread scheduled late).
    report_jitter: Duration,
}

impl Cluster {
    /// `make` builds each server's scheduler (with tenants 0..names.len() added in order).
    pub fn new(
        servers: usize,
        dev: Device,
        names: &[&str],
        make: impl Fn() -> Scheduler,
        clients: Vec<Striper>,
        exchange: Option<(Duration, Duration)>,
    ) -> Self {
        let timeout = make().config().global.as_ref().map_or(Duration::from_millis(500), |g| g.peer_timeout);
        let servers: Vec<Server> = (0..servers)
            .map(|_| Server {
                sched: make(),
                ledger: Ledger::new(timeout),
                dev,
                busy: 0,
                fifo: VecDeque::new(),
                chunks: HashMap::new(),
                seq: 0,
                silent_from: None,
                wake_at: None,
            })
            .collect();
        let n = servers.len();
        let mut c = Cluster {
            served: vec![vec![0; names.len()]; n],
            servers,
            names: names.iter().map(|s| s.to_string()).collect(),
            pos: clients.iter().map(|c| c.start).collect(),
            clients,
            requests: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            now: Duration::ZERO,
            exchange,
            in_transit: HashMap::new(),
            next_key: 0,
            done: vec![Vec::new(); names.len()],
            jitter: Duration::ZERO,
            rng: 1,
            report_jitter: Duration::ZERO,
        };
        for i in 0..c.clients.len() {
            for _ in 0..c.clients[i].outstanding {
                c.push(Duration::ZERO, Kind::Issue(i));
            }
        }
        if c.exchange.is_some() {
            c.push(Duration::ZERO, Kind::Tick);
        }
        c
    }

    /// Server `s` sends no report from `at` on.
    pub fn silence(&mut self, s: usize, at: Duration) {
        self.servers[s].silent_from = Some(at);
    }

    /// Every chunk from now on reaches its server up to `max` late (uniform,
    /// drawn from a generator seeded with `seed`).
    pub fn jitter(&mut self, max: Duration, seed: u64) {
        self.jitter = max;
        self.rng = seed.max(1);
    }

    /// Every report from now on reaches each peer up to `max` late (drawn
    /// from the same generator as chunk delays).
    pub fn jitter_reports(&mut self, max: Duration) {
        self.report_jitter = max;
    }

    fn delay(&mut self) -> Duration {
        self.draw(self.jitter)
    }

    fn draw(&mut self, max: Duration) -> Duration {
        if max.is_zero() {
            return Duration::ZERO;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        Duration::from_nanos(self.rng % max.as_nanos() as u64)
    }

    pub fn sched(&self, s: usize) -> &Scheduler {
        &self.servers[s].sched
    }

    pub fn sched_mut(&mut self, s: usize) -> &mut Scheduler {
        &mut self.servers[s].sched
    }

    /// Bytes each tenant completed (client level) in (from, to].
    pub fn bytes_between(&self, from: Duration, to: Duration) -> Vec<u64> {
        self.done.iter().map(|d| d.iter().filter(|(t, _)| *t > from && *t <= to).map(|(_, b)| b).sum()).collect()
    }

    fn push(&mut self, at: Duration, kind: Kind) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, kind)));
    }

    fn issue(&mut self, c: usize) {
        let cl = &self.clients[c];
        let r = self.requests.len();
        self.requests.push(Request { client: c, left: cl.chunks, bytes: cl.chunk * cl.chunks as u64 });
        let servers: Vec<usize> = (0..cl.chunks).map(|k| cl.servers[(self.pos[c] + k) % cl.servers.len()]).collect();
        self.pos[c] += cl.chunks;
        for s in servers {
            let at = self.now + self.delay();
            self.push(at, Kind::Arrive(s, r));
        }
    }

    fn pump(&mut self, s: usize) {
        let now = self.now;
        let sv = &mut self.servers[s];
        while let Some(d) = sv.sched.dispatch(now) {
            if sv.busy < sv.dev.servers {
                sv.busy += 1;
                let bytes = self.clients[self.requests[sv.chunks[&d.req]].client].chunk;
                let at = now + sv.dev.service(bytes);
                self.seq += 1;
                self.heap.push(Reverse((at, self.seq, Kind::Done(s, d.req))));
            } else {
                sv.fifo.push_back(d.req);
            }
        }
        let wake = sv.sched.next_wakeup(now).filter(|&t| t > now);
        if wake.is_some() && wake != sv.wake_at {
            sv.wake_at = wake;
            self.push(wake.expect("checked"), Kind::Wake(s));
        }
    }

    fn handle(&mut self, kind: Kind) {
        let now = self.now;
        match kind {
            Kind::Issue(c) if self.clients[c].until.is_some_and(|u| now >= u) => {}
            Kind::Issue(c) => self.issue(c),
            Kind::Arrive(s, r) => {
                let tenant = self.clients[self.requests[r].client].tenant;
                let bytes = self.clients[self.requests[r].client].chunk;
                let req = self.servers[s].sched.enqueue(tenant, bytes, now);
                self.servers[s].chunks.insert(req, r);
                self.pump(s);
            }
            Kind::Done(s, req) => {
                let sv = &mut self.servers[s];
                let (tenant, _) = sv.sched.complete(req, now).expect("known chunk");
                let r = sv.chunks.remove(&req).expect("known chunk");
                sv.busy -= 1;
                if let Some(next) = sv.fifo.pop_front() {
                    sv.busy += 1;
                    let bytes = self.clients[self.requests[sv.chunks[&next]].client].chunk;
                    let at = now + sv.dev.service(bytes);
                    self.push(at, Kind::Done(s, next));
                }
                self.served[s][tenant] += self.clients[self.requests[r].client].chunk;
                let rq = &mut self.requests[r];
                rq.left -= 1;
                if rq.left == 0 {
                    let c = rq.client;
                    self.done[self.clients[c].tenant].push((now, rq.bytes));
                    self.push(now + self.clients[c].think, Kind::Issue(c));
                }
                self.pump(s);
            }
            Kind::Tick => self.tick(),
            Kind::Deliver(to, key) => {
                let r = self.in_transit.remove(&key).expect("report in transit");
                let sv = &mut self.servers[to];
                let on = sv.sched.config().global.is_some();
                sv.ledger.apply_to(&mut sv.sched, &self.names, &r, now, on);
                self.pump(to);
            }
            Kind::Wake(s) => {
                if self.servers[s].wake_at == Some(now) {
                    self.servers[s].wake_at = None;
                }
                self.pump(s);
            }
        }
    }

    /// Every server reports to every other; everyone re-judges its peers.
    fn tick(&mut self) {
        let Some((period, delay)) = self.exchange else { return };
        let now = self.now;
        for s in 0..self.servers.len() {
            let sv = &mut self.servers[s];
            let on = sv.sched.config().global.is_some();
            sv.ledger.refresh(&mut sv.sched, &self.names, now, on);
            sv.ledger.converge(&mut sv.sched, &self.names, now, on);
            if sv.silent_from.is_some_and(|t| now >= t) {
                continue;
            }
            sv.seq += 1;
            let r = Report { from: format!("s{s}"), incarnation: 1, seq: sv.seq, tenants: local_report(&mut sv.sched, &self.names) };
            for to in (0..self.servers.len()).filter(|&to| to != s) {
                let key = self.next_key;
                self.next_key += 1;
                self.in_transit.insert(key, r.clone());
                let late = self.draw(self.report_jitter);
                self.push(now + delay + late, Kind::Deliver(to, key));
            }
        }
        for s in 0..self.servers.len() {
            self.pump(s);
        }
        self.push(now + period, Kind::Tick);
    }

    /// Run until virtual time `until`.
    pub fn run(&mut self, until: Duration) {
        while let Some(Reverse((t, _, _))) = self.heap.peek().copied() {
            if t > until {
                break;
            }
            let Reverse((t, _, kind)) = self.heap.pop().expect("peeked");
            self.now = t;
            self.handle(kind);
        }
        self.now = until;
    }
}
