//! The KV requests and their answers.
//!
//! Request types are thin wrappers over the generated messages, so building
//! one costs nothing extra and a key or value taken from a watch event goes
//! into a put as the same `Bytes`, without a copy.

use bytes::Bytes;

use crate::header::Header;
use crate::lease_id::LeaseId;
use crate::pb::{
    PbCompare, PbDeleteRangeRequest, PbDeleteRangeResponse, PbKeyValue, PbOp, PbOpResponse,
    PbPutRequest, PbPutResponse, PbRangeRequest, PbRangeResponse, PbRequestOp, PbTxnRequest,
    PbTxnResponse, pb_compare,
};

/// The end of the range holding every key that starts with `prefix`.
///
/// An empty prefix, or one of only `0xff` bytes, yields `[0]`: "to the end
/// of the keyspace" in etcd's convention.
pub fn prefix_end(prefix: &[u8]) -> Bytes {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Bytes::from(end);
        }
    }
    Bytes::from_static(&[0])
}

/// `prefix` and its [`prefix_end`]: the bounds of a prefix request, for
/// every request type that takes one.
pub(crate) fn prefix_range(prefix: impl Into<Bytes>) -> (Bytes, Bytes) {
    let key = prefix.into();
    let end = prefix_end(&key);
    (key, end)
}

/// The range end that means "every key from the start on" (etcd's `"\0"`).
const FROM_KEY_END: Bytes = Bytes::from_static(&[0]);

/// The start of a from-key or prefix range: etcd refuses an empty key in a
/// range or delete ("key is not provided"), and `[0]` is the smallest key
/// there is.
fn from_key_start(key: Bytes) -> Bytes {
    if key.is_empty() {
        Bytes::from_static(&[0])
    } else {
        key
    }
}

/// A key and its value with etcd's metadata.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyValue(pub(crate) PbKeyValue);

impl KeyValue {
    /// The key.
    pub fn key(&self) -> &Bytes {
        &self.0.key
    }
    /// The value.
    pub fn value(&self) -> &Bytes {
        &self.0.value
    }
    /// The lease attached to the key ([`LeaseId::NONE`] for none).
    pub fn lease(&self) -> LeaseId {
        LeaseId::new(self.0.lease)
    }
    /// The revision of the key's last modification.
    pub fn mod_revision(&self) -> i64 {
        self.0.mod_revision
    }
    /// The revision at which the key was created.
    pub fn create_revision(&self) -> i64 {
        self.0.create_revision
    }
    /// How many times the key was written since it was created.
    pub fn version(&self) -> i64 {
        self.0.version
    }
    /// Takes the key and value out.
    pub fn into_key_value(self) -> (Bytes, Bytes) {
        (self.0.key, self.0.value)
    }
}

impl std::fmt::Debug for KeyValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyValue")
            .field("key", &self.0.key)
            .field("value_len", &self.0.value.len())
            .field("mod_revision", &self.0.mod_revision)
            .field("lease", &self.0.lease)
            .finish()
    }
}

/// A range request: one key, a key range, or a prefix.
#[derive(Clone, Debug)]
pub struct Range(pub(crate) PbRangeRequest);

impl Range {
    /// Exactly `key`.
    pub fn key(key: impl Into<Bytes>) -> Range {
        Range::between(key, Bytes::new())
    }
    /// Every key starting with `prefix`; an empty `prefix` is every key.
    pub fn prefix(prefix: impl Into<Bytes>) -> Range {
        let (key, range_end) = prefix_range(prefix);
        Range::between(from_key_start(key), range_end)
    }
    /// Every key at or after `key` (byte order), to the end of the
    /// keyspace; inside a [`Namespace`](crate::Namespace), to the end of
    /// the namespace. An empty `key` is every key.
    #[must_use]
    pub fn from_key(key: impl Into<Bytes>) -> Range {
        Range::between(from_key_start(key.into()), FROM_KEY_END)
    }
    /// Keys in `[from, to)`.
    pub fn between(from: impl Into<Bytes>, to: impl Into<Bytes>) -> Range {
        Range(PbRangeRequest {
            key: from.into(),
            range_end: to.into(),
            ..Default::default()
        })
    }
    /// Return at most `limit` keys (0: no limit).
    pub fn limit(mut self, limit: i64) -> Self {
        self.0.limit = limit;
        self
    }
    /// Read at this revision (0: the latest).
    pub fn revision(mut self, revision: i64) -> Self {
        self.0.revision = revision;
        self
    }
    /// Return keys without values.
    pub fn keys_only(mut self) -> Self {
        self.0.keys_only = true;
        self
    }
    /// Return only the count.
    pub fn count_only(mut self) -> Self {
        self.0.count_only = true;
        self
    }
    /// Serve from the contacted member without a quorum read.
    pub fn serializable(mut self) -> Self {
        self.0.serializable = true;
        self
    }
}

