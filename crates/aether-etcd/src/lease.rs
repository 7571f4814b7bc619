//! Leases: grant, revoke, time-to-live, and a shared keep-alive stream.
//!
//! # The keep-alive actor
//!
//! [`LeaseKeeper`] is one task that owns one `LeaseKeepAlive` stream and
//! keeps any number of leases alive over it. Owners register a lease with
//! [`LeaseKeeper::keep_alive`] and get a [`LeaseHandle`]; the task sends each
//! lease's keep-alive every TTL/3 and publishes its [`LeaseStatus`] on a
//! `watch` channel. When the stream fails the task reopens it with capped
//! backoff and immediately refreshes every lease. A lease the server reports
//! with TTL <= 0 is lost: its status says so and the task stops sending for
//! it. Dropping the handle stops the keep-alive; it never revokes, so the
//! lease runs out on its own (or a successor adopts it by id).
//!
//! Each [`LeaseKeeper::keep_alive`] is a registration of its own: dropping
//! a handle ends only the registration it came from. A handle for a lease
//! that was lost, kept after the same id was registered again (re-granted
//! with an explicit id, or adopted), used to stop the newer keep-alive when
//! it was dropped.
//!
//! # A lease is lost at its deadline, whatever the server says
//!
//! Like Go's clientv3 (`deadlineLoop`), a lease whose last successful
//! keep-alive is a whole TTL old is declared lost (`lost`, and
//! [`LeaseHandle::lost`] resolves) and is no longer kept alive: through an
//! outage of every endpoint the server may never get to say so, and by
//! then it has expired the lease (its TTL ran from when it answered, which
//! was before the answer arrived). A lease it did keep (a new leader
//! extends every lease) is the caller's to adopt again.
//!
//! # Refused credentials are not hidden
//!
//! The stream authenticates before it opens. When that fails it is a
//! stream failure like any other (counted in every lease's `failures`, and
//! retried with backoff, since the credentials may be replaced with
//! [`Client::set_credentials`]); when the server refused the credentials the
//! status also says `unauthenticated`. Nothing is sent without a token:
//! etcd answers keep-alives without checking it, which kept leases alive
//! for a client whose every other call failed.
//!
//! [`Client::set_credentials`]: super::Client::set_credentials
//!
//! # A stalled stream fails over within the TTL
//!
//! etcd answers every keep-alive request on the stream (TTL 0 for a lease
//! it does not know) or ends the stream. So when a request has waited
//! longer than the *stall bound* with no answer for any lease, the path is
//! black-holed (a dead member whose TCP connection stays up, a partition,
//! a stuck proxy): the task counts a failure for every lease, moves to the
//! next endpoint and reopens the stream, sending every lease at once. The
//! HTTP/2 keep-alive (10 s + 5 s by default) would find the same thing,
//! but too late for any TTL under about 15 s, and its timing does not
//! follow the TTL.
//!
//! The bound is half the shortest keep-alive interval (TTL/6 of the
//! shortest TTL kept), at least [`MIN_KEEPALIVE_STALL`]; opening the stream
//! is bounded by it too. Worst case, the last answer came just before the
//! stall, the next request goes out one interval (TTL/3) later and is
//! given up on TTL/6 after that; the new stream refreshes the lease with
//! half its TTL left. TTL/3 instead would leave a third, which etcd
//! reports as a TTL of 0 for a 3 s lease (it truncates to whole seconds),
//! and a second stalled endpoint in a row would lose the lease. The floor
//! keeps a slow answer from a loaded or distant member from counting as a
//! stall: an etcd round trip is milliseconds on a LAN and a few hundred at
//! most across regions.
//!
//! # Its own connection
//!
//! The stream runs on a connection of its own to the member, not the one
//! the client's other calls share: over a long link under heavy traffic a
//! keep-alive queued behind megabytes of txns could arrive after the lease
//! expired. The interval stays TTL/3 whatever the round trip.

