//! The range-diff sync: make a peer's copy equal to the source at one
//! revision, writing only what differs.
//!
//! The source subtree at revision S is merge-joined with the peer's copy
//! ([`super::diff`]): a key missing on the peer, with another value,
//! or attached to another lease is put (under the current lease); a key the
//! source lacks is deleted. Writes go out as fenced txns, as many in flight
//! as the peer's send pipeline allows ([`super::send`]); they touch
//! disjoint keys, so their order does not matter. Memory holds a few pages
//! per side and the txns in flight (bounded in bytes), whatever the
//! subtree's size.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::count::CountSplits;
use super::diff::{Diff, Merge, Seed};
use super::live::Opened;
use super::live::batch::STATE_RESERVE_BYTES;
use super::live::copy::Carried;
use super::live::source::Newest;
use super::send::own::Own;
use super::send::writer::FencedWriter;
use super::send::{Link, Pipeline};
use crate::error::Result;
use crate::etcd::{self, Delete, Op, Range, TxnBatcher};
use crate::store::Store;

/// A sync made ready to run: the source pinned at a revision, the live
/// watch from the next one open, and the scans of both sides started.
pub(crate) struct Pinned {
    /// The revision S the copy is brought to.
    pub(crate) at: i64,
    /// The live phase's watch, from S + 1.
    pub(crate) live: Opened,
    /// The copy watch, kept up with through the sync (`None`: off, or
    /// lost to a compaction or a closed stream during the sync; the live
    /// phase then opens one with a gap).
    pub(crate) copy: Option<Carried>,
    /// Just before S was read: the copy will hold everything the source
    /// held then (a heartbeat may not claim a later moment).
    started: Instant,
    merge: Merge,
    /// The newest source put the sync read: where the copy's history is
    /// anchored (`live::source`).
    pub(crate) newest: Newest,
    /// The source and its subtree, for the progress log's count.
    local: Store,
    prefix: Bytes,
    /// The engine's sync slot this sync holds until it is dropped.
    _slot: Option<OwnedSemaphorePermit>,
}

/// Waits for one of the engine's sync slots (`slots`), then pins the
/// source at its current revision S, opens the live watch at
/// S + 1 (before the sync, so that it starts among etcd's synced watchers:
/// see `Peer::sync`) and starts the merge's scans at S. A claim that will
/// sync runs this beside its claim txn, so the peer's first page is read
/// alongside the claim instead of a round trip after it. Reading the peer
/// before the claim has committed is safe: the claim found the state key
/// absent, or deleted it, so every txn of an earlier holder fails its
/// fence from then on; a rival that claims first makes this claim fail,
/// and the scans are dropped with it.
///
/// The copy watch opens here too, from `copy.0`, at or below the peer's
/// revision before the scans' first read of it: a change to the copy that
/// a page read before it cannot have seen is the watch's. A claim that
/// read the peer's first page in its own txn passes it as `seed`, and the
/// copy watch from just past that txn.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn pin(
    local: Store,
    peer: Store,
    prefix: Bytes,
    page_size: usize,
    rtt: Option<Duration>,
    slots: Arc<Semaphore>,
    copy: Option<(i64, Own)>,
    seed: Option<Seed>,
) -> Result<Pinned> {
    let slot = match slots.clone().try_acquire_owned() {
        Ok(slot) => Some(slot),
        Err(_) => {
            tracing::info!(
                "waiting for a sync slot: every one of the engine's concurrent syncs is taken"
            );
            // The semaphore is never closed, so this only fails if it were:
            // then the sync runs without a slot rather than not at all.
            slots.acquire_owned().await.ok()
        }
    };
    let copy = match copy {
        Some((from, own)) => Some(Carried::open(&peer, &prefix, from, own)?),
        None => None,
    };
    let started = Instant::now();
    let at = local
        .range(Range::key(prefix.clone()).count_only())
        .await?
        .header
        .revision;
    let live = Opened::now(&local, &prefix, at + 1)?;
    let merge = Merge::start_over(&local, &peer, prefix.clone(), page_size, at, rtt, seed);
    Ok(Pinned {
        at,
        live,
        copy,
        started,
        merge,
        newest: Newest::default(),
        local,
        prefix,
        _slot: slot,
    })
}

