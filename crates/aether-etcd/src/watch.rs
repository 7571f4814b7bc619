//! Watches: many watchers multiplexed on one bidirectional stream, resumed
//! without loss or duplication when the stream breaks.
//!
//! # The watch-stream actor
//!
//! A [`WatchStream`] is a handle to one task that owns one gRPC `Watch`
//! stream. [`WatchStream::watch`] picks the next watch id itself and queues
//! the create request without waiting for the server's `created` answer, so
//! creating a thousand watchers costs one round trip, not a thousand
//! (etcd >= 3.4 accepts client-chosen ids).
//!
//! The task remembers, per watcher, the revision to resume from: one past the
//! last revision it delivered. etcd never splits one revision's events over
//! two responses (large ones are fragmented and reassembled here first), so
//! when the stream breaks every watcher is re-created from its resume
//! revision and sees each event exactly once. A resume revision that has
//! been compacted meanwhile ends that watcher with [`Error::Compacted`].
//!
//! Every create (the first and each resume) asks the server for one
//! revision *before* the start and drops that revision's events here. etcd
//! without the fix for etcd-io/etcd#18089 (Debian's 3.4.23 among them)
//! accepts a watch that starts exactly at the compaction revision but has
//! already dropped that revision's delete events; starting one earlier
//! turns that silent loss into [`Error::Compacted`]. The cost is one
//! revision's events sent twice per create.
//!
//! # Each watcher's buffer is bounded in bytes
//!
//! Responses wait for their consumer in a per-watcher queue bounded by
//! their encoded size ([`ClientConfig::watcher_buffer_bytes`], default
//! [`DEFAULT_WATCHER_BUFFER_BYTES`]), not by their number: one catch-up
//! response can be tens of MiB, so a count bound let a paused watcher hold
//! gigabytes. The task takes byte permits from the watcher's budget before
//! it queues a response, and the consumer gives them back when it takes
//! the response. A response larger than the whole budget still passes, on
//! its own (it takes the whole budget). Nothing is dropped: a consumer that
//! stops reading holds back the whole stream (HTTP/2 flow control then
//! holds back the server), so consumers that must not slow each other down
//! use separate streams: [`Client::watch_stream`] opens a new one each time.
//! Errors are queued without waiting for the budget.
//!
//! A response being reassembled from fragments ([`WatchOptions::fragment`])
//! counts against the same budget as its fragments arrive (and in
//! [`Watcher::buffered_bytes`]): the task waits for room before it takes in
//! the next fragment, so a watcher's queue plus its partial response stay
//! within the budget, except that one response larger than the whole
//! budget still passes on its own, as above. Before, a watcher whose queue
//! was full could hold a whole fragmented response beside it.
//!
//! # A refused create ends its watcher
//!
//! etcd refuses a watch on keys the user may not read. 3.5 cancels it by
//! its id; 3.4 (and any failed create there) answers with a cancel for
//! watch id -1, which used to be taken for a progress notice: every watcher
//! on the stream saw a bogus notice and the refused one waited for ever.
//! etcd answers creates in order, so the task keeps the creates not yet
//! answered and ends the oldest one. "permission denied" ends the watcher
//! with [`Error::PermissionDenied`], anything else with
//! [`Error::WatchCanceled`].
//!
//! A create refused for its token ("invalid auth token": etcd forgets its
//! simple tokens when it restarts, and they expire after
//! `--auth-token-ttl` of disuse, so a watch resumed on a new stream often
//! carries a dead one) is not the watcher's fault: the stream drops the
//! token, re-authenticates and re-creates every watcher where it was, once
//! per watcher until one of its creates succeeds. "permission denied" gets
//! the same one retry, because etcd 3.4 says that for a dead token too
//! (and 3.5.1 at times just after a restart); a watch the user really may
//! not read costs one reconnect of its stream before it ends. A second
//! refusal in a row ends the watcher ([`Error::Auth`] or
//! [`Error::PermissionDenied`]). It used to end with `WatchCanceled`, or,
//! on 3.4, hang, however valid the credentials.
//!
//! # Refused credentials end the watchers
//!
//! The stream authenticates before it opens (when there are credentials
//! and no token). If the server refuses (wrong password, auth not enabled),
//! every watcher on the stream gets that error (`Error::Auth` for refused
//! credentials) and ends: opening without a token instead made etcd accept
//! the stream and answer each create with a cancel, or nothing, so the
//! watcher hung or saw what looked like a progress notice. Watchers added
//! later try again, with whatever credentials are current then. An
//! authentication that could not reach any member is retried with backoff
//! like any stream failure, and counted in [`WatchStream::reconnects`].
//!
//! # A response over the decode limit ends the stream's watchers
//!
//! A response larger than [`ClientConfig::max_decoding_message_size`]
//! cannot be decoded, and resuming would only ask for the same response
//! again: that used to be a silent reconnect loop. Instead the task ends
//! **every watcher on the stream** with [`Error::ResponseTooLarge`] and does
//! not reconnect for them. It cannot do better: the undecodable message
//! carries the watch id, so nothing says which watcher it was for, and
//! guessing ("the ones still catching up") is wrong too, because a watcher
//! that has caught up receives one whole revision per response, so a single
//! large txn written now overflows it as well. Any watcher that is
//! re-created at its resume revision may hit the same response again; only
//! the caller can re-read that range in pieces (by range, with a higher
//! limit, or with [`WatchOptions::fragment`] when the server's own request
//! limit is below the client's decode limit). The stream itself stays
//! usable: watchers added later open a new gRPC stream. Consumers that
//! should not share this fate use separate streams. Note that a create asks
//! for the revision *before* its start (below), so a watcher started just
//! after an oversized revision on its keys hits that revision as well.
//!
//! [`Client::watch_stream`]: super::Client::watch_stream
//! [`ClientConfig::watcher_buffer_bytes`]: super::ClientConfig::watcher_buffer_bytes
//! [`ClientConfig::max_decoding_message_size`]: super::ClientConfig::max_decoding_message_size
//! [`DEFAULT_WATCHER_BUFFER_BYTES`]: super::DEFAULT_WATCHER_BUFFER_BYTES

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::backoff::Backoff;
use super::error::{Error, Result, is_token_refusal};
use super::kv::{KeyValue, prefix_range};
use super::pb::{
    PbEvent, PbEventType, PbWatchCancelRequest, PbWatchClient, PbWatchCreateRequest,
    PbWatchProgressRequest, PbWatchRequest, PbWatchRequestUnion, PbWatchResponse,
};
use super::task::spawn_until_dropped;
use super::transport::Transport;

