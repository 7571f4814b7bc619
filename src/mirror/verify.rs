//! The verification pass (anti-entropy): compare a peer's copy with the
//! source at a pinned revision and repair what differs.
//!
//! Identity checks catch a store that was wiped or restored while the
//! engine watched; this pass catches what they cannot: a restore whose
//! revision had climbed past the old one before the engine looked, a manual
//! edit on the peer, a bug. It merge-joins the source at revision `S` (the
//! live stream's watermark: everything through `S` is applied on the peer)
//! with the peer's copy as it is now, and for each difference:
//!
//! - skips a key the source changed after `S`: the live stream owns it, and
//!   a later pass sees it settled;
//! - otherwise writes the source's value (or deletes the key) through the
//!   fenced writer, guarded on the peer key's mod revision as read, so that
//!   a live write landing in between wins.
//!
//! It reads at most `verify_rate` keys per second, so it never starves the
//! peer's own writers, and counts its runs and repairs.
//!
//! A value too large for the peer is skipped, as the live stream does: the
//! key is (or is made) absent there and counted as `too_large` once.
//!
//! **The schedule belongs to the peer** ([`VerifySchedule`]), not to a
//! session: a session that ends more often than the interval (a flapping
//! link, a load balancer's idle timeout) still gets its pass, started at
//! the next session's first chance. A pass that can't finish is counted
//! (`verify_skipped_total{reason}`), retried soon, and after
//! [`MAX_SKIPS`] in a row the copy is reported not synced until a pass
//! completes: a copy nobody has been able to check is not vouched for.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;

use super::config::MirrorConfig;
use super::count::{CountSplits, Positions};
use super::diff::{Diff, Merge};
use super::send::writer::FencedWriter;
use super::stats::{ErrorKind, PeerStats, VerifySkip};
use crate::error::Result;
use crate::etcd::{self, Delete, KeyValue, Range};
use crate::store::Store;

/// Passes in a row that could not finish before the copy is reported not
/// synced.
pub(crate) const MAX_SKIPS: u32 = 3;

/// When the next pass is due, and how many in a row could not finish.
#[derive(Debug)]
pub(crate) struct VerifySchedule {
    every: Option<Duration>,
    next: Instant,
    skips: u32,
}

impl VerifySchedule {
    /// The first pass is due at once: an engine that adopts a copy can't
    /// know when it was last verified (its predecessor's schedule died with
    /// it, and leaders that change faster than the interval would never
    /// verify). A completed sync counts as a pass ([`VerifySchedule::done`]).
    pub(crate) fn new(every: Option<Duration>, now: Instant) -> VerifySchedule {
        VerifySchedule {
            every,
            next: now,
            skips: 0,
        }
    }

    /// When the next pass is due; `None` when verification is off.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.every.map(|_| self.next)
    }

    /// Brings the next pass forward to `now` (a copy watch that missed
    /// part of the copy's history needs one to vouch for the copy again).
    pub(crate) fn run_now(&mut self, now: Instant) {
        self.next = self.next.min(now);
    }

    /// Whether passes run at all.
    pub(crate) fn is_on(&self) -> bool {
        self.every.is_some()
    }

    /// Several passes in a row could not finish.
    pub(crate) fn overdue(&self) -> bool {
        self.skips >= MAX_SKIPS
    }

    /// A pass finished at `now`: the next is due one interval later.
    pub(crate) fn done(&mut self, now: Instant, stats: &PeerStats) {
        self.skips = 0;
        self.next = now + self.every.unwrap_or_default();
        stats.verify_overdue.store(false, Relaxed);
    }

    /// A pass could not finish at `now`: it is counted, and tried again
    /// after `retry` (at most an interval).
    pub(crate) fn skipped(
        &mut self,
        now: Instant,
        reason: VerifySkip,
        retry: Duration,
        stats: &PeerStats,
    ) {
        self.skips = self.skips.saturating_add(1);
        self.next = now + retry.min(self.every.unwrap_or_default());
        stats.verify_skip(reason);
        if self.overdue() {
            stats.verify_overdue.store(true, Relaxed);
        }
    }
}

/// Scheduled passes in a row that [`Unchanged`] may skip: at least every
/// 24th runs whatever the watches said (daily at the default hourly
/// interval), so a watch that lost an event without a trace is still
/// caught, if a day late.
pub(crate) const MAX_UNCHANGED: u32 = 23;

