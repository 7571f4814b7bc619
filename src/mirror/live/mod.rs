//! The live loop: the source's watch in, fenced batches out.
//!
//! Watch events are packed into batches of consecutive revisions
//! ([`self::batch`]) and sent through the send pipeline
//! ([`super::send`]), several in flight; the in-flight window
//! ([`self::inflight`]) keeps per-key order and the contiguous watermark
//! that the state key records. Every heartbeat a freshness probe reads both
//! stores: their identity, and whether the peer holds everything through
//! the source's revision (staleness, the heartbeat in the state key). The
//! verification pass ([`super::verify`]) and the re-probe of lowered txn
//! limits ([`super::send::limits`]) run beside it.

pub mod batch;
mod inflight;

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use self::batch::{Batch, Batcher};
use self::inflight::{Ahead, Launched, Sequencer};
use super::config::MirrorConfig;
use super::count::{self, CountSplits};
use super::send::limits::ProbeResult;
use super::send::writer::FencedWriter;
use super::send::{Done, Link, Pipeline};
use super::state::{self, Stored};
use super::stats::{VerifySkip, unix_ms};
use super::verify::{self, VerifySchedule};
use crate::error::{Error, Result};
use crate::etcd::{
    self, Client, Header, LeaseHandle, LeaseStatus, Range, WatchOptions, WatchStream, Watcher,
};

/// What a live phase borrows from its peer's task for its length.
pub(crate) struct Parts<'a> {
    pub(crate) writer: &'a FencedWriter,
    pub(crate) cfg: &'a MirrorConfig,
    pub(crate) local: &'a Client,
    pub(crate) prefix: &'a Bytes,
    pub(crate) source_id_key: &'a Bytes,
    /// What is learnt about the link: it outlives the phase.
    pub(crate) link: &'a mut Link,
    pub(crate) verify: &'a mut VerifySchedule,
    pub(crate) splits: &'a mut CountSplits,
    /// See `Peer::replay_horizon`.
    pub(crate) replay_horizon: i64,
    pub(crate) cancel: &'a CancellationToken,
}

/// Mirrors the source watch from `opened.from` until an error or
/// cancellation.
pub(crate) async fn run(parts: Parts<'_>, opened: Opened) -> Result<()> {
    let Parts {
        writer,
        cfg,
        local,
        prefix,
        source_id_key,
        link,
        verify,
        splits,
        replay_horizon,
        cancel,
    } = parts;
    let Some(lease_status) = writer.lease.as_ref().map(LeaseHandle::subscribe) else {
        return Err(Error::LeaseLost {
            peer: writer.region.clone(),
        });
    };
    let from = opened.from;
    let (ws, watcher) = match opened.watch {
        Some(opened) => opened,
        None => open_watch(local, prefix, from)?,
    };
    let stats = &writer.stats;
    stats.applied_revision.store(from - 1, Relaxed);
    stats.source_revision.fetch_max(from - 1, Relaxed);
    // A copy nobody could verify several times in a row is not vouched
    // for until a pass completes.
    stats.set_synced(!verify.overdue());
    tracing::info!(peer = %writer.region, from, "mirroring live");
    let mut live = Live {
        writer,
        cfg,
        local,
        prefix,
        source_id_key,
        ws,
        batcher: Batcher::new(link.limits.current(), writer.lease_id()),
        inflight: Sequencer::new(from - 1),
        pipeline: Pipeline::new(writer, link),
        verify,
        splits,
        verifying: false,
        replay_horizon,
        splits_seen: 0,
        received: 0,
        launched_ops: 0,
        ops_before: VecDeque::new(),
        settled_ahead: Ahead::default(),
        probe: None,
        heartbeat_dirty: false,
        cadence: count::Cadence::default(),
    };
    let result = live.run(watcher, lease_status, cancel).await;
    if live.verifying {
        let retry = cfg.heartbeat_interval * 2;
        live.verify.skipped(
            Instant::now(),
            VerifySkip::Interrupted,
            retry,
            &writer.stats,
        );
    }
    result
}

/// The source watch a live phase reads, from revision `from`: opened
/// already (before a sync), or to be opened when the phase starts.
pub(crate) struct Opened {
    pub(crate) from: i64,
    watch: Option<(WatchStream, Watcher)>,
}