/// The answer to a [`Range`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RangeResponse {
    /// The response header.
    pub header: Header,
    pub(crate) kvs: Vec<KeyValue>,
    /// Whether the limit cut the result short.
    pub more: bool,
    /// The number of keys in the range, regardless of the limit.
    pub count: i64,
}

impl From<PbRangeResponse> for RangeResponse {
    fn from(r: PbRangeResponse) -> Self {
        RangeResponse {
            header: r.header.into(),
            kvs: r.kvs.into_iter().map(KeyValue).collect(),
            more: r.more,
            count: r.count,
        }
    }
}

impl RangeResponse {
    /// The keys returned.
    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }
    /// Takes the keys out.
    pub fn into_kvs(self) -> Vec<KeyValue> {
        self.kvs
    }
}

/// A put request.
#[derive(Clone, Debug)]
pub struct Put(pub(crate) PbPutRequest);

impl Put {
    /// Put `value` at `key`.
    pub fn new(key: impl Into<Bytes>, value: impl Into<Bytes>) -> Put {
        Put(PbPutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        })
    }
    /// Attach the key to this lease ([`LeaseId::NONE`]: none).
    #[must_use]
    pub fn lease(mut self, lease: LeaseId) -> Self {
        self.0.lease = lease.get();
        self
    }
    /// Return the previous key-value.
    pub fn prev_kv(mut self) -> Self {
        self.0.prev_kv = true;
        self
    }
    /// Keep the key's current value: the put changes only its lease (and
    /// revisions). The put's value must be empty, or etcd refuses it with
    /// [`Error::ValueProvided`]; a key that does not exist fails with
    /// [`Error::KeyNotFound`] (in a txn, the whole txn fails).
    ///
    /// ```
    /// use aether_etcd::{LeaseId, Put};
    /// // Move /k to lease 7, value untouched.
    /// let relet = Put::new("/k", "").ignore_value().lease(LeaseId::new(7));
    /// # let _ = relet;
    /// ```
    ///
    /// [`Error::ValueProvided`]: crate::Error::ValueProvided
    /// [`Error::KeyNotFound`]: crate::Error::KeyNotFound
    #[must_use]
    pub fn ignore_value(mut self) -> Self {
        self.0.ignore_value = true;
        self
    }
    /// Keep the key's current lease: the put changes only its value. The
    /// put's lease must be 0, or etcd refuses it with
    /// [`Error::LeaseProvided`]; a key that does not exist fails with
    /// [`Error::KeyNotFound`].
    ///
    /// [`Error::LeaseProvided`]: crate::Error::LeaseProvided
    /// [`Error::KeyNotFound`]: crate::Error::KeyNotFound
    #[must_use]
    pub fn ignore_lease(mut self) -> Self {
        self.0.ignore_lease = true;
        self
    }
    /// The key it writes.
    pub fn key(&self) -> &Bytes {
        &self.0.key
    }
    /// The value it writes.
    pub fn value(&self) -> &Bytes {
        &self.0.value
    }
    /// The lease it attaches the key to ([`LeaseId::NONE`]: none).
    pub fn lease_id(&self) -> LeaseId {
        LeaseId::new(self.0.lease)
    }
}

/// The answer to a [`Put`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PutResponse {
    /// The response header; its revision is the put's.
    pub header: Header,
    /// The previous key-value, if asked for and present.
    pub prev_kv: Option<KeyValue>,
}

impl From<PbPutResponse> for PutResponse {
    fn from(r: PbPutResponse) -> Self {
        PutResponse {
            header: r.header.into(),
            prev_kv: r.prev_kv.map(|kv| KeyValue(*kv)),
        }
    }
}

/// A delete request: one key, a key range, or a prefix.
#[derive(Clone, Debug)]
pub struct Delete(pub(crate) PbDeleteRangeRequest);

