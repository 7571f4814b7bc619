//! The claim: how a session takes a peer, and with which lease.
//!
//! Each session reads the source's identity (cluster id, revision) and the
//! peer's state key at once; refuses a peer that another source holds (two
//! sites with one region name); adopts a predecessor's live lease granted
//! with the configured TTL, or grants a new one (granted beside the reads
//! when the engine holds no live lease, and revoked by any claim that does
//! not end up using it: [`Unclaimed`]; a predecessor's lease with
//! another TTL is kept alive until the subtree is re-put under the new
//! one); and claims the peer anew with a compare-and-swap on the state key,
//! so that whatever an earlier session left in flight fails the fence
//! ([`crate::mirror::state`]). It decides how the session starts: resume the watch
//! from the state revision when the copy can be trusted (same source, no
//! revision gone back, same lease, not too far behind), or re-sync.
//!
//! A session without a live lease of its own (an engine's first, or one
//! whose lease ran out) most likely finds no state key: a new region, or
//! a copy gone with its lease. It claims in one round trip instead of two
//! ([`Peer::claim_at_once`]). With the source's id read first (a local
//! read), it grants a lease under an id it chooses and, a moment later on
//! the same connection, sends a txn that creates the state key on that
//! lease if it is absent and reads the copy's first keys at the same
//! revision (the sync's first read of the peer, which no earlier holder's
//! txn can follow: none passes its fence once the key is new), or reads
//! the key if present, for the usual steps. etcd promises no order between
//! requests in flight: across connections none at all, and on one it
//! starts each in a goroutine of its own. So the claim can still reach the
//! store before its lease; etcd then refuses it as a whole ("lease not
//! found"), and it is sent again once the grant has answered, which costs
//! the round trip a claim after its grant costs anyway. A grant that fails
//! after the claim was made (an id another lease holds) withdraws the
//! claim.
//! On a long link that is one round trip less before the first data txn,
//! and so before a new copy is whole (`tests/wan.rs` counts them).

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use super::Peer;
use crate::error::{Error, Result};
use crate::etcd::{self, Header, LeaseGrant, LeaseId};
use crate::mirror::diff::Seed;
use crate::mirror::state::{self, State};
use crate::mirror::stats::{ErrorKind, ResyncReason};
use crate::mirror::sync::Pinned;
use crate::store::{Lease, Store};

/// Keys of the copy the claim made in one txn reads with it: enough to
/// tell an empty copy from one to scan, few enough that values of etcd's
/// largest size (1.5 MiB) stay far below the client's decode limit.
const AT_ONCE_PAGE: i64 = 16;

/// How long a claim made in one txn waits after sending its lease's grant
/// on the same connection ([`Peer::claim_without_lease`]).
const CLAIM_AFTER_GRANT: Duration = Duration::from_millis(2);

/// What [`Peer::claim_at_once`] came to.
enum AtOnce {
    /// The claim is made: the lease handle and how the session starts.
    Claimed((Option<Box<dyn Lease>>, Start)),
    /// The peer holds a state key: the usual steps follow from it.
    Held(state::Stored, Header),
    /// etcd applied the claim before the grant of its lease, and refused
    /// it: nothing changed.
    BeforeItsLease,
}

/// Where a session starts from.
pub(crate) enum Start {
    /// Every source revision up to this one is on the peer: watch from the
    /// next one.
    Resume(i64),
    /// Run a range-diff sync first: pinned and started beside the claim
    /// (`None`: the pin failed, and the sync pins again).
    Sync(ResyncReason, Option<Box<Pinned>>),
}

impl Peer {
    /// Decides how the session starts and claims the peer: it returns a
    /// new lease handle when the lease changed.
    pub(crate) async fn claim(&mut self) -> Result<(Option<Box<dyn Lease>>, Start)> {
        let floor = self.writer.peer_revision();
        let want_ttl = self.cfg.lease_ttl.as_secs().max(1) as i64;
        if !self.writer.lease_alive() {
            let claimed = self.claim_without_lease(floor, want_ttl).await;
            // Started by now unless the claim failed before it was sent.
            self.open_connections();
            return claimed;
        }
        self.open_connections();
        // The source as it is now: the copy may only be resumed if it came
        // from this store and nothing it holds is past the store's revision.
        // The two reads are independent: one round trip to the peer, not
        // two in a row (on a long link every round trip of the session
        // start is paid again by each new session).
        // The source's own id is read (or created) in the same txn that
        // gives its header.
        let (source, peer) = tokio::join!(
            state::source_id(&self.local, &self.source_id_key, self.cfg.clock.fresh_id()),
            state::read(&self.writer.client, &self.writer.state_key),
        );
        let (stored, peer_header) = peer?;
        self.claim_over(floor, want_ttl, None, source?, stored, peer_header)
            .await
    }

