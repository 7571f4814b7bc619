//! The narrow interface between the mirror engine and an etcd.
//!
//! The engine makes a handful of calls on each etcd it touches: reads
//! (single ranges and paged scans at one revision), txns with compares,
//! watches from a revision, and leases (grant, keep-alive, time-to-live,
//! revoke). [`Backend`] is exactly that list and nothing more, and
//! [`Store`] is the cheap, cloneable handle the engine holds. An
//! [`etcd::Client`] is a backend; so is anything else
//! that answers these calls the way etcd does, such as an in-memory model
//! on a simulated clock, so the engine's logic can be driven, and its
//! faults chosen, without a process.
//!
//! The answers are the client's own types (responses, [`Scan`],
//! [`WatchStream`], [`LeaseHandle`]), so the engine reads the same on
//! either side of the interface. The member that served a call is in each
//! answer's header, and a watch stream names its member
//! ([`WatchStream::member_id`]): the freshness rule compares the two.
//!
//! Why a trait object and not a type parameter: the engine is a dozen
//! modules deep, and a parameter on every type in it would say nothing a
//! reader needs; a call to etcd costs a round trip, next to which the
//! boxed future is free.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;

use crate::etcd::{
    self, Client, LeaseGrant, LeaseHandle, LeaseId, LeaseTtl, Range, RangeResponse, Scan, Txn,
    TxnResponse, WatchStream,
};

/// The calls the engine makes on an etcd; see the module doc.
pub trait Backend: Send + Sync + 'static {
    /// A single read: a key, a range or a prefix.
    fn range(&self, req: Range) -> BoxFuture<'_, etcd::Result<RangeResponse>>;
    /// A txn: compares, then one branch of ops.
    fn txn(&self, txn: Txn) -> BoxFuture<'_, etcd::Result<TxnResponse>>;
    /// `[from, end)` in pages of `page_size` keys at `revision` (0: the
    /// revision of the first page), as [`Client::scan`].
    fn scan(&self, from: Bytes, end: Bytes, page_size: usize, revision: i64) -> Scan;
    /// A new watch stream of its own, as [`Client::watch_stream`].
    fn watch_stream(&self) -> WatchStream;
    /// Grants a lease of `ttl` seconds; the server picks its id.
    fn lease_grant(&self, ttl: i64) -> BoxFuture<'_, etcd::Result<LeaseGrant>>;
    /// Revokes a lease, deleting its keys.
    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, etcd::Result<()>>;
    /// A lease's remaining TTL (-1: it does not exist).
    fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> BoxFuture<'_, etcd::Result<LeaseTtl>>;
    /// Keeps a granted lease alive until the handle is dropped (never
    /// revoking it), as [`etcd::LeaseKeeper::keep_alive`].
    fn keep_alive(&self, id: LeaseId, ttl: i64) -> BoxFuture<'_, etcd::Result<LeaseHandle>>;
    /// Opens the connections calls will use, before there are calls to
    /// make; with `warm`, also starts their flow-control windows growing
    /// (see [`Client::warm_connections`]). Nothing by default: a backend
    /// without connections has nothing to open.
    fn open_connections(&self, warm: bool) -> BoxFuture<'_, ()> {
        let _ = warm;
        Box::pin(async {})
    }
    /// Where the calls go, for logs.
    fn endpoints(&self) -> Vec<String>;
    /// How long one call may take before it fails with a timeout.
    fn timeout(&self) -> Duration;
}

/// The engine's handle on one etcd: a [`Backend`] behind an `Arc`, cheap
/// to clone. Its methods are the backend's, named as the client's.
#[derive(Clone)]
pub struct Store(Arc<dyn Backend>);

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Store").field(&self.0.endpoints()).finish()
    }
}

impl From<Client> for Store {
    fn from(client: Client) -> Store {
        Store(Arc::new(client))
    }
}

impl From<&Client> for Store {
    fn from(client: &Client) -> Store {
        Store(Arc::new(client.clone()))
    }
}

