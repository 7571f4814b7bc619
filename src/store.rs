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

use tokio::sync::watch;

use crate::etcd::{
    self, Client, LeaseGrant, LeaseHandle, LeaseId, LeaseStatus, LeaseTtl, Range, RangeResponse,
    Scan, Txn, TxnResponse, WatchOptions, WatchResponse, WatchStream, Watcher,
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
    /// A watch on a stream of its own, as [`Client::watch`]: the stream's
    /// health, and the watcher's responses.
    fn watch(
        &self,
        opts: WatchOptions,
    ) -> etcd::Result<(Box<dyn WatchHealth>, Box<dyn WatchEvents>)>;
    /// Grants a lease of `ttl` with id `id` ([`LeaseId::NONE`]: the server
    /// picks one); an id that exists already is
    /// [`etcd::Error::LeaseExists`].
    fn lease_grant(&self, id: LeaseId, ttl: Duration) -> BoxFuture<'_, etcd::Result<LeaseGrant>>;
    /// Revokes a lease, deleting its keys.
    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, etcd::Result<()>>;
    /// A lease's remaining TTL (`None`: it does not exist).
    fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> BoxFuture<'_, etcd::Result<LeaseTtl>>;
    /// Keeps a lease granted with `ttl` alive until the handle is dropped
    /// (never revoking it), as [`etcd::LeaseKeeper::keep_alive_with_ttl`]:
    /// the engine knows the TTL of the lease it adopts, and asks nothing.
    fn keep_alive(&self, id: LeaseId, ttl: Duration)
    -> BoxFuture<'_, etcd::Result<Box<dyn Lease>>>;
    /// Opens the connections calls will use, before there are calls to
    /// make; with `warm`, also starts their flow-control windows growing
    /// (see [`Client::warm_connections`]). Nothing by default: a backend
    /// without connections has nothing to open.
    fn open_connections(&self, warm: bool) -> BoxFuture<'_, ()> {
        let _ = warm;
        Box::pin(async {})
    }
    /// A backend whose calls all go over one connection, so that they
    /// arrive in the order they are sent (etcd may still apply two in
    /// flight in either order: see [`Client::in_order`]); `None` when this
    /// one has no such choice to make.
    fn in_order(&self) -> Option<Store> {
        None
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

    /// This store with its calls on one connection; see
    /// [`Backend::in_order`].
    pub fn in_order(&self) -> Store {
        self.0.in_order().unwrap_or_else(|| self.clone())
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

    /// See [`Backend::watch`].
    pub fn watch(
        &self,
        opts: WatchOptions,
    ) -> etcd::Result<(Box<dyn WatchHealth>, Box<dyn WatchEvents>)> {
        self.0.watch(opts)
    }

    /// A lease of `ttl` with an id the server picks; see
    /// [`Backend::lease_grant`].
    pub async fn lease_grant(&self, ttl: Duration) -> etcd::Result<LeaseGrant> {
        self.0.lease_grant(LeaseId::NONE, ttl).await
    }

    /// A lease of `ttl` with id `id`; see [`Backend::lease_grant`].
    pub async fn lease_grant_with_id(
        &self,
        id: LeaseId,
        ttl: Duration,
    ) -> etcd::Result<LeaseGrant> {
        self.0.lease_grant(id, ttl).await
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
    pub async fn keep_alive(&self, id: LeaseId, ttl: Duration) -> etcd::Result<Box<dyn Lease>> {
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

    fn watch(
        &self,
        opts: WatchOptions,
    ) -> etcd::Result<(Box<dyn WatchHealth>, Box<dyn WatchEvents>)> {
        let (stream, watcher) = Client::watch(self, opts)?;
        Ok((Box::new(stream), Box::new(watcher)))
    }

    fn lease_grant(&self, id: LeaseId, ttl: Duration) -> BoxFuture<'_, etcd::Result<LeaseGrant>> {
        Box::pin(Client::lease_grant_with_id(self, id, ttl))
    }

    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, etcd::Result<()>> {
        Box::pin(Client::lease_revoke(self, id))
    }

    fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> BoxFuture<'_, etcd::Result<LeaseTtl>> {
        Box::pin(Client::lease_time_to_live(self, id, keys))
    }

    fn keep_alive(
        &self,
        id: LeaseId,
        ttl: Duration,
    ) -> BoxFuture<'_, etcd::Result<Box<dyn Lease>>> {
        Box::pin(async move {
            let handle = self.lease_keeper().keep_alive_with_ttl(id, ttl).await?;
            Ok(Box::new(handle) as Box<dyn Lease>)
        })
    }

    fn open_connections(&self, warm: bool) -> BoxFuture<'_, ()> {
        if warm {
            Box::pin(Client::warm_connections(self))
        } else {
            Box::pin(Client::open_connections(self))
        }
    }

    fn in_order(&self) -> Option<Store> {
        Some(Store::from(Client::in_order(self)))
    }

    fn endpoints(&self) -> Vec<String> {
        Client::endpoints(self)
    }

    fn timeout(&self) -> Duration {
        Client::timeout(self)
    }
}

