//! The revisions this engine's own txns committed at on the peer: how the
//! copy watch ([`crate::mirror::live`]'s `copy`) tells its own writes from
//! everyone else's.
//!
//! Every write txn to the peer goes through [`Own::send`], which books it
//! in flight before it leaves and, once answered, books the revision it
//! committed at. An event the copy watch sees at revision X is this
//! engine's if X is booked. Watch events can arrive before the txn's own
//! answer, so an event not (yet) booked is *held* until every txn that was
//! in flight when it arrived has been answered: a txn sent after the event
//! arrived commits after it, at a higher revision, so it cannot explain
//! it. Only then is the event judged out of band.
//!
//! A txn whose answer never comes (a timeout, a session dropped mid-call)
//! is booked as answered without a revision: if it did commit, its event
//! reads as out of band and the key is compared with the source and, if it
//! matches, left alone. A false alarm, never a miss.
//!
//! A txn that succeeded but changed nothing (it only deleted keys already
//! gone, or its nested guards all failed) is booked without a revision too:
//! etcd answers such a txn with the store's current revision, which is the
//! revision of the *last* write, whoever made it. Booking it would pass an
//! out-of-band change off as ours: a `del --prefix` on the copy, then the
//! stream's delete of a key it had taken, and the whole `del --prefix`
//! would never be repaired.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::etcd::{self, OpResponse, Txn, TxnResponse};
use crate::store::Store;

/// The ledger of one peer's own txns (see the module doc). Cheap to clone:
/// clones share it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Own {
    inner: Arc<Mutex<Ledger>>,
}

#[derive(Debug, Default)]
struct Ledger {
    /// Txns sent so far; a txn's ticket is the count before it.
    sent: u64,
    /// The tickets of the txns not yet answered.
    in_flight: BTreeSet<u64>,
    /// Revisions our txns committed at, above the copy watch's floor.
    revisions: BTreeSet<i64>,
    /// Below this, revisions are no longer asked about (see [`Own::prune`]).
    floor: i64,
    /// A copy watch asks: revisions are kept only then.
    armed: bool,
}

/// What [`Own::judge`] found for an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// One of ours.
    Own,
    /// Nobody of ours wrote it: out of band.
    Foreign,
    /// Txns that were in flight when it arrived may still explain it:
    /// ask again once they are answered.
    Undecided,
}

/// A txn booked in flight; answered on drop if [`Ticket::answered`] was
/// not called (a future dropped mid-call).
struct Ticket {
    own: Own,
    id: u64,
    done: bool,
}

impl Ticket {
    fn answered(mut self, revision: Option<i64>) {
        self.done = true;
        self.own.answer(self.id, revision);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            self.own.answer(self.id, None);
        }
    }
}

impl Own {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends a write txn to the peer, booking it.
    pub(crate) async fn send(&self, client: &Store, txn: Txn) -> etcd::Result<TxnResponse> {
        let ticket = self.begin();
        let result = client.txn(txn).await;
        ticket.answered(result.as_ref().ok().and_then(committed));
        result
    }

    fn begin(&self) -> Ticket {
        let mut l = self.ledger();
        let id = l.sent;
        l.sent += 1;
        l.in_flight.insert(id);
        Ticket {
            own: self.clone(),
            id,
            done: false,
        }
    }

    fn answer(&self, id: u64, revision: Option<i64>) {
        let mut l = self.ledger();
        l.in_flight.remove(&id);
        if let Some(r) = revision.filter(|&r| l.armed && r >= l.floor) {
            l.revisions.insert(r);
        }
    }

    /// Txns sent so far: what an event that arrives now must wait for.
    pub(crate) fn sent(&self) -> u64 {
        self.ledger().sent
    }

    /// Whose is an event at `revision` that arrived when `sent` txns had
    /// been sent?
    pub(crate) fn judge(&self, revision: i64, sent: u64) -> Verdict {
        let l = self.ledger();
        if l.revisions.contains(&revision) {
            Verdict::Own
        } else if l.in_flight.first().is_some_and(|&oldest| oldest < sent) {
            Verdict::Undecided
        } else {
            Verdict::Foreign
        }
    }

    /// Forgets revisions below `floor`: the copy watch delivers events in
    /// revision order, so nothing below the oldest event it still holds
    /// will be asked about again.
    pub(crate) fn prune(&self, floor: i64) {
        let mut l = self.ledger();
        l.armed = true;
        if floor > l.floor {
            l.floor = floor;
            l.revisions = l.revisions.split_off(&floor);
        }
    }
}