impl Delete {
    /// Exactly `key`.
    pub fn key(key: impl Into<Bytes>) -> Delete {
        Delete::between(key, Bytes::new())
    }
    /// Every key starting with `prefix`; an empty `prefix` is every key.
    pub fn prefix(prefix: impl Into<Bytes>) -> Delete {
        let (key, range_end) = prefix_range(prefix);
        Delete::between(from_key_start(key), range_end)
    }
    /// Every key at or after `key` (byte order), to the end of the
    /// keyspace; inside a [`Namespace`](crate::Namespace), to the end of
    /// the namespace. An empty `key` is every key.
    #[must_use]
    pub fn from_key(key: impl Into<Bytes>) -> Delete {
        Delete::between(from_key_start(key.into()), FROM_KEY_END)
    }
    /// Keys in `[from, to)`.
    pub fn between(from: impl Into<Bytes>, to: impl Into<Bytes>) -> Delete {
        Delete(PbDeleteRangeRequest {
            key: from.into(),
            range_end: to.into(),
            ..Default::default()
        })
    }
    /// Return the deleted key-values.
    pub fn prev_kv(mut self) -> Self {
        self.0.prev_kv = true;
        self
    }
    /// The first key it deletes and the end of its range (empty for
    /// exactly one key).
    pub fn bounds(&self) -> (&Bytes, &Bytes) {
        (&self.0.key, &self.0.range_end)
    }
}

/// The answer to a [`Delete`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DeleteResponse {
    /// The response header.
    pub header: Header,
    /// How many keys were deleted.
    pub deleted: i64,
    /// The deleted key-values, if asked for.
    pub prev_kvs: Vec<KeyValue>,
}

impl From<PbDeleteRangeResponse> for DeleteResponse {
    fn from(r: PbDeleteRangeResponse) -> Self {
        DeleteResponse {
            header: r.header.into(),
            deleted: r.deleted,
            prev_kvs: r.prev_kvs.into_iter().map(KeyValue).collect(),
        }
    }
}

/// How a [`Compare`] relates the stored value to the given one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    /// `==`
    Equal,
    /// `!=`
    NotEqual,
    /// `>`
    Greater,
    /// `<`
    Less,
}

impl CompareOp {
    fn pb(self) -> i32 {
        use pb_compare::CompareResult as R;
        (match self {
            CompareOp::Equal => R::Equal,
            CompareOp::NotEqual => R::NotEqual,
            CompareOp::Greater => R::Greater,
            CompareOp::Less => R::Less,
        }) as i32
    }
}

/// A txn guard on one key.
#[derive(Clone, Debug)]
pub struct Compare(pub(crate) PbCompare);

impl Compare {
    fn new(
        key: Bytes,
        op: CompareOp,
        target: pb_compare::CompareTarget,
        u: pb_compare::TargetUnion,
    ) -> Self {
        Compare(PbCompare {
            key,
            result: op.pb(),
            target: target as i32,
            target_union: Some(u),
            range_end: Bytes::new(),
        })
    }
    /// Compares the key's value.
    pub fn value(key: impl Into<Bytes>, op: CompareOp, value: impl Into<Bytes>) -> Self {
        use pb_compare::{CompareTarget as T, TargetUnion as U};
        Self::new(key.into(), op, T::Value, U::Value(value.into()))
    }
    /// Compares the key's version (0 when the key does not exist).
    pub fn version(key: impl Into<Bytes>, op: CompareOp, version: i64) -> Self {
        use pb_compare::{CompareTarget as T, TargetUnion as U};
        Self::new(key.into(), op, T::Version, U::Version(version))
    }
    /// Compares the key's create revision (0 when the key does not exist).
    pub fn create_revision(key: impl Into<Bytes>, op: CompareOp, rev: i64) -> Self {
        use pb_compare::{CompareTarget as T, TargetUnion as U};
        Self::new(key.into(), op, T::Create, U::CreateRevision(rev))
    }
    /// Compares the key's mod revision (0 when the key does not exist).
    pub fn mod_revision(key: impl Into<Bytes>, op: CompareOp, rev: i64) -> Self {
        use pb_compare::{CompareTarget as T, TargetUnion as U};
        Self::new(key.into(), op, T::Mod, U::ModRevision(rev))
    }
    /// Applies the comparison to every key in `[key, range_end)` instead of
    /// one key (etcd >= 3.3); all of them must satisfy it.
    pub fn with_range_end(mut self, range_end: impl Into<Bytes>) -> Self {
        self.0.range_end = range_end.into();
        self
    }

    /// Compares the key's lease.
    pub fn lease(key: impl Into<Bytes>, op: CompareOp, lease: LeaseId) -> Self {
        use pb_compare::{CompareTarget as T, TargetUnion as U};
        Self::new(key.into(), op, T::Lease, U::Lease(lease.get()))
    }
}

