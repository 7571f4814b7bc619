//! One peer's replication loop: claim, sync or resume, then mirror the watch.
//!
//! A *session* runs from claiming the peer to the first error. Each session:
//! 1. reads the state key; continues its own claim, adopts a predecessor's
//!    live lease, or grants a new lease;
//! 2. resumes the watch from the state revision when it can, or runs the
//!    range-diff sync ([`super::sync`]) when it cannot;
//! 3. mirrors watch events in batched, fenced txns, several in flight.
//!
//! Errors end the session; the loop retries with capped backoff. Only a
//! fence held by another engine ends the loop for good.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;

use super::batch::{Batch, Batcher};
use super::config::MirrorConfig;
use super::state::{self, State, Stored};
use super::stats::{ErrorKind, PeerStats, ResyncReason};
use crate::error::{Error, Result};
use crate::etcd::{
    self, Client, LeaseHandle, OpResponse, PbRequestOp, Range, Txn, TxnResponse, WatchOptions,
};

/// Where a session starts from.
enum Start {
    /// Every source revision up to this one is on the peer: watch from the
    /// next one.
    Resume(i64),
    /// Run a range-diff sync first.
    Sync(ResyncReason),
}

/// The outcome of one txn in flight.
struct Done {
    seq: u64,
    keys: Vec<Bytes>,
    ops: Vec<PbRequestOp>,
    complete_through: i64,
    events: u64,
    bytes: usize,
    received: Instant,
    result: etcd::Result<TxnResponse>,
}

pub(crate) struct Peer {
    pub(crate) region: String,
    pub(crate) local: Client,
    pub(crate) peer: Client,
    pub(crate) cfg: Arc<MirrorConfig>,
    pub(crate) stats: Arc<PeerStats>,
    pub(crate) holder: u64,
    pub(crate) prefix: Bytes,
    pub(crate) state_key: Bytes,
    pub(crate) cancel: CancellationToken,
    /// Set when the owner steps down: stop writing at once, but keep the
    /// lease alive for one more TTL so a successor can adopt it.
    pause: CancellationToken,
    lease: Option<LeaseHandle>,
    fence: i64,
    fresh: bool,
}

impl Peer {
    pub(crate) fn new(
        region: String,
        local: Client,
        peer: Client,
        cfg: Arc<MirrorConfig>,
        stats: Arc<PeerStats>,
        holder: u64,
        (cancel, pause): (CancellationToken, CancellationToken),
    ) -> Peer {
        Peer {
            prefix: Bytes::from(cfg.prefix()),
            state_key: Bytes::from(cfg.state_key()),
            region,
            local,
            peer,
            cfg,
            stats,
            holder,
            cancel,
            pause,
            lease: None,
            fence: 0,
            fresh: true,
        }
    }

    /// Replicates until cancelled, or until another engine fences this one.
    pub(crate) async fn run(mut self) -> Result<()> {
        let result = self.replicate().await;
        self.stats.synced.store(false, Relaxed);
        if result.is_ok() && self.pause.is_cancelled() && self.lease.is_some() {
            // Stepped down: no more writes, but the peer keeps this
            // region's copy while a successor is elected and adopts the
            // lease. Bounded by one TTL, so a region that is really gone
            // still lapses.
            tracing::info!(peer = %self.region, "stepped down; keeping the lease alive for one TTL");
            tokio::select! {
                _ = self.cancel.cancelled() => {}
                _ = tokio::time::sleep(self.cfg.lease_ttl) => {}
            }
        }
        result
    }