/// The revision a txn committed a change at: `None` if it failed its
/// compares (the engine's failure branches only read) or changed nothing
/// (see the module doc).
pub(crate) fn committed(resp: &TxnResponse) -> Option<i64> {
    /// Whether the ops that ran changed a key; a nested txn's, in whichever
    /// branch ran.
    fn changed(responses: &[OpResponse]) -> bool {
        responses.iter().any(|r| match r {
            OpResponse::Put(_) => true,
            OpResponse::Delete(d) => d.deleted > 0,
            OpResponse::Txn(t) => changed(&t.responses),
            // A read, or a kind this engine never sends: not booking it
            // risks a false alarm, booking it a miss.
            _ => false,
        })
    }
    (resp.succeeded && changed(&resp.responses)).then_some(resp.header.revision)
}

impl Own {
    /// A session will watch its copy from `from`: book our txns' revisions
    /// from there on (those already booked above it are kept: a txn of an
    /// earlier session of this engine is still ours).
    pub(crate) fn arm(&self, from: i64) {
        let mut l = self.ledger();
        l.armed = true;
        l.floor = from;
        l.revisions = l.revisions.split_off(&from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_waits_for_the_txns_in_flight_when_it_arrived() {
        let own = Own::default();
        own.prune(0);
        let a = own.begin();
        let b = own.begin();
        // The event arrives with both in flight.
        let sent = own.sent();
        assert_eq!(own.judge(10, sent), Verdict::Undecided);
        a.answered(Some(9));
        assert_eq!(own.judge(10, sent), Verdict::Undecided);
        // A txn sent after the event arrived cannot explain it.
        let c = own.begin();
        b.answered(Some(10));
        assert_eq!(own.judge(10, sent), Verdict::Own);
        assert_eq!(own.judge(11, sent), Verdict::Foreign);
        drop(c);
    }

    #[test]
    fn a_txn_never_answered_counts_as_answered_without_a_revision() {
        let own = Own::default();
        own.prune(0);
        let t = own.begin();
        let sent = own.sent();
        drop(t);
        assert_eq!(own.judge(5, sent), Verdict::Foreign);
    }

    #[test]
    fn pruned_revisions_are_forgotten() {
        let own = Own::default();
        own.prune(0);
        own.begin().answered(Some(3));
        own.begin().answered(Some(8));
        own.prune(5);
        assert_eq!(own.judge(3, own.sent()), Verdict::Foreign);
        assert_eq!(own.judge(8, own.sent()), Verdict::Own);
        // A late answer below the floor is not kept.
        own.begin().answered(Some(4));
        assert_eq!(own.ledger().revisions.len(), 1);
    }

    #[test]
    fn nothing_is_kept_until_a_session_arms_it() {
        let own = Own::default();
        own.begin().answered(Some(3));
        assert!(own.ledger().revisions.is_empty());
        own.arm(4);
        own.begin().answered(Some(4));
        own.begin().answered(Some(9));
        // A later session arming from lower keeps what is booked above.
        own.arm(2);
        assert_eq!(own.judge(9, own.sent()), Verdict::Own);
        assert_eq!(own.judge(3, own.sent()), Verdict::Foreign);
    }

    /// etcd answers a txn that changed nothing with the store's revision:
    /// the last write's, here someone else's delete.
    #[tokio::test]
    async fn a_txn_that_changed_nothing_books_no_revision() {
        use crate::etcd::{Compare, CompareOp, Delete, Op, Put, Range};
        use aether_etcd::model::{Cluster, ModelConfig};

        let cluster = Cluster::new(ModelConfig::default());
        let c = cluster.client(0);
        c.put(Put::new("k", "v")).await.unwrap();
        c.put(Put::new("j", "v")).await.unwrap();
        // Out of band: both keys go at one revision.
        let both = Txn::new().and_then([Delete::key("k"), Delete::key("j")]);
        let foreign = c.txn(both).await.unwrap().header.revision;
        // Ours: the stream's delete of a key already gone, plainly and as
        // a nested txn, each succeeding at that same revision.
        let plain = Txn::new().and_then([Delete::key("j")]);
        let nested = Txn::new().and_then([Op::from(
            Txn::new()
                .when([Compare::version("j", CompareOp::Equal, 0)])
                .and_then([Delete::key("k")]),
        )]);
        for txn in [plain, nested] {
            let resp = c.txn(txn).await.unwrap();
            assert!(resp.succeeded);
            assert_eq!(resp.header.revision, foreign);
            assert_eq!(committed(&resp), None, "{resp:?}");
        }
        // A change is booked at its revision; a failed compare is not.
        let put = c
            .txn(Txn::new().and_then([Put::new("k", "w")]))
            .await
            .unwrap();
        assert_eq!(committed(&put), Some(foreign + 1));
        let failed = c
            .txn(
                Txn::new()
                    .when([Compare::version("k", CompareOp::Equal, 0)])
                    .and_then([Put::new("k", "x")])
                    .or_else([Range::key("k")]),
            )
            .await
            .unwrap();
        assert_eq!(committed(&failed), None);
    }
}
