//! The auth token: one per client, shared by every call and stream, and
//! swapped in place when it is renewed, so that a renewal reaches the
//! streams already open at their next message.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::config::Credentials;
use crate::error::{Error, Result};

/// The gRPC service every generated client is built on.
pub(crate) type Svc = InterceptedService<Channel, TokenInterceptor>;

type Cell = Arc<RwLock<Option<AsciiMetadataValue>>>;

/// Adds the auth token, when there is one, to every request.
#[derive(Clone)]
pub(crate) struct TokenInterceptor(Cell);

impl Interceptor for TokenInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = self.0.read().unwrap_or_else(|e| e.into_inner()).clone() {
            req.metadata_mut().insert("token", token);
        }
        Ok(req)
    }
}

/// The credentials, the token fetched with them, and the lock that lets
/// one caller at a time fetch a new one. The fetch itself is the
/// transport's: it needs the endpoints and their failover.
pub(super) struct Auth {
    token: Cell,
    credentials: RwLock<Option<Credentials>>,
    lock: tokio::sync::Mutex<()>,
    authentications: AtomicU64,
}

impl Auth {
    pub(super) fn new(credentials: Option<Credentials>) -> Auth {
        Auth {
            token: Arc::new(RwLock::new(None)),
            credentials: RwLock::new(credentials),
            lock: tokio::sync::Mutex::new(()),
            authentications: AtomicU64::new(0),
        }
    }

    /// `channel`, sending the current token with every request.
    pub(super) fn intercept(&self, channel: Channel) -> Svc {
        InterceptedService::new(channel, TokenInterceptor(self.token.clone()))
    }

    pub(super) fn credentials(&self) -> Option<Credentials> {
        self.credentials
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the credentials and drops the token fetched with the old
    /// ones.
    pub(super) fn set_credentials(&self, credentials: Option<Credentials>) {
        *self.credentials.write().unwrap_or_else(|e| e.into_inner()) = credentials;
        self.clear();
    }

    /// Whether a call must fetch a token first.
    pub(super) fn missing(&self) -> bool {
        self.credentials
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
            && self
                .token
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_none()
    }

    /// Held while a token is fetched, so that callers that all found it
    /// expired do not each fetch one.
    pub(super) async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    /// Stores a token the server sent.
    pub(super) fn store(&self, token: String) -> Result<()> {
        let token = AsciiMetadataValue::try_from(token)
            .map_err(|_| Error::Auth("server sent a token that is not ASCII".into()))?;
        *self.token.write().unwrap_or_else(|e| e.into_inner()) = Some(token);
        self.authentications.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn clear(&self) {
        *self.token.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub(super) fn authentications(&self) -> u64 {
        self.authentications.load(Ordering::Relaxed)
    }
}
