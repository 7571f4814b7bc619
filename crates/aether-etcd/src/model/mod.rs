//! An in-memory etcd: the crate's own requests in, its own answers and
//! errors out, deterministic, on tokio's clock (feature `model`).
//!
//! It is for simulations and tests of code written against [`Client`]:
//! a [`Cluster`] of N members shares one store, and
//! [`Cluster::client`] gives a [`model::Client`](Client) talking to one
//! member, with the real client's method names and signatures. Nothing
//! runs unless asked, except lease expiry: a task of the cluster sleeps
//! (on `tokio::time`, so paused time drives it) until the next lease
//! deadline and revokes what ran out, whether or not anyone calls.
//!
//! ```
//! use aether_etcd::model::{Cluster, ModelConfig};
//! use aether_etcd::{Put, Range};
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> aether_etcd::Result<()> {
//! let cluster = Cluster::new(ModelConfig::default());
//! let client = cluster.client(0);
//! let rev = client.put(Put::new("/k", "v")).await?.header.revision;
//! let got = client.range(Range::key("/k")).await?;
//! assert_eq!(got.kvs()[0].mod_revision(), rev);
//! # Ok(()) }
//! ```
//!
//! # What it keeps of etcd
//!
//! Checked against etcd 3.4.23 and 3.5.1 by the repository's
//! `tests/model_conformance.rs`, which runs the same scripts on both:
//!
//! - One revision per write request that changes something (a put always
//!   does; a delete of nothing and a read-only txn do not); each key's
//!   create and mod revision, version and lease; a delete ends a key's
//!   generation.
//! - Ranges with every option (limit, `more`, `count`, keys/count only,
//!   sorting, revision bounds, historical reads) and their errors:
//!   [`Error::Compacted`] below the compaction, [`Error::FutureRevision`].
//! - Txns: every compare target and operator, on key ranges too (every
//!   key must satisfy it); nested txns, whose compares are all evaluated
//!   before any write; reads inside a txn that see its earlier writes;
//!   the refusals of etcd's gRPC layer ([`Error::TooManyOps`] with a nested
//!   txn given what its parent left, [`Error::DuplicateKey`],
//!   [`Error::RequestTooLarge`] for a write whose raft request exceeds
//!   `--max-request-bytes`) and of its applier ([`Error::LeaseNotFound`],
//!   [`Error::KeyNotFound`]), none of which changes anything.
//! - Leases: ids chosen by the model or the caller, the minimum TTL,
//!   keep-alive, time-to-live with keys, revoke and expiry deleting the
//!   lease's keys in one revision.
//! - Watches from a revision, on keys, ranges and prefixes, with filters
//!   and previous values; one revision's events in one response; a start
//!   at or below the compaction refused with
//!   `Error::Compacted { compact_revision: Some(_) }`, as the real client
//!   yields it.
//!
//! # Members
//!
//! [`Cluster::hold`] stops a member applying: its serializable reads are
//! served at the revision it had applied, its watches deliver nothing
//! newer, and what needs it to apply (a write or a linearizable read sent
//! to it, as etcd's ReadIndex waits for the member to catch up) waits
//! until [`Cluster::release`]. The others go on.
//!
//! # What it does not model
//!
//! Auth, membership changes, alarms and quotas, the backend's size,
//! defragmentation and hashes; network faults and raft elections; the
//! periodic progress notices of `progress_notify` (a notice comes when
//! asked, [`Watcher::request_progress`]). Leases expire exactly at their
//! deadline (etcd's leader checks every 500 ms). Server-chosen lease ids
//! are deterministic, not etcd's.

mod lease;
mod mvcc;
mod txn;
mod watch;

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;
use tokio::time::Instant;

use self::lease::Leases;
use self::mvcc::Store;
use self::txn::{Apply, Path};
use self::watch::WatchReg;
pub use self::watch::{MAX_REVS_PER_RESPONSE, Watcher};
use crate::batch::{DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS};
use crate::error::{Error, Result};
use crate::header::Header;
use crate::kv::{
    Delete, DeleteResponse, KeyValue, Put, PutResponse, Range, RangeResponse, Txn, TxnResponse,
    prefix_range,
};
use crate::lease::{LeaseGrant, LeaseList, LeaseTtl, ttl_duration, ttl_secs};
use crate::lease_id::LeaseId;
use crate::maintenance::Status;
use crate::pb::PbResponseHeader;
use crate::watch::{WatchOptions, WatchResponse};

/// Members in a default cluster.
pub const DEFAULT_MEMBERS: usize = 1;
/// etcd's smallest lease TTL with its default heartbeat and election
/// timeout (1.5 election timeouts, rounded up to whole seconds).
pub const DEFAULT_MIN_LEASE_TTL: Duration = Duration::from_secs(2);
/// What etcd's gRPC server accepts beyond `--max-request-bytes` (its
/// `grpcOverheadBytes`): the limit of a request that is not a raft
/// proposal (a range, a read-only txn).
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;
/// What the raft request around a write adds to it before etcd compares
/// it with `--max-request-bytes`: the request header (a two-byte tag, its
/// length and the request id, a 9-byte varint), the write's tag, and then
/// its length prefix.
pub const RAFT_HEADER_BYTES: usize = 13 + 1;
/// The cluster id of a default model.
pub const DEFAULT_CLUSTER_ID: u64 = 0x6d6f_6465_6c00_0001;
/// The raft term every header carries (a fresh one-member etcd is at 2).
pub const RAFT_TERM: u64 = 2;

/// The etcd release whose behaviour the model follows where releases
/// differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EtcdVersion {
    /// etcd 3.4 (3.4.23).
    V3_4,
    /// etcd 3.5 (3.5.1).
    #[default]
    V3_5,
}