/// Longest wait between attempts to reopen a broken watch stream.
pub const MAX_WATCH_BACKOFF: Duration = Duration::from_secs(2);
/// What one queued response costs beyond its events' encoded size, so that
/// empty progress notices are bounded too.
const RESPONSE_OVERHEAD_BYTES: usize = 64;
/// What one event costs beyond its key-values' encoded size (type, tags).
const EVENT_OVERHEAD_BYTES: usize = 8;

/// What happened to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The key was written.
    Put,
    /// The key was deleted.
    Delete,
}

/// One change to one key.
#[derive(Clone, Debug)]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// The key-value after the change. For a delete only the key and the
    /// mod revision (the delete's revision) are set.
    pub kv: KeyValue,
    /// The key-value before the change, when the watcher asked for it.
    pub prev_kv: Option<KeyValue>,
}

impl Event {
    fn from_pb(e: PbEvent) -> Event {
        Event {
            kind: if e.r#type == PbEventType::Delete as i32 {
                EventKind::Delete
            } else {
                EventKind::Put
            },
            kv: KeyValue(e.kv.unwrap_or_default()),
            prev_kv: e.prev_kv.map(KeyValue),
        }
    }
    /// An event built by hand, for tests and benches of code that consumes
    /// events.
    #[doc(hidden)]
    pub fn synthetic(kind: EventKind, key: Bytes, value: Bytes, mod_revision: i64) -> Event {
        let kv = super::pb::PbKeyValue {
            key,
            value,
            mod_revision,
            ..Default::default()
        };
        Event {
            kind,
            kv: KeyValue(kv),
            prev_kv: None,
        }
    }

    /// The revision of the change.
    pub fn revision(&self) -> i64 {
        self.kv.mod_revision()
    }
}