impl Opened {
    pub(crate) fn later(from: i64) -> Opened {
        Opened { from, watch: None }
    }

    pub(crate) fn now(local: &Client, prefix: &Bytes, from: i64) -> Result<Opened> {
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

/// A freshness probe that came back: the source's revision at `at`.
#[derive(Clone, Copy)]
struct Probe {
    source_revision: i64,
    at: Instant,
    at_unix_ms: i64,
    /// Watch messages received when the probe was sent.
    received: u64,
    /// Ops of the txns not yet under the watermark when it was sent:
    /// what the peer may hold beyond the watermark, with what is sent
    /// until it comes back.
    unsettled_from: u64,
    /// Ops already applied of a revision above the watermark when it was
    /// sent (a split revision's first parts).
    ahead: u64,
    /// The quiet period after it has passed without making it current:
    /// only the watermark can still resolve it, and the next probe may
    /// replace it.
    quiet_done: bool,
    /// The copy's key count was checked against the source's and matched.
    /// A probe that could not count (a resumed copy still replaying the
    /// predecessor's tail, or a compacted watermark) may still advance an
    /// idle watermark, but never marks the copy current: a new leader that
    /// adopted a copy emptied out of band would otherwise report it fresh
    /// before it has counted it (found by the soak, seed 11).
    counted: bool,
}

/// What a probe read: the source's header, the peer's state key and header,
/// and the floor the peer's revision must not be below.
struct ProbeRead {
    sent: Probe,
    /// The boundaries the counts were split at, and the source's count of
    /// each piece (`None` with `source_count`).
    bounds: Vec<Bytes>,
    source_pieces: Option<Vec<i64>>,
    source: Header,
    /// The source's own id as it reads now (`None`: the key is gone).
    source_id: Option<u64>,
    /// The source's key count at `applied` (`None`: compacted, or nothing
    /// applied yet).
    source_count: Option<i64>,
    stored: Stored,
    peer: Header,
    /// The copy's key count on the peer, read with the state key (`None`:
    /// this probe did not count, see [`count::Cadence`]).
    peer_count: Option<i64>,
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

/// The live phase of one session: watch events in, fenced batches out
/// through the send pipeline; a freshness probe every heartbeat.
struct Live<'a> {
    writer: &'a FencedWriter,
    cfg: &'a MirrorConfig,
    local: &'a Client,
    prefix: &'a Bytes,
    source_id_key: &'a Bytes,
    /// The watch's stream, for whether it is connected.
    ws: WatchStream,
    batcher: Batcher,
    inflight: Sequencer,
    /// The txns in flight, each tagged with its sequence number in the
    /// window and its batch (less the ops, which the pipeline holds).
    pipeline: Pipeline<'a, (u64, Batch)>,
    /// The peer's verification schedule, and whether a pass is running.
    verify: &'a mut VerifySchedule,
    /// Where the probe's key counts are split ([`super::count`]).
    splits: &'a mut CountSplits,
    verifying: bool,
    /// Key counts are compared only once the watermark is past this (see
    /// `Peer::replay_horizon`).
    replay_horizon: i64,
    splits_seen: u64,
    /// Watch messages received so far.
    received: u64,
    /// Data ops launched in this phase so far.
    launched_ops: u64,
    /// Each txn not yet under the watermark, by sequence number (the
    /// front is the watermark's next txn).
    ops_before: VecDeque<Launched>,
    /// Ops under the watermark of a revision above it: the applied first
    /// parts of a revision split over several txns.
    settled_ahead: Ahead,
    /// The last probe not yet confirmed current.
    probe: Option<Probe>,
    /// The heartbeat moved: the state key should record it.
    heartbeat_dirty: bool,
    /// Which probes count the copy.
    cadence: count::Cadence,
}

impl<'a> Live<'a> {
    /// Sealed batches to hold at most before reading the watch again: two
    /// windows' worth, so the batches fill while a window is in flight.
    fn max_ready(&self) -> usize {
        self.pipeline.window_txns() * 2
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
        let mut verifying: Option<BoxFuture<'a, Result<verify::Report>>> = None;
        let mut reprobing: Option<BoxFuture<'static, ProbeResult>> = None;
        loop {
            self.send_ready();
            let max_ready = self.max_ready();
            let quiet_at = self.probe.filter(|p| !p.quiet_done).map(|p| p.at + QUIET);
            let verify_at = self.verify.due().filter(|_| verifying.is_none());
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    self.drain().await;
                    return Ok(());
                }
                _ = async { lease_status.wait_for(|s| s.lost).await.is_ok() } => {
                    return Err(Error::LeaseLost { peer: self.writer.region.clone() });
                }
                Some(done) = self.pipeline.next(), if !self.pipeline.is_empty() => {
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
                    self.verifying = false;
                    self.verified(report)?;
                }
                _ = async {
                    match verify_at {
                        Some(t) => tokio::time::sleep_until(t.into()).await,
                        None => std::future::pending().await,
                    }
                }, if verify_at.is_some() => {
                    self.verifying = true;
                    verifying = Some(Box::pin(verify::pass(
                        self.writer,
                        self.local,
                        self.prefix.clone(),
                        self.cfg,
                        self.inflight.watermark(),
                    )));
                }
                _ = tick.tick(), if probing.is_none() => {
                    self.check_stale()?;
                    probing = Some(self.probe_read());
                    let now = Instant::now();
                    if reprobing.is_none() && self.pipeline.link().limits.reprobe_due(now) {
                        let prober = self.pipeline.prober();
                        reprobing = Some(Box::pin(self.pipeline.link().limits.reprobe(now, prober)));
                    }
                }
                up = async { reprobing.as_mut().expect("guarded").await }, if reprobing.is_some() => {
                    reprobing = None;
                    self.reprobed(up);
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
            unsettled_from: self
                .ops_before
                .front()
                .map_or(self.launched_ops, |l| l.before),
            ahead: self.settled_ahead.above(self.inflight.watermark()),
            quiet_done: false,
            counted: false,
        };
        let floor = self.writer.peer_revision();
        // Read before the source is: the source's revision can be no lower.
        // The watermark as it is when the read completes is no bound at
        // all: the stream goes on applying while the peer is read.
        let applied = self.inflight.watermark();
        let local = self.local;
        let prefix = self.prefix.clone();
        let id_key = self.source_id_key.clone();
        let writer = self.writer;
        // Counted in pieces, never in one walk of the whole subtree: etcd
        // holds every write behind a count's index walk (src/mirror/count.rs).
        let bounds = self.splits.snapshot();
        let max_ops = self.pipeline.limits().max_ops;
        let counting = self.cadence.due();
        Box::pin(async move {
            // The source's id and revision, and its key count at the
            // watermark, side by side; then the peer's state key and key
            // count at one revision.
            let counted = async {
                if applied <= 0 || !counting {
                    return Ok(None);
                }
                match count::count_at(local, &prefix, &bounds, applied, max_ops).await {
                    Ok(each) => Ok(Some(each)),
                    Err(etcd::Error::Compacted { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            };
            let (id, source_pieces) = tokio::join!(local.range(Range::key(id_key)), counted);
            let id = id?;
            let source_pieces = source_pieces?;
            let source_count = source_pieces.as_ref().map(|each| each.iter().sum());
            let source_id = id.kvs().first().and_then(|kv| state::parse_id(kv.value()));
            let source = id.header;
            let (stored, peer, peer_count) = if counting {
                let (stored, peer, n, _) = count::read_state_with_count(
                    &writer.client,
                    &writer.state_key,
                    &prefix,
                    &bounds,
                    max_ops,
                )
                .await?;
                (stored, peer, Some(n))
            } else {
                let (stored, peer) = count::read_state(&writer.client, &writer.state_key).await?;
                (stored, peer, None)
            };
            Ok(ProbeRead {
                bounds,
                source_pieces,
                sent: Probe {
                    source_revision: source.revision,
                    ..sent
                },
                source,
                source_id,
                source_count,
                stored,
                peer,
                peer_count,
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
        let id = w.marks.source_id.load(Relaxed);
        if id != 0 && read.source_id != Some(id) {
            return Err(Error::SourceChanged {
                peer: w.region.clone(),
                why: match read.source_id {
                    Some(now) => format!("source id is {now:016x}, the copy came from {id:016x}"),
                    None => format!(
                        "the source id key is gone (the copy came from {id:016x}): the store was wiped or restored"
                    ),
                },
            });
        }
        w.check_peer_read(&read.peer, read.floor)?;
        if read.stored.create_revision != w.fence {
            return Err(w.lost_claim(&read.stored));
        }
        if let Some(each) = &read.source_pieces {
            w.stats.count_pieces.store(each.len() as u64, Relaxed);
            self.splits.counted(&read.bounds, each);
        }
        let counted = if read.peer_count.is_some() {
            w.stats.copy_counts.fetch_add(1, Relaxed);
            let matched = self.check_count(&read)?;
            if let (true, Some(keys)) = (matched, read.source_count) {
                self.cadence.matched(keys);
            }
            matched
        } else {
            self.cadence.skipped()
        };
        // A pending probe keeps its place until its quiet period is over,
        // or a busy stream would never have one.
        if self.probe.is_none_or(|p| p.quiet_done) {
            self.probe = Some(Probe {
                counted,
                ..read.sent
            });
        }
        Ok(())
    }

    /// Compares the copy's key count on the peer with the source's at the
    /// watermark: a copy emptied or grown out of band (`del --prefix`, a
    /// revoked lease, keys written by hand) must not read as current. The
    /// txns in flight, and those sent while the probe was out, may have
    /// moved the peer by at most their ops; keys too large for the peer are
    /// absent there by design. Returns whether it could count at all.
    fn check_count(&self, read: &ProbeRead) -> Result<bool> {
        let (Some(source), Some(peer_count)) = (
            read.source_count
                .filter(|_| read.applied >= self.replay_horizon),
            read.peer_count,
        ) else {
            return Ok(false);
        };
        let oversized = self.writer.oversized_count() as i64;
        let expected = source - oversized;
        // Only while they exist: a tolerance kept after the split revision
        // is whole would let a copy short of that many keys read fresh.
        let slack =
            (self.launched_ops.saturating_sub(read.sent.unsettled_from) + read.sent.ahead) as i64;
        if (peer_count - expected).abs() <= slack {
            return Ok(true);
        }
        Err(Error::CopyChanged {
            peer: self.writer.region.clone(),
            why: format!(
                "it holds {peer_count} keys, the source held {source} at revision {} ({oversized} of them too large for the peer, {slack} ops in flight)",
                read.applied
            ),
        })
    }

    /// Books a verification pass that ended: done, or skipped (counted,
    /// and tried again soon) when its revision was compacted.
    fn verified(&mut self, report: Result<verify::Report>) -> Result<()> {
        let now = Instant::now();
        let stats = &self.writer.stats;
        match report {
            Ok(report) => {
                *self.splits = report.splits;
                let was_overdue = self.verify.overdue();
                self.verify.done(now, stats);
                if was_overdue {
                    stats.set_synced(true);
                }
                Ok(())
            }
            Err(Error::Etcd(etcd::Error::Compacted { .. })) => {
                tracing::info!(peer = %self.writer.region, "verification skipped: its pinned revision was compacted; the next pass pins a newer one");
                let retry = self.cfg.heartbeat_interval * 2;
                self.verify
                    .skipped(now, VerifySkip::Compacted, retry, stats);
                if self.verify.overdue() {
                    tracing::warn!(peer = %self.writer.region, "verification could not finish several times in a row: the copy is reported not synced until a pass does");
                    stats.set_synced(false);
                }
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Marks the peer current as of the pending probe when everything the
    /// source held then is applied, or the watch has been quiet since with
    /// nothing pending (an idle subtree: nothing to apply).
    fn check_current(&mut self) {
        let Some(p) = self.probe else { return };
        let applied = self.inflight.watermark() >= p.source_revision;
        let idle = self.batcher.is_idle()
            && self.inflight.is_empty()
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
            // Known gap: the probe's revision may come from another member
            // than the watch's; a watch on a member that lags by over the
            // quiet period could still deliver events below it.
            self.inflight.advance_idle(p.source_revision);
        }
        self.probe = None;
        if !p.counted {
            return;
        }
        let w = self.writer;
        w.stats.mark_current(p.at, p.at_unix_ms);
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
                if self.inflight.is_empty()
                    && (self.inflight.state_behind() || self.heartbeat_dirty)
                {
                    self.launch(Batch::empty(self.inflight.watermark()));
                }
                break;
            };
            // Per-key order first: a conflict says nothing about the link.
            if self.inflight.conflicts(&batch.keys) {
                break;
            }
            if !self.pipeline.has_room(batch.bytes) {
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

    fn launch(&mut self, mut batch: Batch) {
        // Every state put carries the heartbeat as it is now.
        self.heartbeat_dirty = false;
        let (seq, state_rev) = self.inflight.open(&batch.keys, batch.complete_through);
        tracing::trace!(peer = %self.writer.region, seq, through = batch.complete_through, state_rev, ops = batch.ops.len(), "send");
        let ops = std::mem::take(&mut batch.ops);
        self.ops_before.push_back(Launched {
            seq,
            before: self.launched_ops,
            ahead: batch.ahead as u64,
            through: batch.complete_through,
        });
        self.launched_ops += ops.len() as u64;
        self.pipeline.send(ops, Some(state_rev), (seq, batch));
    }

    /// Applies what a re-probe of lowered txn limits found: a peer that
    /// takes the configured limits again gets bigger batches from the next
    /// one on.
    fn reprobed(&mut self, up: ProbeResult) {
        let link = self.pipeline.link();
        match up {
            Ok(Some(limits)) => {
                link.limits.reprobed(Some(limits));
                link.limits.publish(&self.writer.stats);
                tracing::info!(peer = %self.writer.region, max_txn_ops = limits.max_ops, max_request_bytes = limits.max_bytes, "the peer takes larger txns again");
                self.batcher.set_limits(limits);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(peer = %self.writer.region, error = %e, "re-probing the peer's txn limits failed; trying again later");
            }
        }
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
                for e in &resp.events {
                    self.splits.offer(e.kv.key());
                }
                self.batcher.push(resp.events, Instant::now());
            } else if self.batcher.is_idle() && self.inflight.is_empty() {
                // A per-watcher progress notice: etcd only sends those once
                // the watcher has caught up. (This stream is the session's
                // own and never asks for the broadcast kind, which 3.4 also
                // sends to watchers still catching up.)
                self.inflight.advance_idle(resp.revision);
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
    async fn complete(&mut self, done: Done<(u64, Batch)>) -> Result<()> {
        let (seq, batch) = self.pipeline.settle(done).await?;
        self.inflight.release(&batch.keys);
        // A refusal may have lowered the limits: pack for them from now.
        let limits = self.pipeline.limits();
        if limits != self.batcher.limits() {
            self.batcher.set_limits(limits);
        }
        let Batch {
            complete_through,
            events,
            received,
            bytes,
            ..
        } = batch;
        let stats = &self.writer.stats;
        stats.events.fetch_add(events, Relaxed);
        stats.bytes.fetch_add(bytes as u64, Relaxed);
        if events > 0 {
            stats.apply_latency.observe(received.elapsed(), events);
        }
        tracing::trace!(peer = %self.writer.region, seq, through = complete_through, "acked");
        let watermark = self.inflight.ack(seq, complete_through);
        stats.applied_revision.fetch_max(watermark, Relaxed);
        let floor = self.inflight.floor_seq();
        while let Some(l) = self.ops_before.front().filter(|l| l.seq < floor) {
            self.settled_ahead.settled(l);
            self.ops_before.pop_front();
        }
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
        while !self.pipeline.is_empty() {
            tokio::select! {
                _ = &mut deadline => { clean = false; break; }
                Some(done) = self.pipeline.next() => {
                    if self.complete(done).await.is_err() {
                        clean = false;
                    }
                }
            }
        }
        if clean && self.inflight.state_behind() {
            let txn = self.writer.txn(Vec::new(), Some(self.inflight.watermark()));
            tokio::select! {
                _ = &mut deadline => {}
                _ = self.writer.client.txn(txn) => {}
            }
        }
    }
}
