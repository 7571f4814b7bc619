//! The range-diff sync: make a peer's copy equal to the source at one
//! revision, writing only what differs.
//!
//! The source subtree is read at revision S and the peer's copy at its
//! current revision, both in pages, by two prefetching tasks. The sorted
//! streams are merge-joined: a key missing on the peer, with another value,
//! or attached to another lease is put (under the current lease); a key the
//! source lacks is deleted. Writes go out as fenced txns, several in flight;
//! they touch disjoint keys, so their order does not matter. Memory holds
//! two pages per side and the txns in flight, whatever the subtree's size.

use std::cmp::Ordering;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;

use super::batch::STATE_RESERVE_BYTES;
use super::peer::Peer;
use crate::error::Result;
use crate::etcd::{
    self, Client, KeyValue, PbRequestOp, REQUEST_OVERHEAD_BYTES, TxnBuilder, delete_op,
    op_encoded_len, put_op,
};

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
    fn start(client: &Client, prefix: Bytes, page_size: usize) -> Prefetch {
        let (tx, rx) = mpsc::channel(PREFETCH_PAGES);
        // Small first pages: the writes start after a few ms, not after
        // reading a full page.
        let mut scan = client.scan_prefix(prefix, page_size, 0).ramp_up(FIRST_PAGE);
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

/// Syncs the peer to the source; returns the source revision S it reflects.
pub(crate) async fn run(peer: &Peer, lease: i64) -> Result<i64> {
    let page_size = peer.cfg.page_size;
    let mut src = Prefetch::start(&peer.local, peer.prefix.clone(), page_size);
    let mut dst = Prefetch::start(&peer.peer, peer.prefix.clone(), page_size);
    let max_ops = peer.cfg.limits.max_ops.max(1);
    let max_bytes = peer
        .cfg
        .limits
        .max_bytes
        .saturating_sub(REQUEST_OVERHEAD_BYTES + STATE_RESERVE_BYTES);
    let max_inflight = peer.cfg.max_inflight.max(1);

    let mut builder = TxnBuilder::default();
    let mut inflight: InFlight = FuturesUnordered::new();
    let (mut puts, mut deletes) = (0u64, 0u64);
    let mut s = src.next().await?;
    let mut d = dst.next().await?;
    loop {
        let op = match (&s, &d) {
            (None, None) => break,
            (Some(a), Some(b)) => match a.key().cmp(b.key()) {
                Ordering::Less => Some(take_put(&mut s, lease)),
                Ordering::Greater => Some(take_delete(&mut d)),
                Ordering::Equal => {
                    let same = a.value() == b.value() && b.lease() == lease;
                    let op = (!same).then(|| take_put(&mut s, lease));
                    s = None;
                    d = None;
                    op
                }
            },
            (Some(_), None) => Some(take_put(&mut s, lease)),
            (None, Some(_)) => Some(take_delete(&mut d)),
        };
        if let Some((key, op)) = op {
            if etcd::op_put_value(&op).is_some() {
                puts += 1;
            } else {
                deletes += 1;
            }
            let len = op_encoded_len(&op);
            if !builder.is_empty()
                && (builder.len() >= max_ops || builder.bytes() + len > max_bytes)
            {
                send_ready(peer, &mut builder, &mut inflight, max_inflight).await?;
            }
            builder.push_key(key, op);
        }
        if s.is_none() {
            s = src.next().await?;
        }
        if d.is_none() {
            d = dst.next().await?;
        }
    }
    if !builder.is_empty() {
        send_ready(peer, &mut builder, &mut inflight, max_inflight).await?;
    }
    while let Some(res) = inflight.next().await {
        finish(peer, res).await?;
    }
    let revision = match src.revision {
        0 => scan_revision(&peer.local, &peer.prefix).await?,
        rev => rev,
    };
    // Record completion: from here a successor can resume by watch.
    let resp = peer
        .peer
        .txn(peer.txn(Vec::new(), Some(revision)))
        .await
        .map_err(|e| peer.txn_error(e))?;
    if !resp.succeeded {
        return Err(peer.fence_failure(&resp));
    }
    peer.stats.sync_puts.fetch_add(puts, Relaxed);
    peer.stats.sync_deletes.fetch_add(deletes, Relaxed);
    tracing::info!(peer = %peer.region, revision, puts, deletes, "sync complete");
    Ok(revision)
}

/// The revision an empty source scan read at (an empty subtree yields no
/// page revision, so ask for one).
async fn scan_revision(local: &Client, prefix: &Bytes) -> Result<i64> {
    Ok(local
        .range(etcd::Range::key(prefix.clone()).count_only())
        .await?
        .header
        .revision)
}

fn take_put(s: &mut Option<KeyValue>, lease: i64) -> (Bytes, PbRequestOp) {
    let (key, value) = s.take().expect("source key present").into_key_value();
    (key.clone(), put_op(key, value, lease))
}

fn take_delete(d: &mut Option<KeyValue>) -> (Bytes, PbRequestOp) {
    let (key, _) = d.take().expect("peer key present").into_key_value();
    (key.clone(), delete_op(key, Bytes::new()))
}

type Sent = (Vec<PbRequestOp>, etcd::Result<etcd::TxnResponse>);
type InFlight = FuturesUnordered<BoxFuture<'static, Sent>>;

async fn send_ready(
    peer: &Peer,
    builder: &mut TxnBuilder,
    inflight: &mut InFlight,
    max_inflight: usize,
) -> Result<()> {
    while inflight.len() >= max_inflight {
        if let Some(res) = inflight.next().await {
            finish(peer, res).await?;
        }
    }
    let ops = builder.take();
    let txn = peer.txn(ops.clone(), None);
    let client = peer.peer.clone();
    inflight.push(Box::pin(async move {
        let r = client.txn(txn).await;
        (ops, r)
    }));
    Ok(())
}

async fn finish(peer: &Peer, (ops, res): Sent) -> Result<()> {
    match res {
        Ok(resp) if resp.succeeded => {
            peer.stats.txns.fetch_add(1, Relaxed);
            Ok(())
        }
        Ok(resp) => Err(peer.fence_failure(&resp)),
        Err(etcd::Error::RequestTooLarge) => peer.apply_one_by_one(ops).await,
        Err(e) => Err(peer.txn_error(e)),
    }
}