/// Whether a scheduled pass would compare anything its predecessor did not.
///
/// A pass reads the whole subtree on both etcds: about 2 CPU-seconds of
/// the two etcds' for 100k keys (`GOGC=25`), so ten regions at rest spent
/// more on their hourly passes than on everything else together
/// (docs/benchmarks-log.md §10). Yet at rest it compares what it compared
/// an interval ago: the source's subtree watch delivered nothing (its
/// events carry every change since the revision it resumed from), and
/// neither did the copy watch (every change on the copy, ours included).
/// So once a pass of this session found the copy exact with everything
/// delivered applied, a later scheduled pass is skipped (counted in
/// `verify_unchanged_total`) while both watches' positions stand where
/// they stood when that pass began. A pass brought forward for a gap in
/// the copy watch's history is never skipped ([`Unchanged::reset`]), nor
/// more than [`MAX_UNCHANGED`] in a row. A session starts with none: it
/// knows nothing of what its predecessor compared.
#[derive(Debug, Default)]
pub(crate) struct Unchanged {
    /// Where both watches stood when the running pass began.
    began: Option<Positions>,
    /// Where they stood when the last pass that found the copy exact
    /// began, and the scheduled passes skipped since.
    exact: Option<(Positions, u32)>,
}

impl Unchanged {
    /// A pass begins, the watches `at` (`None`: the copy is not watched,
    /// and no pass can be skipped).
    pub(crate) fn began(&mut self, at: Option<Positions>) {
        self.began = at;
    }

    /// The running pass ended: `report` if it completed. It vouches for
    /// the copy only if it repaired nothing, left nothing to the live
    /// stream, and compared against a revision covering every event the
    /// watch had delivered when it began.
    pub(crate) fn ended(&mut self, report: Option<&Report>) {
        let began = self.began.take();
        self.exact = match (began, report) {
            (Some(at), Some(r)) if r.repaired == 0 && r.skipped == 0 && r.pinned >= at.0 => {
                Some((at, 0))
            }
            _ => None,
        };
    }

    /// A scheduled pass is due with the watches `at`:
    /// whether it would compare what the last exact pass compared (then it
    /// is booked as skipped and `true` returned).
    pub(crate) fn skip(&mut self, at: Option<Positions>) -> bool {
        match (&mut self.exact, at) {
            (Some((exact, skipped)), Some(at)) if *exact == at && *skipped < MAX_UNCHANGED => {
                *skipped += 1;
                true
            }
            _ => false,
        }
    }

    /// The copy watch's history has a gap (re-armed past a compaction):
    /// what it did not deliver may have changed the copy.
    pub(crate) fn reset(&mut self) {
        self.began = None;
        self.exact = None;
    }
}

/// What one pass found.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// Keys compared.
    pub compared: u64,
    /// Keys written or deleted on the peer.
    pub repaired: u64,
    /// Differences left to the live stream (changed at the source since
    /// the pinned revision, or written on the peer meanwhile).
    pub skipped: u64,
    /// Count pieces learnt from the source's keys, all of them in order,
    /// as a sync learns them: a copy adopted without a sync is counted in
    /// even pieces from the first pass on.
    pub splits: CountSplits,
    /// The source's keys in each of those pieces at the pinned revision:
    /// the next count of a source at rest needs no walk of its own
    /// (`count::SourceCount`).
    pub source_pieces: Vec<i64>,
    /// The source revision the pass compared against.
    pub pinned: i64,
}

/// Keys between two pauses of the pacing.
const PACE_STEP: u64 = 100;
/// Keys per page: small, so the pass holds little memory and the source's
/// pinned revision is read in short requests.
const PAGE: usize = 1_000;

