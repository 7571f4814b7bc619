//! The fenced writer: everything one txn to a peer needs, as one value.
//!
//! The send pipeline ([`super`]), the claim, the verification
//! pass and the final state write all build their txns here. It holds the
//! peer's client, its state key, the fence (the state key's create revision
//! at this engine's claim), the mirror lease and the stats; it builds the
//! fenced txn, checks the peer's identity in every answer, and tells a
//! fence failure from a lost lease.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::time::Instant;

use bytes::Bytes;

use super::own::Own;
use crate::error::{Error, Result};
use crate::etcd::LeaseId;
use crate::etcd::{self, Header, Op, OpResponse, Put, Range, Txn, TxnResponse};
use crate::mirror::clock::Clock;
use crate::mirror::state::{self, State, Stored};
use crate::mirror::stats::{PeerStats, mono_us};
use crate::store::{Lease, Store};

/// Writes to one peer under this engine's claim.
pub(crate) struct FencedWriter {
    /// The peer's region name, for errors and logs.
    pub(crate) region: String,
    /// The peer's etcd.
    pub(crate) client: Store,
    /// `<state_root><origin>/state` on the peer.
    pub(crate) state_key: Bytes,
    /// The engine incarnation.
    pub(crate) holder: u64,
    pub(crate) stats: Arc<PeerStats>,
    /// The state key's create revision at this engine's claim; 0 unclaimed.
    pub(crate) fence: i64,
    /// The mirror lease, kept alive while this value holds it.
    pub(crate) lease: Option<Box<dyn Lease>>,
    /// What goes into the state key besides the revision.
    pub(crate) marks: Marks,
    /// The revisions our write txns committed at: every write to the peer
    /// goes through it ([`Own::send`]).
    pub(crate) own: Own,
    /// The peer's identity as this engine knows it: its cluster id and the
    /// highest revision an answer to us carried.
    peer_cluster: AtomicU64,
    peer_revision: AtomicI64,
    /// Keys whose source value is too large for the peer, so absent there
    /// by design: the freshness probe's key count allows for them, and the
    /// verification pass does not try them again. Rare, so a locked set.
    oversized: Mutex<HashSet<Bytes>>,
}

/// The state key's identity and freshness fields, shared by every txn of
/// the session.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    /// The source etcd's cluster id.
    pub(crate) source_cluster: AtomicU64,
    /// The source's own id (kept in the source etcd).
    pub(crate) source_id: AtomicU64,
    /// When the peer was last known current, on the monotonic clock
    /// (`stats::mono_us`; 0: never). The heartbeat written is derived
    /// from it at each write ([`Marks::heartbeat_unix_ms`]).
    current_mono_us: AtomicU64,
    /// A complete copy is on the peer under this lease.
    pub(crate) synced: AtomicBool,
    /// The TTL the lease was granted with, seconds (0: none held): written
    /// into the state key so that a successor need not ask it.
    pub(crate) lease_ttl: AtomicI64,
    /// The wall clock the heartbeat is read from.
    pub(crate) clock: Clock,
}

impl Marks {
    /// The peer held everything the source did at `at`.
    pub(crate) fn mark_current(&self, at: Instant) {
        self.current_mono_us.fetch_max(mono_us(at), Relaxed);
    }

    /// Takes a predecessor's heartbeat (Unix ms by its clock; 0: none):
    /// the copy is as old as that says by this clock. A heartbeat ahead of
    /// this clock is of unknown age (written by a clock that was ahead,
    /// perhaps an hour ago), so it counts as none: the copy is not current
    /// until a probe says so. Taking it as "now" would let one wall-clock
    /// step make an old copy read fresh again (the simulation found that).
    pub(crate) fn adopt_heartbeat(&self, heartbeat_unix_ms: i64) {
        let age = self.clock.unix_ms() - heartbeat_unix_ms;
        let at = (heartbeat_unix_ms > 0 && age >= 0)
            .then(|| mono_us(Instant::now()).saturating_sub(age as u64 * 1000));
        self.current_mono_us.store(at.unwrap_or(0), Relaxed);
    }