/// A batch of events from one watch response, or a progress notice.
#[derive(Clone, Debug)]
pub struct WatchResponse {
    /// The store revision when the server sent the response. With no events
    /// this is a progress notice.
    pub revision: i64,
    /// The events, in revision order. All events of one revision are in the
    /// same response.
    pub events: Vec<Event>,
}

/// What to watch.
#[derive(Clone, Debug)]
pub struct WatchOptions(pub(crate) PbWatchCreateRequest);

impl WatchOptions {
    /// Watch exactly `key`.
    pub fn key(key: impl Into<Bytes>) -> Self {
        Self::between(key.into(), Bytes::new())
    }
    /// Watch every key starting with `prefix`.
    pub fn prefix(prefix: impl Into<Bytes>) -> Self {
        let (key, range_end) = prefix_range(prefix);
        Self::between(key, range_end)
    }
    fn between(key: Bytes, range_end: Bytes) -> Self {
        WatchOptions(PbWatchCreateRequest {
            key,
            range_end,
            ..Default::default()
        })
    }
    /// Start at this revision (inclusive); 0 means "from now" (see
    /// [`WatchStream::watch`] for what "now" is).
    pub fn start_revision(mut self, rev: i64) -> Self {
        self.0.start_revision = rev;
        self
    }
    /// Include the previous key-value in each event.
    pub fn prev_kv(mut self) -> Self {
        self.0.prev_kv = true;
        self
    }
    /// Let the server split responses larger than its request size limit;
    /// the stream reassembles them. Off by default: the client accepts
    /// large messages anyway, and etcd 3.4 builds fragments in time
    /// quadratic in the events per fragment (50k small events take 2.7 s
    /// fragmented, 0.2 s whole).
    pub fn fragment(mut self) -> Self {
        self.0.fragment = true;
        self
    }
    /// Ask the server for periodic progress notices.
    pub fn progress_notify(mut self) -> Self {
        self.0.progress_notify = true;
        self
    }
}

/// Receives one watch's events. Dropping it cancels the watch. It keeps
/// its stream's task alive, so `let (_, watcher) = client.watch(..)?` works.
///
/// A `Watcher` is a [`Stream`](futures_util::Stream) of responses:
///
/// ```no_run
/// # async fn demo(client: aether_etcd::Client) -> aether_etcd::Result<()> {
/// use futures_util::StreamExt;
/// use aether_etcd::WatchOptions;
///
/// let (_, watcher) = client.watch(WatchOptions::prefix("/k/"))?;
/// let mut puts = watcher.map(|r| r.map(|resp| resp.events.len())).take(3);
/// while let Some(n) = puts.next().await {
///     println!("{} events", n?);
/// }
/// # Ok(()) }
/// ```
pub struct Watcher {
    id: i64,
    rx: mpsc::UnboundedReceiver<Queued>,
    buffered: Arc<AtomicUsize>,
    cmds: mpsc::UnboundedSender<Cmd>,
    _stream: Arc<DropGuard>,
}

/// A response waiting for its consumer, holding its share of the
/// watcher's byte budget until the consumer takes it.
struct Queued {
    msg: Result<WatchResponse>,
    bytes: usize,
    _permit: Option<OwnedSemaphorePermit>,
}

/// The stream task's end of one watcher's queue.
struct Sink {
    tx: mpsc::UnboundedSender<Queued>,
    /// Byte permits; `capacity` of them in all.
    budget: Arc<Semaphore>,
    capacity: usize,
    buffered: Arc<AtomicUsize>,
}

impl Sink {
    /// Queues a response once its bytes fit the budget (one larger than
    /// the whole budget waits until the queue is empty). `held` is what its
    /// fragments already hold. False when the consumer is gone.
    async fn send(&self, resp: WatchResponse, held: Fragments) -> bool {
        let bytes = response_bytes(&resp);
        let Some(permit) = self.grow(held.permit, bytes).await else {
            return false;
        };
        self.buffered.fetch_sub(held.bytes, Ordering::Relaxed);
        self.push(Ok(resp), bytes, Some(permit))
    }

    /// Takes budget for the next fragment's `bytes` (module docs): waits
    /// until they fit beside the queue, up to the whole budget. False when
    /// the consumer is gone.
    async fn hold(&self, frag: &mut Fragments, bytes: usize) -> bool {
        let Some(permit) = self.grow(frag.permit.take(), frag.bytes + bytes).await else {
            return false;
        };
        frag.permit = Some(permit);
        frag.bytes += bytes;
        self.buffered.fetch_add(bytes, Ordering::Relaxed);
        true
    }

