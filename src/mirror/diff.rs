//! The merge-join of this region's subtree at the source with its copy on a
//! peer, shared by the range-diff sync and by `check`.
//!
//! Each side is scanned in pages by its own prefetching task, the source at
//! the revision the caller pins (the sync pins one before it opens its live
//! watch; unpinned, that of the first page), the peer at its current
//! revision. The
//! two sorted key streams are joined in key order; memory holds a few pages
//! per side whatever the subtree's size.
//!
//! **Over a long link** a sequential scan of the peer costs a round trip
//! per page: 10,000 keys per 250 ms is 40k keys/s, below what the peer can
//! take. So when the measured RTT is at least [`LONG_LINK`], the peer's copy
//! is read as [`PEER_SCANS`] scans in flight at once, over consecutive key
//! intervals that a second, independent scan of the (local) source marks
//! out: each of its pages ends an interval, the last runs to the end of the
//! prefix. Any keys would do as bounds; the source's put the intervals
//! about a page apart. (The bounds cannot come from the join's own source
//! scan: with a peer missing many keys the join waits on the peer, which
//! would wait on bounds from a source scan that waits on the join.) The
//! peer's keys come out in order all the same: the intervals tile the
//! prefix and are drained in order. Each interval is read at the peer's
//! revision of its first page; that is safe because the sync writes only
//! keys the join has passed, never in an interval still to be read. On a
//! short link the extra source scan would only cost CPU: the peer is then
//! read by one sequential scan, as before.

use std::cmp::Ordering;

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::etcd::{self, KeyValue, prefix_end};
use crate::store::Store;

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
    _tasks: Vec<AbortOnDrop>,
    s: Option<KeyValue>,
    d: Option<KeyValue>,
    primed: bool,
}

impl Merge {
    pub(crate) fn start(local: &Store, peer: &Store, prefix: Bytes, page_size: usize) -> Merge {
        Merge::start_over(local, peer, prefix, page_size, 0, None, None)
    }

    /// Like [`Merge::start`], with the source read at `source_revision`
    /// (0: its current one).
    pub(crate) fn start_at(
        local: &Store,
        peer: &Store,
        prefix: Bytes,
        page_size: usize,
        source_revision: i64,
    ) -> Merge {
        Merge::start_over(local, peer, prefix, page_size, source_revision, None, None)
    }

