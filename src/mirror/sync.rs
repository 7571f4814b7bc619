//! The range-diff sync: make a peer's copy equal to the source at one
//! revision, writing only what differs.
//!
//! The source subtree at revision S is merge-joined with the peer's copy
//! ([`super::diff`]): a key missing on the peer, with another value,
//! or attached to another lease is put (under the current lease); a key the
//! source lacks is deleted. Writes go out as fenced txns, as many in flight
//! as the peer's send pipeline allows ([`super::pipeline`]); they touch
//! disjoint keys, so their order does not matter. Memory holds a few pages
//! per side and the txns in flight (bounded in bytes), whatever the
//! subtree's size.

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;

use super::batch::STATE_RESERVE_BYTES;
use super::config::MirrorConfig;
use super::diff::{Diff, Merge};
use super::pipeline::{Link, Pipeline};
use super::stats::unix_ms;
use super::writer::FencedWriter;
use crate::error::Result;
use crate::etcd::{Client, Delete, Op, TxnBatcher};

/// Syncs the peer to the source as of revision `at`, which the caller
/// pinned (see `Peer::sync`).
pub(crate) async fn run(
    writer: &FencedWriter,
    link: &mut Link,
    local: &Client,
    prefix: Bytes,
    at: i64,
    cfg: &MirrorConfig,
) -> Result<()> {
    // The copy will hold everything the source held when the scan began.
    let started_ms = unix_ms();
    let started = std::time::Instant::now();
    let rtt = link.pacer.min_rtt();
    let mut merge = Merge::start_over(local, &writer.client, prefix, cfg.page_size, at, rtt);
    let lease = writer.lease_id();
    let mut pipeline = Pipeline::new(writer, link);
    // Room for the fence compare; the state put goes in a txn of its own.
    let mut packer = TxnBatcher::new(pipeline.limits()).with_reserved(0, STATE_RESERVE_BYTES);
    let (mut puts, mut deletes) = (0u64, 0u64);
    while let Some(diff) = merge.next().await? {
        let op = match diff {
            Diff::Missing(src) => {
                puts += 1;
                let (key, value) = src.into_key_value();
                writer.put(key, value)
            }
            Diff::Both(src, dst) if src.value() != dst.value() || dst.lease() != lease => {
                puts += 1;
                let (key, value) = src.into_key_value();
                writer.put(key, value)
            }
            Diff::Both(..) => continue,
            Diff::Extra(dst) => {
                deletes += 1;
                Delete::key(dst.key().clone()).into()
            }
        };
        // Limits found lower mid-sync apply to the very next txn.
        if packer.limits() != pipeline.limits() {
            packer.set_limits(pipeline.limits());
        }
        packer.push(op);
        while let Some(ops) = packer.pop() {
            send(&mut pipeline, ops).await?;
        }
    }
    packer.flush();
    while let Some(ops) = packer.pop() {
        send(&mut pipeline, ops).await?;
    }
    while let Some(done) = pipeline.next().await {
        pipeline.settle(done).await?;
    }
    // Record completion: from here a successor can resume by watch, and
    // consumers see a complete copy.
    writer.marks.synced.store(true, Relaxed);
    writer
        .marks
        .heartbeat_unix_ms
        .fetch_max(started_ms, Relaxed);
    writer.write(Vec::new(), Some(at)).await?;
    writer.stats.mark_current(started, started_ms);
    writer.stats.sync_puts.fetch_add(puts, Relaxed);
    writer.stats.sync_deletes.fetch_add(deletes, Relaxed);
    tracing::info!(peer = %writer.region, revision = at, puts, deletes, "sync complete");
    Ok(())
}

/// Sends one txn of `ops` once the window has room. The txns of a sync
/// touch disjoint keys, so they may commit in any order.
async fn send(pipeline: &mut Pipeline<'_, ()>, ops: Vec<Op>) -> Result<()> {
    let bytes: usize = ops.iter().map(Op::encoded_len).sum();
    while !pipeline.has_room(bytes) {
        if let Some(done) = pipeline.next().await {
            pipeline.settle(done).await?;
        }
    }
    pipeline.send(ops, None, ());
    // Put it on the wire now, rather than when the window is full (about
    // 0.2 s for 64 txns at the start of a sync, which also inflated the
    // measured round trip); txns already answered are booked here too.
    while let Some(done) = pipeline.ready() {
        pipeline.settle(done).await?;
    }
    Ok(())
}
