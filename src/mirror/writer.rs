//! The fenced writer: everything one txn to a peer needs, as one value.
//!
//! Both the range-diff sync ([`super::sync`]) and the live loop
//! ([`super::peer`]) write through it. It holds the peer's client, its
//! state key, the fence (the state key's create revision at this engine's
//! claim), the mirror lease and the stats; it builds the fenced txn, tells
//! a fence failure from a lost lease, and falls back to one op per txn when
//! the peer refuses a batch as too large.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use bytes::Bytes;

use super::state::{self, State, Stored};
use super::stats::{ErrorKind, PeerStats};
use crate::error::{Error, Result};
use crate::etcd::{
    self, Client, Delete, Header, LeaseHandle, Op, OpResponse, Put, Range, Txn, TxnLimits,
    TxnResponse,
};

/// Writes to one peer under this engine's claim.
pub(crate) struct FencedWriter {
    /// The peer's region name, for errors and logs.
    pub(crate) region: String,
    /// The peer's etcd.
    pub(crate) client: Client,
    /// `<state_root><origin>/state` on the peer.
    pub(crate) state_key: Bytes,
    /// The engine incarnation.
    pub(crate) holder: u64,
    pub(crate) stats: Arc<PeerStats>,
    /// The state key's create revision at this engine's claim; 0 unclaimed.
    pub(crate) fence: i64,
    /// The mirror lease, kept alive while this value holds it.
    pub(crate) lease: Option<LeaseHandle>,
    /// What goes into the state key besides the revision.
    pub(crate) marks: Marks,
    /// The peer's txn limits as discovered: they start at the configured
    /// ones and shrink when the peer refuses a txn for its size.
    limits: Mutex<TxnLimits>,
    /// The peer's identity as this engine knows it: its cluster id and the
    /// highest revision a txn of ours committed at.
    peer_cluster: AtomicU64,
    peer_revision: AtomicI64,
}

/// The state key's identity and freshness fields, shared by every txn of
/// the session.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    /// The source etcd's cluster id.
    pub(crate) source_cluster: AtomicU64,
    /// When the peer was last known current, Unix ms.
    pub(crate) heartbeat_unix_ms: AtomicI64,
    /// A complete copy is on the peer under this lease.
    pub(crate) synced: AtomicBool,
}

impl FencedWriter {
    pub(crate) fn new(
        region: String,
        client: Client,
        state_key: Bytes,
        holder: u64,
        stats: Arc<PeerStats>,
        limits: TxnLimits,
    ) -> FencedWriter {
        stats.txn_ops_limit.store(limits.max_ops as u64, Relaxed);
        stats
            .request_bytes_limit
            .store(limits.max_bytes as u64, Relaxed);
        FencedWriter {
            region,
            client,
            state_key,
            holder,
            stats,
            fence: 0,
            lease: None,
            marks: Marks::default(),
            limits: Mutex::new(limits),
            peer_cluster: AtomicU64::new(0),
            peer_revision: AtomicI64::new(0),
        }
    }

    /// The mirror lease id, 0 when none is held.
    pub(crate) fn lease_id(&self) -> i64 {
        self.lease.as_ref().map_or(0, LeaseHandle::id)
    }

    /// Whether the lease is held and not reported lost.
    pub(crate) fn lease_alive(&self) -> bool {
        self.lease.as_ref().is_some_and(|l| !l.status().lost)
    }

    /// Forgets the claim and the lease (its keep-alive stops; it is never
    /// revoked).
    pub(crate) fn drop_lease(&mut self) {
        self.lease = None;
        self.fence = 0;
        self.marks.synced.store(false, Relaxed);
        self.stats.set_lease(0, None);
    }

    /// The peer's txn limits as known now.
    pub(crate) fn limits(&self) -> TxnLimits {
        *self.limits.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shrink_limits(&self, f: impl FnOnce(&mut TxnLimits)) -> TxnLimits {
        let mut l = self.limits.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut l);
        l.max_ops = l.max_ops.max(2);
        l.max_bytes = l.max_bytes.max(4096);
        self.stats.txn_ops_limit.store(l.max_ops as u64, Relaxed);
        self.stats
            .request_bytes_limit
            .store(l.max_bytes as u64, Relaxed);
        *l
    }

    /// A put under the mirror lease.
    pub(crate) fn put(&self, key: Bytes, value: Bytes) -> Op {
        Put::new(key, value).lease(self.lease_id()).into()
    }

    /// The state key's value recording `revision`.
    pub(crate) fn state(&self, revision: i64) -> State {
        State {
            revision,
            lease: self.lease_id(),
            holder: self.holder,
            source_cluster: self.marks.source_cluster.load(Relaxed),
            heartbeat_unix_ms: self.marks.heartbeat_unix_ms.load(Relaxed),
            synced: self.marks.synced.load(Relaxed),
        }
    }