/// What etcd 3.4 makes every request to the peer pay after a burst of
/// writes, and how the engine takes it back.
///
/// etcd 3.4 copies its backend's read buffer for every response header and
/// every txn's compares (`bucketBuffer.Copy` under `ConcurrentReadTx`), and
/// the copy takes the buffer's whole length, which is that of the busiest
/// backend commit interval (100 ms) since the buffer was last dropped: a
/// `del --prefix` of a 100k-key copy leaves every later request copying
/// about 5 MB. etcd drops the key bucket's buffer only at a commit that
/// wrote no key. A lease granted and revoked is written to the lease
/// bucket alone, so its commit drops the buffer, unless another key write
/// shares its 100 ms. Measured on etcd 3.4.23: the re-sync after a
/// `del --prefix` of a 100k-key copy ran at 26k keys/s, and at 75k
/// (the first sync's rate) once the buffer was dropped before it; a
/// 10-region mesh at rest spent a quarter less CPU once each etcd's
/// buffer from the sync was dropped (docs/benchmarks-log.md §9, §10).
/// etcd 3.5 copies the buffer once per write instead of per request: the
/// release costs it two lease writes and does no harm.
///
/// The grant and the revoke go a commit interval apart: the grant's
/// commit may carry our own last key write (a claim's, just before a
/// re-sync), the revoke's then carries none of ours.
pub(crate) async fn release_read_buffer(peer: &Store) -> etcd::Result<()> {
    // Long enough to outlive a failed revoke's retries, and nothing is
    // ever attached to it.
    const TTL: Duration = Duration::from_secs(10);
    let lease = peer.lease_grant(TTL).await?;
    tokio::time::sleep(BACKEND_COMMIT_WAIT).await;
    peer.lease_revoke(lease.id).await
}

/// etcd's default backend commit interval (`--backend-batch-interval`),
/// with a margin: a key written sooner after the release's lease writes
/// may share their commit, which then drops nothing.
pub(crate) const BACKEND_COMMIT_WAIT: Duration = Duration::from_millis(150);

/// Syncs the peer to the source as pinned (see `Peer::sync`).
pub(crate) async fn run(
    writer: &FencedWriter,
    link: &mut Link,
    pinned: &mut Pinned,
    splits: &mut CountSplits,
) -> Result<()> {
    let (at, started) = (pinned.at, pinned.started);
    // Every source key goes by in order: the probe's count pieces come out
    // even, however the subtree was written.
    splits.restart();
    let merge = &mut pinned.merge;
    let lease = writer.lease_id();
    let mut pipeline = Pipeline::new(writer, link);
    // Room for the fence compare; the state put goes in a txn of its own.
    let mut packer = TxnBatcher::new(pipeline.limits()).with_reserved(0, STATE_RESERVE_BYTES);
    let (mut puts, mut deletes) = (0u64, 0u64);
    let mut progress = Progress::new(started);
    // The subtree's size, for the progress log's ETA: counted only once a
    // sync has run for a progress interval, so that the many short syncs
    // never pay for a walk of the subtree; beside the sync, never in its way.
    let mut counting = None;
    while let Some(diff) = merge.next().await? {
        if let Diff::Missing(src) | Diff::Both(src, _) = &diff {
            splits.offer(src.key());
            pinned.newest.offer(src);
            if let Some(report) = progress.seen(Instant::now()) {
                if progress.total.is_none() {
                    let handle = counting.get_or_insert_with(|| {
                        let (local, prefix) = (pinned.local.clone(), pinned.prefix.clone());
                        tokio::spawn(async move {
                            let count = Range::prefix(prefix).revision(at).count_only();
                            local.range(count).await.map(|r| r.count.max(0) as u64)
                        })
                    });
                    if handle.is_finished() {
                        // A failed count leaves the ETA out; the sync goes on.
                        progress.total = Some(match counting.take().expect("running").await {
                            Ok(Ok(n)) => n,
                            _ => 0,
                        })
                        .filter(|&n| n > 0);
                    }
                }
                tracing::info!(
                    peer = %writer.region,
                    keys = report.keys,
                    of = progress.total,
                    puts,
                    deletes,
                    keys_per_sec = report.rate as u64,
                    eta = ?progress.eta(&report),
                    "syncing"
                );
            }
        }
        let op = match diff {
            Diff::Missing(src) => {
                puts += 1;
                let (key, value) = src.into_key_value();
                writer.put(key, value)
            }
            Diff::Both(src, dst) if src.value() != dst.value() || dst.lease() != lease => {
                puts += 1;
                let (key, value) = src.into_key_value();
                writer.put(key, value)
            }
            Diff::Both(..) => continue,
            Diff::Extra(dst) => {
                deletes += 1;
                Delete::key(dst.key().clone()).into()
            }
        };
        // Limits found lower mid-sync apply to the very next txn.
        if packer.limits() != pipeline.limits() {
            packer.set_limits(pipeline.limits());
        }
        packer.push(op);
        while let Some(ops) = packer.pop() {
            send(&mut pipeline, ops, &mut pinned.copy, &writer.region).await?;
        }
    }
    packer.flush();
    while let Some(ops) = packer.pop() {
        send(&mut pipeline, ops, &mut pinned.copy, &writer.region).await?;
    }
    while let Some(done) = pipeline.next().await {
        pipeline.settle(done).await?;
        catch_up(&mut pinned.copy, &writer.region);
    }
    // Record completion: from here a successor can resume by watch, and
    // consumers see a complete copy.
    writer.marks.synced.store(true, Relaxed);
    writer.marks.mark_current(started);
    writer.write(Vec::new(), Some(at)).await?;
    // Its Unix time by the engine's clock now, never ahead of it.
    let started_ms = writer.marks.clock.unix_ms() - started.elapsed().as_millis() as i64;
    writer.stats.mark_current(started, started_ms);
    writer.stats.sync_puts.fetch_add(puts, Relaxed);
    writer.stats.sync_deletes.fetch_add(deletes, Relaxed);
    if let Some(handle) = counting {
        handle.abort();
    }
    let took = started.elapsed();
    tracing::info!(
        peer = %writer.region,
        revision = at,
        keys = progress.keys,
        puts,
        deletes,
        took = ?took,
        keys_per_sec = (progress.keys as f64 / took.as_secs_f64().max(1e-3)) as u64,
        "sync complete"
    );
    Ok(())
}

