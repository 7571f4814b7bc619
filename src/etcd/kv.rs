//! The KV service: range, put, delete, txn, compact, and paginated scans.
//!
//! Request types are thin wrappers over the generated messages, so building
//! one costs nothing extra and a key or value taken from a watch event goes
//! into a put as the same `Bytes`, without a copy.

use bytes::Bytes;

use super::client::Client;
use super::error::Result;
use super::pb::{
    PbCompactionRequest, PbCompare, PbDeleteRangeRequest, PbDeleteRangeResponse, PbKeyValue,
    PbKvClient, PbOp, PbOpResponse, PbPutRequest, PbPutResponse, PbRangeRequest, PbRangeResponse,
    PbRequestOp, PbResponseHeader, PbTxnRequest, PbTxnResponse, pb_compare,
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

/// The header etcd puts on every response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// The cluster that served it. A store restored from a snapshot, or
    /// wiped and restarted with the same name, peer URLs and token, keeps
    /// its cluster id: only its revision goes back.
    pub cluster_id: u64,
    /// The store revision when the request was served.
    pub revision: i64,
    /// The member that served it.
    pub member_id: u64,
    /// The raft term.
    pub raft_term: u64,
}

impl From<Option<PbResponseHeader>> for Header {
    fn from(h: Option<PbResponseHeader>) -> Self {
        let h = h.unwrap_or_default();
        Header {
            cluster_id: h.cluster_id,
            revision: h.revision,
            member_id: h.member_id,
            raft_term: h.raft_term,
        }
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
    /// The lease attached to the key, 0 for none.
    pub fn lease(&self) -> i64 {
        self.0.lease
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
        Range(PbRangeRequest {
            key: key.into(),
            ..Default::default()
        })
    }
    /// Every key starting with `prefix`.
    pub fn prefix(prefix: impl Into<Bytes>) -> Range {
        let key = prefix.into();
        let range_end = prefix_end(&key);
        Range(PbRangeRequest {
            key,
            range_end,
            ..Default::default()
        })
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
pub struct RangeResponse {
    /// The response header.
    pub header: Header,
    pub(crate) kvs: Vec<KeyValue>,
    /// Whether the limit cut the result short.
    pub more: bool,
    /// The number of keys in the range, regardless of the limit.
    pub count: i64,
}

impl RangeResponse {
    fn from_pb(r: PbRangeResponse) -> Self {
        RangeResponse {
            header: r.header.into(),
            kvs: r.kvs.into_iter().map(KeyValue).collect(),
            more: r.more,
            count: r.count,
        }
    }
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
    /// Attach the key to this lease.
    pub fn lease(mut self, lease: i64) -> Self {
        self.0.lease = lease;
        self
    }
    /// Return the previous key-value.
    pub fn prev_kv(mut self) -> Self {
        self.0.prev_kv = true;
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
    /// The lease it attaches the key to (0: none).
    pub fn lease_id(&self) -> i64 {
        self.0.lease
    }
}

/// The answer to a [`Put`].
#[derive(Clone, Debug)]
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
            prev_kv: r.prev_kv.map(KeyValue),
        }
    }
}

/// A delete request: one key, a key range, or a prefix.
#[derive(Clone, Debug)]
pub struct Delete(pub(crate) PbDeleteRangeRequest);

impl Delete {
    /// Exactly `key`.
    pub fn key(key: impl Into<Bytes>) -> Delete {
        Delete(PbDeleteRangeRequest {
            key: key.into(),
            ..Default::default()
        })
    }
    /// Every key starting with `prefix`.
    pub fn prefix(prefix: impl Into<Bytes>) -> Delete {
        let key = prefix.into();
        let range_end = prefix_end(&key);
        Delete(PbDeleteRangeRequest {
            key,
            range_end,
            ..Default::default()
        })
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
    pub fn lease(key: impl Into<Bytes>, op: CompareOp, lease: i64) -> Self {
        use pb_compare::{CompareTarget as T, TargetUnion as U};
        Self::new(key.into(), op, T::Lease, U::Lease(lease))
    }
}

/// One operation inside a txn.
#[derive(Clone, Debug)]
pub enum Op {
    /// A range.
    Range(Range),
    /// A put.
    Put(Put),
    /// A delete.
    Delete(Delete),
}

impl Op {
    /// The one key a put or single-key delete writes; `None` for a range
    /// delete or a read.
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
pub enum OpResponse {
    /// A range's result.
    Range(RangeResponse),
    /// A put's result.
    Put(PutResponse),
    /// A delete's result.
    Delete(DeleteResponse),
    /// A nested txn's result (not built by this client, but decoded).
    Txn(Box<TxnResponse>),
}

/// The answer to a [`Txn`].
#[derive(Clone, Debug)]
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
                    PbOpResponse::ResponseRange(r) => OpResponse::Range(RangeResponse::from_pb(r)),
                    PbOpResponse::ResponsePut(p) => OpResponse::Put(p.into()),
                    PbOpResponse::ResponseDeleteRange(d) => OpResponse::Delete(d.into()),
                    PbOpResponse::ResponseTxn(t) => OpResponse::Txn(Box::new((t).into())),
                })
                .collect(),
        }
    }
}

