//! Counting the copy in pieces, so a count never stalls a store's writes.
//!
//! The freshness probe compares the copy's key count on the peer with the
//! source's ([`super::live`]). etcd counts a range by walking its key index
//! under the index's read lock, and every write waits for that lock: one
//! `count_only` over a subtree of 200k keys held both stores' writes for
//! 150–230 ms on a 2-core VM, once per heartbeat, and the mirror stalled
//! with them (the saturated live stall, docs/benchmarks-log.md §7). The walk is per range
//! request, and etcd releases the lock between the ranges of one txn, so
//! the same count split into ranges of a few thousand keys, sent a few to a
//! txn and all at one revision, lets writes in between every piece.
//!
//! The pieces' boundaries are keys the engine has seen: a sync walks the
//! whole subtree in key order and starts them afresh, every
//! [`PIECE_KEYS`]-th source key becoming one, so a base-synced copy is
//! counted in even pieces from its first probe; after that every
//! [`PIECE_KEYS`]-th key the live stream mirrors becomes one too, so a
//! growing subtree is split where it grows. Adjacent pieces that turn out
//! small (rewrites of a few hot keys, deletes) are merged after each count,
//! and the number of boundaries is capped, so the set tracks the subtree's
//! size, not its write count. A verification pass walks the subtree too,
//! and its pieces replace the set when it ends; a copy resumed without a
//! sync is counted in one piece until then (a new leader verifies at once)
//! or until its live stream has mirrored [`PIECE_KEYS`] keys.
//!
//! How often: at the start of every session, then as a backstop to the
//! copy watch (`live/copy.rs`), which sees every change to the copy as it
//! happens: no more often than every
//! [`crate::mirror::MirrorConfig::recount_interval`] (10 minutes), and at
//! once when the copy watch had to be re-armed after a gap. A count due
//! while neither watch has delivered anything since the last one matched
//! is skipped, at most [`MAX_UNCHANGED_COUNTS`] in a row ([`Cadence`]).
//! Without the copy watch the count is the first line: every heartbeat
//! while the subtree holds up to [`KEYS_PER_HEARTBEAT`] keys, and every
//! `keys / KEYS_PER_HEARTBEAT` heartbeats above that
//! ([`heartbeats_between_counts`]). Pieces bound how long one count holds
//! the writes, not what counting costs: each count walks the whole
//! subtree on the peer, and on the source unless the subtree's watch
//! delivered nothing since the session's last count there
//! ([`SourceCount`]). Ten regions at 100k keys each, every copy synced and
//! nothing written, kept the ten etcds busy for 1.53 CPU-seconds a second
//! counting every heartbeat, 0.34–0.37 counting every fifth
//! (docs/benchmarks-log.md §4), which is why the copy watch, not the
//! count, is what keeps a copy honest.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::state::Stored;
use crate::etcd::{self, Header, Op, OpResponse, Range, Txn, prefix_end};
use crate::store::Store;

/// About how many keys one count request should walk: a few ms of etcd's
/// index walk, short enough that the writes waiting behind it don't show.
pub(crate) const PIECE_KEYS: u64 = 4096;

/// Keys the probe counts per heartbeat on each store, on average: above
/// this it counts every `keys / KEYS_PER_HEARTBEAT` heartbeats (see the
/// module doc).
pub(crate) const KEYS_PER_HEARTBEAT: u64 = 20_000;

/// How many heartbeats apart the probe counts a subtree of `keys` keys: one
/// up to [`KEYS_PER_HEARTBEAT`], proportionally more above.
fn heartbeats_between_counts(keys: i64) -> u64 {
    (keys.max(0) as u64 / KEYS_PER_HEARTBEAT).max(1)
}

/// Backstop counts in a row a cadence may skip while neither watch has
/// delivered anything since the last count matched: at least every 6th
/// runs (hourly at the default ten-minute spacing), so a watch that lost
/// a put or a delete without a trace is still found.
pub(crate) const MAX_UNCHANGED_COUNTS: u32 = 5;

