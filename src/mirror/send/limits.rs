//! The peer's txn limits, discovered: what `--max-txn-ops` and
//! `--max-request-bytes` the peer's etcd really runs with.
//!
//! The engine starts from the configured limits (etcd's defaults unless
//! told otherwise). A peer run with lower ones refuses a txn that is too
//! big: "too many operations in txn request" or "request is too large".
//!
//! # A refusal starts a search, not a halving
//! A refusal says only that *that* txn was too big, and with a window of
//! txns in flight every one of them packed at the old size is refused too.
//! Halving the limit on each refusal therefore ratcheted a peer at 16 ops
//! down to 2 within one sync (27× slower). Here a refusal of a txn no larger
//! than the current limit starts a binary search between the largest size
//! the peer is known to take and the refused one, with *probe txns that
//! write nothing*:
//! - ops: a read-only txn of `n` compares on the state key. etcd checks
//!   the compare count against the same `--max-txn-ops` as each branch,
//!   before it reads anything, and a read-only txn never reaches raft.
//!   The search is exact.
//! - bytes: a put of the state key padded to the size tried, guarded by a
//!   compare that never holds. etcd checks the size before it applies the
//!   request, so nothing is written either way. The search stops within
//!   [`BYTES_PRECISION`].
//!
//! A refusal of a txn larger than the current limit (packed before the
//! limit came down) changes nothing: it is re-sent in pieces of the
//! current size.
//!
//! # What the limits mean
//! - `max_ops`: the most ops in one branch, exactly the peer's
//!   `--max-txn-ops`. A live txn carries the state put, so it holds one data
//!   op fewer ([`crate::mirror::live::batch`] reserves the slot); a sync txn uses them all.
//! - `max_bytes`: the largest encoded txn request the peer takes. etcd
//!   checks `--max-request-bytes` against the txn wrapped in its raft
//!   header (a few dozen bytes), so this is that flag less the header and
//!   the search's precision. The packers keep a further
//!   [`crate::etcd::REQUEST_OVERHEAD_BYTES`] free.
//!
//! # Back up
//! While a limit is below the configured one, the configured limits are
//! probed again every `limit_reprobe` ([`crate::mirror::MirrorConfig`], a minute
//! by default) by the live loop, beside its freshness probe; a peer that
//! takes them gets them back.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tokio::time::Instant;

use bytes::Bytes;

use crate::etcd::{self, Compare, CompareOp, Put, Txn, TxnLimits};
use crate::mirror::stats::PeerStats;
use crate::store::Store;

/// How close to the peer's byte limit the search gets.
pub(crate) const BYTES_PRECISION: usize = 64;
/// The fewest ops a mirror txn needs: one write and the state put.
pub(crate) const MIN_OPS: usize = 2;
/// The smallest byte limit the engine works with.
pub(crate) const MIN_BYTES: usize = 4096;

/// What a peer refused a txn for, with the txn's size in that dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// "too many operations": the txn's largest branch had this many ops.
    Ops(usize),
    /// "request is too large": the txn's encoded size.
    Bytes(usize),
}

/// The txn limits of one peer as discovered so far. It outlives sessions:
/// what was learnt holds until the peer says otherwise.
#[derive(Debug)]
pub(crate) struct Limits {
    configured: TxnLimits,
    current: TxnLimits,
    /// The largest branch and request the peer took since the limit was
    /// last found wrong: where a search starts from.
    ok_ops: usize,
    ok_bytes: usize,
    /// When the limits were last lowered or probed back up.
    checked: Instant,
    reprobe_every: Duration,
}

impl Limits {
    pub(crate) fn new(configured: TxnLimits, reprobe_every: Duration) -> Limits {
        Limits {
            configured,
            current: configured,
            ok_ops: 0,
            ok_bytes: 0,
            checked: Instant::now(),
            reprobe_every,
        }
    }