impl Client {
    fn kv(&self, svc: super::transport::Svc) -> PbKvClient<super::transport::Svc> {
        PbKvClient::new(svc)
            .max_decoding_message_size(self.max_decoding())
            .max_encoding_message_size(self.max_encoding())
    }

    /// Reads a key, a range or a prefix.
    pub async fn range(&self, req: Range) -> Result<RangeResponse> {
        let resp = self
            .unary(req.0, |svc, r| {
                let mut kv = self.kv(svc);
                async move { kv.range(r).await }
            })
            .await?;
        Ok(RangeResponse::from_pb(resp))
    }

    /// Writes a key.
    pub async fn put(&self, req: Put) -> Result<PutResponse> {
        let resp = self
            .unary(req.0, |svc, r| {
                let mut kv = self.kv(svc);
                async move { kv.put(r).await }
            })
            .await?;
        Ok(resp.into())
    }

    /// Deletes a key, a range or a prefix.
    pub async fn delete(&self, req: Delete) -> Result<DeleteResponse> {
        let resp = self
            .unary(req.0, |svc, r| {
                let mut kv = self.kv(svc);
                async move { kv.delete_range(r).await }
            })
            .await?;
        Ok(resp.into())
    }

    /// Runs a transaction.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let resp = self
            .unary(txn.0, |svc, r| {
                let mut kv = self.kv(svc);
                async move { kv.txn(r).await }
            })
            .await?;
        Ok(resp.into())
    }

    /// Compacts the history up to `revision`. With `physical`, waits until
    /// the compaction has been applied to the backend.
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<Header> {
        let req = PbCompactionRequest { revision, physical };
        let resp = self
            .unary(req, |svc, r| {
                let mut kv = self.kv(svc);
                async move { kv.compact(r).await }
            })
            .await?;
        Ok(resp.header.into())
    }

    /// Scans `[from, to)` in pages of `page_size` keys, all at one revision.
    ///
    /// With `revision` 0 the scan pins the revision of its first page, so
    /// every page is part of the same snapshot however the keys change
    /// meanwhile. Only one page is held at a time.
    pub fn scan(
        &self,
        from: impl Into<Bytes>,
        to: impl Into<Bytes>,
        page_size: usize,
        revision: i64,
    ) -> Scan {
        Scan {
            client: self.clone(),
            next: Some(from.into()),
            end: to.into(),
            page_size: page_size.max(1) as i64,
            limit: page_size.max(1) as i64,
            revision,
            hint: None,
            started: false,
        }
    }

    /// Scans every key under `prefix`; see [`Client::scan`].
    pub fn scan_prefix(&self, prefix: impl Into<Bytes>, page_size: usize, revision: i64) -> Scan {
        let prefix = prefix.into();
        let end = prefix_end(&prefix);
        self.scan(prefix, end, page_size, revision)
    }
}

/// A paginated scan at a fixed revision; see [`Client::scan`].
///
/// etcd 3.4 answers a range with a limit only after walking the index over
/// the whole rest of the range, so plain pagination costs O(n²/page): a
/// million keys in pages of 2000 take minutes. The scan therefore bounds each
/// request to a *window* whose end it extrapolates from the density of the
/// keys it has seen, aiming at one page per window, and widens the window
/// when it comes back short. Each request then costs about one page, and the
/// pages still tile the range in key order at one revision.
pub struct Scan {
    client: Client,
    next: Option<Bytes>,
    end: Bytes,
    page_size: i64,
    /// The limit of the next request: ramps up to `page_size`.
    limit: i64,
    revision: i64,
    /// Where the next window ends: extrapolated from `(a, b)` by `factor`
    /// times their distance beyond `b`. None: to the end of the range.
    hint: Option<(Bytes, Bytes, f64)>,
    started: bool,
}

/// One page of a [`Scan`].
#[derive(Debug)]
pub struct Page {
    /// The revision the whole scan reads at.
    pub revision: i64,
    /// The keys of this page, in key order.
    pub kvs: Vec<KeyValue>,
}

impl Scan {
    /// The revision the scan reads at; 0 until the first page is read.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Starts with pages of `first` keys and doubles them up to the page
    /// size, so a consumer that works page by page starts sooner.
    pub fn ramp_up(mut self, first: usize) -> Self {
        self.limit = (first.max(1) as i64).min(self.page_size);
        self
    }