use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::backoff::Backoff;
use super::error::{Error, Result};
use super::header::Header;
use super::lease_id::LeaseId;
use super::pb::{
    PbLeaseClient, PbLeaseGrantRequest, PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse,
    PbLeaseLeasesRequest, PbLeaseRevokeRequest, PbLeaseTimeToLiveRequest,
};
use super::task::spawn_until_dropped;
use super::transport::Transport;

/// Longest wait between attempts to reopen the keep-alive stream.
pub(crate) const MAX_KEEPALIVE_BACKOFF: Duration = Duration::from_secs(2);
/// Shortest wait for a keep-alive answer before the stream counts as
/// stalled; the bound is otherwise TTL/6 of the shortest lease kept (see
/// the module docs).
pub const MIN_KEEPALIVE_STALL: Duration = Duration::from_millis(500);

/// A lease TTL in etcd's unit, whole seconds: a sub-second part rounds
/// up (a lease never lives shorter than asked), and zero is refused with
/// [`Error::InvalidArgument`] rather than sent (etcd would grant its
/// minimum TTL instead, which is not what the caller meant).
pub(crate) fn ttl_secs(ttl: Duration) -> Result<i64> {
    if ttl.is_zero() {
        return Err(Error::InvalidArgument(
            "a lease TTL of zero: etcd's TTLs are whole seconds, at least one".into(),
        ));
    }
    let secs = ttl
        .as_secs()
        .saturating_add(u64::from(ttl.subsec_nanos() > 0));
    Ok(i64::try_from(secs).unwrap_or(i64::MAX))
}

/// A TTL etcd reported, in seconds; a negative one is none left.
pub(crate) fn ttl_duration(secs: i64) -> Duration {
    Duration::from_secs(secs.max(0) as u64)
}

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseGrant {
    /// The lease id.
    pub id: LeaseId,
    /// The TTL the server granted (whole seconds; etcd raises one below
    /// its minimum, about 1.5 election timeouts, to that minimum).
    pub ttl: Duration,
}

/// What the server says about a lease.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseTtl {
    /// The lease id.
    pub id: LeaseId,
    /// Time left, in whole seconds as etcd truncates it; `None` when the
    /// lease does not exist (never granted, revoked or expired).
    pub ttl: Option<Duration>,
    /// The TTL it was granted with (zero when it does not exist).
    pub granted_ttl: Duration,
    /// Keys attached, when asked for.
    pub keys: Vec<bytes::Bytes>,
}

/// The leases that exist; see [`Client::lease_list`](super::Client::lease_list).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseList {
    /// The response header.
    pub header: Header,
    /// Every lease's id, in no particular order. etcd sends nothing else
    /// about them: [`Client::lease_time_to_live`](super::Client::lease_time_to_live)
    /// tells a lease's TTL.
    pub ids: Vec<LeaseId>,
}

/// The sending half of a raw keep-alive stream; see
/// [`Client::lease_keep_alive_stream`](super::Client::lease_keep_alive_stream).
/// Dropping it (and the stream) closes the gRPC stream.
#[derive(Debug)]
pub struct KeepAliveSender {
    id: LeaseId,
    tx: mpsc::UnboundedSender<PbLeaseKeepAliveRequest>,
}

impl KeepAliveSender {
    /// The lease this stream keeps alive.
    pub fn id(&self) -> LeaseId {
        self.id
    }

    /// Sends one keep-alive request; its answer arrives on the
    /// [`KeepAliveStream`]. [`Error::Closed`] once the stream has ended.
    /// Unbounded: a caller that sends faster than etcd answers queues the
    /// requests in memory.
    pub fn keep_alive(&self) -> Result<()> {
        self.tx
            .send(PbLeaseKeepAliveRequest { id: self.id.get() })
            .map_err(|_| Error::Closed)
    }
}

