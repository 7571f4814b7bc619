//! The transport: endpoints, balancing, failover, retries, TLS, auth, and
//! the unary call path. Every service is built on it and it knows none of
//! them.
//!
//! One lazily connected tonic [`Channel`](tonic::transport::Channel) is
//! built per endpoint (more with [`ClientConfig::connections`]). Unary calls
//! go to the current endpoint ([`Balance::Pinned`], the default) or
//! round-robin over the healthy ones ([`Balance::RoundRobin`]); streams
//! always to the current one. A transport failure moves the current
//! endpoint to the next one. A failed call is sent again as
//! [`RetryPolicy`] says (`retry`: reads after any transient failure, writes
//! only when they never left), within the call's timeout.
//!
//! Auth is a token in the `token` metadata header. It is fetched on first use
//! and fetched again, once, when etcd says it is no longer valid.
//!
//! Background tasks (keep-alive, watch streams, endpoint sync) hold a
//! [`Transport`], never the `Client`, so that a task never keeps alive the
//! handle whose drop is meant to stop it.

mod config;
mod endpoints;
mod retry;
mod shared_request;
mod token;
mod warm;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::time::Instant;

pub use config::{
    Balance, ClientConfig, Credentials, DEFAULT_CONNECT_TIMEOUT, DEFAULT_CONNECTION_WINDOW,
    DEFAULT_CONNECTIONS, DEFAULT_ENDPOINT, DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_KEEPALIVE_TIMEOUT,
    DEFAULT_MAX_DECODING_MESSAGE_SIZE, DEFAULT_MAX_ENCODING_MESSAGE_SIZE, DEFAULT_MAX_RETRIES,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_RETRY_BACKOFF_BASE, DEFAULT_RETRY_BACKOFF_CAP,
    DEFAULT_STREAM_WINDOW, DEFAULT_WATCH_REQUIRE_LEADER, DEFAULT_WATCHER_BUFFER_BYTES, RetryPolicy,
    TlsConfig, UNHEALTHY_FOR,
};
pub(crate) use retry::Repeat;
pub(crate) use shared_request::SharedRequest;
pub(crate) use token::Svc;

use super::error::{Error, Result};
use super::pb::{PbAuthClient, PbAuthenticateRequest};
use endpoints::{Endpoints, TlsMaterial};
use token::Auth;

/// The connections, token and config, and the timeout of this view's unary
/// calls. Cheap to clone; clones share all but the timeout.
#[derive(Clone)]
pub(crate) struct Transport {
    shared: Arc<Shared>,
    /// Overrides [`ClientConfig::request_timeout`] for this view's calls.
    timeout: Option<Duration>,
    /// This view's unary calls all go over this connection of an endpoint
    /// (modulo their number), rather than round robin over them.
    lane: Option<usize>,
}

struct Shared {
    config: ClientConfig,
    endpoints: RwLock<Arc<Endpoints>>,
    current: AtomicUsize,
    /// Round-robin counter over an endpoint's connections.
    spread: AtomicUsize,
    /// Round-robin counter over the endpoints ([`Balance::RoundRobin`]).
    next: AtomicUsize,
    auth: Auth,
}

impl Transport {
    /// Builds the channels; nothing connects until the first call.
    pub(crate) fn new(config: ClientConfig) -> Result<Transport> {
        let tls = match &config.tls {
            Some(tls) => Some(TlsMaterial::read(tls)?),
            None => None,
        };
        let endpoints = Endpoints::build(&config, config.endpoints.clone(), tls)?;
        Ok(Transport {
            shared: Arc::new(Shared {
                auth: Auth::new(config.credentials.clone()),
                config,
                endpoints: RwLock::new(Arc::new(endpoints)),
                current: AtomicUsize::new(0),
                spread: AtomicUsize::new(0),
                next: AtomicUsize::new(0),
            }),
            timeout: None,
            lane: None,
        })
    }

    /// The same transport whose unary calls time out after `timeout`.
    pub(crate) fn with_timeout(&self, timeout: Duration) -> Transport {
        Transport {
            shared: self.shared.clone(),
            timeout: Some(timeout),
            lane: self.lane,
        }
    }

    /// The same transport whose unary calls all go over one connection of
    /// an endpoint, the next in turn, so that requests reach the member in
    /// the order they were sent.
    pub(crate) fn in_order(&self) -> Transport {
        let lane = self.shared.spread.fetch_add(1, Ordering::Relaxed);
        Transport {
            shared: self.shared.clone(),
            timeout: self.timeout,
            lane: Some(lane),
        }
    }

