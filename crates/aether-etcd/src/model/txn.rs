//! Requests checked and applied as etcd does it: the static checks of its
//! gRPC layer (sizes, op counts, empty keys, keys written twice), then the
//! compares of every level against the store as it was, then the checks
//! of the path that will run (leases and keys that must exist, read
//! revisions), and only then the writes: a refused request changes
//! nothing.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::EtcdVersion;
use super::lease::Leases;
use super::mvcc::Store;
use crate::error::{Code, Error, Result};
use crate::pb::etcdserverpb::{ResponseOp, response_op};
use crate::pb::{
    PbCompare, PbDeleteRangeRequest, PbDeleteRangeResponse, PbOp, PbPutRequest, PbPutResponse,
    PbRangeRequest, PbRangeResponse, PbRequestOp, PbResponseHeader, PbSortOrder, PbSortTarget,
    PbTxnRequest, PbTxnResponse, pb_compare,
};

fn empty_key() -> Error {
    Error::server(Code::InvalidArgument, "etcdserver: key is not provided")
}

/// The gRPC layer's checks of a put.
pub(super) fn check_put(p: &PbPutRequest) -> Result<()> {
    if p.key.is_empty() {
        return Err(empty_key());
    }
    if p.ignore_value && !p.value.is_empty() {
        return Err(Error::ValueProvided);
    }
    if p.ignore_lease && p.lease != 0 {
        return Err(Error::LeaseProvided);
    }
    Ok(())
}

/// The gRPC layer's checks of a range or a delete: a key is needed.
pub(super) fn check_key(key: &Bytes) -> Result<()> {
    if key.is_empty() {
        return Err(empty_key());
    }
    Ok(())
}

/// The gRPC layer's checks of a txn: no branch (nor the compares) longer
/// than the limit, a nested txn within what its parent left of it, keys
/// everywhere, then no key written twice in a branch.
pub(super) fn check_txn(t: &PbTxnRequest, max_ops: usize) -> Result<()> {
    check_counts(t, max_ops as i64)?;
    intervals(&t.success)?;
    intervals(&t.failure)?;
    Ok(())
}

fn check_counts(t: &PbTxnRequest, max_ops: i64) -> Result<()> {
    let n = t.compare.len().max(t.success.len()).max(t.failure.len()) as i64;
    if n > max_ops {
        return Err(Error::TooManyOps);
    }
    if t.compare.iter().any(|c| c.key.is_empty()) {
        return Err(empty_key());
    }
    for op in t.success.iter().chain(&t.failure) {
        match &op.request {
            Some(PbOp::RequestRange(r)) => check_key(&r.key)?,
            Some(PbOp::RequestPut(p)) => check_put(p)?,
            Some(PbOp::RequestDeleteRange(d)) => check_key(&d.key)?,
            // What the parent's longest list left of the limit.
            Some(PbOp::RequestTxn(n2)) => check_counts(n2, max_ops - n)?,
            None => {}
        }
    }
    Ok(())
}

/// A branch's puts and its deletes' `[from, to)` ranges.
type Writes = (BTreeSet<Bytes>, Vec<(Bytes, Bytes)>);

/// The keys a branch puts and the ranges it deletes, its nested txns
/// included. etcd refuses a put of a key another put of the branch writes
/// or a delete of the branch covers; the two branches of one nested txn
/// may put the same key, since only one runs. Deletes are compared as
/// literal intervals, as etcd's interval tree does: a from-key delete
/// (`[key, "\0")`) covers nothing there.
fn intervals(ops: &[PbRequestOp]) -> Result<Writes> {
    let mut dels: Vec<(Bytes, Bytes)> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(PbOp::RequestDeleteRange(d)) => Some((d.key.clone(), d.range_end.clone())),
            _ => None,
        })
        .collect();
    let covered = |dels: &[(Bytes, Bytes)], k: &Bytes| {
        dels.iter().any(|(from, to)| {
            if to.is_empty() {
                from == k
            } else {
                from <= k && k < to
            }
        })
    };
    let mut puts = BTreeSet::new();
    for op in ops {
        let Some(PbOp::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (then_puts, then_dels) = intervals(&t.success)?;
        let (else_puts, else_dels) = intervals(&t.failure)?;
        for k in &then_puts {
            if puts.contains(k) || covered(&dels, k) {
                return Err(Error::DuplicateKey);
            }
        }
        for k in &else_puts {
            if (puts.contains(k) && !then_puts.contains(k)) || covered(&dels, k) {
                return Err(Error::DuplicateKey);
            }
        }
        puts.extend(then_puts.into_iter().chain(else_puts));
        dels.extend(then_dels.into_iter().chain(else_dels));
    }
    for op in ops {
        let Some(PbOp::RequestPut(p)) = &op.request else {
            continue;
        };
        if puts.contains(&p.key) || covered(&dels, &p.key) {
            return Err(Error::DuplicateKey);
        }
        puts.insert(p.key.clone());
    }
    Ok((puts, dels))
}