/// How often a running sync logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// A sync's progress in source keys, for its log lines: an operator
/// watching a million-key sync sees it move, at what rate, and when it
/// should end.
#[derive(Debug)]
struct Progress {
    started: Instant,
    next: Instant,
    /// Source keys compared so far.
    keys: u64,
    /// The source keys at the pinned revision, once counted.
    total: Option<u64>,
}

/// One progress line's figures.
#[derive(Debug, PartialEq)]
struct Report {
    keys: u64,
    /// Keys per second since the sync started.
    rate: f64,
}

impl Progress {
    fn new(started: Instant) -> Self {
        Progress {
            started,
            next: started + PROGRESS_EVERY,
            keys: 0,
            total: None,
        }
    }

    /// One more source key, compared at `now`: a report when a progress
    /// interval has passed since the last one. `now` is read every key, a
    /// few tens of nanoseconds against microseconds of work per key.
    fn seen(&mut self, now: Instant) -> Option<Report> {
        self.keys += 1;
        if now < self.next {
            return None;
        }
        self.next = now + PROGRESS_EVERY;
        let elapsed = now.duration_since(self.started).as_secs_f64();
        Some(Report {
            keys: self.keys,
            rate: self.keys as f64 / elapsed.max(1e-3),
        })
    }

    /// The time left at `report`'s rate, once the total is known.
    fn eta(&self, report: &Report) -> Option<Duration> {
        let left = self.total?.saturating_sub(report.keys);
        (report.rate > 0.0).then(|| Duration::from_secs_f64(left as f64 / report.rate))
    }
}

/// Sends one txn of `ops` once the window has room. The txns of a sync
/// touch disjoint keys, so they may commit in any order. The copy watch
/// is caught up with as txns are answered: its events are mostly theirs.
async fn send(
    pipeline: &mut Pipeline<'_, ()>,
    ops: Vec<Op>,
    copy: &mut Option<Carried>,
    peer: &str,
) -> Result<()> {
    let bytes: usize = ops.iter().map(Op::encoded_len).sum();
    while !pipeline.has_room(bytes) {
        if let Some(done) = pipeline.next().await {
            pipeline.settle(done).await?;
            catch_up(copy, peer);
        }
    }
    pipeline.send(ops, None, ());
    // Put it on the wire now, rather than when the window is full (about
    // 0.2 s for 64 txns at the start of a sync, which also inflated the
    // measured round trip); txns already answered are booked here too.
    while let Some(done) = pipeline.ready() {
        pipeline.settle(done).await?;
    }
    catch_up(copy, peer);
    Ok(())
}

/// Catches the copy watch up (`Carried::catch_up`). A watch that ended
/// (the peer compacted past it, or its stream closed) is dropped: the
/// sync goes on, and the live phase opens a new one with a gap.
fn catch_up(copy: &mut Option<Carried>, peer: &str) {
    if let Some(Err(e)) = copy.as_mut().map(Carried::catch_up) {
        tracing::info!(peer, error = %e, "the copy watch ended during the sync; the live phase re-arms it and verifies the copy");
        *copy = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_reports_every_interval_with_rate_and_eta() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        // Nothing before the first interval, however many keys.
        for _ in 0..999 {
            assert_eq!(p.seen(t0 + Duration::from_secs(1)), None);
        }
        let report = p.seen(t0 + PROGRESS_EVERY).expect("a report at 5 s");
        assert_eq!(report.keys, 1_000);
        assert_eq!(report.rate, 200.0);
        // No total counted yet: no ETA.
        assert_eq!(p.eta(&report), None);
        p.total = Some(3_000);
        assert_eq!(p.eta(&report), Some(Duration::from_secs(10)));
        // The next report comes one interval after the last, not before.
        assert_eq!(p.seen(t0 + PROGRESS_EVERY + Duration::from_secs(4)), None);
        let report = p.seen(t0 + 2 * PROGRESS_EVERY).expect("a report at 10 s");
        assert_eq!(report.keys, 1_002);
        // A total below the keys seen (the count failed, or read another
        // member) is no negative time.
        p.total = Some(10);
        assert_eq!(p.eta(&report), Some(Duration::ZERO));
    }
}