    /// The timeout of this view's unary calls.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(self.shared.config.request_timeout)
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.shared.config
    }

    pub(crate) fn max_decoding(&self) -> usize {
        self.shared.config.max_decoding_message_size
    }

    pub(crate) fn max_encoding(&self) -> usize {
        self.shared.config.max_encoding_message_size
    }

    /// The member URLs in use now.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.endpoints().urls.clone()
    }

    /// Replaces the member URLs; unchanged URLs keep their connections.
    pub(crate) fn set_endpoints(&self, urls: Vec<String>) -> Result<()> {
        let current = self.endpoints();
        if current.urls == urls {
            return Ok(());
        }
        let next = Endpoints::build(self.config(), urls, current.tls.clone())?;
        self.replace_endpoints(next.keep_channels_of(&current));
        Ok(())
    }

    /// Reads the TLS files again and, when they changed, rebuilds every
    /// channel with them. Returns whether anything changed.
    pub(crate) fn reload_tls(&self) -> Result<bool> {
        let Some(tls) = &self.config().tls else {
            return Ok(false);
        };
        let material = TlsMaterial::read(tls)?;
        let current = self.endpoints();
        if current.tls.as_ref() == Some(&material) {
            return Ok(false);
        }
        let next = Endpoints::build(self.config(), current.urls.clone(), Some(material))?;
        self.replace_endpoints(next);
        Ok(true)
    }

    fn endpoints(&self) -> Arc<Endpoints> {
        self.shared
            .endpoints
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn replace_endpoints(&self, next: Endpoints) {
        *self
            .shared
            .endpoints
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
    }

    /// The index of the endpoint in use in `eps`.
    fn current(&self, eps: &Endpoints) -> usize {
        self.shared.current.load(Ordering::Relaxed) % eps.channels.len()
    }

    /// The service for the endpoint currently in use, and its index: what
    /// streams use, whatever the balancing.
    pub(crate) fn svc(&self) -> (usize, Svc) {
        let eps = self.endpoints();
        let i = self.current(&eps);
        (i, self.svc_at(&eps, i))
    }

    /// A connection of endpoint `i`, with the token.
    fn svc_at(&self, eps: &Endpoints, i: usize) -> Svc {
        let conns = &eps.channels[i];
        let c = self
            .lane
            .unwrap_or_else(|| self.shared.spread.fetch_add(1, Ordering::Relaxed))
            % conns.len();
        self.shared.auth.intercept(conns[c].clone())
    }

    /// Like [`Transport::svc`], on the endpoint's dedicated keep-alive
    /// connection.
    pub(crate) fn lease_svc(&self) -> (usize, Svc) {
        let eps = self.endpoints();
        let i = self.current(&eps);
        (i, self.shared.auth.intercept(eps.lease_channels[i].clone()))
    }

    /// Moves off endpoint `failed` if it is still the current one.
    pub(crate) fn rotate(&self, failed: usize) {
        let n = self.endpoints().channels.len();
        let _ = self.shared.current.compare_exchange(
            failed,
            (failed + 1) % n,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// The endpoint for a unary call's next attempt, given the URLs it
    /// already tried. Pinned: the current one (a failure has moved it on).
    /// Round robin: the next in turn that is healthy and untried, else
    /// untried, else healthy, else simply the next.
    fn pick(&self, eps: &Endpoints, tried: &[String]) -> usize {
        let n = eps.channels.len();
        if self.shared.config.balance == Balance::Pinned || n == 1 {
            return self.current(eps);
        }
        let start = self.shared.next.fetch_add(1, Ordering::Relaxed);
        let order = || (0..n).map(|k| (start + k) % n);
        let untried = |i: &usize| !tried.contains(&eps.urls[*i]);
        let healthy = |i: &usize| !eps.is_unhealthy(*i);
        order()
            .find(|i| untried(i) && healthy(i))
            .or_else(|| order().find(untried))
            .or_else(|| order().find(healthy))
            .unwrap_or(start % n)
    }

    /// Sends one unary request: balancing, retries as the config's
    /// [`RetryPolicy`] allows for the request's [`Repeat`] class, one
    /// re-authentication when the token has expired, all within this
    /// view's timeout.
    pub(crate) async fn unary<Req, Resp, F, Fut>(&self, req: Req, call: F) -> Result<Resp>
    where
        Req: Clone + Repeat,
        F: Fn(Svc, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.request(req, call, true).await
    }

    /// Opens a server stream (the snapshot) the way [`Transport::unary`]
    /// sends a request, except that the timeout bounds only the opening:
    /// the server is not told a deadline, which would cut a stream that
    /// takes longer than that to read. The stream's own pace is its
    /// caller's to bound.
    pub(crate) async fn open_stream<Req, Resp, F, Fut>(&self, req: Req, call: F) -> Result<Resp>
    where
        Req: Clone + Repeat,
        F: Fn(Svc, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.request(req, call, false).await
    }

    /// [`Transport::unary`], telling the server the deadline (`grpc-timeout`)
    /// or not.
    async fn request<Req, Resp, F, Fut>(&self, req: Req, call: F, tell: bool) -> Result<Resp>
    where
        Req: Clone + Repeat,
        F: Fn(Svc, tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let timeout = self.timeout();
        let deadline = Instant::now() + timeout;
        let timed_out = || Error::Timeout(timeout);
        // Checked first so that a call with its token (or without auth)
        // does not build a timer it never needs.
        if self.shared.auth.missing() {
            tokio::time::timeout_at(deadline, self.ensure_token())
                .await
                .map_err(|_| timed_out())??;
        }
        let class = req.class();
        let policy = self.shared.config.retry;
        let mut backoff = policy.backoff();
        let mut retries = 0;
        let mut reauthed = false;
        let mut tried: Vec<String> = Vec::new();
        let mut last: Option<Error> = None;
        loop {
            let eps = self.endpoints();
            let idx = self.pick(&eps, &tried);
            if let Some(err) = last.take() {
                // A member not tried yet gets the call at once; one that
                // failed it already, only after a wait.
                if tried.contains(&eps.urls[idx]) {
                    let delay = backoff.next_delay();
                    if Instant::now() + delay >= deadline {
                        return Err(err);
                    }
                    tokio::time::sleep(delay).await;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out());
            }
            let svc = self.svc_at(&eps, idx);
            let err = match attempt(left, tell, req.clone(), |r| call(svc, r)).await {
                Ok(resp) => {
                    eps.mark_healthy(idx);
                    return Ok(resp);
                }
                // Out of time: the call's own deadline, or the server's
                // report of it.
                Err(Error::Timeout(_)) => timed_out(),
                // Which member's certificate: the status cannot say.
                Err(Error::Tls {
                    message, source, ..
                }) => Error::Tls {
                    endpoint: eps.urls[idx].clone(),
                    message,
                    source,
                },
                Err(e) => e,
            };
            if !tried.contains(&eps.urls[idx]) {
                tried.push(eps.urls[idx].clone());
            }
            // A member whose certificates fail is passed over by the next
            // call, as an unreachable one is; this call is not repeated.
            if err.is_transient() || matches!(err, Error::Tls { .. }) {
                eps.mark_unhealthy(idx);
                self.rotate(idx);
            }
            if err.is_invalid_token() && self.shared.auth.credentials().is_some() && !reauthed {
                reauthed = true;
                tokio::time::timeout_at(deadline, self.authenticate())
                    .await
                    .map_err(|_| timed_out())??;
                continue;
            }
            if retries >= policy.max_retries || !retry::may_retry(class, &err) {
                return Err(err);
            }
            retries += 1;
            last = Some(err);
        }
    }

    /// Fetches a token on first use when credentials are configured.
    pub(crate) async fn ensure_token(&self) -> Result<()> {
        if !self.shared.auth.missing() {
            return Ok(());
        }
        self.authenticate().await.map(|_| ())
    }

    /// Fetches a fresh token with the current credentials, stores it for
    /// every call, and returns it; `None` without credentials.
    pub(crate) async fn authenticate(&self) -> Result<Option<String>> {
        let Some(creds) = self.shared.auth.credentials() else {
            return Ok(None);
        };
        let _guard = self.shared.auth.lock().await;
        let token = self.fetch_token(&creds).await?;
        self.shared.auth.store(token.clone())?;
        Ok(Some(token))
    }

    /// A token for `creds`, from the first member that answers; stored
    /// nowhere.
    pub(crate) async fn fetch_token(&self, creds: &Credentials) -> Result<String> {
        let timeout = self.shared.config.request_timeout;
        let req = PbAuthenticateRequest {
            name: creds.user.clone(),
            password: creds.password.clone(),
        };
        let mut last = Error::Closed;
        let eps = self.endpoints();
        for _ in 0..eps.channels.len() {
            let idx = self.current(&eps);
            // Authenticate on a bare channel: a stale token must not be sent.
            let mut auth = PbAuthClient::new(eps.channels[idx][0].clone());
            match attempt(timeout, true, req.clone(), |r| auth.authenticate(r)).await {
                Ok(resp) => return Ok(resp.token),
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
        self.shared.auth.clear();
    }

    /// Replaces the credentials; the next call authenticates with them.
    pub(crate) fn set_credentials(&self, credentials: Option<Credentials>) {
        self.shared.auth.set_credentials(credentials);
    }

    /// How many tokens have been fetched.
    pub(crate) fn authentications(&self) -> u64 {
        self.shared.auth.authentications()
    }
}

/// One try of a unary call, bounded by `timeout`: the client stops waiting
/// at it even when the server never answers, and with `tell` the server is
/// told the deadline too (not for a stream that may outlast it).
async fn attempt<Req, Resp, Fut>(
    timeout: Duration,
    tell: bool,
    req: Req,
    call: impl FnOnce(tonic::Request<Req>) -> Fut,
) -> Result<Resp>
where
    Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
{
    let mut request = tonic::Request::new(req);
    if tell {
        request.set_timeout(timeout);
    }
    match tokio::time::timeout(timeout, call(request)).await {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        // tonic enforces the `grpc-timeout` it sends as well, and may get
        // there first: the same timeout, not a broken connection.
        Ok(Err(status)) if deadline_passed(&status) => Err(Error::Timeout(timeout)),
        Ok(Err(status)) => Err(Error::from_status(status)),
        Err(_) => Err(Error::Timeout(timeout)),
    }
}

/// Whether tonic ended the call at its deadline (`TimeoutExpired`).
fn deadline_passed(status: &tonic::Status) -> bool {
    let mut src = std::error::Error::source(status);
    while let Some(e) = src {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        src = e.source();
    }
    false
}