/// Whether a txn (both branches, nested ones too) only reads: etcd serves
/// it as a read, without raft, and so without the request size check.
pub(super) fn is_read_only(t: &PbTxnRequest) -> bool {
    t.success
        .iter()
        .chain(&t.failure)
        .all(|op| match &op.request {
            Some(PbOp::RequestRange(_)) | None => true,
            Some(PbOp::RequestTxn(n)) => is_read_only(n),
            _ => false,
        })
}

/// Which branch runs at each level: the compares of every level are
/// evaluated first, against the store before the txn.
#[derive(Debug)]
pub(super) struct Path {
    succeeded: bool,
    /// The paths of the nested txns of the branch that runs, in order.
    nested: Vec<Path>,
}

impl Path {
    pub(super) fn of(store: &Store, t: &PbTxnRequest) -> Path {
        let succeeded = t.compare.iter().all(|c| compare(store, c));
        let nested = branch(t, succeeded)
            .iter()
            .filter_map(|op| match &op.request {
                Some(PbOp::RequestTxn(n)) => Some(Path::of(store, n)),
                _ => None,
            })
            .collect();
        Path { succeeded, nested }
    }
}

fn branch(t: &PbTxnRequest, succeeded: bool) -> &[PbRequestOp] {
    if succeeded { &t.success } else { &t.failure }
}

/// One compare: every key of its range must satisfy it; over no key a
/// value compare fails and the others compare with zero.
fn compare(store: &Store, c: &PbCompare) -> bool {
    use pb_compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let kvs = store.range(&c.key, &c.range_end, store.rev);
    let target = T::try_from(c.target).unwrap_or(T::Version);
    if kvs.is_empty() && target == T::Value {
        return false;
    }
    let holds = |kv: &crate::pb::PbKeyValue| {
        let ord = match (&c.target_union, target) {
            (Some(U::Value(v)), T::Value) => kv.value[..].cmp(&v[..]),
            (None, T::Value) => kv.value[..].cmp(&[][..]),
            (u, t) => {
                let want = match u {
                    Some(
                        U::Version(n) | U::CreateRevision(n) | U::ModRevision(n) | U::Lease(n),
                    ) => *n,
                    _ => 0,
                };
                let have = match t {
                    T::Version => kv.version,
                    T::Create => kv.create_revision,
                    T::Mod => kv.mod_revision,
                    T::Lease => kv.lease,
                    T::Value => unreachable!("value compares are above"),
                };
                have.cmp(&want)
            }
        };
        match R::try_from(c.result).unwrap_or(R::Equal) {
            R::Equal => ord.is_eq(),
            R::NotEqual => !ord.is_eq(),
            R::Greater => ord.is_gt(),
            R::Less => ord.is_lt(),
        }
    };
    if kvs.is_empty() {
        return holds(&Default::default());
    }
    kvs.iter().all(holds)
}

/// The checks of the path that will run, against the store before the
/// txn: a range's revision (the future is the store's current revision,
/// even for a range after a write of the same txn), and, when the txn
/// writes, each put's lease and the key a put that keeps its value or
/// lease needs.
pub(super) fn check_path(
    store: &Store,
    leases: &Leases,
    t: &PbTxnRequest,
    path: &Path,
    writes: bool,
) -> Result<()> {
    if writes {
        walk(t, path, &mut |op| match op {
            PbOp::RequestPut(p) => check_put_applies(store, leases, p),
            _ => Ok(()),
        })?;
    }
    walk(t, path, &mut |op| match op {
        PbOp::RequestRange(r) if r.revision != 0 => {
            store.read_rev(r.revision, store.rev).map(|_| ())
        }
        _ => Ok(()),
    })
}

