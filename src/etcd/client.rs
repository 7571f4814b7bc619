//! Connection setup: endpoints, failover, TLS, auth, and the unary call path.
//!
//! One lazily connected tonic [`Channel`] is built per endpoint. Calls go to
//! the current endpoint; a transport failure rotates to the next one, and a
//! call that provably never left (the connection could not be made) is sent
//! again there at once. Anything else is returned: whether to retry a write
//! is the caller's decision.
//!
//! Auth is a token in the `token` metadata header. It is fetched on first use
//! and fetched again, once, when etcd says it is no longer valid.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::error::{Error, Result};
use super::lease::LeaseKeeper;
use super::pb::{AuthClient, PbAuthenticateRequest};

/// Default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default per-request timeout for unary calls.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default HTTP/2 keep-alive ping interval.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Default time to wait for a keep-alive ping's answer.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default largest message accepted from etcd. Watch responses that catch up
/// over history can be tens of MiB, far above tonic's 4 MiB default.
pub const DEFAULT_MAX_DECODING_MESSAGE_SIZE: usize = 256 * 1024 * 1024;
/// Default largest message sent. etcd's own receive limit is lower
/// (`--max-request-bytes` plus 512 KiB); it is the one that matters.
pub const DEFAULT_MAX_ENCODING_MESSAGE_SIZE: usize = 64 * 1024 * 1024;
/// Default budget of each watcher's queue, in encoded bytes of the
/// responses waiting for its consumer. A catch-up response can be tens of
/// MiB; once a watcher's queue is full its stream waits (and HTTP/2 flow
/// control holds back the server) instead of buffering more. Twice the
/// stream window: a paused consumer holds at most this much in the client
/// plus one window in flight.
pub const DEFAULT_WATCHER_BUFFER_BYTES: usize = 16 * 1024 * 1024;
/// Default HTTP/2 flow-control window of each stream: what etcd may send on
/// one watch, keep-alive or unary stream before the client reads it. 8 MiB
/// keeps a page of a range or a watch catch-up moving at full speed across
/// a region-to-region round trip.
pub const DEFAULT_STREAM_WINDOW: u32 = 8 * 1024 * 1024;
/// Default HTTP/2 flow-control window of the whole connection, the largest
/// HTTP/2 allows. The stream windows bound what is buffered; this one is
/// large because h2 (>= 0.4.16) closes a connection once too many *small*
/// DATA frames sit unread, with a budget of half this window. etcd sends
/// every watch response and keep-alive answer as one small frame, so with
/// the 64 KiB default a consumer that pauses for a few hundred responses,
/// or a few hundred concurrent small calls, got the whole connection (and
/// every call on it) reset with `too_many_data_frames`. The windows are
/// fixed: an adaptive window overrides both and, on a low-latency link,
/// keeps the budget near its 25 KiB floor. The 100k-key sync runs at the
/// same speed either way (BENCHMARKS.md).
pub const DEFAULT_CONNECTION_WINDOW: u32 = (1 << 31) - 1;
/// Default HTTP/2 connections per endpoint for calls and streams (the
/// keep-alive stream has one more of its own). One is right on a LAN; see
/// [`ClientConfig::connections`] for a long link.
pub const DEFAULT_CONNECTIONS: usize = 1;

/// TLS settings for `https://` endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM bundle of the CAs that sign the server certificates.
    pub ca_file: Option<String>,
    /// PEM client certificate for mutual TLS.
    pub cert_file: Option<String>,
    /// PEM private key for `cert_file`.
    pub key_file: Option<String>,
    /// Name to verify the server certificate against, instead of the host
    /// in the URL.
    pub server_name: Option<String>,
}

