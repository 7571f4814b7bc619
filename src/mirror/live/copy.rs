//! The copy watch: every change to this region's copy on the peer, and
//! whether it was ours.
//!
//! Each live phase watches its copy on the peer (the region's subtree
//! there) from just past the last txn of ours before it. An event whose
//! revision is one of our own txns' ([`Own`]) is ours; any other is an
//! out-of-band change (a hand edit, a `del --prefix`, a stray writer, a
//! deposed engine's txn that slipped in before the fence moved, a lease
//! other than ours expiring): the live loop turns the copy not current at
//! once and repairs the keys it names from the source ([`plan`]).
//!
//! A sync opens the copy watch itself ([`Carried`]), before its first
//! read of the peer, and judges what it delivers between the sync's txns:
//! the live phase takes over a watch that is caught up, with whatever it
//! found changed during the sync waiting for repair. A watch opened only
//! at the live phase, from before the sync, would first replay every
//! write of the sync (a million events after a million-key sync, all held
//! until judged), and a change made just after the sync would wait behind
//! them: 1.3-2.4 s at a million keys, long enough for a count to find it
//! first and re-sync the whole copy.
//!
//! Why watch rather than count: a key count cannot see a value edited in
//! place, a delete and a stray put cancel out in it, and counting a large
//! copy often enough to matter costs both etcds a walk of the subtree.
//! The watch sees every change, at the cost of one watcher on the peer.
//! Counting stays as a backstop (at the session start, and every
//! [`crate::mirror::MirrorConfig::recount_interval`]), and is what re-arms
//! the watch when the peer compacted past it.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use tokio::time::Instant;

use bytes::Bytes;

use super::Live;
use super::batch::Batch;
use crate::error::{Error, Result};
use crate::etcd::{
    self, KeyValue, Op, OpResponse, Range, Txn, TxnResponse, WatchOptions, WatchResponse,
};
use crate::mirror::send::own::{Own, Verdict};
use crate::mirror::send::writer::FencedWriter;
use crate::store::{Store, WatchEvents, WatchHealth};

/// The watch on one session's copy, and the events not yet judged.
pub(crate) struct CopyWatch {
    /// Kept so the stream lives as long as its watcher.
    _health: Box<dyn WatchHealth>,
    watcher: Box<dyn WatchEvents>,
    own: Own,
    /// Events not yet judged: revision, key, and our txns sent when it
    /// arrived.
    held: VecDeque<(i64, Bytes, u64)>,
    /// The last revision the watch delivered.
    seen: i64,
}

impl std::fmt::Debug for CopyWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyWatch")
            .field("held", &self.held.len())
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

impl CopyWatch {
    /// Watches `prefix` on the peer from revision `from`.
    pub(crate) fn open(peer: &Store, prefix: &Bytes, from: i64, own: Own) -> Result<CopyWatch> {
        let (health, watcher) =
            peer.watch(WatchOptions::prefix(prefix.clone()).start_revision(from))?;
        own.prune(from);
        Ok(CopyWatch {
            _health: health,
            watcher,
            own,
            held: VecDeque::new(),
            seen: from - 1,
        })
    }

    /// The watch's next response (cancel-safe).
    pub(crate) async fn next(&mut self) -> Option<etcd::Result<WatchResponse>> {
        self.watcher.next_response().await
    }

    /// Takes a response's events, to be judged.
    pub(crate) fn take(&mut self, resp: WatchResponse) {
        let sent = self.own.sent();
        for e in resp.events {
            self.seen = self.seen.max(e.revision());
            self.held
                .push_back((e.revision(), e.kv.key().clone(), sent));
        }
    }

    /// Takes and judges what the watch has delivered so far, without
    /// waiting: the keys changed out of band among them. A sync calls it
    /// between its txns, so that the copy watch keeps up with the sync's
    /// own writes instead of replaying them all when the live phase starts
    /// (at a million keys that replay held a stray key back for seconds,
    /// and every event of it in memory). An error ends the watch: the
    /// watch was compacted past or closed.
    pub(crate) fn catch_up(&mut self) -> etcd::Result<Vec<Bytes>> {
        use futures_util::FutureExt;
        // `next` is cancel-safe: a response not ready now stays queued.
        while let Some(msg) = self.next().now_or_never() {
            match msg {
                Some(Ok(resp)) => self.take(resp),
                Some(Err(e)) => return Err(e),
                None => return Err(etcd::Error::Closed),
            }
        }
        Ok(self.judge())
    }

