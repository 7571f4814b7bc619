//! Whether a peer's copy is current: the one place that decides it.
//!
//! The live loop feeds [`Freshness`] what happens (a watch message, a
//! probe sent and read back, a txn under the watermark) and asks it
//! [`Freshness::decide`]; nothing else in the engine marks a copy current.
//! What it decides reaches the outside in two ways: the peer's stats
//! (`peer_staleness_seconds`, on the monotonic clock) and the heartbeat in
//! the state key, which consumers read by [`State::staleness_at`]'s rule.
//!
//! # The rule
//! Every heartbeat a *probe* reads the source's revision S (and the
//! member that served it) at the instant T it is sent. The copy is
//! **current as of T** once all four hold:
//! 1. **everything through S is received and applied**: the watermark
//!    reached S; or the watch stream itself vouches that nothing in the
//!    subtree lies between the watermark and S — nothing pending, no
//!    message since T, the stream connected throughout to the very member
//!    that served S, and quiet for [`QUIET`] (a caught-up watcher gets its
//!    events as they commit, a catching-up one every ~100 ms). A read
//!    served by another member says nothing about this stream: a watch on
//!    a member that lags could still deliver events below S.
//! 2. **the copy checked out**: its key count on the peer matched the
//!    source's at the watermark, by this probe or by the session's last
//!    count, which matched (a mismatch ends the session:
//!    `Error::CopyChanged`, unless the copy watch has seen a change not
//!    ours since the probe was sent, or one waits for repair: that change
//!    explains the mismatch and its repair is under way, so the count says
//!    nothing and the next probe counts again). Counts come at the
//!    session's start, then as a backstop to the copy watch
//!    (`count::Cadence`); a backstop count due while neither watch has
//!    delivered anything since the last match stands on that match, since
//!    both sides are as it found them (at most five in a row).
//! 3. **its lease has at least a heartbeat left** (or a third of its TTL,
//!    if that is less: keep-alives go every third of it, so a healthy
//!    lease never has less; a heartbeat longer than that would otherwise
//!    fail healthy copies): a copy whose lease may lapse before the next
//!    probe is not vouched for.
//! 4. **no out-of-band change waits for repair**: the copy watch
//!    (`live/copy.rs`) saw every change on the copy that was not ours, and
//!    each was repaired; a change drops the probe in hand (sent before it,
//!    it vouches for nothing), and none is taken until then. An event the
//!    copy watch holds unjudged (a txn of ours in flight when it arrived
//!    may yet explain it) at or below the peer revision the probe read
//!    (any such event, if the probe did not read the peer: a txn's answer
//!    since the last probe vouched for the peer, see `live/probe.rs`)
//!    holds the probe until it is judged: it may be the change. A copy
//!    watch the peer compacted past missed part of the copy's history: an
//!    edit in that gap only a comparison of every value can see (a count
//!    sees a delete or a stray key, not an edit), so after a gap only a
//!    verification pass begun after it lets the copy be current again. A
//!    copy resumed from another engine starts with such a gap: what that
//!    engine's copy watch saw and had not repaired lies before ours.
//!
//! ```text
//!                  probe sent at T          read back: S, member, count
//!   ┌───────┐  ─────────────────────►  ┌────────────┐ ─────────────────┐
//!   │ none  │                          │  in flight │                  │
//!   └───────┘  ◄──────────────┐        └────────────┘                  ▼
//!       ▲        current as of T                       ┌──────────────────────┐
//!       │        (rules 1 to 4)                        │ pending (S, counted) │
//!       │                     └─────────────────────── └──────────────────────┘
//!       │                                                 │        │
//!       │  rule 1 met, 2, 3 or 4 not: no mark,            │        │ count
//!       └──────────────── probe dropped ──────────────────┘        │ mismatch
//!                                                                  ▼
//!                                          CopyChanged: re-sync (in the session, once)
//! ```
//! A pending probe keeps its place until its quiet period is over (a busy
//! stream would never have one otherwise); after that the next probe may
//! replace it. **Lapsed** is not decided here: a lease the peer reports
//! gone ends the session (`Error::LeaseLost`), and the copy expires there.

use std::time::Duration;
use tokio::time::Instant;

use crate::mirror::count::{Cadence, Positions};
#[cfg(doc)]
use crate::mirror::state::State;