    /// A mirror txn: the fence guard, `ops`, and optionally the state put
    /// recording `state_revision`; on failure it reads the state key back so
    /// the caller can tell why.
    pub(crate) fn txn(&self, ops: Vec<Op>, state_revision: Option<i64>) -> Txn {
        let txn = Txn::new()
            .when([state::fence(&self.state_key, self.fence)])
            .and_then(ops)
            .or_else([Range::key(self.state_key.clone())]);
        match state_revision {
            Some(revision) => {
                txn.and_then([
                    Put::new(self.state_key.clone(), self.state(revision).encode())
                        .lease(self.lease_id()),
                ])
            }
            None => txn,
        }
    }

    /// A fenced txn of `ops` (see [`FencedWriter::txn`]) on its way, for a
    /// window of txns in flight: it resolves to when it was sent and what
    /// the peer answered, to be booked by [`FencedWriter::settle`].
    pub(crate) fn send(
        &self,
        ops: Vec<Op>,
        state_revision: Option<i64>,
    ) -> impl Future<Output = (Instant, etcd::Result<etcd::TxnResponse>)> + Send + 'static {
        let txn = self.txn(ops, state_revision);
        let client = self.client.clone();
        let sent = Instant::now();
        async move { (sent, client.txn(txn).await) }
    }

    /// Sends a fenced txn of `ops` and books its outcome (see
    /// [`FencedWriter::settle`]).
    pub(crate) async fn write(&self, ops: Vec<Op>, state_revision: Option<i64>) -> Result<()> {
        let result = self.client.txn(self.txn(ops.clone(), state_revision)).await;
        self.settle(ops, result).await
    }

    /// Books the outcome of a fenced txn of `ops`. A failed compare is a
    /// fence or lease error. A txn the peer refuses for its size is split
    /// and sent again, and the peer's limit is lowered for what follows:
    /// "too many operations" halves the op limit, "request too large"
    /// halves the txn; a single value too large for the peer is deleted
    /// there (never left at an older value), logged with its key and
    /// counted. A peer out of space is an error of its own.
    pub(crate) async fn settle(
        &self,
        ops: Vec<Op>,
        result: etcd::Result<TxnResponse>,
    ) -> Result<()> {
        let mut queue: VecDeque<Vec<Op>> = VecDeque::new();
        let mut result = Some((ops, result));
        loop {
            let (ops, res) = match result.take() {
                Some(r) => r,
                None => match queue.pop_front() {
                    Some(ops) => {
                        let res = self.client.txn(self.txn(ops.clone(), None)).await;
                        (ops, res)
                    }
                    None => return Ok(()),
                },
            };
            match res {
                Ok(resp) if resp.succeeded => self.check_peer(&resp.header)?,
                Ok(resp) => return Err(self.fence_failure(&resp)),
                Err(etcd::Error::TooManyOps) if ops.len() > 1 => {
                    self.stats.error(ErrorKind::TooManyOps);
                    // The refused txn had `ops` plus, maybe, the state put.
                    let limits = self.shrink_limits(|l| {
                        l.max_ops = l.max_ops.min(ops.len() + 1) / 2 + 1;
                    });
                    tracing::warn!(peer = %self.region, max_txn_ops = limits.max_ops, "the peer refused a txn for its op count; lowered its limit");
                    let per = limits.max_ops.saturating_sub(1).max(1);
                    split_front(&mut queue, ops, per);
                }
                Err(etcd::Error::RequestTooLarge) if ops.len() > 1 => {
                    let bytes: usize = ops.iter().map(Op::encoded_len).sum();
                    let limits = self.shrink_limits(|l| {
                        l.max_bytes = l.max_bytes.min(bytes + etcd::REQUEST_OVERHEAD_BYTES);
                    });
                    tracing::debug!(peer = %self.region, ops = ops.len(), bytes, max_request_bytes = limits.max_bytes, "the peer refused a txn as too large; splitting it");
                    let half = ops.len().div_ceil(2);
                    split_front(&mut queue, ops, half);
                }
                Err(etcd::Error::RequestTooLarge) if ops.len() == 1 => {
                    let key = ops[0].key().cloned();
                    self.stats.error(ErrorKind::TooLarge);
                    match key {
                        Some(key) => {
                            tracing::error!(
                                peer = %self.region,
                                key = %String::from_utf8_lossy(&key),
                                "value exceeds the peer's request size limit; deleted on the peer instead of leaving an older value"
                            );
                            queue.push_front(vec![Delete::key(key).into()]);
                        }
                        None => {
                            tracing::error!(peer = %self.region, "op exceeds the peer's request size limit; skipped")
                        }
                    }
                }
                Err(etcd::Error::NoSpace) => {
                    self.stats.error(ErrorKind::NoSpace);
                    return Err(Error::Etcd(etcd::Error::NoSpace));
                }
                Err(e) => return Err(self.txn_error(e)),
            }
        }
    }

    /// Checks a response header of the peer against what this engine knows
    /// of it: the same cluster, and a revision no lower than one it has
    /// already seen a txn commit at *before this call was sent*. Out of
    /// order answers of pipelined txns are fine: each only raises the mark.
    pub(crate) fn check_peer(&self, header: &Header) -> Result<()> {
        let known = self.peer_cluster.load(Relaxed);
        if known == 0 {
            self.peer_cluster.store(header.cluster_id, Relaxed);
        } else if header.cluster_id != 0 && header.cluster_id != known {
            return Err(Error::PeerChanged {
                peer: self.region.clone(),
                why: format!("cluster id {:016x}, was {known:016x}", header.cluster_id),
            });
        }
        self.peer_revision.fetch_max(header.revision, Relaxed);
        Ok(())
    }

    /// Checks a linearizable read of the peer made after `floor` was taken
    /// from [`FencedWriter::peer_revision`]: it must not be below it.
    pub(crate) fn check_peer_read(&self, header: &Header, floor: i64) -> Result<()> {
        if header.revision < floor {
            return Err(Error::PeerChanged {
                peer: self.region.clone(),
                why: format!(
                    "revision {} is below {floor}, where a txn of ours committed",
                    header.revision
                ),
            });
        }
        self.check_peer(header)
    }

    /// The highest revision a txn of ours is known to have committed at.
    pub(crate) fn peer_revision(&self) -> i64 {
        self.peer_revision.load(Relaxed)
    }

    /// Forgets the peer's identity (after a full re-sync).
    pub(crate) fn forget_peer(&self) {
        self.peer_cluster.store(0, Relaxed);
        self.peer_revision.store(0, Relaxed);
    }

    /// Whether a failed txn still found this engine's fence in place (so
    /// another of its compares failed).
    pub(crate) fn fence_holds(&self, resp: &TxnResponse) -> bool {
        resp.responses.iter().any(|r| match r {
            OpResponse::Range(r) => r
                .kvs()
                .first()
                .is_some_and(|kv| kv.create_revision() == self.fence),
            _ => false,
        })
    }

    /// Why a fenced txn failed: another holder, or the state key is gone.
    pub(crate) fn fence_failure(&self, resp: &TxnResponse) -> Error {
        let kv = resp.responses.iter().find_map(|r| match r {
            OpResponse::Range(r) => r.kvs().first().cloned(),
            _ => None,
        });
        let stored = Stored::from_kv(kv.as_ref());
        let peer = self.region.clone();
        match stored.state {
            Some(st) if st.holder != self.holder => Error::Fenced { peer },
            _ if self.lease.as_ref().is_some_and(|l| l.status().lost) => Error::LeaseLost { peer },
            _ => Error::StateGone { peer },
        }
    }

    /// Classifies a failed txn result.
    pub(crate) fn txn_error(&self, err: etcd::Error) -> Error {
        match err {
            etcd::Error::LeaseNotFound => Error::LeaseLost {
                peer: self.region.clone(),
            },
            e => Error::Etcd(e),
        }
    }
}

/// Puts `ops` back at the front of `queue` in chunks of at most `per`,
/// keeping their order.
fn split_front(queue: &mut VecDeque<Vec<Op>>, mut ops: Vec<Op>, per: usize) {
    let per = per.max(1);
    let mut chunks = Vec::new();
    while ops.len() > per {
        let rest = ops.split_off(per);
        chunks.push(std::mem::replace(&mut ops, rest));
    }
    chunks.push(ops);
    for c in chunks.into_iter().rev() {
        queue.push_front(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_front_keeps_the_order() {
        let ops: Vec<Op> = (0..7)
            .map(|i| Delete::key(format!("k{i}")).into())
            .collect();
        let mut q = VecDeque::new();
        q.push_back(vec![Delete::key("after").into()]);
        split_front(&mut q, ops, 3);
        let keys: Vec<Vec<String>> = q
            .iter()
            .map(|c| {
                c.iter()
                    .map(|o| String::from_utf8_lossy(o.key().unwrap()).into_owned())
                    .collect()
            })
            .collect();
        assert_eq!(
            keys,
            [
                vec!["k0", "k1", "k2"],
                vec!["k3", "k4", "k5"],
                vec!["k6"],
                vec!["after"]
            ]
        );
    }
}