/// Where a session's two watches stood: the newest revision the source's
/// subtree watch delivered an event at, and the last revision the copy
/// watch delivered.
pub(crate) type Positions = (i64, i64);

/// Which of a session's probes count the copy: every one until a count
/// has matched, then one every [`heartbeats_between_counts`] for the
/// subtree's size at that count, and no more often than every `min_gap`
/// heartbeats (the backstop spacing while the copy watch follows the copy;
/// 1 without it).
///
/// A count that falls due while both watches stand where they stood when
/// the last matched count was sent is skipped, as if it had matched again:
/// the source's subtree and the copy are as that count found them, since
/// every change to either comes through its watch. Only a watch that lost
/// an event could make it differ, so at most [`MAX_UNCHANGED_COUNTS`] are
/// skipped in a row. Ten regions of 100k keys at rest spent about a tenth
/// of their etcds' CPU on the ten-minute counts (docs/benchmarks-log.md
/// §10).
#[derive(Debug)]
pub(crate) struct Cadence {
    /// The source's key count at the session's last count, which matched.
    matched_keys: Option<i64>,
    /// Where the watches stood when that count's probe was sent (`None`:
    /// the copy is not watched, and no count is skipped).
    matched_at: Option<Positions>,
    /// Probes since then.
    since: u64,
    min_gap: u64,
    /// Counts skipped in a row since, neither watch having moved.
    unchanged: u32,
}

impl Default for Cadence {
    fn default() -> Self {
        Cadence::new(1)
    }
}

impl Cadence {
    /// A cadence counting no more often than every `min_gap` heartbeats
    /// once a count matched.
    pub(crate) fn new(min_gap: u64) -> Cadence {
        Cadence {
            matched_keys: None,
            matched_at: None,
            since: 0,
            min_gap: min_gap.max(1),
            unchanged: 0,
        }
    }

    fn spacing(&self, keys: i64) -> u64 {
        heartbeats_between_counts(keys).max(self.min_gap)
    }

    /// Whether the next probe, sent with the watches `at`, counts.
    pub(crate) fn due(&self, at: Option<Positions>) -> bool {
        let Some(keys) = self.matched_keys else {
            return true;
        };
        let unchanged =
            at.is_some() && at == self.matched_at && self.unchanged < MAX_UNCHANGED_COUNTS;
        self.since + 1 >= self.spacing(keys) && !unchanged
    }

    /// A count matched, the source holding `keys` keys; its probe was sent
    /// with the watches `at`.
    pub(crate) fn matched(&mut self, keys: i64, at: Option<Positions>) {
        self.matched_keys = Some(keys);
        self.matched_at = at;
        self.since = 0;
        self.unchanged = 0;
    }

    /// A probe that did not count: whether it stands on the session's last
    /// count, which matched (a mismatch would have ended the session). One
    /// that was due by the spacing was skipped as unchanged, and the
    /// spacing starts again from it.
    pub(crate) fn skipped(&mut self) -> bool {
        self.since += 1;
        let Some(keys) = self.matched_keys else {
            return false;
        };
        if self.since >= self.spacing(keys) {
            self.since = 0;
            self.unchanged += 1;
        }
        true
    }

    /// The next probe counts, whatever the spacing (the copy watch had to
    /// be re-armed: what it missed, only a count can see).
    pub(crate) fn recount(&mut self) {
        self.matched_keys = None;
    }
}

/// Boundaries kept at most: pieces grow past [`PIECE_KEYS`] only beyond
/// about this many times that many keys (33M), so the probe's requests stay
/// bounded too.
const MAX_BOUNDS: usize = 8192;

/// Where a subtree's count is split (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct CountSplits {
    bounds: BTreeSet<Bytes>,
    offered: u64,
}