/// One operation inside a txn.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Op {
    /// A range.
    Range(Range),
    /// A put.
    Put(Put),
    /// A delete.
    Delete(Delete),
    /// A nested txn, run if its branch runs; its result is an
    /// [`OpResponse::Txn`]. etcd evaluates the compares of every level
    /// first, against the store as it was before the outer txn: a nested
    /// compare does not see the writes of the ops before it (its ranges
    /// do). etcd refuses it if it writes a key that another op of the same
    /// branch writes ([`Error::DuplicateKey`](crate::Error::DuplicateKey)).
    /// Against `--max-txn-ops` it gets what its parent left: each of its
    /// lists (compares, either branch) may hold the limit less the longest
    /// of its parent's lists, or the txn is
    /// [`Error::TooManyOps`](crate::Error::TooManyOps).
    Txn(Txn),
}

impl Op {
    /// The one key a put or single-key delete writes; `None` for a range
    /// delete, a read or a nested txn.
    pub fn key(&self) -> Option<&Bytes> {
        match self {
            Op::Put(p) => Some(&p.0.key),
            Op::Delete(d) if d.0.range_end.is_empty() => Some(&d.0.key),
            _ => None,
        }
    }

    /// What this op adds to an encoded txn request, in bytes: what the
    /// server's `--max-request-bytes` counts.
    pub fn encoded_len(&self) -> usize {
        use prost::Message;
        let inner = match self {
            Op::Range(r) => r.0.encoded_len(),
            Op::Put(p) => p.0.encoded_len(),
            Op::Delete(d) => d.0.encoded_len(),
            Op::Txn(t) => t.0.encoded_len(),
        };
        // The op's field inside `RequestOp`, then `RequestOp` inside the
        // txn's branch: a one-byte tag and a length prefix each.
        let body = 1 + prost::encoding::encoded_len_varint(inner as u64) + inner;
        1 + prost::encoding::encoded_len_varint(body as u64) + body
    }
}

impl From<Op> for PbRequestOp {
    fn from(op: Op) -> Self {
        PbRequestOp {
            request: Some(match op {
                Op::Range(r) => PbOp::RequestRange(r.0),
                Op::Put(p) => PbOp::RequestPut(p.0),
                Op::Delete(d) => PbOp::RequestDeleteRange(d.0),
                Op::Txn(t) => PbOp::RequestTxn(t.0),
            }),
        }
    }
}
impl From<Put> for Op {
    fn from(p: Put) -> Self {
        Op::Put(p)
    }
}
impl From<Delete> for Op {
    fn from(d: Delete) -> Self {
        Op::Delete(d)
    }
}
impl From<Range> for Op {
    fn from(r: Range) -> Self {
        Op::Range(r)
    }
}
impl From<Txn> for Op {
    fn from(t: Txn) -> Self {
        Op::Txn(t)
    }
}

/// A transaction: if every compare holds, the success ops run, otherwise
/// the failure ops. Either way it is one revision.
#[derive(Clone, Debug, Default)]
pub struct Txn(pub(crate) PbTxnRequest);

impl Txn {
    /// An empty txn (no compares: the success branch runs).
    pub fn new() -> Self {
        Txn::default()
    }
    /// Adds compares; all must hold.
    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Self {
        self.0.compare.extend(compares.into_iter().map(|c| c.0));
        self
    }
    /// Adds ops to the success branch.
    pub fn and_then<O: Into<Op>>(mut self, ops: impl IntoIterator<Item = O>) -> Self {
        self.0
            .success
            .extend(ops.into_iter().map(|o| o.into().into()));
        self
    }
    /// Adds ops to the failure branch.
    pub fn or_else<O: Into<Op>>(mut self, ops: impl IntoIterator<Item = O>) -> Self {
        self.0
            .failure
            .extend(ops.into_iter().map(|o| o.into().into()));
        self
    }
    /// Number of ops in the success branch.
    pub fn success_len(&self) -> usize {
        self.0.success.len()
    }
    /// The encoded size of the request in bytes.
    pub fn encoded_len(&self) -> usize {
        prost::Message::encoded_len(&self.0)
    }
    /// Number of compares.
    pub fn compare_len(&self) -> usize {
        self.0.compare.len()
    }
}

impl Compare {
    /// What this compare adds to an encoded txn request, in bytes.
    pub fn encoded_len(&self) -> usize {
        let n = prost::Message::encoded_len(&self.0);
        1 + prost::encoding::encoded_len_varint(n as u64) + n
    }
}

