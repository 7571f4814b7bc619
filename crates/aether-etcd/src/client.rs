//! The `Client` facade: one value that owns the transport and hands each
//! call to its service, so callers see one type and one set of methods,
//! and the services never see each other.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::auth::{
    AuthClient, AuthStatus, NameList, Permission, RoleInfo, UserAddOptions, UserInfo,
};
use super::cluster::{ClusterClient, MemberList};
use super::endpoint_sync;
use super::error::Result;
use super::header::Header;
use super::kv::{
    Delete, DeleteResponse, KvClient, Put, PutResponse, Range, RangeResponse, Scan, Txn,
    TxnResponse, prefix_range,
};
use super::lease::{LeaseClient, LeaseGrant, LeaseKeeper, LeaseTtl};
use super::maintenance::{Alarm, HashKv, MaintenanceClient, Status};
use super::transport::{ClientConfig, Credentials, Transport};
use super::watch::{WatchClient, WatchOptions, WatchStream, Watcher};

/// An etcd v3 client. Cheap to clone; clones share connections, the auth
/// token and the lease keep-alive stream.
///
/// **Ownership.** The client's background tasks (the lease keep-alive, each
/// watch stream, endpoint auto-sync) hold the connections, never a `Client`:
/// dropping the last clone stops the keep-alive task and closes the
/// connections once no [`super::WatchStream`] or [`super::Watcher`] is left.
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
struct Handle {
    transport: Transport,
    kv: KvClient,
    watch: WatchClient,
    lease: LeaseClient,
    cluster: ClusterClient,
    maintenance: MaintenanceClient,
    auth: AuthClient,
    keeper: OnceLock<LeaseKeeper>,
    /// Stops the endpoint auto-sync task when the last clone goes.
    _auto_sync: Option<tokio_util::sync::DropGuard>,
}

impl Client {
    /// Builds a client. Nothing connects until the first request, so an
    /// unreachable cluster is not an error here; a malformed config is.
    /// Call it inside a Tokio runtime: the connections are driven by tasks.
    pub fn connect(config: ClientConfig) -> Result<Client> {
        let auto_sync = config.auto_sync_interval;
        let transport = Transport::new(config)?;
        let _auto_sync = auto_sync.map(|every| endpoint_sync::spawn(transport.clone(), every));
        Ok(Client {
            inner: Arc::new(Handle {
                kv: KvClient::new(transport.clone()),
                watch: WatchClient::new(transport.clone()),
                lease: LeaseClient::new(transport.clone()),
                cluster: ClusterClient::new(transport.clone()),
                maintenance: MaintenanceClient::new(transport.clone()),
                auth: AuthClient::new(transport.clone()),
                transport,
                keeper: OnceLock::new(),
                _auto_sync,
            }),
        })
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

    /// Fetches a fresh token with the configured credentials.
    pub async fn authenticate(&self) -> Result<()> {
        self.inner.auth.authenticate().await
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

    /// Grants a lease of `ttl` seconds. With `id` 0 the server picks the id.
    pub async fn lease_grant(&self, ttl: i64, id: i64) -> Result<LeaseGrant> {
        self.inner.lease.grant(ttl, id).await
    }

    /// Revokes a lease, deleting every key attached to it.
    pub async fn lease_revoke(&self, id: i64) -> Result<()> {
        self.inner.lease.revoke(id).await
    }

    /// Reads a lease's remaining TTL. A lease that does not exist has TTL -1.
    pub async fn lease_time_to_live(&self, id: i64, keys: bool) -> Result<LeaseTtl> {
        self.inner.lease.time_to_live(id, keys).await
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

    /// Defragments the backend of the member this client talks to,
    /// returning the space freed by compaction to the file system. The
    /// member blocks reads and writes meanwhile, and a large backend can
    /// take longer than the default request timeout: raise
    /// [`ClientConfig::request_timeout`] for it.
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
}
