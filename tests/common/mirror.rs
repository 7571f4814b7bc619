//! Helpers for tests that run the mirror engine: clients with short
//! timeouts, a test config, key generation, and the convergence oracle.

use aether_replicator::etcd::LeaseId;
use std::time::Duration;

use aether_replicator::etcd::{Client, ClientConfig, Put, Range, TxnBatcher, TxnLimits};
use aether_replicator::mirror::MirrorConfig;
use aether_replicator::mirror::check::{self, Report};
use aether_replicator::mirror::state::State;

/// Bound on every wait for convergence.
pub(crate) const CONVERGE: Duration = Duration::from_secs(30);

/// Region a's subtree.
pub(crate) const PREFIX: &str = "/aether/v1/regions/a/";

/// A client with short timeouts, so faults surface quickly.
pub(crate) fn client(endpoint: &str) -> Client {
    let mut cfg = ClientConfig::new([endpoint]);
    cfg.request_timeout = Duration::from_secs(3);
    cfg.connect_timeout = Duration::from_secs(1);
    Client::connect(cfg).expect("client")
}

/// Region a's engine config with a short lease and backoff.
pub(crate) fn config(ttl_secs: u64) -> MirrorConfig {
    config_for("a", ttl_secs)
}

/// The same for any region.
pub(crate) fn config_for(region: &str, ttl_secs: u64) -> MirrorConfig {
    let mut cfg = MirrorConfig::new(region);
    cfg.lease_ttl = Duration::from_secs(ttl_secs);
    cfg.max_backoff = Duration::from_millis(500);
    cfg.page_size = 100;
    cfg
}

/// A config whose freshness probe runs every 300 ms, so identity changes
/// are noticed quickly; no lapse and no verification unless a test asks.
pub(crate) fn fast(ttl_secs: u64) -> MirrorConfig {
    config(ttl_secs)
        .with_heartbeat_interval(Duration::from_millis(300))
        .with_lapse_after(None)
        .with_verify_interval(None)
}

/// [`fast`] without the copy watch: only the key count and the
/// verification pass see out-of-band changes, as when the watch has a gap.
/// For the tests of those backstops.
pub(crate) fn backstop(ttl_secs: u64) -> MirrorConfig {
    fast(ttl_secs).without_copy_watch()
}

/// One put per revision, so the source's history is as long as `n`.
pub(crate) async fn put_each(c: &Client, range: std::ops::Range<usize>, value: &str) {
    for i in range {
        c.put(Put::new(key(i), format!("{value}{i}")))
            .await
            .unwrap();
    }
}

pub(crate) async fn state_on(peer: &Client, cfg: &MirrorConfig) -> Option<State> {
    let resp = peer.range(Range::key(cfg.state_key())).await.unwrap();
    resp.kvs().first().and_then(|kv| State::decode(kv.value()))
}

/// The i-th endpoint key of region a.
pub(crate) fn key(i: usize) -> String {
    key_in("a", i)
}

/// The i-th endpoint key of `region`.
pub(crate) fn key_in(region: &str, i: usize) -> String {
    format!(
        "/aether/v1/regions/{region}/clusters/c1/services/s{}/protocols/http/endpoints/10.0.{}.{}",
        i % 13,
        i / 256,
        i % 256
    )
}

/// Writes `items` in batched txns.
pub(crate) async fn put_many(c: &Client, items: impl IntoIterator<Item = (String, String)>) {
    put_in_revisions_of(c, TxnLimits::default().max_ops, items).await
}

/// [`put_many`] in txns of at most `ops` puts: one source revision each.
pub(crate) async fn put_in_revisions_of(
    c: &Client,
    ops: usize,
    items: impl IntoIterator<Item = (String, String)>,
) {
    let limits = TxnLimits {
        max_ops: ops,
        ..TxnLimits::default()
    };
    let mut b = TxnBatcher::new(limits);
    for (k, v) in items {
        b.put(k, v, LeaseId::NONE);
    }
    for t in b.finish() {
        c.txn(t).await.expect("txn");
    }
}