/// One pass over the peer's copy against the source at `pinned`.
pub(crate) async fn pass(
    writer: &FencedWriter,
    local: &Store,
    prefix: Bytes,
    cfg: &MirrorConfig,
    pinned: i64,
) -> Result<Report> {
    let mut merge = Merge::start_at(
        local,
        &writer.client,
        prefix,
        cfg.page_size.min(PAGE),
        pinned,
    );
    let lease = writer.lease_id();
    let pause = Duration::from_secs_f64(PACE_STEP as f64 / f64::from(cfg.verify_rate.max(1)));
    let mut report = Report {
        source_pieces: vec![0],
        pinned,
        ..Report::default()
    };
    while let Some(diff) = merge.next().await? {
        report.compared += 1;
        if let Diff::Missing(src) | Diff::Both(src, _) = &diff {
            if report.splits.offer(src.key()) {
                report.source_pieces.push(0);
            }
            *report.source_pieces.last_mut().expect("one piece at least") += 1;
        }
        if report.compared.is_multiple_of(PACE_STEP) {
            tokio::time::sleep(pause).await;
        }
        let (peer_kv, want) = match diff {
            Diff::Missing(src) => (None, Some(src)),
            Diff::Extra(dst) => (Some(dst), None),
            Diff::Both(src, dst) if src.value() != dst.value() || dst.lease() != lease => {
                (Some(dst), Some(src))
            }
            Diff::Both(..) => continue,
        };
        let key = want
            .as_ref()
            .or(peer_kv.as_ref())
            .map(|kv| kv.key().clone())
            .unwrap_or_default();
        if !settled(local, &key, want.as_ref()).await? {
            report.skipped += 1;
            continue;
        }
        if peer_kv.is_none() && writer.is_oversized(&key) {
            // Too large for the peer, found so before: absent by design.
            report.skipped += 1;
            continue;
        }
        let (guard, op) = writer.fix(&key, want, peer_kv.as_ref());
        let sent = writer
            .own
            .send(
                &writer.client,
                writer.txn(vec![op], None).when([guard.clone()]),
            )
            .await;
        let resp = match sent {
            Err(etcd::Error::RequestTooLarge) => {
                // The value can't be held by the peer: as the live stream
                // does, the key is deleted there (if present) rather than
                // left at another value, counted once, and the pass goes
                // on.
                writer.stats.error(ErrorKind::TooLarge);
                writer.mark_oversized(key.clone());
                tracing::error!(peer = %writer.region, key = %String::from_utf8_lossy(&key), "value exceeds the peer's request size limit; absent on the peer");
                if peer_kv.is_none() {
                    report.skipped += 1;
                    continue;
                }
                let del = writer
                    .txn(vec![Delete::key(key.clone()).into()], None)
                    .when([guard]);
                writer
                    .own
                    .send(&writer.client, del)
                    .await
                    .map_err(|e| writer.txn_error(e))?
            }
            other => other.map_err(|e| writer.txn_error(e))?,
        };
        if resp.succeeded {
            report.repaired += 1;
            tracing::warn!(
                peer = %writer.region,
                key = %String::from_utf8_lossy(&key),
                "verification repaired a key that differed from the source"
            );
        } else if writer.fence_holds(&resp) {
            // The live stream wrote the key meanwhile: it wins.
            report.skipped += 1;
        } else {
            return Err(writer.fence_failure(&resp));
        }
    }
    writer.stats.verify_runs.fetch_add(1, Relaxed);
    writer
        .stats
        .verify_repairs
        .fetch_add(report.repaired, Relaxed);
    tracing::info!(peer = %writer.region, pinned, compared = report.compared, repaired = report.repaired, skipped = report.skipped, "verification pass done");
    Ok(report)
}

/// Whether the source's `key` is now as it was at the pinned revision
/// (`at_pin`, `None`: absent), so the peer must equal it.
async fn settled(local: &Store, key: &Bytes, at_pin: Option<&KeyValue>) -> Result<bool> {
    let now = local.range(Range::key(key.clone())).await?;
    Ok(match (at_pin, now.kvs().first()) {
        (Some(pin), Some(cur)) => cur.mod_revision() == pin.mod_revision(),
        (None, None) => true,
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(pinned: i64) -> Report {
        Report {
            pinned,
            ..Report::default()
        }
    }

    #[test]
    fn a_pass_is_skipped_only_while_neither_watch_moved_since_an_exact_one() {
        let mut u = Unchanged::default();
        assert!(!u.skip(Some((10, 5))), "no pass of this session yet");
        u.began(Some((10, 5)));
        u.ended(Some(&exact(12)));
        assert!(u.skip(Some((10, 5))));
        assert!(u.skip(Some((10, 5))), "and again");
        assert!(!u.skip(Some((11, 5))), "the source changed");
        assert!(!u.skip(Some((10, 6))), "the copy changed");
        assert!(!u.skip(None), "the copy is not watched");
        u.reset();
        assert!(!u.skip(Some((10, 5))), "a gap in the copy watch");
    }

    #[test]
    fn only_a_pass_that_found_everything_exact_vouches() {
        let cases = [
            (
                "repaired a key",
                Report {
                    repaired: 1,
                    ..exact(12)
                },
            ),
            (
                "left a key to the live stream",
                Report {
                    skipped: 1,
                    ..exact(12)
                },
            ),
            ("pinned below an event delivered", exact(9)),
        ];
        for (what, report) in cases {
            let mut u = Unchanged::default();
            u.began(Some((10, 5)));
            u.ended(Some(&report));
            assert!(!u.skip(Some((10, 5))), "a pass that {what}");
        }
        let mut u = Unchanged::default();
        u.began(Some((10, 5)));
        u.ended(None);
        assert!(!u.skip(Some((10, 5))), "a pass that did not finish");
        u.began(None);
        u.ended(Some(&exact(12)));
        assert!(!u.skip(Some((10, 5))), "a pass with the copy unwatched");
    }

    #[test]
    fn every_so_often_a_pass_runs_whatever_the_watches_say() {
        let mut u = Unchanged::default();
        u.began(Some((10, 5)));
        u.ended(Some(&exact(10)));
        let skipped = (0..100).take_while(|_| u.skip(Some((10, 5)))).count();
        assert_eq!(skipped, MAX_UNCHANGED as usize);
        u.began(Some((10, 5)));
        u.ended(Some(&exact(10)));
        assert!(
            u.skip(Some((10, 5))),
            "the pass that ran starts the count again"
        );
    }
}
