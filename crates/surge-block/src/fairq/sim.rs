//! A discrete-event simulation for the scheduler's tests: closed-loop streams
//! (each re-issues as soon as its request completes) against a device with a few
//! parallel servers and a FIFO queue of its own, on virtual time. Deterministic,
//! so tests can assert exact counts.

use super::sched::{Dispatch, ReqId, Scheduler, TenantId};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct Device {
    /// Requests served at once; more wait in the device's own FIFO.
    pub servers: usize,
    pub bytes_per_sec: u64,
    /// Fixed time per request on top of the transfer.
    pub fixed: Duration,
}

impl Device {
    pub fn service(&self, bytes: u64) -> Duration {
        self.fixed + Duration::from_nanos((bytes as u128 * 1_000_000_000 / self.bytes_per_sec as u128) as u64)
    }
}

/// `streams` closed-loop streams of a tenant, from `start` on.
#[derive(Debug, Clone)]
pub struct Load {
    pub tenant: TenantId,
    pub streams: usize,
    /// Request sizes, used in turn (per tenant).
    pub sizes: Vec<u64>,
    pub start: Duration,
}

impl Load {
    pub fn new(tenant: TenantId, streams: usize, bytes: u64) -> Self {
        Load { tenant, streams, sizes: vec![bytes], start: Duration::ZERO }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event {
    Dispatched(Dispatch),
    Completed { req: ReqId, tenant: TenantId, latency: Duration },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Start(usize),
    Done(ReqId),
}

pub struct Sim {
    pub sched: Scheduler,
    pub now: Duration,
    dev: Device,
    loads: Vec<Load>,
    next_size: Vec<usize>,
    heap: BinaryHeap<Reverse<(Duration, u64, Kind)>>,
    seq: u64,
    busy: usize,
    fifo: VecDeque<ReqId>,
    reqs: HashMap<ReqId, (usize, u64)>,
}

impl Sim {
    pub fn new(sched: Scheduler, dev: Device, loads: Vec<Load>) -> Self {
        let mut sim = Sim {
            sched,
            now: Duration::ZERO,
            dev,
            next_size: vec![0; loads.len()],
            loads,
            heap: BinaryHeap::new(),
            seq: 0,
            busy: 0,
            fifo: VecDeque::new(),
            reqs: HashMap::new(),
        };
        for (i, l) in sim.loads.clone().iter().enumerate() {
            for _ in 0..l.streams {
                sim.push(l.start, Kind::Start(i));
            }
        }
        sim
    }

    fn push(&mut self, at: Duration, kind: Kind) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, kind)));
    }

    fn issue(&mut self, load: usize) {
        let l = &self.loads[load];
        let bytes = l.sizes[self.next_size[load] % l.sizes.len()];
        self.next_size[load] += 1;
        let req = self.sched.enqueue(l.tenant, bytes, self.now);
        self.reqs.insert(req, (load, bytes));
    }

    fn serve(&mut self, req: ReqId) {
        let bytes = self.reqs[&req].1;
        self.busy += 1;
        let done = self.now + self.dev.service(bytes);
        self.push(done, Kind::Done(req));
    }

    fn pump(&mut self, obs: &mut impl FnMut(&Scheduler, Duration, Event)) {
        while let Some(d) = self.sched.dispatch(self.now) {
            obs(&self.sched, self.now, Event::Dispatched(d));
            if self.busy < self.dev.servers {
                self.serve(d.req);
            } else {
                self.fifo.push_back(d.req);
            }
        }
    }

    fn handle(&mut self, kind: Kind, obs: &mut impl FnMut(&Scheduler, Duration, Event)) {
        match kind {
            Kind::Start(load) => self.issue(load),
            Kind::Done(req) => {
                let (tenant, latency) = self.sched.complete(req, self.now).expect("known request");
                obs(&self.sched, self.now, Event::Completed { req, tenant, latency });
                self.busy -= 1;
                if let Some(next) = self.fifo.pop_front() {
                    self.serve(next);
                }
                let (load, _) = self.reqs.remove(&req).expect("known request");
                self.issue(load);
            }
        }
    }

    /// Run until virtual time `until`, reporting every dispatch and completion.
    pub fn run(&mut self, until: Duration, mut obs: impl FnMut(&Scheduler, Duration, Event)) {
        loop {
            self.pump(&mut obs);
            let event = self.heap.peek().map(|r| r.0 .0);
            let wake = self.sched.next_wakeup(self.now);
            let Some(t) = [event, wake].into_iter().flatten().min() else { break };
            if t > until {
                break;
            }
            self.now = t;
            // Everything due at t happens before the scheduler picks.
            while self.heap.peek().is_some_and(|r| r.0 .0 == t) {
                let Reverse((_, _, kind)) = self.heap.pop().expect("peeked");
                self.handle(kind, &mut obs);
            }
        }
        self.now = until;
    }
}