    /// Gives back what a discarded partial response held.
    fn release(&self, frag: Fragments) {
        self.buffered.fetch_sub(frag.bytes, Ordering::Relaxed);
    }

    /// `held` grown to cover `bytes` of the budget (at most all of it).
    async fn grow(
        &self,
        held: Option<OwnedSemaphorePermit>,
        bytes: usize,
    ) -> Option<OwnedSemaphorePermit> {
        let have = held.as_ref().map_or(0, |p| p.num_permits());
        // `capacity` fits in u32: see `WatchStream::watch`.
        let want = bytes.min(self.capacity).saturating_sub(have) as u32;
        if want == 0 && held.is_some() {
            return held;
        }
        let mut more = tokio::select! {
            p = self.budget.clone().acquire_many_owned(want) => p.ok()?,
            // A consumer that drops its watcher while the stream waits for
            // it must not hold the stream for ever.
            _ = self.tx.closed() => return None,
        };
        if let Some(held) = held {
            more.merge(held);
        }
        Some(more)
    }

    /// Queues an error at once: it ends the watcher, and it is small.
    fn send_err(&self, err: Error) {
        self.push(Err(err), 0, None);
    }

    fn push(
        &self,
        msg: Result<WatchResponse>,
        bytes: usize,
        permit: Option<OwnedSemaphorePermit>,
    ) -> bool {
        self.buffered.fetch_add(bytes, Ordering::Relaxed);
        let sent = self.tx.send(Queued {
            msg,
            bytes,
            _permit: permit,
        });
        if sent.is_err() {
            self.buffered.fetch_sub(bytes, Ordering::Relaxed);
        }
        sent.is_ok()
    }
}

/// What a response costs against its watcher's budget: its events'
/// encoded size plus a fixed overhead.
fn response_bytes(resp: &WatchResponse) -> usize {
    RESPONSE_OVERHEAD_BYTES + events_bytes(&resp.events)
}

/// What events cost against their watcher's budget.
fn events_bytes(events: &[Event]) -> usize {
    events
        .iter()
        .map(|e| {
            EVENT_OVERHEAD_BYTES
                + e.kv.0.encoded_len()
                + e.prev_kv.as_ref().map_or(0, |p| p.0.encoded_len())
        })
        .sum::<usize>()
}

impl Watcher {
    /// The client-assigned watch id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The next response. `None` when the stream's task has stopped. After
    /// an error (compaction, cancellation) the watcher is finished.
    pub async fn next(&mut self) -> Option<Result<WatchResponse>> {
        let q = self.rx.recv().await?;
        Some(self.take(q))
    }

    /// A response that has already arrived, without waiting; `None` if
    /// nothing is buffered right now.
    pub fn try_next(&mut self) -> Option<Result<WatchResponse>> {
        let q = self.rx.try_recv().ok()?;
        Some(self.take(q))
    }

    /// Encoded bytes of the responses queued for this watcher and not yet
    /// taken, plus the fragments of one being reassembled. At most the
    /// budget ([`ClientConfig::watcher_buffer_bytes`]), or one response
    /// when that response alone is larger.
    ///
    /// [`ClientConfig::watcher_buffer_bytes`]: super::ClientConfig::watcher_buffer_bytes
    pub fn buffered_bytes(&self) -> usize {
        self.buffered.load(Ordering::Relaxed)
    }

    /// Hands a queued response over, giving its bytes back to the budget.
    fn take(&self, q: Queued) -> Result<WatchResponse> {
        self.buffered.fetch_sub(q.bytes, Ordering::Relaxed);
        q.msg
    }
}

impl futures_util::Stream for Watcher {
    type Item = Result<WatchResponse>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.rx.poll_recv(cx).map(|q| q.map(|q| this.take(q)))
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.cmds.send(Cmd::Cancel(self.id));
    }
}

enum Cmd {
    Create {
        id: i64,
        req: PbWatchCreateRequest,
        sink: Sink,
    },
    Cancel(i64),
    Progress,
}

