//! Helpers for tests that run the mirror engine: clients with short
//! timeouts, a test config, key generation, and the convergence oracle.

use aether_replicator::etcd::LeaseId;
use std::collections::BTreeMap;
use std::time::Duration;

use aether_replicator::etcd::{Client, ClientConfig, Put, Range, TxnBatcher, TxnLimits};
use aether_replicator::mirror::state::State;
use aether_replicator::mirror::{ErrorKind, MirrorConfig, PeerStats, ResyncReason};
use std::sync::atomic::Ordering::Relaxed;

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

/// What a peer's stats say, for a wait on them that gives up: the
/// counters the tests here wait on, and the errors and re-syncs so far.
pub(crate) fn saw(s: &PeerStats) -> String {
    let mut out = format!(
        "synced={} lapsed={} lease={} verify runs={} repairs={} out_of_band={} repaired={} copy_counts={} pieces={}",
        s.is_synced(),
        s.lapsed.load(Relaxed),
        s.lease_id.load(Relaxed),
        s.verify_runs.load(Relaxed),
        s.verify_repairs.load(Relaxed),
        s.out_of_band.load(Relaxed),
        s.repaired.load(Relaxed),
        s.copy_counts.load(Relaxed),
        s.count_pieces.load(Relaxed),
    );
    for r in ResyncReason::ALL {
        if s.resyncs(r) > 0 {
            out += &format!(" resync[{}]={}", r.as_str(), s.resyncs(r));
        }
    }
    for k in ErrorKind::ALL {
        if s.errors(k) > 0 {
            out += &format!(" error[{}]={}", k.as_str(), s.errors(k));
        }
    }
    out
}

/// A probe on a peer's stats for the kit's `eventually`: done when `cond`
/// holds, else what the stats say ([`saw`]).
pub(crate) fn when(cond: bool, s: &PeerStats) -> Result<(), String> {
    if cond { Ok(()) } else { Err(saw(s)) }
}

/// What [`converged`] found once the copy matched.
#[derive(Clone, Debug)]
pub(crate) struct Converged {
    /// Keys in the source subtree (and so on the peer).
    pub source_keys: u64,
    /// The peer's state key (always present once converged).
    pub state: Option<State>,
}

/// Keys per request of the oracle's own paging.
const ORACLE_PAGE: i64 = 1000;
/// Keys listed per kind of difference in the oracle's panic message.
const ORACLE_LISTED: usize = 8;

/// Everything under `prefix` as key -> (value, lease), read at one
/// revision (`at`, 0: the store's current one) in pages of at most
/// [`ORACLE_PAGE`] keys (fewer when a page is larger than the client
/// takes), paged here with plain ranges: nothing of the
/// engine's scanning or merging is involved.
async fn read_whole(
    c: &Client,
    prefix: &str,
    at: i64,
) -> Result<BTreeMap<Vec<u8>, (Vec<u8>, i64)>, String> {
    // Every key starting with `prefix` (which ends in '/', never 0xff).
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("a prefix") += 1;
    let mut from = prefix.as_bytes().to_vec();
    let mut rev = at;
    let mut out = BTreeMap::new();
    let mut limit = ORACLE_PAGE;
    loop {
        let mut req = Range::between(from.clone(), end.clone()).limit(limit);
        if rev > 0 {
            req = req.revision(rev);
        }
        let resp = match c.range(req).await {
            Ok(r) => r,
            // A page larger than the client takes (large values, a small
            // decode limit): fewer keys a page.
            Err(_) if limit > 1 => {
                limit = (limit / 4).max(1);
                continue;
            }
            Err(e) => return Err(format!("range of one key: {e}")),
        };
        rev = resp.header.revision;
        let Some(last) = resp.kvs().last().map(|kv| kv.key().to_vec()) else {
            return Ok(out);
        };
        for kv in resp.kvs() {
            out.insert(kv.key().to_vec(), (kv.value().to_vec(), kv.lease().get()));
        }
        if !resp.more {
            return Ok(out);
        }
        from = last;
        from.push(0);
    }
}

/// The `lease=` field of a state key's value (decimal), parsed here
/// rather than by the engine's [`State::decode`].
fn lease_field(value: &[u8]) -> Option<i64> {
    std::str::from_utf8(value)
        .ok()?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("lease="))?
        .parse()
        .ok()
}

