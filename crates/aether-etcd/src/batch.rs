//! Packing many writes into the fewest txns that etcd accepts.
//!
//! etcd refuses a txn whose branch has more than `--max-txn-ops` ops
//! (default 128), whose encoded request exceeds `--max-request-bytes`
//! (default 1.5 MiB), or that writes one key twice. [`TxnBatcher`] packs an
//! ordered stream of puts and deletes greedily into txns that respect all
//! three. Within one txn, a later write to a key replaces the earlier one:
//! the txn is atomic, so only the last write is observable anyway. A put
//! under a range delete already in the txn starts a new txn, which keeps the
//! order of the stream intact.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};

use bytes::Bytes;
use hashbrown::HashTable;

use super::kv::{Compare, Delete, Op, Put, Txn};
use super::lease_id::LeaseId;

/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;
/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// Bytes kept free below `max_request_bytes` for what etcd wraps around the
/// request before it checks the size (the raft request header).
pub const REQUEST_OVERHEAD_BYTES: usize = 1024;

/// The peer's limits on one txn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnLimits {
    /// Most ops in one branch (`--max-txn-ops`).
    pub max_ops: usize,
    /// Largest request in bytes (`--max-request-bytes`).
    pub max_bytes: usize,
}

impl Default for TxnLimits {
    fn default() -> Self {
        TxnLimits {
            max_ops: DEFAULT_MAX_TXN_OPS,
            max_bytes: DEFAULT_MAX_REQUEST_BYTES,
        }
    }
}

/// One txn's success branch being filled, with de-duplication by key.
#[derive(Default)]
struct Open {
    ops: Vec<Op>,
    /// Per-op guards added with [`TxnBatcher::push_guarded`].
    guards: Vec<Compare>,
    /// Encoded bytes of `ops` and `guards`.
    bytes: usize,
    /// Single-key writes, as indexes into `ops`, found by their key's hash.
    /// The table holds no key of its own: the op already has it, and a
    /// second `Bytes` handle per key (plus a map that grows from empty for
    /// every txn) was most of what batching a put cost.
    keys: HashTable<usize>,
    hasher: RandomState,
    /// Range deletes in this txn, as `[from, to)`.
    ranges: Vec<(Bytes, Bytes)>,
}

/// The key of a single-key write at `ops[i]`.
fn key_at(ops: &[Op], i: usize) -> &[u8] {
    ops[i].key().map_or(&[][..], |k| &k[..])
}

impl Open {
    /// Whether a range delete in this txn covers `key`.
    fn covered(&self, key: &[u8]) -> bool {
        self.ranges.iter().any(|(from, to)| in_range(key, from, to))
    }

    fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The index in `ops` of the write to `key` (hashed as `hash`), if any.
    fn find(&self, key: &[u8], hash: u64) -> Option<usize> {
        let ops = &self.ops;
        self.keys.find(hash, |&i| key_at(ops, i) == key).copied()
    }

    /// Adds a single-key write of encoded size `len`, replacing an earlier
    /// write to the same key.
    fn push_key(&mut self, op: Op, len: usize) {
        let key = op.key().map_or(&[][..], |k| &k[..]);
        let hash = self.hash(key);
        let at = self.find(key, hash);
        self.push_key_at(op, len, hash, at);
    }

    /// [`Open::push_key`] with the key's hash and index already looked up.
    fn push_key_at(&mut self, op: Op, len: usize, hash: u64, at: Option<usize>) {
        match at {
            Some(i) => {
                self.bytes = self.bytes - self.ops[i].encoded_len() + len;
                self.ops[i] = op;
            }
            None => {
                let (ops, hasher) = (&self.ops, &self.hasher);
                self.keys
                    .insert_unique(hash, ops.len(), |&i| hasher.hash_one(key_at(ops, i)));
                self.ops.push(op);
                self.bytes += len;
            }
        }
    }

    /// Adds a range delete or a read; a range delete drops the writes in
    /// this txn that it supersedes.
    fn push_other(&mut self, op: Op, len: usize) {
        if let Op::Delete(d) = &op {
            let (from, to) = d.bounds();
            let (from, to) = (from.clone(), to.clone());
            let ops = &self.ops;
            if self
                .keys
                .iter()
                .any(|&i| in_range(key_at(ops, i), &from, &to))
            {
                let old = std::mem::take(&mut self.ops);
                self.keys.clear();
                self.bytes = self.guards.iter().map(Compare::encoded_len).sum();
                for op in old {
                    let len = op.encoded_len();
                    match op.key() {
                        Some(k) if in_range(k, &from, &to) => {}
                        Some(_) => self.push_key(op, len),
                        None => {
                            self.bytes += len;
                            self.ops.push(op);
                        }
                    }
                }
            }
            self.ranges.push((from, to));
        }
        self.bytes += len;
        self.ops.push(op);
    }