impl CountSplits {
    /// A key the engine is about to write to the peer: every
    /// [`PIECE_KEYS`]-th becomes a boundary.
    ///
    /// A boundary is a copy: the key offered is a slice of the response it
    /// was decoded from (a page of up to 10,000 keys, a watch response), and
    /// a boundary kept for the life of the copy would keep that whole
    /// buffer alive with it.
    /// Returns whether it did: it then starts a piece.
    pub(crate) fn offer(&mut self, key: &Bytes) -> bool {
        self.offered += 1;
        self.offered.is_multiple_of(PIECE_KEYS)
            && self.bounds.len() < MAX_BOUNDS
            && self.bounds.insert(Bytes::copy_from_slice(key))
    }

    /// Starts over: a sync is about to offer every key of the subtree,
    /// in order.
    pub(crate) fn restart(&mut self) {
        self.bounds.clear();
        self.offered = 0;
    }

    /// The boundaries now, for one count.
    pub(crate) fn snapshot(&self) -> Vec<Bytes> {
        self.bounds.iter().cloned().collect()
    }

    /// Merges pieces that a count found small: the boundary between two
    /// adjacent pieces goes when together they hold under half a piece.
    /// `bounds` is the snapshot the count used, `counts` its pieces'.
    pub(crate) fn counted(&mut self, bounds: &[Bytes], counts: &[i64]) {
        if counts.len() != bounds.len() + 1 {
            return;
        }
        let mut run = counts[0];
        for (b, &c) in bounds.iter().zip(&counts[1..]) {
            if run + c < (PIECE_KEYS / 2) as i64 {
                self.bounds.remove(b);
                run += c;
            } else {
                run = c;
            }
        }
    }

    /// How many boundaries are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.bounds.len()
    }
}

/// The source's count as a probe last read it, in pieces: the subtree's
/// count at any later revision through which its watch delivered no event
/// is the same, so a backstop count of a copy at rest reads only the peer.
/// In the ten-region mesh at rest a round of backstop counts was the
/// largest cost after the heartbeats, and half of it was the sources
/// answering what they had answered ten minutes before.
#[derive(Debug)]
pub(crate) struct SourceCount {
    /// The revision it was counted at.
    at: i64,
    bounds: Vec<Bytes>,
    pieces: Vec<i64>,
}

impl SourceCount {
    /// The count at `at`, in pieces split at `bounds`.
    pub(crate) fn new(at: i64, bounds: Vec<Bytes>, pieces: Vec<i64>) -> Option<SourceCount> {
        (pieces.len() == bounds.len() + 1).then_some(SourceCount { at, bounds, pieces })
    }

    /// The count at `revision` in pieces split at `bounds`, if this one
    /// stands for it: `last_change` (the newest revision the subtree's
    /// watch delivered an event at, every event up to `revision` having
    /// been delivered) is not after the revision counted at, and `bounds`
    /// are these or fewer ([`CountSplits::counted`] merges small pieces:
    /// their counts add up).
    pub(crate) fn reuse(
        &self,
        bounds: &[Bytes],
        revision: i64,
        last_change: i64,
    ) -> Option<Vec<i64>> {
        if last_change > self.at || revision < self.at {
            return None;
        }
        let mut out = Vec::with_capacity(bounds.len() + 1);
        let mut wanted = bounds.iter().peekable();
        let mut run = self.pieces[0];
        for (bound, &n) in self.bounds.iter().zip(&self.pieces[1..]) {
            if wanted.peek() == Some(&bound) {
                wanted.next();
                out.push(run);
                run = n;
            } else {
                run += n;
            }
        }
        out.push(run);
        // A boundary this count was not split at: its pieces can't be told.
        wanted.next().is_none().then_some(out)
    }
}

