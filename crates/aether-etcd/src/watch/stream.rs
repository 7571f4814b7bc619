//! The handles: [`WatchStream`] (one gRPC stream and its task, where
//! watchers are added) and the crate's `WatchClient` that opens them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::DropGuard;

use super::actor::run;
use super::options::WatchOptions;
use super::watcher::{Cmd, Sink, Watcher};
use crate::error::{Error, Result};
use crate::task::spawn_until_dropped;
use crate::transport::Transport;

/// A handle to one watch stream and its task; cheap to clone. The task
/// stops when every handle and every watcher is gone; it holds the client's
/// connections, not the client.
#[derive(Clone)]
pub struct WatchStream {
    next_id: Arc<AtomicI64>,
    cmds: mpsc::UnboundedSender<Cmd>,
    connected: Arc<AtomicBool>,
    reconnects: Arc<AtomicU64>,
    member: Arc<AtomicU64>,
    buffer_bytes: usize,
    _guard: Arc<DropGuard>,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("connected", &self.connected.load(Ordering::Relaxed))
            .field("reconnects", &self.reconnects.load(Ordering::Relaxed))
            .field("buffer_bytes", &self.buffer_bytes)
            .finish_non_exhaustive()
    }
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
        let member = Arc::new(AtomicU64::new(0));
        let (t, c, r, m) = (
            self.transport.clone(),
            connected.clone(),
            reconnects.clone(),
            member.clone(),
        );
        let guard = spawn_until_dropped(|cancel| run(t, rx, cancel, c, r, m));
        WatchStream {
            next_id: Arc::new(AtomicI64::new(1)),
            cmds: tx,
            connected,
            reconnects,
            member,
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
        let WatchOptions(mut req, created_notify) = opts;
        req.watch_id = id;
        self.cmds
            .send(Cmd::Create {
                id,
                req,
                created_notify,
                sink,
            })
            .map_err(|_| Error::Closed)?;
        Ok(Watcher {
            id,
            rx,
            buffered,
            cmds: self.cmds.clone(),
            ended: false,
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

    /// The member that sent the stream's latest response, from its header:
    /// `None` before the first and while the stream reconnects. With
    /// [`WatchStream::reconnects`] unchanged, a unary read served by this
    /// member saw the store this stream's watchers are fed from.
    pub fn member_id(&self) -> Option<u64> {
        Some(self.member.load(Ordering::Relaxed)).filter(|&m| m != 0)
    }

    /// Asks the server for a progress notice. etcd 3.4 broadcasts it to
    /// every watcher on the stream with the current store revision.
    pub fn request_progress(&self) -> Result<()> {
        self.cmds.send(Cmd::Progress).map_err(|_| Error::Closed)
    }
}