/// How long the watch must stay quiet, with nothing pending, after a probe
/// read the source's revision on the watch's own member, before that
/// revision counts as received. etcd hands a caught-up watcher its events
/// as they commit, and a catching-up one every ~100 ms, so ten of those
/// cycles of silence are a wide margin.
pub(crate) const QUIET: Duration = Duration::from_secs(1);

/// What is known about one session's copy, for deciding whether it is
/// current (see the module doc).
#[derive(Debug)]
pub(crate) struct Freshness {
    /// The lease time left below which a copy is not current (rule 3).
    lease_margin: Duration,
    /// Key counts are compared only once the watermark is past this (see
    /// `Peer::replay_horizon`).
    replay_horizon: i64,
    /// Watch messages received so far.
    received: u64,
    /// The last probe read back and not yet settled.
    pending: Option<Probe>,
    /// Which probes count the copy.
    cadence: Cadence,
    /// Keys the copy watch found changed out of band and not yet repaired.
    out_of_band: bool,
    /// Out-of-band changes the copy watch has seen in the session.
    changes_seen: u64,
    /// The copy watch missed part of the copy's history (rule 4).
    gap: Gap,
    /// Where the two watches stand (`None`: the copy is not watched).
    positions: Option<Positions>,
}

/// Whether a gap in the copy watch's history waits for a verification pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Gap {
    #[default]
    None,
    /// No pass begun since.
    Open,
    /// A pass begun since is running.
    Covering,
}

/// A probe as sent: what the loop knew at that instant.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sent {
    pub(crate) at: Instant,
    /// Watch messages received when it was sent.
    received: u64,
    /// The watch stream's reconnects when it was sent.
    reconnects: u64,
    /// Ops of the txns not yet under the watermark when it was sent: what
    /// the peer may hold beyond the watermark, with what is sent until it
    /// comes back.
    pub(crate) unsettled_from: u64,
    /// Ops already applied of a revision above the watermark when it was
    /// sent (a split revision's first parts).
    ahead: u64,
    /// Whether it counts the copy.
    pub(crate) counting: bool,
    /// Out-of-band changes seen when it was sent.
    changes_seen: u64,
    /// Where the two watches stood when it was sent.
    positions: Option<Positions>,
}

/// What a probe read back, as far as freshness is concerned.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Read {
    /// The source's revision.
    pub(crate) source_revision: i64,
    /// The member that served it.
    pub(crate) source_member: u64,
    /// The peer's revision when the copy was read (`i64::MAX`: the probe
    /// did not read the peer).
    pub(crate) peer_revision: i64,
    /// The watermark when the probe was sent, before the source was read.
    pub(crate) applied: i64,
    /// The source's key count at `applied`, and the copy's on the peer
    /// (`None`: this probe did not count, or the source's was compacted).
    pub(crate) counts: Option<(i64, i64)>,
    /// Keys absent on the peer by design (too large for it).
    pub(crate) oversized: i64,
    /// Ops launched in the session by the time it came back.
    pub(crate) launched_ops: u64,
}

#[derive(Clone, Copy, Debug)]
struct Probe {
    sent: Sent,
    source_revision: i64,
    source_member: u64,
    peer_revision: i64,
    /// The copy's count matched, by this probe or the session's last.
    checked: bool,
    /// Its quiet period passed without making it current: only the
    /// watermark can still settle it, and the next probe may replace it.
    quiet_done: bool,
}

/// What the live loop sees of the copy and its watch when it asks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Now {
    pub(crate) at: Instant,
    /// The contiguous watermark: every revision through it is on the peer.
    pub(crate) watermark: i64,
    /// Nothing received is waiting to be sent or acknowledged.
    pub(crate) nothing_pending: bool,
    /// The watch stream: connected, its member, its reconnects so far.
    pub(crate) connected: bool,
    pub(crate) watch_member: Option<u64>,
    pub(crate) reconnects: u64,
    /// Time left on the copy's lease, by its last keep-alive.
    pub(crate) lease_left: Duration,
    /// The lowest revision of an event the copy watch holds unjudged.
    pub(crate) unjudged_from: Option<i64>,
}

