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
//! Each watcher has a bounded queue. A consumer that stops reading holds
//! back the whole stream (HTTP/2 flow control then holds back the server),
//! so consumers that must not slow each other down use separate streams:
//! [`Client::watch_stream`] opens a new one each time.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

use super::backoff::Backoff;
use super::client::{Client, Transport};
use super::error::{Error, Result};
use super::kv::{KeyValue, prefix_end};
use super::pb::{
    PbEvent, PbEventType, PbWatchCancelRequest, PbWatchCreateRequest, PbWatchProgressRequest,
    PbWatchRequest, PbWatchRequestUnion, PbWatchResponse, WatchClient,
};

/// Longest wait between attempts to reopen a broken watch stream.
pub const MAX_WATCH_BACKOFF: Duration = Duration::from_secs(2);
/// Responses buffered per watcher before the stream waits for its consumer.
pub const WATCHER_QUEUE: usize = 64;

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
        WatchOptions(PbWatchCreateRequest {
            key: key.into(),
            ..Default::default()
        })
    }
    /// Watch every key starting with `prefix`.
    pub fn prefix(prefix: impl Into<Bytes>) -> Self {
        let key = prefix.into();
        let range_end = prefix_end(&key);
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
/// # async fn demo(client: aether_replicator::etcd::Client) -> aether_replicator::etcd::Result<()> {
/// use futures_util::StreamExt;
/// use aether_replicator::etcd::WatchOptions;
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
    rx: mpsc::Receiver<Result<WatchResponse>>,
    cmds: mpsc::UnboundedSender<Cmd>,
    _stream: Arc<DropGuard>,
}

impl Watcher {
    /// The client-assigned watch id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The next response. `None` when the stream's task has stopped. After
    /// an error (compaction, cancellation) the watcher is finished.
    pub async fn next(&mut self) -> Option<Result<WatchResponse>> {
        self.rx.recv().await
    }

    /// A response that has already arrived, without waiting; `None` if
    /// nothing is buffered right now.
    pub fn try_next(&mut self) -> Option<Result<WatchResponse>> {
        self.rx.try_recv().ok()
    }
}

impl futures_util::Stream for Watcher {
    type Item = Result<WatchResponse>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
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
        tx: mpsc::Sender<Result<WatchResponse>>,
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
    _guard: Arc<DropGuard>,
}

impl Client {
    /// Opens a new watch stream (its own gRPC stream and task).
    pub fn watch_stream(&self) -> WatchStream {
        let (tx, rx) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let connected = Arc::new(AtomicBool::new(false));
        // Logs under the caller's span (the engine's per-peer span).
        tokio::spawn(
            run(
                self.transport().clone(),
                rx,
                cancel.clone(),
                connected.clone(),
            )
            .instrument(tracing::Span::current()),
        );
        WatchStream {
            next_id: Arc::new(AtomicI64::new(1)),
            cmds: tx,
            connected,
            _guard: Arc::new(cancel.drop_guard()),
        }
    }