    async fn replicate(&mut self) -> Result<()> {
        let mut backoff = Duration::from_millis(100);
        loop {
            let started = Instant::now();
            let pause = self.pause.clone();
            let session = tokio::select! {
                biased;
                _ = pause.cancelled() => return Ok(()),
                r = self.session() => r,
            };
            let err = match session {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            self.stats.synced.store(false, Relaxed);
            let kind = classify(&err);
            self.stats.error(kind);
            if kind == ErrorKind::Unavailable {
                self.stats.up.store(false, Relaxed);
            }
            if let Error::Fenced { .. } = err {
                tracing::error!(peer = %self.region, "fenced: another replicator holds this region's mirror; stopping");
                self.drop_lease();
                return Err(err);
            }
            if matches!(err, Error::LeaseLost { .. }) {
                self.drop_lease();
            }
            if started.elapsed() > Duration::from_secs(10) {
                backoff = Duration::from_millis(100);
            }
            tracing::warn!(peer = %self.region, error = %err, retry_in = ?backoff, "peer session ended");
            tokio::select! {
                _ = self.cancel.cancelled() => return Ok(()),
                _ = self.pause.cancelled() => return Ok(()),
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(self.cfg.max_backoff);
        }
    }

    fn drop_lease(&mut self) {
        self.lease = None;
        self.fence = 0;
        self.stats.set_lease(0, None);
    }

    async fn session(&mut self) -> Result<()> {
        let cancel = self.cancel.clone();
        let start = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            r = self.establish_owned() => r?,
        };
        let start = match start {
            (Some(lease), start) => {
                self.stats.set_lease(lease.id(), Some(lease.subscribe()));
                self.lease = Some(lease);
                start
            }
            (None, start) => start,
        };
        self.fresh = false;
        let mut from = match start {
            Start::Resume(rev) => rev + 1,
            Start::Sync(reason) => match self.sync(reason).await? {
                Some(rev) => rev + 1,
                None => return Ok(()),
            },
        };
        loop {
            match self.stream(from).await {
                Err(Error::Etcd(etcd::Error::Compacted { .. })) => {
                    self.stats.error(ErrorKind::Compacted);
                    tracing::info!(peer = %self.region, from, "watch start revision compacted; re-syncing");
                    match self.sync(ResyncReason::Compacted).await? {
                        Some(rev) => from = rev + 1,
                        None => return Ok(()),
                    }
                }
                other => return other,
            }
        }
    }

    async fn sync(&mut self, reason: ResyncReason) -> Result<Option<i64>> {
        self.stats.resync(reason);
        self.stats.synced.store(false, Relaxed);
        tracing::info!(peer = %self.region, reason = reason.as_str(), "range-diff sync");
        let lease = self.lease_id();
        let fut = super::sync::run(self, lease);
        let rev = tokio::select! {
            _ = self.cancel.cancelled() => return Ok(None),
            r = fut => r?,
        };
        Ok(Some(rev))
    }

    fn lease_id(&self) -> i64 {
        self.lease.as_ref().map_or(0, LeaseHandle::id)
    }

    /// Decides how the session starts and makes sure this engine holds the
    /// peer: it returns a new lease handle when the lease changed.
    async fn establish_owned(&mut self) -> Result<(Option<LeaseHandle>, Start)> {
        let stored = state::read(&self.peer, &self.state_key).await?;
        self.stats.up.store(true, Relaxed);
        let own_lease_alive = self.lease.as_ref().is_some_and(|l| !l.status().lost);

        // Our own claim, intact: carry on from where the state says.
        if let Some(st) = stored.state
            && st.holder == self.holder
            && stored.create_revision == self.fence
            && own_lease_alive
            && st.lease == self.lease_id()
        {
            // Revision 0: an earlier sync under this claim did not finish.
            let start = if st.revision > 0 {
                self.check_lag(st.revision).await?
            } else {
                Start::Sync(ResyncReason::Initial)
            };
            return Ok((None, start));
        }
        if let Some(st) = stored.state
            && st.holder != self.holder
            && !self.fresh
        {
            return Err(Error::Fenced {
                peer: self.region.clone(),
            });
        }

        // Take the peer over: adopt a live lease if there is one.
        let candidate = match stored.state {
            Some(st) => st.lease,
            None => self.lease_id(),
        };
        let mut new_handle = None;
        let (lease, adopted) = match self.live_lease(candidate).await? {
            Some(granted_ttl) => {
                if self.lease_id() != candidate || !own_lease_alive {
                    new_handle = Some(
                        self.peer
                            .lease_keeper()
                            .keep_alive(candidate, granted_ttl)
                            .await?,
                    );
                }
                (candidate, true)
            }
            None => {
                let ttl = self.cfg.lease_ttl.as_secs().max(1) as i64;
                let grant = self.peer.lease_grant(ttl, 0).await?;
                tracing::info!(peer = %self.region, lease = grant.id, ttl = grant.ttl, "granted mirror lease");
                new_handle = Some(
                    self.peer
                        .lease_keeper()
                        .keep_alive(grant.id, grant.ttl)
                        .await?,
                );
                (grant.id, false)
            }
        };
        let resume = match stored.state {
            Some(st) if adopted && st.lease == lease && st.revision > 0 => Some(st.revision),
            _ => None,
        };
        let start = match resume {
            Some(rev) => self.check_lag(rev).await?,
            None if !adopted && !self.fresh => Start::Sync(ResyncReason::LeaseLost),
            None if !self.fresh => Start::Sync(ResyncReason::Fenced),
            None => Start::Sync(ResyncReason::Initial),
        };
        let claimed = State {
            revision: match start {
                Start::Resume(rev) => rev,
                Start::Sync(_) => 0,
            },
            lease,
            holder: self.holder,
        };
        match state::claim(&self.peer, &self.state_key, &stored, claimed).await? {
            Some(fence) => {
                self.fence = fence;
                if let Some(prev) = stored.state.filter(|s| s.holder != self.holder) {
                    tracing::info!(peer = %self.region, previous = format!("{:016x}", prev.holder), lease, adopted, "took over the peer");
                }
                Ok((new_handle, start))
            }
            // Not necessarily a rival: an aborted predecessor's txns in
            // flight still pass its fence and move the state key. The next
            // session reads it again.
            None => Err(Error::ClaimRaced {
                peer: self.region.clone(),
            }),
        }
    }

    /// The granted TTL of `lease` if it is alive on the peer.
    async fn live_lease(&self, lease: i64) -> Result<Option<i64>> {
        if lease == 0 {
            return Ok(None);
        }
        let ttl = self.peer.lease_time_to_live(lease, false).await?;
        Ok((ttl.ttl > 0).then_some(ttl.granted_ttl.max(1)))
    }

    /// Resume through the watch unless the source has moved on so far that
    /// a range diff is cheaper.
    async fn check_lag(&self, revision: i64) -> Result<Start> {
        let now = self
            .local
            .range(Range::key(self.prefix.clone()).count_only())
            .await?
            .header
            .revision;
        if now - revision > self.cfg.resync_lag {
            return Ok(Start::Sync(ResyncReason::Lag));
        }
        Ok(Start::Resume(revision))
    }

    /// A mirror txn: the fence guard, `ops`, and optionally the state put;
    /// on failure it reads the state key back so the caller can tell why.
    pub(crate) fn txn(&self, ops: Vec<PbRequestOp>, state_revision: Option<i64>) -> Txn {
        let lease = self.lease_id();
        let mut txn = Txn::new()
            .when([state::fence(&self.state_key, self.fence)])
            .or_else([Range::key(self.state_key.clone())]);
        txn.0.success = ops;
        if let Some(revision) = state_revision {
            let st = State {
                revision,
                lease,
                holder: self.holder,
            };
            txn.0
                .success
                .push(etcd::put_op(self.state_key.clone(), st.encode(), lease));
        }
        txn
    }

    /// Why a fenced txn failed: another holder, or the state key is gone.
    pub(crate) fn fence_failure(&self, resp: &TxnResponse) -> Error {
        let kv = resp.responses.iter().find_map(|r| match r {
            OpResponse::Range(r) => r.kvs().first().cloned(),
            _ => None,
        });
        let stored = Stored::from_kv(kv.as_ref());
        let peer = self.region.clone();
        match stored.state {
            Some(st) if st.holder != self.holder => Error::Fenced { peer },
            _ if self.lease.as_ref().is_some_and(|l| l.status().lost) => Error::LeaseLost { peer },
            _ => Error::StateGone { peer },
        }
    }

    /// Classifies a failed txn result.
    pub(crate) fn txn_error(&self, err: etcd::Error) -> Error {
        match err {
            etcd::Error::LeaseNotFound => Error::LeaseLost {
                peer: self.region.clone(),
            },
            e => Error::Etcd(e),
        }
    }

    /// Sends `ops` one per txn after a batch was refused as too large,
    /// skipping (and counting) those that are too large on their own.
    pub(crate) async fn apply_one_by_one(&self, ops: Vec<PbRequestOp>) -> Result<()> {
        for op in ops {
            let key = etcd::op_key(&op).unwrap_or_default();
            match self.peer.txn(self.txn(vec![op], None)).await {
                Ok(resp) if resp.succeeded => {}
                Ok(resp) => return Err(self.fence_failure(&resp)),
                Err(etcd::Error::RequestTooLarge) => {
                    self.stats.error(ErrorKind::TooLarge);
                    tracing::error!(
                        peer = %self.region,
                        key = %String::from_utf8_lossy(&key),
                        "write exceeds the peer's request size limit; skipped"
                    );
                }
                Err(e) => return Err(self.txn_error(e)),
            }
        }
        Ok(())
    }

    /// Mirrors the watch from `from` until an error or cancellation.
    async fn stream(&mut self, from: i64) -> Result<()> {
        let ws = self.local.watch_stream();
        // progress_notify: an idle subtree still advances the state revision
        // when the local etcd sends per-watcher progress notices.
        let mut watcher = ws.watch(
            WatchOptions::prefix(self.prefix.clone())
                .start_revision(from)
                .progress_notify(),
        )?;
        let Some(mut lease_status) = self.lease.as_ref().map(LeaseHandle::subscribe) else {
            return Err(Error::LeaseLost {
                peer: self.region.clone(),
            });
        };
        let mut batcher = Batcher::new(self.cfg.limits, self.lease_id());
        let max_inflight = self.cfg.max_inflight.max(1);
        let max_ready = max_inflight * 2;
        let mut inflight = FuturesUnordered::new();
        let mut inflight_keys: HashMap<Bytes, u32> = HashMap::new();
        let mut next_seq = 0u64;
        let mut acked: BTreeMap<u64, i64> = BTreeMap::new();
        let mut floor_seq = 0u64;
        let mut watermark = from - 1;
        let mut state_written = from - 1;
        let mut splits_seen = 0;
        self.stats.applied_revision.store(watermark, Relaxed);
        self.stats.source_revision.fetch_max(watermark, Relaxed);
        self.stats.synced.store(true, Relaxed);
        tracing::info!(peer = %self.region, from, "mirroring live");

        loop {
            // Send what can go: eagerly while there is room in flight, so a
            // lone revision leaves at once and a burst fills the batches.
            while inflight.len() < max_inflight {
                if batcher.ready_len() == 0 {
                    batcher.flush();
                }
                let conflict = match batcher.peek() {
                    Some(b) => b.keys.iter().any(|k| inflight_keys.contains_key(k)),
                    None => {
                        // Nothing to send: catch the state key up if the
                        // last batches went out pipelined.
                        if inflight.is_empty() && watermark > state_written {
                            let txn = self.txn(Vec::new(), Some(watermark));
                            state_written = watermark;
                            inflight.push(send(&self.peer, txn, next_seq, empty_batch(watermark)));
                            next_seq += 1;
                        }
                        break;
                    }
                };
                if conflict {
                    break;
                }
                let Some(batch) = batcher.pop() else { break };
                let state_rev = if inflight.is_empty() {
                    batch.complete_through
                } else {
                    watermark
                };
                state_written = state_written.max(state_rev);
                for k in &batch.keys {
                    *inflight_keys.entry(k.clone()).or_default() += 1;
                }
                tracing::trace!(peer = %self.region, seq = next_seq, through = batch.complete_through, state_rev, ops = batch.ops.len(), "send");
                let txn = self.txn(batch.ops.clone(), Some(state_rev));
                inflight.push(send(&self.peer, txn, next_seq, batch));
                next_seq += 1;
            }
            if batcher.split_revisions > splits_seen {
                self.stats
                    .split_revisions
                    .fetch_add(batcher.split_revisions - splits_seen, Relaxed);
                splits_seen = batcher.split_revisions;
            }

            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => {
                    self.drain(&mut inflight, watermark, state_written, &mut acked, &mut floor_seq).await;
                    return Ok(());
                }
                _ = async { lease_status.wait_for(|s| s.lost).await.is_ok() } => {
                    return Err(Error::LeaseLost { peer: self.region.clone() });
                }
                Some(done) = inflight.next(), if !inflight.is_empty() => {
                    for k in &done.keys {
                        if let Some(n) = inflight_keys.get_mut(k) {
                            *n -= 1;
                            if *n == 0 {
                                inflight_keys.remove(k);
                            }
                        }
                    }
                    self.complete(done, &mut acked, &mut floor_seq, &mut watermark).await?;
                }
                msg = watcher.next(), if batcher.ready_len() < max_ready => {
                    let mut msg = msg;
                    // Take everything the watch has buffered before sending,
                    // so a burst lands in full batches.
                    loop {
                        match msg {
                            None => return Err(Error::Etcd(etcd::Error::Closed)),
                            Some(Err(e)) => return Err(Error::Etcd(e)),
                            Some(Ok(resp)) => {
                                tracing::trace!(peer = %self.region, rev = resp.revision, events = resp.events.len(), first = resp.events.first().map(|e| e.revision()), "watch");
                                if let Some(last) = resp.events.last() {
                                    self.stats.source_revision.fetch_max(last.revision(), Relaxed);
                                    batcher.push(resp.events, Instant::now());
                                } else if batcher.is_idle() && inflight.is_empty() {
                                    // A per-watcher progress notice: etcd only
                                    // sends those once the watcher has caught up.
                                    // (This stream is the session's own and never
                                    // asks for the broadcast kind, which 3.4 also
                                    // sends to watchers still catching up.)
                                    watermark = watermark.max(resp.revision);
                                }
                            }
                        }
                        if batcher.ready_len() >= max_ready {
                            break;
                        }
                        msg = match watcher.try_next() {
                            Some(m) => Some(m),
                            None => break,
                        };
                    }
                }
            }
        }
    }