/// What [`Freshness::decide`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The watch vouched that nothing lies between the watermark and this
    /// revision: the watermark may move there.
    pub(crate) idle_through: Option<i64>,
    /// The copy is current as of this instant.
    pub(crate) current_at: Option<Instant>,
}

impl Freshness {
    /// `recount`: the backstop count's interval while the copy watch
    /// follows the copy (zero: by the subtree's size alone).
    pub(crate) fn new(
        heartbeat: Duration,
        lease_ttl: Duration,
        replay_horizon: i64,
        recount: Duration,
    ) -> Freshness {
        let gap = recount.as_millis() / heartbeat.as_millis().max(1);
        Freshness {
            lease_margin: heartbeat.min(lease_ttl / 3),
            replay_horizon,
            received: 0,
            pending: None,
            cadence: Cadence::new(u64::try_from(gap).unwrap_or(u64::MAX)),
            out_of_band: false,
            changes_seen: 0,
            gap: Gap::None,
            positions: None,
        }
    }

    /// The copy watch missed part of the copy's history (the peer
    /// compacted past it): not current until a verification pass begun
    /// from now on has compared every value. The next probe counts too.
    pub(crate) fn gap(&mut self) {
        self.gap = Gap::Open;
        self.pending = None;
        self.cadence.recount();
    }

    /// Whether a gap in the copy watch's history waits for a pass.
    pub(crate) fn gap_open(&self) -> bool {
        self.gap != Gap::None
    }

    /// Whether a gap waits for a pass to begin.
    pub(crate) fn needs_pass(&self) -> bool {
        self.gap == Gap::Open
    }

    /// A verification pass begins.
    pub(crate) fn pass_started(&mut self) {
        if self.gap == Gap::Open {
            self.gap = Gap::Covering;
        }
    }

    /// A verification pass ended: completed (every value compared and
    /// repaired), or not. Whether it closed a gap.
    pub(crate) fn pass_ended(&mut self, completed: bool) -> bool {
        if self.gap != Gap::Covering {
            return false;
        }
        self.gap = if completed { Gap::None } else { Gap::Open };
        completed
    }

    /// The copy watch saw a change that was not ours: the copy is not
    /// current from now until [`Freshness::repaired`], and the probe in
    /// hand, sent before it, vouches for nothing.
    pub(crate) fn out_of_band(&mut self) {
        self.out_of_band = true;
        self.changes_seen += 1;
        self.pending = None;
    }

    /// Every key changed out of band was compared with the source and
    /// repaired.
    pub(crate) fn repaired(&mut self) {
        self.out_of_band = false;
    }

    /// Whether keys changed out of band wait for repair.
    pub(crate) fn is_out_of_band(&self) -> bool {
        self.out_of_band
    }

    /// Where the two watches stand now: the next probe's count is skipped
    /// if they stand where they stood at the last count that matched
    /// (`count::Cadence`).
    pub(crate) fn watched(&mut self, at: Option<Positions>) {
        self.positions = at;
    }

    /// A watch message arrived (events or a progress notice).
    pub(crate) fn received(&mut self) {
        self.received += 1;
    }

    /// A probe goes out now; whether it counts the copy is decided here.
    pub(crate) fn send(
        &self,
        at: Instant,
        reconnects: u64,
        unsettled_from: u64,
        ahead: u64,
    ) -> Sent {
        Sent {
            at,
            received: self.received,
            reconnects,
            unsettled_from,
            ahead,
            counting: self.cadence.due(self.positions),
            positions: self.positions,
            changes_seen: self.changes_seen,
        }
    }