impl EtcdVersion {
    /// The release a version string ("3.4.23", `Status::version`) names.
    pub fn parse(version: &str) -> Option<EtcdVersion> {
        if version.starts_with("3.4.") {
            Some(EtcdVersion::V3_4)
        } else if version.starts_with("3.5.") {
            Some(EtcdVersion::V3_5)
        } else {
            None
        }
    }

    /// The version [`Client::status`] reports.
    pub fn as_str(self) -> &'static str {
        match self {
            EtcdVersion::V3_4 => "3.4.23",
            EtcdVersion::V3_5 => "3.5.1",
        }
    }
}

/// How a model cluster is set up.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ModelConfig {
    /// How many members ([`DEFAULT_MEMBERS`]).
    pub members: usize,
    /// Which release to follow where they differ.
    pub version: EtcdVersion,
    /// `--max-txn-ops` ([`DEFAULT_MAX_TXN_OPS`]).
    pub max_txn_ops: usize,
    /// `--max-request-bytes` ([`DEFAULT_MAX_REQUEST_BYTES`]).
    pub max_request_bytes: usize,
    /// The smallest TTL a lease gets ([`DEFAULT_MIN_LEASE_TTL`]).
    pub min_lease_ttl: Duration,
    /// The cluster id in every header ([`DEFAULT_CLUSTER_ID`]).
    pub cluster_id: u64,
    /// How long every request takes before it is served (zero: none).
    /// On paused time it only orders requests.
    pub latency: Duration,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            members: DEFAULT_MEMBERS,
            version: EtcdVersion::default(),
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            min_lease_ttl: DEFAULT_MIN_LEASE_TTL,
            cluster_id: DEFAULT_CLUSTER_ID,
            latency: Duration::ZERO,
        }
    }
}

impl ModelConfig {
    /// With `n` members (at least one).
    #[must_use]
    pub fn with_members(mut self, n: usize) -> Self {
        self.members = n.max(1);
        self
    }
    /// Following `version` where releases differ.
    #[must_use]
    pub fn with_version(mut self, version: EtcdVersion) -> Self {
        self.version = version;
        self
    }
    /// With this `--max-txn-ops`.
    #[must_use]
    pub fn with_max_txn_ops(mut self, n: usize) -> Self {
        self.max_txn_ops = n;
        self
    }
    /// With this `--max-request-bytes`.
    #[must_use]
    pub fn with_max_request_bytes(mut self, n: usize) -> Self {
        self.max_request_bytes = n;
        self
    }
    /// With this smallest lease TTL (whole seconds, as etcd's; a
    /// sub-second part is dropped).
    #[must_use]
    pub fn with_min_lease_ttl(mut self, ttl: Duration) -> Self {
        self.min_lease_ttl = ttl;
        self
    }
    /// With this cluster id.
    #[must_use]
    pub fn with_cluster_id(mut self, id: u64) -> Self {
        self.cluster_id = id;
        self
    }
    /// With every request taking `latency`.
    #[must_use]
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }
}

#[derive(Debug)]
struct Member {
    id: u64,
    held: bool,
    /// The revision it had applied when held.
    applied: i64,
}

