//! A peer over the in-memory model, for the claim's and the session's
//! tests: a source and a peer etcd of their own, a fixed wall clock and
//! fixed ids, so that every claim decides the same way on every run.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aether_etcd::model::{self, Cluster, ModelConfig};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use super::{Peer, Shared};
use crate::etcd::{
    self, LeaseGrant, LeaseId, LeaseStatus, LeaseTtl, Put, Range, RangeResponse, Scan, Txn,
    TxnResponse, WatchOptions, WatchResponse,
};
use crate::mirror::clock::Clock;
use crate::mirror::config::MirrorConfig;
use crate::mirror::live::tick::Ticks;
use crate::mirror::state::State;
use crate::mirror::stats::PeerStats;
use crate::store::{Backend, Lease, Store, WatchEvents, WatchHealth};

pub(crate) const HOLDER: u64 = 0xa1;
/// What the fixed id source hands out: the source id a fresh source gets.
pub(crate) const SOURCE_ID: u64 = 0x5;
pub(crate) const SOURCE_CLUSTER: u64 = 0x50;
pub(crate) const PEER_CLUSTER: u64 = 0xb0;
pub(crate) const NOW_MS: i64 = 1_800_000_000_000;
pub(crate) const TTL: Duration = Duration::from_secs(10);

/// Every keep-alive handed out, for a test to report them lost.
type KeptAlives = Arc<Mutex<Vec<Arc<watch::Sender<LeaseStatus>>>>>;

/// The lease grants and revokes made on the peer, each with the peer's
/// revision when it was asked for.
pub(crate) type LeaseCalls = Arc<Mutex<Vec<(&'static str, i64)>>>;

/// The model, with keep-alives and watches: the claim takes a handle on
/// every lease it uses, a sync opens its watch first, and the model's own
/// backend refuses both.
struct KeptAlive {
    model: model::Client,
    store: Store,
    kept: KeptAlives,
    /// The peer's only, with the peer's cluster.
    lease_calls: Option<LeaseCalls>,
    cluster: Option<Cluster>,
    /// Single reads asked of this store (not scans, not txns).
    ranges: Arc<AtomicU64>,
    /// Txns asked of this store that count keys.
    txns: Arc<AtomicU64>,
    /// How long each lease grant waits before it goes (a test's).
    grant_delay: Arc<Mutex<Duration>>,
}

impl KeptAlive {
    /// Books a lease call, with the cluster's revision read on the spot: a
    /// read through the model would delay the call, and a grant sent ahead
    /// of a txn must stay ahead of it.
    fn book(&self, call: &'static str) {
        if let (Some(calls), Some(cluster)) = (&self.lease_calls, &self.cluster) {
            calls.lock().unwrap().push((call, cluster.revision()));
        }
    }
}

/// A keep-alive that is never lost unless a test says so.
pub(crate) struct Held(Arc<watch::Sender<LeaseStatus>>, LeaseId);

impl Held {
    pub(crate) fn new(id: LeaseId, ttl: Duration) -> Held {
        let mut status = LeaseStatus::default();
        status.last_ok = Some(tokio::time::Instant::now());
        status.ttl = ttl;
        Held(Arc::new(watch::Sender::new(status)), id)
    }
}

struct Health(u64);

impl WatchHealth for Health {
    fn member_id(&self) -> Option<u64> {
        Some(self.0)
    }

    fn reconnects(&self) -> u64 {
        0
    }

    fn is_connected(&self) -> bool {
        true
    }
}

struct Events(model::Watcher);

impl WatchEvents for Events {
    fn next_response(&mut self) -> BoxFuture<'_, Option<etcd::Result<WatchResponse>>> {
        Box::pin(futures_util::StreamExt::next(&mut self.0))
    }

    fn next_buffered(&mut self) -> Option<etcd::Result<WatchResponse>> {
        self.0.next_buffered()
    }
}

impl Lease for Held {
    fn id(&self) -> LeaseId {
        self.1
    }

    fn subscribe(&self) -> watch::Receiver<LeaseStatus> {
        self.0.subscribe()
    }
}