fn walk(t: &PbTxnRequest, path: &Path, f: &mut impl FnMut(&PbOp) -> Result<()>) -> Result<()> {
    let mut nested = path.nested.iter();
    for op in branch(t, path.succeeded) {
        match &op.request {
            Some(PbOp::RequestTxn(n)) => walk(n, nested.next().expect("a path per nested txn"), f)?,
            Some(op) => f(op)?,
            None => {}
        }
    }
    Ok(())
}

/// What the applier checks of a put before writing anything.
pub(super) fn check_put_applies(store: &Store, leases: &Leases, p: &PbPutRequest) -> Result<()> {
    if (p.ignore_value || p.ignore_lease) && store.get(&p.key).is_none() {
        return Err(Error::KeyNotFound);
    }
    if p.lease != 0 && !leases.exists(p.lease) {
        return Err(Error::LeaseNotFound);
    }
    Ok(())
}

/// A range at `current` (the store's revision, or a lagging member's).
/// Its header carries only the revision; the caller completes it.
pub(super) fn range(
    store: &Store,
    r: &PbRangeRequest,
    current: i64,
    version: EtcdVersion,
) -> Result<PbRangeResponse> {
    let rev = store.read_rev(r.revision, current)?;
    let mut kvs = store.range(&r.key, &r.range_end, rev);
    let count = kvs.len() as i64;
    let mut more = false;
    if r.count_only {
        kvs.clear();
    } else {
        kvs.retain(|kv| {
            (r.max_mod_revision == 0 || kv.mod_revision <= r.max_mod_revision)
                && (r.min_mod_revision == 0 || kv.mod_revision >= r.min_mod_revision)
                && (r.max_create_revision == 0 || kv.create_revision <= r.max_create_revision)
                && (r.min_create_revision == 0 || kv.create_revision >= r.min_create_revision)
        });
        sort(&mut kvs, r, version);
        if r.limit > 0 && kvs.len() > r.limit as usize {
            kvs.truncate(r.limit as usize);
            more = true;
        }
        if r.keys_only {
            for kv in &mut kvs {
                kv.value = Bytes::new();
            }
        }
    }
    Ok(PbRangeResponse {
        header: Some(rev_header(current)),
        kvs,
        more,
        count,
    })
}

/// etcd sorts ascending by default when the target is not the key (the
/// store already returns key order), descending with a reversed
/// comparison. Go's `sort.Sort` is not stable, so ties come out in the
/// order its algorithm leaves them, which depends on the Go release etcd
/// was built with: up to 12 elements, Go 1.19 (etcd 3.4.23) sorts by
/// insertion alone, and Go 1.16 (etcd 3.5.1) first swaps elements 6 apart
/// once. Both are followed here; over 12 elements ties keep key order,
/// which Go's quicksorts need not do.
fn sort(kvs: &mut [crate::pb::PbKeyValue], r: &PbRangeRequest, version: EtcdVersion) {
    let target = PbSortTarget::try_from(r.sort_target).unwrap_or(PbSortTarget::Key);
    let mut order = PbSortOrder::try_from(r.sort_order).unwrap_or(PbSortOrder::None);
    if target != PbSortTarget::Key && order == PbSortOrder::None {
        order = PbSortOrder::Ascend;
    }
    if order == PbSortOrder::None {
        return;
    }
    let desc = order == PbSortOrder::Descend;
    let less = |a: &crate::pb::PbKeyValue, b: &crate::pb::PbKeyValue| {
        let (a, b) = if desc { (b, a) } else { (a, b) };
        let o = match target {
            PbSortTarget::Key => a.key.cmp(&b.key),
            PbSortTarget::Version => a.version.cmp(&b.version),
            PbSortTarget::Create => a.create_revision.cmp(&b.create_revision),
            PbSortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
            PbSortTarget::Value => a.value.cmp(&b.value),
        };
        o.is_lt()
    };
    go_small_sort(kvs, less, version == EtcdVersion::V3_5);
}