/// Everything the members share.
#[derive(Debug)]
struct State {
    config: ModelConfig,
    store: Store,
    leases: Leases,
    members: Vec<Member>,
    watchers: std::collections::BTreeMap<u64, WatchReg>,
    next_watch: u64,
    raft_index: u64,
}

impl State {
    fn applied(&self, m: usize) -> i64 {
        let member = &self.members[m];
        if member.held {
            member.applied
        } else {
            self.store.rev
        }
    }

    fn header(&self, m: usize, revision: i64) -> Header {
        Header::from(Some(self.pb_header(m, revision)))
    }

    fn pb_header(&self, m: usize, revision: i64) -> PbResponseHeader {
        PbResponseHeader {
            cluster_id: self.config.cluster_id,
            member_id: self.members[m].id,
            revision,
            raft_term: RAFT_TERM,
        }
    }

    /// Feeds every watcher what its member has applied.
    fn pump(&mut self) {
        let State {
            store,
            members,
            watchers,
            config,
            ..
        } = self;
        watchers.retain(|_, w| {
            let m = &members[w.member];
            let upto = if m.held { m.applied } else { store.rev };
            let header = Header::from(Some(PbResponseHeader {
                cluster_id: config.cluster_id,
                member_id: m.id,
                revision: upto,
                raft_term: RAFT_TERM,
            }));
            w.pump(store, header)
        });
    }

    /// Runs the writes of one request at the next revision; the revision
    /// moves only if something changed. Returns the revision after it.
    fn write<R>(&mut self, f: impl FnOnce(&mut Apply<'_>) -> R) -> (R, i64) {
        let begin = self.store.rev;
        let r = f(&mut Apply {
            store: &mut self.store,
            leases: &mut self.leases,
            begin,
            version: self.config.version,
        });
        if self.store.changed_at(begin + 1) {
            self.store.rev = begin + 1;
        }
        self.raft_index += 1;
        self.pump();
        (r, self.store.rev)
    }

    /// Revokes a lease: its keys are deleted in one revision, in key order.
    fn revoke(&mut self, id: i64) -> Result<()> {
        let lease = self.leases.map.remove(&id).ok_or(Error::LeaseNotFound)?;
        self.write(|a| {
            for key in &lease.keys {
                a.store.delete(a.begin + 1, key, b"");
            }
        });
        Ok(())
    }

    /// Revokes every lease whose deadline has passed, each in its own
    /// revision (each is its own raft proposal in etcd).
    fn expire(&mut self, now: Instant) {
        for id in self.leases.due(now) {
            let _ = self.revoke(id);
        }
    }
}

/// The state and what wakes its tasks.
#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the expiry task: a new deadline, or the cluster is gone.
    expiry: Arc<Notify>,
    /// Wakes the requests waiting on a held member at each release. A
    /// `Notify`, not a `watch`: a watch channel parks its receivers on one
    /// of eight lists drawn at random, so the order they wake in would
    /// differ from run to run, and a simulation on the model would not
    /// replay.
    released: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic under the lock leaves no half-applied request behind
        // that matters more than the panic itself.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The expiry task holds only a weak reference: wake it to find
        // the cluster gone and end.
        self.expiry.notify_one();
    }
}

