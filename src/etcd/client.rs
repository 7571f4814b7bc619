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

use std::sync::atomic::{AtomicUsize, Ordering};
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
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: ClientConfig,
    channels: Vec<Channel>,
    current: AtomicUsize,
    token: Arc<RwLock<Option<AsciiMetadataValue>>>,
    auth_lock: tokio::sync::Mutex<()>,
    authentications: std::sync::atomic::AtomicU64,
    pub(crate) keeper: OnceLock<LeaseKeeper>,
}

impl Client {
    /// Builds a client. Nothing connects until the first request, so an
    /// unreachable cluster is not an error here; a malformed config is.
    /// Call it inside a Tokio runtime: the connections are driven by tasks.
    pub fn connect(config: ClientConfig) -> Result<Client> {
        if config.endpoints.is_empty() {
            return Err(Error::InvalidConfig("no endpoints".into()));
        }
        let tls = match &config.tls {
            Some(tls) => Some(tls_config(tls)?),
            None => None,
        };
        let mut channels = Vec::with_capacity(config.endpoints.len());
        for url in &config.endpoints {
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
                let tls = tls.clone().unwrap_or_default();
                ep = ep.tls_config(tls)?;
            }
            channels.push(ep.connect_lazy());
        }
        Ok(Client {
            inner: Arc::new(Inner {
                config,
                channels,
                current: AtomicUsize::new(0),
                token: Arc::new(RwLock::new(None)),
                auth_lock: tokio::sync::Mutex::new(()),
                authentications: std::sync::atomic::AtomicU64::new(0),
                keeper: OnceLock::new(),
            }),
        })
    }

    /// The config this client was built from.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// The service for the endpoint currently in use, and its index.
    pub(crate) fn svc(&self) -> (usize, Svc) {
        let i = self.inner.current.load(Ordering::Relaxed) % self.inner.channels.len();
        let svc = InterceptedService::new(
            self.inner.channels[i].clone(),
            TokenInterceptor(self.inner.token.clone()),
        );
        (i, svc)
    }

    /// Moves off endpoint `failed` if it is still the current one.
    pub(crate) fn rotate(&self, failed: usize) {
        let n = self.inner.channels.len();
        let _ = self.inner.current.compare_exchange(
            failed,
            (failed + 1) % n,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    pub(crate) fn max_decoding(&self) -> usize {
        self.inner.config.max_decoding_message_size
    }

    pub(crate) fn max_encoding(&self) -> usize {
        self.inner.config.max_encoding_message_size
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
        let timeout = self.inner.config.request_timeout;
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
                if err.not_sent() && failovers + 1 < self.inner.channels.len() {
                    failovers += 1;
                    continue;
                }
            }
            if err.is_invalid_token() && self.inner.config.credentials.is_some() && !reauthed {
                reauthed = true;
                self.authenticate().await?;
                continue;
            }
            return Err(err);
        }
    }

    /// Fetches a token on first use when credentials are configured.
    pub(crate) async fn ensure_token(&self) -> Result<()> {
        if self.inner.config.credentials.is_none()
            || self
                .inner
                .token
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_some()
        {
            return Ok(());
        }
        self.authenticate().await
    }

    /// Fetches a fresh token with the configured credentials.
    pub async fn authenticate(&self) -> Result<()> {
        let Some(creds) = &self.inner.config.credentials else {
            return Ok(());
        };
        let _guard = self.inner.auth_lock.lock().await;
        let timeout = self.inner.config.request_timeout;
        let req = PbAuthenticateRequest {
            name: creds.user.clone(),
            password: creds.password.clone(),
        };
        let mut last = Error::Closed;
        for _ in 0..self.inner.channels.len() {
            let (idx, _) = self.svc();
            // Authenticate on a bare channel: a stale token must not be sent.
            let mut auth = AuthClient::new(self.inner.channels[idx].clone());
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
                    *self.inner.token.write().unwrap_or_else(|e| e.into_inner()) = Some(token);
                    self.inner.authentications.fetch_add(1, Ordering::Relaxed);
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

    /// How many tokens this client has fetched (for tests of renewal).
    #[doc(hidden)]
    pub fn authentications(&self) -> u64 {
        self.inner.authentications.load(Ordering::Relaxed)
    }

    /// Drops the cached token so the next call authenticates again.
    pub(crate) fn clear_token(&self) {
        *self.inner.token.write().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

fn read_file(path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_string(),
        source,
    })
}

fn tls_config(tls: &TlsConfig) -> Result<ClientTlsConfig> {
    let mut cfg = ClientTlsConfig::new();
    if let Some(ca) = &tls.ca_file {
        cfg = cfg.ca_certificate(Certificate::from_pem(read_file(ca)?));
    }
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            cfg = cfg.identity(Identity::from_pem(read_file(cert)?, read_file(key)?));
        }
        (None, None) => {}
        _ => {
            return Err(Error::InvalidConfig(
                "a client certificate needs both cert and key".into(),
            ));
        }
    }
    if let Some(name) = &tls.server_name {
        cfg = cfg.domain_name(name.clone());
    }
    Ok(cfg)
}