/// A handle to one watch stream and its task; cheap to clone. The task
/// stops when every handle and every watcher is gone; it holds the client's
/// connections, not the client.
#[derive(Clone)]
pub struct WatchStream {
    next_id: Arc<AtomicI64>,
    cmds: mpsc::UnboundedSender<Cmd>,
    connected: Arc<AtomicBool>,
    reconnects: Arc<AtomicU64>,
    buffer_bytes: usize,
    _guard: Arc<DropGuard>,
}

/// The watch service on a transport.
#[derive(Clone)]
pub(crate) struct WatchClient {
    transport: Transport,
}

impl WatchClient {
    pub(crate) fn new(transport: Transport) -> WatchClient {
        WatchClient { transport }
    }

    /// A new watch stream: its own gRPC stream and task.
    pub(crate) fn stream(&self) -> WatchStream {
        let (tx, rx) = mpsc::unbounded_channel();
        let connected = Arc::new(AtomicBool::new(false));
        let reconnects = Arc::new(AtomicU64::new(0));
        let (t, c, r) = (
            self.transport.clone(),
            connected.clone(),
            reconnects.clone(),
        );
        let guard = spawn_until_dropped(|cancel| run(t, rx, cancel, c, r));
        WatchStream {
            next_id: Arc::new(AtomicI64::new(1)),
            cmds: tx,
            connected,
            reconnects,
            buffer_bytes: self.transport.config().watcher_buffer_bytes,
            _guard: Arc::new(guard),
        }
    }

    /// One watcher on a new stream of its own.
    pub(crate) fn watch(&self, opts: WatchOptions) -> Result<(WatchStream, Watcher)> {
        let stream = self.stream();
        let watcher = stream.watch(opts)?;
        Ok((stream, watcher))
    }
}

impl WatchStream {
    /// Adds a watcher. The create request is queued at once; errors such as
    /// a compacted start revision arrive on the watcher.
    ///
    /// Without a start revision, "now" is when the server processes the
    /// create, which can be after a write the caller makes right after this
    /// returns. To see a write for certain, watch from a known revision
    /// (for example one past a read's header revision).
    pub fn watch(&self, opts: WatchOptions) -> Result<Watcher> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        // At least one byte, so a zero budget means one response at a time
        // rather than no bound; at most what one acquire can ask for.
        let capacity = self.buffer_bytes.clamp(1, u32::MAX as usize);
        let buffered = Arc::new(AtomicUsize::new(0));
        let sink = Sink {
            tx,
            budget: Arc::new(Semaphore::new(capacity)),
            capacity,
            buffered: buffered.clone(),
        };
        let mut req = opts.0;
        req.watch_id = id;
        self.cmds
            .send(Cmd::Create { id, req, sink })
            .map_err(|_| Error::Closed)?;
        Ok(Watcher {
            id,
            rx,
            buffered,
            cmds: self.cmds.clone(),
            _stream: self._guard.clone(),
        })
    }

    /// How many times the task has reopened the stream after it broke or
    /// failed to open. A steady climb with no outage means something is
    /// wrong with the stream itself.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Whether the stream is open right now. False before the first watcher
    /// connects and while the task is reconnecting after a failure, so a
    /// consumer can tell a quiet watch from a dead one.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Asks the server for a progress notice. etcd 3.4 broadcasts it to
    /// every watcher on the stream with the current store revision.
    pub fn request_progress(&self) -> Result<()> {
        self.cmds.send(Cmd::Progress).map_err(|_| Error::Closed)
    }
}

struct State {
    req: PbWatchCreateRequest,
    /// First revision not yet delivered; 0 until known ("from now").
    resume: i64,
    sink: Sink,
    /// The response being reassembled, with its share of the budget.
    fragments: Fragments,
    /// Its create was refused for its token and the stream re-authenticated
    /// for it; a second refusal before a create succeeds ends it.
    reauthed: bool,
}

/// The fragments of one response received so far, holding their bytes of
/// the watcher's budget (module docs).
#[derive(Default)]
struct Fragments {
    events: Vec<Event>,
    /// Their bytes, as counted in `Watcher::buffered_bytes`.
    bytes: usize,
    /// Budget taken for them: `bytes`, at most the whole budget.
    permit: Option<OwnedSemaphorePermit>,
}