    /// The claim of a session without a live lease of its own: an engine's
    /// first, or one whose lease ran out. It most likely needs a new lease,
    /// and most likely finds no state key on the peer (a new region, or a
    /// copy gone with its lease), so it claims in one round trip
    /// ([`Peer::claim_at_once`]): with the source's id read first (a local
    /// read, so nothing on the peer link waits on it), a lease of an id of
    /// its own choosing is granted and, [`CLAIM_AFTER_GRANT`] later, the
    /// claim attached to that id goes on the same connection. The usual
    /// steps follow if the peer holds a state key, with that lease granted
    /// beside them (a claim that does not end up using it revokes it:
    /// [`Unclaimed`]). If the claim still reached etcd before its lease, it
    /// is sent again once the grant has answered: one round trip more, what
    /// a claim after a grant costs anyway.
    async fn claim_without_lease(
        &mut self,
        floor: i64,
        want_ttl: i64,
    ) -> Result<(Option<Box<dyn Lease>>, Start)> {
        let source =
            state::source_id(&self.local, &self.source_id_key, self.cfg.clock.fresh_id()).await?;
        // etcd orders no requests across connections, and the client
        // spreads its calls over several: on one, the grant's frames (queued
        // first: `Unclaimed::grant`) reach etcd before the claim's.
        let peer = self.writer.client.in_order();
        let id = self.next_lease_id();
        let mut speculative = Some(Unclaimed::grant(&peer, id, want_ttl));
        // etcd starts each request's handler in a goroutine of its own, and
        // of two that arrive together the later one often runs first: the
        // pause puts the claim in a later read than the grant, by which
        // time the grant has long been proposed. Nothing on a long link.
        tokio::time::sleep(CLAIM_AFTER_GRANT).await;
        let mut retried = false;
        let (stored, peer_header) = loop {
            match self
                .claim_at_once(&peer, floor, id, want_ttl, &source, &mut speculative)
                .await?
            {
                AtOnce::Claimed(done) => return Ok(done),
                AtOnce::Held(stored, header) => break (stored, header),
                AtOnce::BeforeItsLease if !retried => {
                    retried = true;
                    tracing::debug!(peer = %self.region(), lease = %id, "the claim reached the peer before its lease; sending it again once the lease is granted");
                    let granted = match speculative.take() {
                        Some(early) => early.wait().await?,
                        None => return Err(Error::Etcd(etcd::Error::Closed)),
                    };
                    speculative = Some(Speculative::ready(granted));
                }
                // The lease was granted and is gone again: this session's
                // error, and the next one claims anew.
                AtOnce::BeforeItsLease => return Err(Error::Etcd(etcd::Error::LeaseNotFound)),
            }
        };
        self.claim_over(floor, want_ttl, speculative, source, stored, peer_header)
            .await
    }

    /// The claim in one txn ([`state::claim_at_once`]) on lease `id`,
    /// whose grant `speculative` has sent. Created, the claim is a whole
    /// one: the session starts syncing, the peer's first page read by the
    /// claim's own txn.
    async fn claim_at_once(
        &mut self,
        peer: &Store,
        floor: i64,
        id: LeaseId,
        want_ttl: i64,
        (source_id, source): &(u64, Header),
        speculative: &mut Option<Speculative>,
    ) -> Result<AtOnce> {
        let w = &self.writer;
        let claimed = State {
            revision: 0,
            lease: id,
            holder: w.holder,
            source_cluster: source.cluster_id,
            source_id: *source_id,
            heartbeat_unix_ms: 0,
            synced: false,
            lease_ttl: want_ttl,
        };
        let (key, prefix) = (w.state_key.clone(), self.prefix.clone());
        let sent = std::time::Instant::now();
        let mut found = std::pin::pin!(state::claim_at_once(
            peer,
            &key,
            claimed,
            &prefix,
            AT_ONCE_PAGE
        ));
        // The connections open once the claim is queued on its own, not
        // before: what the opening sends (a call on each, and on the
        // first session a padding body) costs CPU, which the grant and the
        // claim should not wait behind, and its answers come back a round
        // trip later, after the claim has gone.
        let first =
            std::future::poll_fn(|cx| std::task::Poll::Ready(found.as_mut().poll(cx))).await;
        self.open_connections();
        let found = match first {
            std::task::Poll::Ready(found) => found,
            std::task::Poll::Pending => found.await,
        };
        let took = sent.elapsed();
        let (header, kvs, more) = match found {
            Ok(state::AtOnce::Created { header, kvs, more }) => (header, kvs, more),
            Ok(state::AtOnce::Held(stored, header)) => return Ok(AtOnce::Held(stored, header)),
            Err(etcd::Error::LeaseNotFound) => return Ok(AtOnce::BeforeItsLease),
            Err(e) => return Err(e.into()),
        };
        let fence = header.revision;
        // Created on lease `id`: the claim is ours only if our grant made
        // that lease. Its answer left before the claim's did.
        let granted = match speculative.take() {
            Some(early) => early.wait().await,
            None => Err(Error::Etcd(etcd::Error::Closed)),
        };
        let unclaimed = match granted {
            Ok(unclaimed) => unclaimed,
            Err(e) => {
                // Another's lease with that id, or a grant whose fate is
                // unknown: the claim must not hang on it.
                let w = &self.writer;
                if let Err(undo) = state::withdraw(&w.client, &w.state_key, fence).await {
                    tracing::info!(peer = %w.region, error = %undo, "could not withdraw a claim made on a lease not granted; the next session finds it");
                }
                return Err(e);
            }
        };
        // From here on an early return drops `unclaimed`, which revokes the
        // lease and, with it, the state key just created.
        self.writer.check_peer_read(&header, floor)?;
        self.stats().up.store(true, Relaxed);
        let marks = &self.writer.marks;
        marks.source_cluster.store(source.cluster_id, Relaxed);
        marks.source_id.store(*source_id, Relaxed);
        let grant = unclaimed.grant;
        tracing::info!(peer = %self.region(), lease = %grant.id, ttl = ?grant.ttl, "granted mirror lease");
        let handle = self.writer.client.keep_alive(grant.id, grant.ttl).await?;
        let owed = !self.fresh && !self.writer.marks.synced.load(Relaxed);
        self.replay_horizon = 0;
        let reason = self.sync_reason(None, false, false, false, owed);
        let w = &mut self.writer;
        w.marks.adopt_heartbeat(0);
        w.marks.synced.store(false, Relaxed);
        w.marks.lease_ttl.store(secs(grant.ttl), Relaxed);
        w.fence = fence;
        unclaimed.keep();
        // Every change after the claim's txn is the copy watch's: the
        // first page was read in it.
        let copy_from = fence + 1;
        self.copy_from = copy_from;
        self.inherited = false;
        if self.cfg.copy_watch {
            w.own.arm(copy_from);
        }
        let seed = Seed {
            kvs,
            more,
            revision: fence,
            took,
        };
        let start = match self.pin_sync(copy_from, Some(seed)).await {
            Ok(pinned) => Start::Sync(reason, Some(Box::new(pinned))),
            Err(e) => {
                tracing::debug!(peer = %self.region(), error = %e, "could not pin the sync after the claim; pinning it again");
                Start::Sync(reason, None)
            }
        };
        Ok(AtOnce::Claimed((Some(handle), start)))
    }

