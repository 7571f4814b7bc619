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

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::batch::{Batch, Batcher};
use super::config::MirrorConfig;
use super::pacing::Pacer;
use super::state::{self, State};
use super::stats::{ErrorKind, PeerStats, ResyncReason};
use super::window::Window;
use super::writer::FencedWriter;
use crate::error::{Error, Result};
use crate::etcd::{
    self, Backoff, Client, LeaseHandle, LeaseStatus, Range, TxnResponse, WatchOptions, Watcher,
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
    batch: Batch,
    sent: Instant,
    result: etcd::Result<TxnResponse>,
}

pub(crate) struct Peer {
    writer: FencedWriter,
    local: Client,
    cfg: Arc<MirrorConfig>,
    prefix: Bytes,
    cancel: CancellationToken,
    /// Set when the owner steps down: stop writing at once, but keep the
    /// lease alive for one more TTL so a successor can adopt it.
    pause: CancellationToken,
    fresh: bool,
    /// The adaptive window: it outlives sessions, so what was learnt about
    /// the link in the sync carries into the live phase and across retries.
    pacer: Pacer,
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
        let pacer = Pacer::new(cfg.max_inflight, cfg.max_inflight_bytes, Instant::now());
        pacer.publish(&stats);
        Peer {
            pacer,
            writer: FencedWriter::new(region, peer, Bytes::from(cfg.state_key()), holder, stats),
            prefix: Bytes::from(cfg.prefix()),
            local,
            cfg,
            cancel,
            pause,
            fresh: true,
        }
    }

    fn region(&self) -> &str {
        &self.writer.region
    }

    fn stats(&self) -> &PeerStats {
        &self.writer.stats
    }

    /// Replicates until cancelled, or until another engine fences this one.
    pub(crate) async fn run(mut self) -> Result<()> {
        let result = self.replicate().await;
        self.stats().set_synced(false);
        if result.is_ok() && self.pause.is_cancelled() && self.writer.lease.is_some() {
            // Stepped down: no more writes, but the peer keeps this
            // region's copy while a successor is elected and adopts the
            // lease. Bounded by one TTL, so a region that is really gone
            // still lapses.
            tracing::info!(peer = %self.region(), "stepped down; keeping the lease alive for one TTL");
            tokio::select! {
                _ = self.cancel.cancelled() => {}
                _ = tokio::time::sleep(self.cfg.lease_ttl) => {}
            }
        }
        result
    }

    async fn replicate(&mut self) -> Result<()> {
        let mut backoff = Backoff::new(Duration::from_millis(100), self.cfg.max_backoff);
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
            self.stats().set_synced(false);
            let kind = classify(&err);
            self.stats().error(kind);
            if kind == ErrorKind::Unavailable {
                self.stats().up.store(false, Relaxed);
            }
            if let Error::Fenced { .. } = err {
                tracing::error!(peer = %self.region(), "fenced: another replicator holds this region's mirror; stopping");
                self.writer.drop_lease();
                return Err(err);
            }
            if matches!(err, Error::LeaseLost { .. }) {
                self.writer.drop_lease();
            }
            if started.elapsed() > Duration::from_secs(10) {
                // A session that ran a while was a success: start over.
                backoff.reset();
            }
            let wait = backoff.next_delay();
            tracing::warn!(peer = %self.region(), error = %err, retry_in = ?wait, "peer session ended");
            tokio::select! {
                _ = self.cancel.cancelled() => return Ok(()),
                _ = self.pause.cancelled() => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    async fn session(&mut self) -> Result<()> {
        let cancel = self.cancel.clone();
        let start = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            r = self.establish_owned() => r?,
        };
        let start = match start {
            (Some(lease), start) => {
                self.stats().set_lease(lease.id(), Some(lease.subscribe()));
                self.writer.lease = Some(lease);
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
                    self.stats().error(ErrorKind::Compacted);
                    tracing::info!(peer = %self.region(), from, "watch start revision compacted; re-syncing");
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
        self.stats().resync(reason);
        self.stats().set_synced(false);
        tracing::info!(peer = %self.region(), reason = reason.as_str(), "range-diff sync");
        let fut = super::sync::run(
            &self.writer,
            &self.local,
            self.prefix.clone(),
            &self.cfg,
            &mut self.pacer,
        );
        let rev = tokio::select! {
            _ = self.cancel.cancelled() => return Ok(None),
            r = fut => r?,
        };
        Ok(Some(rev))
    }

    /// Decides how the session starts and makes sure this engine holds the
    /// peer: it returns a new lease handle when the lease changed.
    async fn establish_owned(&mut self) -> Result<(Option<LeaseHandle>, Start)> {
        let w = &self.writer;
        let stored = state::read(&w.client, &w.state_key).await?;
        self.stats().up.store(true, Relaxed);
        let own_lease_alive = w.lease_alive();

        // Our own claim, intact: carry on from where the state says.
        if let Some(st) = stored.state
            && st.holder == w.holder
            && stored.create_revision == w.fence
            && own_lease_alive
            && st.lease == w.lease_id()
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
            && st.holder != w.holder
            && !self.fresh
        {
            return Err(Error::Fenced {
                peer: self.region().to_owned(),
            });
        }

        // Take the peer over: adopt a live lease if there is one.
        let candidate = match stored.state {
            Some(st) => st.lease,
            None => w.lease_id(),
        };
        let mut new_handle = None;
        let (lease, adopted) = match self.live_lease(candidate).await? {
            Some(granted_ttl) => {
                if w.lease_id() != candidate || !own_lease_alive {
                    new_handle = Some(
                        w.client
                            .lease_keeper()
                            .keep_alive(candidate, granted_ttl)
                            .await?,
                    );
                }
                (candidate, true)
            }
            None => {
                let ttl = self.cfg.lease_ttl.as_secs().max(1) as i64;
                let grant = w.client.lease_grant(ttl, 0).await?;
                tracing::info!(peer = %self.region(), lease = grant.id, ttl = grant.ttl, "granted mirror lease");
                new_handle = Some(
                    w.client
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
        let w = &mut self.writer;
        let claimed = State {
            revision: match start {
                Start::Resume(rev) => rev,
                Start::Sync(_) => 0,
            },
            lease,
            holder: w.holder,
        };
        match state::claim(&w.client, &w.state_key, &stored, claimed).await? {
            Some(fence) => {
                w.fence = fence;
                if let Some(prev) = stored.state.filter(|s| s.holder != w.holder) {
                    tracing::info!(peer = %w.region, previous = format!("{:016x}", prev.holder), lease, adopted, "took over the peer");
                }
                Ok((new_handle, start))
            }
            // Not necessarily a rival: an aborted predecessor's txns in
            // flight still pass its fence and move the state key. The next
            // session reads it again.
            None => Err(Error::ClaimRaced {
                peer: w.region.clone(),
            }),
        }
    }

    /// The granted TTL of `lease` if it is alive on the peer.
    async fn live_lease(&self, lease: i64) -> Result<Option<i64>> {
        if lease == 0 {
            return Ok(None);
        }
        let ttl = self.writer.client.lease_time_to_live(lease, false).await?;
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

    /// Mirrors the watch from `from` until an error or cancellation.
    async fn stream(&mut self, from: i64) -> Result<()> {
        let Some(lease_status) = self.writer.lease.as_ref().map(LeaseHandle::subscribe) else {
            return Err(Error::LeaseLost {
                peer: self.region().to_owned(),
            });
        };
        // A stream of the session's own: a slow peer holds back only its
        // own watch. progress_notify: an idle subtree still advances the
        // state revision when the local etcd sends per-watcher notices.
        let watcher = self.local.watch_stream().watch(
            WatchOptions::prefix(self.prefix.clone())
                .start_revision(from)
                .progress_notify(),
        )?;
        let stats = self.stats();
        stats.applied_revision.store(from - 1, Relaxed);
        stats.source_revision.fetch_max(from - 1, Relaxed);
        stats.set_synced(true);
        tracing::info!(peer = %self.region(), from, "mirroring live");
        let mut live = Live {
            writer: &self.writer,
            cfg: &self.cfg,
            batcher: Batcher::new(self.cfg.limits, self.writer.lease_id()),
            window: Window::new(from - 1),
            pacer: &mut self.pacer,
            bytes_in_flight: 0,
            inflight: FuturesUnordered::new(),
            splits_seen: 0,
        };
        live.run(watcher, lease_status, &self.cancel).await
    }
}

/// The live phase of one session: watch events in, fenced batches out,
/// as many at once as the adaptive window allows (capped by
/// `max_inflight`).
struct Live<'a> {
    writer: &'a FencedWriter,
    cfg: &'a MirrorConfig,
    batcher: Batcher,
    window: Window,
    pacer: &'a mut Pacer,
    /// Request bytes of the txns in flight.
    bytes_in_flight: usize,
    inflight: FuturesUnordered<BoxFuture<'static, Done>>,
    splits_seen: u64,
}

impl Live<'_> {
    /// Sealed batches to hold at most before reading the watch again: two
    /// windows' worth, so the batches fill while a window is in flight.
    fn max_ready(&self) -> usize {
        self.pacer.window_txns() * 2
    }

    async fn run(
        &mut self,
        mut watcher: Watcher,
        mut lease_status: watch::Receiver<LeaseStatus>,
        cancel: &CancellationToken,
    ) -> Result<()> {
        loop {
            self.send_ready();
            let max_ready = self.max_ready();
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    self.drain().await;
                    return Ok(());
                }
                _ = async { lease_status.wait_for(|s| s.lost).await.is_ok() } => {
                    return Err(Error::LeaseLost { peer: self.writer.region.clone() });
                }
                Some(done) = self.inflight.next(), if !self.inflight.is_empty() => {
                    self.complete(done).await?;
                }
                msg = watcher.next(), if self.batcher.ready_len() < max_ready => {
                    self.take_watch(msg, &mut watcher, max_ready)?;
                }
            }
        }
    }

    /// Sends what can go: eagerly while there is room in flight, so a lone
    /// revision leaves at once and a burst fills the batches.
    fn send_ready(&mut self) {
        loop {
            if self.batcher.ready_len() == 0 {
                self.batcher.flush();
            }
            let Some(batch) = self.batcher.peek() else {
                // Nothing to send: catch the state key up if the last
                // batches went out pipelined.
                if self.window.is_empty() && self.window.state_behind() {
                    self.launch(Batch::empty(self.window.watermark()));
                }
                break;
            };
            // Per-key order first: a conflict says nothing about the link.
            if self.window.conflicts(&batch.keys) {
                break;
            }
            if !self
                .pacer
                .allows(self.window.len(), self.bytes_in_flight, batch.bytes)
            {
                break;
            }
            if let Some(batch) = self.batcher.pop() {
                self.launch(batch);
            }
        }
        let splits = self.batcher.split_revisions;
        if splits > self.splits_seen {
            let stats = &self.writer.stats;
            stats
                .split_revisions
                .fetch_add(splits - self.splits_seen, Relaxed);
            self.splits_seen = splits;
        }
    }

    fn launch(&mut self, batch: Batch) {
        let (seq, state_rev) = self.window.open(&batch.keys, batch.complete_through);
        tracing::trace!(peer = %self.writer.region, seq, through = batch.complete_through, state_rev, ops = batch.ops.len(), "send");
        let txn = self.writer.txn(batch.ops.clone(), Some(state_rev));
        let client = self.writer.client.clone();
        self.bytes_in_flight += batch.bytes;
        let sent = Instant::now();
        self.inflight.push(Box::pin(async move {
            let result = client.txn(txn).await;
            Done {
                seq,
                batch,
                sent,
                result,
            }
        }));
    }

    /// Takes everything the watch has buffered before sending, so a burst
    /// lands in full batches.
    fn take_watch(
        &mut self,
        mut msg: Option<etcd::Result<etcd::WatchResponse>>,
        watcher: &mut Watcher,
        max_ready: usize,
    ) -> Result<()> {
        loop {
            let resp = match msg {
                None => return Err(Error::Etcd(etcd::Error::Closed)),
                Some(Err(e)) => return Err(Error::Etcd(e)),
                Some(Ok(resp)) => resp,
            };
            tracing::trace!(peer = %self.writer.region, rev = resp.revision, events = resp.events.len(), first = resp.events.first().map(|e| e.revision()), "watch");
            if let Some(last) = resp.events.last() {
                let stats = &self.writer.stats;
                stats.source_revision.fetch_max(last.revision(), Relaxed);
                self.batcher.push(resp.events, Instant::now());
            } else if self.batcher.is_idle() && self.window.is_empty() {
                // A per-watcher progress notice: etcd only sends those once
                // the watcher has caught up. (This stream is the session's
                // own and never asks for the broadcast kind, which 3.4 also
                // sends to watchers still catching up.)
                self.window.advance_idle(resp.revision);
            }
            if self.batcher.ready_len() >= max_ready {
                return Ok(());
            }
            msg = match watcher.try_next() {
                Some(m) => Some(m),
                None => return Ok(()),
            };
        }
    }

    /// Books one finished txn: stats, the contiguous watermark, errors.
    async fn complete(&mut self, done: Done) -> Result<()> {
        let Done {
            seq,
            batch,
            sent,
            result,
        } = done;
        self.window.release(&batch.keys);
        self.bytes_in_flight = self.bytes_in_flight.saturating_sub(batch.bytes);
        let Batch {
            ops,
            complete_through,
            events,
            received,
            bytes,
            ..
        } = batch;
        let now = Instant::now();
        let ok = result.is_ok();
        let n_ops = ops.len() as u64;
        if let Err(e) = self.writer.settle(ops, result).await {
            if !ok {
                self.pacer.on_error(now);
                self.pacer.publish(&self.writer.stats);
            }
            return Err(e);
        }
        if ok && self.pacer.on_ack(now, now - sent, n_ops, bytes as u64) {
            self.pacer.publish(&self.writer.stats);
        }
        let stats = &self.writer.stats;
        stats.up.store(true, Relaxed);
        stats.txns.fetch_add(1, Relaxed);
        stats.events.fetch_add(events, Relaxed);
        stats.bytes.fetch_add(bytes as u64, Relaxed);
        if events > 0 {
            stats.apply_latency.observe(received.elapsed(), events);
        }
        tracing::trace!(peer = %self.writer.region, seq, through = complete_through, "acked");
        let watermark = self.window.ack(seq, complete_through);
        stats.applied_revision.fetch_max(watermark, Relaxed);
        Ok(())
    }

    /// On shutdown: let the txns in flight finish, then record the final
    /// watermark so a successor resumes without replay; all within the
    /// shutdown grace (or the request timeout, if shorter).
    async fn drain(&mut self) {
        let grace = self
            .cfg
            .shutdown_grace
            .min(self.writer.client.config().request_timeout);
        let deadline = tokio::time::sleep(grace);
        tokio::pin!(deadline);
        let mut clean = true;
        while !self.inflight.is_empty() {
            tokio::select! {
                _ = &mut deadline => { clean = false; break; }
                Some(done) = self.inflight.next() => {
                    if self.complete(done).await.is_err() {
                        clean = false;
                    }
                }
            }
        }
        if clean && self.window.state_behind() {
            let txn = self.writer.txn(Vec::new(), Some(self.window.watermark()));
            tokio::select! {
                _ = &mut deadline => {}
                _ = self.writer.client.txn(txn) => {}
            }
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