/// Username and password for etcd's auth.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The etcd user.
    pub user: String,
    /// The user's password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// How to reach one etcd cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// Member URLs, `http://host:port` or `https://host:port`.
    pub endpoints: Vec<String>,
    /// TLS settings, used for `https://` endpoints.
    pub tls: Option<TlsConfig>,
    /// Auth credentials, if the cluster has auth enabled.
    pub credentials: Option<Credentials>,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Timeout for each unary request.
    pub request_timeout: Duration,
    /// HTTP/2 keep-alive ping interval.
    pub keepalive_interval: Duration,
    /// Time to wait for a keep-alive ping's answer.
    pub keepalive_timeout: Duration,
    /// Largest message accepted from etcd.
    pub max_decoding_message_size: usize,
    /// Largest message sent to etcd.
    pub max_encoding_message_size: usize,
    /// HTTP/2 window of each stream, in bytes.
    pub stream_window: u32,
    /// HTTP/2 window of each connection, in bytes.
    pub connection_window: u32,
    /// Ask etcd to serve watches only from a member that has a leader
    /// (`hasleader` metadata), so a partitioned member's watch fails over
    /// instead of going quiet. On by default.
    pub watch_require_leader: bool,
    /// Refresh the endpoints from the cluster's member list this often
    /// (`None`: never). See [`Client::member_list`]; the task ends with the
    /// last `Client` clone.
    pub auto_sync_interval: Option<Duration>,
    /// Bytes of responses each watcher may hold unread before its stream
    /// waits for the consumer (one larger response still passes, alone).
    /// 0 means one response at a time. See the `watch` module docs.
    pub watcher_buffer_bytes: usize,
    /// HTTP/2 connections per endpoint; calls and streams are spread over
    /// them round-robin. etcd's gRPC server (grpc-go) opens every
    /// connection's receive window at 64 KiB and grows it by about a
    /// doubling per round trip, so over a 250 ms link one new connection
    /// carries ~64 KiB in its first round trip, whatever the client has in
    /// flight: a 50k-key bulk write took 3.4 s on one connection and 1.2 s
    /// on 16 (BENCHMARKS.md §7). A long-haul bulk writer wants several;
    /// each costs a TCP (and TLS) handshake and a little memory. At least 1.
    pub connections: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            endpoints: vec!["http://127.0.0.1:2379".to_string()],
            tls: None,
            credentials: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            max_decoding_message_size: DEFAULT_MAX_DECODING_MESSAGE_SIZE,
            max_encoding_message_size: DEFAULT_MAX_ENCODING_MESSAGE_SIZE,
            stream_window: DEFAULT_STREAM_WINDOW,
            connection_window: DEFAULT_CONNECTION_WINDOW,
            watch_require_leader: true,
            auto_sync_interval: None,
            watcher_buffer_bytes: DEFAULT_WATCHER_BUFFER_BYTES,
            connections: DEFAULT_CONNECTIONS,
        }
    }
}

impl ClientConfig {
    /// A config for these endpoints with every other setting at its default.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ..ClientConfig::default()
        }
    }

    /// The same config with `n` connections per endpoint (see
    /// [`ClientConfig::connections`]).
    #[must_use]
    pub fn with_connections(mut self, n: usize) -> Self {
        self.connections = n;
        self
    }
}

/// The gRPC service every generated client is built on.
pub(crate) type Svc = InterceptedService<Channel, TokenInterceptor>;

/// Adds the auth token, when there is one, to every request.
#[derive(Clone)]
pub(crate) struct TokenInterceptor(Arc<RwLock<Option<AsciiMetadataValue>>>);

impl Interceptor for TokenInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = self.0.read().unwrap_or_else(|e| e.into_inner()).clone() {
            req.metadata_mut().insert("token", token);
        }
        Ok(req)
    }
}

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
/// # async fn demo() -> aether_replicator::etcd::Result<()> {
/// use aether_replicator::etcd::{Client, ClientConfig, Put, Range};
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

/// What the `Client` clones share: the transport, and the tasks that only
/// live as long as some clone does.
struct Handle {
    transport: Transport,
    keeper: OnceLock<LeaseKeeper>,
    /// Stops the endpoint auto-sync task when the last clone goes.
    _auto_sync: Option<tokio_util::sync::DropGuard>,
}

/// The connections, token and config: what a background task needs to make
/// calls. Tasks hold this, never a [`Client`], so that a task never keeps
/// alive the handle whose drop is meant to stop it.
#[derive(Clone)]
pub(crate) struct Transport(Arc<Shared>);

struct Shared {
    config: ClientConfig,
    endpoints: RwLock<Arc<Endpoints>>,
    current: AtomicUsize,
    /// Round-robin counter over an endpoint's connections.
    spread: AtomicUsize,
    token: Arc<RwLock<Option<AsciiMetadataValue>>>,
    credentials: RwLock<Option<Credentials>>,
    auth_lock: tokio::sync::Mutex<()>,
    authentications: AtomicU64,
}

