//! The `Client` facade: one value that owns the transport and hands each
//! call to its service, so callers see one type and one set of methods.

use std::sync::{Arc, OnceLock};

use super::error::Result;
use super::lease::LeaseKeeper;
use super::transport::{ClientConfig, Credentials, Svc, Transport};

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

impl Client {
    /// Builds a client. Nothing connects until the first request, so an
    /// unreachable cluster is not an error here; a malformed config is.
    /// Call it inside a Tokio runtime: the connections are driven by tasks.
    pub fn connect(config: ClientConfig) -> Result<Client> {
        let auto_sync = config.auto_sync_interval;
        let transport = Transport::new(config)?;
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
        self.inner.transport.authenticate().await
    }

    /// How many tokens this client has fetched (for tests of renewal).
    #[doc(hidden)]
    pub fn authentications(&self) -> u64 {
        self.inner.transport.authentications()
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
