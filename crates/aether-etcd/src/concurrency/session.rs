//! A lease kept alive for as long as its holder lives.

use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::{Client, LeaseHandle, LeaseId, LeaseStatus, Result};

/// The session TTL when none is given: Go's default.
pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(60);

/// How to open a [`Session`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    ttl: Duration,
    lease: Option<LeaseId>,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: DEFAULT_SESSION_TTL,
            lease: None,
        }
    }
}

impl SessionOptions {
    /// The lease TTL: how long the session's keys outlive a holder that
    /// stops without closing it. Whole seconds, as etcd counts them: a
    /// sub-second part rounds up, and zero makes
    /// [`Session::with_options`] fail with
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument). Not used
    /// with [`SessionOptions::with_lease`], whose lease has its TTL.
    #[must_use]
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Adopt this existing lease instead of granting one, for example the
    /// lease of a session an earlier incarnation of this process left
    /// running. The session asks the server for the TTL it was granted
    /// with (one round trip); a lease that is gone is
    /// [`Error::LeaseNotFound`](crate::Error::LeaseNotFound).
    #[must_use]
    pub fn with_lease(mut self, id: LeaseId) -> Self {
        self.lease = Some(id);
        self
    }
}

/// A lease kept alive through the client's [`LeaseKeeper`](crate::LeaseKeeper).
/// Cheap to clone; clones share the lease.
///
/// The session is *lost* when the server says the lease is gone or when no
/// keep-alive has been answered for a whole TTL (the server may already have
/// let it expire): [`Session::lost`] resolves and [`Session::lost_signal`]
/// turns true then, without polling.
///
/// Dropping the last clone stops the keep-alive but does not revoke the
/// lease: it runs out within its TTL. Revoking needs a request, which a
/// `Drop` cannot await; a process that crashes cannot revoke either, so
/// anything built on a session must already cope with keys that outlive
/// their holder by a TTL; and a lease that is left alone can be adopted by
/// a successor ([`SessionOptions::with_lease`]). Call [`Session::close`] to
/// revoke at once.
///
/// ```no_run
/// # async fn demo() -> aether_etcd::Result<()> {
/// use std::time::Duration;
/// use aether_etcd::{Client, ClientConfig, Put};
/// use aether_etcd::concurrency::{Session, SessionOptions};
///
/// let client = Client::connect(ClientConfig::new(["http://127.0.0.1:2379"]))?;
/// let session =
///     Session::with_options(&client, SessionOptions::default().with_ttl(Duration::from_secs(10)))
///         .await?;
/// // A key that lives as long as this process keeps the session.
/// client.put(Put::new("/presence/me", "here").lease(session.lease())).await?;
/// tokio::select! {
///     _ = session.lost() => eprintln!("session lost; /presence/me is gone"),
///     _ = tokio::time::sleep(Duration::from_secs(60)) => session.close().await?,
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Session(Arc<Inner>);

struct Inner {
    client: Client,
    lease: LeaseId,
    ttl: Duration,
    lost: Arc<watch::Sender<bool>>,
    _keep: LeaseHandle,
    _monitor: DropGuard,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lease", &self.0.lease)
            .field("ttl", &self.0.ttl)
            .field("lost", &*self.0.lost.borrow())
            .finish()
    }
}

impl Session {
    /// Opens a session with the default TTL ([`DEFAULT_SESSION_TTL`]).
    pub async fn new(client: &Client) -> Result<Session> {
        Session::with_options(client, SessionOptions::default()).await
    }

    /// Opens a session: grants (or adopts) the lease and starts keeping it
    /// alive.
    pub async fn with_options(client: &Client, opts: SessionOptions) -> Result<Session> {
        let keeper = client.lease_keeper();
        let (lease, keep) = match opts.lease {
            Some(id) => (id, keeper.keep_alive_id(id).await?),
            None => {
                let grant = client.lease_grant(opts.ttl).await?;
                (grant.id, keeper.keep_alive(&grant).await?)
            }
        };
        // What the keeper was registered with: the granted TTL.
        let ttl = keep.status().ttl;
        let lost = Arc::new(watch::channel(false).0);
        let cancel = CancellationToken::new();
        // The monitor holds the lease status and the signal, never the
        // client: it ends with the session.
        tokio::spawn(monitor(keep.subscribe(), lost.clone(), cancel.clone()));
        Ok(Session(Arc::new(Inner {
            client: client.clone(),
            lease,
            ttl,
            lost,
            _keep: keep,
            _monitor: cancel.drop_guard(),
        })))
    }

    /// The session's lease id: attach keys to it to tie them to the session.
    pub fn lease(&self) -> LeaseId {
        self.0.lease
    }

    /// The TTL the lease was granted with.
    pub fn ttl(&self) -> Duration {
        self.0.ttl
    }

    /// The client the session was opened on.
    pub fn client(&self) -> &Client {
        &self.0.client
    }

    /// Whether the session is lost.
    pub fn is_lost(&self) -> bool {
        *self.0.lost.borrow()
    }

    /// A receiver that turns true, once, when the session is lost.
    pub fn lost_signal(&self) -> watch::Receiver<bool> {
        self.0.lost.subscribe()
    }

    /// Resolves when the session is lost (at once if it already is).
    pub async fn lost(&self) {
        let mut rx = self.0.lost.subscribe();
        // The sender lives as long as `self`, so this only ends on `true`.
        let _ = rx.wait_for(|lost| *lost).await;
    }

    /// Revokes the lease, deleting every key attached to it, and marks the
    /// session lost. The keep-alive stops when the last clone is dropped.
    pub async fn close(&self) -> Result<()> {
        let res = self.0.client.lease_revoke(self.0.lease).await;
        self.0.lost.send_replace(true);
        match res {
            // Already gone: the session's keys are gone too.
            Err(crate::Error::LeaseNotFound) => Ok(()),
            other => other,
        }
    }
}

/// Turns `lost` true when the keeper reports the lease gone, the keeper
/// stops, or a whole TTL passes after the last answered keep-alive.
async fn monitor(
    mut status: watch::Receiver<LeaseStatus>,
    lost: Arc<watch::Sender<bool>>,
    cancel: CancellationToken,
) {
    loop {
        let s = *status.borrow_and_update();
        let Some(deadline) = expiry(&s) else { break };
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = status.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    lost.send_replace(true);
}

/// When the lease may have expired, judged from the last answer; `None`
/// when it is already lost.
fn expiry(s: &LeaseStatus) -> Option<Instant> {
    match s.last_ok {
        Some(at) if !s.lost => Some(at + s.ttl),
        _ => None,
    }
}
