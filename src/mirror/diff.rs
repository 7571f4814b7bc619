//! The merge-join of this region's subtree at the source with its copy on a
//! peer, shared by the range-diff sync and by `check`.
//!
//! Each side is scanned in pages by its own prefetching task, the source at
//! the revision of its first page, the peer at its current revision. The
//! two sorted key streams are joined in key order; memory holds a few pages
//! per side whatever the subtree's size.

use std::cmp::Ordering;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::etcd::{self, Client, KeyValue};

/// One key of the join.
pub(crate) enum Diff {
    /// At the source only.
    Missing(KeyValue),
    /// On the peer only.
    Extra(KeyValue),
    /// On both: (source, peer).
    Both(KeyValue, KeyValue),
}

/// The join of the source's and the peer's keys under one prefix.
pub(crate) struct Merge {
    src: Prefetch,
    dst: Prefetch,
    s: Option<KeyValue>,
    d: Option<KeyValue>,
    primed: bool,
}

impl Merge {
    pub(crate) fn start(local: &Client, peer: &Client, prefix: Bytes, page_size: usize) -> Merge {
        Merge::start_at(local, peer, prefix, page_size, 0)
    }

    /// Like [`Merge::start`], with the source read at `source_revision`
    /// (0: its current one).
    pub(crate) fn start_at(
        local: &Client,
        peer: &Client,
        prefix: Bytes,
        page_size: usize,
        source_revision: i64,
    ) -> Merge {
        Merge {
            src: Prefetch::start(local, prefix.clone(), page_size, source_revision),
            dst: Prefetch::start(peer, prefix, page_size, 0),
            s: None,
            d: None,
            primed: false,
        }
    }

    /// The revision the source is read at (known after the first key, or
    /// once the join is exhausted).
    pub(crate) fn source_revision(&self) -> i64 {
        self.src.revision
    }

    /// The next key in order, or `None` when both sides are exhausted.
    pub(crate) async fn next(&mut self) -> etcd::Result<Option<Diff>> {
        if !self.primed {
            self.s = self.src.next().await?;
            self.d = self.dst.next().await?;
            self.primed = true;
        }
        let order = match (&self.s, &self.d) {
            (None, None) => return Ok(None),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(a), Some(b)) => a.key().cmp(b.key()),
        };
        let diff = match order {
            Ordering::Less => Diff::Missing(take(&mut self.s)),
            Ordering::Greater => Diff::Extra(take(&mut self.d)),
            Ordering::Equal => Diff::Both(take(&mut self.s), take(&mut self.d)),
        };
        if self.s.is_none() {
            self.s = self.src.next().await?;
        }
        if self.d.is_none() {
            self.d = self.dst.next().await?;
        }
        Ok(Some(diff))
    }
}

fn take(kv: &mut Option<KeyValue>) -> KeyValue {
    kv.take().expect("the side compared is present")
}

/// Pages read ahead per side.
const PREFETCH_PAGES: usize = 2;
/// Keys in the first page of each scan; pages then double up to the page
/// size.
const FIRST_PAGE: usize = 256;

/// A scan running in its own task, yielding keys in order.
struct Prefetch {
    rx: mpsc::Receiver<etcd::Result<etcd::Page>>,
    page: std::vec::IntoIter<KeyValue>,
    revision: i64,
    _task: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Prefetch {
    fn start(client: &Client, prefix: Bytes, page_size: usize, revision: i64) -> Prefetch {
        let (tx, rx) = mpsc::channel(PREFETCH_PAGES);
        // Small first pages: the writes start after a few ms, not after
        // reading a full page.
        let mut scan = client
            .scan_prefix(prefix, page_size, revision)
            .ramp_up(FIRST_PAGE);
        let task = tokio::spawn(async move {
            loop {
                let page = scan.next_page().await;
                let stop = !matches!(page, Ok(Some(_)));
                let msg = match page {
                    Ok(Some(p)) => Ok(p),
                    Ok(None) => return,
                    Err(e) => Err(e),
                };
                if tx.send(msg).await.is_err() || stop {
                    return;
                }
            }
        });
        Prefetch {
            rx,
            page: Vec::new().into_iter(),
            revision: 0,
            _task: AbortOnDrop(task),
        }
    }

    async fn next(&mut self) -> etcd::Result<Option<KeyValue>> {
        loop {
            if let Some(kv) = self.page.next() {
                return Ok(Some(kv));
            }
            match self.rx.recv().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(e),
                Some(Ok(page)) => {
                    self.revision = page.revision;
                    self.page = page.kvs.into_iter();
                }
            }
        }
    }
}