    /// The last revision the watch delivered, and the events it holds
    /// unjudged.
    #[cfg(test)]
    pub(crate) fn position(&self) -> (i64, usize) {
        (self.seen, self.held.len())
    }

    /// The last revision the watch delivered.
    pub(crate) fn seen(&self) -> i64 {
        self.seen
    }

    /// The lowest revision among the events not yet judged.
    pub(crate) fn unjudged_from(&self) -> Option<i64> {
        self.held.front().map(|h| h.0)
    }

    /// Judges the held events that can be judged now, in order: the keys
    /// changed out of band among them.
    pub(crate) fn judge(&mut self) -> Vec<Bytes> {
        let mut foreign = Vec::new();
        while let Some((revision, key, sent)) = self.held.front() {
            match self.own.judge(*revision, *sent) {
                Verdict::Own => {}
                Verdict::Foreign => foreign.push(key.clone()),
                // Events come in revision order and were held in it: the
                // rest waits with this one.
                Verdict::Undecided => break,
            }
            self.held.pop_front();
        }
        let floor = self.held.front().map_or(self.seen + 1, |h| h.0);
        self.own.prune(floor);
        foreign
    }
}

/// What a repair's read found: the writes that make the keys match the
/// source, each a nested txn guarded by the key's revision on the peer as
/// read, and how many keys already matched.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) fixes: Vec<(Bytes, Op)>,
    pub(crate) matched: u64,
}

/// Compares `keys` on the peer with the source as it is now: a chunk of
/// keys to a round trip on each store. The writes it plans re-put a key
/// from the source, or delete it when the source has none; each is guarded
/// by the key's revision on the peer as read, so a write that lands there
/// meanwhile wins. They go out through the live loop, in per-key order
/// with the live stream's txns (`Live::plan_repairs`): a delete the live
/// stream sends for a key already absent leaves no trace a guard could
/// see, so only that order keeps a repair from re-putting it.
pub(crate) async fn plan(
    writer: &FencedWriter,
    local: &Store,
    keys: Vec<Bytes>,
    max_ops: usize,
) -> Result<Plan> {
    let mut plan = Plan::default();
    for chunk in keys.chunks(max_ops.max(1)) {
        let ranges = || chunk.iter().map(|k| Op::from(Range::key(k.clone())));
        let (source, peer) = tokio::join!(
            local.txn(Txn::new().and_then(ranges())),
            writer.client.txn(Txn::new().and_then(ranges()))
        );
        let (source, peer) = (source?, peer.map_err(|e| writer.txn_error(e))?);
        for (i, key) in chunk.iter().enumerate() {
            // A value found too large for the peer is absent there by
            // design: the repair of a key put there out of band deletes it
            // (re-putting the source's value would only be refused).
            let want = first_kv(&source, i).filter(|_| !writer.is_oversized(key));
            let have = first_kv(&peer, i);
            let same = match (&want, &have) {
                (Some(w), Some(h)) => w.value() == h.value() && h.lease() == writer.lease_id(),
                (None, None) => true,
                _ => false,
            };
            if same {
                plan.matched += 1;
                continue;
            }
            let (guard, op) = writer.fix(key, want, have.as_ref());
            plan.fixes.push((
                key.clone(),
                Op::from(Txn::new().when([guard]).and_then([op])),
            ));
        }
    }
    Ok(plan)
}

/// The key a txn's `i`-th range found, if any.
fn first_kv(resp: &TxnResponse, i: usize) -> Option<KeyValue> {
    match resp.responses.get(i) {
        Some(OpResponse::Range(r)) => r.kvs().first().cloned(),
        _ => None,
    }
}

