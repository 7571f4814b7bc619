//! The `Client` facade: one value that owns the transport and hands each
//! call to its service, so callers see one type and one set of methods,
//! and the services never see each other.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;

use super::auth::{
    AuthClient, AuthStatus, AuthToken, NameList, Permission, RoleInfo, UserAddOptions, UserInfo,
};
use super::cluster::{ClusterClient, MemberAdded, MemberList};
use super::endpoint_sync;
use super::error::{Error, Result};
use super::header::Header;
use super::kv::{
    Delete, DeleteResponse, KvClient, Put, PutResponse, Range, RangeResponse, Scan, Txn,
    TxnResponse, prefix_range,
};
use super::lease::{
    KeepAliveSender, KeepAliveStream, LeaseClient, LeaseGrant, LeaseKeeper, LeaseList, LeaseTtl,
};
use super::lease_id::LeaseId;
use super::maintenance::{
    Alarm, DowngradeAction, DowngradeResponse, Hash, HashKv, MaintenanceClient, Snapshot, Status,
};
use super::transport::{ClientConfig, Credentials, Transport};
use super::watch::{WatchClient, WatchOptions, WatchStream, Watcher};

/// An etcd v3 client. Cheap to clone; clones share connections, the auth
/// token and the lease keep-alive stream.
///
/// **Ownership.** The client's background tasks (the lease keep-alive, each
/// watch stream, endpoint auto-sync) hold the connections, never a `Client`:
/// dropping the last clone (and [`Client::with_timeout`] view) stops the
/// keep-alive task and closes the connections once no
/// [`super::WatchStream`] or [`super::Watcher`] is left.
/// A watcher keeps its own stream alive.
///
/// ```no_run
/// # async fn demo() -> aether_etcd::Result<()> {
/// use aether_etcd::{Client, ClientConfig, Put, Range};
///
/// let client = Client::connect(ClientConfig::new(["http://127.0.0.1:2379"]))?;
/// client.put(Put::new("/greeting", "hello")).await?;
/// let resp = client.range(Range::key("/greeting")).await?;
/// assert_eq!(resp.kvs()[0].value(), "hello");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Handle>,
}

/// What the `Client` clones share: the transport, a client per service on
/// it, and the tasks that only live as long as some clone does.
impl std::fmt::Debug for Client {
    // The transport's state is behind locks and tasks; what identifies a
    // client to someone debugging is how many clones share it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("clones", &Arc::strong_count(&self.inner))
            .finish_non_exhaustive()
    }
}

struct Handle {
    transport: Transport,
    kv: KvClient,
    watch: WatchClient,
    lease: LeaseClient,
    cluster: ClusterClient,
    maintenance: MaintenanceClient,
    auth: AuthClient,
    /// Shared with every [`Client::with_timeout`] view, so that all of them
    /// keep their leases on one stream.
    keeper: Arc<OnceLock<LeaseKeeper>>,
    /// Stops the endpoint auto-sync task when the last clone, or view, goes.
    _auto_sync: Option<Arc<tokio_util::sync::DropGuard>>,
}

impl Handle {
    /// Every service on `transport`, sharing `keeper` and the auto-sync.
    fn new(
        transport: Transport,
        keeper: Arc<OnceLock<LeaseKeeper>>,
        _auto_sync: Option<Arc<tokio_util::sync::DropGuard>>,
    ) -> Handle {
        Handle {
            kv: KvClient::new(transport.clone()),
            watch: WatchClient::new(transport.clone()),
            lease: LeaseClient::new(transport.clone()),
            cluster: ClusterClient::new(transport.clone()),
            maintenance: MaintenanceClient::new(transport.clone()),
            auth: AuthClient::new(transport.clone()),
            transport,
            keeper,
            _auto_sync,
        }
    }
}

