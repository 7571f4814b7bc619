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
use super::config::MirrorConfig;
use super::diff::{Diff, Merge};
use super::stats::unix_ms;
use super::writer::FencedWriter;
use crate::error::Result;
use crate::etcd::{self, Client, Delete, Op, TxnBatcher};

/// Syncs the peer to the source; returns the source revision S it reflects.
pub(crate) async fn run(
    writer: &FencedWriter,
    local: &Client,
    prefix: Bytes,
    cfg: &MirrorConfig,
) -> Result<i64> {
    // The copy will hold everything the source held when the scan began.
    let started_ms = unix_ms();
    let mut merge = Merge::start(local, &writer.client, prefix, cfg.page_size);
    let lease = writer.lease_id();
    // Room for the fence compare; the state put goes in a txn of its own.
    let mut packer = TxnBatcher::new(writer.limits()).with_reserved(0, STATE_RESERVE_BYTES);
    let max_inflight = cfg.max_inflight.max(1);
    let mut inflight: InFlight = FuturesUnordered::new();
    let (mut puts, mut deletes) = (0u64, 0u64);
    while let Some(diff) = merge.next().await? {
        match diff {
            Diff::Missing(src) => {
                puts += 1;
                let (key, value) = src.into_key_value();
                packer.push(writer.put(key, value));
            }
            Diff::Both(src, dst) if src.value() != dst.value() || dst.lease() != lease => {
                puts += 1;
                let (key, value) = src.into_key_value();
                packer.push(writer.put(key, value));
            }
            Diff::Both(..) => continue,
            Diff::Extra(dst) => {
                deletes += 1;
                packer.push(Delete::key(dst.key().clone()));
            }
        }
        while let Some(ops) = packer.pop() {
            send(writer, ops, &mut inflight, max_inflight).await?;
        }
    }
    packer.flush();
    while let Some(ops) = packer.pop() {
        send(writer, ops, &mut inflight, max_inflight).await?;
    }
    while let Some((ops, res)) = inflight.next().await {
        finish(writer, ops, res).await?;
    }
    // The source's first page, empty or not, always comes back and pins it.
    let revision = merge.source_revision();
    // Record completion: from here a successor can resume by watch, and
    // consumers see a complete copy.
    writer.marks.synced.store(true, Relaxed);
    writer
        .marks
        .heartbeat_unix_ms
        .fetch_max(started_ms, Relaxed);
    writer.write(Vec::new(), Some(revision)).await?;
    writer.stats.mark_current(started_ms);
    writer.stats.sync_puts.fetch_add(puts, Relaxed);
    writer.stats.sync_deletes.fetch_add(deletes, Relaxed);
    tracing::info!(peer = %writer.region, revision, puts, deletes, "sync complete");
    Ok(revision)
}

type Sent = (Vec<Op>, etcd::Result<etcd::TxnResponse>);
type InFlight = FuturesUnordered<BoxFuture<'static, Sent>>;

/// Sends one txn of `ops` once there is room in flight. The txns of a sync
/// touch disjoint keys, so they may commit in any order.
async fn send(
    writer: &FencedWriter,
    ops: Vec<Op>,
    inflight: &mut InFlight,
    max_inflight: usize,
) -> Result<()> {
    while inflight.len() >= max_inflight {
        if let Some((ops, res)) = inflight.next().await {
            finish(writer, ops, res).await?;
        }
    }
    let txn = writer.txn(ops.clone(), None);
    let client = writer.client.clone();
    inflight.push(Box::pin(async move {
        let r = client.txn(txn).await;
        (ops, r)
    }));
    Ok(())
}

async fn finish(
    writer: &FencedWriter,
    ops: Vec<Op>,
    res: etcd::Result<etcd::TxnResponse>,
) -> Result<()> {
    writer.settle(ops, res).await?;
    writer.stats.txns.fetch_add(1, Relaxed);
    Ok(())
}