    /// The claim's usual steps, once the source and the peer's state key
    /// are read: refuse, adopt or grant a lease, release a predecessor's
    /// key, create ours.
    async fn claim_over(
        &mut self,
        floor: i64,
        want_ttl: i64,
        mut speculative: Option<Speculative>,
        (source_id, source): (u64, Header),
        stored: state::Stored,
        peer_header: Header,
    ) -> Result<(Option<Box<dyn Lease>>, Start)> {
        self.writer.check_peer_read(&peer_header, floor)?;
        self.stats().up.store(true, Relaxed);
        let marks = &self.writer.marks;
        marks.source_cluster.store(source.cluster_id, Relaxed);
        marks.source_id.store(source_id, Relaxed);

        if let Some(st) = stored.state
            && st.holder != self.writer.holder
        {
            // Another site with this region's name, still alive: it keeps
            // the peer. Sources are told apart by their own ids; a claim
            // written before those existed, by cluster id.
            let other = if st.source_id != 0 {
                (st.source_id != source_id).then_some(st.source_id)
            } else {
                (st.source_cluster != 0 && st.source_cluster != source.cluster_id)
                    .then_some(st.source_cluster)
            };
            if let Some(other) = other
                && self.stored_lease(&st).await?.is_some()
            {
                return Err(Error::Conflict {
                    peer: self.region().to_owned(),
                    other,
                });
            }
            if !self.fresh {
                return Err(Error::Fenced {
                    peer: self.region().to_owned(),
                });
            }
        }
        let source_changed = stored
            .state
            .and_then(|st| source_mismatch(&st, &source, source_id));
        if let Some(why) = &source_changed {
            self.stats().error(ErrorKind::Identity);
            tracing::warn!(peer = %self.region(), why, "the source is not the store the copy came from; re-syncing in full");
        }

        // Adopt a live lease granted with our TTL, or grant one.
        let w = &self.writer;
        let own_lease_alive = w.lease_alive();
        let candidate = stored.state.map_or(w.lease_id(), |st| st.lease);
        let mut new_handle = None;
        // A lease granted for this claim: revoked unless the claim succeeds.
        let mut granted = None;
        let mut ttl_changed = false;
        // A state key present names a live lease (it is attached to it),
        // and a recent one says with which TTL: no round trip to ask.
        let candidate_ttl = match stored.state {
            Some(st) => self.stored_lease(&st).await?,
            None => self.live_lease(candidate).await?,
        };
        let mut lease_ttl = want_ttl;
        let (lease, adopted) = match candidate_ttl {
            Some(granted) if granted == want_ttl => {
                if w.lease_id() != candidate || !own_lease_alive {
                    new_handle = Some(w.client.keep_alive(candidate, ttl(granted)).await?);
                }
                // Not needed: revoked now rather than at the claim's end.
                drop(speculative.take());
                (candidate, true)
            }
            other => {
                if let Some(granted) = other {
                    // The operator changed the TTL: the only handoff that
                    // re-puts the subtree. The old lease stays alive until
                    // every key is under the new one.
                    ttl_changed = true;
                    tracing::info!(peer = %self.region(), lease = %candidate, granted, want_ttl, "the live lease has another TTL; re-putting the subtree under a new lease");
                    self.prev_lease = Some(w.client.keep_alive(candidate, ttl(granted)).await?);
                }
                let unclaimed = match speculative.take() {
                    Some(early) => early.wait().await?,
                    None => Unclaimed::new(&w.client, w.client.lease_grant(ttl(want_ttl)).await?),
                };
                let grant = unclaimed.grant;
                tracing::info!(peer = %self.region(), lease = %grant.id, ttl = ?grant.ttl, "granted mirror lease");
                new_handle = Some(w.client.keep_alive(grant.id, grant.ttl).await?);
                lease_ttl = secs(grant.ttl);
                granted = Some(unclaimed);
                (grant.id, false)
            }
        };
        // What this engine's own last session on the peer left owing: a
        // change to the copy it saw and did not repair, or a gap in its
        // copy watch not yet verified. Its marks say so even when the
        // session ended before a state write could.
        let owed = !self.fresh && !self.writer.marks.synced.load(Relaxed);
        let resume = match stored.state {
            Some(st)
                if adopted
                    && st.lease == lease
                    && st.revision > 0
                    // A copy its writer left not synced (see `owed`, or a
                    // sync cut short) is re-synced: what it still owed is
                    // not in the key, and the next copy watch starts past
                    // the change that caused it.
                    && st.synced
                    && !owed
                    && source_changed.is_none()
                    && self.force_sync.is_none() =>
            {
                Some(st)
            }
            _ => None,
        };
        // A resumed copy may hold more than its state revision says (the
        // predecessor's txns in flight), at most what the source held now;
        // the live loop compares key counts only past this horizon.
        self.replay_horizon = resume.map_or(0, |_| source.revision);
        let sync = match resume {
            Some(st) => self.check_lag(st.revision, source.revision),
            None => Some(self.sync_reason(
                stored.state,
                adopted,
                source_changed.is_some(),
                ttl_changed,
                owed,
            )),
        };
        // What the copy is, as of this claim: a resumed copy keeps its
        // heartbeat and synced marker; anything else starts unsynced.
        let marks = &self.writer.marks;
        // A heartbeat from a clock ahead is of unknown age: not adopted
        // (the copy is not current until a probe says so).
        marks.adopt_heartbeat(resume.map_or(0, |st| st.heartbeat_unix_ms));
        if let Some(st) = resume.filter(|st| st.heartbeat_unix_ms > 0) {
            // The store's word on when this copy was last current.
            self.writer
                .stats
                .adopt_heartbeat(st.heartbeat_unix_ms, self.cfg.clock.unix_ms());
        }
        marks
            .synced
            .store(resume.is_some_and(|st| st.synced), Relaxed);
        let claimed = State {
            revision: resume.map_or(0, |st| st.revision),
            lease,
            lease_ttl,
            ..self.writer.state(0)
        };
        // Where the copy watch starts (`live/copy.rs`): for a resumed copy,
        // just past the predecessor's last write, so that a change made
        // while nobody watched is out of band; for a copy to be synced,
        // from this claim's read on (the sync compares what came before,
        // and a change during the sync is the watch's, which the sync opens
        // and keeps up with). Our own txns are booked from here on.
        //
        // A sync is pinned, its watches opened and its scans started beside
        // the claim's last txn, so the peer's first page comes back with
        // the claim rather than a round trip after it (`sync::pin` says
        // why that is safe once the state key is gone).
        let copy_from = if sync.is_none() && stored.create_revision != 0 {
            stored.mod_revision + 1
        } else {
            peer_header.revision + 1
        };
        let pin = sync.map(|_| self.pin_sync(copy_from, None));
        let w = &mut self.writer;
        if stored.create_revision != 0 && !state::release(&w.client, &w.state_key, &stored).await? {
            return Err(Error::ClaimRaced {
                peer: w.region.clone(),
            });
        }
        let pinning = async {
            match pin {
                Some(pin) => Some(pin.await),
                None => None,
            }
        };
        self.copy_from = copy_from;
        self.inherited = resume.is_some() && stored.state.is_some_and(|st| st.holder != w.holder);
        if self.cfg.copy_watch {
            w.own.arm(copy_from);
        }
        let (created, pinned) =
            tokio::join!(state::create(&w.client, &w.state_key, claimed), pinning);
        let start = match (sync, pinned) {
            (Some(reason), Some(Ok(pinned))) => Start::Sync(reason, Some(Box::new(pinned))),
            (Some(reason), failed) => {
                if let Some(Err(e)) = failed {
                    tracing::debug!(peer = %w.region, error = %e, "could not pin the sync beside the claim; pinning it after");
                }
                Start::Sync(reason, None)
            }
            (None, _) => Start::Resume(resume.map_or(0, |st| st.revision)),
        };
        match created? {
            Some(fence) => {
                // The claim holds the lease now: it is the mirror's.
                if let Some(lease) = granted {
                    lease.keep();
                }
                w.fence = fence;
                w.marks.lease_ttl.store(lease_ttl, Relaxed);
                if let Some(prev) = stored.state.filter(|s| s.holder != w.holder) {
                    tracing::info!(peer = %w.region, previous = format!("{:016x}", prev.holder), lease = %lease, adopted, "took over the peer");
                }
                Ok((new_handle, start))
            }
            // Not necessarily a rival: an aborted predecessor's txns in
            // flight still pass its fence and move the state key. The next
            // session reads it again.
            None => Err(Error::ClaimRaced {
                peer: w.region.clone(),
            }),
        }
    }