/// The result of one op of a txn.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum OpResponse {
    /// A range's result.
    Range(RangeResponse),
    /// A put's result.
    Put(PutResponse),
    /// A delete's result.
    Delete(DeleteResponse),
    /// A nested txn's result ([`Op::Txn`]): which branch ran and its
    /// results.
    Txn(Box<TxnResponse>),
}

/// The answer to a [`Txn`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TxnResponse {
    /// The response header; its revision is the txn's.
    pub header: Header,
    /// Whether the compares held.
    pub succeeded: bool,
    /// The results of the branch that ran, in order.
    pub responses: Vec<OpResponse>,
}

impl From<PbTxnResponse> for TxnResponse {
    fn from(r: PbTxnResponse) -> Self {
        TxnResponse {
            header: r.header.into(),
            succeeded: r.succeeded,
            responses: r
                .responses
                .into_iter()
                .filter_map(|o| o.response)
                .map(|o| match o {
                    PbOpResponse::ResponseRange(r) => OpResponse::Range(r.into()),
                    PbOpResponse::ResponsePut(p) => OpResponse::Put(p.into()),
                    PbOpResponse::ResponseDeleteRange(d) => OpResponse::Delete(d.into()),
                    PbOpResponse::ResponseTxn(t) => OpResponse::Txn(Box::new((t).into())),
                })
                .collect(),
        }
    }
}

impl From<PbKeyValue> for KeyValue {
    fn from(kv: PbKeyValue) -> Self {
        KeyValue(kv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"/a/"), Bytes::from_static(b"/a0"));
        assert_eq!(prefix_end(b"a\xff"), Bytes::from_static(b"b"));
        assert_eq!(prefix_end(b"\xff\xff"), Bytes::from_static(&[0]));
        assert_eq!(prefix_end(b""), Bytes::from_static(&[0]));
    }

    #[test]
    fn txn_builder_fills_branches() {
        let t = Txn::new()
            .when([Compare::mod_revision("k", CompareOp::Equal, 3)])
            .and_then([Put::new("k", "v")])
            .or_else([Range::key("k")]);
        assert_eq!(t.0.compare.len(), 1);
        assert_eq!(t.success_len(), 1);
        assert_eq!(t.0.failure.len(), 1);
        assert!(t.encoded_len() > 0);
    }

    #[test]
    fn a_nested_txn_is_a_request_txn_op_of_its_size() {
        let inner = Txn::new()
            .when([Compare::value("k", CompareOp::Equal, "v").with_range_end("l")])
            .and_then([Put::new("k", "w")])
            .or_else([Delete::from_key("m").prev_kv()]);
        let op = Op::from(inner.clone());
        assert!(op.key().is_none());
        let outer = Txn::new().and_then([op.clone()]).or_else([Range::key("k")]);
        match &outer.0.success[0].request {
            Some(PbOp::RequestTxn(t)) => assert_eq!(t, &inner.0),
            other => panic!("not a nested txn: {other:?}"),
        }
        // One op in each branch: the nested one and the range.
        let range = Op::from(Range::key("k"));
        assert_eq!(outer.encoded_len(), op.encoded_len() + range.encoded_len());
    }

    #[test]
    fn put_keeps_value_or_lease_and_from_key_bounds() {
        let p = Put::new("k", "").ignore_value().lease(LeaseId::new(7));
        assert!(p.0.ignore_value && !p.0.ignore_lease && p.0.lease == 7);
        let p = Put::new("k", "v").ignore_lease();
        assert!(p.0.ignore_lease && !p.0.ignore_value);
        let r = Range::from_key("/m");
        assert_eq!((&r.0.key[..], &r.0.range_end[..]), (&b"/m"[..], &[0u8][..]));
        // etcd refuses an empty key: everything starts at [0].
        let r = Range::from_key("");
        assert_eq!((&r.0.key[..], &r.0.range_end[..]), (&[0u8][..], &[0u8][..]));
        let d = Delete::from_key("");
        assert_eq!(
            d.bounds(),
            (&Bytes::from_static(&[0]), &Bytes::from_static(&[0]))
        );
        let d = Delete::prefix("");
        assert_eq!(
            d.bounds(),
            (&Bytes::from_static(&[0]), &Bytes::from_static(&[0]))
        );
        let r = Range::prefix("/p/").min_mod_revision(3).max_mod_revision(9);
        assert_eq!(&r.0.key[..], b"/p/");
        assert_eq!((r.0.min_mod_revision, r.0.max_mod_revision), (3, 9));
    }
}