/// Sleeps until the next lease deadline, or until woken, and revokes what
/// ran out. Holds the state only while it works, so the last handle
/// dropping ends it.
async fn expiry_task(shared: Weak<Shared>, wake: Arc<Notify>) {
    loop {
        let next = {
            let Some(s) = shared.upgrade() else {
                return;
            };
            let mut st = s.lock();
            st.expire(Instant::now());
            st.leases.next_deadline()
        };
        match next {
            Some(at) => {
                // Biased: an unbiased select draws from the runtime's
                // random source, and a simulation must replay exactly.
                tokio::select! {
                    biased;
                    () = tokio::time::sleep_until(at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

/// A copy of the store and the leases, to restore later
/// ([`Cluster::restore`]).
#[derive(Clone, Debug)]
pub struct Snapshot {
    store: Store,
    leases: Leases,
}

impl Snapshot {
    /// The revision it was taken at.
    pub fn revision(&self) -> i64 {
        self.store.rev
    }
}

/// A model etcd cluster. Clones share it; it lives, with its expiry task,
/// as long as a clone or a [`Client`] of it does. Needs a tokio runtime to
/// be created.
#[derive(Clone)]
pub struct Cluster {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("Cluster")
            .field("revision", &st.store.rev)
            .field("members", &st.members.len())
            .finish()
    }
}

impl Cluster {
    /// A cluster as `config` says, at revision 1 with nothing in it.
    pub fn new(config: ModelConfig) -> Cluster {
        let members = (0..config.members.max(1))
            .map(|i| Member {
                // Distinct, non-zero and stable: the cluster id's bits
                // mixed with the member's index.
                id: (config.cluster_id ^ 0x9e37_79b9_7f4a_7c15)
                    .wrapping_mul(i as u64 + 1)
                    .max(1),
                held: false,
                applied: 1,
            })
            .collect();
        let expiry = Arc::new(Notify::new());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                config,
                store: Store::default(),
                leases: Leases::default(),
                members,
                watchers: Default::default(),
                next_watch: 1,
                raft_index: 1,
            }),
            expiry: expiry.clone(),
            released: Notify::new(),
        });
        tokio::spawn(expiry_task(Arc::downgrade(&shared), expiry));
        Cluster { shared }
    }

    /// A client of member `i`.
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn client(&self, i: usize) -> Client {
        assert!(i < self.members(), "no member {i}");
        Client {
            shared: self.shared.clone(),
            member: i,
        }
    }

    /// How many members.
    pub fn members(&self) -> usize {
        self.shared.lock().members.len()
    }

    /// Member `i`'s id.
    pub fn member_id(&self, i: usize) -> u64 {
        self.shared.lock().members[i].id
    }

    /// Stops member `i` applying (see the module docs).
    pub fn hold(&self, i: usize) {
        let mut st = self.shared.lock();
        let rev = st.store.rev;
        let m = &mut st.members[i];
        if !m.held {
            m.held = true;
            m.applied = rev;
        }
    }

    /// Lets member `i` apply again: it catches up at once, its watchers
    /// get what they missed, and the requests waiting on it are answered.
    pub fn release(&self, i: usize) {
        let mut st = self.shared.lock();
        st.members[i].held = false;
        st.pump();
        drop(st);
        self.shared.released.notify_waiters();
    }

    /// The current revision.
    pub fn revision(&self) -> i64 {
        self.shared.lock().store.rev
    }

    /// The last compaction's revision (-1: none yet).
    pub fn compact_revision(&self) -> i64 {
        self.shared.lock().store.compact_rev
    }

    /// Every live key under `prefix` (all with an empty one), in key
    /// order: for oracles.
    pub fn dump(&self, prefix: impl Into<Bytes>) -> Vec<KeyValue> {
        let (key, end) = prefix_range(prefix);
        let st = self.shared.lock();
        st.store
            .dump(&key, &end)
            .into_iter()
            .map(KeyValue)
            .collect()
    }

    /// The store and leases as they are now.
    pub fn snapshot(&self) -> Snapshot {
        let st = self.shared.lock();
        Snapshot {
            store: st.store.clone(),
            leases: st.leases.clone(),
        }
    }

    /// Puts the store and leases back as `snapshot` has them: the revision
    /// goes back with an older one. Every open watch ends with
    /// [`Error::WatchCanceled`], as a restored member drops its
    /// connections; leases get a full TTL from now, as after a leader
    /// change.
    pub fn restore(&self, snapshot: &Snapshot) {
        let mut st = self.shared.lock();
        st.store = snapshot.store.clone();
        st.leases = snapshot.leases.clone();
        st.leases.renew_all(Instant::now());
        let rev = st.store.rev;
        for m in &mut st.members {
            m.applied = rev;
        }
        for (_, w) in std::mem::take(&mut st.watchers) {
            w.end(Error::WatchCanceled(
                "model: the store was restored from a snapshot".into(),
            ));
        }
        drop(st);
        self.shared.expiry.notify_one();
    }
}

/// A client of one member of a model [`Cluster`], with the methods of
/// [`crate::Client`] it models.
#[derive(Clone)]
pub struct Client {
    shared: Arc<Shared>,
    member: usize,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("member", &self.member)
            .finish()
    }
}

/// How long a raft request around a write of `n` bytes is.
fn raft_len(n: usize) -> usize {
    n + RAFT_HEADER_BYTES + prost::encoding::encoded_len_varint(n as u64)
}

impl Client {
    /// The member's id.
    pub fn member_id(&self) -> u64 {
        self.shared.lock().members[self.member].id
    }

    async fn latency(&self) {
        let d = self.shared.lock().config.latency;
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }

    /// Waits while the member is held: what needs it to apply.
    async fn wait_released(&self) {
        loop {
            // Registered before the check, so a release between the two
            // is not missed.
            let released = self.shared.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if !self.shared.lock().members[self.member].held {
                return;
            }
            released.await;
        }
    }

    /// The size checks: gRPC's limit on any request, and for a write the
    /// limit on its raft request.
    fn check_size(&self, n: usize, write: bool) -> Result<()> {
        let max = self.shared.lock().config.max_request_bytes;
        if n > max + GRPC_OVERHEAD_BYTES || (write && raft_len(n) > max) {
            return Err(Error::RequestTooLarge);
        }
        Ok(())
    }

    /// Reads a key, a range or a prefix. Serializable: at the revision the
    /// member applied; otherwise at the latest, once the member has
    /// caught up.
    pub async fn range(&self, req: Range) -> Result<RangeResponse> {
        self.latency().await;
        txn::check_key(&req.0.key)?;
        self.check_size(prost::Message::encoded_len(&req.0), false)?;
        if !req.0.serializable {
            self.wait_released().await;
        }
        let st = self.shared.lock();
        let current = st.applied(self.member);
        let mut resp = txn::range(&st.store, &req.0, current, st.config.version)?;
        resp.header = Some(st.pb_header(self.member, current));
        Ok(resp.into())
    }

    /// Writes a key.
    pub async fn put(&self, req: Put) -> Result<PutResponse> {
        self.latency().await;
        txn::check_put(&req.0)?;
        self.check_size(prost::Message::encoded_len(&req.0), true)?;
        let mut resp = {
            let mut st = self.shared.lock();
            txn::check_put_applies(&st.store, &st.leases, &req.0)?;
            st.write(|a| a.put(&req.0)).0
        };
        self.wait_released().await;
        let st = self.shared.lock();
        let rev = resp.header.as_ref().map_or(0, |h| h.revision);
        resp.header = Some(st.pb_header(self.member, rev));
        Ok(resp.into())
    }

    /// Deletes a key, a range or a prefix.
    pub async fn delete(&self, req: Delete) -> Result<DeleteResponse> {
        self.latency().await;
        txn::check_key(&req.0.key)?;
        self.check_size(prost::Message::encoded_len(&req.0), true)?;
        let (mut resp, rev) = self.shared.lock().write(|a| a.delete(&req.0));
        self.wait_released().await;
        resp.header = Some(self.shared.lock().pb_header(self.member, rev));
        Ok(resp.into())
    }