    /// Opens every connection to the peer in a task of the session's
    /// (`Store::open_connections`, warming them on an engine's first
    /// session), once per session; see `Peer::session`.
    fn open_connections(&mut self) {
        if let Some(warm) = self.open_pending.take() {
            let peer = self.writer.client.clone();
            self.opening
                .spawn(async move { peer.open_connections(warm).await });
        }
    }

    /// The id of the next lease this peer's claims choose: any id will do
    /// that no other lease on the peer has. The engine's holder is 64
    /// random bits, and each draw mixes in a count of its own (splitmix64),
    /// so ids differ between engines and between one engine's claims; a
    /// taken one fails the grant, and the claim is withdrawn.
    fn next_lease_id(&mut self) -> LeaseId {
        self.lease_draws += 1;
        let mut z = self
            .writer
            .holder
            .wrapping_add(self.lease_draws.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // Positive and never 0 (which asks the server to choose).
        LeaseId::new(((z & i64::MAX as u64) | 1) as i64)
    }

    /// Why a copy that is not resumed is synced: `stored` is the state key
    /// the claim found (`None`: none), `adopted` whether its lease was.
    fn sync_reason(
        &mut self,
        stored: Option<State>,
        adopted: bool,
        source_changed: bool,
        ttl_changed: bool,
        owed: bool,
    ) -> ResyncReason {
        match self.force_sync.take() {
            Some(reason) => reason,
            None if source_changed => ResyncReason::SourceChanged,
            None if ttl_changed => ResyncReason::LeaseTtl,
            // A sync of this engine's, or of a predecessor's, that never
            // completed (its claim still records no revision).
            None if self.sync_pending || stored.is_some_and(|st| st.revision == 0) => {
                ResyncReason::Interrupted
            }
            // The copy went with its lease: whatever it owed went too.
            None if !adopted && !self.fresh => ResyncReason::LeaseLost,
            // Left not synced: a change not repaired, a gap not verified.
            None if owed || stored.is_some_and(|st| adopted && !st.synced) => {
                ResyncReason::Interrupted
            }
            None if self.fresh => ResyncReason::Initial,
            // The state key was removed or replaced under this engine.
            None => ResyncReason::Fenced,
        }
    }

    /// The granted TTL of the lease a state key read from the peer names,
    /// if it is alive. The key is attached to that lease, so its presence
    /// proves the lease alive as of the read; a value that records the TTL
    /// (`ttl=`) answers without a round trip. One written before that field
    /// existed (an older engine, during a rolling upgrade) asks the peer.
    /// The lease may still run out just after the read: then the claim's
    /// compare-and-delete or its create txn fails, as they would after a
    /// query, and the next session reads the key again.
    async fn stored_lease(&self, st: &State) -> Result<Option<i64>> {
        if st.lease_ttl > 0 && !st.lease.is_none() {
            return Ok(Some(st.lease_ttl));
        }
        self.live_lease(st.lease).await
    }

    /// The granted TTL of `lease` if it is alive on the peer.
    async fn live_lease(&self, lease: LeaseId) -> Result<Option<i64>> {
        if lease.is_none() {
            return Ok(None);
        }
        let ttl = self.writer.client.lease_time_to_live(lease, false).await?;
        let alive = ttl.ttl.is_some_and(|t| !t.is_zero());
        Ok(alive.then_some(secs(ttl.granted_ttl).max(1)))
    }

    /// Resume through the watch (`None`) unless the source has moved on so
    /// far that a range diff is cheaper.
    fn check_lag(&self, revision: i64, source_revision: i64) -> Option<ResyncReason> {
        (source_revision - revision > self.cfg.resync_lag).then_some(ResyncReason::Lag)
    }
}

/// Why a copy stamped `st` cannot have come from the source `now`: another
/// cluster, or a revision the source has not reached (it went back).
fn source_mismatch(st: &State, now: &Header, source_id: u64) -> Option<String> {
    if st.source_id != 0 && source_id != 0 && st.source_id != source_id {
        return Some(format!(
            "source id is {source_id:016x}, the copy came from {:016x}",
            st.source_id
        ));
    }
    if st.source_cluster != 0 && st.source_cluster != now.cluster_id {
        return Some(format!(
            "source cluster id is {:016x}, the copy came from {:016x}",
            now.cluster_id, st.source_cluster
        ));
    }
    if now.revision < st.revision {
        return Some(format!(
            "source revision is {}, below the {} the copy is applied through",
            now.revision, st.revision
        ));
    }
    None
}

/// A lease granted for a claim that has not (yet) succeeded with it. Dropped
/// without [`Unclaimed::keep`] (the claim adopted another lease, failed, or
/// its session was cancelled), it revokes the lease in a task of its own:
/// nothing is attached to it but, at most, the state key of a claim whose
/// answer was lost, which the next session finds gone and claims again.
/// Left alone it would hold its id on the peer for a whole TTL.
struct Unclaimed {
    client: Store,
    grant: LeaseGrant,
    armed: bool,
}

/// A grant sent ahead of the claim's reads, in a task of its own so that a
/// cancelled session cannot lose it in flight: the lease reaches this
/// receiver as an [`Unclaimed`], so whoever drops it (the task when the
/// receiver is gone, or the receiver) revokes it.
struct Speculative(tokio::sync::oneshot::Receiver<etcd::Result<Unclaimed>>);

impl Unclaimed {
    fn new(client: &Store, grant: LeaseGrant) -> Unclaimed {
        Unclaimed {
            client: client.clone(),
            grant,
            armed: true,
        }
    }

