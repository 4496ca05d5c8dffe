//! `BlockDev::may_wait_remote` reaches through every layer: the NBD front end
//! runs small requests on a connection's intake thread unless the device says
//! they may wait on the network, so a layer that keeps the default `false`
//! over a remote device lets one base fetch hold up every request behind it.

use std::sync::Arc;
use surge_block::cache::{CacheConfig, ElasticCache};
use surge_block::fairq::{FairQueue, SchedConfig, TenantConfig};
use surge_block::fault::{FaultDev, FaultRules};
use surge_block::mirror::{Mirror, MirrorConfig};
use surge_block::stripe::{Stripe, StripeConfig};
use surge_block::{BlockDev, MemoryDev, Result, SystemClock};

const SIZE: u64 = 4 << 20;

/// A memory device that says every request waits on the network, as the NBD
/// client device does.
struct RemoteLike(MemoryDev);

impl BlockDev for RemoteLike {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.0.write_at(buf, offset, fua)
    }
    fn flush(&self) -> Result<()> {
        self.0.flush()
    }
    fn may_wait_remote(&self, _offset: u64, _len: u64, _write: bool) -> bool {
        true
    }
}

fn remote() -> Arc<dyn BlockDev> {
    Arc::new(RemoteLike(MemoryDev::new(SIZE)))
}

fn local() -> Arc<dyn BlockDev> {
    Arc::new(MemoryDev::new(SIZE))
}

fn clock() -> Arc<SystemClock> {
    Arc::new(SystemClock::new())
}

#[test]
fn a_stripe_asks_only_the_members_a_request_touches() {
    let s = Stripe::new(vec![local(), remote()], StripeConfig { chunk: 64 << 10, parallel: false }).unwrap();
    for write in [false, true] {
        assert!(!s.may_wait_remote(0, 4096, write), "chunk 0 is on the local member");
        assert!(s.may_wait_remote(64 << 10, 4096, write), "chunk 1 is on the remote member");
        assert!(s.may_wait_remote(60 << 10, 8192, write), "a request across both chunks touches the remote member");
    }
    assert!(!s.may_wait_remote(s.size(), 4096, false), "out of range is refused at once");
}

#[test]
fn a_mirror_waits_on_either_leg() {
    let meta: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(SIZE));
    let m = Mirror::create(remote(), local(), meta, MirrorConfig::default(), 1, clock()).unwrap();
    assert!(m.may_wait_remote(0, 4096, false) && m.may_wait_remote(0, 4096, true), "remote source");
    let meta: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(SIZE));
    let m = Mirror::create(local(), remote(), meta, MirrorConfig::default(), 1, clock()).unwrap();
    assert!(m.may_wait_remote(0, 4096, true), "a write goes to the remote target too");
    let meta: Arc<dyn BlockDev> = Arc::new(MemoryDev::new(SIZE));
    let m = Mirror::create(local(), local(), meta, MirrorConfig::default(), 1, clock()).unwrap();
    assert!(!m.may_wait_remote(0, 4096, true), "two local legs never wait");
}

#[test]
fn a_cache_waits_on_its_backing_or_its_cache_device() {
    let c = ElasticCache::new(remote(), CacheConfig::default(), clock());
    assert!(c.may_wait_remote(0, 4096, false), "a miss reads the remote backing");
    let c = ElasticCache::new(local(), CacheConfig::default(), clock());
    assert!(!c.may_wait_remote(0, 4096, false), "local backing, no cache device");
    c.attach(remote()).unwrap();
    assert!(c.may_wait_remote(0, 4096, true), "a remote cache device");
}

#[test]
fn a_tenant_and_a_fault_layer_pass_the_question_on() {
    let q = FairQueue::new(remote(), SchedConfig::default(), clock());
    assert!(q.tenant("a", TenantConfig::default()).may_wait_remote(0, 4096, false));
    let q = FairQueue::new(local(), SchedConfig::default(), clock());
    assert!(!q.tenant("a", TenantConfig::default()).may_wait_remote(0, 4096, false));
    let f = FaultDev::new(remote(), FaultRules::default(), clock());
    assert!(f.may_wait_remote(0, 4096, true));
    let f = FaultDev::new(local(), FaultRules::default(), clock());
    assert!(!f.may_wait_remote(0, 4096, true));
}