    /// A probe came back. Checks the copy's count against the source's: a
    /// copy emptied or grown out of band (`del --prefix`, a revoked lease,
    /// keys written by hand) is `CopyChanged`. The txns in flight, and
    /// those sent while the probe was out, may have moved the peer by at
    /// most their ops; keys too large for the peer are absent there by
    /// design.
    pub(crate) fn probed(&mut self, sent: Sent, read: Read) -> Result<(), String> {
        let counts = read.counts.filter(|_| read.applied >= self.replay_horizon);
        let checked = match counts {
            Some((source, peer)) => {
                let expected = source - read.oversized;
                // Only while they exist: a tolerance kept after a split
                // revision is whole would let a copy short of that many
                // keys read fresh.
                let slack =
                    (read.launched_ops.saturating_sub(sent.unsettled_from) + sent.ahead) as i64;
                if (peer - expected).abs() > slack {
                    if self.out_of_band || self.changes_seen > sent.changes_seen {
                        // A change the copy watch saw explains it, and is
                        // (being) repaired key by key: a re-sync of the
                        // whole copy for it would be the wrong tool (one
                        // stray key put just after a 1M-key sync cost 11 s
                        // of re-sync). The probe vouches for nothing; the
                        // next one counts.
                        self.cadence.recount();
                        return Ok(());
                    }
                    return Err(format!(
                        "it holds {peer} keys, the source held {source} at revision {} ({} of them too large for the peer, {slack} ops in flight)",
                        read.applied, read.oversized
                    ));
                }
                self.cadence.matched(source, sent.positions);
                true
            }
            // A probe that could not count (a resumed copy still replaying
            // the predecessor's tail, or a compacted watermark) may still
            // move an idle watermark, but marks the copy current only on
            // the strength of the session's last count: a new leader that
            // adopted a copy emptied out of band would otherwise report it
            // fresh before counting it.
            None if sent.counting => false,
            None => self.cadence.skipped(),
        };
        // A probe sent before an out-of-band change vouches for nothing.
        if self.pending.is_none_or(|p| p.quiet_done) && !self.out_of_band {
            self.pending = Some(Probe {
                sent,
                source_revision: read.source_revision,
                source_member: read.source_member,
                peer_revision: read.peer_revision,
                checked,
                quiet_done: false,
            });
        }
        Ok(())
    }

    /// When the pending probe's quiet period ends, if it has one to wait.
    pub(crate) fn quiet_at(&self) -> Option<Instant> {
        self.pending
            .filter(|p| !p.quiet_done)
            .map(|p| p.sent.at + QUIET)
    }

    /// The pending probe's quiet period has passed (after a `decide`).
    pub(crate) fn quiet_passed(&mut self) {
        if let Some(p) = self.pending.as_mut() {
            p.quiet_done = true;
        }
    }