impl Client {
    /// Builds a client. Nothing connects until the first request, so an
    /// unreachable cluster is not an error here; a malformed config is, and
    /// so is a call outside a Tokio runtime ([`Error::InvalidConfig`]): the
    /// connections are driven by tasks of the runtime it is called in.
    pub fn connect(config: ClientConfig) -> Result<Client> {
        // Checked here, where tonic and the tasks below would panic.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::InvalidConfig(
                "Client::connect needs a Tokio runtime: call it from within one (e.g. in #[tokio::main], or after Runtime::enter)".into(),
            ));
        }
        let auto_sync = config.auto_sync_interval;
        let transport = Transport::new(config)?;
        let auto_sync =
            auto_sync.map(|every| Arc::new(endpoint_sync::spawn(transport.clone(), every)));
        Ok(Client {
            inner: Arc::new(Handle::new(transport, Arc::default(), auto_sync)),
        })
    }

    /// This client with another timeout for its unary calls: a cheap view
    /// that shares the connections, token, lease keep-alive and endpoint
    /// sync, so one slow or urgent call needs no client of its own. The
    /// timeout bounds each call whole, its retries and their waits included
    /// (see [`RetryPolicy`](crate::RetryPolicy)), and replaces
    /// [`ClientConfig::request_timeout`] for calls made through the view
    /// and its clones (scans, namespaces and sessions built on it too).
    /// Watches and the keep-alive stream are not timed out either way.
    ///
    /// ```no_run
    /// # async fn demo(client: aether_etcd::Client) -> aether_etcd::Result<()> {
    /// use std::time::Duration;
    /// use aether_etcd::Range;
    ///
    /// // A health check that must answer quickly, on the same connections.
    /// let quick = client.with_timeout(Duration::from_millis(500));
    /// quick.range(Range::key("/health").serializable()).await?;
    /// // A defragment that may take minutes.
    /// client.with_timeout(Duration::from_secs(600)).defragment().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_timeout(&self, timeout: Duration) -> Client {
        let inner = &self.inner;
        Client {
            inner: Arc::new(Handle::new(
                inner.transport.with_timeout(timeout),
                inner.keeper.clone(),
                inner._auto_sync.clone(),
            )),
        }
    }

    /// This client with all its unary calls on one connection: a cheap view
    /// like [`Client::with_timeout`]'s, for requests that must reach the
    /// member in the order they were sent. A client spreads its calls over
    /// [`ClientConfig::connections`] connections, and etcd orders nothing
    /// across them: a txn that uses a lease, sent just after its grant, can
    /// overtake the grant on another connection and be refused. On one
    /// connection their frames arrive in order; etcd still handles each
    /// request in a goroutine of its own, so a caller that cannot wait for
    /// the first answer must be ready for the rare reply that says the
    /// second went first. Failover moves the view to the next member like
    /// any call.
    pub fn in_order(&self) -> Client {
        let inner = &self.inner;
        Client {
            inner: Arc::new(Handle::new(
                inner.transport.in_order(),
                inner.keeper.clone(),
                inner._auto_sync.clone(),
            )),
        }
    }

    /// The timeout of this client's unary calls:
    /// [`ClientConfig::request_timeout`], or the one given to
    /// [`Client::with_timeout`].
    pub fn timeout(&self) -> Duration {
        self.inner.transport.timeout()
    }

    /// The config this client was built from. The endpoints and
    /// credentials in use may since have changed: see [`Client::endpoints`].
    pub fn config(&self) -> &ClientConfig {
        self.inner.transport.config()
    }

    /// The member URLs in use now.
    pub fn endpoints(&self) -> Vec<String> {
        self.inner.transport.urls()
    }

    /// Replaces the member URLs (for example from a member list). New calls
    /// and reconnecting streams use them; calls under way finish where they
    /// are. Unchanged URLs keep their connections.
    pub fn set_endpoints(&self, urls: Vec<String>) -> Result<()> {
        self.inner.transport.set_endpoints(urls)
    }

    /// Reads the TLS files named in the config again and, when their
    /// contents changed, makes every new connection use them (a rotated
    /// certificate needs no restart). Returns whether anything changed.
    /// Connections already open stay as they are until they break.
    pub fn reload_tls(&self) -> Result<bool> {
        self.inner.transport.reload_tls()
    }

    /// Replaces the auth credentials (a rotated password) and drops the
    /// cached token, so the next call authenticates with them.
    pub fn set_credentials(&self, credentials: Option<Credentials>) {
        self.inner.transport.set_credentials(credentials);
    }

    /// Fetches a fresh token with the configured credentials, which every
    /// call then carries, and returns it (for a caller that hands it to
    /// another program or a gRPC gateway); `None` without credentials.
    /// Refused credentials are [`Error::Auth`](crate::Error::Auth).
    pub async fn authenticate(&self) -> Result<Option<AuthToken>> {
        self.inner.auth.authenticate().await
    }

    /// A token for `user` and `password`, as etcd's `Authenticate` gives
    /// it, without touching this client's own credentials or token: for a
    /// caller that authenticates on behalf of someone else. Refused
    /// credentials are [`Error::Auth`](crate::Error::Auth).
    pub async fn authenticate_as(&self, user: &str, password: &str) -> Result<AuthToken> {
        self.inner.auth.authenticate_as(user, password).await
    }

    /// Turns auth on. etcd refuses unless user `root` exists and has the
    /// `root` role. From then on every request needs a token: this client
    /// (without credentials) can make no more calls, not even to turn it off.
    pub async fn auth_enable(&self) -> Result<Header> {
        self.inner.auth.auth_enable().await
    }

    /// Turns auth off (needs the `root` role).
    pub async fn auth_disable(&self) -> Result<Header> {
        self.inner.auth.auth_disable().await
    }

    /// Whether auth is on, and the auth store's revision. etcd 3.4 has no
    /// such call: it answers [`Error::Unimplemented`](super::Error::Unimplemented).
    pub async fn auth_status(&self) -> Result<AuthStatus> {
        self.inner.auth.auth_status().await
    }

    /// Adds a user with a password (etcdctl `user add NAME:PASSWORD`).
    /// [`Error::UserAlreadyExists`](super::Error::UserAlreadyExists) if the
    /// name is taken.
    ///
    /// ```no_run
    /// # async fn demo(root: aether_etcd::Client)
    /// # -> aether_etcd::Result<()> {
    /// use aether_etcd::Permission;
    ///
    /// root.role_add("reader").await?;
    /// root.role_grant_permission("reader", &Permission::read("/app/").with_prefix()).await?;
    /// root.user_add("alice", "s3cret").await?;
    /// root.user_grant_role("alice", "reader").await?;
    /// assert_eq!(root.user_get("alice").await?.roles, ["reader"]);
    /// # Ok(()) }
    /// ```
    pub async fn user_add(&self, name: &str, password: &str) -> Result<Header> {
        self.user_add_with_options(name, password, UserAddOptions::default())
            .await
    }

    /// Adds a user with options: [`UserAddOptions::no_password`] makes a
    /// user who authenticates by TLS client certificate only (etcdctl
    /// `user add --no-password`).
    pub async fn user_add_with_options(
        &self,
        name: &str,
        password: &str,
        options: UserAddOptions,
    ) -> Result<Header> {
        self.inner.auth.user_add(name, password, options).await
    }

    /// Deletes a user.
    pub async fn user_delete(&self, name: &str) -> Result<Header> {
        self.inner.auth.user_delete(name).await
    }

    /// A user's roles; [`Error::UserNotFound`](super::Error::UserNotFound)
    /// if there is no such user.
    pub async fn user_get(&self, name: &str) -> Result<UserInfo> {
        self.inner.auth.user_get(name).await
    }

    /// Every user's name.
    pub async fn user_list(&self) -> Result<NameList> {
        self.inner.auth.user_list().await
    }

    /// Sets a user's password. Tokens already issued stay valid until they
    /// expire.
    pub async fn user_change_password(&self, name: &str, password: &str) -> Result<Header> {
        self.inner.auth.user_change_password(name, password).await
    }

    /// Grants `role` to `user` (granting it again is no error).
    pub async fn user_grant_role(&self, user: &str, role: &str) -> Result<Header> {
        self.inner.auth.user_grant_role(user, role).await
    }

    /// Revokes `role` from `user`;
    /// [`Error::RoleNotGranted`](super::Error::RoleNotGranted) if the user
    /// did not have it.
    pub async fn user_revoke_role(&self, user: &str, role: &str) -> Result<Header> {
        self.inner.auth.user_revoke_role(user, role).await
    }

    /// Adds a role, with no permissions.
    pub async fn role_add(&self, name: &str) -> Result<Header> {
        self.inner.auth.role_add(name).await
    }

    /// Deletes a role (and revokes it from every user).
    pub async fn role_delete(&self, name: &str) -> Result<Header> {
        self.inner.auth.role_delete(name).await
    }

    /// A role's permissions; [`Error::RoleNotFound`](super::Error::RoleNotFound)
    /// if there is no such role.
    pub async fn role_get(&self, name: &str) -> Result<RoleInfo> {
        self.inner.auth.role_get(name).await
    }

    /// Every role's name.
    pub async fn role_list(&self) -> Result<NameList> {
        self.inner.auth.role_list().await
    }

    /// Grants `permission` to `role`. A permission on the same key and
    /// range end replaces the one there (so granting `Read` over a
    /// `ReadWrite` narrows it).
    pub async fn role_grant_permission(
        &self,
        role: &str,
        permission: &Permission,
    ) -> Result<Header> {
        self.inner
            .auth
            .role_grant_permission(role, permission)
            .await
    }

    /// Revokes `role`'s permission on exactly `[key, range_end)` (empty
    /// `range_end`: the one key; pass a [`Permission`]'s fields to revoke
    /// it). [`Error::PermissionNotGranted`](super::Error::PermissionNotGranted)
    /// if the role has none there.
    pub async fn role_revoke_permission(
        &self,
        role: &str,
        key: impl Into<Bytes>,
        range_end: impl Into<Bytes>,
    ) -> Result<Header> {
        self.inner
            .auth
            .role_revoke_permission(role, key.into(), range_end.into())
            .await
    }

    /// How many tokens this client has fetched (for tests of renewal).
    #[doc(hidden)]
    pub fn authentications(&self) -> u64 {
        self.inner.transport.authentications()
    }

    /// Reads a key, a range or a prefix.
    pub async fn range(&self, req: Range) -> Result<RangeResponse> {
        self.inner.kv.range(req).await
    }

    /// Writes a key.
    pub async fn put(&self, req: Put) -> Result<PutResponse> {
        self.inner.kv.put(req).await
    }

    /// Deletes a key, a range or a prefix.
    pub async fn delete(&self, req: Delete) -> Result<DeleteResponse> {
        self.inner.kv.delete(req).await
    }

    /// Runs a transaction.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.inner.kv.txn(txn).await
    }

    /// Compacts the history up to `revision`. With `physical`, waits until
    /// the compaction has been applied to the backend.
    pub async fn compact(&self, revision: i64, physical: bool) -> Result<Header> {
        self.inner.kv.compact(revision, physical).await
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
        let kv = self.inner.kv.clone();
        Scan::new(kv, from.into(), to.into(), page_size, revision)
    }

    /// Scans every key under `prefix`; see [`Client::scan`].
    pub fn scan_prefix(&self, prefix: impl Into<Bytes>, page_size: usize, revision: i64) -> Scan {
        let (from, to) = prefix_range(prefix);
        self.scan(from, to, page_size, revision)
    }

    /// Opens a new watch stream (its own gRPC stream and task).
    pub fn watch_stream(&self) -> WatchStream {
        self.inner.watch.stream()
    }

    /// Watches on a new stream of its own; see [`WatchStream::watch`].
    pub fn watch(&self, opts: WatchOptions) -> Result<(WatchStream, Watcher)> {
        self.inner.watch.watch(opts)
    }

    /// Grants a lease of `ttl`; the server picks its id.
    ///
    /// etcd counts TTLs in whole seconds: a sub-second part rounds up
    /// (1.2 s is granted as 2 s, so the lease never lives shorter than
    /// asked), and zero is [`Error::InvalidArgument`](crate::Error::InvalidArgument),
    /// refused before anything is sent. The server may raise a short TTL to
    /// its minimum; [`LeaseGrant::ttl`] is what it granted.
    pub async fn lease_grant(&self, ttl: Duration) -> Result<LeaseGrant> {
        self.inner.lease.grant(LeaseId::NONE, ttl).await
    }

    /// Grants a lease of `ttl` (rounded as for [`Client::lease_grant`])
    /// with an id of the caller's choosing ([`LeaseId::NONE`]: the server
    /// picks), as a process that re-creates a lease under a known id does.
    /// An id that exists already is
    /// [`Error::LeaseExists`](crate::Error::LeaseExists).
    pub async fn lease_grant_with_id(&self, id: LeaseId, ttl: Duration) -> Result<LeaseGrant> {
        self.inner.lease.grant(id, ttl).await
    }

    /// Revokes a lease, deleting every key attached to it.
    pub async fn lease_revoke(&self, id: LeaseId) -> Result<()> {
        self.inner.lease.revoke(id).await
    }

    /// Reads a lease's remaining TTL. A lease that does not exist has TTL -1.
    pub async fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> Result<LeaseTtl> {
        self.inner.lease.time_to_live(id, keys).await
    }

    /// A raw keep-alive stream for lease `id`, for a caller that runs its
    /// own loop (etcd-client's `lease_keep_alive`): each
    /// [`KeepAliveSender::keep_alive`] sends one request, and its answer
    /// (the TTL the lease has again, zero once it is gone) arrives on the
    /// [`KeepAliveStream`]. The first request is sent at once. The stream
    /// is opened on the member in use and is not reopened when it breaks:
    /// the caller opens another. Most callers want
    /// [`Client::lease_keeper`] instead, which keeps any number of leases
    /// alive on one stream, reopens it, and finds a stalled one.
    pub async fn lease_keep_alive_stream(
        &self,
        id: LeaseId,
    ) -> Result<(KeepAliveSender, KeepAliveStream)> {
        self.inner.lease.keep_alive_stream(id).await
    }

    /// Lists every lease that exists (etcd `LeaseLeases`, etcdctl `lease
    /// list`): granted and neither revoked nor expired. The member that
    /// answers reads its own lease table.
    pub async fn lease_list(&self) -> Result<LeaseList> {
        self.inner.lease.list().await
    }

    /// The client's shared keep-alive actor, started on first use.
    pub fn lease_keeper(&self) -> LeaseKeeper {
        let inner = &self.inner;
        inner.keeper.get_or_init(|| inner.lease.keeper()).clone()
    }

    /// Lists the cluster's members. With
    /// [`ClientConfig::auto_sync_interval`] set, a task does this
    /// periodically and makes the client's endpoints the started voting
    /// members' client URLs.
    ///
    /// ```no_run
    /// # async fn demo(client: aether_etcd::Client)
    /// # -> aether_etcd::Result<()> {
    /// let list = client.member_list().await?;
    /// for m in &list.members {
    ///     println!("{:x} {} {:?}", m.id, m.name, m.client_urls);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn member_list(&self) -> Result<MemberList> {
        self.inner.cluster.member_list().await
    }

    /// Adds a voting member that will serve at `peer_urls` (etcdctl
    /// `member add`), then start it with `--initial-cluster-state
    /// existing`. Until it starts the cluster counts it in the quorum
    /// without it answering: prefer [`Client::member_add_as_learner`] and
    /// [`Client::member_promote`].
    ///
    /// Refusals: [`Error::InvalidPeerUrls`](super::Error::InvalidPeerUrls),
    /// [`Error::PeerUrlExists`](super::Error::PeerUrlExists),
    /// [`Error::NotEnoughStartedMembers`](super::Error::NotEnoughStartedMembers)
    /// (an added member has not started yet), and
    /// [`Error::UnhealthyCluster`](super::Error::UnhealthyCluster) while
    /// the member asked has not been connected to every voting member for
    /// 5 s.
    ///
    /// # One change at a time
    ///
    /// etcd's raft takes a membership change (add, remove, update,
    /// promote) only once the previous one has been applied in its own
    /// bookkeeping, which can lag the answer to that previous change. A
    /// change proposed in between is dropped without a word, and the call
    /// waits until the request timeout ([`Error::Timeout`](super::Error::Timeout))
    /// having changed nothing (etcd-io/etcd#15528; 3.4 and 3.5 alike). So
    /// does a change right after one etcd refused while applying it (an
    /// unknown id, a peer URL in use, too many learners). Any write that
    /// completes after the previous change has answered (a put) proves
    /// the bookkeeping has caught up. Before retrying a change that timed
    /// out, list the members to see whether it happened.
    pub async fn member_add<I, S>(&self, peer_urls: I) -> Result<MemberAdded>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let urls = peer_urls.into_iter().map(Into::into).collect();
        self.inner.cluster.member_add(urls, false).await
    }

    /// Adds a learner, a member that receives the log without voting
    /// (etcdctl `member add --learner`); promote it with
    /// [`Client::member_promote`] once it has caught up. etcd allows one
    /// learner at a time: another is refused with
    /// [`Error::TooManyLearners`](super::Error::TooManyLearners). The
    /// other refusals are [`Client::member_add`]'s.
    ///
    /// ```no_run
    /// # async fn demo(client: aether_etcd::Client)
    /// # -> aether_etcd::Result<()> {
    /// use aether_etcd::Error;
    ///
    /// let added = client.member_add_as_learner(["http://10.0.0.4:2380"]).await?;
    /// // ... start the new etcd with --initial-cluster-state existing ...
    /// for _ in 0..50 {
    ///     match client.member_promote(added.member.id).await {
    ///         Ok(list) => break,
    ///         Err(Error::LearnerNotReady) => {
    ///             tokio::time::sleep(std::time::Duration::from_millis(200)).await
    ///         }
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn member_add_as_learner<I, S>(&self, peer_urls: I) -> Result<MemberAdded>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let urls = peer_urls.into_iter().map(Into::into).collect();
        self.inner.cluster.member_add(urls, true).await
    }

    /// Removes member `id` (etcdctl `member remove`) and returns the
    /// membership after it. One change at a time: see
    /// [`Client::member_add`]. [`Error::MemberNotFound`](super::Error::MemberNotFound)
    /// for an unknown (or already removed) id;
    /// [`Error::UnhealthyCluster`](super::Error::UnhealthyCluster) when
    /// the members left would not have an active quorum, as the member
    /// asked sees it (a member counts as active once connected for 5 s).
    pub async fn member_remove(&self, id: u64) -> Result<MemberList> {
        self.inner.cluster.member_remove(id).await
    }

    /// Replaces member `id`'s peer URLs (etcdctl `member update`) and
    /// returns the membership after it (one change at a time: see
    /// [`Client::member_add`]). The member must already listen
    /// there: its peers reach it at the new URLs from now on.
    /// [`Error::MemberNotFound`](super::Error::MemberNotFound) for an
    /// unknown id, [`Error::PeerUrlExists`](super::Error::PeerUrlExists)
    /// for another member's URL.
    pub async fn member_update<I, S>(&self, id: u64, peer_urls: I) -> Result<MemberList>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let urls = peer_urls.into_iter().map(Into::into).collect();
        self.inner.cluster.member_update(id, urls).await
    }

    /// Makes learner `id` a voting member (etcdctl `member promote`) and
    /// returns the membership after it (one change at a time: see
    /// [`Client::member_add`]).
    /// [`Error::LearnerNotReady`](super::Error::LearnerNotReady) until it
    /// has caught up with the leader (retry: see
    /// [`Client::member_add_as_learner`]),
    /// [`Error::MemberNotLearner`](super::Error::MemberNotLearner) for a
    /// voting member, [`Error::MemberNotFound`](super::Error::MemberNotFound)
    /// for an unknown id.
    pub async fn member_promote(&self, id: u64) -> Result<MemberList> {
        self.inner.cluster.member_promote(id).await
    }

    /// The status of the member this client is talking to.
    pub async fn status(&self) -> Result<Status> {
        self.inner.maintenance.status().await
    }

    /// Opens every connection to the member in use now (the
    /// [`ClientConfig::connections`] and the keep-alive stream's own), all
    /// at once; resolves when each is up or has failed. Without it each
    /// connection opens on the first call that lands on it, which waits for
    /// the handshakes (TCP, and TLS): over a long link, a few calls in a row
    /// spread over new connections each pay them in a row. Nothing is
    /// reported: a connection that could not be opened is tried again by
    /// the next call on it. It sends each connection one call to a method
    /// etcd does not serve, which needs no token and does no work there.
    pub async fn open_connections(&self) {
        self.inner.transport.open_connections().await
    }

    /// [`Client::open_connections`], and on each connection for calls a
    /// body of 60 KiB that starts the server's flow-control window growing
    /// before there is data to send. etcd's server opens each connection's
    /// receive window at 64 KiB and grows it, by about a doubling per round
    /// trip, only from the bytes it receives; sent during round trips a
    /// caller spends anyway (a session start's reads), this makes the first
    /// round trip of a bulk write carry twice as much on a new connection.
    /// Worth it over a long link before a large write; on a connection
    /// already warm it costs the bytes and nothing else. The server answers
    /// the call as it does [`Client::open_connections`]'s, unread.
    pub async fn warm_connections(&self) {
        self.inner.transport.warm_connections().await
    }

    /// The alarms raised anywhere in the cluster.
    ///
    /// ```no_run
    /// # async fn demo(client: aether_etcd::Client)
    /// # -> aether_etcd::Result<()> {
    /// use aether_etcd::AlarmKind;
    /// for alarm in client.alarm_list().await? {
    ///     if alarm.kind == AlarmKind::NoSpace {
    ///         // Free space first, or the alarm is raised again at once.
    ///         let rev = client.status().await?.revision;
    ///         client.compact(rev, true).await?;
    ///         client.defragment().await?;
    ///         client.alarm_disarm(alarm).await?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn alarm_list(&self) -> Result<Vec<Alarm>> {
        self.inner.maintenance.alarm_list().await
    }

    /// Disarms `alarm` (a `member_id` of 0 disarms it on every member) and
    /// returns the alarms that were disarmed. A NOSPACE alarm disarmed
    /// while the backend is still over quota is raised again by the next
    /// write.
    pub async fn alarm_disarm(&self, alarm: Alarm) -> Result<Vec<Alarm>> {
        self.inner.maintenance.alarm_disarm(alarm).await
    }

    /// Raises `alarm` on its member, as etcd does itself when a member runs
    /// out of space or finds corruption; returns the alarm raised. etcd
    /// accepts it from any client with admin rights (Go's clientv3 has no
    /// call for it; the API has the action). The cluster then behaves as
    /// for a real one: a NOSPACE alarm refuses writes with
    /// [`Error::NoSpace`](crate::Error::NoSpace) until
    /// [`Client::alarm_disarm`], which makes it useful to rehearse what
    /// a full cluster does to a program. `member_id` should be a member's
    /// (from [`Client::status`] or [`Client::member_list`]): etcd does not
    /// check it.
    pub async fn alarm_activate(&self, alarm: Alarm) -> Result<Vec<Alarm>> {
        self.inner.maintenance.alarm_activate(alarm).await
    }

    /// Validates, starts or cancels a downgrade of the cluster version to
    /// `version` ("3.4" or "3.4.0"; ignored by a cancel). etcd 3.5 and
    /// later: 3.4 answers [`Error::Unimplemented`](crate::Error::Unimplemented).
    /// The target must be exactly one minor release below the cluster's
    /// ([`Error::InvalidDowngradeTarget`](crate::Error::InvalidDowngradeTarget)
    /// otherwise); a validate or enable while a downgrade is in progress is
    /// [`Error::DowngradeInProgress`](crate::Error::DowngradeInProgress), a
    /// cancel without one [`Error::NoDowngradeInProgress`](crate::Error::NoDowngradeInProgress).
    /// A write: never retried once it may have reached the server. etcd
    /// 3.5.1 does not answer an enable: the call ends in
    /// [`Error::ServerTimeout`](crate::Error::ServerTimeout) after etcd's
    /// own request timeout (validate and cancel answer; the tests run
    /// those).
    pub async fn downgrade(
        &self,
        action: DowngradeAction,
        version: &str,
    ) -> Result<DowngradeResponse> {
        self.inner.maintenance.downgrade(action, version).await
    }

    /// Defragments the backend of the member this client talks to,
    /// returning the space freed by compaction to the file system. The
    /// member blocks reads and writes meanwhile, and a large backend can
    /// take longer than the default request timeout: call it through
    /// [`Client::with_timeout`] with a longer one.
    pub async fn defragment(&self) -> Result<Header> {
        self.inner.maintenance.defragment().await
    }

    /// The hash of the member's KV history up to `revision` (0: the
    /// latest). Two members that agree on the history give the same hash
    /// for the same revision and compact revision; it is etcd's own
    /// corruption check.
    pub async fn hash_kv(&self, revision: i64) -> Result<HashKv> {
        self.inner.maintenance.hash_kv(revision).await
    }

    /// The hash of the whole backend of the member this client talks to
    /// (etcd `Hash`): the keys with their history, and the leases,
    /// membership, auth and alarms. etcd meant it for tests: it takes no
    /// lock, so under writes the hash and the header's revision need not
    /// match; [`Client::hash_kv`] is the consistency check. With no writes
    /// under way, members that have applied the same log report the same
    /// hash, and any write changes it.
    pub async fn hash(&self) -> Result<Hash> {
        self.inner.maintenance.hash().await
    }

    /// Streams a snapshot of the backend of the member this client talks
    /// to, chunk by chunk as it is read (never whole in memory; see
    /// [`Snapshot`]). Write every chunk, the final checksum too, to get
    /// what `etcdctl snapshot save` writes and `snapshot restore` takes.
    /// The request timeout bounds the opening and each wait for a chunk,
    /// not the whole transfer. Needs the `root` role when auth is on.
    ///
    /// ```no_run
    /// # async fn demo(client: aether_etcd::Client)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// use std::io::Write;
    /// use futures_util::StreamExt;
    ///
    /// let mut file = std::fs::File::create("/backup/etcd.db")?;
    /// let mut snapshot = client.snapshot().await?;
    /// while let Some(chunk) = snapshot.next().await {
    ///     file.write_all(&chunk?.blob)?;
    /// }
    /// file.sync_all()?;
    /// println!("{:?} bytes", snapshot.size());
    /// # Ok(()) }
    /// ```
    pub async fn snapshot(&self) -> Result<Snapshot> {
        self.inner.maintenance.snapshot().await
    }

    /// Hands the raft leadership to voting member `target` (etcdctl
    /// `move-leader`), returning once it leads. The request must reach
    /// the leader: a client talking to another member gets
    /// [`Error::NotRaftLeader`](super::Error::NotRaftLeader) (find the
    /// leader with [`Client::status`]: `leader == member_id`). A learner
    /// or unknown target is [`Error::BadLeaderTransferee`](super::Error::BadLeaderTransferee).
    pub async fn move_leader(&self, target: u64) -> Result<()> {
        self.inner.maintenance.move_leader(target).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_outside_a_runtime_is_an_error_not_a_panic() {
        let err = Client::connect(ClientConfig::new(["http://127.0.0.1:1"])).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidConfig(m) if m.contains("needs a Tokio runtime")),
            "{err:?}"
        );
        // Inside one, the same config builds a client (nothing connects yet).
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _in = rt.enter();
        assert!(Client::connect(ClientConfig::new(["http://127.0.0.1:1"])).is_ok());
    }
}
