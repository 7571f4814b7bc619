//! One peer's replication loop: claim, sync or resume, then mirror the watch.
//!
//! A *session* runs from claiming the peer to the first error. Each session:
//! 1. reads the source's identity (cluster id, revision) and the peer's
//!    state key; refuses a peer that another source holds (two sites with
//!    one region name); adopts a predecessor's live lease with the
//!    configured TTL, or grants a new lease; and claims the peer anew, so
//!    that whatever an earlier session left in flight fails the fence;
//! 2. resumes the watch from the state revision when the copy can be
//!    trusted (same source, no revision gone back, same lease), or runs the
//!    range-diff sync ([`super::sync`]) when it cannot;
//! 3. mirrors watch events in batched, fenced txns, several in flight, and
//!    probes both stores every heartbeat interval: their identity, and
//!    whether the peer holds everything through the source's revision
//!    (staleness, the heartbeat in the state key).
//!
//! Errors end the session; the loop retries with capped, jittered backoff.
//! A copy that stays stale past `lapse_after` even through a re-sync is let
//! lapse: the keep-alive stops and the peer drops it within a TTL. Only a
//! fence held by another engine of this region ends the loop for good.

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
use super::state::{self, State, Stored};
use super::stats::{ErrorKind, PeerStats, ResyncReason, unix_ms};
use super::verify;
use super::window::Window;
use super::writer::FencedWriter;
use crate::error::{Error, Result};
use crate::etcd::{
    self, Backoff, Client, Header, LeaseHandle, LeaseStatus, Range, TxnResponse, WatchOptions,
    WatchStream, Watcher,
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
    /// The next session re-syncs in full, for this reason (the source or
    /// the peer changed under the copy, or the copy went stale).
    force_sync: Option<ResyncReason>,
    /// A predecessor's lease whose TTL differs from ours, kept alive until
    /// the subtree is re-put under our own lease.
    prev_lease: Option<LeaseHandle>,
    /// When the last range-diff sync started, Unix ms.
    sync_started_ms: i64,
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
        // Staleness counts from this engine's start until a store says
        // better (a resumed state key's heartbeat, or a probe): counters
        // kept across leadership terms must not make a new leader's copy
        // look as old as the process.
        stats.current_unix_ms.store(unix_ms(), Relaxed);
        let pacer = Pacer::new(cfg.max_inflight, cfg.max_inflight_bytes, Instant::now());
        pacer.publish(&stats);
        Peer {
            pacer,
            writer: FencedWriter::new(
                region,
                peer,
                Bytes::from(cfg.state_key()),
                holder,
                stats,
                cfg.limits,
            ),
            prefix: Bytes::from(cfg.prefix()),
            local,
            cfg,
            cancel,
            pause,
            fresh: true,
            force_sync: None,
            prev_lease: None,
            sync_started_ms: 0,
        }
    }

    fn region(&self) -> &str {
        &self.writer.region
    }

    fn stats(&self) -> &PeerStats {
        &self.writer.stats
    }

    /// Replicates until cancelled, or until another engine of this region
    /// fences this one.
    pub(crate) async fn run(mut self) -> Result<()> {
        let result = self.replicate().await;
        self.stats().set_synced(false);
        if result.is_ok() && self.pause.is_cancelled() && self.writer.lease.is_some() {
            // Stepped down: no more writes, but the peer keeps this
            // region's copy while a successor is elected and adopts the
            // lease. Bounded by one TTL, so a region that is really gone
            // still lapses.
            tracing::info!(peer = %self.region(), "stepped down; keeping the lease alive for one TTL");
            Backoff::sleep_unless(self.cfg.lease_ttl, self.cancel.cancelled()).await;
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
            let mut wait = None;
            match &err {
                Error::Fenced { .. } => {
                    tracing::error!(peer = %self.region(), "fenced: another replicator of this region holds the mirror; stopping");
                    self.writer.drop_lease();
                    return Err(err);
                }
                Error::Conflict { other, .. } => {
                    if !self.stats().conflicted.swap(true, Relaxed) {
                        self.stats().conflicts.fetch_add(1, Relaxed);
                    }
                    tracing::error!(
                        peer = %self.region(),
                        other_source = format!("{other:016x}"),
                        "another source mirrors this region into the peer (is the same region name configured at two sites?); writing nothing there until its lease lapses"
                    );
                    // Ours would be a second writer: give any lease up and
                    // look again once the incumbent's lease could have
                    // lapsed.
                    self.writer.drop_lease();
                    wait = Some(self.cfg.lease_ttl);
                }
                Error::LeaseLost { .. } => self.writer.drop_lease(),
                Error::SourceChanged { .. } => {
                    tracing::warn!(peer = %self.region(), error = %err, "re-syncing in full");
                    self.force_sync = Some(ResyncReason::SourceChanged);
                }
                Error::PeerChanged { .. } => {
                    tracing::warn!(peer = %self.region(), error = %err, "re-syncing in full");
                    self.writer.forget_peer();
                    self.force_sync = Some(ResyncReason::PeerChanged);
                }
                _ => {}
            }
            if self.lapse_if_stale() {
                wait = Some(self.cfg.lease_ttl.max(self.cfg.max_backoff));
            }
            if started.elapsed() > Duration::from_secs(10) {
                // A session that ran a while was a success: start over.
                backoff.reset();
            }
            let wait = wait.unwrap_or_else(|| backoff.next_delay());
            tracing::warn!(peer = %self.region(), error = %err, retry_in = ?wait, "peer session ended");
            let stop = async {
                tokio::select! {
                    _ = self.cancel.cancelled() => {}
                    _ = self.pause.cancelled() => {}
                }
            };
            if !Backoff::sleep_unless(wait, stop).await {
                return Ok(());
            }
        }
    }

    /// After a failed session: if the copy has been stale past the bound
    /// and a re-sync since it went stale did not help (or none could start
    /// for twice the bound), let it lapse (stop the keep-alive; never
    /// revoke). If no re-sync was tried yet, the next session makes one.
    /// Returns whether it lapsed now.
    fn lapse_if_stale(&mut self) -> bool {
        let Some(bound) = self.cfg.lapse_after else {
            return false;
        };
        let stale = self.stats().staleness();
        if stale <= bound || self.writer.lease.is_none() {
            return false;
        }
        let current_ms = self.stats().current_unix_ms.load(Relaxed);
        // A re-sync gets its chance first; when not even that can start
        // (the claim itself fails), twice the bound decides.
        if self.sync_started_ms <= current_ms && stale <= bound * 2 {
            self.force_sync.get_or_insert(ResyncReason::Stale);
            return false;
        }
        tracing::error!(
            peer = %self.region(),
            stale_secs = stale.as_secs(),
            "the copy on this peer could not be made current, even by a re-sync: letting it lapse (the keep-alive stops; the peer drops the copy within one lease TTL)"
        );
        self.writer.drop_lease();
        self.prev_lease = None;
        self.stats().lapsed.store(true, Relaxed);
        self.stats().lapses.fetch_add(1, Relaxed);
        true
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
        self.stats().conflicted.store(false, Relaxed);
        let mut live = match start {
            Start::Resume(rev) => Opened::later(rev + 1),
            Start::Sync(reason) => match self.sync(reason).await? {
                Some(live) => live,
                None => return Ok(()),
            },
        };
        loop {
            let from = live.from;
            match self.stream(live).await {
                Err(Error::Etcd(
                    etcd::Error::Compacted { .. } | etcd::Error::ResponseTooLarge { .. },
                )) => {
                    self.stats().error(ErrorKind::Compacted);
                    tracing::info!(peer = %self.region(), from, "watch cannot resume (compacted, or a response over the decode limit); re-syncing");
                    match self.sync(ResyncReason::Compacted).await? {
                        Some(next) => live = next,
                        None => return Ok(()),
                    }
                }
                other => return other,
            }
        }
    }

    /// Syncs the peer at a revision S pinned first, with the live watch
    /// from S + 1 opened before the sync starts. etcd serves a watch that
    /// starts in the past from its *unsynced* group, at most 1,000
    /// revisions per 100 ms; a watch opened only after the sync, while the
    /// source is busy, started behind and stayed there through a whole
    /// burst (up to a second of lag after the WAN bench's bursts). Opened
    /// first, it
    /// starts caught up and its events wait in the watcher's byte-bounded
    /// buffer (then in HTTP/2 flow control) until the sync is done.
    async fn sync(&mut self, reason: ResyncReason) -> Result<Option<Opened>> {
        self.stats().resync(reason);
        self.stats().set_synced(false);
        self.sync_started_ms = unix_ms();
        tracing::info!(peer = %self.region(), reason = reason.as_str(), "range-diff sync");
        let pin = self
            .local
            .range(Range::key(self.prefix.clone()).count_only());
        let at = tokio::select! {
            _ = self.cancel.cancelled() => return Ok(None),
            r = pin => r?.header.revision,
        };
        let live = Opened::now(&self.local, &self.prefix, at + 1)?;
        let fut = super::sync::run(
            &self.writer,
            &self.local,
            self.prefix.clone(),
            at,
            &self.cfg,
            &mut self.pacer,
        );
        tokio::select! {
            _ = self.cancel.cancelled() => return Ok(None),
            r = fut => r?,
        }
        // Every key is under our lease now: a predecessor's is no longer
        // needed.
        self.prev_lease = None;
        self.stats().lapsed.store(false, Relaxed);
        Ok(Some(live))
    }

    /// Decides how the session starts and claims the peer: it returns a
    /// new lease handle when the lease changed.
    async fn establish_owned(&mut self) -> Result<(Option<LeaseHandle>, Start)> {
        // The source as it is now: the copy may only be resumed if it came
        // from this store and nothing it holds is past the store's revision.
        // The two reads are independent: one round trip to the peer, not
        // two in a row (on a long link every round trip of the session
        // start is paid again by each new session).
        let floor = self.writer.peer_revision();
        let (source, peer) = tokio::join!(
            self.local
                .range(Range::key(self.prefix.clone()).count_only()),
            state::read(&self.writer.client, &self.writer.state_key),
        );
        let source = source?.header;
        let (stored, peer_header) = peer?;
        self.writer.check_peer_read(&peer_header, floor)?;
        self.stats().up.store(true, Relaxed);
        self.writer
            .marks
            .source_cluster
            .store(source.cluster_id, Relaxed);

        if let Some(st) = stored.state
            && st.holder != self.writer.holder
        {
            // Another site with this region's name, still alive: it keeps
            // the peer.
            if st.source_cluster != 0
                && st.source_cluster != source.cluster_id
                && self.live_lease(st.lease).await?.is_some()
            {
                return Err(Error::Conflict {
                    peer: self.region().to_owned(),
                    other: st.source_cluster,
                });
            }
            if !self.fresh {
                return Err(Error::Fenced {
                    peer: self.region().to_owned(),
                });
            }
        }
        let source_changed = stored.state.and_then(|st| source_mismatch(&st, &source));
        if let Some(why) = &source_changed {
            self.stats().error(ErrorKind::Identity);
            tracing::warn!(peer = %self.region(), why, "the source is not the store the copy came from; re-syncing in full");
        }

        // Adopt a live lease granted with our TTL, or grant one.
        let w = &self.writer;
        let own_lease_alive = w.lease_alive();
        let candidate = stored.state.map_or(w.lease_id(), |st| st.lease);
        let want_ttl = self.cfg.lease_ttl.as_secs().max(1) as i64;
        let mut new_handle = None;
        let mut ttl_changed = false;
        let (lease, adopted) = match self.live_lease(candidate).await? {
            Some(granted) if granted == want_ttl => {
                if w.lease_id() != candidate || !own_lease_alive {
                    new_handle = Some(
                        w.client
                            .lease_keeper()
                            .keep_alive(candidate, granted)
                            .await?,
                    );
                }
                (candidate, true)
            }
            other => {
                if let Some(granted) = other {
                    // The operator changed the TTL: the only handoff that
                    // re-puts the subtree. The old lease stays alive until
                    // every key is under the new one.
                    ttl_changed = true;
                    tracing::info!(peer = %self.region(), lease = candidate, granted, want_ttl, "the live lease has another TTL; re-putting the subtree under a new lease");
                    self.prev_lease = Some(
                        w.client
                            .lease_keeper()
                            .keep_alive(candidate, granted)
                            .await?,
                    );
                }
                let grant = w.client.lease_grant(want_ttl, 0).await?;
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
            Some(st)
                if adopted
                    && st.lease == lease
                    && st.revision > 0
                    && source_changed.is_none()
                    && self.force_sync.is_none() =>
            {
                Some(st)
            }
            _ => None,
        };
        let start = match resume {
            Some(st) => self.check_lag(st.revision, source.revision),
            None => Start::Sync(match self.force_sync.take() {
                Some(reason) => reason,
                None if source_changed.is_some() => ResyncReason::SourceChanged,
                None if ttl_changed => ResyncReason::LeaseTtl,
                None if !adopted && !self.fresh => ResyncReason::LeaseLost,
                None if !self.fresh => ResyncReason::Fenced,
                None => ResyncReason::Initial,
            }),
        };
        // What the copy is, as of this claim: a resumed copy keeps its
        // heartbeat and synced marker; anything else starts unsynced.
        let marks = &self.writer.marks;
        marks
            .heartbeat_unix_ms
            .store(resume.map_or(0, |st| st.heartbeat_unix_ms), Relaxed);
        if let Some(st) = resume.filter(|st| st.heartbeat_unix_ms > 0) {
            // The store's word on when this copy was last current.
            self.writer
                .stats
                .current_unix_ms
                .store(st.heartbeat_unix_ms, Relaxed);
        }
        marks
            .synced
            .store(resume.is_some_and(|st| st.synced), Relaxed);
        let claimed = State {
            revision: resume.map_or(0, |st| st.revision),
            lease,
            ..self.writer.state(0)
        };
        let w = &mut self.writer;
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
    fn check_lag(&self, revision: i64, source_revision: i64) -> Start {
        if source_revision - revision > self.cfg.resync_lag {
            return Start::Sync(ResyncReason::Lag);
        }
        Start::Resume(revision)
    }

    /// Mirrors the source watch from `live.from` until an error or
    /// cancellation.
    async fn stream(&mut self, live: Opened) -> Result<()> {
        let Some(lease_status) = self.writer.lease.as_ref().map(LeaseHandle::subscribe) else {
            return Err(Error::LeaseLost {
                peer: self.region().to_owned(),
            });
        };
        let from = live.from;
        let (ws, watcher) = match live.watch {
            Some(opened) => opened,
            None => open_watch(&self.local, &self.prefix, from)?,
        };
        let stats = self.stats();
        stats.applied_revision.store(from - 1, Relaxed);
        stats.source_revision.fetch_max(from - 1, Relaxed);
        stats.set_synced(true);
        tracing::info!(peer = %self.region(), from, "mirroring live");
        let mut live = Live {
            writer: &self.writer,
            cfg: &self.cfg,
            local: &self.local,
            prefix: &self.prefix,
            ws,
            batcher: Batcher::new(self.writer.limits(), self.writer.lease_id()),
            window: Window::new(from - 1),
            pacer: &mut self.pacer,
            bytes_in_flight: 0,
            inflight: FuturesUnordered::new(),
            splits_seen: 0,
            received: 0,
            probe: None,
            heartbeat_dirty: false,
        };
        live.run(watcher, lease_status, &self.cancel).await
    }
}

/// The source watch a live phase reads, from revision `from`: opened
/// already (before a sync), or to be opened when the phase starts.
struct Opened {
    from: i64,
    watch: Option<(WatchStream, Watcher)>,
}

impl Opened {
    fn later(from: i64) -> Opened {
        Opened { from, watch: None }
    }

    fn now(local: &Client, prefix: &Bytes, from: i64) -> Result<Opened> {
        Ok(Opened {
            from,
            watch: Some(open_watch(local, prefix, from)?),
        })
    }
}

/// A watch stream of the session's own (a slow peer holds back only its
/// own watch), watching the subtree from `from`. progress_notify: an idle
/// subtree still advances the state revision when the local etcd sends
/// per-watcher notices.
fn open_watch(local: &Client, prefix: &Bytes, from: i64) -> Result<(WatchStream, Watcher)> {
    let ws = local.watch_stream();
    let watcher = ws.watch(
        WatchOptions::prefix(prefix.clone())
            .start_revision(from)
            .progress_notify(),
    )?;
    Ok((ws, watcher))
}

/// Why a copy stamped `st` cannot have come from the source `now`: another
/// cluster, or a revision the source has not reached (it went back).
fn source_mismatch(st: &State, now: &Header) -> Option<String> {
    if st.source_cluster != 0 && st.source_cluster != now.cluster_id {
        return Some(format!(
            "source cluster id is {:016x}, the copy came from {:016x}",
            now.cluster_id, st.source_cluster
        ));
    }
    if now.revision < st.revision {
        return Some(format!(
            "source revision is {}, below the {} the copy is applied through",
            now.revision, st.revision
        ));
    }
    None
}

/// A freshness probe that came back: the source's revision at `at`.
#[derive(Clone, Copy)]
struct Probe {
    source_revision: i64,
    at: Instant,
    at_unix_ms: i64,
    /// Watch messages received when the probe was sent.
    received: u64,
    /// The quiet period after it has passed without making it current:
    /// only the watermark can still resolve it, and the next probe may
    /// replace it.
    quiet_done: bool,
}

/// What a probe read: the source's header, the peer's state key and header,
/// and the floor the peer's revision must not be below.
struct ProbeRead {
    sent: Probe,
    source: Header,
    stored: Stored,
    peer: Header,
    floor: i64,
    /// The watermark when the probe was sent, before the source was read:
    /// a source revision below it means the source went back.
    applied: i64,
}

/// How long the watch must stay quiet, with nothing pending, after a probe
/// read the source's revision, before the engine takes it that no event in
/// the subtree lies between what it applied and that revision. etcd hands
/// a caught-up watcher its events as they commit, and a catching-up one
/// every ~100 ms, so ten of those cycles of silence are a wide margin.
const QUIET: Duration = Duration::from_secs(1);

/// The live phase of one session: watch events in, fenced batches out,
/// as many at once as the adaptive window allows (capped by
/// `max_inflight`); a freshness probe every heartbeat.
struct Live<'a> {
    writer: &'a FencedWriter,
    cfg: &'a MirrorConfig,
    local: &'a Client,
    prefix: &'a Bytes,
    /// The watch's stream, for whether it is connected.
    ws: WatchStream,
    batcher: Batcher,
    window: Window,
    pacer: &'a mut Pacer,
    /// Request bytes of the txns in flight.
    bytes_in_flight: usize,
    inflight: FuturesUnordered<BoxFuture<'static, Done>>,
    splits_seen: u64,
    /// Watch messages received so far.
    received: u64,
    /// The last probe not yet confirmed current.
    probe: Option<Probe>,
    /// The heartbeat moved: the state key should record it.
    heartbeat_dirty: bool,
}