    /// The next page, or `None` when the range is exhausted. The first call
    /// always returns a page (maybe empty), which pins the revision; later
    /// pages are never empty and hold at most `page_size` keys.
    ///
    /// A scan whose revision has been compacted away fails with
    /// [`Error::Compacted`](super::Error::Compacted).
    pub async fn next_page(&mut self) -> Result<Option<Page>> {
        loop {
            let Some(from) = self.next.take() else {
                return Ok(None);
            };
            let window_end = match &self.hint {
                Some((a, b, f)) => clamp_window(extrapolate(a, b, *f), &from, &self.end),
                None => self.end.clone(),
            };
            let bounded = window_end != self.end;
            let req = Range::between(from.clone(), window_end.clone())
                .limit(self.limit)
                .revision(self.revision);
            let resp = match self.client.range(req).await {
                Ok(r) => r,
                Err(e) => {
                    self.next = Some(from);
                    return Err(e);
                }
            };
            if self.revision == 0 {
                self.revision = resp.header.revision;
            }
            let more = resp.more;
            let kvs = resp.into_kvs();
            if more {
                let (first, last) = match (kvs.first(), kvs.last()) {
                    (Some(f), Some(l)) => (f.key().clone(), l.key().clone()),
                    _ => return Ok(None),
                };
                let mut next = Vec::with_capacity(last.len() + 1);
                next.extend_from_slice(&last);
                next.push(0);
                self.next = Some(Bytes::from(next));
                // The next page likely spans as much key space as this one.
                self.hint = (kvs.len() >= 2).then_some((first, last, 1.0));
            } else if bounded {
                // The window is exhausted: the next one starts where it
                // ended, scaled to hold about a page.
                let n = kvs.len().max(1) as f64;
                let grow = ((self.limit * 2).min(self.page_size) as f64 / n).clamp(1.0, 8.0);
                self.hint = Some((from, window_end.clone(), grow));
                self.next = Some(window_end);
            }
            let first_call = !self.started;
            self.started = true;
            if !kvs.is_empty() {
                self.limit = (self.limit * 2).min(self.page_size);
            }
            if !kvs.is_empty() || first_call {
                return Ok(Some(Page {
                    revision: self.revision,
                    kvs,
                }));
            }
        }
    }
}

impl Scan {
    /// The pages as a `Stream`, ending after the last page or the first
    /// error. Still one page at a time in memory.
    pub fn into_stream(self) -> impl futures_util::Stream<Item = Result<Page>> + Send {
        futures_util::stream::unfold(Some(self), |scan| async move {
            let mut scan = scan?;
            match scan.next_page().await {
                Ok(Some(page)) => Some((Ok(page), Some(scan))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        })
    }
}

/// The key `f` times the distance from `a` to `b` beyond `b`, measured in
/// the eight bytes after their common prefix. `None` when that cannot be
/// told (no distance), or past the end of the keyspace.
fn extrapolate(a: &[u8], b: &[u8], f: f64) -> Option<Bytes> {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let word = |s: &[u8]| {
        let mut buf = [0u8; 8];
        for (d, x) in buf.iter_mut().zip(&s[common..]) {
            *d = *x;
        }
        u64::from_be_bytes(buf)
    };
    let (va, vb) = (word(a), word(b));
    if vb <= va {
        return None;
    }
    let step = (((vb - va) as f64) * f).max(1.0) as u128;
    let v = u128::from(vb) + step;
    if v > u128::from(u64::MAX) {
        // Past everything under the common prefix.
        return (common > 0).then(|| prefix_end(&b[..common]));
    }
    let mut out = b[..common].to_vec();
    out.extend_from_slice(&(v as u64).to_be_bytes());
    while out.len() > common + 1 && out.last() == Some(&0) {
        out.pop();
    }
    Some(Bytes::from(out))
}

/// A window end strictly after `from` and no further than `end` (where
/// `[0]` means the end of the keyspace).
fn clamp_window(w: Option<Bytes>, from: &[u8], end: &Bytes) -> Bytes {
    let unbounded = |k: &[u8]| k == [0];
    match w {
        Some(w) if !unbounded(&w) && w.as_ref() > from && (unbounded(end) || w < *end) => w,
        _ => end.clone(),
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
    fn windows_extrapolate_past_the_last_key() {
        // Twice the distance from a to b, beyond b.
        let w = extrapolate(b"/k/0100", b"/k/0200", 1.0).unwrap();
        assert!(
            w.as_ref() > b"/k/0200".as_slice() && w.as_ref() < b"/k/9".as_slice(),
            "{w:?}"
        );
        // No distance: no hint.
        assert_eq!(extrapolate(b"/k/1", b"/k/1", 1.0), None);
        assert_eq!(extrapolate(b"/k/2", b"/k/1", 1.0), None);
        // Overflowing the common prefix's space ends at its prefix end.
        let w = extrapolate(b"/k/\x00", b"/k/\xff\xff\xff\xff\xff\xff\xff\xff", 4.0).unwrap();
        assert_eq!(w, Bytes::from_static(b"/k0"));
        // Windows stay inside (from, end].
        let end = Bytes::from_static(b"/k0");
        assert_eq!(
            clamp_window(Some(Bytes::from_static(b"/z")), b"/k/1", &end),
            end
        );
        assert_eq!(
            clamp_window(Some(Bytes::from_static(b"/k/0")), b"/k/1", &end),
            end
        );
        assert_eq!(clamp_window(None, b"/k/1", &end), end);
        let inside = Bytes::from_static(b"/k/5");
        assert_eq!(clamp_window(Some(inside.clone()), b"/k/1", &end), inside);
        let to_the_end = Bytes::from_static(&[0]);
        assert_eq!(
            clamp_window(Some(inside.clone()), b"/k/1", &to_the_end),
            inside
        );
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
}
