//! The sequence of one peer's live txns, without I/O: per-key order and
//! the acknowledged watermark.
//!
//! Batches go out pipelined, each with a sequence number, and their
//! acknowledgements come back in any order. The sequencer keeps:
//! - per-key counts of the txns in flight, so that a batch touching a key
//!   still in flight waits (per-key order on the peer);
//! - the acknowledged sequence numbers, so that the *watermark* — the
//!   source revision through which every batch is acknowledged — only moves
//!   over a contiguous prefix of sequence numbers;
//! - the last revision written into the state key, so the loop knows when
//!   the state key needs catching up.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

/// Sequence numbers, acknowledgements and per-key counts of the txns in
/// flight to one peer.
#[derive(Debug)]
pub(crate) struct Sequencer {
    next_seq: u64,
    floor_seq: u64,
    /// Acknowledged out of order: seq → complete-through revision.
    acked: BTreeMap<u64, i64>,
    keys: HashMap<Bytes, u32>,
    in_flight: usize,
    watermark: i64,
    state_written: i64,
}

impl Sequencer {
    /// A sequencer whose every revision through `applied` is on the peer and
    /// recorded in its state key.
    pub(crate) fn new(applied: i64) -> Sequencer {
        Sequencer {
            next_seq: 0,
            floor_seq: 0,
            acked: BTreeMap::new(),
            keys: HashMap::new(),
            in_flight: 0,
            watermark: applied,
            state_written: applied,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.in_flight == 0
    }

    /// Every txn numbered below this one is acknowledged.
    pub(crate) fn floor_seq(&self) -> u64 {
        self.floor_seq
    }

    /// Every source revision through this one is acknowledged by the peer.
    pub(crate) fn watermark(&self) -> i64 {
        self.watermark
    }

    /// Whether a txn writing one of `keys` is in flight.
    pub(crate) fn conflicts(&self, keys: &[Bytes]) -> bool {
        !self.keys.is_empty() && keys.iter().any(|k| self.keys.contains_key(k))
    }

    /// Whether the state key lags the watermark.
    pub(crate) fn state_behind(&self) -> bool {
        self.watermark > self.state_written
    }

    /// Opens a txn writing `keys` whose batch is complete through
    /// `complete_through`; returns its sequence number and the revision
    /// its state put records: its own when nothing else is in flight (it
    /// commits after everything before it), else the watermark (a lower
    /// bound that stays true whatever order the txns commit in).
    pub(crate) fn open(&mut self, keys: &[Bytes], complete_through: i64) -> (u64, i64) {
        let state_rev = if self.in_flight == 0 {
            complete_through
        } else {
            self.watermark
        };
        self.state_written = self.state_written.max(state_rev);
        for k in keys {
            *self.keys.entry(k.clone()).or_default() += 1;
        }
        self.in_flight += 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        (seq, state_rev)
    }

    /// Releases the keys of a finished txn (acknowledged or not), so
    /// batches waiting on them may go.
    pub(crate) fn release(&mut self, keys: &[Bytes]) {
        for k in keys {
            if let Some(n) = self.keys.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    self.keys.remove(k);
                }
            }
        }
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Books the acknowledgement of txn `seq`, complete through
    /// `complete_through`; returns the watermark.
    pub(crate) fn ack(&mut self, seq: u64, complete_through: i64) -> i64 {
        self.acked.insert(seq, complete_through);
        while let Some(rev) = self.acked.remove(&self.floor_seq) {
            self.watermark = self.watermark.max(rev);
            self.floor_seq += 1;
        }
        self.watermark
    }

    /// Moves the watermark to `revision` without a txn: a progress notice
    /// on an idle stream says nothing below it is pending.
    pub(crate) fn advance_idle(&mut self, revision: i64) {
        debug_assert!(self.in_flight == 0);
        self.watermark = self.watermark.max(revision);
    }
}

/// A txn sent and not yet under the watermark.
pub(crate) struct Launched {
    pub(crate) seq: u64,
    /// `launched_ops` before it.
    pub(crate) before: u64,
    /// Its ops of the revision after `through` (see [`super::batch::Batch::ahead`]).
    pub(crate) ahead: u64,
    pub(crate) through: i64,
}