    /// The heartbeat to write now: this clock now, less the copy's age on
    /// the monotonic clock. Never ahead of this clock, and a step of the
    /// wall clock moves it only while the step lasts (see
    /// [`State::staleness_at`]); 0 when the copy was never current.
    pub(crate) fn heartbeat_unix_ms(&self) -> i64 {
        match self.current_mono_us.load(Relaxed) {
            0 => 0,
            at => {
                let age_us = mono_us(Instant::now()).saturating_sub(at);
                self.clock.unix_ms() - (age_us / 1000) as i64
            }
        }
    }
}

impl FencedWriter {
    pub(crate) fn new(
        region: String,
        client: Store,
        state_key: Bytes,
        holder: u64,
        stats: Arc<PeerStats>,
        clock: Clock,
    ) -> FencedWriter {
        FencedWriter {
            region,
            client,
            state_key,
            holder,
            stats,
            fence: 0,
            lease: None,
            marks: Marks {
                clock,
                ..Marks::default()
            },
            own: Own::default(),
            peer_cluster: AtomicU64::new(0),
            peer_revision: AtomicI64::new(0),
            oversized: Mutex::new(HashSet::new()),
        }
    }

    fn oversized(&self) -> MutexGuard<'_, HashSet<Bytes>> {
        self.oversized.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that `key`'s source value is too large for the peer.
    pub(crate) fn mark_oversized(&self, key: Bytes) {
        // A copy, not a slice of the page the key came from (see
        // `CountSplits::offer`).
        self.oversized().insert(Bytes::copy_from_slice(&key));
    }

    /// Whether `key`'s source value was found too large for the peer.
    pub(crate) fn is_oversized(&self, key: &[u8]) -> bool {
        self.oversized().contains(key)
    }

    /// Keys too large for the peer, as known now.
    pub(crate) fn oversized_count(&self) -> usize {
        self.oversized().len()
    }

    /// The peer took these ops: their keys hold the source's value (or
    /// its absence) there now, whatever they held before.
    pub(crate) fn took(&self, ops: &[Op]) {
        let mut set = self.oversized();
        if set.is_empty() {
            return;
        }
        for op in ops {
            if let Some(k) = op.key() {
                set.remove(k.as_ref());
            }
        }
    }

    /// Forgets every oversized key (a sync finds them again).
    pub(crate) fn forget_oversized(&self) {
        self.oversized().clear();
    }

    /// The mirror lease id, [`LeaseId::NONE`] when none is held.
    pub(crate) fn lease_id(&self) -> LeaseId {
        self.lease.as_ref().map_or(LeaseId::NONE, |l| l.id())
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
        self.marks.lease_ttl.store(0, Relaxed);
        self.stats.set_lease(LeaseId::NONE, None);
    }