/// The `[from, to)` of each piece of `prefix` split at `bounds` (sorted,
/// each inside the prefix), in key order.
fn piece_ranges(prefix: &Bytes, bounds: &[Bytes]) -> Vec<(Bytes, Bytes)> {
    let starts = std::iter::once(prefix.clone()).chain(bounds.iter().cloned());
    let ends = bounds
        .iter()
        .cloned()
        .chain(std::iter::once(prefix_end(prefix)));
    starts.zip(ends).collect()
}

/// The count ranges of [`piece_ranges`], at `revision` (0: the txn's own).
fn pieces(prefix: &Bytes, bounds: &[Bytes], revision: i64) -> Vec<Op> {
    piece_ranges(prefix, bounds)
        .into_iter()
        .map(|(from, to)| {
            let r = Range::between(from, to).count_only();
            Op::Range(if revision > 0 {
                r.revision(revision)
            } else {
                r
            })
        })
        .collect()
}

/// Count ranges sent in one txn at most: a few pieces' walk (~30k keys),
/// then a round trip's pause. On a store short of CPU (two cores shared
/// with its writers) one txn of all the pieces still took the CPU for the
/// whole walk at once: the slowest concurrent put fell only from 69 to 51
/// ms (median, 200k keys, `count_stall` bench); spread over txns the
/// writes get the CPU in between.
const PIECES_PER_TXN: usize = 8;

/// The ops of one txn: at most `max_ops` and [`PIECES_PER_TXN`], and at
/// least two (the peer's state key and one piece).
fn per_txn(max_ops: usize) -> usize {
    max_ops.clamp(2, PIECES_PER_TXN)
}

/// The range counts of `resp`'s results from the `skip`-th on.
fn counts(resp: &etcd::TxnResponse, skip: usize) -> impl Iterator<Item = i64> + '_ {
    resp.responses.iter().skip(skip).map(|r| match r {
        OpResponse::Range(r) => r.count,
        _ => 0,
    })
}

/// Counts `prefix` on `client` at `revision`, split at `bounds`, in txns of
/// at most `max_ops` ranges: each piece's count, in key order.
pub(crate) async fn count_at(
    client: &Store,
    prefix: &Bytes,
    bounds: &[Bytes],
    revision: i64,
    max_ops: usize,
) -> etcd::Result<Vec<i64>> {
    let mut out = Vec::with_capacity(bounds.len() + 1);
    let ops = pieces(prefix, bounds, revision);
    for chunk in ops.chunks(per_txn(max_ops)) {
        let resp = client.txn(Txn::new().and_then(chunk.to_vec())).await?;
        out.extend(counts(&resp, 0));
    }
    Ok(out)
}

/// The peer's state key `key`, for a probe that does not count.
pub(crate) async fn read_state(peer: &Store, key: &Bytes) -> etcd::Result<(Stored, Header)> {
    let resp = peer.range(Range::key(key.clone())).await?;
    Ok((Stored::from_kv(resp.kvs().first()), resp.header))
}