    /// Makes room for a txn of `n` single-key writes, so the table does
    /// not grow (and re-hash every key) while a txn fills.
    fn reserve(&mut self, n: usize) {
        let (ops, hasher) = (&self.ops, &self.hasher);
        self.keys.reserve(n, |&i| hasher.hash_one(key_at(ops, i)));
        self.ops.reserve(n);
    }

    /// Seals the txn. The next one starts with room for as many ops, so a
    /// stream of full txns allocates each txn's ops once.
    fn take(&mut self) -> Sealed {
        self.keys.clear();
        self.ranges.clear();
        self.bytes = 0;
        let room = self.ops.len();
        Sealed {
            guards: std::mem::take(&mut self.guards),
            ops: std::mem::replace(&mut self.ops, Vec::with_capacity(room)),
        }
    }
}

/// A sealed txn's guards and ops.
struct Sealed {
    guards: Vec<Compare>,
    ops: Vec<Op>,
}

fn in_range(key: &[u8], from: &[u8], to: &[u8]) -> bool {
    // etcd: range_end "\0" means "to the end of the keyspace".
    key >= from && (to == [0] || key < to)
}

/// Packs puts and deletes into the fewest txns within [`TxnLimits`].
///
/// Writes go into an *open* txn; when the next one does not fit, the open
/// txn is sealed and a new one starts. Within a txn a later write to a key
/// replaces the earlier one. Callers that add their own guards or ops to
/// every txn when they send it (a fence compare, a bookkeeping put) reserve
/// room for them with [`TxnBatcher::with_compares`] and
/// [`TxnBatcher::with_reserved`]. Sealed txns come out in order, either
/// whole ([`TxnBatcher::pop_txn`], [`TxnBatcher::finish`]) or as their ops
/// ([`TxnBatcher::pop`]) for a caller that builds the txn itself.
///
/// ```
/// use aether_etcd::{LeaseId, TxnBatcher, TxnLimits};
///
/// let mut b = TxnBatcher::new(TxnLimits { max_ops: 2, ..TxnLimits::default() });
/// let none = LeaseId::NONE;
/// b.put("a", "1", none).put("b", "2", none).put("a", "3", none).delete("c");
/// // "a" is written twice in the first txn, so the later write replaces the
/// // earlier one: [a=3, b=2] then [delete c].
/// let txns = b.finish();
/// assert_eq!(txns.iter().map(|t| t.success_len()).collect::<Vec<_>>(), [2, 1]);
/// ```
///
/// Streaming, with room kept for an op the caller adds to each txn:
///
/// ```
/// use aether_etcd::{LeaseId, Put, Txn, TxnBatcher, TxnLimits};
///
/// let mut b = TxnBatcher::new(TxnLimits::default()).with_reserved(1, 256);
/// let mut sent = 0;
/// for i in 0..1000 {
///     b.put(format!("/k/{i}"), "v", LeaseId::NONE);
///     while let Some(ops) = b.pop() {
///         let txn = Txn::new().and_then(ops).and_then([Put::new("/progress", i.to_string())]);
///         assert!(txn.success_len() <= 128);
///         sent += 1;
///     }
/// }
/// b.flush();
/// sent += std::iter::from_fn(|| b.pop()).count();
/// assert_eq!(sent, 8); // 1000 puts, 127 per txn
/// ```
pub struct TxnBatcher {
    limits: TxnLimits,
    compares: Vec<Compare>,
    reserved_ops: usize,
    reserved_bytes: usize,
    max_ops: usize,
    max_bytes: usize,
    open: Open,
    sealed: VecDeque<Sealed>,
}

impl std::fmt::Debug for TxnBatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxnBatcher")
            .field("limits", &self.limits)
            .field("compares", &self.compares)
            .field("open_ops", &self.open_len())
            .field("open_bytes", &self.open_bytes())
            .field("sealed_txns", &self.sealed.len())
            .finish_non_exhaustive()
    }
}

