//! The range-diff sync: make a peer's copy equal to the source at one
//! revision, writing only what differs.
//!
//! The source subtree at revision S is merge-joined with the peer's copy
//! ([`super::diff`]): a key missing on the peer, with another value,
//! or attached to another lease is put (under the current lease); a key the
//! source lacks is deleted. Writes go out as fenced txns, several in flight;
//! they touch disjoint keys, so their order does not matter. Memory holds
//! two pages per side and the txns in flight, whatever the subtree's size.

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;

use super::batch::STATE_RESERVE_BYTES;
use super::diff::{Diff, Merge};
use super::peer::Peer;
use crate::error::Result;
use crate::etcd::{
    self, KeyValue, PbRequestOp, REQUEST_OVERHEAD_BYTES, TxnBuilder, delete_op, op_encoded_len,
    put_op,
};

/// Syncs the peer to the source; returns the source revision S it reflects.
pub(crate) async fn run(peer: &Peer, lease: i64) -> Result<i64> {
    let mut merge = Merge::start(
        &peer.local,
        &peer.peer,
        peer.prefix.clone(),
        peer.cfg.page_size,
    );
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
    while let Some(diff) = merge.next().await? {
        let (key, op) = match diff {
            Diff::Missing(src) => put(src, lease),
            Diff::Extra(dst) => delete(dst),
            Diff::Both(src, dst) if src.value() != dst.value() || dst.lease() != lease => {
                put(src, lease)
            }
            Diff::Both(..) => continue,
        };
        if etcd::op_put_value(&op).is_some() {
            puts += 1;
        } else {
            deletes += 1;
        }
        let len = op_encoded_len(&op);
        if !builder.is_empty() && (builder.len() >= max_ops || builder.bytes() + len > max_bytes) {
            send_ready(peer, &mut builder, &mut inflight, max_inflight).await?;
        }
        builder.push_key(key, op);
    }
    if !builder.is_empty() {
        send_ready(peer, &mut builder, &mut inflight, max_inflight).await?;
    }
    while let Some(res) = inflight.next().await {
        finish(peer, res).await?;
    }
    // The source's first page, empty or not, always comes back and pins it.
    let revision = merge.source_revision();
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

fn put(src: KeyValue, lease: i64) -> (Bytes, PbRequestOp) {
    let (key, value) = src.into_key_value();
    (key.clone(), put_op(key, value, lease))
}

fn delete(dst: KeyValue) -> (Bytes, PbRequestOp) {
    let (key, _) = dst.into_key_value();
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