impl Backend for KeptAlive {
    fn range(&self, req: Range) -> BoxFuture<'_, etcd::Result<RangeResponse>> {
        self.ranges.fetch_add(1, SeqCst);
        Box::pin(self.store.range(req))
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, etcd::Result<TxnResponse>> {
        // A count is a txn of `count_only` ranges; a repair's or a pass's
        // reads are not. The client's `Txn` shows its ops only in its
        // `Debug` form, which is good enough for a test's tally.
        if format!("{txn:?}").contains("count_only: true") {
            self.txns.fetch_add(1, SeqCst);
        }
        Box::pin(self.store.txn(txn))
    }

    fn scan(&self, from: Bytes, end: Bytes, page_size: usize, revision: i64) -> Scan {
        self.store.scan(from, end, page_size, revision)
    }

    fn watch(
        &self,
        opts: WatchOptions,
    ) -> etcd::Result<(Box<dyn WatchHealth>, Box<dyn WatchEvents>)> {
        let w = self.model.watch(opts)?;
        Ok((Box::new(Health(w.member_id())), Box::new(Events(w))))
    }

    fn lease_grant(&self, id: LeaseId, ttl: Duration) -> BoxFuture<'_, etcd::Result<LeaseGrant>> {
        Box::pin(async move {
            let delay = *self.grant_delay.lock().unwrap();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            self.book("grant");
            self.store.lease_grant_with_id(id, ttl).await
        })
    }

    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, etcd::Result<()>> {
        Box::pin(async move {
            self.book("revoke");
            self.store.lease_revoke(id).await
        })
    }

    fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> BoxFuture<'_, etcd::Result<LeaseTtl>> {
        Box::pin(self.store.lease_time_to_live(id, keys))
    }

    fn keep_alive(
        &self,
        id: LeaseId,
        ttl: Duration,
    ) -> BoxFuture<'_, etcd::Result<Box<dyn Lease>>> {
        let held = Held::new(id, ttl);
        self.kept.lock().unwrap().push(held.0.clone());
        Box::pin(async move { Ok(Box::new(held) as Box<dyn Lease>) })
    }

    fn endpoints(&self) -> Vec<String> {
        self.store.endpoints()
    }

    fn timeout(&self) -> Duration {
        self.store.timeout()
    }
}

/// The two etcds a peer's task talks to.
pub(crate) struct Rig {
    pub(crate) source_cluster: Cluster,
    pub(crate) source: model::Client,
    pub(crate) peer_cluster: Cluster,
    pub(crate) peer: model::Client,
    pub(crate) state_key: String,
    kept: KeptAlives,
    pub(crate) lease_calls: LeaseCalls,
    /// Single reads the task asked of the source, and of the peer.
    pub(crate) source_ranges: Arc<AtomicU64>,
    pub(crate) peer_ranges: Arc<AtomicU64>,
    /// Txns the task asked of the source that count keys.
    pub(crate) source_counts: Arc<AtomicU64>,
    /// How long the task's lease grants on the peer wait before they go.
    pub(crate) grant_delay: Arc<Mutex<Duration>>,
}

impl Rig {
    /// The state key on the peer, if any.
    pub(crate) async fn state(&self) -> Option<State> {
        let resp = self
            .peer
            .range(Range::key(self.state_key.clone()))
            .await
            .unwrap();
        resp.kvs()
            .first()
            .map(|kv| State::decode(kv.value()).unwrap())
    }

    /// Writes `st` as the peer's state key, attached to its lease.
    pub(crate) async fn put_state(&self, st: State) {
        let put = Put::new(self.state_key.clone(), st.encode()).lease(st.lease);
        self.peer.put(put).await.unwrap();
    }

    /// A lease on the peer, as a predecessor would have granted it.
    pub(crate) async fn grant(&self, ttl: Duration) -> LeaseId {
        self.peer.lease_grant(ttl).await.unwrap().id
    }

    /// Every lease the peer holds, once any revoke in flight has landed.
    pub(crate) async fn leases(&self) -> Vec<LeaseId> {
        // Revokes go in tasks of their own, through the model's latency.
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.peer.lease_list().await.unwrap().ids
    }

