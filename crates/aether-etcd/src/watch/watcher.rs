//! The consumer's side of one watch: the [`Watcher`] stream, its queue
//! bounded in bytes (the stream task's `Sink` end of it), and the fragments
//! of a response being reassembled, which count against the same budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::DropGuard;

use super::types::{Event, WatchResponse};
use crate::error::{Error, Result};
use crate::pb::PbWatchCreateRequest;

/// What one queued response costs beyond its events' encoded size, so that
/// empty progress notices are bounded too.
const RESPONSE_OVERHEAD_BYTES: usize = 64;
/// What one event costs beyond its key-values' encoded size (type, tags).
const EVENT_OVERHEAD_BYTES: usize = 8;

/// Receives one watch's events. Dropping it cancels the watch. It keeps
/// its stream's task alive, so `let (_, watcher) = client.watch(..)?` works.
///
/// A `Watcher` is a [`Stream`](futures_util::Stream) of responses (and
/// with `futures_util::TryStreamExt`, `try_next` is
/// [`Watcher::message`]):
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
    pub(super) id: i64,
    pub(super) rx: mpsc::UnboundedReceiver<Queued>,
    pub(super) buffered: Arc<AtomicUsize>,
    pub(super) cmds: mpsc::UnboundedSender<Cmd>,
    /// The queue said it is closed: the stream has ended.
    pub(super) ended: bool,
    pub(super) _stream: Arc<DropGuard>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("id", &self.id)
            .field("buffered_bytes", &self.buffered.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What the stream's task is asked to do, by [`WatchStream`](super::WatchStream)
/// (create, progress) and by a watcher (cancel, when dropped). Here, with
/// the watcher's end of the queue it hands over, so that the task's code
/// depends on the watcher's and not the other way round.
pub(super) enum Cmd {
    Create {
        id: i64,
        req: PbWatchCreateRequest,
        created_notify: bool,
        sink: Sink,
    },
    /// The watcher is gone: forget it, and tell the server.
    Cancel(i64),
    /// [`Watcher::cancel`]: tell the server, and deliver its answer.
    Close(i64),
    Progress,
}

/// A response waiting for its consumer, holding its share of the
/// watcher's byte budget until the consumer takes it.
pub(super) struct Queued {
    msg: Result<WatchResponse>,
    bytes: usize,
    _permit: Option<OwnedSemaphorePermit>,
}

/// The stream task's end of one watcher's queue.
pub(super) struct Sink {
    pub(super) tx: mpsc::UnboundedSender<Queued>,
    /// Byte permits; `capacity` of them in all.
    pub(super) budget: Arc<Semaphore>,
    pub(super) capacity: usize,
    pub(super) buffered: Arc<AtomicUsize>,
}

impl Sink {
    /// Queues a response once its bytes fit the budget (one larger than
    /// the whole budget waits until the queue is empty). `held` is what its
    /// fragments already hold. False when the consumer is gone.
    pub(super) async fn send(&self, resp: WatchResponse, held: Fragments) -> bool {
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
    pub(super) async fn hold(&self, frag: &mut Fragments, bytes: usize) -> bool {
        let Some(permit) = self.grow(frag.permit.take(), frag.bytes + bytes).await else {
            return false;
        };
        frag.permit = Some(permit);
        frag.bytes += bytes;
        self.buffered.fetch_add(bytes, Ordering::Relaxed);
        true
    }

    /// Gives back what a discarded partial response held.
    pub(super) fn release(&self, frag: Fragments) {
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
    pub(super) fn send_err(&self, err: Error) {
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
pub(super) fn events_bytes(events: &[Event]) -> usize {
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

    /// The next response, waiting for it: `Ok(None)` once the watch has
    /// ended (the stream's task stopped, or after the answer to
    /// [`Watcher::cancel`]). After an error (compaction, a server cancel)
    /// the watcher is finished. The same as
    /// [`StreamExt::next`](futures_util::StreamExt::next) with the
    /// `Option` and `Result` swapped, the way tonic's `Streaming::message`
    /// has it, for `?` in a loop: `while let Some(resp) = watcher.message().await? {..}`.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>> {
        if self.ended {
            return Ok(None);
        }
        match self.rx.recv().await {
            Some(q) => self.take(q).map(Some),
            None => {
                self.ended = true;
                Ok(None)
            }
        }
    }

    /// A response that has already arrived, without waiting; `None` if
    /// nothing is buffered right now (or the watch has ended).
    pub fn next_buffered(&mut self) -> Option<Result<WatchResponse>> {
        let q = self.rx.try_recv().ok()?;
        Some(self.take(q))
    }

    /// Cancels the watch and lets the consumer see it end: the responses
    /// already on their way are still delivered, then the server's answer
    /// (a response with [`WatchResponse::canceled`] set), then the stream
    /// ends. If the stream breaks before the server answers, it ends
    /// without that answer (there is no watch left to cancel). Dropping
    /// the watcher cancels too, without waiting for anything.
    pub fn cancel(&mut self) -> Result<()> {
        self.cmds
            .send(Cmd::Close(self.id))
            .map_err(|_| Error::Closed)
    }

    /// Encoded bytes of the responses queued for this watcher and not yet
    /// taken, plus the fragments of one being reassembled. At most the
    /// budget ([`ClientConfig::watcher_buffer_bytes`]), or one response
    /// when that response alone is larger.
    ///
    /// [`ClientConfig::watcher_buffer_bytes`]: crate::ClientConfig::watcher_buffer_bytes
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
        if this.ended {
            return std::task::Poll::Ready(None);
        }
        let polled = this.rx.poll_recv(cx);
        if let std::task::Poll::Ready(None) = polled {
            this.ended = true;
        }
        polled.map(|q| q.map(|q| this.take(q)))
    }
}

// Once it has said `None` it says so again, without polling the queue: a
// `select!` over several watchers may poll an ended one.
impl futures_util::stream::FusedStream for Watcher {
    fn is_terminated(&self) -> bool {
        self.ended
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.cmds.send(Cmd::Cancel(self.id));
    }
}

/// The fragments of one response received so far, holding their bytes of
/// the watcher's budget (module docs).
#[derive(Default)]
pub(super) struct Fragments {
    pub(super) events: Vec<Event>,
    /// Their bytes, as counted in `Watcher::buffered_bytes`.
    bytes: usize,
    /// Budget taken for them: `bytes`, at most the whole budget.
    permit: Option<OwnedSemaphorePermit>,
}
