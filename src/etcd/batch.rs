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

use std::collections::HashMap;

use bytes::Bytes;

use super::kv::{Compare, Delete, Put, Txn};
use super::pb::{PbDeleteRangeRequest, PbOp, PbPutRequest, PbRequestOp};

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

/// The size one op adds to an encoded `TxnRequest` (field tag, length
/// prefix and body).
pub(crate) fn op_encoded_len(op: &PbRequestOp) -> usize {
    let body = prost::Message::encoded_len(op);
    1 + prost::encoding::encoded_len_varint(body as u64) + body
}

pub(crate) fn put_op(key: Bytes, value: Bytes, lease: i64) -> PbRequestOp {
    PbRequestOp {
        request: Some(PbOp::RequestPut(PbPutRequest {
            key,
            value,
            lease,
            ..Default::default()
        })),
    }
}

pub(crate) fn delete_op(key: Bytes, range_end: Bytes) -> PbRequestOp {
    PbRequestOp {
        request: Some(PbOp::RequestDeleteRange(PbDeleteRangeRequest {
            key,
            range_end,
            ..Default::default()
        })),
    }
}

/// The value a put op writes, if it is a put.
pub(crate) fn op_put_value(op: &PbRequestOp) -> Option<Bytes> {
    match &op.request {
        Some(PbOp::RequestPut(p)) => Some(p.value.clone()),
        _ => None,
    }
}

/// One txn's success branch being filled, with de-duplication by key.
#[derive(Default)]
pub(crate) struct TxnBuilder {
    ops: Vec<PbRequestOp>,
    bytes: usize,
    /// Single-key writes: key → index in `ops`.
    keys: HashMap<Bytes, usize>,
    /// Range deletes in this txn, as `[from, to)`.
    ranges: Vec<(Bytes, Bytes)>,
}

impl TxnBuilder {
    pub(crate) fn len(&self) -> usize {
        self.ops.len()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
    /// Whether `key` is already written by this txn.
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        self.keys.contains_key(key)
    }
    /// Whether a range delete in this txn covers `key`.
    pub(crate) fn covered(&self, key: &[u8]) -> bool {
        self.ranges.iter().any(|(from, to)| in_range(key, from, to))
    }

    /// Adds a single-key write, replacing an earlier write to the same key.
    /// The caller checks [`TxnBuilder::covered`] first.
    pub(crate) fn push_key(&mut self, key: Bytes, op: PbRequestOp) {
        let len = op_encoded_len(&op);
        match self.keys.get(&key) {
            Some(&i) => {
                self.bytes = self.bytes - op_encoded_len(&self.ops[i]) + len;
                self.ops[i] = op;
            }
            None => {
                self.keys.insert(key, self.ops.len());
                self.ops.push(op);
                self.bytes += len;
            }
        }
    }

    /// Adds a range delete, dropping the writes it supersedes.
    pub(crate) fn push_range_delete(&mut self, from: Bytes, to: Bytes) {
        if self.keys.keys().any(|k| in_range(k, &from, &to)) {
            let old = std::mem::take(&mut self.ops);
            self.keys.clear();
            self.bytes = 0;
            let ranges = std::mem::take(&mut self.ranges);
            for op in old {
                match op_key(&op) {
                    Some(k) if in_range(&k, &from, &to) => {}
                    Some(k) => self.push_key(k, op),
                    None => {
                        self.bytes += op_encoded_len(&op);
                        self.ops.push(op);
                    }
                }
            }
            self.ranges = ranges;
        }
        let op = delete_op(from.clone(), to.clone());
        self.bytes += op_encoded_len(&op);
        self.ops.push(op);
        self.ranges.push((from, to));
    }

    pub(crate) fn take(&mut self) -> Vec<PbRequestOp> {
        self.keys.clear();
        self.ranges.clear();
        self.bytes = 0;
        std::mem::take(&mut self.ops)
    }
}

/// The single key a put or single-key delete writes.
pub(crate) fn op_key(op: &PbRequestOp) -> Option<Bytes> {
    match &op.request {
        Some(PbOp::RequestPut(p)) => Some(p.key.clone()),
        Some(PbOp::RequestDeleteRange(d)) if d.range_end.is_empty() => Some(d.key.clone()),
        _ => None,
    }
}

fn in_range(key: &[u8], from: &[u8], to: &[u8]) -> bool {
    // etcd: range_end "\0" means "to the end of the keyspace".
    key >= from && (to == [0] || key < to)
}

/// Packs puts and deletes into the fewest txns within [`TxnLimits`].
///
/// ```
/// use aether_replicator::etcd::{TxnBatcher, TxnLimits};
///
/// let mut b = TxnBatcher::new(TxnLimits { max_ops: 2, ..TxnLimits::default() });
/// b.put("a", "1", 0).put("b", "2", 0).put("a", "3", 0).delete("c");
/// // "a" is written twice in the first txn, so the later write replaces the
/// // earlier one: [a=3, b=2] then [delete c].
/// let txns = b.finish();
/// assert_eq!(txns.iter().map(|t| t.success_len()).collect::<Vec<_>>(), [2, 1]);
/// ```
pub struct TxnBatcher {
    limits: TxnLimits,
    compares: Vec<Compare>,
    cur: TxnBuilder,
    done: Vec<Txn>,
}

