//! Turning watch events into mirror txns.
//!
//! Consecutive source revisions are coalesced into one txn until the peer's
//! limits are reached; a revision is only split when it alone exceeds them.
//! Several writes to one key inside a batch collapse to the last one. Every
//! batch leaves room for the fence compare and the state-key put that the
//! engine adds when it sends it.

use std::collections::VecDeque;
use tokio::time::Instant;

use bytes::Bytes;

use crate::etcd::LeaseId;
use crate::etcd::{Delete, Event, EventKind, Op, Put, TxnBatcher, TxnLimits};

/// Bytes reserved per txn for the fence compare and the state put.
pub const STATE_RESERVE_BYTES: usize = 512;

/// A sealed batch, ready to send.
#[derive(Debug)]
pub struct Batch {
    /// The data ops (puts under the peer lease, deletes).
    pub ops: Vec<Op>,
    /// The keys the ops write, for per-key ordering between txns in flight.
    pub keys: Vec<Bytes>,
    /// The last source revision whose every event is in this or an earlier
    /// batch. Revisions split over batches report the revision before them
    /// until their last part.
    pub complete_through: i64,
    /// Watch events folded into this batch.
    pub events: u64,
    /// When the oldest event in it was received.
    pub received: Instant,
    /// Encoded size of the ops.
    pub bytes: usize,
    /// Ops of the revision after `complete_through`: a part of a split
    /// revision other than its last (0 otherwise). Once applied, the peer
    /// holds them while the watermark is still below their revision.
    pub ahead: usize,
}

impl Batch {
    /// Number of data ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    /// Whether the batch has no ops.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    /// A batch with no ops that only records progress through `revision`.
    pub fn empty(revision: i64) -> Batch {
        Batch {
            ops: Vec::new(),
            keys: Vec::new(),
            complete_through: revision,
            events: 0,
            received: Instant::now(),
            bytes: 0,
            ahead: 0,
        }
    }
}

/// Accumulates watch events into [`Batch`]es, on the client's
/// [`TxnBatcher`]: this layer only decides where a batch may end (between
/// revisions, unless one revision alone is too large) and keeps the
/// bookkeeping that travels with it.
pub struct Batcher {
    lease: LeaseId,
    /// Ops of the revision being read, not yet placed, with their sizes.
    rev: Vec<(Bytes, Op, usize)>,
    rev_bytes: usize,
    rev_number: i64,
    rev_received: Option<Instant>,
    rev_events: u64,
    txns: TxnBatcher,
    cur_keys: Vec<Bytes>,
    cur_events: u64,
    cur_received: Option<Instant>,
    cur_through: i64,
    /// Ops of the revision being split that sit in the open txn.
    cur_ahead: usize,
    ready: VecDeque<Batch>,
    /// Revisions split over more than one txn so far.
    pub split_revisions: u64,
}

impl std::fmt::Debug for Batcher {
    // The ops themselves are the caller's data: a summary is what a log
    // or a panic message needs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("lease", &self.lease)
            .field("rev_number", &self.rev_number)
            .field("rev_ops", &self.rev.len())
            .field("cur_through", &self.cur_through)
            .field("cur_keys", &self.cur_keys.len())
            .field("ready", &self.ready.len())
            .field("split_revisions", &self.split_revisions)
            .finish_non_exhaustive()
    }
}

impl Batcher {
    /// A batcher writing puts under `lease`, within `limits` less the room
    /// the engine needs for its own compare and state put.
    pub fn new(limits: TxnLimits, lease: LeaseId) -> Self {
        Batcher {
            lease,
            rev: Vec::new(),
            rev_bytes: 0,
            rev_number: 0,
            rev_received: None,
            rev_events: 0,
            txns: TxnBatcher::new(limits).with_reserved(1, STATE_RESERVE_BYTES),
            cur_keys: Vec::new(),
            cur_events: 0,
            cur_received: None,
            cur_through: 0,
            cur_ahead: 0,
            ready: VecDeque::new(),
            split_revisions: 0,
        }
    }