    /// Grants a lease of `ttl` seconds with id `id` now, in the
    /// background. Its request is queued on the connection before this
    /// returns, so a request the caller sends next on the same connection
    /// ([`Store::in_order`]) goes after it.
    fn grant(client: &Store, id: LeaseId, ttl: i64) -> Speculative {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let client = client.clone();
        let mut grant = Box::pin(async move {
            let granted = client
                .lease_grant_with_id(id, self::ttl(ttl))
                .await
                .map(|g| Unclaimed::new(&client, g));
            // A receiver gone drops (and so revokes) the lease here.
            let _ = tx.send(granted);
        });
        // Polled once here rather than first by the task, which the
        // runtime may run only after the caller's next request: the first
        // poll hands the request to the connection. The task polls it
        // again with its own waker, as every future allows.
        let mut cx = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
        if grant.as_mut().poll(&mut cx).is_pending() {
            tokio::spawn(grant);
        }
        Speculative(rx)
    }

    /// The claim succeeded with this lease: it is not revoked.
    fn keep(mut self) {
        self.armed = false;
    }
}

impl Speculative {
    /// A grant that has answered already.
    fn ready(granted: Unclaimed) -> Speculative {
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The receiver is right here: the send cannot fail.
        let _ = tx.send(Ok(granted));
        Speculative(rx)
    }