    /// The write that makes `key` on the peer what the source holds
    /// (`want`; `None`: the source has no such key), guarded by the key as
    /// it was read on the peer (`have`), so that a write landing there
    /// meanwhile wins. The verification pass's and the copy watch's repairs.
    pub(crate) fn fix(
        &self,
        key: &Bytes,
        want: Option<crate::etcd::KeyValue>,
        have: Option<&crate::etcd::KeyValue>,
    ) -> (crate::etcd::Compare, Op) {
        use crate::etcd::{Compare, CompareOp, Delete};
        let guard = match have {
            Some(h) => Compare::mod_revision(key.clone(), CompareOp::Equal, h.mod_revision()),
            None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
        };
        let op = match want {
            Some(w) => {
                let (k, v) = w.into_key_value();
                self.put(k, v)
            }
            None => Delete::key(key.clone()).into(),
        };
        (guard, op)
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
            source_id: self.marks.source_id.load(Relaxed),
            heartbeat_unix_ms: self.marks.heartbeat_unix_ms(),
            synced: self.marks.synced.load(Relaxed),
            lease_ttl: self.marks.lease_ttl.load(Relaxed),
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

    /// Sends a fenced txn of `ops` with the state put recording
    /// `state_revision`, one at a time: for the state-only writes outside
    /// the send pipeline (a sync's completion, a drain's last word).
    pub(crate) async fn write(&self, ops: Vec<Op>, state_revision: Option<i64>) -> Result<()> {
        let resp = self
            .own
            .send(&self.client, self.txn(ops, state_revision))
            .await
            .map_err(|e| self.txn_error(e))?;
        if !resp.succeeded {
            return Err(self.fence_failure(&resp));
        }
        self.check_peer(&resp.header)
    }

    /// Checks a response header of the peer against what this engine knows
    /// of it: the same cluster; and raises the mark of the highest
    /// revision a txn of ours committed at. Out of order answers of
    /// pipelined txns are fine: each only raises the mark. Whether the
    /// answer is below the mark *as it was when the call was sent* is
    /// [`FencedWriter::check_peer_read`]'s check.
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

    /// Checks an answer of the peer (a linearizable read, or a txn) to a
    /// call sent after `floor` was taken from
    /// [`FencedWriter::peer_revision`]: it must not be below it.
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

    /// Checks the answer to a txn of ours that changed a key, sent after
    /// `floor` was taken from [`FencedWriter::peer_revision`]: it committed
    /// after every answer the floor came from, so its revision must be
    /// above it, not merely at it.
    pub(crate) fn check_peer_write(&self, header: &Header, floor: i64) -> Result<()> {
        if header.revision <= floor {
            return Err(Error::PeerChanged {
                peer: self.region.clone(),
                why: format!(
                    "a write of ours committed at revision {}, not above {floor}, which the peer had reached before",
                    header.revision
                ),
            });
        }
        self.check_peer(header)
    }

    /// Raises the peer revision mark to one the peer is known to have
    /// reached otherwise (the copy watch delivered it): every later answer
    /// of the peer is at or above it too.
    pub(crate) fn witnessed(&self, revision: i64) {
        self.peer_revision.fetch_max(revision, Relaxed);
    }

    /// The highest revision of the peer an answer to us, or the copy
    /// watch, is known to have carried.
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
        self.lost_claim(&stored)
    }

    /// Why the state key no longer carries this engine's claim: another
    /// source holds the peer (a conflict: wait, never give up), another
    /// engine of this source fenced this one (stop), the lease was lost,
    /// or the key is gone.
    pub(crate) fn lost_claim(&self, stored: &Stored) -> Error {
        let peer = self.region.clone();
        let ours = self.marks.source_id.load(Relaxed);
        match stored.state {
            Some(st)
                if st.holder != self.holder
                    && st.source_id != 0
                    && ours != 0
                    && st.source_id != ours =>
            {
                Error::Conflict {
                    peer,
                    other: st.source_id,
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A heartbeat written while the writer's wall clock was an hour ahead
    /// (an NTP step since undone) says nothing about the copy's age: a
    /// successor that adopts it must not write it back as "now".
    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_from_a_clock_ahead_is_not_adopted() {
        let wall = Arc::new(AtomicI64::new(1_800_000_000_000));
        let w = wall.clone();
        let marks = Marks {
            clock: Clock::supplied(move || w.load(Relaxed), || 1),
            ..Marks::default()
        };
        let now = wall.load(Relaxed);
        marks.adopt_heartbeat(now + 3_600_000);
        assert_eq!(marks.heartbeat_unix_ms(), 0, "never current, not now");
        // One in the past is its age by this clock, and ages on.
        marks.adopt_heartbeat(now - 2_000);
        assert_eq!(marks.heartbeat_unix_ms(), now - 2_000);
        tokio::time::advance(Duration::from_secs(1)).await;
        wall.fetch_add(1_000, Relaxed);
        assert_eq!(marks.heartbeat_unix_ms(), now - 2_000);
    }
}