/// Keys under `prefix`.
pub(crate) async fn count(c: &Client, prefix: &str) -> i64 {
    c.range(Range::prefix(prefix.to_string()).count_only())
        .await
        .map(|r| r.count)
        .unwrap_or(-1)
}

/// Polls `cond` until it holds, for at most [`CONVERGE`]; panics naming `what`.
/// The one place a test waits for the system to get somewhere.
pub(crate) async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + CONVERGE;
    while tokio::time::Instant::now() < deadline {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within {CONVERGE:?}: {what}");
}

/// Polls `get` until it returns `want`; panics with the last value seen.
pub(crate) async fn eventually_eq<T: PartialEq + std::fmt::Debug>(
    what: &str,
    want: T,
    mut get: impl AsyncFnMut() -> T,
) {
    let deadline = tokio::time::Instant::now() + CONVERGE;
    let mut last = get().await;
    while last != want && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        last = get().await;
    }
    assert_eq!(last, want, "not within {CONVERGE:?}: {what}");
}

/// Polls `check` until the copy matches (same keys and values, every key on
/// the live lease the state key names); panics with the last report.
pub(crate) async fn converged(src: &Client, dst: &Client, cfg: &MirrorConfig) -> Report {
    let mut last = None;
    let deadline = tokio::time::Instant::now() + CONVERGE;
    while tokio::time::Instant::now() < deadline {
        match check::compare(src, dst, cfg).await {
            Ok(r) if r.matches() => return r,
            Ok(r) => last = Some(format!("{r:#?}")),
            Err(e) => last = Some(format!("check failed: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("peer did not converge: {}", last.unwrap_or_default());
}

/// Byte-for-byte contents under `prefix`.
pub(crate) async fn contents(c: &Client, prefix: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut scan = c.scan_prefix(prefix.to_string(), 1000, 0);
    while let Some(p) = scan.next_page().await.expect("scan") {
        out.extend(p.kvs.into_iter().map(|kv| {
            let (k, v) = kv.into_key_value();
            (k.to_vec(), v.to_vec())
        }));
    }
    out
}

/// Starts region a's engine mirroring `src` into `peer` (as region b),
/// waits until it is live and `observe` (the peer as seen directly, not
/// through a proxy) holds an exact copy.
pub(crate) async fn start_synced(
    src: &Client,
    peer: Client,
    observe: &Client,
    cfg: &MirrorConfig,
) -> aether_replicator::mirror::Engine {
    let engine = aether_replicator::mirror::Engine::start(
        src.clone(),
        vec![("b".into(), peer)],
        cfg.clone(),
    )
    .expect("engine");
    tokio::time::timeout(CONVERGE, engine.wait_synced())
        .await
        .expect("engine synced");
    converged(src, observe, cfg).await;
    engine
}

/// The common scene: a source etcd and a peer etcd, with clients to each.
pub(crate) struct Scene {
    /// Region a's etcd, the source.
    pub src_etcd: crate::common::Etcd,
    /// Region b's etcd, the peer.
    pub peer_etcd: crate::common::Etcd,
    /// A client of the source.
    pub src: Client,
    /// A client of the peer, straight (not through a proxy).
    pub peer: Client,
}

impl Scene {
    /// Two fresh etcds.
    pub(crate) fn start() -> Scene {
        Scene::with(crate::common::Etcd::start(), crate::common::Etcd::start())
    }

    /// A scene over etcds the test built itself (extra flags).
    pub(crate) fn with(src_etcd: crate::common::Etcd, peer_etcd: crate::common::Etcd) -> Scene {
        let src = client(&src_etcd.endpoint());
        let peer = client(&peer_etcd.endpoint());
        Scene {
            src_etcd,
            peer_etcd,
            src,
            peer,
        }
    }

    /// Clones of the two clients, for a test that keeps the etcds running
    /// (in `self`) without touching them.
    pub(crate) fn clients(&self) -> (Client, Client) {
        (self.src.clone(), self.peer.clone())
    }
}

/// A tiny deterministic generator for randomized tests (no extra crates).
pub(crate) struct Lcg(pub u64);

impl Lcg {
    /// The next value, 31 bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// A value in `0..n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