    /// Like [`Merge::start_at`] over a link of round trip `rtt` (if
    /// known): from [`LONG_LINK`] on, the peer is read by several scans at
    /// once. With a `seed`, the peer's first page is the seed's.
    pub(crate) fn start_over(
        local: &Store,
        peer: &Store,
        prefix: Bytes,
        page_size: usize,
        source_revision: i64,
        rtt: Option<Duration>,
        seed: Option<Seed>,
    ) -> Merge {
        let (dst, dst_tx) = Prefetch::channel();
        let task = tokio::spawn(read_peer(
            peer.clone(),
            local.clone(),
            prefix.clone(),
            page_size,
            rtt,
            seed,
            dst_tx,
        ));
        Merge {
            src: Prefetch::start(local, prefix, page_size, source_revision),
            dst,
            _tasks: vec![AbortOnDrop(task)],
            s: None,
            d: None,
            primed: false,
        }
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
/// Scans of the peer in flight at once (each over its own key interval,
/// each holding at most [`PREFETCH_PAGES`] pages): a 250 ms link at pages
/// of 10,000 keys then reads 160k keys/s, twice the peer's write ceiling.
pub(crate) const PEER_SCANS: usize = 4;
/// The round trip from which the peer is read by several scans at once.
pub(crate) const LONG_LINK: Duration = Duration::from_millis(10);
/// Keys in the first page of each scan; pages then double up to the page
/// size.
const FIRST_PAGE: usize = 256;

/// The peer's first page, read by someone else: the claim reads it in its
/// own txn, at the claim's revision, so that the sync's first read of the
/// peer costs no round trip of its own (`peer/claim.rs`).
#[derive(Debug)]
pub(crate) struct Seed {
    /// The first keys of the copy, in key order.
    pub(crate) kvs: Vec<KeyValue>,
    /// Keys remain past the last of `kvs`.
    pub(crate) more: bool,
    /// The revision it was read at: a sequential scan reads the rest there.
    pub(crate) revision: i64,
    /// How long the read took: the link's round trip, when no better
    /// measure is known.
    pub(crate) took: Duration,
}

/// A scan running in its own task, yielding keys in order.
struct Prefetch {
    rx: mpsc::Receiver<etcd::Result<Vec<KeyValue>>>,
    page: std::vec::IntoIter<KeyValue>,
    _task: Option<AbortOnDrop>,
}

type PageTx = mpsc::Sender<etcd::Result<Vec<KeyValue>>>;

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Prefetch {
    /// A scan of `prefix` at `revision` (0: the current one) in its own
    /// task.
    fn start(client: &Store, prefix: Bytes, page_size: usize, revision: i64) -> Prefetch {
        let (tx, rx) = mpsc::channel(PREFETCH_PAGES);
        // Small first pages: the writes start after a few ms, not after
        // reading a full page.
        let scan = client
            .scan_prefix(prefix, page_size, revision)
            .ramp_up(FIRST_PAGE);
        let task = tokio::spawn(pump(scan, tx));
        Prefetch {
            rx,
            page: Vec::new().into_iter(),
            _task: Some(AbortOnDrop(task)),
        }
    }

    /// A prefetch fed by someone else through the returned sender.
    fn channel() -> (Prefetch, PageTx) {
        let (tx, rx) = mpsc::channel(PREFETCH_PAGES);
        let p = Prefetch {
            rx,
            page: Vec::new().into_iter(),
            _task: None,
        };
        (p, tx)
    }

    async fn next(&mut self) -> etcd::Result<Option<KeyValue>> {
        loop {
            if let Some(kv) = self.page.next() {
                return Ok(Some(kv));
            }
            match self.rx.recv().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(e),
                Some(Ok(page)) => self.page = page.into_iter(),
            }
        }
    }
}

/// Sends the pages of `scan` to `tx` until it is done or fails.
async fn pump(mut scan: etcd::Scan, tx: PageTx) {
    loop {
        let page = scan.next_page().await;
        let stop = !matches!(page, Ok(Some(_)));
        let msg = match page {
            Ok(Some(p)) => Ok(p.kvs),
            Ok(None) => return,
            Err(e) => Err(e),
        };
        if tx.send(msg).await.is_err() || stop {
            return;
        }
    }
}

/// Sends where each page of `scan` ends (the key just after its last) until
/// the scan is done; a failed scan ends the bounds early, which only makes
/// the last interval longer.
async fn send_bounds(mut scan: etcd::Scan, tx: mpsc::Sender<Bytes>) {
    while let Ok(Some(page)) = scan.next_page().await {
        if let Some(last) = page.kvs.last()
            && tx.send(key_after(last.key())).await.is_err()
        {
            return;
        }
    }
}

/// The smallest key after `key`.
fn key_after(key: &[u8]) -> Bytes {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.extend_from_slice(key);
    k.push(0);
    Bytes::from(k)
}

/// Reads the peer's keys under `prefix`, in order, into `out`, starting
/// with `seed`'s page if there is one. The first page tells how long the
/// link is (unless `rtt` says): on a short one the
/// rest is one sequential scan; on a long one, [`scan_peer`] with the bounds
/// from a second scan of the source.
async fn read_peer(
    peer: Store,
    local: Store,
    prefix: Bytes,
    page_size: usize,
    rtt: Option<Duration>,
    seed: Option<Seed>,
    out: PageTx,
) {
    let end = prefix_end(&prefix);
    // The first page, the key the rest starts at (`None`: there is no
    // rest), whether the link is long, and how a short link's rest is read.
    let (first, rest, long, then) = match seed {
        Some(seed) => {
            let rest = seed
                .more
                .then(|| seed.kvs.last().map(|kv| key_after(kv.key())))
                .flatten();
            let long = rtt.unwrap_or(seed.took) >= LONG_LINK;
            let then = rest
                .clone()
                .map(|from| peer.scan(from, end.clone(), page_size, seed.revision));
            (Ok(seed.kvs), rest, long, then)
        }
        None => {
            let mut scan = peer
                .scan(prefix, end.clone(), page_size, 0)
                .ramp_up(FIRST_PAGE);
            let started = tokio::time::Instant::now();
            let first = scan.next_page().await;
            let long = rtt.unwrap_or_else(|| started.elapsed()) >= LONG_LINK;
            // Whether the first page was the whole range only the scan can
            // tell: a page shorter than its key limit may have met the byte
            // budget.
            let rest = match &first {
                Ok(Some(p)) if !scan.is_done() => p.kvs.last().map(|kv| key_after(kv.key())),
                _ => None,
            };
            match first {
                Ok(Some(p)) => (Ok(p.kvs), rest, long, Some(scan)),
                Ok(None) => return,
                Err(e) => (Err(e), None, long, None),
            }
        }
    };
    let failed = first.is_err();
    if out.send(first).await.is_err() || failed {
        return;
    }
    match (rest, then) {
        (Some(from), _) if long => {
            let (bounds_tx, bounds_rx) = mpsc::channel(PEER_SCANS);
            let bounds = local.scan(from.clone(), end.clone(), page_size, 0);
            let _bounds = AbortOnDrop(tokio::spawn(send_bounds(bounds, bounds_tx)));
            scan_peer(peer, (from, end), page_size, bounds_rx, out).await;
        }
        (Some(_), Some(scan)) => pump(scan, out).await,
        _ => {}
    }
}

/// Reads the peer's keys in `[from, end)`, in order, into `out`: up to
/// [`PEER_SCANS`] scans at once over the intervals that end at `bounds`
/// (the last runs to the end of the prefix once `bounds` closes).
async fn scan_peer(
    peer: Store,
    (from, end): (Bytes, Bytes),
    page_size: usize,
    mut bounds: mpsc::Receiver<Bytes>,
    out: PageTx,
) {
    let mut from = Some(from);
    let mut scans: VecDeque<(mpsc::Receiver<etcd::Result<Vec<KeyValue>>>, AbortOnDrop)> =
        VecDeque::new();
    loop {
        // Start scans while there is room and an interval to scan.
        while scans.len() < PEER_SCANS
            && let Some(start) = from.clone()
        {
            let to = if scans.is_empty() {
                // Nothing else to drain meanwhile: wait for the bound.
                bounds.recv().await
            } else {
                match bounds.try_recv() {
                    Ok(b) => Some(b),
                    Err(mpsc::error::TryRecvError::Empty) => break,
                    Err(mpsc::error::TryRecvError::Disconnected) => None,
                }
            };
            let to = to.unwrap_or_else(|| end.clone());
            from = (to != end).then(|| to.clone());
            let (tx, rx) = mpsc::channel(PREFETCH_PAGES);
            let scan = peer.scan(start, to, page_size, 0);
            scans.push_back((rx, AbortOnDrop(tokio::spawn(pump(scan, tx)))));
        }
        let room = from.is_some() && scans.len() < PEER_SCANS;
        let Some((rx, _)) = scans.front_mut() else {
            return;
        };
        // Drain the oldest interval; while it has nothing ready, another
        // bound may arrive and start the next scan.
        let event = tokio::select! {
            biased;
            msg = rx.recv() => Ok(msg),
            b = bounds.recv(), if room => Err(b),
        };
        match event {
            Ok(Some(page)) => {
                let failed = page.is_err();
                if out.send(page).await.is_err() || failed {
                    return;
                }
            }
            Ok(None) => {
                scans.pop_front();
            }
            Err(b) => {
                let start = from.take().expect("room");
                let to = b.unwrap_or_else(|| end.clone());
                from = (to != end).then(|| to.clone());
                let (tx, rx) = mpsc::channel(PREFETCH_PAGES);
                let scan = peer.scan(start, to, page_size, 0);
                scans.push_back((rx, AbortOnDrop(tokio::spawn(pump(scan, tx)))));
            }
        }
    }
}