/// The keys a repair will take at most: a change larger than this (a
/// `del --prefix` of a large copy) is a re-sync's job, which compares the
/// whole copy in pages rather than key by key.
pub(crate) const MAX_REPAIR_KEYS: usize = 1_000;

/// Keys waiting for a repair, deduplicated.
pub(crate) type Pending = BTreeSet<Bytes>;

/// The copy watch a sync opened and kept up with, handed to the live
/// phase that follows it, with the keys it found changed out of band
/// during the sync (the sync may have compared some of them before the
/// change: their repair then finds them matching and writes nothing).
#[derive(Debug)]
pub(crate) struct Carried {
    pub(crate) watch: CopyWatch,
    pub(crate) found: Pending,
}

/// Where a live phase's copy watch comes from.
#[derive(Debug)]
pub(crate) enum CopyStart {
    /// Opened from this revision: a resumed copy (see `Peer::copy_from`).
    From(i64),
    /// The sync's, kept up with through it.
    Carried(Carried),
    /// The sync's ended during it: opened again from the peer's revision
    /// as last read, with a gap that a verification pass closes.
    Lost,
}

impl Carried {
    /// Opens the copy watch of a sync about to start, from `from`: at or
    /// below the revision of the sync's first read of the peer, so that a
    /// change the sync's pages cannot have seen is the watch's.
    pub(crate) fn open(peer: &Store, prefix: &Bytes, from: i64, own: Own) -> Result<Carried> {
        Ok(Carried {
            watch: CopyWatch::open(peer, prefix, from.max(1), own)?,
            found: Pending::new(),
        })
    }

    /// See [`CopyWatch::catch_up`].
    pub(crate) fn catch_up(&mut self) -> etcd::Result<()> {
        let foreign = self.watch.catch_up()?;
        self.found.extend(foreign);
        Ok(())
    }
}