/// The peer's state key `key` and its copy's key count under `prefix`,
/// both at one revision: the state key and the first pieces in one txn,
/// the rest pinned at that txn's revision. Also each piece's count.
pub(crate) async fn read_state_with_count(
    peer: &Store,
    key: &Bytes,
    prefix: &Bytes,
    bounds: &[Bytes],
    max_ops: usize,
) -> etcd::Result<(Stored, Header, i64, Vec<i64>)> {
    let per = per_txn(max_ops);
    let first = pieces(prefix, bounds, 0);
    let head = first.len().min(per - 1);
    let txn = Txn::new()
        .and_then([Op::from(Range::key(key.clone()))])
        .and_then(first[..head].to_vec());
    let resp = peer.txn(txn).await?;
    let stored = match resp.responses.first() {
        Some(OpResponse::Range(r)) => Stored::from_kv(r.kvs().first()),
        _ => Stored::from_kv(None),
    };
    let mut each: Vec<i64> = counts(&resp, 1).collect();
    if head < first.len() {
        // The rest at the first txn's revision, so the pieces add up to
        // one count. A compaction of the peer past it within the probe's
        // few round trips fails the probe like any read error would.
        let rest = count_at(peer, prefix, bounds, resp.header.revision, max_ops).await?;
        each.extend(rest.into_iter().skip(head));
    }
    Ok((stored, resp.header, each.iter().sum(), each))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> Bytes {
        Bytes::from(format!("/p/{i:08}"))
    }

    #[test]
    fn a_subtree_is_counted_every_heartbeat_up_to_the_budget_and_proportionally_less_above() {
        assert_eq!(heartbeats_between_counts(-1), 1);
        assert_eq!(heartbeats_between_counts(0), 1);
        assert_eq!(heartbeats_between_counts(KEYS_PER_HEARTBEAT as i64 - 1), 1);
        assert_eq!(
            heartbeats_between_counts(2 * KEYS_PER_HEARTBEAT as i64 - 1),
            1
        );
        assert_eq!(heartbeats_between_counts(2 * KEYS_PER_HEARTBEAT as i64), 2);
        assert_eq!(heartbeats_between_counts(100_000), 5);
        assert_eq!(heartbeats_between_counts(1_000_000), 50);
    }

    #[test]
    fn a_session_counts_until_a_count_matches_then_every_few_probes() {
        let mut c = Cadence::default();
        assert!(c.due(None), "a session's first probe counts");
        c.matched(100_000, None);
        let due: Vec<bool> = (0..10)
            .map(|_| {
                let due = c.due(None);
                if due {
                    c.matched(100_000, None);
                } else {
                    assert!(c.skipped(), "a skipped probe stands on the match");
                }
                due
            })
            .collect();
        assert_eq!(due.iter().filter(|d| **d).count(), 2, "{due:?}");
        assert!(!Cadence::default().skipped(), "no match yet to stand on");
    }

    #[test]
    fn a_due_count_is_skipped_while_neither_watch_moved_up_to_a_limit() {
        // Every third probe is due.
        let mut c = Cadence::new(3);
        let rest = Some((10, 20));
        c.matched(100, rest);
        let mut counted = Vec::new();
        for probe in 1..=40 {
            if c.due(rest) {
                counted.push(probe);
                c.matched(100, rest);
            } else {
                assert!(c.skipped());
            }
        }
        let every = 3 * (MAX_UNCHANGED_COUNTS as usize + 1);
        assert_eq!(counted, vec![every, 2 * every], "the probes that counted");
        // A watch that moved has the next due probe count.
        let mut c = Cadence::new(3);
        c.matched(100, rest);
        assert!(!c.due(Some((11, 20))) && c.skipped());
        assert!(!c.due(Some((11, 20))) && c.skipped());
        assert!(c.due(Some((11, 20))), "the source changed");
        assert!(c.due(Some((10, 21))), "the copy changed");
        assert!(c.due(None), "the copy is not watched");
        assert!(!c.due(rest), "nothing changed");
    }

    #[test]
    fn a_boundary_does_not_keep_the_page_it_came_from() {
        // A page as the client decodes it: every key a slice of one buffer.
        let page = Bytes::from(
            (0..PIECE_KEYS as u32)
                .map(|i| format!("/p/{i:08}"))
                .collect::<String>(),
        );
        let width = page.len() / PIECE_KEYS as usize;
        let mut s = CountSplits::default();
        for i in 0..PIECE_KEYS as usize {
            s.offer(&page.slice(i * width..(i + 1) * width));
        }
        let b = s.snapshot();
        assert_eq!(b, vec![Bytes::from(format!("/p/{:08}", PIECE_KEYS - 1))]);
        let inside = page.as_ptr_range();
        assert!(
            !inside.contains(&b[0].as_ptr()),
            "the boundary is a slice of the page, so the page's buffer lives as long as the boundary"
        );
    }

    #[test]
    fn every_piece_keys_th_offered_key_becomes_a_boundary() {
        let mut s = CountSplits::default();
        for i in 0..(PIECE_KEYS as u32 * 3 + 5) {
            s.offer(&key(i));
        }
        let b = s.snapshot();
        assert_eq!(b.len(), 3, "{b:?}");
        assert!(b.windows(2).all(|w| w[0] < w[1]), "sorted: {b:?}");
    }

    #[test]
    fn a_source_count_stands_for_later_revisions_with_no_change_and_merged_pieces() {
        let b = |k: &'static str| Bytes::from_static(k.as_bytes());
        let counted = SourceCount::new(10, vec![b("/p/c"), b("/p/f"), b("/p/k")], vec![5, 1, 2, 7]);
        let counted = counted.expect("four pieces at three bounds");
        let same = [b("/p/c"), b("/p/f"), b("/p/k")];
        assert_eq!(counted.reuse(&same, 10, 10), Some(vec![5, 1, 2, 7]));
        assert_eq!(
            counted.reuse(&same, 42, 9),
            Some(vec![5, 1, 2, 7]),
            "nothing since"
        );
        assert_eq!(
            counted.reuse(&same, 42, 11),
            None,
            "an event after the count"
        );
        assert_eq!(
            counted.reuse(&same, 9, 3),
            None,
            "counted after the revision asked"
        );
        assert_eq!(
            counted.reuse(&[b("/p/c")], 12, 10),
            Some(vec![5, 10]),
            "merged"
        );
        assert_eq!(
            counted.reuse(&[b("/p/f")], 12, 10),
            Some(vec![6, 9]),
            "merged"
        );
        assert_eq!(counted.reuse(&[], 12, 10), Some(vec![15]), "one piece");
        assert_eq!(counted.reuse(&[b("/p/d")], 12, 10), None, "a new bound");
        assert_eq!(
            counted.reuse(&[b("/p/c"), b("/p/z")], 12, 10),
            None,
            "a new bound last"
        );
        assert!(
            SourceCount::new(1, vec![b("/p/c")], vec![1]).is_none(),
            "pieces ≠ bounds + 1"
        );
    }

    #[test]
    fn pieces_cover_the_prefix_exactly_once_in_order() {
        let prefix = Bytes::from_static(b"/p/");
        let bounds = vec![key(10), key(20)];
        let ranges = piece_ranges(&prefix, &bounds);
        assert_eq!(ranges.len(), 3);
        assert_eq!(pieces(&prefix, &bounds, 7).len(), 3);
        assert_eq!(ranges[0].0, prefix);
        assert_eq!(ranges[2].1, prefix_end(&prefix));
        for w in ranges.windows(2) {
            assert_eq!(w[0].1, w[1].0, "no gap and no overlap between pieces");
        }
        assert!(ranges.iter().all(|(a, b)| a < b), "{ranges:?}");
        // No boundaries: the whole prefix in one piece, as before.
        assert_eq!(
            piece_ranges(&prefix, &[]),
            vec![(prefix.clone(), prefix_end(&prefix))]
        );
    }

    #[test]
    fn small_neighbours_merge_and_full_pieces_stay() {
        let mut s = CountSplits::default();
        for i in 0..(PIECE_KEYS as u32 * 4) {
            s.offer(&key(i));
        }
        let b = s.snapshot();
        assert_eq!(b.len(), 4);
        // Five pieces: two tiny ones in the middle merge into one, the
        // full ones keep their boundaries.
        let half = (PIECE_KEYS / 2) as i64;
        s.counted(&b, &[PIECE_KEYS as i64, 10, 10, PIECE_KEYS as i64, half]);
        let after = s.snapshot();
        assert_eq!(
            after,
            vec![b[0].clone(), b[2].clone(), b[3].clone()],
            "{after:?}"
        );
        assert_eq!(s.len(), 3);
        // A count from an older snapshot that does not fit is ignored.
        s.counted(&b, &[0, 0]);
        assert_eq!(s.len(), 3);
    }
}