impl From<&Store> for Store {
    fn from(store: &Store) -> Store {
        store.clone()
    }
}

impl Store {
    /// A store over any backend.
    pub fn new(backend: impl Backend) -> Store {
        Store(Arc::new(backend))
    }

    /// See [`Backend::range`].
    pub async fn range(&self, req: Range) -> etcd::Result<RangeResponse> {
        self.0.range(req).await
    }

    /// See [`Backend::txn`].
    pub async fn txn(&self, txn: Txn) -> etcd::Result<TxnResponse> {
        self.0.txn(txn).await
    }

    /// See [`Backend::scan`].
    pub fn scan(&self, from: Bytes, end: Bytes, page_size: usize, revision: i64) -> Scan {
        self.0.scan(from, end, page_size, revision)
    }

    /// Every key under `prefix`; see [`Backend::scan`].
    pub fn scan_prefix(&self, prefix: impl Into<Bytes>, page_size: usize, revision: i64) -> Scan {
        let prefix = prefix.into();
        let end = etcd::prefix_end(&prefix);
        self.0.scan(prefix, end, page_size, revision)
    }

    /// See [`Backend::watch_stream`].
    pub fn watch_stream(&self) -> WatchStream {
        self.0.watch_stream()
    }

    /// See [`Backend::lease_grant`].
    pub async fn lease_grant(&self, ttl: i64) -> etcd::Result<LeaseGrant> {
        self.0.lease_grant(ttl).await
    }

    /// See [`Backend::lease_revoke`].
    pub async fn lease_revoke(&self, id: LeaseId) -> etcd::Result<()> {
        self.0.lease_revoke(id).await
    }

    /// See [`Backend::lease_time_to_live`].
    pub async fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> etcd::Result<LeaseTtl> {
        self.0.lease_time_to_live(id, keys).await
    }

    /// See [`Backend::keep_alive`].
    pub async fn keep_alive(&self, id: LeaseId, ttl: i64) -> etcd::Result<LeaseHandle> {
        self.0.keep_alive(id, ttl).await
    }

    /// See [`Backend::open_connections`].
    pub async fn open_connections(&self, warm: bool) {
        self.0.open_connections(warm).await
    }

    /// See [`Backend::endpoints`].
    pub fn endpoints(&self) -> Vec<String> {
        self.0.endpoints()
    }

    /// See [`Backend::timeout`].
    pub fn timeout(&self) -> Duration {
        self.0.timeout()
    }
}

impl Backend for Client {
    fn range(&self, req: Range) -> BoxFuture<'_, etcd::Result<RangeResponse>> {
        Box::pin(Client::range(self, req))
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, etcd::Result<TxnResponse>> {
        Box::pin(Client::txn(self, txn))
    }

    fn scan(&self, from: Bytes, end: Bytes, page_size: usize, revision: i64) -> Scan {
        Client::scan(self, from, end, page_size, revision)
    }

    fn watch_stream(&self) -> WatchStream {
        Client::watch_stream(self)
    }

    fn lease_grant(&self, ttl: i64) -> BoxFuture<'_, etcd::Result<LeaseGrant>> {
        Box::pin(Client::lease_grant(self, ttl))
    }

    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, etcd::Result<()>> {
        Box::pin(Client::lease_revoke(self, id))
    }

    fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> BoxFuture<'_, etcd::Result<LeaseTtl>> {
        Box::pin(Client::lease_time_to_live(self, id, keys))
    }

    fn keep_alive(&self, id: LeaseId, ttl: i64) -> BoxFuture<'_, etcd::Result<LeaseHandle>> {
        Box::pin(async move { self.lease_keeper().keep_alive(id, ttl).await })
    }

    fn open_connections(&self, warm: bool) -> BoxFuture<'_, ()> {
        if warm {
            Box::pin(Client::warm_connections(self))
        } else {
            Box::pin(Client::open_connections(self))
        }
    }

    fn endpoints(&self) -> Vec<String> {
        Client::endpoints(self)
    }

    fn timeout(&self) -> Duration {
        Client::timeout(self)
    }
}
