//! The fenced writer: everything one txn to a peer needs, as one value.
//!
//! Both the range-diff sync ([`super::sync`]) and the live loop
//! ([`super::peer`]) write through it. It holds the peer's client, its
//! state key, the fence (the state key's create revision at this engine's
//! claim), the mirror lease and the stats; it builds the fenced txn, tells
//! a fence failure from a lost lease, and falls back to one op per txn when
//! the peer refuses a batch as too large.

use std::sync::Arc;

use bytes::Bytes;

use super::state::{self, State, Stored};
use super::stats::{ErrorKind, PeerStats};
use crate::error::{Error, Result};
use crate::etcd::{self, Client, LeaseHandle, Op, OpResponse, Put, Range, Txn, TxnResponse};

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
}

impl FencedWriter {
    pub(crate) fn new(
        region: String,
        client: Client,
        state_key: Bytes,
        holder: u64,
        stats: Arc<PeerStats>,
    ) -> FencedWriter {
        FencedWriter {
            region,
            client,
            state_key,
            holder,
            stats,
            fence: 0,
            lease: None,
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
        self.stats.set_lease(0, None);
    }

    /// A put under the mirror lease.
    pub(crate) fn put(&self, key: Bytes, value: Bytes) -> Op {
        Put::new(key, value).lease(self.lease_id()).into()
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
                let st = State {
                    revision,
                    lease: self.lease_id(),
                    holder: self.holder,
                };
                txn.and_then([Put::new(self.state_key.clone(), st.encode()).lease(self.lease_id())])
            }
            None => txn,
        }
    }

    /// Sends a fenced txn of `ops` and books its outcome (see
    /// [`FencedWriter::settle`]).
    pub(crate) async fn write(&self, ops: Vec<Op>, state_revision: Option<i64>) -> Result<()> {
        let result = self.client.txn(self.txn(ops.clone(), state_revision)).await;
        self.settle(ops, result).await
    }

    /// Books the outcome of a fenced txn of `ops`: a failed compare is a
    /// fence or lease error; a batch refused as too large goes again one op
    /// per txn.
    pub(crate) async fn settle(
        &self,
        ops: Vec<Op>,
        result: etcd::Result<TxnResponse>,
    ) -> Result<()> {
        match result {
            Ok(resp) if resp.succeeded => Ok(()),
            Ok(resp) => Err(self.fence_failure(&resp)),
            Err(etcd::Error::RequestTooLarge) if !ops.is_empty() => {
                self.apply_one_by_one(ops).await
            }
            Err(e) => Err(self.txn_error(e)),
        }
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

    /// Sends `ops` one per txn after a batch was refused as too large,
    /// skipping (and counting) those that are too large on their own.
    async fn apply_one_by_one(&self, ops: Vec<Op>) -> Result<()> {
        for op in ops {
            let key = op.key().cloned().unwrap_or_default();
            match self.client.txn(self.txn(vec![op], None)).await {
                Ok(resp) if resp.succeeded => {}
                Ok(resp) => return Err(self.fence_failure(&resp)),
                Err(etcd::Error::RequestTooLarge) => {
                    self.stats.error(ErrorKind::TooLarge);
                    tracing::error!(
                        peer = %self.region,
                        key = %String::from_utf8_lossy(&key),
                        "write exceeds the peer's request size limit; skipped"
                    );
                }
                Err(e) => return Err(self.txn_error(e)),
            }
        }
        Ok(())
    }
}