/// One set of endpoints and their lazily connected channels. Replaced as a
/// whole by [`Client::set_endpoints`] and [`Client::reload_tls`]; calls and
/// streams already under way keep the old channels until they end.
struct Endpoints {
    urls: Vec<String>,
    /// Per URL, [`ClientConfig::connections`] channels.
    channels: Vec<Vec<Channel>>,
    /// A second connection per URL for the lease keep-alive stream only,
    /// so that a keep-alive never waits behind bulk traffic (mirror txns,
    /// range pages) in the shared connection's HTTP/2 flow-control windows
    /// and TCP send buffer. Over a long, full link that queue can hold
    /// seconds of data, longer than a short lease's TTL/3. Lazily
    /// connected: a client that keeps no lease never opens it.
    lease_channels: Vec<Channel>,
    tls: Option<TlsMaterial>,
}

/// The TLS files' contents as last read, to tell whether a reload changed
/// anything.
#[derive(Clone, PartialEq, Eq)]
struct TlsMaterial {
    ca: Option<Vec<u8>>,
    cert: Option<Vec<u8>>,
    key: Option<Vec<u8>>,
}

impl Client {
    /// Builds a client. Nothing connects until the first request, so an
    /// unreachable cluster is not an error here; a malformed config is.
    /// Call it inside a Tokio runtime: the connections are driven by tasks.
    pub fn connect(config: ClientConfig) -> Result<Client> {
        let tls = match &config.tls {
            Some(tls) => Some(TlsMaterial::read(tls)?),
            None => None,
        };
        let endpoints = build_endpoints(&config, config.endpoints.clone(), tls)?;
        let auto_sync = config.auto_sync_interval;
        let transport = Transport(Arc::new(Shared {
            credentials: RwLock::new(config.credentials.clone()),
            config,
            endpoints: RwLock::new(Arc::new(endpoints)),
            current: AtomicUsize::new(0),
            spread: AtomicUsize::new(0),
            token: Arc::new(RwLock::new(None)),
            auth_lock: tokio::sync::Mutex::new(()),
            authentications: AtomicU64::new(0),
        }));
        let _auto_sync =
            auto_sync.map(|every| super::endpoint_sync::spawn(transport.clone(), every));
        Ok(Client {
            inner: Arc::new(Handle {
                transport,
                keeper: OnceLock::new(),
                _auto_sync,
            }),
        })
    }

    /// The config this client was built from. The endpoints and
    /// credentials in use may since have changed: see [`Client::endpoints`].
    pub fn config(&self) -> &ClientConfig {
        &self.inner.transport.0.config
    }

    /// The member URLs in use now.
    pub fn endpoints(&self) -> Vec<String> {
        self.inner.transport.endpoints().urls.clone()
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
        let t = &self.inner.transport;
        let Some(tls) = &t.config().tls else {
            return Ok(false);
        };
        let material = TlsMaterial::read(tls)?;
        let current = t.endpoints();
        if current.tls.as_ref() == Some(&material) {
            return Ok(false);
        }
        let next = build_endpoints(t.config(), current.urls.clone(), Some(material))?;
        t.replace_endpoints(next);
        Ok(true)
    }

    /// Replaces the auth credentials (a rotated password) and drops the
    /// cached token, so the next call authenticates with them.
    pub fn set_credentials(&self, credentials: Option<Credentials>) {
        let t = &self.inner.transport;
        *t.0.credentials.write().unwrap_or_else(|e| e.into_inner()) = credentials;
        t.clear_token();
    }

    /// Fetches a fresh token with the configured credentials.
    pub async fn authenticate(&self) -> Result<()> {
        self.inner.transport.authenticate().await
    }

    /// How many tokens this client has fetched (for tests of renewal).
    #[doc(hidden)]
    pub fn authentications(&self) -> u64 {
        self.inner
            .transport
            .0
            .authentications
            .load(Ordering::Relaxed)
    }

    /// The transport, for a background task that must not own the client.
    pub(crate) fn transport(&self) -> &Transport {
        &self.inner.transport
    }

    /// The client's shared keep-alive actor, started on first use.
    pub(crate) fn keeper_or_init(&self, init: impl FnOnce() -> LeaseKeeper) -> LeaseKeeper {
        self.inner.keeper.get_or_init(init).clone()
    }