impl<'a> Live<'a> {
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
        let mut tick = tokio::time::interval(self.cfg.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut probing: Option<BoxFuture<'a, etcd::Result<ProbeRead>>> = None;
        let mut verify_tick = self.cfg.verify_interval.map(|every| {
            let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        });
        let mut verifying: Option<BoxFuture<'a, Result<verify::Report>>> = None;
        loop {
            self.send_ready();
            let max_ready = self.max_ready();
            let quiet_at = self.probe.filter(|p| !p.quiet_done).map(|p| p.at + QUIET);
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
                    self.check_current();
                }
                msg = watcher.next(), if self.batcher.ready_len() < max_ready => {
                    self.take_watch(msg, &mut watcher, max_ready)?;
                }
                read = async { probing.as_mut().expect("guarded").await }, if probing.is_some() => {
                    probing = None;
                    self.probed(read?)?;
                    self.check_current();
                }
                report = async { verifying.as_mut().expect("guarded").await }, if verifying.is_some() => {
                    verifying = None;
                    match report {
                        Ok(_) => {}
                        Err(Error::Etcd(etcd::Error::Compacted { .. })) => {
                            tracing::info!(peer = %self.writer.region, "verification skipped: its pinned revision was compacted; the next pass pins a newer one");
                        }
                        Err(e) => return Err(e),
                    }
                }
                _ = async { verify_tick.as_mut().expect("guarded").tick().await }, if verify_tick.is_some() && verifying.is_none() => {
                    verifying = Some(Box::pin(verify::pass(
                        self.writer,
                        self.local,
                        self.prefix.clone(),
                        self.cfg,
                        self.window.watermark(),
                    )));
                }
                _ = tick.tick(), if probing.is_none() => {
                    self.check_stale()?;
                    probing = Some(self.probe_read());
                }
                _ = async {
                    match quiet_at {
                        Some(t) => tokio::time::sleep_until(t.into()).await,
                        None => std::future::pending().await,
                    }
                }, if quiet_at.is_some() => {
                    self.check_current();
                    if let Some(p) = self.probe.as_mut() {
                        p.quiet_done = true;
                    }
                }
            }
        }
    }

    /// Reads the source's revision and the peer's state key, for identity
    /// and freshness.
    fn probe_read(&self) -> BoxFuture<'a, etcd::Result<ProbeRead>> {
        let sent = Probe {
            source_revision: 0,
            at: Instant::now(),
            at_unix_ms: unix_ms(),
            received: self.received,
            quiet_done: false,
        };
        let floor = self.writer.peer_revision();
        // Read before the source is: the source's revision can be no lower.
        // The watermark as it is when the read completes is no bound at
        // all: the stream goes on applying while the peer is read.
        let applied = self.window.watermark();
        let local = self.local;
        let prefix = self.prefix.clone();
        let writer = self.writer;
        Box::pin(async move {
            let source = local.range(Range::key(prefix).count_only()).await?.header;
            let (stored, peer) = state::read(&writer.client, &writer.state_key).await?;
            Ok(ProbeRead {
                sent: Probe {
                    source_revision: source.revision,
                    ..sent
                },
                source,
                stored,
                peer,
                floor,
                applied,
            })
        })
    }

    /// Checks what a probe read: both stores are still the ones the copy
    /// belongs to, and this engine still holds the peer.
    fn probed(&mut self, read: ProbeRead) -> Result<()> {
        let w = self.writer;
        let known = w.marks.source_cluster.load(Relaxed);
        let went_back = read.source.revision < read.applied;
        if (known != 0 && read.source.cluster_id != known) || went_back {
            return Err(Error::SourceChanged {
                peer: w.region.clone(),
                why: format!(
                    "cluster {:016x} at revision {}, the copy came from {known:016x} and is applied through {}",
                    read.source.cluster_id, read.source.revision, read.applied
                ),
            });
        }
        w.check_peer_read(&read.peer, read.floor)?;
        if read.stored.create_revision != w.fence {
            let peer = w.region.clone();
            return Err(match read.stored.state {
                Some(st) if st.holder != w.holder => Error::Fenced { peer },
                _ => Error::StateGone { peer },
            });
        }
        // A pending probe keeps its place until its quiet period is over,
        // or a busy stream would never have one.
        if self.probe.is_none_or(|p| p.quiet_done) {
            self.probe = Some(read.sent);
        }
        Ok(())
    }

    /// Marks the peer current as of the pending probe when everything the
    /// source held then is applied, or the watch has been quiet since with
    /// nothing pending (an idle subtree: nothing to apply).
    fn check_current(&mut self) {
        let Some(p) = self.probe else { return };
        let applied = self.window.watermark() >= p.source_revision;
        let idle = self.batcher.is_idle()
            && self.window.is_empty()
            && self.received == p.received
            && self.ws.is_connected()
            && p.at.elapsed() >= QUIET;
        if !applied && !idle {
            return;
        }
        if !applied {
            // Nothing in the subtree changed through that revision: resume
            // from there (this moves an idle subtree's state revision on
            // etcd 3.4, which sends no progress notices by default).
            self.window.advance_idle(p.source_revision);
        }
        self.probe = None;
        let w = self.writer;
        w.stats.mark_current(p.at_unix_ms);
        w.marks.heartbeat_unix_ms.fetch_max(p.at_unix_ms, Relaxed);
        self.heartbeat_dirty = true;
    }

    /// Ends the session once the copy has been stale past the bound, so the
    /// peer loop can re-sync it or let it lapse.
    fn check_stale(&self) -> Result<()> {
        let Some(bound) = self.cfg.lapse_after else {
            return Ok(());
        };
        let stale = self.writer.stats.staleness();
        if stale > bound {
            return Err(Error::Stale {
                peer: self.writer.region.clone(),
                stale_secs: stale.as_secs(),
            });
        }
        Ok(())
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
                if self.window.is_empty() && (self.window.state_behind() || self.heartbeat_dirty) {
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
        // Every state put carries the heartbeat as it is now.
        self.heartbeat_dirty = false;
        self.pacer.on_send(Instant::now(), self.inflight.len());
        let (seq, state_rev) = self.window.open(&batch.keys, batch.complete_through);
        tracing::trace!(peer = %self.writer.region, seq, through = batch.complete_through, state_rev, ops = batch.ops.len(), "send");
        let txn = self.writer.send(batch.ops.clone(), Some(state_rev));
        self.bytes_in_flight += batch.bytes;
        self.inflight.push(Box::pin(async move {
            let (sent, result) = txn.await;
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
            self.received += 1;
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
        let limits = self.writer.limits();
        if limits != self.batcher.limits() {
            self.batcher.set_limits(limits);
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
        Error::Etcd(etcd::Error::NoSpace) => ErrorKind::NoSpace,
        Error::Etcd(etcd::Error::TooManyOps) => ErrorKind::TooManyOps,
        Error::Conflict { .. } => ErrorKind::Conflict,
        Error::SourceChanged { .. } | Error::PeerChanged { .. } => ErrorKind::Identity,
        _ => ErrorKind::Other,
    }
}