    /// Whether the pending probe settles now, and how (the module doc's
    /// rule).
    pub(crate) fn decide(&mut self, now: Now) -> Decision {
        let Some(p) = self.pending else {
            return Decision::default();
        };
        // Rule 4: a change on the copy the probe saw may be among the
        // events not yet judged.
        if now.unjudged_from.is_some_and(|r| r <= p.peer_revision) {
            return Decision::default();
        }
        let applied = now.watermark >= p.source_revision;
        let vouched = !applied
            && now.nothing_pending
            && self.received == p.sent.received
            && now.connected
            && now.reconnects == p.sent.reconnects
            && now.watch_member == Some(p.source_member)
            && now.at.saturating_duration_since(p.sent.at) >= QUIET;
        if !applied && !vouched {
            return Decision::default();
        }
        self.pending = None;
        Decision {
            idle_through: vouched.then_some(p.source_revision),
            current_at: (p.checked
                && now.lease_left >= self.lease_margin
                && !self.out_of_band
                && self.gap == Gap::None)
                .then_some(p.sent.at),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HB: Duration = Duration::from_secs(5);
    const TTL: Duration = Duration::from_secs(30);
    const MEMBER: u64 = 7;

    fn read(source_revision: i64, counts: Option<(i64, i64)>) -> Read {
        Read {
            source_revision,
            source_member: MEMBER,
            peer_revision: 50,
            applied: 10,
            counts,
            oversized: 0,
            launched_ops: 0,
        }
    }

    fn now(t0: Instant, after: Duration, watermark: i64) -> Now {
        Now {
            at: t0 + after,
            watermark,
            nothing_pending: true,
            connected: true,
            watch_member: Some(MEMBER),
            reconnects: 0,
            lease_left: Duration::from_secs(30),
            unjudged_from: None,
        }
    }

    /// A session whose first probe (counting) came back at revision 20.
    fn probed(f: &mut Freshness, t0: Instant, counts: Option<(i64, i64)>) -> Sent {
        let sent = f.send(t0, 0, 0, 0);
        assert!(sent.counting);
        f.probed(sent, read(20, counts)).unwrap();
        sent
    }

    #[test]
    fn current_once_the_watermark_reaches_the_probed_revision() {
        let t0 = Instant::now();
        let mut f = Freshness::new(HB, TTL, 0, Duration::ZERO);
        probed(&mut f, t0, Some((100, 100)));
        assert_eq!(f.decide(now(t0, Duration::ZERO, 19)), Decision::default());
        let d = f.decide(now(t0, Duration::ZERO, 20));
        assert_eq!(d.current_at, Some(t0));
        assert_eq!(d.idle_through, None);
        // Settled: nothing more to decide until the next probe.
        assert_eq!(f.decide(now(t0, HB, 30)), Decision::default());
    }

    #[test]
    fn not_current_until_the_copy_has_been_counted() {
        let t0 = Instant::now();
        let mut f = Freshness::new(HB, TTL, 0, Duration::ZERO);
        // The first probe could not count (compacted): it settles without
        // a mark.
        probed(&mut f, t0, None);
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)).current_at, None);
        // Once a count matched, probes in between stand on it.
        probed(&mut f, t0, Some((100, 100)));
        assert!(f.decide(now(t0, Duration::ZERO, 20)).current_at.is_some());
    }

    #[test]
    fn a_count_that_does_not_match_is_a_changed_copy() {
        let mut f = Freshness::new(HB, TTL, 0, Duration::ZERO);
        let sent = f.send(Instant::now(), 0, 0, 0);
        let why = f.probed(sent, read(20, Some((100, 99)))).unwrap_err();
        assert!(why.contains("holds 99 keys"), "{why}");
        // Ops in flight since the probe was sent excuse that many.
        let sent = f.send(Instant::now(), 0, 5, 0);
        let r = Read {
            launched_ops: 6,
            ..read(20, Some((100, 99)))
        };
        f.probed(sent, r).unwrap();
        // A count taken before the resumed copy's replay is over says
        // nothing either way.
        let mut f = Freshness::new(HB, TTL, 50, Duration::ZERO);
        let sent = f.send(Instant::now(), 0, 0, 0);
        f.probed(sent, read(20, Some((100, 0)))).unwrap();
    }

    #[test]
    fn a_copy_whose_lease_has_less_than_a_heartbeat_left_is_not_current() {
        let t0 = Instant::now();
        let mut f = Freshness::new(HB, TTL, 0, Duration::ZERO);
        probed(&mut f, t0, Some((100, 100)));
        let lapsing = Now {
            lease_left: HB - Duration::from_millis(1),
            ..now(t0, Duration::ZERO, 20)
        };
        assert_eq!(f.decide(lapsing).current_at, None);
        probed(&mut f, t0, Some((100, 100)));
        let kept = Now {
            lease_left: HB,
            ..now(t0, Duration::ZERO, 20)
        };
        assert_eq!(f.decide(kept).current_at, Some(t0));
        // A heartbeat longer than the keep-alive period: a third of the
        // TTL is the margin, or a healthy lease would fail the rule.
        let mut f = Freshness::new(HB, Duration::from_secs(6), 0, Duration::ZERO);
        probed(&mut f, t0, Some((100, 100)));
        let healthy = Now {
            lease_left: Duration::from_secs(4),
            ..now(t0, Duration::ZERO, 20)
        };
        assert_eq!(f.decide(healthy).current_at, Some(t0));
        probed(&mut f, t0, Some((100, 100)));
        let lapsing = Now {
            lease_left: Duration::from_millis(1999),
            ..now(t0, Duration::ZERO, 20)
        };
        assert_eq!(f.decide(lapsing).current_at, None);
    }

    #[test]
    fn an_idle_watch_vouches_only_for_its_own_members_revision() {
        let t0 = Instant::now();
        let mut f = Freshness::new(HB, TTL, 0, Duration::ZERO);
        probed(&mut f, t0, Some((100, 100)));
        // Not yet quiet long enough.
        assert_eq!(f.decide(now(t0, QUIET / 2, 10)), Decision::default());
        // The probe read another member than the watch's: a lagging
        // member could still deliver events below it.
        let other = Now {
            watch_member: Some(MEMBER + 1),
            ..now(t0, QUIET, 10)
        };
        assert_eq!(f.decide(other), Decision::default());
        // Nor after the stream reconnected, nor while it is down.
        let reconnected = Now {
            reconnects: 1,
            ..now(t0, QUIET, 10)
        };
        assert_eq!(f.decide(reconnected), Decision::default());
        let down = Now {
            connected: false,
            watch_member: None,
            ..now(t0, QUIET, 10)
        };
        assert_eq!(f.decide(down), Decision::default());
        // The same member, quiet, nothing pending: it vouches.
        let d = f.decide(now(t0, QUIET, 10));
        assert_eq!(d.idle_through, Some(20));
        assert_eq!(d.current_at, Some(t0));
    }

    #[test]
    fn a_message_or_pending_work_since_the_probe_voids_the_idle_rule() {
        let t0 = Instant::now();
        let mut f = Freshness::new(HB, TTL, 0, Duration::ZERO);
        probed(&mut f, t0, Some((100, 100)));
        f.received();
        assert_eq!(f.decide(now(t0, QUIET, 10)), Decision::default());
        let mut f = Freshness::new(HB, TTL, 0, Duration::ZERO);
        probed(&mut f, t0, Some((100, 100)));
        let busy = Now {
            nothing_pending: false,
            ..now(t0, QUIET, 10)
        };
        assert_eq!(f.decide(busy), Decision::default());
    }

    #[test]
    fn a_pending_probe_keeps_its_place_until_its_quiet_period_is_over() {
        let t0 = Instant::now();
        let mut f = Freshness::new(HB, TTL, 0, Duration::ZERO);
        probed(&mut f, t0, Some((100, 100)));
        let later = f.send(t0 + HB, 0, 0, 0);
        f.probed(later, read(40, None)).unwrap();
        // Still the first probe's revision that settles it.
        assert_eq!(f.decide(now(t0, HB, 20)).current_at, Some(t0));
        probed(&mut f, t0, Some((100, 100)));
        assert_eq!(f.quiet_at(), Some(t0 + QUIET));
        f.quiet_passed();
        assert_eq!(f.quiet_at(), None);
        let later = f.send(t0 + HB, 0, 0, 0);
        f.probed(later, read(40, Some((100, 100)))).unwrap();
        assert_eq!(f.decide(now(t0, HB, 20)), Decision::default());
        assert_eq!(f.decide(now(t0, HB, 40)).current_at, Some(t0 + HB));
    }

    #[test]
    fn an_out_of_band_change_makes_the_copy_not_current_until_repaired() {
        let t0 = Instant::now();
        let mut f = Freshness::new(HB, TTL, 0, Duration::ZERO);
        probed(&mut f, t0, Some((100, 100)));
        f.out_of_band();
        // The probe in hand is gone, and one read back meanwhile is not
        // taken.
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)), Decision::default());
        let sent = f.send(t0, 0, 0, 0);
        f.probed(sent, read(20, Some((100, 100)))).unwrap();
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)), Decision::default());
        f.repaired();
        probed(&mut f, t0, Some((100, 100)));
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)).current_at, Some(t0));
    }

    #[test]
    fn a_count_that_a_change_the_copy_watch_saw_explains_ends_nothing() {
        let t0 = Instant::now();
        // With the copy watch: counts every 12 heartbeats once one matched.
        let mut f = Freshness::new(HB, TTL, 0, Duration::from_secs(60));
        // A stray key put just after the sync: the copy watch sees it
        // before the session's first count, which it makes one too many.
        let first = f.send(t0, 0, 0, 0);
        assert!(first.counting);
        f.out_of_band();
        f.probed(first, read(20, Some((100, 101)))).unwrap();
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)), Decision::default());
        // Repaired meanwhile; a count sent before the change, read back
        // after the repair, is still explained by it.
        f.repaired();
        let before = Sent {
            changes_seen: 0,
            ..f.send(t0, 0, 0, 0)
        };
        f.probed(before, read(20, Some((100, 101)))).unwrap();
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)), Decision::default());
        // The next probe counts again, and a match makes the copy current.
        let sent = f.send(t0 + HB, 0, 0, 0);
        assert!(sent.counting, "the next probe counts");
        f.probed(sent, read(20, Some((100, 100)))).unwrap();
        assert_eq!(f.decide(now(t0, HB, 20)).current_at, Some(t0 + HB));
        // A mismatch no change explains ends the session, as ever.
        let sent = Sent {
            counting: true,
            ..f.send(t0 + HB * 2, 0, 0, 0)
        };
        assert!(f.probed(sent, read(20, Some((100, 99)))).is_err());
    }

    #[test]
    fn with_the_copy_watch_counts_are_a_backstop_and_a_re_arm_counts_at_once() {
        let t0 = Instant::now();
        // Counts every 12 heartbeats (a minute of 5 s heartbeats).
        let mut f = Freshness::new(HB, TTL, 0, Duration::from_secs(60));
        probed(&mut f, t0, Some((100, 100)));
        let counting = (0..24)
            .filter(|_| {
                let sent = f.send(t0, 0, 0, 0);
                let counts = sent.counting.then_some((100, 100));
                f.probed(sent, read(20, counts)).unwrap();
                sent.counting
            })
            .count();
        assert_eq!(counting, 2);
        assert!(f.decide(now(t0, Duration::ZERO, 20)).current_at.is_some());
        // Re-armed after a gap: the next probe counts, and marks nothing
        // until it has (nor until a pass, below).
        f.gap();
        let sent = f.send(t0, 0, 0, 0);
        assert!(sent.counting);
        f.probed(sent, read(20, None)).unwrap();
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)).current_at, None);
    }

    #[test]
    fn an_unjudged_copy_event_the_probe_saw_holds_it_until_judged() {
        let t0 = Instant::now();
        let mut f = Freshness::new(HB, TTL, 0, Duration::ZERO);
        probed(&mut f, t0, Some((100, 100)));
        // An event at the peer revision the probe read (50), held while a
        // txn of ours that may explain it is in flight.
        let holding = Now {
            unjudged_from: Some(50),
            ..now(t0, Duration::ZERO, 20)
        };
        assert_eq!(f.decide(holding), Decision::default());
        // One past what the probe read is a later change: not this
        // probe's business.
        let later = Now {
            unjudged_from: Some(51),
            ..now(t0, Duration::ZERO, 20)
        };
        assert_eq!(f.decide(later).current_at, Some(t0));
        // Judged foreign: the probe is dropped.
        probed(&mut f, t0, Some((100, 100)));
        assert_eq!(f.decide(holding), Decision::default());
        f.out_of_band();
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)), Decision::default());
    }

    /// A probe that did not read the peer has no revision of it to bound
    /// the unjudged events by: any of them holds it.
    #[test]
    fn a_probe_that_did_not_read_the_peer_is_held_by_any_unjudged_event() {
        let t0 = Instant::now();
        let mut f = Freshness::new(HB, TTL, 0, Duration::from_secs(60));
        probed(&mut f, t0, Some((100, 100)));
        assert!(f.decide(now(t0, Duration::ZERO, 20)).current_at.is_some());
        let sent = f.send(t0, 0, 0, 0);
        assert!(!sent.counting);
        let unread = Read {
            peer_revision: i64::MAX,
            ..read(20, None)
        };
        f.probed(sent, unread).unwrap();
        let much_later = Now {
            unjudged_from: Some(1 << 40),
            ..now(t0, Duration::ZERO, 20)
        };
        assert_eq!(f.decide(much_later), Decision::default());
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)).current_at, Some(t0));
    }

    #[test]
    fn after_a_gap_in_the_copy_watch_only_a_pass_begun_since_makes_it_current() {
        let t0 = Instant::now();
        let mut f = Freshness::new(HB, TTL, 0, Duration::from_secs(60));
        probed(&mut f, t0, Some((100, 100)));
        // Probes that count when due, and stand on the last count between.
        let probe = |f: &mut Freshness| {
            let sent = f.send(t0, 0, 0, 0);
            f.probed(sent, read(20, sent.counting.then_some((100, 100))))
                .unwrap();
        };
        // A pass already running when the gap opened does not cover it.
        f.pass_started();
        f.gap();
        f.pass_ended(true);
        let sent = f.send(t0, 0, 0, 0);
        assert!(sent.counting, "a gap counts at once");
        f.probed(sent, read(20, Some((100, 100)))).unwrap();
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)).current_at, None);
        // One begun since that could not finish does not either.
        f.pass_started();
        f.pass_ended(false);
        probe(&mut f);
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)).current_at, None);
        f.pass_started();
        f.pass_ended(true);
        probe(&mut f);
        assert_eq!(f.decide(now(t0, Duration::ZERO, 20)).current_at, Some(t0));
    }
}