impl TxnBatcher {
    /// A batcher for a server with these limits.
    pub fn new(limits: TxnLimits) -> Self {
        let mut b = TxnBatcher {
            limits,
            compares: Vec::new(),
            reserved_ops: 0,
            reserved_bytes: 0,
            max_ops: 0,
            max_bytes: 0,
            open: Open::default(),
            sealed: VecDeque::new(),
        };
        b.budget();
        b
    }

    /// Puts these compares on every txn produced by [`TxnBatcher::pop_txn`]
    /// and [`TxnBatcher::finish`] (for example a fencing guard). They count
    /// against the byte limit.
    #[must_use]
    pub fn with_compares(mut self, compares: impl IntoIterator<Item = Compare>) -> Self {
        self.compares.extend(compares);
        self.budget();
        self
    }

    /// Keeps room in every txn for `ops` more ops of `bytes` encoded bytes
    /// in all (compares included) that the caller adds when it sends.
    #[must_use]
    pub fn with_reserved(mut self, ops: usize, bytes: usize) -> Self {
        self.reserved_ops = ops;
        self.reserved_bytes = bytes;
        self.budget();
        self
    }

    fn budget(&mut self) {
        let compares: usize = self.compares.iter().map(Compare::encoded_len).sum();
        self.max_ops = self.limits.max_ops.saturating_sub(self.reserved_ops).max(1);
        self.max_bytes = self
            .limits
            .max_bytes
            .saturating_sub(REQUEST_OVERHEAD_BYTES + compares + self.reserved_bytes);
        // Up to a bound: a server with a huge `--max-txn-ops` need not
        // cost that much memory before any write comes.
        self.open.reserve(self.max_ops.min(1024));
    }

    /// Packs for other limits from now on (a server found to take less
    /// than assumed). The open txn is sealed first if it no longer fits.
    pub fn set_limits(&mut self, limits: TxnLimits) {
        self.limits = limits;
        self.budget();
        if self.open.ops.len() > self.max_ops || self.open.bytes > self.max_bytes {
            self.flush();
        }
    }

    /// The server limits it packs for.
    pub fn limits(&self) -> TxnLimits {
        self.limits
    }

    /// Most ops a txn gets, after the reserve.
    pub fn max_ops(&self) -> usize {
        self.max_ops
    }

    /// Most encoded bytes of ops a txn gets, after overhead, compares and
    /// the reserve. An op larger than this still goes out, alone.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Ops in the open txn.
    pub fn open_len(&self) -> usize {
        self.open.ops.len()
    }

    /// Encoded bytes of the ops in the open txn.
    pub fn open_bytes(&self) -> usize {
        self.open.bytes
    }

