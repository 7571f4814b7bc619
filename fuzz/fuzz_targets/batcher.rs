//! The live loop's `Batcher`, driven as the engine drives it: watch
//! responses of whole revisions (distinct keys within one, as etcd
//! guarantees; revisions may skip numbers), flushes when the watch has
//! nothing buffered, batches popped at any time, and the peer's limits
//! lowered or raised between responses. The batches are applied, in order,
//! to a model of the peer and compared with the source at each batch's
//! `complete_through`:
//!
//! - a batch holds at most the limits' ops less the state put, and at most
//!   their bytes less the overhead and the state reserve, unless it is one
//!   op too large for any txn (counted in `split_revisions`);
//! - no key twice in a batch (etcd refuses such a txn), `keys` are the
//!   ops' keys, every put carries the batcher's lease, `bytes` is the ops'
//!   encoded size;
//! - `complete_through` never goes back, and a batch with `ahead == 0`
//!   leaves the peer exactly as the source was at `complete_through`: whole
//!   revisions, in order, nothing lost;
//! - a batch with `ahead > 0` (a part of a split revision R, the first
//!   revision after `complete_through`) ends with `ahead` of R's writes,
//!   leaves every other key as at `complete_through`, and the revision is
//!   counted in `split_revisions`;
//! - every event is folded into exactly one batch (`events` add up; a
//!   split revision's events count in its last part), and after the last
//!   flush nothing is held.
//!
//! The input is a byte-coded script; see `Script::run`.
#![no_main]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use tokio::time::Instant;

use aether_replicator::etcd::{Event, EventKind, LeaseId, Op, REQUEST_OVERHEAD_BYTES, TxnLimits};
use aether_replicator::mirror::batch::{Batch, Batcher, STATE_RESERVE_BYTES};
use libfuzzer_sys::fuzz_target;

const LEASE: LeaseId = LeaseId::new(0x5eed);
/// Keys are drawn from this many, so that revisions rewrite keys and
/// batches de-duplicate them.
const KEYS: u8 = 16;
/// The longest script run, in events: enough for splits and many batches,
/// small enough for a fast loop.
const MAX_EVENTS: usize = 2000;

/// A put's value, as the model keeps it: the event's number (written at
/// the start of the value, which makes every value unique) and its length.
type Value = (u64, usize);
type Store = HashMap<Vec<u8>, Value>;
/// A revision's writes: a value, or `None` for a delete.
type Writes = BTreeMap<Vec<u8>, Option<Value>>;

fuzz_target!(|data: &[u8]| {
    Script::new(data).run();
});

/// The limits the engine accepts (at least 2 ops, at least 4096 bytes),
/// small enough that a few hundred bytes of values fill a txn.
fn limits(ops: u8, bytes: u8) -> TxnLimits {
    TxnLimits {
        max_ops: 2 + usize::from(ops % 15),
        max_bytes: 4096 + usize::from(bytes) * 64,
    }
}

struct Script<'a> {
    data: &'a [u8],
    batcher: Batcher,
    /// The limits the batches being sealed are held to.
    limits: TxnLimits,
    /// The revision being read, and what it wrote.
    rev: i64,
    rev_writes: Writes,
    /// Revisions read but not yet pushed: one watch response.
    response: Vec<Event>,
    /// The source after each revision, and every revision's own writes.
    source: BTreeMap<i64, Store>,
    writes: BTreeMap<i64, Writes>,
    events: u64,
    /// The peer, as the batches popped so far leave it.
    peer: Store,
    through: i64,
    folded: u64,
    /// Revisions seen split (a batch with `ahead > 0`).
    split_seen: BTreeSet<i64>,
    oversized_ops: u64,
}

impl<'a> Script<'a> {
    fn new(data: &'a [u8]) -> Self {
        let (l, data) = match data {
            [o, b, rest @ ..] => (limits(*o, *b), rest),
            _ => (TxnLimits::default(), &[][..]),
        };
        Script {
            data,
            batcher: Batcher::new(l, LEASE),
            limits: l,
            rev: 2,
            rev_writes: BTreeMap::new(),
            response: Vec::new(),
            source: BTreeMap::new(),
            writes: BTreeMap::new(),
            events: 0,
            peer: Store::new(),
            through: 0,
            folded: 0,
            split_seen: BTreeSet::new(),
            oversized_ops: 0,
        }
    }

    fn byte(&mut self) -> u8 {
        let (b, rest) = self
            .data
            .split_first()
            .map_or((0, &[][..]), |(b, r)| (*b, r));
        self.data = rest;
        b
    }