    /// Adds events received at `received`, in revision order.
    pub fn push(&mut self, events: impl IntoIterator<Item = Event>, received: Instant) {
        for ev in events {
            let revision = ev.revision();
            if revision != self.rev_number {
                self.place_revision();
                self.rev_number = revision;
            }
            let (key, value) = ev.kv.into_key_value();
            let op: Op = match ev.kind {
                EventKind::Put => Put::new(key.clone(), value).lease(self.lease).into(),
                EventKind::Delete => Delete::key(key.clone()).into(),
            };
            let len = op.encoded_len();
            self.rev_bytes += len;
            self.rev.push((key, op, len));
            self.rev_events += 1;
            self.rev_received.get_or_insert(received);
        }
    }

    /// Moves the revision being read into the open batch, sealing the open
    /// batch first if the revision does not fit beside it.
    fn place_revision(&mut self) {
        if self.rev.is_empty() {
            return;
        }
        let new_keys = self
            .rev
            .iter()
            .filter(|(k, ..)| !self.txns.contains(k))
            .count();
        if !self.txns.has_room(new_keys, self.rev_bytes) {
            self.seal();
        }
        let alone =
            self.rev.len() <= self.txns.max_ops() && self.rev_bytes <= self.txns.max_bytes();
        if !alone {
            self.split_revisions += 1;
        }
        let through_before = self.rev_number - 1;
        let received = self.rev_received.take();
        let events = std::mem::take(&mut self.rev_events);
        for (key, op, len) in std::mem::take(&mut self.rev) {
            let new_key = !self.txns.contains(&key);
            if !self.txns.has_room(usize::from(new_key), len) {
                // Only reached while splitting an oversized revision.
                self.cur_through = self.cur_through.max(through_before);
                self.seal();
            }
            if !alone {
                self.cur_ahead += 1;
            }
            if new_key {
                self.cur_keys.push(key);
            }
            // Fits, as just checked: the packer never seals on its own here.
            self.txns.push(op);
            if let Some(r) = received {
                self.cur_received.get_or_insert(r);
            }
        }
        self.cur_events += events;
        self.cur_through = self.rev_number;
        // The last part is complete through its revision.
        self.cur_ahead = 0;
        self.rev_bytes = 0;
    }

    fn seal(&mut self) {
        let bytes = self.txns.open_bytes();
        self.txns.flush();
        let Some(ops) = self.txns.pop() else {
            return;
        };
        debug_assert_eq!(self.txns.sealed_len(), 0);
        self.ready.push_back(Batch {
            ops,
            keys: std::mem::take(&mut self.cur_keys),
            complete_through: self.cur_through,
            events: std::mem::take(&mut self.cur_events),
            received: self.cur_received.take().unwrap_or_else(Instant::now),
            bytes,
            ahead: std::mem::take(&mut self.cur_ahead),
        });
    }

    /// Seals everything read so far: the watch has nothing more buffered.
    pub fn flush(&mut self) {
        self.place_revision();
        self.seal();
    }

    /// The peer's limits, as the batches are packed for them.
    pub fn limits(&self) -> TxnLimits {
        self.txns.limits()
    }

    /// Packs the batches not yet sealed for other limits (a peer found to
    /// take less than assumed). A revision being read is placed first.
    pub fn set_limits(&mut self, limits: TxnLimits) {
        self.place_revision();
        self.seal();
        self.txns.set_limits(limits);
    }

    /// Sealed batches waiting to be sent.
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Whether nothing at all is held: no sealed batch, no open batch, no
    /// partial revision.
    pub fn is_idle(&self) -> bool {
        self.ready.is_empty() && self.txns.is_empty() && self.rev.is_empty()
    }

