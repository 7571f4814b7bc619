//! A peer over the in-memory model, for the claim's and the session's
//! tests: a source and a peer etcd of their own, a fixed wall clock and
//! fixed ids, so that every claim decides the same way on every run.

use std::sync::Arc;
use std::time::Duration;

use aether_etcd::model::{self, Cluster, ModelConfig};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

use super::{Peer, Shared};
use crate::etcd::{
    self, LeaseGrant, LeaseId, LeaseStatus, LeaseTtl, Put, Range, RangeResponse, Scan, Txn,
    TxnResponse, WatchOptions,
};
use crate::mirror::clock::Clock;
use crate::mirror::config::MirrorConfig;
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

/// The model, with keep-alives: the claim takes a handle on every lease
/// it uses, and the model's own backend refuses them.
struct KeptAlive(Store);

/// A keep-alive that is never lost.
pub(crate) struct Held(watch::Sender<LeaseStatus>, LeaseId);

impl Held {
    pub(crate) fn new(id: LeaseId, ttl: Duration) -> Held {
        let mut status = LeaseStatus::default();
        status.last_ok = Some(tokio::time::Instant::now());
        status.ttl = ttl;
        Held(watch::Sender::new(status), id)
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
        Box::pin(self.0.range(req))
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, etcd::Result<TxnResponse>> {
        Box::pin(self.0.txn(txn))
    }

    fn scan(&self, from: Bytes, end: Bytes, page_size: usize, revision: i64) -> Scan {
        self.0.scan(from, end, page_size, revision)
    }

    fn watch(
        &self,
        opts: WatchOptions,
    ) -> etcd::Result<(Box<dyn WatchHealth>, Box<dyn WatchEvents>)> {
        self.0.watch(opts)
    }

    fn lease_grant(&self, ttl: Duration) -> BoxFuture<'_, etcd::Result<LeaseGrant>> {
        Box::pin(self.0.lease_grant(ttl))
    }

    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, etcd::Result<()>> {
        Box::pin(self.0.lease_revoke(id))
    }

    fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> BoxFuture<'_, etcd::Result<LeaseTtl>> {
        Box::pin(self.0.lease_time_to_live(id, keys))
    }

    fn keep_alive(
        &self,
        id: LeaseId,
        ttl: Duration,
    ) -> BoxFuture<'_, etcd::Result<Box<dyn Lease>>> {
        Box::pin(async move { Ok(Box::new(Held::new(id, ttl)) as Box<dyn Lease>) })
    }

    fn endpoints(&self) -> Vec<String> {
        self.0.endpoints()
    }

    fn timeout(&self) -> Duration {
        self.0.timeout()
    }
}

/// The two etcds a peer's task talks to.
pub(crate) struct Rig {
    pub(crate) source: model::Client,
    pub(crate) peer: model::Client,
    pub(crate) state_key: String,
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
    let source = Cluster::new(ModelConfig::default().with_cluster_id(SOURCE_CLUSTER)).client(0);
    let peer_model = Cluster::new(peer.with_cluster_id(PEER_CLUSTER)).client(0);
    let base = MirrorConfig {
        lease_ttl: TTL,
        clock: Clock::supplied(|| NOW_MS, || SOURCE_ID),
        ..MirrorConfig::new("a")
    };
    let cfg = cfg(base);
    let state_key = cfg.state_key();
    let task = Peer::new(
        "b".into(),
        Store::new(source.clone()),
        Store::new(KeptAlive(Store::new(peer_model.clone()))),
        Arc::new(cfg),
        Arc::new(PeerStats::new("b")),
        HOLDER,
        Shared {
            cancel: CancellationToken::new(),
            pause: CancellationToken::new(),
            sync_slots: Arc::new(Semaphore::new(1)),
        },
    );
    let rig = Rig {
        source,
        peer: peer_model,
        state_key,
    };
    (task, rig)
}
