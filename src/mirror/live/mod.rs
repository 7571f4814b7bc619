//! The live loop: the source's watch in, fenced batches out.
//!
//! Watch events are packed into batches of consecutive revisions
//! ([`self::batch`]) and sent through the send pipeline
//! ([`super::send`]), several in flight; the in-flight window
//! ([`self::inflight`]) keeps per-key order and the contiguous watermark
//! that the state key records. Every heartbeat a freshness probe reads the
//! source (one read for all the engine's peers, [`self::tick`]) and, when
//! no txn's answer has vouched for it since the last probe, the peer: their
//! identity, and whether the peer holds everything through the source's
//! revision (staleness, the heartbeat in the state key). The
//! verification pass ([`super::verify`]) and the re-probe of lowered txn
//! limits ([`super::send::limits`]) run beside it.

pub mod batch;
pub(crate) mod copy;
mod fresh;
mod inflight;
mod probe;
pub(crate) mod source;
pub(crate) mod tick;

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use self::batch::{Batch, Batcher};
use self::copy::{CopyStart, CopyWatch};
use self::fresh::Freshness;
use self::inflight::{Ahead, Launched, Sequencer};
use self::probe::ProbeRead;
pub(crate) use self::source::Opened;
use self::source::{Continuity, open_watch};
use self::tick::Ticks;
use super::config::MirrorConfig;
use super::count::{self, CountSplits};
use super::send::limits::ProbeResult;
use super::send::writer::FencedWriter;
use super::send::{Done, Link, Pipeline};
use super::stats::VerifySkip;
use super::verify::{self, VerifySchedule};
use crate::error::{Error, Result};
use crate::etcd::{self, LeaseStatus};
use crate::store::{Store, WatchEvents, WatchHealth};

/// What a live phase borrows from its peer's task for its length.
pub(crate) struct Parts<'a> {
    pub(crate) writer: &'a FencedWriter,
    pub(crate) cfg: &'a MirrorConfig,
    pub(crate) local: &'a Store,
    pub(crate) prefix: &'a Bytes,
    /// The engine's probe clock and shared source read.
    pub(crate) ticks: &'a Ticks,
    /// What is learnt about the link: it outlives the phase.
    pub(crate) link: &'a mut Link,
    pub(crate) verify: &'a mut VerifySchedule,
    pub(crate) splits: &'a mut CountSplits,
    /// The source's history, checked across reconnects and sessions.
    pub(crate) continuity: &'a mut Continuity,
    /// See `Peer::replay_horizon`.
    pub(crate) replay_horizon: i64,
    /// Where the copy watch comes from.
    pub(crate) copy: CopyStart,
    /// The copy was resumed from another engine (see `Peer::inherited`).
    pub(crate) inherited: bool,
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
        ticks,
        link,
        verify,
        splits,
        continuity,
        replay_horizon,
        copy,
        inherited,
        cancel,
    } = parts;
    let Some(lease_status) = writer.lease.as_ref().map(|l| l.subscribe()) else {
        return Err(Error::LeaseLost {
            peer: writer.region.clone(),
        });
    };
    let from = opened.from;
    let (health, watcher) = match opened.watch {
        Some(opened) => opened,
        None => open_watch(local, prefix, from)?,
    };
    continuity.start(health.reconnects());
    let stats = &writer.stats;
    stats.applied_revision.store(from - 1, Relaxed);
    stats.source_revision.fetch_max(from - 1, Relaxed);
    // A copy nobody could verify several times in a row is not vouched
    // for until a pass completes.
    stats.set_synced(!verify.overdue());
    tracing::info!(peer = %writer.region, from, "mirroring live");
    // The copy watch starts where the claim said, or is the sync's: our
    // own txns since are booked, anything else there is out of band.
    let open = |from: i64| CopyWatch::open(&writer.client, prefix, from, writer.own.clone());
    let (copy, found, lost) = match copy {
        _ if !cfg.copy_watch => (None, Vec::new(), false),
        CopyStart::From(from) => (Some(open(from.max(1))?), Vec::new(), false),
        CopyStart::Carried(c) => (Some(c.watch), c.found.into_iter().collect(), false),
        CopyStart::Lost => (Some(open(writer.peer_revision() + 1)?), Vec::new(), true),
    };
    let recount = if copy.is_some() {
        cfg.recount_interval
    } else {
        Duration::ZERO
    };
    let fresh = Freshness::new(
        cfg.heartbeat_interval,
        cfg.lease_ttl,
        replay_horizon,
        recount,
    );
    let mut live = Live {
        writer,
        cfg,
        local,
        prefix,
        ticks,
        continuity,
        health,
        batcher: Batcher::new(link.limits.current(), writer.lease_id()),
        inflight: Sequencer::new(from - 1),
        pipeline: Pipeline::new(writer, link),
        verify,
        splits,
        verifying: false,
        unchanged: verify::Unchanged::default(),
        splits_seen: 0,
        launched_ops: 0,
        ops_before: VecDeque::new(),
        settled_ahead: Ahead::default(),
        fresh,
        lease_status,
        heartbeat_dirty: false,
        answered_since_probe: false,
        source_count: None,
        last_change: 0,
        copy,
        to_repair: copy::Pending::new(),
        repair_reading: HashSet::new(),
        repair_touched: HashSet::new(),
        repair_ready: None,
        repair_seqs: HashSet::new(),
    };
    // What the predecessor's copy watch saw and left unrepaired is behind
    // ours: a gap. With verification off nothing can close one; the copy
    // is vouched for by its counts, as a copy always is then.
    if inherited && live.copy.is_some() && live.verify.is_on() {
        live.open_gap();
    }
    if lost {
        if !live.verify.is_on() {
            return Err(Error::CopyChanged {
                peer: writer.region.clone(),
                why: "the copy watch ended during the sync, and with verification off only a re-sync can compare what changed in the gap".into(),
            });
        }
        live.open_gap();
    }
    // What the sync's copy watch found changed out of band during it.
    live.changed_out_of_band(found)?;
    let result = live.run(watcher, cancel).await;
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