    /// Whether the open txn already writes `key`.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.open.find(key, self.open.hash(key)).is_some()
    }

    /// Whether `new_ops` more ops of `bytes` bytes in all would join the
    /// open txn without sealing it. An empty txn takes anything.
    pub fn has_room(&self, new_ops: usize, bytes: usize) -> bool {
        self.open.ops.is_empty()
            || (self.open.ops.len() + new_ops <= self.max_ops
                && self.open.bytes + bytes <= self.max_bytes)
    }

    /// Adds any op: puts and single-key deletes de-duplicate by key; a
    /// range delete drops the writes it supersedes in the open txn. A
    /// nested txn goes into a txn of its own (with its guard, if any): what
    /// it writes is known only to the server, and etcd refuses a branch in
    /// which it writes a key another op writes.
    pub fn push(&mut self, op: impl Into<Op>) -> &mut Self {
        self.push_inner(op.into(), None)
    }

    /// Adds an op with a guard of its own that goes into the same txn's
    /// compares (for example "this key does not exist yet"). The guard
    /// counts against both limits: etcd caps the compares of a txn at
    /// `--max-txn-ops` too. Read the txn back with
    /// [`TxnBatcher::pop_parts`] or [`TxnBatcher::pop_txn`].
    pub fn push_guarded(&mut self, op: impl Into<Op>, guard: Compare) -> &mut Self {
        self.push_inner(op.into(), Some(guard))
    }

    fn push_inner(&mut self, op: Op, guard: Option<Compare>) -> &mut Self {
        let alone = matches!(op, Op::Txn(_));
        if alone {
            self.flush();
        }
        let guard_len = guard.as_ref().map_or(0, Compare::encoded_len);
        if guard.is_some()
            && !self.open.ops.is_empty()
            && self.open.guards.len() + self.compares.len() + 1 > self.limits.max_ops
        {
            self.flush();
        }
        let len = op.encoded_len();
        let need = len + guard_len;
        match op.key() {
            Some(key) => {
                if self.open.covered(key) {
                    // A range delete in this txn would conflict with the
                    // put: start a new txn, which also keeps their order.
                    self.flush();
                }
                let hash = self.open.hash(key);
                let mut at = self.open.find(key, hash);
                if !self.has_room(usize::from(at.is_none()), need) {
                    self.flush();
                    at = None;
                }
                self.open.push_key_at(op, len, hash, at);
            }
            None => {
                if !self.has_room(1, need) {
                    self.flush();
                }
                self.open.push_other(op, len);
            }
        }
        if let Some(g) = guard {
            self.open.bytes += guard_len;
            self.open.guards.push(g);
        }
        if alone {
            self.flush();
        }
        self
    }

    /// Adds a put of `value` at `key` under `lease` ([`LeaseId::NONE`]: none).
    pub fn put(
        &mut self,
        key: impl Into<Bytes>,
        value: impl Into<Bytes>,
        lease: LeaseId,
    ) -> &mut Self {
        self.push(Put::new(key, value).lease(lease))
    }

    /// Adds a prepared [`Put`].
    pub fn push_put(&mut self, put: Put) -> &mut Self {
        self.push(put)
    }

    /// Adds a delete of exactly `key`.
    pub fn delete(&mut self, key: impl Into<Bytes>) -> &mut Self {
        self.push(Delete::key(key))
    }

    /// Adds a prepared [`Delete`] (a single key or a range).
    pub fn push_delete(&mut self, del: Delete) -> &mut Self {
        self.push(del)
    }

    /// Adds a delete of every key in `[from, to)`.
    pub fn delete_range(&mut self, from: impl Into<Bytes>, to: impl Into<Bytes>) -> &mut Self {
        self.push(Delete::between(from, to))
    }

    /// Seals the open txn, if it has any ops.
    pub fn flush(&mut self) {
        if !self.open.ops.is_empty() {
            self.sealed.push_back(self.open.take());
        }
    }

    /// The ops of the oldest sealed txn, without any compares: for a caller
    /// that adds its own guard and ops (within the reserve) when it sends.
    /// Per-op guards, if any were pushed, are dropped: use
    /// [`TxnBatcher::pop_parts`] for those.
    pub fn pop(&mut self) -> Option<Vec<Op>> {
        self.sealed.pop_front().map(|s| s.ops)
    }

    /// The oldest sealed txn's per-op guards and ops, without the shared
    /// compares of [`TxnBatcher::with_compares`].
    pub fn pop_parts(&mut self) -> Option<(Vec<Compare>, Vec<Op>)> {
        self.sealed.pop_front().map(|s| (s.guards, s.ops))
    }

    /// The oldest sealed txn, with the shared compares and its guards.
    pub fn pop_txn(&mut self) -> Option<Txn> {
        let Sealed { guards, ops } = self.sealed.pop_front()?;
        Some(
            Txn::new()
                .when(self.compares.iter().cloned())
                .when(guards)
                .and_then(ops),
        )
    }

    /// Sealed txns waiting to be taken.
    pub fn sealed_len(&self) -> usize {
        self.sealed.len()
    }

    /// Number of txns so far, counting the open one.
    pub fn len(&self) -> usize {
        self.sealed.len() + usize::from(!self.open.ops.is_empty())
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every txn, in order.
    pub fn finish(mut self) -> Vec<Txn> {
        self.flush();
        std::iter::from_fn(|| self.pop_txn()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::PbOp;

    #[test]
    fn op_sizes_add_up_to_the_encoded_txn() {
        let ops: Vec<Op> = vec![
            Put::new("k1", vec![0u8; 300]).lease(LeaseId::new(7)).into(),
            Delete::key("k2").into(),
            Delete::prefix("/p/").into(),
            Put::new(vec![0xffu8; 200], "v").into(),
        ];
        let sum: usize = ops.iter().map(Op::encoded_len).sum();
        assert_eq!(Txn::new().and_then(ops).encoded_len(), sum);
        let c = Compare::create_revision("fence", super::super::kv::CompareOp::Equal, 42);
        let with = Txn::new().when([c.clone()]).and_then([Put::new("k", "v")]);
        assert_eq!(
            with.encoded_len(),
            c.encoded_len() + Op::from(Put::new("k", "v")).encoded_len()
        );
    }

    #[test]
    fn the_reserve_leaves_room_for_the_callers_own_op() {
        let mut b = TxnBatcher::new(TxnLimits::default()).with_reserved(1, 512);
        assert_eq!(b.max_ops(), 127);
        assert_eq!(
            b.max_bytes(),
            DEFAULT_MAX_REQUEST_BYTES - REQUEST_OVERHEAD_BYTES - 512
        );
        for i in 0..300 {
            b.put(format!("k{i:04}"), "v", LeaseId::NONE);
        }
        b.flush();
        let sizes: Vec<usize> = std::iter::from_fn(|| b.pop())
            .map(|ops| ops.len())
            .collect();
        assert_eq!(sizes, [127, 127, 46]);
    }

    fn keys(t: &Txn) -> Vec<String> {
        t.0.success
            .iter()
            .map(|op| match &op.request {
                Some(PbOp::RequestPut(p)) => format!("put {}", String::from_utf8_lossy(&p.key)),
                Some(PbOp::RequestDeleteRange(d)) if d.range_end.is_empty() => {
                    format!("del {}", String::from_utf8_lossy(&d.key))
                }
                Some(PbOp::RequestDeleteRange(d)) => format!(
                    "delrange {}..{}",
                    String::from_utf8_lossy(&d.key),
                    String::from_utf8_lossy(&d.range_end)
                ),
                _ => "other".into(),
            })
            .collect()
    }

    #[test]
    fn guards_travel_with_their_ops_and_count_against_the_limits() {
        let limits = TxnLimits {
            max_ops: 3,
            ..Default::default()
        };
        let mut b = TxnBatcher::new(limits);
        for i in 0..7 {
            let key = format!("g{i}");
            b.push_guarded(
                Put::new(key.clone(), "v"),
                Compare::version(key, super::super::kv::CompareOp::Equal, 0),
            );
        }
        b.flush();
        let parts: Vec<(usize, usize)> = std::iter::from_fn(|| b.pop_parts())
            .map(|(g, o)| (g.len(), o.len()))
            .collect();
        assert_eq!(parts, [(3, 3), (3, 3), (1, 1)]);
        let mut b = TxnBatcher::new(TxnLimits {
            max_ops: 100,
            max_bytes: REQUEST_OVERHEAD_BYTES + 400,
        });
        for i in 0..4 {
            let key = format!("{i:0>60}");
            b.push_guarded(
                Put::new(key.clone(), "v"),
                Compare::version(key, super::super::kv::CompareOp::Equal, 0),
            );
        }
        let txns = b.finish();
        assert!(txns.len() >= 2, "the guards' bytes count");
        assert!(txns.iter().all(|t| t.encoded_len() <= 400));
    }

    #[test]
    fn splits_at_max_ops() {
        let mut b = TxnBatcher::new(TxnLimits {
            max_ops: 128,
            ..Default::default()
        });
        for i in 0..300 {
            b.put(format!("k{i:04}"), "v", LeaseId::NONE);
        }
        let txns = b.finish();
        let sizes: Vec<usize> = txns.iter().map(Txn::success_len).collect();
        assert_eq!(sizes, [128, 128, 44]);
    }

    #[test]
    fn splits_at_max_bytes() {
        let limits = TxnLimits {
            max_ops: 1000,
            max_bytes: 64 * 1024,
        };
        let mut b = TxnBatcher::new(limits);
        let value = vec![7u8; 10 * 1024];
        for i in 0..20 {
            b.put(format!("k{i:02}"), value.clone(), LeaseId::NONE);
        }
        let txns = b.finish();
        assert!(txns.len() >= 4, "{} txns", txns.len());
        for t in &txns {
            assert!(t.encoded_len() <= limits.max_bytes - REQUEST_OVERHEAD_BYTES);
        }
        assert_eq!(txns.iter().map(Txn::success_len).sum::<usize>(), 20);
    }

    #[test]
    fn oversized_op_goes_alone() {
        let limits = TxnLimits {
            max_ops: 10,
            max_bytes: 4096,
        };
        let mut b = TxnBatcher::new(limits);
        b.put("a", "small", LeaseId::NONE)
            .put("big", vec![0u8; 10_000], LeaseId::NONE)
            .put("c", "small", LeaseId::NONE);
        let txns = b.finish();
        assert_eq!(
            txns.iter().map(keys).collect::<Vec<_>>(),
            [vec!["put a"], vec!["put big"], vec!["put c"]]
        );
    }

    #[test]
    fn deduplicates_keys_keeping_the_last_write() {
        let mut b = TxnBatcher::new(TxnLimits::default());
        for i in 0..20 {
            b.put("same", format!("v{i}"), LeaseId::NONE);
        }
        b.delete("gone")
            .put("gone", "back", LeaseId::NONE)
            .put("x", "1", LeaseId::NONE)
            .delete("x");
        let txns = b.finish();
        assert_eq!(txns.len(), 1);
        assert_eq!(keys(&txns[0]), ["put same", "put gone", "del x"]);
        match &txns[0].0.success[0].request {
            Some(PbOp::RequestPut(p)) => assert_eq!(p.value, "v19"),
            _ => panic!("not a put"),
        }
    }

    #[test]
    fn put_under_range_delete_starts_a_new_txn() {
        let mut b = TxnBatcher::new(TxnLimits::default());
        b.put("/a/1", "x", LeaseId::NONE)
            .delete_range("/a/", "/a0")
            .put("/b", "y", LeaseId::NONE)
            .put("/a/2", "z", LeaseId::NONE);
        let txns = b.finish();
        assert_eq!(
            txns.iter().map(keys).collect::<Vec<_>>(),
            [vec!["delrange /a/../a0", "put /b"], vec!["put /a/2"]]
        );
    }

    #[test]
    fn compares_count_against_the_byte_budget() {
        let limits = TxnLimits {
            max_ops: 1000,
            max_bytes: 8 * 1024,
        };
        let big = vec![0u8; 4096];
        let mut b = TxnBatcher::new(limits).with_compares([Compare::value(
            "fence",
            super::super::kv::CompareOp::Equal,
            vec![1u8; 3000],
        )]);
        b.put("a", big.clone(), LeaseId::NONE)
            .put("b", big, LeaseId::NONE);
        let txns = b.finish();
        assert_eq!(txns.len(), 2);
        assert!(txns.iter().all(|t| t.0.compare.len() == 1));
    }

    /// A nested txn is sent in a txn of its own, with its guard, between
    /// the writes pushed before and after it.
    #[test]
    fn a_nested_txn_goes_alone_and_in_order() {
        let nested = Txn::new()
            .when([Compare::version("k", super::super::kv::CompareOp::Equal, 0)])
            .and_then([Put::new("k", "inner")]);
        let mut b = TxnBatcher::new(TxnLimits::default());
        b.put("a", "1", LeaseId::NONE)
            .put("k", "outer", LeaseId::NONE);
        b.push_guarded(
            nested.clone(),
            Compare::version("g", super::super::kv::CompareOp::Equal, 0),
        );
        b.put("k", "after", LeaseId::NONE);
        let mut parts = Vec::new();
        b.flush();
        while let Some((guards, ops)) = b.pop_parts() {
            parts.push((guards.len(), ops));
        }
        let shape: Vec<(usize, Vec<&str>)> = parts
            .iter()
            .map(|(g, ops)| {
                let kinds = ops
                    .iter()
                    .map(|op| match op {
                        Op::Txn(_) => "txn",
                        Op::Put(_) => "put",
                        _ => "other",
                    })
                    .collect();
                (*g, kinds)
            })
            .collect();
        assert_eq!(
            shape,
            [(0, vec!["put", "put"]), (1, vec!["txn"]), (0, vec!["put"])]
        );
        // Its size is counted like any op's.
        let one = Op::from(nested);
        assert_eq!(
            Txn::new().and_then([one.clone()]).encoded_len(),
            one.encoded_len()
        );
    }

    #[test]
    fn finds_every_key_after_the_table_grows_past_its_reserve() {
        // More keys than the 1024 reserved up front: the table re-hashes
        // each key from its op while it grows, and must still find all.
        let limits = TxnLimits {
            max_ops: 3000,
            max_bytes: usize::MAX / 2,
        };
        let mut b = TxnBatcher::new(limits);
        for i in 0..2500 {
            b.put(format!("/k/{i}"), "old", LeaseId::NONE);
        }
        for i in 0..2500 {
            assert!(b.contains(format!("/k/{i}").as_bytes()), "lost /k/{i}");
            b.put(format!("/k/{i}"), "new", LeaseId::NONE);
        }
        assert!(!b.contains(b"/k/2500"));
        let txns = b.finish();
        assert_eq!(txns.len(), 1);
        let req = &txns[0].0;
        assert_eq!(req.success.len(), 2500);
        assert!(req.success.iter().all(|op| matches!(
            &op.request,
            Some(PbOp::RequestPut(p)) if &p.value[..] == b"new"
        )));
    }
}
