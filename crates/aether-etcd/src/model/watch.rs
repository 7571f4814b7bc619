//! Watches: each a registration that is fed from the store's event log up
//! to its member's applied revision, and a [`Watcher`] that receives what
//! the real client's watcher would.
//!
//! A watcher catching up (a start in the past, or a member released after
//! a hold) gets its backlog in responses of at most [`MAX_REVS_PER_RESPONSE`]
//! revisions, as etcd's catch-up does; one that is caught up gets one
//! response per revision. Every response's revision is the member's
//! applied revision when it was sent, and one revision's events are never
//! split.

use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::Shared;
use super::mvcc::{Store, in_range};
use crate::error::{Error, Result};
use crate::header::Header;
use crate::pb::{PbEvent, PbWatchFilter};
use crate::watch::{Event, WatchOptions, WatchResponse};

/// The most revisions etcd puts in one catch-up response.
pub const MAX_REVS_PER_RESPONSE: usize = 1000;

/// A watch as the model keeps it.
#[derive(Debug)]
pub(super) struct WatchReg {
    pub(super) member: usize,
    key: Bytes,
    end: Bytes,
    prev_kv: bool,
    no_put: bool,
    no_delete: bool,
    /// The next revision to deliver.
    pub(super) next: i64,
    tx: mpsc::UnboundedSender<Result<WatchResponse>>,
}

impl WatchReg {
    pub(super) fn new(
        member: usize,
        opts: &WatchOptions,
        next: i64,
        tx: mpsc::UnboundedSender<Result<WatchResponse>>,
    ) -> WatchReg {
        let o = &opts.0;
        WatchReg {
            member,
            key: o.key.clone(),
            end: o.range_end.clone(),
            prev_kv: o.prev_kv,
            no_put: o.filters.contains(&(PbWatchFilter::Noput as i32)),
            no_delete: o.filters.contains(&(PbWatchFilter::Nodelete as i32)),
            next,
            tx,
        }
    }

    /// Sends what the log has in `[next, upto]`. False when the watcher
    /// is done: its consumer is gone, or its history was compacted.
    /// `header` is the member's, at its applied revision (`upto`).
    pub(super) fn pump(&mut self, store: &Store, header: Header) -> bool {
        let upto = header.revision;
        if self.tx.is_closed() {
            return false;
        }
        if self.next > upto {
            return true;
        }
        if self.next.max(2) <= store.compact_rev {
            let _ = self.tx.send(Err(Error::Compacted {
                compact_revision: Some(store.compact_rev),
            }));
            return false;
        }
        let mut events = Vec::new();
        let mut revs = 0;
        for (rev, changes) in store.changes(self.next, upto) {
            let before = events.len();
            for c in changes {
                if !in_range(c.key(), &self.key, &self.end)
                    || (c.is_put() && self.no_put)
                    || (!c.is_put() && self.no_delete)
                {
                    continue;
                }
                let mut e: PbEvent = c.event.clone();
                // etcd reads the previous value at the revision before,
                // so a compaction past it leaves the event without one.
                if self.prev_kv && *rev > store.compact_rev {
                    e.prev_kv = c.prev.clone();
                }
                events.push(Event::from_pb(e));
            }
            if events.len() > before {
                revs += 1;
                if revs == MAX_REVS_PER_RESPONSE {
                    self.send(header, std::mem::take(&mut events));
                    revs = 0;
                }
            }
        }
        self.next = upto + 1;
        if !events.is_empty() {
            self.send(header, events);
        }
        true
    }

    fn send(&self, header: Header, events: Vec<Event>) {
        let _ = self.tx.send(Ok(WatchResponse::events(header, events)));
    }

    /// A progress notice, for a watcher that is caught up.
    /// `header` as for [`WatchReg::pump`].
    pub(super) fn progress(&self, header: Header) {
        if self.next > header.revision {
            self.send(header, Vec::new());
        }
    }

    /// Ends the watcher with `err`.
    pub(super) fn end(&self, err: Error) {
        let _ = self.tx.send(Err(err));
    }
}

/// A watch on a model member: a `Stream` of what the real client's
/// [`Watcher`](crate::Watcher) yields. It ends after an error (a
/// compaction past its position, a restore) and stops the watch when
/// dropped.
pub struct Watcher {
    pub(super) rx: mpsc::UnboundedReceiver<Result<WatchResponse>>,
    pub(super) id: u64,
    pub(super) member_id: u64,
    pub(super) shared: Weak<Shared>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("id", &self.id)
            .field("member_id", &self.member_id)
            .finish()
    }
}

impl Watcher {
    /// The member the watch is on.
    pub fn member_id(&self) -> u64 {
        self.member_id
    }

    /// Asks for a progress notice: a response without events at the
    /// member's applied revision, sent if the watcher is caught up (as
    /// etcd 3.5 does; etcd 3.4 broadcasts it).
    pub fn request_progress(&self) -> Result<()> {
        let shared = self.shared.upgrade().ok_or(Error::Closed)?;
        let st = shared.lock();
        let Some(reg) = st.watchers.get(&self.id) else {
            return Err(Error::Closed);
        };
        reg.progress(st.header(reg.member, st.applied(reg.member)));
        Ok(())
    }

    /// The next response, waiting for it: `Ok(None)` once the watch has
    /// ended; as [`crate::Watcher::message`].
    pub async fn message(&mut self) -> Result<Option<WatchResponse>> {
        self.rx.recv().await.transpose()
    }

    /// The next response already waiting, without waiting; as
    /// [`crate::Watcher::next_buffered`].
    pub fn next_buffered(&mut self) -> Option<Result<WatchResponse>> {
        self.rx.try_recv().ok()
    }
}

impl futures_util::Stream for Watcher {
    type Item = Result<WatchResponse>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.lock().watchers.remove(&self.id);
        }
    }
}