impl TxnBatcher {
    /// A batcher for a server with these limits.
    pub fn new(limits: TxnLimits) -> Self {
        TxnBatcher {
            limits,
            compares: Vec::new(),
            cur: TxnBuilder::default(),
            done: Vec::new(),
        }
    }

    /// Puts these compares on every txn produced (for example a fencing
    /// guard). They count against the limits.
    pub fn with_compares(mut self, compares: impl IntoIterator<Item = Compare>) -> Self {
        self.compares.extend(compares);
        self
    }

    fn budget_bytes(&self) -> usize {
        let compares: usize = self
            .compares
            .iter()
            .map(|c| {
                let n = prost::Message::encoded_len(&c.0);
                1 + prost::encoding::encoded_len_varint(n as u64) + n
            })
            .sum();
        self.limits
            .max_bytes
            .saturating_sub(REQUEST_OVERHEAD_BYTES + compares)
    }

    fn fits(&self, extra: usize, new_op: bool) -> bool {
        self.cur.is_empty()
            || ((self.cur.len() + usize::from(new_op)) <= self.limits.max_ops
                && self.cur.bytes() + extra <= self.budget_bytes())
    }

    fn push_key(&mut self, key: Bytes, op: PbRequestOp) {
        if self.cur.covered(&key) {
            self.flush();
        }
        let new_key = !self.cur.contains(&key);
        if !self.fits(op_encoded_len(&op), new_key) {
            self.flush();
        }
        self.cur.push_key(key, op);
    }

    /// Adds a put of `value` at `key` under `lease` (0: none).
    pub fn put(&mut self, key: impl Into<Bytes>, value: impl Into<Bytes>, lease: i64) -> &mut Self {
        let key = key.into();
        self.push_key(key.clone(), put_op(key, value.into(), lease));
        self
    }

    /// Adds a prepared [`Put`].
    pub fn push_put(&mut self, put: Put) -> &mut Self {
        let key = put.0.key.clone();
        self.push_key(
            key,
            PbRequestOp {
                request: Some(PbOp::RequestPut(put.0)),
            },
        );
        self
    }

    /// Adds a delete of exactly `key`.
    pub fn delete(&mut self, key: impl Into<Bytes>) -> &mut Self {
        let key = key.into();
        self.push_key(key.clone(), delete_op(key, Bytes::new()));
        self
    }

    /// Adds a prepared [`Delete`] (a single key or a range).
    pub fn push_delete(&mut self, del: Delete) -> &mut Self {
        if del.0.range_end.is_empty() {
            return self.delete(del.0.key);
        }
        self.delete_range(del.0.key, del.0.range_end)
    }

    /// Adds a delete of every key in `[from, to)`.
    pub fn delete_range(&mut self, from: impl Into<Bytes>, to: impl Into<Bytes>) -> &mut Self {
        let (from, to) = (from.into(), to.into());
        let op = delete_op(from.clone(), to.clone());
        if !self.fits(op_encoded_len(&op), true) {
            self.flush();
        }
        self.cur.push_range_delete(from, to);
        self
    }

    /// Closes the txn being filled, if it has any ops.
    pub fn flush(&mut self) {
        if self.cur.is_empty() {
            return;
        }
        let mut txn = Txn::new().when(self.compares.iter().cloned());
        txn.0.success = self.cur.take();
        self.done.push(txn);
    }

    /// Number of txns so far, counting the one being filled.
    pub fn len(&self) -> usize {
        self.done.len() + usize::from(!self.cur.is_empty())
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every txn, in order.
    pub fn finish(mut self) -> Vec<Txn> {
        self.flush();
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn splits_at_max_ops() {
        let mut b = TxnBatcher::new(TxnLimits {
            max_ops: 128,
            ..Default::default()
        });
        for i in 0..300 {
            b.put(format!("k{i:04}"), "v", 0);
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
            b.put(format!("k{i:02}"), value.clone(), 0);
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
        b.put("a", "small", 0)
            .put("big", vec![0u8; 10_000], 0)
            .put("c", "small", 0);
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
            b.put("same", format!("v{i}"), 0);
        }
        b.delete("gone")
            .put("gone", "back", 0)
            .put("x", "1", 0)
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
        b.put("/a/1", "x", 0)
            .delete_range("/a/", "/a0")
            .put("/b", "y", 0)
            .put("/a/2", "z", 0);
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
        b.put("a", big.clone(), 0).put("b", big, 0);
        let txns = b.finish();
        assert_eq!(txns.len(), 2);
        assert!(txns.iter().all(|t| t.0.compare.len() == 1));
    }
}