/// Go's `sort.Sort` on up to 12 elements (`shell`: Go 1.16's gap-6 pass
/// first); a stable sort beyond.
fn go_small_sort<T>(v: &mut [T], less: impl Fn(&T, &T) -> bool, shell: bool) {
    let n = v.len();
    if n > 12 {
        v.sort_by(|a, b| {
            if less(a, b) {
                std::cmp::Ordering::Less
            } else if less(b, a) {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        });
        return;
    }
    if shell {
        for i in 6..n {
            if less(&v[i], &v[i - 6]) {
                v.swap(i, i - 6);
            }
        }
    }
    for i in 1..n {
        let mut j = i;
        while j > 0 && less(&v[j], &v[j - 1]) {
            v.swap(j, j - 1);
            j -= 1;
        }
    }
}

/// A header with only a revision, as etcd fills the responses inside a
/// txn.
pub(super) fn rev_header(revision: i64) -> PbResponseHeader {
    PbResponseHeader {
        revision,
        ..Default::default()
    }
}

/// The writes of one request, all at revision `begin + 1`.
pub(super) struct Apply<'a> {
    pub(super) store: &'a mut Store,
    pub(super) leases: &'a mut Leases,
    pub(super) begin: i64,
    pub(super) version: EtcdVersion,
}

impl Apply<'_> {
    /// The revision a read inside the request sees: one past the start
    /// once something was written.
    fn now(&self) -> i64 {
        if self.store.changed_at(self.begin + 1) {
            self.begin + 1
        } else {
            self.begin
        }
    }

    pub(super) fn put(&mut self, p: &PbPutRequest) -> PbPutResponse {
        let rev = self.begin + 1;
        let old = self.store.range(&p.key, b"", rev).pop();
        let value = match (&old, p.ignore_value) {
            (Some(o), true) => o.value.clone(),
            _ => p.value.clone(),
        };
        let lease = match (&old, p.ignore_lease) {
            (Some(o), true) => o.lease,
            _ => p.lease,
        };
        let (_, prev) = self.store.put(rev, p.key.clone(), value, lease);
        let old_lease = prev.as_ref().map_or(0, |o| o.lease);
        self.leases.reattach(&p.key, old_lease, lease);
        PbPutResponse {
            header: Some(rev_header(rev)),
            prev_kv: prev.filter(|_| p.prev_kv).map(Box::new),
        }
    }

    pub(super) fn delete(&mut self, d: &PbDeleteRangeRequest) -> PbDeleteRangeResponse {
        let gone = self.store.delete(self.begin + 1, &d.key, &d.range_end);
        for kv in &gone {
            self.leases.reattach(&kv.key, kv.lease, 0);
        }
        PbDeleteRangeResponse {
            header: Some(rev_header(self.now())),
            deleted: gone.len() as i64,
            prev_kvs: if d.prev_kv { gone } else { Vec::new() },
        }
    }

    /// Runs the branch `path` chose; the checks have passed.
    pub(super) fn txn(&mut self, t: &PbTxnRequest, path: &Path) -> PbTxnResponse {
        let mut nested = path.nested.iter();
        let mut responses = Vec::new();
        for op in branch(t, path.succeeded) {
            let r = match &op.request {
                Some(PbOp::RequestRange(r)) => response_op::Response::ResponseRange(
                    range(self.store, r, self.now(), self.version).expect("checked before the txn"),
                ),
                Some(PbOp::RequestPut(p)) => response_op::Response::ResponsePut(self.put(p)),
                Some(PbOp::RequestDeleteRange(d)) => {
                    response_op::Response::ResponseDeleteRange(self.delete(d))
                }
                Some(PbOp::RequestTxn(n)) => {
                    let mut r = self.txn(n, nested.next().expect("a path per nested txn"));
                    // etcd leaves a nested txn's header empty, revision too.
                    r.header = Some(PbResponseHeader::default());
                    response_op::Response::ResponseTxn(r)
                }
                None => continue,
            };
            responses.push(ResponseOp { response: Some(r) });
        }
        PbTxnResponse {
            header: Some(rev_header(self.now())),
            succeeded: path.succeeded,
            responses,
        }
    }
}