/// One answer on a raw keep-alive stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeepAliveResponse {
    /// The response header.
    pub header: Header,
    /// The lease.
    pub id: LeaseId,
    /// The TTL the lease has again from now, in whole seconds as etcd
    /// counts them; zero when the lease is gone (expired or revoked).
    pub ttl: Duration,
}

/// The answers of a raw keep-alive stream, a
/// [`Stream`](futures_util::Stream) of [`KeepAliveResponse`]s; see
/// [`Client::lease_keep_alive_stream`](super::Client::lease_keep_alive_stream).
/// It ends (or yields an error) when the gRPC stream does; nothing reopens
/// it.
pub struct KeepAliveStream {
    inner: tonic::codec::Streaming<PbLeaseKeepAliveResponse>,
}

impl std::fmt::Debug for KeepAliveStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeepAliveStream").finish_non_exhaustive()
    }
}

impl KeepAliveStream {
    /// The next answer, waiting for it: `Ok(None)` once the stream has
    /// ended.
    pub async fn message(&mut self) -> Result<Option<KeepAliveResponse>> {
        match self.inner.message().await {
            Ok(m) => Ok(m.map(keep_alive_response)),
            Err(s) => Err(Error::from_status(s)),
        }
    }
}

impl futures_util::Stream for KeepAliveStream {
    type Item = Result<KeepAliveResponse>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.inner)
            .poll_next(cx)
            .map(|m| m.map(|r| r.map(keep_alive_response).map_err(Error::from_status)))
    }
}

fn keep_alive_response(r: PbLeaseKeepAliveResponse) -> KeepAliveResponse {
    KeepAliveResponse {
        header: r.header.into(),
        id: LeaseId::new(r.id),
        ttl: Duration::from_secs(r.ttl.max(0) as u64),
    }
}

/// The lease service on a transport.
#[derive(Clone)]
pub(crate) struct LeaseClient {
    transport: Transport,
}

impl LeaseClient {
    pub(crate) fn new(transport: Transport) -> LeaseClient {
        LeaseClient { transport }
    }

    pub(crate) async fn grant(&self, id: LeaseId, ttl: Duration) -> Result<LeaseGrant> {
        let req = PbLeaseGrantRequest {
            ttl: ttl_secs(ttl)?,
            id: id.get(),
        };
        let resp = self
            .transport
            .unary(req, |svc, r| async move {
                PbLeaseClient::new(svc).lease_grant(r).await
            })
            .await?;
        if !resp.error.is_empty() {
            return Err(Error::server(crate::error::Code::Unknown, resp.error));
        }
        Ok(LeaseGrant {
            id: LeaseId::new(resp.id),
            ttl: ttl_duration(resp.ttl),
        })
    }

    pub(crate) async fn revoke(&self, id: LeaseId) -> Result<()> {
        self.transport
            .unary(PbLeaseRevokeRequest { id: id.get() }, |svc, r| async move {
                PbLeaseClient::new(svc).lease_revoke(r).await
            })
            .await?;
        Ok(())
    }