    /// Watches on a new stream of its own; see [`WatchStream::watch`].
    pub fn watch(&self, opts: WatchOptions) -> Result<(WatchStream, Watcher)> {
        let stream = self.watch_stream();
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
        let (tx, rx) = mpsc::channel(WATCHER_QUEUE);
        let mut req = opts.0;
        req.watch_id = id;
        self.cmds
            .send(Cmd::Create { id, req, tx })
            .map_err(|_| Error::Closed)?;
        Ok(Watcher {
            id,
            rx,
            cmds: self.cmds.clone(),
            _stream: self._guard.clone(),
        })
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
    tx: mpsc::Sender<Result<WatchResponse>>,
    fragments: Vec<Event>,
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
                    Some(Cmd::Create { id, req, tx }) => {
                        watchers.insert(id, State { resume: req.start_revision, req, tx, fragments: Vec::new() });
                    }
                    Some(_) => {}
                    None => commands_open = false,
                },
            }
        }
        let _ = client.ensure_token().await;
        // Queue every create before opening: etcd sends the response
        // headers only with its first message.
        let (out_tx, out_rx) = mpsc::unbounded_channel::<PbWatchRequest>();
        for (id, st) in &watchers {
            let _ = out_tx.send(create_msg(*id, st));
        }
        let (idx, svc) = client.svc();
        let mut wc = WatchClient::new(svc)
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
                if !sleep_or_cancel(&cancel, &mut backoff).await {
                    return;
                }
                continue;
            }
        };
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                cmd = cmds.recv(), if commands_open => match cmd {
                    Some(Cmd::Create { id, req, tx }) => {
                        let st = State { resume: req.start_revision, req, tx, fragments: Vec::new() };
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
                        dispatch(&mut watchers, resp, &out_tx).await;
                        if watchers.is_empty() && !commands_open {
                            return;
                        }
                    }
                    other => {
                        let err = match other {
                            Err(s) => Error::from(s),
                            _ => Error::Unavailable("watch stream ended".into()),
                        };
                        connected.store(false, Ordering::Relaxed);
                        tracing::debug!(error = %err, watchers = watchers.len(), "watch stream broke; resuming");
                        if err.is_invalid_token() {
                            client.clear_token();
                        }
                        client.rotate(idx);
                        for st in watchers.values_mut() {
                            st.fragments.clear();
                        }
                        if !sleep_or_cancel(&cancel, &mut backoff).await {
                            return;
                        }
                        break;
                    }
                },
            }
        }
    }
}

async fn sleep_or_cancel(cancel: &CancellationToken, backoff: &mut Backoff) -> bool {
    let d = backoff.next_delay();
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

async fn dispatch(
    watchers: &mut HashMap<i64, State>,
    resp: PbWatchResponse,
    out: &mpsc::UnboundedSender<PbWatchRequest>,
) {
    let revision = resp.header.as_ref().map_or(0, |h| h.revision);
    if resp.watch_id == -1 {
        // A broadcast progress notice (etcd 3.4's answer to a progress
        // request). It does not move resume revisions: in 3.4 it is sent
        // even to watchers that have not caught up yet.
        let ids: Vec<i64> = watchers.keys().copied().collect();
        for id in ids {
            deliver(
                watchers,
                id,
                Ok(WatchResponse {
                    revision,
                    events: Vec::new(),
                }),
                out,
            )
            .await;
        }
        return;
    }
    let id = resp.watch_id;
    let Some(st) = watchers.get_mut(&id) else {
        return;
    };
    if resp.canceled {
        let err = if resp.compact_revision > 0 {
            Error::Compacted {
                compact_revision: Some(resp.compact_revision),
            }
        } else {
            Error::WatchCanceled(resp.cancel_reason.clone())
        };
        let _ = st.tx.send(Err(err)).await;
        watchers.remove(&id);
        return;
    }
    if resp.created {
        // A watch "from now" starts after the revision it was created at.
        if st.resume == 0 {
            st.resume = revision + 1;
        }
        if resp.events.is_empty() {
            return;
        }
    }
    let mut events: Vec<Event> = std::mem::take(&mut st.fragments);
    events.extend(resp.events.into_iter().map(Event::from_pb));
    if resp.fragment {
        st.fragments = events;
        return;
    }
    if events.first().is_some_and(|e| e.revision() < st.resume) {
        // The revision before the start, asked for by `create_msg`. Events
        // come in revision order, so they are a prefix.
        let keep = events.partition_point(|e| e.revision() < st.resume);
        events.drain(..keep);
        if events.is_empty() {
            // Not a progress notice: say nothing rather than look like one.
            return;
        }
    }
    if let Some(last) = events.last() {
        st.resume = last.revision() + 1;
    } else if revision >= st.resume && st.resume > 0 {
        // A per-watcher progress notice: the server only sends these to
        // watchers that have caught up, so nothing below it is pending.
        st.resume = revision + 1;
    }
    deliver(watchers, id, Ok(WatchResponse { revision, events }), out).await;
}

async fn deliver(
    watchers: &mut HashMap<i64, State>,
    id: i64,
    msg: Result<WatchResponse>,
    out: &mpsc::UnboundedSender<PbWatchRequest>,
) {
    let Some(st) = watchers.get(&id) else { return };
    if st.tx.send(msg).await.is_err() {
        watchers.remove(&id);
        let _ = out.send(cancel_msg(id));
    }
}