    /// Books one finished txn: stats, the contiguous watermark, errors.
    async fn complete(
        &self,
        done: Done,
        acked: &mut BTreeMap<u64, i64>,
        floor_seq: &mut u64,
        watermark: &mut i64,
    ) -> Result<()> {
        match done.result {
            Ok(resp) if resp.succeeded => {}
            Ok(resp) => return Err(self.fence_failure(&resp)),
            Err(etcd::Error::RequestTooLarge) if !done.ops.is_empty() => {
                self.apply_one_by_one(done.ops).await?;
            }
            Err(e) => return Err(self.txn_error(e)),
        }
        self.stats.up.store(true, Relaxed);
        self.stats.txns.fetch_add(1, Relaxed);
        self.stats.events.fetch_add(done.events, Relaxed);
        self.stats.bytes.fetch_add(done.bytes as u64, Relaxed);
        if done.events > 0 {
            self.stats
                .apply_latency
                .observe(done.received.elapsed(), done.events);
        }
        tracing::trace!(peer = %self.region, seq = done.seq, through = done.complete_through, "acked");
        acked.insert(done.seq, done.complete_through);
        while let Some(rev) = acked.remove(floor_seq) {
            *watermark = (*watermark).max(rev);
            *floor_seq += 1;
        }
        self.stats.applied_revision.fetch_max(*watermark, Relaxed);
        Ok(())
    }