/// The live phase of one session: watch events in, fenced batches out
/// through the send pipeline; a freshness probe every heartbeat.
struct Live<'a> {
    writer: &'a FencedWriter,
    cfg: &'a MirrorConfig,
    local: &'a Store,
    prefix: &'a Bytes,
    ticks: &'a Ticks,
    /// The watch's stream, for whether it is connected.
    health: Box<dyn WatchHealth>,
    /// Whether the source is still the history the copy came from, checked
    /// after the watch reconnects.
    continuity: &'a mut Continuity,
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
    /// Whether a scheduled pass would compare anything new.
    unchanged: verify::Unchanged,
    splits_seen: u64,
    /// Data ops launched in this phase so far.
    launched_ops: u64,
    /// Each txn not yet under the watermark, by sequence number (the
    /// front is the watermark's next txn).
    ops_before: VecDeque<Launched>,
    /// Ops under the watermark of a revision above it: the applied first
    /// parts of a revision split over several txns.
    settled_ahead: Ahead,
    /// Whether the copy is current: the one owner of that decision.
    fresh: Freshness,
    /// The lease's keep-alive status.
    lease_status: watch::Receiver<LeaseStatus>,
    /// The watch on the copy itself (`None`: off, see
    /// [`MirrorConfig::copy_watch`]).
    copy: Option<CopyWatch>,
    /// Keys changed out of band, waiting for the next repair.
    to_repair: copy::Pending,
    /// Keys whose repair is being read, and those of them the live stream
    /// sent a txn for since: it decides those.
    repair_reading: HashSet<Bytes>,
    repair_touched: HashSet<Bytes>,
    /// A repair's writes, waiting for their keys' txns in flight.
    repair_ready: Option<Batch>,
    /// Sequence numbers of the repair txns in flight.
    repair_seqs: HashSet<u64>,
    /// The heartbeat moved: the state key should record it.
    heartbeat_dirty: bool,
    /// The source's count as this session's last counting probe read it
    /// (`count::SourceCount`), and the newest revision the watch delivered
    /// an event at: together they say when it can be reused.
    source_count: Option<count::SourceCount>,
    last_change: i64,
    /// A txn of ours was answered since the last probe went out (see
    /// [`Live::probe_read`]).
    answered_since_probe: bool,
}

impl<'a> Live<'a> {
    /// Sealed batches to hold at most before reading the watch again: two
    /// windows' worth, so the batches fill while a window is in flight.
    fn max_ready(&self) -> usize {
        self.pipeline.window_txns() * 2
    }

