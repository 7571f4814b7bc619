//! The transport: endpoints, failover, TLS, auth, and the unary call path.
//! Every service is built on it and it knows none of them.
//!
//! One lazily connected tonic [`Channel`](tonic::transport::Channel) is
//! built per endpoint (more with [`ClientConfig::connections`]). Calls go
//! to the current endpoint; a transport failure rotates to the next one,
//! and a call that provably never left (the connection could not be made)
//! is sent again there at once. Anything else is returned: whether to retry
//! a write is the caller's decision.
//!
//! Auth is a token in the `token` metadata header. It is fetched on first use
//! and fetched again, once, when etcd says it is no longer valid.
//!
//! Background tasks (keep-alive, watch streams, endpoint sync) hold a
//! [`Transport`], never the `Client`, so that a task never keeps alive the
//! handle whose drop is meant to stop it.

mod config;
mod endpoints;
mod token;
mod warm;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use config::{
    ClientConfig, Credentials, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE_INTERVAL,
    DEFAULT_KEEPALIVE_TIMEOUT, DEFAULT_MAX_DECODING_MESSAGE_SIZE,
    DEFAULT_MAX_ENCODING_MESSAGE_SIZE, DEFAULT_REQUEST_TIMEOUT, DEFAULT_WATCHER_BUFFER_BYTES,
    TlsConfig,
};
pub(crate) use token::Svc;

use super::error::{Error, Result};
use super::pb::{PbAuthClient, PbAuthenticateRequest};
use endpoints::{Endpoints, TlsMaterial};
use token::Auth;

/// The connections, token and config. Cheap to clone; clones share all
/// of it.
#[derive(Clone)]
pub(crate) struct Transport(Arc<Shared>);

struct Shared {
    config: ClientConfig,
    endpoints: RwLock<Arc<Endpoints>>,
    current: AtomicUsize,
    /// Round-robin counter over an endpoint's connections.
    spread: AtomicUsize,
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
        Ok(Transport(Arc::new(Shared {
            auth: Auth::new(config.credentials.clone()),
            config,
            endpoints: RwLock::new(Arc::new(endpoints)),
            current: AtomicUsize::new(0),
            spread: AtomicUsize::new(0),
        })))
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.0.config
    }

    pub(crate) fn max_decoding(&self) -> usize {
        self.0.config.max_decoding_message_size
    }

    pub(crate) fn max_encoding(&self) -> usize {
        self.0.config.max_encoding_message_size
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
        self.0
            .endpoints
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn replace_endpoints(&self, next: Endpoints) {
        *self.0.endpoints.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
    }

    /// The index of the endpoint in use in `eps`.
    fn current(&self, eps: &Endpoints) -> usize {
        self.0.current.load(Ordering::Relaxed) % eps.channels.len()
    }

    /// The service for the endpoint currently in use, and its index.
    pub(crate) fn svc(&self) -> (usize, Svc) {
        let eps = self.endpoints();
        let i = self.current(&eps);
        let conns = &eps.channels[i];
        let c = self.0.spread.fetch_add(1, Ordering::Relaxed) % conns.len();
        (i, self.0.auth.intercept(conns[c].clone()))
    }

    /// Like [`Transport::svc`], on the endpoint's dedicated keep-alive
    /// connection.
    pub(crate) fn lease_svc(&self) -> (usize, Svc) {
        let eps = self.endpoints();
        let i = self.current(&eps);
        (i, self.0.auth.intercept(eps.lease_channels[i].clone()))
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
            let err = match attempt(timeout, req.clone(), |r| call(svc, r)).await {
                Ok(resp) => return Ok(resp),
                // A deadline the server reports is the same timeout.
                Err(Error::Timeout(_)) => Error::Timeout(timeout),
                Err(e) => e,
            };
            if err.is_transient() {
                self.rotate(idx);
                if err.not_sent() && failovers + 1 < self.endpoints().channels.len() {
                    failovers += 1;
                    continue;
                }
            }
            if err.is_invalid_token() && self.0.auth.credentials().is_some() && !reauthed {
                reauthed = true;
                self.authenticate().await?;
                continue;
            }
            return Err(err);
        }
    }

    /// Fetches a token on first use when credentials are configured.
    pub(crate) async fn ensure_token(&self) -> Result<()> {
        if !self.0.auth.missing() {
            return Ok(());
        }
        self.authenticate().await
    }

    /// Fetches a fresh token with the current credentials.
    pub(crate) async fn authenticate(&self) -> Result<()> {
        let Some(creds) = self.0.auth.credentials() else {
            return Ok(());
        };
        let _guard = self.0.auth.lock().await;
        let timeout = self.0.config.request_timeout;
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
            match attempt(timeout, req.clone(), |r| auth.authenticate(r)).await {
                Ok(resp) => return self.0.auth.store(resp.token),
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
        self.0.auth.clear();
    }

    /// Replaces the credentials; the next call authenticates with them.
    pub(crate) fn set_credentials(&self, credentials: Option<Credentials>) {
        self.0.auth.set_credentials(credentials);
    }

    /// How many tokens have been fetched.
    pub(crate) fn authentications(&self) -> u64 {
        self.0.auth.authentications()
    }
}

/// One try of a unary call, bounded by `timeout` at both ends: the server
/// is told the deadline, and the client stops waiting at it even when the
/// server never answers.
async fn attempt<Req, Resp, Fut>(
    timeout: Duration,
    req: Req,
    call: impl FnOnce(tonic::Request<Req>) -> Fut,
) -> Result<Resp>
where
    Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
{
    let mut request = tonic::Request::new(req);
    request.set_timeout(timeout);
    match tokio::time::timeout(timeout, call(request)).await {
        Ok(Ok(resp)) => Ok(resp.into_inner()),
        Ok(Err(status)) => Err(Error::from(status)),
        Err(_) => Err(Error::Timeout(timeout)),
    }
}