fn sample(keys: &[&Vec<u8>]) -> String {
    let listed: Vec<_> = keys
        .iter()
        .take(ORACLE_LISTED)
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    let more = keys.len().saturating_sub(ORACLE_LISTED);
    if more > 0 {
        format!("{} {listed:?} and {more} more", keys.len())
    } else {
        format!("{} {listed:?}", keys.len())
    }
}

/// One look at the copy: `Ok` if it is exact (same keys and values as
/// the source, every key on the lease the state key names, that lease
/// alive), else what differs. Shares no code with the engine: both sides
/// are read whole with plain ranges and compared as maps.
async fn exact_copy(src: &Client, dst: &Client, cfg: &MirrorConfig) -> Result<Converged, String> {
    let prefix = cfg.prefix();
    // The state key first; the copy at the same revision of the peer, so
    // the two agree.
    let st = dst
        .range(Range::key(cfg.state_key()))
        .await
        .map_err(|e| format!("read the state key: {e}"))?;
    let at = st.header.revision;
    let state_value = st.kvs().first().map(|kv| kv.value().to_vec());
    let want = read_whole(src, &prefix, 0)
        .await
        .map_err(|e| format!("read the source: {e}"))?;
    let got = read_whole(dst, &prefix, at)
        .await
        .map_err(|e| format!("read the peer: {e}"))?;
    let missing: Vec<_> = want.keys().filter(|k| !got.contains_key(*k)).collect();
    let stray: Vec<_> = got.keys().filter(|k| !want.contains_key(*k)).collect();
    let differ: Vec<_> = want
        .iter()
        .filter(|(k, (v, _))| got.get(*k).is_some_and(|(g, _)| g != v))
        .map(|(k, _)| k)
        .collect();
    let lease = state_value.as_deref().and_then(lease_field);
    let wrong_lease: Vec<_> = got
        .iter()
        .filter(|(_, (_, l))| lease.is_none_or(|want| *l != want || want == 0))
        .map(|(k, _)| k)
        .collect();
    let ttl = match lease.filter(|&l| l != 0) {
        Some(l) => {
            dst.lease_time_to_live(LeaseId::new(l), false)
                .await
                .map_err(|e| format!("lease {l:x} time to live: {e}"))?
                .ttl
        }
        None => None,
    };
    if missing.is_empty()
        && stray.is_empty()
        && differ.is_empty()
        && wrong_lease.is_empty()
        && ttl.is_some_and(|t| !t.is_zero())
    {
        let state = state_value.as_deref().and_then(State::decode);
        if state.map(|s| s.lease.get()) != lease {
            return Err(format!(
                "the state key's lease field reads {lease:?}, the engine's decoding {state:?}"
            ));
        }
        return Ok(Converged {
            source_keys: want.len() as u64,
            state,
        });
    }
    Err(format!(
        "source {} keys, peer {} keys at revision {at}; missing {}; stray {}; \
         value differs {}; not on the state's lease {}; state key {:?}, its lease's TTL {ttl:?}",
        want.len(),
        got.len(),
        sample(&missing),
        sample(&stray),
        sample(&differ),
        sample(&wrong_lease),
        state_value.map(|v| String::from_utf8_lossy(&v).into_owned()),
    ))
}

/// Polls until the copy matches (same keys and values, every key on the
/// live lease the state key names); panics with what differed last.
///
/// The oracle is the test's own: both sides read whole with plain ranges
/// and compared as maps, not the product's `check::compare`, whose merge
/// the engine's sync shares (a paging bug there would hide itself).
pub(crate) async fn converged(src: &Client, dst: &Client, cfg: &MirrorConfig) -> Converged {
    let mut last = String::new();
    let deadline = tokio::time::Instant::now() + CONVERGE;
    while tokio::time::Instant::now() < deadline {
        match exact_copy(src, dst, cfg).await {
            Ok(c) => return c,
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("peer did not converge within {CONVERGE:?}: {last}");
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
    if tokio::time::timeout(CONVERGE, engine.wait_synced())
        .await
        .is_err()
    {
        let seen: Vec<String> = engine.stats().iter().map(|s| saw(s)).collect();
        panic!(
            "the engine was not synced within {CONVERGE:?}: {}",
            seen.join("; ")
        );
    }
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