/// A watch stream's health: whether it is open, which member feeds it, how
/// often it reopened. Shared by the stream's watchers.
pub trait WatchHealth: Send + Sync {
    /// The member feeding the stream (`None` while it is not open).
    fn member_id(&self) -> Option<u64>;
    /// How many times the stream reopened after it broke.
    fn reconnects(&self) -> u64;
    /// Whether the stream is open right now.
    fn is_connected(&self) -> bool;
}

/// One watcher's responses, in revision order, resumed across reconnects
/// without loss or duplicates.
pub trait WatchEvents: Send {
    /// The next response; `None` once the watch has ended. (Not `next`:
    /// on a `Watcher` that would read as `StreamExt::next`.)
    fn next_response(&mut self) -> BoxFuture<'_, Option<etcd::Result<WatchResponse>>>;
    /// A response that has already arrived, without waiting.
    fn next_buffered(&mut self) -> Option<etcd::Result<WatchResponse>>;
}

/// A lease kept alive until this value is dropped; dropping it never
/// revokes the lease.
pub trait Lease: Send + Sync {
    /// The lease's id.
    fn id(&self) -> LeaseId;
    /// The keep-alive's health, as it changes.
    fn subscribe(&self) -> watch::Receiver<LeaseStatus>;
    /// The keep-alive's health now.
    fn status(&self) -> LeaseStatus {
        *self.subscribe().borrow()
    }
}

impl WatchHealth for WatchStream {
    fn member_id(&self) -> Option<u64> {
        WatchStream::member_id(self)
    }

    fn reconnects(&self) -> u64 {
        WatchStream::reconnects(self)
    }

    fn is_connected(&self) -> bool {
        WatchStream::is_connected(self)
    }
}

impl WatchEvents for Watcher {
    fn next_response(&mut self) -> BoxFuture<'_, Option<etcd::Result<WatchResponse>>> {
        Box::pin(futures_util::StreamExt::next(self))
    }

    fn next_buffered(&mut self) -> Option<etcd::Result<WatchResponse>> {
        Watcher::next_buffered(self)
    }
}

impl Lease for LeaseHandle {
    fn id(&self) -> LeaseId {
        LeaseHandle::id(self)
    }

    fn subscribe(&self) -> watch::Receiver<LeaseStatus> {
        LeaseHandle::subscribe(self)
    }
}

/// The in-memory model as a store, for the engine's unit tests: every call
/// answered at once as etcd would, no faults. What the tests here do not
/// need (watches, keep-alives) fails as an unreachable etcd would; the
/// simulation (`tests/sim`) puts its own backend, with faults, in front of
/// the model.
#[cfg(test)]
impl Backend for aether_etcd::model::Client {
    fn range(&self, req: Range) -> BoxFuture<'_, etcd::Result<RangeResponse>> {
        Box::pin(aether_etcd::model::Client::range(self, req))
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, etcd::Result<TxnResponse>> {
        Box::pin(aether_etcd::model::Client::txn(self, txn))
    }

    fn scan(&self, from: Bytes, end: Bytes, page_size: usize, revision: i64) -> Scan {
        let model = self.clone();
        Scan::with_range(
            move |req| {
                let model = model.clone();
                async move { model.range(req).await }
            },
            from,
            end,
            page_size,
            revision,
        )
    }

    fn watch(
        &self,
        _opts: WatchOptions,
    ) -> etcd::Result<(Box<dyn WatchHealth>, Box<dyn WatchEvents>)> {
        Err(etcd::Error::Unavailable(
            "no watches in the unit tests' model".into(),
        ))
    }

    fn lease_grant(&self, id: LeaseId, ttl: Duration) -> BoxFuture<'_, etcd::Result<LeaseGrant>> {
        Box::pin(aether_etcd::model::Client::lease_grant_with_id(
            self, id, ttl,
        ))
    }

    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, etcd::Result<()>> {
        Box::pin(aether_etcd::model::Client::lease_revoke(self, id))
    }

    fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> BoxFuture<'_, etcd::Result<LeaseTtl>> {
        Box::pin(aether_etcd::model::Client::lease_time_to_live(
            self, id, keys,
        ))
    }

    fn keep_alive(
        &self,
        _id: LeaseId,
        _ttl: Duration,
    ) -> BoxFuture<'_, etcd::Result<Box<dyn Lease>>> {
        Box::pin(async {
            Err(etcd::Error::Unavailable(
                "no keep-alives in the unit tests' model".into(),
            ))
        })
    }

    fn endpoints(&self) -> Vec<String> {
        vec!["model".into()]
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(2)
    }
}