    async fn run(
        &mut self,
        mut watcher: Box<dyn WatchEvents>,
        cancel: &CancellationToken,
    ) -> Result<()> {
        // The first probe at once; then on the engine's ticks, which its
        // other peers share (`live/tick.rs`).
        let mut probe_at = Instant::now();
        let mut probing: Option<BoxFuture<'a, etcd::Result<ProbeRead>>> = None;
        let mut verifying: Option<BoxFuture<'a, Result<verify::Report>>> = None;
        let mut repairing: Option<BoxFuture<'a, Result<copy::Plan>>> = None;
        let mut reprobing: Option<BoxFuture<'static, ProbeResult>> = None;
        loop {
            self.send_ready();
            let max_ready = self.max_ready();
            let quiet_at = self.fresh.quiet_at();
            let mut lease_status = self.lease_status.clone();
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
                    self.judge_copy()?;
                    self.check_current();
                }
                msg = async { self.copy.as_mut().expect("guarded").next().await }, if self.copy.is_some() => {
                    if self.copy_event(msg)? {
                        // Re-armed after a gap: count at once.
                        probe_at = Instant::now();
                    }
                    self.judge_copy()?;
                }
                plan = async { repairing.as_mut().expect("guarded").await }, if repairing.is_some() => {
                    repairing = None;
                    self.planned(plan?);
                }
                _ = std::future::ready(()), if repairing.is_none() && self.repair_ready.is_none() && !self.to_repair.is_empty() => {
                    let keys: Vec<Bytes> = std::mem::take(&mut self.to_repair).into_iter().collect();
                    self.repair_reading = keys.iter().cloned().collect();
                    let max_ops = self.pipeline.limits().max_ops.saturating_sub(2);
                    repairing = Some(Box::pin(copy::plan(self.writer, self.local, keys, max_ops)));
                }
                msg = watcher.next_response(), if self.batcher.ready_len() < max_ready => {
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
                    self.judge_copy()?;
                }
                _ = async {
                    match verify_at {
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                }, if verify_at.is_some() => {
                    verifying = self.due_pass();
                }
                _ = tokio::time::sleep_until(probe_at), if probing.is_none() => {
                    let now = Instant::now();
                    probe_at = self.ticks.next_after(now);
                    self.check_stale()?;
                    probing = Some(self.probe_read());
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
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                }, if quiet_at.is_some() => {
                    self.check_current();
                    self.fresh.quiet_passed();
                }
            }
        }
    }

    /// Where the two watches stand: the newest revision the source's
    /// watch delivered an event at, and the last the copy watch delivered
    /// (`None`: the copy is not watched). A backstop whose last run found
    /// the copy whole at these needs no other (`count::Cadence`,
    /// [`verify::Unchanged`]).
    fn positions(&self) -> Option<count::Positions> {
        self.copy.as_ref().map(|c| (self.last_change, c.seen()))
    }

    /// The scheduled pass is due: its future, or `None` (booked as done)
    /// when neither watch delivered a thing since a pass found the copy
    /// exact, so it would find the same ([`verify::Unchanged`]).
    fn due_pass(&mut self) -> Option<BoxFuture<'a, Result<verify::Report>>> {
        let at = self.positions();
        if !self.fresh.needs_pass() && self.unchanged.skip(at) {
            self.verify.done(Instant::now(), &self.writer.stats);
            self.writer.stats.verify_unchanged.fetch_add(1, Relaxed);
            return None;
        }
        self.unchanged.began(at);
        self.verifying = true;
        self.fresh.pass_started();
        Some(Box::pin(verify::pass(
            self.writer,
            self.local,
            self.prefix.clone(),
            self.cfg,
            self.inflight.watermark(),
        )))
    }

    /// Books a verification pass that ended: done, or skipped (counted,
    /// and tried again soon) when its revision was compacted.
    fn verified(&mut self, report: Result<verify::Report>) -> Result<()> {
        let now = Instant::now();
        let completed = report.is_ok();
        self.unchanged.ended(report.as_ref().ok());
        let closed_gap = self.fresh.pass_ended(completed);
        let stats = &self.writer.stats;
        match report {
            Ok(report) => {
                *self.splits = report.splits;
                // The pass read every source key at its revision: the
                // next backstop count of a source at rest reads only
                // the peer. (Without it the first count after a pass,
                // split afresh, would read the source again.)
                self.source_count = count::SourceCount::new(
                    report.pinned,
                    self.splits.snapshot(),
                    report.source_pieces,
                );
                let was_overdue = self.verify.overdue();
                self.verify.done(now, stats);
                if was_overdue {
                    stats.set_synced(true);
                }
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
            }
            Err(e) => return Err(e),
        }
        if closed_gap {
            self.resynced();
        }
        if completed && self.fresh.needs_pass() {
            // A gap in the copy watch opened while this pass ran: the
            // next one runs now, not an interval on (one that could not
            // finish is tried again after its retry).
            self.verify.run_now(now);
        }
        Ok(())
    }

    /// Asks [`Freshness`] whether the pending probe settles now, and
    /// applies what it decided.
    fn check_current(&mut self) {
        let now = Instant::now();
        let decision = self.fresh.decide(fresh::Now {
            at: now,
            watermark: self.inflight.watermark(),
            nothing_pending: self.batcher.is_idle() && self.inflight.is_empty(),
            connected: self.health.is_connected(),
            watch_member: self.health.member_id(),
            reconnects: self.health.reconnects(),
            lease_left: self.lease_status.borrow().ttl_left(),
            unjudged_from: self.copy.as_ref().and_then(CopyWatch::unjudged_from),
        });
        if let Some(through) = decision.idle_through {
            // Nothing in the subtree changed through that revision: resume
            // from there (this moves an idle subtree's state revision on
            // etcd 3.4, which sends no progress notices by default).
            self.inflight.advance_idle(through);
        }
        if let Some(at) = decision.current_at {
            let w = self.writer;
            // Its Unix time by this clock now, never ahead of it.
            let at_unix_ms =
                self.cfg.clock.unix_ms() - now.saturating_duration_since(at).as_millis() as i64;
            w.stats.mark_current(at, at_unix_ms);
            w.marks.mark_current(at);
            self.heartbeat_dirty = true;
        }
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
        if let Some(repair) = self.repair_ready.take() {
            if !self.inflight.conflicts(&repair.keys) && self.pipeline.has_room(repair.bytes) {
                let seq = self.launch(repair);
                self.repair_seqs.insert(seq);
            } else {
                self.repair_ready = Some(repair);
            }
        }
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

    fn launch(&mut self, mut batch: Batch) -> u64 {
        // Every state put carries the heartbeat as it is now.
        self.heartbeat_dirty = false;
        if !self.repair_reading.is_empty() {
            for k in &batch.keys {
                if self.repair_reading.contains(k) {
                    self.repair_touched.insert(k.clone());
                }
            }
        }
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
        seq
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
        watcher: &mut Box<dyn WatchEvents>,
        max_ready: usize,
    ) -> Result<()> {
        loop {
            let resp = match msg {
                None => return Err(Error::Etcd(etcd::Error::Closed)),
                Some(Err(e)) => return Err(Error::Etcd(e)),
                Some(Ok(resp)) => resp,
            };
            self.fresh.received();
            tracing::trace!(peer = %self.writer.region, rev = resp.header.revision, events = resp.events.len(), first = resp.events.first().map(|e| e.revision()), "watch");
            if let Some(last) = resp.events.last() {
                let stats = &self.writer.stats;
                stats.source_revision.fetch_max(last.revision(), Relaxed);
                self.last_change = self.last_change.max(last.revision());
                for e in &resp.events {
                    self.splits.offer(e.kv.key());
                }
                self.continuity.saw(&resp.events, self.health.reconnects());
                self.batcher.push(resp.events, Instant::now());
            } else if resp.is_progress_notify()
                && self.batcher.is_idle()
                && self.inflight.is_empty()
            {
                // A per-watcher progress notice: etcd only sends those once
                // the watcher has caught up. (This stream is the session's
                // own and never asks for the broadcast kind, which 3.4 also
                // sends to watchers still catching up.)
                self.inflight.advance_idle(resp.header.revision);
            }
            if self.batcher.ready_len() >= max_ready {
                return Ok(());
            }
            msg = match watcher.next_buffered() {
                Some(m) => Some(m),
                None => return Ok(()),
            };
        }
    }

    /// Books one finished txn: stats, the contiguous watermark, errors.
    async fn complete(&mut self, done: Done<(u64, Batch)>) -> Result<()> {
        let (seq, batch) = self.pipeline.settle(done).await?;
        self.answered_since_probe = true;
        self.inflight.release(&batch.keys);
        let keys_written = batch.keys.len() as u64;
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
        if self.repair_seqs.remove(&seq) {
            // Written or left to a write that landed first: either way
            // the key is the source's or on its way there.
            stats.repaired.fetch_add(keys_written, Relaxed);
            self.maybe_repaired();
        }
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
        let grace = self.cfg.shutdown_grace.min(self.writer.client.timeout());
        let deadline = tokio::time::sleep(grace);
        tokio::pin!(deadline);
        let mut clean = true;
        while !self.pipeline.is_empty() {
            tokio::select! {
                biased;
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
                biased;
                _ = &mut deadline => {}
                _ = self.writer.own.send(&self.writer.client, txn) => {}
            }
        }
    }
}