/// Ops applied of one revision the watermark has not reached: the parts
/// of a split revision settled before its last.
#[derive(Default, Clone, Copy)]
pub(crate) struct Ahead {
    ops: u64,
    revision: i64,
}

impl Ahead {
    /// Books a txn that went under the watermark, in sequence order.
    pub(crate) fn settled(&mut self, l: &Launched) {
        if l.ahead == 0 {
            // Complete through its last revision: any split one is whole.
            *self = Ahead::default();
        } else if self.revision == l.through + 1 {
            self.ops += l.ahead;
        } else {
            *self = Ahead {
                ops: l.ahead,
                revision: l.through + 1,
            };
        }
    }

    /// The ops the peer holds above `watermark`.
    pub(crate) fn above(&self, watermark: i64) -> u64 {
        if self.revision > watermark {
            self.ops
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn the_watermark_moves_only_over_a_contiguous_prefix() {
        let mut w = Sequencer::new(10);
        let (s0, r0) = w.open(&[k("a")], 12);
        let (s1, r1) = w.open(&[k("b")], 15);
        let (s2, r2) = w.open(&[k("c")], 20);
        // The first goes out alone and records its own revision; the later
        // ones only what is certain when they are sent.
        assert_eq!((r0, r1, r2), (12, 10, 10));
        w.release(&[k("c")]);
        assert_eq!(w.ack(s2, 20), 10, "a later ack alone moves nothing");
        w.release(&[k("a")]);
        assert_eq!(w.ack(s0, 12), 12);
        w.release(&[k("b")]);
        assert_eq!(w.ack(s1, 15), 20, "the gap closes: through the last");
        assert!(w.is_empty());
        assert!(w.state_behind());
    }

    #[test]
    fn a_key_in_flight_holds_back_batches_that_touch_it() {
        let mut w = Sequencer::new(0);
        w.open(&[k("a"), k("b")], 1);
        w.open(&[k("a")], 2);
        assert!(w.conflicts(&[k("x"), k("a")]));
        assert!(!w.conflicts(&[k("x")]));
        w.release(&[k("a"), k("b")]);
        assert!(w.conflicts(&[k("a")]), "still one txn on a");
        assert!(!w.conflicts(&[k("b")]));
        w.release(&[k("a")]);
        assert!(!w.conflicts(&[k("a")]));
        assert!(w.is_empty());
    }

    #[test]
    fn idle_progress_moves_the_watermark_and_flags_the_state_key() {
        let mut w = Sequencer::new(5);
        assert!(!w.state_behind());
        w.advance_idle(9);
        assert_eq!(w.watermark(), 9);
        assert!(w.state_behind());
        let (_, rev) = w.open(&[], 9);
        assert_eq!(rev, 9);
        assert!(!w.state_behind());
    }

    fn txn(seq: u64, ahead: u64, through: i64) -> Launched {
        Launched {
            seq,
            before: 0,
            ahead,
            through,
        }
    }

    #[test]
    fn the_applied_parts_of_a_split_revision_count_only_until_it_is_whole() {
        let mut a = Ahead::default();
        a.settled(&txn(1, 0, 9));
        assert_eq!(a.above(9), 0);
        // Revision 10 in three parts: the first two go under the
        // watermark (still 9) one after the other.
        a.settled(&txn(2, 127, 9));
        assert_eq!(a.above(9), 127);
        a.settled(&txn(3, 127, 9));
        assert_eq!(a.above(9), 254);
        // The last part completes it: nothing is ahead any more.
        a.settled(&txn(4, 0, 10));
        assert_eq!(a.above(10), 0);
        // A new split revision starts from nothing, not from the last one.
        a.settled(&txn(5, 100, 11));
        assert_eq!(a.above(11), 100);
        // Two split revisions back to back: the second's first part
        // follows the first's last one, which may already hold revision
        // 12's neighbours but completes 12.
        a.settled(&txn(6, 0, 12));
        a.settled(&txn(7, 50, 12));
        assert_eq!(a.above(12), 50);
        // A watermark read after the revision is whole sees nothing ahead.
        assert_eq!(a.above(13), 0);
    }
}