    pub(crate) async fn time_to_live(&self, id: LeaseId, keys: bool) -> Result<LeaseTtl> {
        let resp = self
            .transport
            .unary(
                PbLeaseTimeToLiveRequest { id: id.get(), keys },
                |svc, r| async move { PbLeaseClient::new(svc).lease_time_to_live(r).await },
            )
            .await;
        match resp {
            // etcd 3.4 and 3.5 answer -1 for a lease they do not have.
            Ok(r) => Ok(LeaseTtl {
                id: LeaseId::new(r.id),
                ttl: (r.ttl >= 0).then(|| ttl_duration(r.ttl)),
                granted_ttl: ttl_duration(r.granted_ttl),
                keys: r.keys,
            }),
            Err(Error::LeaseNotFound) => Ok(LeaseTtl {
                id,
                ttl: None,
                granted_ttl: Duration::ZERO,
                keys: Vec::new(),
            }),
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn list(&self) -> Result<LeaseList> {
        let resp = self
            .transport
            .unary(PbLeaseLeasesRequest {}, |svc, r| async move {
                PbLeaseClient::new(svc).lease_leases(r).await
            })
            .await?;
        Ok(LeaseList {
            header: resp.header.into(),
            ids: resp
                .leases
                .into_iter()
                .map(|l| LeaseId::new(l.id))
                .collect(),
        })
    }

    /// A keep-alive stream of its own for lease `id`, its first request
    /// sent (etcd sends the stream's headers with its first answer).
    pub(crate) async fn keep_alive_stream(
        &self,
        id: LeaseId,
    ) -> Result<(KeepAliveSender, KeepAliveStream)> {
        // Never open without a token when there are credentials: etcd
        // answers keep-alives without checking one (module docs).
        self.transport.ensure_token().await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let sender = KeepAliveSender { id, tx };
        sender.keep_alive()?;
        let (idx, svc) = self.transport.svc();
        let timeout = self.transport.config().request_timeout;
        let mut lc = PbLeaseClient::new(svc);
        let open = lc.lease_keep_alive(UnboundedReceiverStream::new(rx));
        match tokio::time::timeout(timeout, open).await {
            Ok(Ok(r)) => Ok((
                sender,
                KeepAliveStream {
                    inner: r.into_inner(),
                },
            )),
            Ok(Err(s)) => {
                let err = Error::from_status(s);
                if err.is_transient() {
                    // The next call (or the caller's next attempt) tries
                    // another member.
                    self.transport.rotate(idx);
                }
                if err.is_invalid_token() {
                    self.transport.clear_token();
                }
                Err(err)
            }
            Err(_) => {
                self.transport.rotate(idx);
                Err(Error::Timeout(timeout))
            }
        }
    }

    /// A new keep-alive actor on this transport.
    pub(crate) fn keeper(&self) -> LeaseKeeper {
        LeaseKeeper::spawn(self.transport.clone())
    }
}

/// The health of one kept-alive lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStatus {
    /// When the last keep-alive was answered with TTL > 0, on tokio's
    /// clock ([`tokio::time::Instant`]), like the keeper's timers: a test
    /// on a paused clock sees its leases age with that clock.
    pub last_ok: Option<Instant>,
    /// The TTL the server reported then (whole seconds); from
    /// registration until the first answer, the TTL registered with.
    pub ttl: Duration,
    /// The server said the lease is gone (TTL <= 0 or not found).
    pub lost: bool,
    /// Keep-alives answered so far.
    pub successes: u64,
    /// Stream failures seen while this lease was kept alive.
    pub failures: u64,
    /// The last attempt to open the keep-alive stream could not
    /// authenticate: the server refused the credentials. Nothing is sent
    /// until it can, so the lease runs out (and is lost at its deadline)
    /// unless the credentials are replaced in time. A field rather than
    /// an error: the keeper retries, and the caller decides when to stop.
    pub unauthenticated: bool,
}

impl LeaseStatus {
    /// Time left before the lease expires, judged from the last answer.
    pub fn ttl_left(&self) -> Duration {
        match self.deadline() {
            Some(at) if !self.lost => at.saturating_duration_since(Instant::now()),
            _ => Duration::ZERO,
        }
    }