    /// Runs a transaction.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.latency().await;
        let t = &txn.0;
        let (max_ops, _) = {
            let st = self.shared.lock();
            (st.config.max_txn_ops, ())
        };
        let n = prost::Message::encoded_len(t);
        self.check_size(n, false)?;
        txn::check_txn(t, max_ops)?;
        let read_only = txn::is_read_only(t);
        self.check_size(n, !read_only)?;
        if read_only {
            self.wait_released().await;
        }
        let (mut resp, rev) = {
            let mut st = self.shared.lock();
            let path = Path::of(&st.store, t);
            txn::check_path(&st.store, &st.leases, t, &path, !read_only)?;
            st.write(|a| a.txn(t, &path))
        };
        if !read_only {
            self.wait_released().await;
        }
        resp.header = Some(self.shared.lock().pb_header(self.member, rev));
        Ok(resp.into())
    }

    /// Compacts the history up to `revision`. `physical` changes nothing
    /// here: the model's compaction is always complete.
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<Header> {
        let _ = physical;
        self.latency().await;
        let rev = {
            let mut st = self.shared.lock();
            st.store.compact(revision)?;
            st.raft_index += 1;
            st.pump();
            st.store.rev
        };
        self.wait_released().await;
        Ok(self.shared.lock().header(self.member, rev))
    }

    /// Grants a lease of `ttl` (rounded up to whole seconds, zero refused,
    /// as the client does); the model picks its id.
    pub async fn lease_grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        self.lease_grant_with_id(LeaseId::NONE, ttl).await
    }

    /// Grants a lease of `ttl` with the caller's id
    /// ([`LeaseId::NONE`]: the model picks). A taken id is
    /// [`Error::LeaseExists`].
    pub async fn lease_grant_with_id(&self, id: LeaseId, ttl: Duration) -> Result<LeaseGrant> {
        // Refused before the request, as the client does.
        let ttl = ttl_secs(ttl)?;
        self.latency().await;
        let grant = {
            let mut st = self.shared.lock();
            let min = st.config.min_lease_ttl.as_secs() as i64;
            let base = st.members[0].id as i64;
            let (id, ttl) = st.leases.grant(id.get(), ttl, min, base, Instant::now())?;
            st.raft_index += 1;
            LeaseGrant {
                id: LeaseId::new(id),
                ttl: ttl_duration(ttl),
            }
        };
        self.shared.expiry.notify_one();
        self.wait_released().await;
        Ok(grant)
    }

    /// Revokes a lease, deleting its keys in one revision.
    pub async fn lease_revoke(&self, id: LeaseId) -> Result<()> {
        self.latency().await;
        self.shared.lock().revoke(id.get())?;
        self.wait_released().await;
        Ok(())
    }

    /// A lease's remaining TTL (whole seconds, truncated) and, with
    /// `keys`, its keys. A lease that does not exist has none.
    pub async fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> Result<LeaseTtl> {
        self.latency().await;
        let st = self.shared.lock();
        let Some(ttl) = st.leases.remaining(id.get(), Instant::now()) else {
            return Ok(LeaseTtl {
                id,
                ttl: None,
                granted_ttl: Duration::ZERO,
                keys: Vec::new(),
            });
        };
        let lease = &st.leases.map[&id.get()];
        Ok(LeaseTtl {
            id,
            ttl: Some(ttl_duration(ttl)),
            granted_ttl: ttl_duration(lease.ttl),
            keys: if keys {
                lease.keys.iter().cloned().collect()
            } else {
                Vec::new()
            },
        })
    }

    /// One keep-alive: the lease's deadline moves to a full TTL from now;
    /// returns the TTL. A lease that does not exist is
    /// [`Error::LeaseNotFound`] (etcd answers TTL 0 on the stream).
    pub async fn lease_keep_alive_once(&self, id: LeaseId) -> Result<Duration> {
        self.latency().await;
        let ttl = self
            .shared
            .lock()
            .leases
            .keep_alive(id.get(), Instant::now())?;
        Ok(ttl_duration(ttl))
    }

    /// Every lease that exists, in id order.
    pub async fn lease_list(&self) -> Result<LeaseList> {
        self.latency().await;
        let st = self.shared.lock();
        Ok(LeaseList {
            header: st.header(self.member, st.applied(self.member)),
            ids: st.leases.map.keys().map(|id| LeaseId::new(*id)).collect(),
        })
    }

    /// Watches from `opts`' start revision (0: after the member's applied
    /// revision). A start at or below the compaction yields
    /// `Error::Compacted { compact_revision: Some(_) }` and ends, as the
    /// real client's watcher does.
    pub fn watch(&self, opts: WatchOptions) -> Result<Watcher> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let mut st = self.shared.lock();
        let applied = st.applied(self.member);
        let start = opts.0.start_revision;
        let next = if start > 0 { start } else { applied + 1 };
        let id = st.next_watch;
        st.next_watch += 1;
        let member_id = st.members[self.member].id;
        let header = st.header(self.member, applied);
        if opts.1 {
            // The create's answer, as the real client delivers it when
            // asked: no events, the revision the watch starts after.
            let _ = tx.send(Ok(WatchResponse {
                created: true,
                ..WatchResponse::events(header, Vec::new())
            }));
        }
        // The real client asks for one revision before the start (its
        // watch module says why), so a start at the compaction is refused.
        if start > 0 && (start - 1).max(1) < st.store.compact_rev {
            let _ = tx.send(Err(Error::Compacted {
                compact_revision: Some(st.store.compact_rev),
            }));
        } else {
            let mut reg = WatchReg::new(self.member, &opts, next, tx);
            if reg.pump(&st.store, header) {
                st.watchers.insert(id, reg);
            }
        }
        Ok(Watcher {
            rx,
            id,
            member_id,
            shared: Arc::downgrade(&self.shared),
        })
    }

    /// The member's status: the release the model follows, its applied
    /// revision, and member 0 as the leader.
    pub async fn status(&self) -> Result<Status> {
        self.latency().await;
        let st = self.shared.lock();
        Ok(Status {
            version: st.config.version.as_str().to_string(),
            revision: st.applied(self.member),
            member_id: st.members[self.member].id,
            leader: st.members[0].id,
            raft_index: st.raft_index,
            raft_term: RAFT_TERM,
            db_size: 0,
            db_size_in_use: 0,
            raft_applied_index: st.raft_index,
            is_learner: false,
            errors: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests;