    /// Two bytes of limits, then commands, one byte each (`c % 8`), some
    /// with an argument byte:
    /// - 0..=3 `k v`: a put of key `k % 16` with a value of `v * 24` bytes
    ///   (after 16 that make it unique) in the revision being read;
    /// - 4 `k`: a delete of key `k % 16` in it;
    /// - 5 `g`: the next revision starts, `1 + g % 4` later (etcd skips
    ///   the revisions of keys outside the watched prefix);
    /// - 6: the response ends and is pushed; with bit 3 set the watch has
    ///   nothing more buffered (flush), with bit 4 set the batches ready are
    ///   popped, with bit 5 one batch is;
    /// - 7 `o b`: after this response, the peer's limits change.
    ///
    /// A write to a key the revision already wrote starts the next one.
    fn run(mut self) {
        let now = Instant::now();
        while !self.data.is_empty() && self.events < MAX_EVENTS as u64 {
            let c = self.byte();
            match c % 8 {
                0..=3 => {
                    let key = self.byte() % KEYS;
                    let len = usize::from(self.byte()) * 24;
                    self.write(key, Some(len));
                }
                4 => {
                    let key = self.byte() % KEYS;
                    self.write(key, None);
                }
                5 => {
                    let gap = 1 + i64::from(self.byte() % 4);
                    self.end_revision(gap);
                }
                6 => {
                    self.end_response(now);
                    if c & 8 != 0 {
                        self.batcher.flush();
                    }
                    if c & 16 != 0 {
                        self.pop_all();
                    } else if c & 32 != 0 {
                        self.pop_one();
                    }
                }
                _ => {
                    let l = limits(self.byte(), self.byte());
                    self.end_response(now);
                    // Sealed under the old limits: checked against them.
                    self.pop_all();
                    self.batcher.set_limits(l);
                    assert_eq!(self.batcher.limits(), l);
                    self.pop_all();
                    self.limits = l;
                }
            }
        }
        self.end_response(now);
        self.batcher.flush();
        self.pop_all();
        assert!(
            self.batcher.is_idle(),
            "the batcher holds something after a flush"
        );
        assert_eq!(self.folded, self.events, "events folded into batches");
        let last = self.source.last_key_value();
        assert_eq!(self.peer, last.map(|(_, s)| s.clone()).unwrap_or_default());
        if let Some((&rev, _)) = last {
            assert_eq!(
                self.through, rev,
                "the last batch completes the last revision"
            );
        }
        // An op too large for any txn makes its revision count as split
        // even when it is the revision's only op.
        let splits = self.batcher.split_revisions;
        assert!(
            splits >= self.split_seen.len() as u64 && (self.oversized_ops == 0 || splits > 0),
            "split_revisions {splits} does not count the {} revisions seen split, or the {} ops too large",
            self.split_seen.len(),
            self.oversized_ops
        );
    }

    fn write(&mut self, key: u8, value_len: Option<usize>) {
        let key = format!("/k/{key:02}").into_bytes();
        if self.rev_writes.contains_key(&key) {
            self.end_revision(1);
        }
        let (kind, value) = match value_len {
            Some(len) => {
                let mut v = format!("{:016}", self.events).into_bytes();
                v.resize(v.len() + len, b'v');
                (EventKind::Put, v)
            }
            None => (EventKind::Delete, Vec::new()),
        };
        let model = (kind == EventKind::Put).then_some((self.events, value.len()));
        self.response.push(Event::synthetic(
            kind,
            key.clone().into(),
            value.into(),
            self.rev,
        ));
        self.rev_writes.insert(key, model);
        self.events += 1;
    }

    /// Records the revision being read in the source model.
    fn end_revision(&mut self, gap: i64) {
        if self.rev_writes.is_empty() {
            self.rev += gap;
            return;
        }
        let mut store = self
            .source
            .last_key_value()
            .map(|(_, s)| s.clone())
            .unwrap_or_default();
        for (k, v) in &self.rev_writes {
            match v {
                Some(v) => store.insert(k.clone(), *v),
                None => store.remove(k),
            };
        }
        self.source.insert(self.rev, store);
        self.writes
            .insert(self.rev, std::mem::take(&mut self.rev_writes));
        self.rev += gap;
    }

    fn end_response(&mut self, now: Instant) {
        self.end_revision(1);
        if !self.response.is_empty() {
            self.batcher.push(std::mem::take(&mut self.response), now);
        }
    }

    fn pop_all(&mut self) {
        while self.pop_one() {}
    }