    /// When the lease expires unless a keep-alive is answered first: the
    /// last answer plus its TTL (from registration, the TTL it was
    /// registered with).
    fn deadline(&self) -> Option<Instant> {
        self.last_ok.map(|at| at + self.ttl)
    }
}

/// A lease kept alive by the [`LeaseKeeper`]. Dropping it stops the
/// keep-alive without revoking the lease. While it lives, so does the
/// keep-alive task, even if every `Client` clone is gone.
pub struct LeaseHandle {
    id: i64,
    /// This registration, so that dropping the handle ends only it.
    reg: u64,
    status: watch::Receiver<LeaseStatus>,
    cmds: mpsc::UnboundedSender<Cmd>,
    _keeper: std::sync::Arc<DropGuard>,
}

impl LeaseHandle {
    /// The lease id.
    pub fn id(&self) -> LeaseId {
        LeaseId::new(self.id)
    }
    /// The latest status.
    pub fn status(&self) -> LeaseStatus {
        *self.status.borrow()
    }
    /// Resolves when the lease is lost (the server says so, or its deadline
    /// passed without a keep-alive answer: see the module docs), or the
    /// keeper is gone.
    pub async fn lost(&mut self) {
        let _ = self.status.wait_for(|s| s.lost).await;
    }
    /// A receiver of status changes.
    pub fn subscribe(&self) -> watch::Receiver<LeaseStatus> {
        self.status.clone()
    }
}

impl Drop for LeaseHandle {
    fn drop(&mut self) {
        let _ = self.cmds.send(Cmd::Remove {
            id: self.id,
            reg: self.reg,
        });
    }
}

enum Cmd {
    Add {
        id: i64,
        ttl: Duration,
        reply: oneshot::Sender<(u64, watch::Receiver<LeaseStatus>)>,
    },
    /// Ends registration `reg` of lease `id`; a no-op when that
    /// registration is already gone (the lease was lost and registered
    /// again since).
    Remove { id: i64, reg: u64 },
}

impl std::fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseHandle")
            .field("id", &self.id)
            .field("status", &*self.status.borrow())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for LeaseKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseKeeper").finish_non_exhaustive()
    }
}

/// Handle to the keep-alive task; cheap to clone. The task stops when the
/// last clone, the last [`LeaseHandle`] and the last `Client` clone are
/// dropped: it holds the client's connections, never the client.
#[derive(Clone)]
pub struct LeaseKeeper {
    cmds: mpsc::UnboundedSender<Cmd>,
    /// For [`LeaseKeeper::keep_alive_id`], which asks the TTL.
    leases: LeaseClient,
    _guard: std::sync::Arc<DropGuard>,
}

struct Kept {
    /// The live registrations (handles) of this lease.
    regs: std::collections::HashSet<u64>,
    interval: Duration,
    due: Instant,
    status: watch::Sender<LeaseStatus>,
}

impl LeaseKeeper {
    fn spawn(client: Transport) -> LeaseKeeper {
        let (tx, rx) = mpsc::unbounded_channel();
        // The task logs under the span of whoever first needed it.
        let leases = LeaseClient::new(client.clone());
        let guard = spawn_until_dropped(|cancel| run(client, rx, cancel));
        LeaseKeeper {
            cmds: tx,
            leases,
            _guard: std::sync::Arc::new(guard),
        }
    }

    /// Starts keeping the granted lease alive, with the TTL it was granted
    /// with: it sets the keep-alive interval (TTL/3) and the first deadline
    /// (now + TTL: a lease not answered for by then is lost). Each call is
    /// a registration of its own: the handle's drop ends only it.
    pub async fn keep_alive(&self, grant: &LeaseGrant) -> Result<LeaseHandle> {
        self.register(grant.id, grant.ttl).await
    }

    /// Starts keeping an existing lease alive by its id alone (one a
    /// predecessor granted, or another process): asks the server for the
    /// TTL it was granted with first, one round trip.
    /// [`Error::LeaseNotFound`] when the lease is gone.
    pub async fn keep_alive_id(&self, id: LeaseId) -> Result<LeaseHandle> {
        let ttl = self.leases.time_to_live(id, false).await?;
        if ttl.ttl.is_none() {
            return Err(Error::LeaseNotFound);
        }
        self.register(id, ttl.granted_ttl).await
    }