fn create_msg(id: i64, st: &State) -> PbWatchRequest {
    let mut req = st.req.clone();
    req.watch_id = id;
    if st.resume > 0 {
        // One revision early, so that a start at the compaction revision
        // is refused instead of silently missing its deletes; `dispatch`
        // drops the replayed revision.
        req.start_revision = (st.resume - 1).max(1);
    }
    PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::CreateRequest(req)),
    }
}

fn cancel_msg(id: i64) -> PbWatchRequest {
    PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::CancelRequest(PbWatchCancelRequest {
            watch_id: id,
        })),
    }
}

async fn run(
    client: Transport,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    cancel: CancellationToken,
    connected: Arc<AtomicBool>,
    reconnects: Arc<AtomicU64>,
) {
    let mut watchers: HashMap<i64, State> = HashMap::new();
    let mut backoff = Backoff::new(Duration::from_millis(50), MAX_WATCH_BACKOFF);
    let mut commands_open = true;
    loop {
        while watchers.is_empty() {
            if !commands_open {
                return;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                cmd = cmds.recv() => match cmd {
                    Some(Cmd::Create { id, req, sink }) => {
                        watchers.insert(id, State { resume: req.start_revision, req, sink, fragments: Fragments::default(), reauthed: false });
                    }
                    Some(_) => {}
                    None => commands_open = false,
                },
            }
        }
        if let Err(err) = client.ensure_token().await {
            reconnects.fetch_add(1, Ordering::Relaxed);
            if err.is_transient() {
                // `authenticate` has already moved past unreachable members.
                tracing::debug!(error = %err, "watch stream: authentication failed; retrying");
                if !backoff.wait_unless(cancel.cancelled()).await {
                    return;
                }
                continue;
            }
            // Refused: end the watchers rather than open without a token
            // (module docs).
            tracing::warn!(error = %err, watchers = watchers.len(), "watch stream: authentication refused; ending every watcher on the stream");
            for (_, st) in watchers.drain() {
                st.sink.send_err(auth_error(&err));
            }
            continue;
        }
        // Queue every create before opening: etcd sends the response
        // headers only with its first message.
        let (out_tx, out_rx) = mpsc::unbounded_channel::<PbWatchRequest>();
        // The creates the server has not answered yet, in the order sent:
        // etcd 3.4 refuses one with a cancel for watch id -1 (see
        // `dispatch`), so only the order says which it was.
        let mut pending: VecDeque<i64> = VecDeque::new();
        for (id, st) in &watchers {
            pending.push_back(*id);
            let _ = out_tx.send(create_msg(*id, st));
        }
        let (idx, svc) = client.svc();
        let mut wc = PbWatchClient::new(svc)
            .max_decoding_message_size(client.max_decoding())
            .max_encoding_message_size(client.max_encoding());
        let outbound = tokio_stream::wrappers::UnboundedReceiverStream::new(out_rx);
        let mut request = tonic::Request::new(outbound);
        if client.config().watch_require_leader {
            // Without it, a member cut off from its quorum keeps the stream
            // open and silent; with it, etcd refuses or cancels the stream
            // and the task moves to the next endpoint.
            request.metadata_mut().insert(
                "hasleader",
                tonic::metadata::AsciiMetadataValue::from_static("true"),
            );
        }
        let open = wc.watch(request);
        let opened = tokio::select! {
            _ = cancel.cancelled() => return,
            r = tokio::time::timeout(client.config().request_timeout, open) => r,
        };
        let mut inbound = match opened {
            Ok(Ok(resp)) => {
                connected.store(true, Ordering::Relaxed);
                resp.into_inner()
            }
            failed => {
                let err = match failed {
                    Ok(Err(s)) => Error::from(s),
                    _ => Error::Timeout(client.config().request_timeout),
                };
                tracing::debug!(error = %err, "watch stream failed to open");
                if err.is_invalid_token() {
                    client.clear_token();
                }
                client.rotate(idx);
                reconnects.fetch_add(1, Ordering::Relaxed);
                if !backoff.wait_unless(cancel.cancelled()).await {
                    return;
                }
                continue;
            }
        };
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                cmd = cmds.recv(), if commands_open => match cmd {
                    Some(Cmd::Create { id, req, sink }) => {
                        let st = State { resume: req.start_revision, req, sink, fragments: Fragments::default(), reauthed: false };
                        pending.push_back(id);
                        let _ = out_tx.send(create_msg(id, &st));
                        watchers.insert(id, st);
                    }
                    Some(Cmd::Cancel(id)) => {
                        if watchers.remove(&id).is_some() {
                            let _ = out_tx.send(cancel_msg(id));
                        }
                    }
                    Some(Cmd::Progress) => {
                        let _ = out_tx.send(PbWatchRequest {
                            request_union: Some(PbWatchRequestUnion::ProgressRequest(PbWatchProgressRequest {})),
                        });
                    }
                    None => commands_open = false,
                },
                msg = inbound.message() => match msg {
                    Ok(Some(resp)) => {
                        backoff.reset();
                        let reauth = dispatch(&mut watchers, &mut pending, resp, &out_tx).await;
                        if watchers.is_empty() && !commands_open {
                            return;
                        }
                        if reauth {
                            // A create refused for its token (module docs):
                            // a new token and a new stream, from where every
                            // watcher is.
                            tracing::debug!("watch create refused for its token; re-authenticating");
                            client.clear_token();
                            connected.store(false, Ordering::Relaxed);
                            reconnects.fetch_add(1, Ordering::Relaxed);
                            for st in watchers.values_mut() {
                                st.sink.release(std::mem::take(&mut st.fragments));
                            }
                            break;
                        }
                    }
                    other => {
                        let err = match other {
                            Err(s) => Error::from(s),
                            _ => Error::Unavailable("watch stream ended".into()),
                        };
                        connected.store(false, Ordering::Relaxed);
                        if let Error::ResponseTooLarge { limit } = err {
                            // Every member would send the same response, so
                            // neither a resume nor another endpoint helps:
                            // end the watchers (see the module docs).
                            let limit = if limit == 0 { client.max_decoding() } else { limit };
                            tracing::warn!(limit, watchers = watchers.len(), "a watch response is over the decode limit; ending every watcher on the stream");
                            for (_, st) in watchers.drain() {
                                st.sink.send_err(Error::ResponseTooLarge { limit });
                            }
                            if !commands_open {
                                return;
                            }
                            break;
                        }
                        tracing::debug!(error = %err, watchers = watchers.len(), "watch stream broke; resuming");
                        if err.is_invalid_token() {
                            client.clear_token();
                        }
                        client.rotate(idx);
                        reconnects.fetch_add(1, Ordering::Relaxed);
                        for st in watchers.values_mut() {
                            st.sink.release(std::mem::take(&mut st.fragments));
                        }
                        if !backoff.wait_unless(cancel.cancelled()).await {
                            return;
                        }
                        break;
                    }
                },
            }
        }
    }
}