    async fn wait(self) -> Result<Unclaimed> {
        match self.0.await {
            Ok(granted) => Ok(granted?),
            // The grant's task cannot end without sending unless the
            // runtime is shutting down.
            Err(_) => Err(Error::Etcd(etcd::Error::Closed)),
        }
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime left to send it: the lease runs out by its TTL.
            return;
        };
        let (client, id) = (self.client.clone(), self.grant.id);
        rt.spawn(async move {
            match client.lease_revoke(id).await {
                Ok(()) => tracing::debug!(lease = %id, "revoked a lease no claim used"),
                Err(e) => {
                    tracing::info!(lease = %id, error = %e, "could not revoke a lease no claim used; it runs out by its TTL")
                }
            }
        });
    }
}

/// A TTL in the engine's whole seconds (its config, the state key) as the
/// client takes it; at least one second, as etcd grants.
fn ttl(secs: i64) -> Duration {
    Duration::from_secs(secs.max(1) as u64)
}

/// A TTL from the client in the engine's whole seconds.
fn secs(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::Duration;

    use aether_etcd::model::ModelConfig;

    use super::super::fixture::{
        HOLDER, NOW_MS, Rig, SOURCE_CLUSTER, SOURCE_ID, TTL, predecessor, rig,
    };
    use super::*;
    use crate::mirror::config::MirrorConfig;

    /// The re-sync a claim asked for; `None` for a resume.
    fn resync(start: &Start) -> Option<ResyncReason> {
        match start {
            Start::Sync(reason, _) => Some(*reason),
            Start::Resume(_) => None,
        }
    }

    fn resumed(start: &Start) -> Option<i64> {
        match start {
            Start::Resume(revision) => Some(*revision),
            Start::Sync(..) => None,
        }
    }

    /// Claims a peer that holds `st` under a live lease of `TTL`, the
    /// source 6 revisions on; returns the claim and the lease.
    async fn claim_over(
        st: impl FnOnce(LeaseId) -> State,
        cfg: impl FnOnce(MirrorConfig) -> MirrorConfig,
    ) -> (Result<(Option<Box<dyn Lease>>, Start)>, LeaseId, Rig, Peer) {
        let (mut peer, rig) = rig(cfg, ModelConfig::default());
        rig.write_source(6).await;
        let lease = rig.grant(TTL).await;
        rig.put_state(st(lease)).await;
        let claimed = peer.claim().await;
        (claimed, lease, rig, peer)
    }

    /// A fresh engine claims a peer without a state key in one txn, which
    /// also reads the copy's first page: no read of the state key before
    /// it, no read of the copy after it (on a long link, each a round trip).
    #[tokio::test(start_paused = true)]
    async fn a_fresh_engine_with_no_state_key_grants_a_lease_and_syncs_initial() {
        let (mut peer, rig) = rig(|c| c, ModelConfig::default());
        let (handle, start) = peer.claim().await.unwrap();
        let handle = handle.expect("a lease granted");
        assert_eq!(resync(&start), Some(ResyncReason::Initial));
        assert!(
            matches!(start, Start::Sync(_, Some(_))),
            "the sync is pinned, its first page read"
        );
        assert_eq!(
            rig.peer_ranges.load(SeqCst),
            0,
            "nothing read but in the claim's txn"
        );
        let st = rig.state().await.expect("claimed");
        assert_eq!(st.holder, HOLDER);
        assert_eq!(st.lease, handle.id());
        assert_eq!((st.revision, st.synced), (0, false));
        assert_eq!(st.lease_ttl, TTL.as_secs() as i64);
        assert_eq!(
            (st.source_id, st.source_cluster),
            (SOURCE_ID, SOURCE_CLUSTER)
        );
        assert_eq!(rig.leases().await, vec![handle.id()]);
    }

    /// The lease granted beside the reads is not needed: it is revoked, and
    /// the predecessor's heartbeat is written back as the copy's age.
    #[tokio::test(start_paused = true)]
    async fn a_live_synced_state_key_of_the_same_source_is_adopted_and_resumed() {
        let (claimed, lease, rig, _peer) = claim_over(|l| predecessor(6, l), |c| c).await;
        let (handle, start) = claimed.unwrap();
        assert_eq!(resumed(&start), Some(6));
        assert_eq!(
            handle.expect("a keep-alive on the adopted lease").id(),
            lease
        );
        assert_eq!(rig.leases().await, vec![lease]);
        let st = rig.state().await.expect("claimed");
        assert_eq!(
            (st.holder, st.lease, st.revision, st.synced),
            (HOLDER, lease, 6, true)
        );
        assert_eq!(st.heartbeat_unix_ms, NOW_MS - 2_000);
    }

    #[tokio::test(start_paused = true)]
    async fn a_state_key_at_revision_0_resyncs_interrupted_on_the_adopted_lease() {
        let (claimed, lease, rig, _peer) = claim_over(|l| predecessor(0, l), |c| c).await;
        let (handle, start) = claimed.unwrap();
        assert_eq!(resync(&start), Some(ResyncReason::Interrupted));
        assert_eq!(handle.unwrap().id(), lease);
        let st = rig.state().await.unwrap();
        assert_eq!((st.holder, st.revision, st.synced), (HOLDER, 0, false));
    }

    #[tokio::test(start_paused = true)]
    async fn a_state_key_its_writer_left_not_synced_resyncs_interrupted() {
        let unsynced = |l| State {
            synced: false,
            ..predecessor(6, l)
        };
        let (claimed, _, rig, _peer) = claim_over(unsynced, |c| c).await;
        assert_eq!(resync(&claimed.unwrap().1), Some(ResyncReason::Interrupted));
        assert_eq!(rig.state().await.unwrap().revision, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_source_of_another_cluster_resyncs_source_changed() {
        let other = |l| State {
            source_cluster: 0x99,
            ..predecessor(6, l)
        };
        let (claimed, _, _rig, peer) = claim_over(other, |c| c).await;
        assert_eq!(
            resync(&claimed.unwrap().1),
            Some(ResyncReason::SourceChanged)
        );
        assert_eq!(peer.stats().errors(ErrorKind::Identity), 1);
    }

    /// The source went back (restored from a snapshot): the copy holds
    /// revisions the source no longer has.
    #[tokio::test(start_paused = true)]
    async fn a_source_revision_below_the_state_keys_resyncs_source_changed() {
        let (claimed, _, _rig, peer) = claim_over(|l| predecessor(100, l), |c| c).await;
        assert_eq!(
            resync(&claimed.unwrap().1),
            Some(ResyncReason::SourceChanged)
        );
        assert_eq!(peer.stats().errors(ErrorKind::Identity), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_copy_lagging_more_than_resync_lag_resyncs_lag() {
        let lagging = |c| MirrorConfig { resync_lag: 3, ..c };
        let (claimed, lease, _rig, _peer) = claim_over(|l| predecessor(1, l), lagging).await;
        let (handle, start) = claimed.unwrap();
        assert_eq!(resync(&start), Some(ResyncReason::Lag));
        // Lag is no reason to give the lease up.
        assert_eq!(handle.unwrap().id(), lease);
    }

    #[tokio::test(start_paused = true)]
    async fn a_live_lease_of_another_ttl_is_kept_until_a_resync_reputs_the_subtree() {
        let longer = |l| State {
            lease_ttl: 30,
            ..predecessor(6, l)
        };
        let (claimed, lease, rig, peer) = claim_over(longer, |c| c).await;
        let (handle, start) = claimed.unwrap();
        assert_eq!(resync(&start), Some(ResyncReason::LeaseTtl));
        let ours = handle.unwrap().id();
        assert_ne!(ours, lease);
        assert_eq!(peer.prev_lease.as_ref().map(|l| l.id()), Some(lease));
        let st = rig.state().await.unwrap();
        assert_eq!((st.lease, st.lease_ttl), (ours, TTL.as_secs() as i64));
    }

    /// The claim refuses before it writes anything, and the lease it
    /// granted beside its reads is revoked.
    #[tokio::test(start_paused = true)]
    async fn a_state_key_of_another_source_under_a_live_lease_is_a_conflict() {
        let theirs = |l| State {
            source_id: 0x77,
            ..predecessor(6, l)
        };
        let (claimed, lease, rig, _peer) = claim_over(theirs, |c| c).await;
        let err = claimed.err().expect("refused");
        assert!(
            matches!(err, Error::Conflict { other: 0x77, .. }),
            "{err:?}"
        );
        assert_eq!(rig.state().await.unwrap().holder, 7);
        assert_eq!(rig.leases().await, vec![lease]);
    }

    /// A predecessor whose txns were in flight moved the state key between
    /// the claim's read and its compare-and-delete.
    #[tokio::test(start_paused = true)]
    async fn a_claim_whose_compare_and_delete_loses_to_another_write_is_claim_raced() {
        let latency = Duration::from_millis(20);
        let (mut peer, rig) = rig(|c| c, ModelConfig::default().with_latency(latency));
        let lease = rig.grant(TTL).await;
        rig.put_state(predecessor(0, lease)).await;
        let moved = predecessor(1, lease);
        // Sent after the claim's read, it lands before its delete.
        let (claimed, ()) = tokio::join!(peer.claim(), async {
            tokio::time::sleep(latency / 2).await;
            rig.put_state(moved).await;
        });
        let err = claimed.err().expect("raced");
        assert!(matches!(err, Error::ClaimRaced { .. }), "{err:?}");
        assert_eq!(rig.state().await, Some(moved));
    }

    /// The `Unclaimed` guard: a lease granted for a claim that then fails
    /// would otherwise hold its id on the peer for a whole TTL. The peer
    /// holds a dead claim (no lease), so after the one-txn claim has read
    /// it (one latency; its grant lands then too) the claim takes its
    /// usual steps, and a rival's write lands before the first of them.
    #[tokio::test(start_paused = true)]
    async fn a_lease_granted_for_a_claim_that_then_fails_is_revoked() {
        let latency = Duration::from_millis(20);
        let (mut peer, rig) = rig(|c| c, ModelConfig::default().with_latency(latency));
        let rival = predecessor(0, LeaseId::NONE);
        rig.put_state(rival).await;
        let (claimed, ()) = tokio::join!(peer.claim(), async {
            tokio::time::sleep(latency * 3 / 2).await;
            rig.put_state(rival).await;
        });
        let err = claimed.err().expect("raced");
        assert!(matches!(err, Error::ClaimRaced { .. }), "{err:?}");
        assert_eq!(rig.state().await, Some(rival));
        assert_eq!(rig.leases().await, Vec::<LeaseId>::new());
    }

    /// The one-txn claim reached etcd before the grant of its lease and
    /// was refused as a whole: it is sent again once the grant has
    /// answered, and makes the claim then, still without reading the state
    /// key or the copy on their own.
    #[tokio::test(start_paused = true)]
    async fn a_claim_that_reaches_the_peer_before_its_lease_is_sent_again_after_the_grant() {
        let (mut peer, rig) = rig(|c| c, ModelConfig::default());
        *rig.grant_delay.lock().unwrap() = Duration::from_secs(1);
        let began = tokio::time::Instant::now();
        let (handle, start) = peer.claim().await.unwrap();
        assert!(
            began.elapsed() >= Duration::from_secs(1),
            "claimed after {:?}, before the grant went",
            began.elapsed()
        );
        let handle = handle.expect("a lease granted");
        assert_eq!(resync(&start), Some(ResyncReason::Initial));
        assert!(
            matches!(start, Start::Sync(_, Some(_))),
            "the sync is pinned, its first page read by the claim"
        );
        assert_eq!(
            rig.peer_ranges.load(SeqCst),
            0,
            "nothing read but in the claim's txns"
        );
        let st = rig.state().await.expect("claimed");
        assert_eq!((st.holder, st.lease), (HOLDER, handle.id()));
        assert_eq!(rig.leases().await, vec![handle.id()]);
    }

    /// The id the claim chose names a lease someone else holds: the grant
    /// fails, and the claim, which etcd attached to that lease, is
    /// withdrawn rather than left to live and die with another's lease.
    #[tokio::test(start_paused = true)]
    async fn a_claim_on_a_lease_id_another_holds_is_withdrawn() {
        let (mut peer, rig) = rig(|c| c, ModelConfig::default());
        let id = peer.next_lease_id();
        peer.lease_draws = 0;
        rig.peer.lease_grant_with_id(id, TTL).await.unwrap();
        let err = peer.claim().await.err().expect("the grant fails");
        assert!(
            matches!(err, Error::Etcd(etcd::Error::LeaseExists)),
            "{err:?}"
        );
        assert_eq!(rig.state().await, None);
        assert_eq!(rig.leases().await, vec![id], "the other's lease untouched");
    }

    /// A heartbeat in this clock's future is of unknown age: the claim
    /// writes the copy as never current rather than as current now.
    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_stored_from_a_clock_ahead_is_not_adopted() {
        let ahead = |l| State {
            heartbeat_unix_ms: NOW_MS + 3_600_000,
            ..predecessor(6, l)
        };
        let (claimed, _, rig, peer) = claim_over(ahead, |c| c).await;
        assert_eq!(resumed(&claimed.unwrap().1), Some(6));
        assert_eq!(rig.state().await.unwrap().heartbeat_unix_ms, 0);
        assert_eq!(peer.writer.marks.heartbeat_unix_ms(), 0);
    }

    /// What a session's error handling leaves for the next claim wins over
    /// a copy that could otherwise be resumed.
    #[tokio::test(start_paused = true)]
    async fn a_forced_resync_overrides_an_adoptable_copy_with_its_reason() {
        for reason in [
            ResyncReason::SourceChanged,
            ResyncReason::PeerChanged,
            ResyncReason::CopyChanged,
            ResyncReason::Stale,
        ] {
            let (mut peer, rig) = rig(|c| c, ModelConfig::default());
            rig.write_source(6).await;
            let lease = rig.grant(TTL).await;
            rig.put_state(predecessor(6, lease)).await;
            peer.force_sync = Some(reason);
            let (_, start) = peer.claim().await.unwrap();
            assert_eq!(resync(&start), Some(reason));
            assert_eq!(peer.force_sync, None, "taken by the claim");
        }
    }

    /// After a session that dropped the lease (it was lost), the copy went
    /// with it: nothing to adopt, and not a first sync either.
    #[tokio::test(start_paused = true)]
    async fn a_claim_after_the_lease_was_dropped_resyncs_lease_lost() {
        let (mut peer, rig) = rig(|c| c, ModelConfig::default());
        peer.fresh = false;
        let (handle, start) = peer.claim().await.unwrap();
        assert_eq!(resync(&start), Some(ResyncReason::LeaseLost));
        assert_eq!(rig.state().await.unwrap().lease, handle.unwrap().id());
    }
}