    /// Every keep-alive handed out reports its lease lost, as the client's
    /// does once the peer answers TTL 0.
    pub(crate) fn lose_leases(&self) {
        for kept in self.kept.lock().unwrap().iter() {
            kept.send_modify(|s| s.lost = true);
        }
    }

    /// Puts `n` keys under `prefix` in the source, a revision each.
    pub(crate) async fn fill_source(&self, prefix: &str, n: usize) {
        for i in 0..n {
            let put = Put::new(format!("{prefix}{i:05}"), "v");
            self.source.put(put).await.unwrap();
        }
    }

    /// Moves the source `n` revisions on.
    pub(crate) async fn write_source(&self, n: usize) {
        for i in 0..n {
            self.source
                .put(Put::new(format!("/src/{i}"), "v"))
                .await
                .unwrap();
        }
    }
}

/// A state key another engine of this region (holder 7) wrote for a
/// complete copy of our source through `revision`, under `lease`.
pub(crate) fn predecessor(revision: i64, lease: LeaseId) -> State {
    State {
        revision,
        lease,
        holder: 7,
        source_cluster: SOURCE_CLUSTER,
        source_id: SOURCE_ID,
        heartbeat_unix_ms: NOW_MS - 2_000,
        synced: true,
        lease_ttl: TTL.as_secs() as i64,
    }
}

/// A fresh peer task, with `cfg` over the defaults; `peer` is the peer's
/// model config.
pub(crate) fn rig(
    cfg: impl FnOnce(MirrorConfig) -> MirrorConfig,
    peer: ModelConfig,
) -> (Peer, Rig) {
    let source_cluster = Cluster::new(ModelConfig::default().with_cluster_id(SOURCE_CLUSTER));
    let source = source_cluster.client(0);
    let peer_cluster = Cluster::new(peer.with_cluster_id(PEER_CLUSTER));
    let peer_model = peer_cluster.client(0);
    let base = MirrorConfig {
        lease_ttl: TTL,
        clock: Clock::supplied(|| NOW_MS, || SOURCE_ID),
        ..MirrorConfig::new("a")
    };
    let cfg = cfg(base);
    let kept = KeptAlives::default();
    let lease_calls = LeaseCalls::default();
    let (source_ranges, peer_ranges) = (Arc::default(), Arc::default());
    let (source_counts, peer_txns): (Arc<AtomicU64>, _) = (Arc::default(), Arc::default());
    let grant_delay = Arc::<Mutex<Duration>>::default();
    let store = |model: &model::Client,
                 lease_calls: Option<LeaseCalls>,
                 ranges: &Arc<AtomicU64>,
                 txns: &Arc<AtomicU64>| {
        Store::new(KeptAlive {
            model: model.clone(),
            store: Store::new(model.clone()),
            kept: kept.clone(),
            cluster: lease_calls.is_some().then(|| peer_cluster.clone()),
            lease_calls,
            ranges: ranges.clone(),
            txns: txns.clone(),
            grant_delay: grant_delay.clone(),
        })
    };
    let state_key = cfg.state_key();
    let (source_id_key, heartbeat) = (cfg.source_id_key(), cfg.heartbeat_interval);
    let task = Peer::new(
        "b".into(),
        store(&source, None, &source_ranges, &source_counts),
        store(
            &peer_model,
            Some(lease_calls.clone()),
            &peer_ranges,
            &peer_txns,
        ),
        Arc::new(cfg),
        Arc::new(PeerStats::new("b")),
        HOLDER,
        Shared {
            cancel: CancellationToken::new(),
            pause: CancellationToken::new(),
            sync_slots: Arc::new(Semaphore::new(1)),
            ticks: Arc::new(Ticks::new(
                store(&source, None, &source_ranges, &source_counts),
                Bytes::from(source_id_key),
                heartbeat,
                NOW_MS,
            )),
        },
    );
    let rig = Rig {
        source_cluster,
        source,
        peer_cluster,
        peer: peer_model,
        state_key,
        kept,
        lease_calls,
        source_ranges,
        peer_ranges,
        source_counts,
        grant_delay,
    };
    (task, rig)
}