/// Hands one response to its watcher(s). True when a create was refused
/// for its token and the stream should re-authenticate and reopen.
async fn dispatch(
    watchers: &mut HashMap<i64, State>,
    pending: &mut VecDeque<i64>,
    resp: PbWatchResponse,
    out: &mpsc::UnboundedSender<PbWatchRequest>,
) -> bool {
    let revision = resp.header.as_ref().map_or(0, |h| h.revision);
    if resp.created
        && resp.watch_id != -1
        && let Some(at) = pending.iter().position(|p| *p == resp.watch_id)
    {
        pending.remove(at);
    }
    if resp.watch_id == -1 && resp.canceled {
        // etcd 3.4 refuses a create (a user without read permission on
        // the range, an invalid token) with `created` and `canceled` for
        // watch id -1, not the watcher's: it is the oldest create not yet
        // answered, since the server answers creates in order. Taken for a
        // progress notice, it used to leave that watcher waiting for ever.
        let Some(id) = pending.pop_front() else {
            return false;
        };
        return refused(watchers, id, &resp.cancel_reason);
    }
    if resp.watch_id == -1 {
        // A broadcast progress notice (etcd 3.4's answer to a progress
        // request). It does not move resume revisions: in 3.4 it is sent
        // even to watchers that have not caught up yet.
        let ids: Vec<i64> = watchers.keys().copied().collect();
        for id in ids {
            deliver(
                watchers,
                id,
                WatchResponse {
                    revision,
                    events: Vec::new(),
                },
                Fragments::default(),
                out,
            )
            .await;
        }
        return false;
    }
    let id = resp.watch_id;
    let Some(st) = watchers.get_mut(&id) else {
        return false;
    };
    if resp.canceled {
        if resp.compact_revision == 0 {
            return refused(watchers, id, &resp.cancel_reason);
        }
        st.sink.release(std::mem::take(&mut st.fragments));
        st.sink.send_err(Error::Compacted {
            compact_revision: Some(resp.compact_revision),
        });
        watchers.remove(&id);
        return false;
    }
    if resp.created {
        st.reauthed = false;
        // A watch "from now" starts after the revision it was created at.
        if st.resume == 0 {
            st.resume = revision + 1;
        }
        if resp.events.is_empty() {
            return false;
        }
    }
    let new: Vec<Event> = resp.events.into_iter().map(Event::from_pb).collect();
    if resp.fragment {
        // Counted against the budget before it is kept (module docs).
        if !st.sink.hold(&mut st.fragments, events_bytes(&new)).await {
            watchers.remove(&id);
            let _ = out.send(cancel_msg(id));
            return false;
        }
        st.fragments.events.extend(new);
        return false;
    }
    let mut held = std::mem::take(&mut st.fragments);
    let mut events = std::mem::take(&mut held.events);
    events.extend(new);
    if events.first().is_some_and(|e| e.revision() < st.resume) {
        // The revision before the start, asked for by `create_msg`. Events
        // come in revision order, so they are a prefix.
        let keep = events.partition_point(|e| e.revision() < st.resume);
        events.drain(..keep);
        if events.is_empty() {
            // Not a progress notice: say nothing rather than look like one.
            st.sink.release(held);
            return false;
        }
    }
    if let Some(last) = events.last() {
        st.resume = last.revision() + 1;
    } else if revision >= st.resume && st.resume > 0 {
        // A per-watcher progress notice: the server only sends these to
        // watchers that have caught up, so nothing below it is pending.
        st.resume = revision + 1;
    }
    deliver(watchers, id, WatchResponse { revision, events }, held, out).await;
    false
}