    /// Starts keeping lease `id` alive, for a caller that knows the TTL it
    /// was granted with and wants no round trip to ask
    /// ([`LeaseKeeper::keep_alive_id`] asks). A TTL other than the granted
    /// one mistimes the keep-alives: too long, and the lease can expire
    /// between two. Zero is [`Error::InvalidArgument`]; a sub-second part
    /// rounds up, as for a grant.
    pub async fn keep_alive_with_ttl(&self, id: LeaseId, ttl: Duration) -> Result<LeaseHandle> {
        let ttl = ttl_duration(ttl_secs(ttl)?);
        self.register(id, ttl).await
    }

    async fn register(&self, id: LeaseId, ttl: Duration) -> Result<LeaseHandle> {
        let id = id.get();
        let (reply, rx) = oneshot::channel();
        self.cmds
            .send(Cmd::Add { id, ttl, reply })
            .map_err(|_| Error::Closed)?;
        let (reg, status) = rx.await.map_err(|_| Error::Closed)?;
        Ok(LeaseHandle {
            id,
            reg,
            status,
            cmds: self.cmds.clone(),
            _keeper: self._guard.clone(),
        })
    }
}

async fn run(client: Transport, mut cmds: mpsc::UnboundedReceiver<Cmd>, cancel: CancellationToken) {
    let mut leases: HashMap<i64, Kept> = HashMap::new();
    let mut regs = Registrations::default();
    let mut backoff = Backoff::new(Duration::from_millis(50), MAX_KEEPALIVE_BACKOFF);
    'reconnect: loop {
        // Open the stream only once there is something to keep alive.
        while leases.is_empty() {
            tokio::select! {
                _ = cancel.cancelled() => return,
                cmd = cmds.recv() => match cmd {
                    Some(cmd) => apply(&mut leases, &mut regs, cmd),
                    None => return,
                },
            }
        }
        expire(&mut leases);
        if leases.is_empty() {
            continue 'reconnect;
        }
        // Never open without a token when there are credentials: etcd
        // answers keep-alives without one (module docs).
        if let Err(err) = client.ensure_token().await {
            let refused = !err.is_transient();
            if refused {
                tracing::warn!(error = %err, "lease keep-alive: authentication refused; not keeping leases alive until it succeeds");
            }
            for k in leases.values() {
                k.status.send_if_modified(|s| {
                    let changed = s.unauthenticated != refused;
                    s.unauthenticated = refused;
                    changed
                });
            }
            // `authenticate` has already moved past unreachable endpoints.
            if !stream_failed(&client, None, &err, &leases, &cancel, &mut backoff).await {
                return;
            }
            continue 'reconnect;
        }
        // Unbounded: each request is a lease id, at most one per lease per
        // interval, and a bounded queue would leave leases past its size
        // waiting a whole interval after a reconnect. A stalled stream is
        // found out by the stall bound (module docs).
        let (out_tx, out_rx) = mpsc::unbounded_channel::<PbLeaseKeepAliveRequest>();
        let now = Instant::now();
        let mut waiting = Waiting::default();
        for (id, k) in leases.iter_mut() {
            k.due = now + k.interval;
            waiting.send(&out_tx, *id);
        }
        // Its own connection: a keep-alive must not queue behind the
        // client's bulk traffic (see `Endpoints::lease_channels`).
        let (idx, svc) = client.lease_svc();
        let mut lc = PbLeaseClient::new(svc);
        let open = lc.lease_keep_alive(UnboundedReceiverStream::new(out_rx));
        // etcd sends the response headers with the first answer, so a
        // black-holed path shows here first: bound it like any answer.
        let open_timeout = client.config().request_timeout.min(stall_bound(&leases));
        let mut inbound = match tokio::time::timeout(open_timeout, open).await {
            Ok(Ok(r)) => {
                for k in leases.values() {
                    k.status
                        .send_if_modified(|s| std::mem::take(&mut s.unauthenticated));
                }
                r.into_inner()
            }
            failed => {
                let err = match failed {
                    Ok(Err(s)) => Error::from_status(s),
                    _ => Error::Timeout(open_timeout),
                };
                if !stream_failed(&client, Some(idx), &err, &leases, &cancel, &mut backoff).await {
                    return;
                }
                continue 'reconnect;
            }
        };
        loop {
            let next_due = leases.values().map(|k| k.due).min();
            let sleep = async {
                match next_due {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let deadline = next_deadline(&leases);
            let expiry = async {
                match deadline {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let stalled_at = waiting.since.map(|t| t + stall_bound(&leases));
            let stall = async {
                match stalled_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            // Biased: an answer already here is taken before a stall or a
            // deadline is declared, so a busy runtime does not turn a late
            // poll into a lost lease.
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return,
                msg = inbound.message() => match msg {
                    Ok(Some(resp)) => {
                        backoff.reset();
                        waiting.answered();
                        if let Some(k) = leases.get(&resp.id) {
                            let lost = resp.ttl <= 0;
                            k.status.send_modify(|s| {
                                if lost {
                                    s.lost = true;
                                    s.ttl = Duration::ZERO;
                                } else {
                                    s.last_ok = Some(Instant::now());
                                    s.ttl = ttl_duration(resp.ttl);
                                    s.successes += 1;
                                }
                            });
                            if lost {
                                tracing::warn!(lease = resp.id, "lease lost: the server reports it expired");
                                leases.remove(&resp.id);
                            }
                        }
                    }
                    other => {
                        let err = match other {
                            Err(s) => Error::from_status(s),
                            _ => Error::Unavailable("keep-alive stream ended".into()),
                        };
                        if !stream_failed(&client, Some(idx), &err, &leases, &cancel, &mut backoff).await {
                            return;
                        }
                        continue 'reconnect;
                    }
                },
                cmd = cmds.recv() => match cmd {
                    Some(Cmd::Add { id, ttl, reply }) => {
                        apply(&mut leases, &mut regs, Cmd::Add { id, ttl, reply });
                        waiting.send(&out_tx, id);
                    }
                    Some(cmd) => apply(&mut leases, &mut regs, cmd),
                    None => return,
                },
                _ = sleep => {
                    let now = Instant::now();
                    for (id, k) in leases.iter_mut().filter(|(_, k)| k.due <= now) {
                        k.due = now + k.interval;
                        waiting.send(&out_tx, *id);
                    }
                }
                _ = stall => {
                    let bound = stall_bound(&leases);
                    tracing::warn!(?bound, unanswered = waiting.pending, "lease keep-alive stream stalled; moving to the next endpoint");
                    let err = Error::Unavailable(format!("no keep-alive answer in {bound:?}"));
                    if !stream_failed(&client, Some(idx), &err, &leases, &cancel, &mut backoff).await {
                        return;
                    }
                    continue 'reconnect;
                }
                _ = expiry => expire(&mut leases),
            }
        }
    }
}

/// Keep-alive requests sent and not yet answered on the current stream.
#[derive(Default)]
struct Waiting {
    pending: u64,
    /// Since when the stream owes an answer without having sent any: the
    /// first send with nothing pending, or the last answer while more are
    /// pending.
    since: Option<Instant>,
}

impl Waiting {
    fn send(&mut self, out: &mpsc::UnboundedSender<PbLeaseKeepAliveRequest>, id: i64) {
        if out.send(PbLeaseKeepAliveRequest { id }).is_ok() {
            self.pending += 1;
            self.since.get_or_insert_with(Instant::now);
        }
    }

    fn answered(&mut self) {
        self.pending = self.pending.saturating_sub(1);
        self.since = (self.pending > 0).then(Instant::now);
    }
}

/// How long a keep-alive may go unanswered before the stream counts as
/// stalled: half the shortest interval (TTL/6), at least
/// [`MIN_KEEPALIVE_STALL`].
fn stall_bound(leases: &HashMap<i64, Kept>) -> Duration {
    leases
        .values()
        .map(|k| k.interval / 2)
        .min()
        .unwrap_or(MIN_KEEPALIVE_STALL)
        .max(MIN_KEEPALIVE_STALL)
}

/// Hands out registration numbers, never reused.
#[derive(Default)]
struct Registrations(u64);

/// The earliest deadline of the leases kept.
fn next_deadline(leases: &HashMap<i64, Kept>) -> Option<Instant> {
    leases
        .values()
        .filter_map(|k| k.status.borrow().deadline())
        .min()
}

/// Declares lost, and stops keeping, every lease whose deadline has passed
/// without an answer (module docs).
fn expire(leases: &mut HashMap<i64, Kept>) {
    let now = Instant::now();
    leases.retain(|id, k| {
        let past = k.status.borrow().deadline().is_some_and(|d| d <= now);
        if past {
            tracing::warn!(
                lease = id,
                "lease lost: no keep-alive answered within its TTL"
            );
            k.status.send_modify(|s| {
                s.lost = true;
                s.ttl = Duration::ZERO;
            });
        }
        !past
    });
}

fn apply(leases: &mut HashMap<i64, Kept>, regs: &mut Registrations, cmd: Cmd) {
    match cmd {
        Cmd::Add { id, ttl, reply } => {
            // A third of the TTL, in whole milliseconds.
            let third =
                Duration::from_millis(ttl.max(Duration::from_secs(1)).as_millis() as u64 / 3);
            let interval = third.max(Duration::from_millis(100));
            let kept = leases.entry(id).or_insert_with(|| Kept {
                regs: Default::default(),
                interval,
                due: Instant::now(),
                status: watch::channel(LeaseStatus {
                    last_ok: Some(Instant::now()),
                    ttl,
                    lost: false,
                    successes: 0,
                    failures: 0,
                    unauthenticated: false,
                })
                .0,
            });
            kept.interval = interval;
            regs.0 += 1;
            kept.regs.insert(regs.0);
            let _ = reply.send((regs.0, kept.status.subscribe()));
        }
        Cmd::Remove { id, reg } => {
            // Only this registration, and only stop when no other handle
            // still holds the lease.
            if let Some(k) = leases.get_mut(&id)
                && k.regs.remove(&reg)
                && k.regs.is_empty()
            {
                leases.remove(&id);
            }
        }
    }
}

/// After the stream failed to open or broke: count it against every lease,
/// move to the next endpoint, and back off. False if cancelled meanwhile.
async fn stream_failed(
    client: &Transport,
    idx: Option<usize>,
    err: &Error,
    leases: &HashMap<i64, Kept>,
    cancel: &CancellationToken,
    backoff: &mut Backoff,
) -> bool {
    tracing::debug!(error = %err, "lease keep-alive stream failed; reopening");
    if err.is_invalid_token() {
        client.clear_token();
    }
    if let Some(idx) = idx {
        client.rotate(idx);
    }
    for k in leases.values() {
        k.status.send_modify(|s| s.failures += 1);
    }
    // A deadline that passes meanwhile is declared at once (the caller
    // expires it before reopening), not a backoff later.
    match next_deadline(leases) {
        Some(d) => tokio::select! {
            more = backoff.wait_unless(cancel.cancelled()) => more,
            _ = tokio::time::sleep_until(d) => !cancel.is_cancelled(),
        },
        None => backoff.wait_unless(cancel.cancelled()).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ttl_rounds_up_to_whole_seconds_and_zero_is_refused() {
        let ms = Duration::from_millis;
        assert_eq!(ttl_secs(ms(1)).unwrap(), 1);
        assert_eq!(ttl_secs(ms(1000)).unwrap(), 1);
        assert_eq!(ttl_secs(ms(1001)).unwrap(), 2);
        assert_eq!(ttl_secs(Duration::MAX).unwrap(), i64::MAX);
        assert!(matches!(
            ttl_secs(Duration::ZERO),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(ttl_duration(-1), Duration::ZERO);
    }
}