    fn pop_one(&mut self) -> bool {
        let ready = self.batcher.ready_len();
        let peeked = self.batcher.peek().map(|b| (b.complete_through, b.len()));
        let Some(batch) = self.batcher.pop() else {
            assert_eq!(ready, 0);
            return false;
        };
        assert_eq!(ready, self.batcher.ready_len() + 1);
        assert_eq!(peeked, Some((batch.complete_through, batch.len())));
        self.check(&batch);
        true
    }

    /// The source as of `revision`: after every revision up to it.
    fn source_at(&self, revision: i64) -> Store {
        self.source
            .range(..=revision)
            .next_back()
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    }

    fn check(&mut self, b: &Batch) {
        let max_ops = self.limits.max_ops.saturating_sub(1).max(1);
        let max_bytes = self
            .limits
            .max_bytes
            .saturating_sub(REQUEST_OVERHEAD_BYTES + STATE_RESERVE_BYTES);
        assert!(!b.is_empty(), "an empty batch was sealed");
        assert_eq!(b.len(), b.ops.len());
        assert!(b.len() <= max_ops, "{} ops, limit {max_ops}", b.len());
        let bytes: usize = b.ops.iter().map(Op::encoded_len).sum();
        assert_eq!(b.bytes, bytes, "the batch's bytes");
        if b.len() > 1 {
            assert!(b.bytes <= max_bytes, "{} bytes, limit {max_bytes}", b.bytes);
        } else if b.bytes > max_bytes {
            self.oversized_ops += 1;
        }
        // Events count in the batch that completes their revision, so a
        // part of a split revision other than its last may have none.
        assert!(
            b.ahead > 0 || b.events >= b.len() as u64,
            "fewer events than ops"
        );
        self.folded += b.events;

        let keys: Vec<&[u8]> = b
            .ops
            .iter()
            .map(|op| &op.key().expect("a single-key write")[..])
            .collect();
        let distinct: BTreeSet<&[u8]> = keys.iter().copied().collect();
        assert_eq!(distinct.len(), keys.len(), "a key twice in one batch");
        let listed: BTreeSet<&[u8]> = b.keys.iter().map(|k| &k[..]).collect();
        assert_eq!(listed, distinct, "keys are not the ops' keys");
        assert_eq!(b.keys.len(), b.len());

        assert!(
            b.complete_through >= self.through,
            "complete_through went back: {} after {}",
            b.complete_through,
            self.through
        );
        assert!(
            b.complete_through <= self.rev,
            "completes a revision not read"
        );
        self.through = b.complete_through;

        for op in &b.ops {
            match op {
                Op::Put(p) => {
                    assert_eq!(p.lease_id(), LEASE, "a put without the peer lease");
                    self.peer.insert(p.key().to_vec(), value_of(p.value()));
                }
                Op::Delete(_) => {
                    let key = op.key().expect("a single-key delete");
                    self.peer.remove(&key[..]);
                }
                other => panic!("unexpected op {other:?}"),
            }
        }

        let at = self.source_at(b.complete_through);
        if b.ahead == 0 {
            assert!(
                self.peer == at,
                "after a batch complete through {}, the peer differs from the source",
                b.complete_through
            );
            return;
        }
        // A part of a split revision: the one after complete_through.
        assert!(b.ahead <= b.len(), "ahead {} of {} ops", b.ahead, b.len());
        let (&split, split_writes) = self
            .writes
            .range(b.complete_through + 1..)
            .next()
            .expect("a revision after complete_through, for a batch ahead of it");
        self.split_seen.insert(split);
        for op in &b.ops[b.len() - b.ahead..] {
            let key = &op.key().expect("a single-key write")[..];
            let written = split_writes
                .get(key)
                .unwrap_or_else(|| panic!("an op ahead is not revision {split}'s"));
            let value = match op {
                Op::Put(p) => Some(value_of(p.value())),
                _ => None,
            };
            assert_eq!(
                &value, written,
                "an op ahead is not revision {split}'s write"
            );
        }
        let mut keys: BTreeSet<&Vec<u8>> = self.peer.keys().collect();
        keys.extend(at.keys());
        for k in keys {
            let (now, then) = (self.peer.get(k), at.get(k));
            if now == then {
                continue;
            }
            assert!(
                split_writes.get(k).is_some_and(|w| w.as_ref() == now),
                "a key moved past complete_through {} but not by revision {split}",
                b.complete_through
            );
        }
    }
}

/// The model's value of a put's bytes (see [`Value`]).
fn value_of(v: &[u8]) -> Value {
    let n = std::str::from_utf8(&v[..16])
        .ok()
        .and_then(|s| s.parse().ok())
        .expect("a value this script wrote");
    (n, v.len())
}