    pub(crate) async fn unary<Req, Resp, F, Fut>(&self, req: Req, call: F) -> Result<Resp>
    where
        Req: Clone,
        F: Fn(Svc, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.inner.transport.unary(req, call).await
    }

    pub(crate) fn max_decoding(&self) -> usize {
        self.config().max_decoding_message_size
    }

    pub(crate) fn max_encoding(&self) -> usize {
        self.config().max_encoding_message_size
    }
}

impl Transport {
    /// See [`Client::set_endpoints`]; here so that the auto-sync task,
    /// which holds only the transport, can call it.
    pub(crate) fn set_endpoints(&self, urls: Vec<String>) -> Result<()> {
        let current = self.endpoints();
        if current.urls == urls {
            return Ok(());
        }
        let mut next = build_endpoints(self.config(), urls, current.tls.clone())?;
        for j in 0..next.urls.len() {
            if let Some(i) = current.urls.iter().position(|u| *u == next.urls[j]) {
                next.channels[j] = current.channels[i].clone();
                next.lease_channels[j] = current.lease_channels[i].clone();
            }
        }
        self.replace_endpoints(next);
        Ok(())
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.0.config
    }

    fn endpoints(&self) -> Arc<Endpoints> {
        self.0
            .endpoints
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn replace_endpoints(&self, next: Endpoints) {
        *self.0.endpoints.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
    }

    /// The service for the endpoint currently in use, and its index.
    pub(crate) fn svc(&self) -> (usize, Svc) {
        let eps = self.endpoints();
        let i = self.0.current.load(Ordering::Relaxed) % eps.channels.len();
        let conns = &eps.channels[i];
        let c = self.0.spread.fetch_add(1, Ordering::Relaxed) % conns.len();
        let svc = InterceptedService::new(conns[c].clone(), TokenInterceptor(self.0.token.clone()));
        (i, svc)
    }

    /// Like [`Transport::svc`], on the endpoint's dedicated keep-alive
    /// connection.
    pub(crate) fn lease_svc(&self) -> (usize, Svc) {
        let eps = self.endpoints();
        let i = self.0.current.load(Ordering::Relaxed) % eps.lease_channels.len();
        let svc = InterceptedService::new(
            eps.lease_channels[i].clone(),
            TokenInterceptor(self.0.token.clone()),
        );
        (i, svc)
    }

    /// Moves off endpoint `failed` if it is still the current one.
    pub(crate) fn rotate(&self, failed: usize) {
        let n = self.endpoints().channels.len();
        let _ = self.0.current.compare_exchange(
            failed,
            (failed + 1) % n,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    pub(crate) fn max_decoding(&self) -> usize {
        self.0.config.max_decoding_message_size
    }

    pub(crate) fn max_encoding(&self) -> usize {
        self.0.config.max_encoding_message_size
    }

    fn credentials(&self) -> Option<Credentials> {
        self.0
            .credentials
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sends one unary request: per-request timeout, endpoint failover for
    /// requests that never left, and one re-authentication when the token
    /// has expired.
    pub(crate) async fn unary<Req, Resp, F, Fut>(&self, req: Req, call: F) -> Result<Resp>
    where
        Req: Clone,
        F: Fn(Svc, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.ensure_token().await?;
        let timeout = self.0.config.request_timeout;
        let mut reauthed = false;
        let mut failovers = 0;
        loop {
            let (idx, svc) = self.svc();
            let mut request = tonic::Request::new(req.clone());
            request.set_timeout(timeout);
            let err = match tokio::time::timeout(timeout, call(svc, request)).await {
                Ok(Ok(resp)) => return Ok(resp.into_inner()),
                Ok(Err(status)) => Error::from(status),
                Err(_) => Error::Timeout(timeout),
            };
            let err = match err {
                Error::Timeout(_) => Error::Timeout(timeout),
                e => e,
            };
            if err.is_transient() {
                self.rotate(idx);
                if err.not_sent() && failovers + 1 < self.endpoints().channels.len() {
                    failovers += 1;
                    continue;
                }
            }
            if err.is_invalid_token() && self.credentials().is_some() && !reauthed {
                reauthed = true;
                self.authenticate().await?;
                continue;
            }
            return Err(err);
        }
    }

    /// Fetches a token on first use when credentials are configured.
    pub(crate) async fn ensure_token(&self) -> Result<()> {
        if self.credentials().is_none()
            || self
                .0
                .token
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_some()
        {
            return Ok(());
        }
        self.authenticate().await
    }

    /// Fetches a fresh token with the current credentials.
    pub(crate) async fn authenticate(&self) -> Result<()> {
        let Some(creds) = self.credentials() else {
            return Ok(());
        };
        let _guard = self.0.auth_lock.lock().await;
        let timeout = self.0.config.request_timeout;
        let req = PbAuthenticateRequest {
            name: creds.user.clone(),
            password: creds.password.clone(),
        };
        let mut last = Error::Closed;
        let eps = self.endpoints();
        for _ in 0..eps.channels.len() {
            let (idx, _) = self.svc();
            // Authenticate on a bare channel: a stale token must not be sent.
            let mut auth = AuthClient::new(eps.channels[idx % eps.channels.len()][0].clone());
            let mut request = tonic::Request::new(req.clone());
            request.set_timeout(timeout);
            let res = match tokio::time::timeout(timeout, auth.authenticate(request)).await {
                Ok(r) => r.map_err(Error::from),
                Err(_) => Err(Error::Timeout(timeout)),
            };
            match res {
                Ok(resp) => {
                    let token = AsciiMetadataValue::try_from(resp.into_inner().token)
                        .map_err(|_| Error::Auth("server sent a token that is not ASCII".into()))?;
                    *self.0.token.write().unwrap_or_else(|e| e.into_inner()) = Some(token);
                    self.0.authentications.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if e.is_transient() => {
                    self.rotate(idx);
                    last = e;
                }
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Drops the cached token so the next call authenticates again.
    pub(crate) fn clear_token(&self) {
        *self.0.token.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl TlsMaterial {
    fn read(tls: &TlsConfig) -> Result<TlsMaterial> {
        let read = |p: &Option<String>| p.as_deref().map(read_file).transpose();
        let material = TlsMaterial {
            ca: read(&tls.ca_file)?,
            cert: read(&tls.cert_file)?,
            key: read(&tls.key_file)?,
        };
        if material.cert.is_some() != material.key.is_some() {
            return Err(Error::InvalidConfig(
                "a client certificate needs both cert and key".into(),
            ));
        }
        Ok(material)
    }

    fn client_config(&self, server_name: Option<&str>) -> ClientTlsConfig {
        let mut cfg = ClientTlsConfig::new();
        if let Some(ca) = &self.ca {
            cfg = cfg.ca_certificate(Certificate::from_pem(ca));
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            cfg = cfg.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = server_name {
            cfg = cfg.domain_name(name);
        }
        cfg
    }
}

/// One lazily connected channel per URL, with the client's settings.
fn build_endpoints(
    config: &ClientConfig,
    urls: Vec<String>,
    tls: Option<TlsMaterial>,
) -> Result<Endpoints> {
    if urls.is_empty() {
        return Err(Error::InvalidConfig("no endpoints".into()));
    }
    if config.connections == 0 {
        return Err(Error::InvalidConfig(
            "connections per endpoint must be at least 1".into(),
        ));
    }
    let server_name = config.tls.as_ref().and_then(|t| t.server_name.as_deref());
    let tls_config = tls.as_ref().map(|m| m.client_config(server_name));
    let mut channels = Vec::with_capacity(urls.len());
    let mut lease_channels = Vec::with_capacity(urls.len());
    for url in &urls {
        let https = url.starts_with("https://");
        if !https && !url.starts_with("http://") {
            return Err(Error::InvalidConfig(format!(
                "endpoint {url:?} must start with http:// or https://"
            )));
        }
        let mut ep = Endpoint::from_shared(url.clone())
            .map_err(|e| Error::InvalidConfig(format!("endpoint {url:?}: {e}")))?
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(config.keepalive_interval)
            .keep_alive_timeout(config.keepalive_timeout)
            .keep_alive_while_idle(true)
            .initial_stream_window_size(config.stream_window)
            .initial_connection_window_size(config.connection_window);
        if https {
            ep = ep.tls_config(tls_config.clone().unwrap_or_default())?;
        }
        channels.push((0..config.connections).map(|_| ep.connect_lazy()).collect());
        lease_channels.push(ep.connect_lazy());
    }
    Ok(Endpoints {
        urls,
        channels,
        lease_channels,
        tls,
    })
}

fn read_file(path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_string(),
        source,
    })
}
