//! The range-diff sync: make a peer's copy equal to the source at one
//! revision, writing only what differs.
//!
//! The source subtree at revision S is merge-joined with the peer's copy
//! ([`super::diff`]): a key missing on the peer, with another value,
//! or attached to another lease is put (under the current lease); a key the
//! source lacks is deleted. Writes go out as fenced txns, as many in flight
//! as the peer's adaptive window allows ([`super::pacing`]); they touch
//! disjoint keys, so their order does not matter. Memory holds a few pages
//! per side and the txns in flight (bounded in bytes), whatever the
//! subtree's size.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};

use super::batch::STATE_RESERVE_BYTES;
use super::config::MirrorConfig;
use super::diff::{Diff, Merge};
use super::pacing::Pacer;
use super::stats::unix_ms;
use super::writer::FencedWriter;
use crate::error::Result;
use crate::etcd::{self, Client, Delete, Op, TxnBatcher};

/// Syncs the peer to the source as of revision `at`, which the caller
/// pinned (see `Peer::sync`).
pub(crate) async fn run(
    writer: &FencedWriter,
    local: &Client,
    prefix: Bytes,
    at: i64,
    cfg: &MirrorConfig,
    pacer: &mut Pacer,
) -> Result<()> {
    // The copy will hold everything the source held when the scan began.
    let started_ms = unix_ms();
    let rtt = pacer.min_rtt();
    let mut merge = Merge::start_over(local, &writer.client, prefix, cfg.page_size, at, rtt);
    let lease = writer.lease_id();
    // Room for the fence compare; the state put goes in a txn of its own.
    let mut packer = TxnBatcher::new(writer.limits()).with_reserved(0, STATE_RESERVE_BYTES);
    let mut inflight = InFlight {
        txns: FuturesUnordered::new(),
        bytes: 0,
        pacer,
    };
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
            inflight.send(writer, ops).await?;
        }
    }
    packer.flush();
    while let Some(ops) = packer.pop() {
        inflight.send(writer, ops).await?;
    }
    while let Some(sent) = inflight.txns.next().await {
        inflight.finish(writer, sent).await?;
    }
    // Record completion: from here a successor can resume by watch, and
    // consumers see a complete copy.
    writer.marks.synced.store(true, Relaxed);
    writer
        .marks
        .heartbeat_unix_ms
        .fetch_max(started_ms, Relaxed);
    writer.write(Vec::new(), Some(at)).await?;
    writer.stats.mark_current(started_ms);
    writer.stats.sync_puts.fetch_add(puts, Relaxed);
    writer.stats.sync_deletes.fetch_add(deletes, Relaxed);
    tracing::info!(peer = %writer.region, revision = at, puts, deletes, "sync complete");
    Ok(())
}

/// One txn of the sync in flight, and its outcome.
struct Sent {
    ops: Vec<Op>,
    bytes: usize,
    sent: Instant,
    result: etcd::Result<etcd::TxnResponse>,
}

struct InFlight<'a> {
    txns: FuturesUnordered<BoxFuture<'static, Sent>>,
    bytes: usize,
    pacer: &'a mut Pacer,
}

impl InFlight<'_> {
    /// Sends one txn of `ops` once the window has room. The txns of a sync
    /// touch disjoint keys, so they may commit in any order.
    async fn send(&mut self, writer: &FencedWriter, ops: Vec<Op>) -> Result<()> {
        let bytes: usize = ops.iter().map(Op::encoded_len).sum();
        while !self.pacer.allows(self.txns.len(), self.bytes, bytes) {
            if let Some(sent) = self.txns.next().await {
                self.finish(writer, sent).await?;
            }
        }
        self.pacer.on_send(Instant::now(), self.txns.len());
        let txn = writer.send(ops.clone(), None);
        self.bytes += bytes;
        self.txns.push(Box::pin(async move {
            let (sent, result) = txn.await;
            Sent {
                ops,
                bytes,
                sent,
                result,
            }
        }));
        // Put it on the wire now: a future in the set is first polled when
        // the set is, and the loop above only polls it once the window is
        // full, so the first txns of a sync would wait for the whole
        // window to be packed (about 0.2 s for 64 txns, inflating the
        // measured round trip too). Txns that are already answered are
        // booked here as well.
        while let Some(Some(sent)) = self.txns.next().now_or_never() {
            self.finish(writer, sent).await?;
        }
        Ok(())
    }

    async fn finish(&mut self, writer: &FencedWriter, sent: Sent) -> Result<()> {
        let Sent {
            ops,
            bytes,
            sent,
            result,
        } = sent;
        self.bytes = self.bytes.saturating_sub(bytes);
        let now = Instant::now();
        let ok = result.is_ok();
        let n_ops = ops.len() as u64;
        if let Err(e) = writer.settle(ops, result).await {
            if !ok {
                self.pacer.on_error(now);
                self.pacer.publish(&writer.stats);
            }
            return Err(e);
        }
        if ok && self.pacer.on_ack(now, now - sent, n_ops, bytes as u64) {
            self.pacer.publish(&writer.stats);
        }
        writer.stats.txns.fetch_add(1, Relaxed);
        Ok(())
    }
}