/// The live loop's side of the copy watch: taking its events, judging
/// them, and sending the repairs.
impl Live<'_> {
    /// Takes a response of the copy watch. A watch the peer compacted
    /// past is re-armed from the oldest revision the peer still has; the
    /// copy is counted at once (true) and verified: what happened in the
    /// gap only they can see, and only the pass sees an edit.
    pub(super) fn copy_event(
        &mut self,
        msg: Option<etcd::Result<etcd::WatchResponse>>,
    ) -> Result<bool> {
        let Some(copy) = self.copy.as_mut() else {
            return Ok(false);
        };
        match msg {
            Some(Ok(resp)) => {
                copy.take(resp);
                Ok(false)
            }
            Some(Err(etcd::Error::Compacted { compact_revision })) => {
                // Just past the compaction (or, if the peer did not say
                // where it is, past its revision as of our last read of
                // it): from our own last txn again would only be refused
                // again. Not *at* the compaction: the client asks for the
                // revision before its start, so a start at the compaction
                // revision is refused too, at once, and the watch would be
                // re-armed for ever (the simulation found that loop).
                let floor = self.writer.peer_revision() + 1;
                let from = compact_revision.map_or(floor, |c| (c + 1).max(floor));
                if !self.verify.is_on() {
                    // Only a pass can see an edit made in the gap.
                    return Err(Error::CopyChanged {
                        peer: self.writer.region.clone(),
                        why: "the peer compacted past the copy watch, and with verification off only a re-sync can compare what changed in the gap".into(),
                    });
                }
                tracing::info!(peer = %self.writer.region, from, "the peer compacted past the copy watch; re-armed; the copy is counted and verified before it is current again");
                self.copy = Some(CopyWatch::open(
                    &self.writer.client,
                    self.prefix,
                    from,
                    self.writer.own.clone(),
                )?);
                self.open_gap();
                Ok(true)
            }
            Some(Err(e)) => Err(Error::Etcd(e)),
            None => Err(Error::Etcd(etcd::Error::Closed)),
        }
    }

    /// Judges what the copy watch holds: a change that was not ours turns
    /// the copy not current at once (the state key says so too) and queues
    /// its key for repair. More keys than a repair takes are a re-sync's
    /// job.
    pub(super) fn judge_copy(&mut self) -> Result<()> {
        let Some(copy) = self.copy.as_mut() else {
            return Ok(());
        };
        let foreign = copy.judge();
        self.changed_out_of_band(foreign)
    }

    /// Keys the copy watch found changed out of band: the copy is not
    /// current until they are repaired.
    pub(super) fn changed_out_of_band(&mut self, foreign: Vec<Bytes>) -> Result<()> {
        if foreign.is_empty() {
            return Ok(());
        }
        let w = self.writer;
        w.stats.out_of_band.fetch_add(foreign.len() as u64, Relaxed);
        if !self.fresh.is_out_of_band() {
            tracing::warn!(peer = %w.region, keys = foreign.len(), first = %String::from_utf8_lossy(&foreign[0]), "the copy was changed out of band: not current until repaired");
            self.fresh.out_of_band();
            w.stats.set_synced(false);
            w.marks.synced.store(false, Relaxed);
            self.heartbeat_dirty = true;
        }
        self.to_repair.extend(foreign);
        if self.to_repair.len() > MAX_REPAIR_KEYS {
            // The session re-syncs (`peer/session.rs`), and that sync's
            // copy watch starts past what this one delivered: the sync
            // compares every key after it, and a watch from our last txn
            // would judge the change again and find it out of band again.
            if let Some(copy) = &self.copy {
                w.witnessed(copy.seen());
            }
            return Err(Error::CopyChanged {
                peer: w.region.clone(),
                why: format!(
                    "over {} keys changed out of band: a re-sync compares them faster than a repair",
                    MAX_REPAIR_KEYS
                ),
            });
        }
        Ok(())
    }

    /// Takes a repair's plan: its writes go out as one batch, in per-key
    /// order with the live stream's txns, less the keys the live stream
    /// sent a txn for while the plan was read (the stream's newer word
    /// decides those).
    pub(super) fn planned(&mut self, plan: Plan) {
        let touched = std::mem::take(&mut self.repair_touched);
        self.repair_reading.clear();
        let (mut keys, mut ops) = (Vec::new(), Vec::new());
        for (key, op) in plan.fixes {
            if !touched.contains(&key) {
                keys.push(key);
                ops.push(op);
            }
        }
        tracing::info!(peer = %self.writer.region, writes = ops.len(), matched = plan.matched, left_to_the_stream = touched.len(), "repairing keys changed out of band");
        if !ops.is_empty() {
            let bytes = ops.iter().map(etcd::Op::encoded_len).sum();
            self.repair_ready = Some(Batch {
                ops,
                keys,
                complete_through: self.inflight.watermark(),
                events: 0,
                received: Instant::now(),
                bytes,
                ahead: 0,
            });
        }
        self.maybe_repaired();
    }

    /// Once no repair waits to be read, sent or acknowledged, the copy is
    /// exact again and the state key says so.
    pub(super) fn maybe_repaired(&mut self) {
        if !self.fresh.is_out_of_band()
            || !self.to_repair.is_empty()
            || !self.repair_reading.is_empty()
            || self.repair_ready.is_some()
            || !self.repair_seqs.is_empty()
        {
            return;
        }
        self.fresh.repaired();
        self.resynced();
    }

    /// Part of the copy's history is unseen: not current until a pass,
    /// started now, has compared every value; `synced=0` is written at
    /// once, so that a successor (which resumes the watch from past what
    /// this one judged) re-syncs instead of trusting the copy.
    pub(super) fn open_gap(&mut self) {
        self.fresh.gap();
        self.unchanged.reset();
        self.verify.run_now(Instant::now());
        self.writer.marks.synced.store(false, Relaxed);
        self.writer.stats.set_synced(false);
        self.heartbeat_dirty = true;
    }

    /// The copy is whole again, unless a gap in the copy watch still waits
    /// for its verification pass: the state key says synced again.
    pub(super) fn resynced(&mut self) {
        if self.fresh.is_out_of_band() || self.fresh.gap_open() {
            return;
        }
        let w = self.writer;
        w.marks.synced.store(true, Relaxed);
        w.stats.set_synced(!self.verify.overdue());
        self.heartbeat_dirty = true;
    }
}