    /// The oldest sealed batch, without removing it.
    pub fn peek(&self) -> Option<&Batch> {
        self.ready.front()
    }

    /// Removes and returns the oldest sealed batch.
    pub fn pop(&mut self) -> Option<Batch> {
        self.ready.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: EventKind, key: &str, value: &[u8], rev: i64) -> Event {
        Event::synthetic(
            kind,
            Bytes::copy_from_slice(key.as_bytes()),
            Bytes::copy_from_slice(value),
            rev,
        )
    }

    /// Each batch's complete-through revision.
    fn through(batches: &[Batch]) -> Vec<i64> {
        batches.iter().map(|b| b.complete_through).collect()
    }

    fn drain(b: &mut Batcher) -> Vec<Batch> {
        b.flush();
        std::iter::from_fn(|| b.pop()).collect()
    }

    fn value_of(op: &Op) -> Option<Bytes> {
        match op {
            Op::Put(p) => Some(p.value().clone()),
            _ => None,
        }
    }

    #[test]
    fn coalesces_revisions_and_deduplicates() {
        let mut b = Batcher::new(TxnLimits::default(), LeaseId::new(7));
        let now = Instant::now();
        for i in 0..20 {
            b.push(
                [ev(EventKind::Put, "/k", format!("v{i}").as_bytes(), 10 + i)],
                now,
            );
        }
        let batches = drain(&mut b);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].len(), 1);
        assert_eq!(batches[0].events, 20);
        assert_eq!(batches[0].complete_through, 29);
        assert_eq!(value_of(&batches[0].ops[0]).unwrap(), "v19");
    }

    #[test]
    fn never_splits_a_revision_that_fits() {
        let limits = TxnLimits {
            max_ops: 10,
            ..Default::default()
        };
        let mut b = Batcher::new(limits, LeaseId::NONE);
        let now = Instant::now();
        // Revision 1: 5 keys, revision 2: 5 keys; 9 data ops fit per txn.
        for rev in 1..=2 {
            let evs: Vec<Event> = (0..5)
                .map(|i| ev(EventKind::Put, &format!("/r{rev}/{i}"), b"x", rev))
                .collect();
            b.push(evs, now);
        }
        let batches = drain(&mut b);
        assert_eq!(batches.iter().map(Batch::len).collect::<Vec<_>>(), [5, 5]);
        assert_eq!(b.split_revisions, 0);
        assert_eq!(through(&batches), [1, 2]);
    }

    #[test]
    fn splits_an_oversized_revision_and_counts_it() {
        let mut b = Batcher::new(TxnLimits::default(), LeaseId::NONE);
        let evs: Vec<Event> = (0..300)
            .map(|i| ev(EventKind::Put, &format!("/k{i:03}"), b"x", 5))
            .collect();
        b.push(evs, Instant::now());
        // The next revision joins the tail of the split one.
        b.push([ev(EventKind::Delete, "/k000", b"", 6)], Instant::now());
        let batches = drain(&mut b);
        assert_eq!(
            batches.iter().map(Batch::len).collect::<Vec<_>>(),
            [127, 127, 47]
        );
        assert_eq!(b.split_revisions, 1);
        assert_eq!(through(&batches), [4, 4, 6]);
        // The first two parts hold revision 5 above what they complete.
        let ahead: Vec<usize> = batches.iter().map(|b| b.ahead).collect();
        assert_eq!(ahead, [127, 127, 0]);
    }

    #[test]
    fn large_values_go_one_per_txn() {
        let mut b = Batcher::new(TxnLimits::default(), LeaseId::NONE);
        let big = vec![1u8; 1200 * 1024];
        for rev in 1..=3 {
            b.push(
                [ev(EventKind::Put, &format!("/big{rev}"), &big, rev)],
                Instant::now(),
            );
        }
        let batches = drain(&mut b);
        assert_eq!(batches.len(), 3);
        assert_eq!(b.split_revisions, 0);
    }
}