    /// The limits to pack for now.
    pub(crate) fn current(&self) -> TxnLimits {
        self.current
    }

    /// Reports the limits in the peer's stats.
    pub(crate) fn publish(&self, stats: &PeerStats) {
        stats
            .txn_ops_limit
            .store(self.current.max_ops as u64, Relaxed);
        stats
            .request_bytes_limit
            .store(self.current.max_bytes as u64, Relaxed);
    }

    /// Books a txn of `ops` ops (largest branch) and `bytes` bytes that the
    /// peer took.
    pub(crate) fn accepted(&mut self, ops: usize, bytes: usize) {
        self.ok_ops = self.ok_ops.max(ops);
        self.ok_bytes = self.ok_bytes.max(bytes);
    }

    /// Books a refusal. When the refused txn was within the current limit,
    /// searches for the peer's real one with probes (a few round trips);
    /// returns whether the limits changed.
    pub(crate) async fn refused(&mut self, refusal: Refusal, probe: &Prober) -> etcd::Result<bool> {
        let before = self.current;
        match refusal {
            Refusal::Ops(n) if n <= self.current.max_ops => {
                // Taken once, refused now: the peer's limit went down.
                let lo = if self.ok_ops >= n { 1 } else { self.ok_ops };
                let found = search(lo.max(1), n, 1, |k| probe.ops(k)).await?;
                self.current.max_ops = found.max(MIN_OPS);
                self.ok_ops = found;
            }
            Refusal::Bytes(b) if b <= self.current.max_bytes => {
                let lo = if self.ok_bytes >= b { 0 } else { self.ok_bytes };
                let floor = probe.bytes_floor();
                let found = search(lo.max(floor), b, BYTES_PRECISION, |k| probe.bytes(k)).await?;
                self.current.max_bytes = found.max(MIN_BYTES);
                self.ok_bytes = found;
            }
            _ => return Ok(false),
        }
        self.checked = Instant::now();
        Ok(self.current != before)
    }

    /// Whether limits below the configured ones are due to be probed again.
    pub(crate) fn reprobe_due(&self, now: Instant) -> bool {
        self.current != self.configured && now.duration_since(self.checked) >= self.reprobe_every
    }

    /// The configured limits, probed: a future of the limits the peer
    /// takes back (`Ok(None)`: none), to apply with [`Limits::reprobed`].
    /// Starts a new interval whatever the outcome.
    pub(crate) fn reprobe(
        &mut self,
        now: Instant,
        probe: Prober,
    ) -> impl Future<Output = ProbeResult> + Send + 'static {
        self.checked = now;
        let (current, configured) = (self.current, self.configured);
        async move {
            let mut up = current;
            if current.max_ops < configured.max_ops && probe.ops(configured.max_ops).await? {
                up.max_ops = configured.max_ops;
            }
            if current.max_bytes < configured.max_bytes && probe.bytes(configured.max_bytes).await?
            {
                up.max_bytes = configured.max_bytes;
            }
            Ok((up != current).then_some(up))
        }
    }

    /// Applies what [`Limits::reprobe`] found.
    pub(crate) fn reprobed(&mut self, up: Option<TxnLimits>) {
        if let Some(up) = up {
            self.current = up;
        }
    }
}

/// What a re-probe found: the limits the peer takes back, if any.
pub(crate) type ProbeResult = etcd::Result<Option<TxnLimits>>;