    /// On shutdown: let the txns in flight finish, then record the final
    /// watermark so a successor resumes without replay; all within the
    /// shutdown grace (or the request timeout, if shorter).
    async fn drain(
        &self,
        inflight: &mut FuturesUnordered<impl Future<Output = Done>>,
        mut watermark: i64,
        state_written: i64,
        acked: &mut BTreeMap<u64, i64>,
        floor_seq: &mut u64,
    ) {
        let grace = self
            .cfg
            .shutdown_grace
            .min(self.peer.config().request_timeout);
        let deadline = tokio::time::sleep(grace);
        tokio::pin!(deadline);
        let mut clean = true;
        while !inflight.is_empty() {
            tokio::select! {
                _ = &mut deadline => { clean = false; break; }
                Some(done) = inflight.next() => {
                    if self.complete(done, acked, floor_seq, &mut watermark).await.is_err() {
                        clean = false;
                    }
                }
            }
        }
        if clean && watermark > state_written {
            let write = self.peer.txn(self.txn(Vec::new(), Some(watermark)));
            tokio::select! {
                _ = &mut deadline => {}
                _ = write => {}
            }
        }
    }
}

fn empty_batch(revision: i64) -> Batch {
    Batch {
        ops: Vec::new(),
        keys: Vec::new(),
        complete_through: revision,
        events: 0,
        received: Instant::now(),
        bytes: 0,
    }
}

fn send(peer: &Client, txn: Txn, seq: u64, batch: Batch) -> impl Future<Output = Done> + use<> {
    let peer = peer.clone();
    async move {
        let result = peer.txn(txn).await;
        Done {
            seq,
            keys: batch.keys,
            ops: batch.ops,
            complete_through: batch.complete_through,
            events: batch.events,
            bytes: batch.bytes,
            received: batch.received,
            result,
        }
    }
}

/// The metric class of a session-ending error.
pub(crate) fn classify(err: &Error) -> ErrorKind {
    match err {
        Error::Fenced { .. } => ErrorKind::Fenced,
        Error::LeaseLost { .. } => ErrorKind::LeaseLost,
        Error::StateGone { .. } | Error::ClaimRaced { .. } => ErrorKind::Other,
        Error::Etcd(e) if e.is_transient() => ErrorKind::Unavailable,
        Error::Etcd(etcd::Error::Compacted { .. }) => ErrorKind::Compacted,
        Error::Etcd(etcd::Error::RequestTooLarge) => ErrorKind::TooLarge,
        _ => ErrorKind::Other,
    }
}