/// A watch the server canceled (not for compaction) or refused to create.
/// Refused for its token or for permission, and not yet since a
/// re-authentication: kept, and true (the stream re-authenticates and
/// re-creates it). Otherwise it ends with the reason's error.
fn refused(watchers: &mut HashMap<i64, State>, id: i64, reason: &str) -> bool {
    let Some(st) = watchers.get_mut(&id) else {
        return false;
    };
    // 3.4 says "permission denied" for a dead token too, and so does 3.5
    // at times just after a restart: worth one new token as well.
    let maybe_token = is_token_refusal(reason) || reason.contains("etcdserver: permission denied");
    if maybe_token && !st.reauthed {
        st.reauthed = true;
        return true;
    }
    if let Some(mut st) = watchers.remove(&id) {
        st.sink.release(std::mem::take(&mut st.fragments));
        st.sink.send_err(cancel_error(reason));
    }
    false
}

/// The error for a watch the server canceled, from its reason: etcd
/// refuses a watch on keys the user may not read with "permission denied"
/// (3.5 wraps it in the gRPC status text).
fn cancel_error(reason: &str) -> Error {
    if reason.contains("etcdserver: permission denied") {
        Error::PermissionDenied
    } else if is_token_refusal(reason) {
        Error::Auth(reason.to_string())
    } else if reason.is_empty() {
        Error::WatchCanceled("the server refused the watch".into())
    } else {
        Error::WatchCanceled(reason.to_string())
    }
}

/// The error each watcher gets when the stream's authentication was
/// refused: `err` itself where it can be copied.
fn auth_error(err: &Error) -> Error {
    match err {
        Error::Auth(m) => Error::Auth(m.clone()),
        Error::PermissionDenied => Error::PermissionDenied,
        Error::Status(s) => Error::Status(s.clone()),
        other => Error::Auth(other.to_string()),
    }
}

async fn deliver(
    watchers: &mut HashMap<i64, State>,
    id: i64,
    resp: WatchResponse,
    held: Fragments,
    out: &mpsc::UnboundedSender<PbWatchRequest>,
) {
    let Some(st) = watchers.get(&id) else { return };
    if !st.sink.send(resp, held).await {
        watchers.remove(&id);
        let _ = out.send(cancel_msg(id));
    }
}