/// The largest size in `[lo, hi)` that `takes` accepts, to within `precision`,
/// given that `lo` is taken (or is the floor) and `hi` is refused.
async fn search<F, Fut>(
    mut lo: usize,
    mut hi: usize,
    precision: usize,
    takes: F,
) -> etcd::Result<usize>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = etcd::Result<bool>>,
{
    while hi > lo + precision.max(1) {
        let mid = lo + (hi - lo) / 2;
        if takes(mid).await? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// Sends the probe txns of a search, on the state key.
#[derive(Clone)]
pub(crate) struct Prober {
    client: Store,
    key: Bytes,
}

impl Prober {
    pub(crate) fn new(client: Store, key: Bytes) -> Prober {
        Prober { client, key }
    }

    /// Whether the peer takes a branch of `n` ops: a read-only txn of `n`
    /// compares (always true, never read for anything).
    pub(crate) async fn ops(&self, n: usize) -> etcd::Result<bool> {
        let compares = (0..n).map(|_| Compare::version(self.key.clone(), CompareOp::NotEqual, -1));
        accepted(self.client.txn(Txn::new().when(compares)).await)
    }

    /// The size of the smallest bytes probe.
    fn bytes_floor(&self) -> usize {
        self.padded(0).encoded_len()
    }

    /// A txn putting the state key padded to `pad` bytes, guarded by a
    /// compare that never holds (no version is below 0): never applied.
    fn padded(&self, pad: usize) -> Txn {
        Txn::new()
            .when([Compare::version(self.key.clone(), CompareOp::Less, 0)])
            .and_then([Put::new(self.key.clone(), vec![0u8; pad])])
    }

    /// Whether the peer takes a txn request of `size` encoded bytes.
    pub(crate) async fn bytes(&self, size: usize) -> etcd::Result<bool> {
        let base = self.bytes_floor();
        let mut pad = size.saturating_sub(base);
        // The value's length prefix grows with it: settle on the pad that
        // makes the request `size` bytes (or just under).
        for _ in 0..3 {
            let len = self.padded(pad).encoded_len();
            if len == size {
                break;
            }
            pad = (pad + size).saturating_sub(len);
        }
        accepted(self.client.txn(self.padded(pad)).await)
    }
}

/// A probe's answer: taken (whatever its compares said), refused for its
/// size, or another error.
fn accepted(result: etcd::Result<etcd::TxnResponse>) -> etcd::Result<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(etcd::Error::TooManyOps | etcd::Error::RequestTooLarge) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn found(limit: usize, lo: usize, hi: usize, precision: usize) -> (usize, usize) {
        let probes = std::cell::Cell::new(0);
        let got = search(lo, hi, precision, |k| {
            probes.set(probes.get() + 1);
            std::future::ready(Ok(k <= limit))
        })
        .await
        .unwrap();
        (got, probes.get())
    }

    #[tokio::test]
    async fn the_search_finds_the_exact_op_limit_in_log_steps() {
        for limit in [2, 15, 16, 17, 64, 127] {
            let (got, probes) = found(limit, 1, 128, 1).await;
            assert_eq!(got, limit);
            assert!(probes <= 7, "{probes} probes for {limit}");
        }
    }

    #[tokio::test]
    async fn the_byte_search_stops_within_its_precision() {
        let limit = 262_144 - 40;
        let (got, probes) = found(limit, 100, 1_600_000, BYTES_PRECISION).await;
        assert!(got <= limit && limit - got <= BYTES_PRECISION, "{got}");
        assert!(probes <= 15, "{probes}");
    }

    #[tokio::test]
    async fn a_refusal_above_the_current_limit_is_a_leftover() {
        let mut l = Limits::new(TxnLimits::default(), Duration::from_secs(60));
        l.current.max_ops = 16;
        // The client points nowhere: were a probe sent, the call would
        // fail. A txn packed before the limit came down changes nothing.
        let probe = Prober::new(
            etcd::Client::connect(etcd::ClientConfig::new(["http://127.0.0.1:9"]))
                .unwrap()
                .into(),
            Bytes::from_static(b"/s"),
        );
        assert!(!l.refused(Refusal::Ops(128), &probe).await.unwrap());
        assert_eq!(l.current().max_ops, 16);
        l.current.max_bytes = 100_000;
        assert!(!l.refused(Refusal::Bytes(300_000), &probe).await.unwrap());
        assert_eq!(l.current().max_bytes, 100_000);
    }
}
