//! The verification pass (anti-entropy): compare a peer's copy with the
//! source at a pinned revision and repair what differs.
//!
//! Identity checks catch a store that was wiped or restored while the
//! engine watched; this pass catches what they cannot: a restore whose
//! revision had climbed past the old one before the engine looked, a manual
//! edit on the peer, a bug. It merge-joins the source at revision `S` (the
//! live stream's watermark: everything through `S` is applied on the peer)
//! with the peer's copy as it is now, and for each difference:
//!
//! - skips a key the source changed after `S`: the live stream owns it, and
//!   a later pass sees it settled;
//! - otherwise writes the source's value (or deletes the key) through the
//!   fenced writer, guarded on the peer key's mod revision as read, so that
//!   a live write landing in between wins.
//!
//! It reads at most `verify_rate` keys per second, so it never starves the
//! peer's own writers, and counts its runs and repairs.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;

use super::config::MirrorConfig;
use super::diff::{Diff, Merge};
use super::writer::FencedWriter;
use crate::error::Result;
use crate::etcd::{Client, Compare, CompareOp, Delete, KeyValue, Op, Range};

/// What one pass found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Report {
    /// Keys compared.
    pub compared: u64,
    /// Keys written or deleted on the peer.
    pub repaired: u64,
    /// Differences left to the live stream (changed at the source since
    /// the pinned revision, or written on the peer meanwhile).
    pub skipped: u64,
}

/// Keys between two pauses of the pacing.
const PACE_STEP: u64 = 100;
/// Keys per page: small, so the pass holds little memory and the source's
/// pinned revision is read in short requests.
const PAGE: usize = 1_000;

/// One pass over the peer's copy against the source at `pinned`.
pub(crate) async fn pass(
    writer: &FencedWriter,
    local: &Client,
    prefix: Bytes,
    cfg: &MirrorConfig,
    pinned: i64,
) -> Result<Report> {
    let mut merge = Merge::start_at(
        local,
        &writer.client,
        prefix,
        cfg.page_size.min(PAGE),
        pinned,
    );
    let lease = writer.lease_id();
    let pause = Duration::from_secs_f64(PACE_STEP as f64 / f64::from(cfg.verify_rate.max(1)));
    let mut report = Report::default();
    while let Some(diff) = merge.next().await? {
        report.compared += 1;
        if report.compared % PACE_STEP == 0 {
            tokio::time::sleep(pause).await;
        }
        let (peer_kv, want) = match diff {
            Diff::Missing(src) => (None, Some(src)),
            Diff::Extra(dst) => (Some(dst), None),
            Diff::Both(src, dst) if src.value() != dst.value() || dst.lease() != lease => {
                (Some(dst), Some(src))
            }
            Diff::Both(..) => continue,
        };
        let key = want
            .as_ref()
            .or(peer_kv.as_ref())
            .map(|kv| kv.key().clone())
            .unwrap_or_default();
        if !settled(local, &key, want.as_ref()).await? {
            report.skipped += 1;
            continue;
        }
        let guard = match &peer_kv {
            Some(p) => Compare::mod_revision(key.clone(), CompareOp::Equal, p.mod_revision()),
            None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
        };
        let op: Op = match want {
            Some(w) => {
                let (k, v) = w.into_key_value();
                writer.put(k, v)
            }
            None => Delete::key(key.clone()).into(),
        };
        let resp = writer
            .client
            .txn(writer.txn(vec![op], None).when([guard]))
            .await
            .map_err(|e| writer.txn_error(e))?;
        if resp.succeeded {
            report.repaired += 1;
            tracing::warn!(
                peer = %writer.region,
                key = %String::from_utf8_lossy(&key),
                "verification repaired a key that differed from the source"
            );
        } else if writer.fence_holds(&resp) {
            // The live stream wrote the key meanwhile: it wins.
            report.skipped += 1;
        } else {
            return Err(writer.fence_failure(&resp));
        }
    }
    writer.stats.verify_runs.fetch_add(1, Relaxed);
    writer
        .stats
        .verify_repairs
        .fetch_add(report.repaired, Relaxed);
    tracing::info!(peer = %writer.region, pinned, compared = report.compared, repaired = report.repaired, skipped = report.skipped, "verification pass done");
    Ok(report)
}

/// Whether the source's `key` is now as it was at the pinned revision
/// (`at_pin`, `None`: absent), so the peer must equal it.
async fn settled(local: &Client, key: &Bytes, at_pin: Option<&KeyValue>) -> Result<bool> {
    let now = local.range(Range::key(key.clone())).await?;
    Ok(match (at_pin, now.kvs().first()) {
        (Some(pin), Some(cur)) => cur.mod_revision() == pin.mod_revision(),
        (None, None) => true,
        _ => false,
    })
}
