//! The engine's probe ticks, one clock for all its peers, and the read of
//! the source that their probes share.
//!
//! Every heartbeat, each peer's freshness probe reads the source's
//! revision (and its id key: `live/source.rs`). An engine mirrors one
//! source to every peer region, so with one read per probe the source's
//! etcd answered as many reads a heartbeat as there are peers, all of the
//! same key: in the ten-region mesh, 1.8 of the 6.5 requests a second each
//! etcd answered at rest. Measured on etcd 3.4.23 alone with a million
//! keys (`GOGC=25`, as that mesh runs), a one-key read costs etcd about as
//! much CPU as a small txn (1.9 ms against 1.75 ms).
//!
//! So the peers' probes tick together ([`Ticks::next_after`]), and the
//! probes of one tick share one read ([`Ticks::read`]). The ticks fall on
//! multiples of the period in Unix time, so the engines of different
//! regions tick together too, as far as their clocks agree: a peer's etcd
//! then gets the heartbeat txns of all the copies it holds within a few
//! milliseconds, and syncs them to its log in fewer writes. In that mesh
//! the two took the ten etcds from 0.198 to 0.161 CPU-s/s at rest (their
//! own counters, 300 s each, the two builds swapped on one mesh), and the
//! minutes between backstop counts from 0.14–0.17 to 0.09–0.11
//! (docs/benchmarks-log.md §10). A clock that is off only moves an
//! engine's ticks (staleness is dated by the monotonic clock, and the
//! heartbeat is never ahead of the wall clock: `live/fresh.rs`,
//! `state.rs`). Sharing must not weaken what a probe
//! proves: a probe taken at instant T needs the source's revision as of T
//! *or later*, so a probe joins only a read that has not yet been sent.
//! The first probe of a tick opens a round and sends its read
//! [`GATHER`] later; probes that arrive meanwhile join it. A probe that
//! finds the round's read gone starts the next round. A round whose read
//! failed gives each of its probes `None`, and each reads on its own: its
//! own call then says what went wrong.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::OnceCell;
use tokio::time::Instant;

use bytes::Bytes;

use crate::etcd::{self, Range, RangeResponse};
use crate::store::Store;

/// How long a round waits for the probes of its tick before its read
/// goes: the peers' tasks wake at the same instant and each reaches its
/// probe within a few scheduler turns. A probe is that much later than
/// its tick, which its staleness never sees (it is dated when taken).
pub(crate) const GATHER: Duration = Duration::from_millis(10);

/// One engine's probe clock and shared source read (see the module doc).
pub(crate) struct Ticks {
    local: Store,
    key: Bytes,
    epoch: Instant,
    period: Duration,
    round: Mutex<Option<Arc<Round>>>,
}

/// The probes that share one read of the source.
struct Round {
    opened: Instant,
    /// The read has been sent: a probe taken from now on may not join.
    sent: AtomicBool,
    read: OnceCell<Option<RangeResponse>>,
}

impl std::fmt::Debug for Ticks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticks")
            .field("epoch", &self.epoch)
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

impl Ticks {
    /// Ticks every `period`, at multiples of it in Unix time as
    /// `unix_ms` (the wall clock now) tells it; reads `key` in `local`.
    pub(crate) fn new(local: Store, key: Bytes, period: Duration, unix_ms: i64) -> Ticks {
        let period = period.max(Duration::from_millis(1));
        let now = Instant::now();
        let into = unix_ms.rem_euclid(period.as_millis().max(1) as i64) as u64;
        Ticks {
            local,
            key,
            epoch: now.checked_sub(Duration::from_millis(into)).unwrap_or(now),
            period,
            round: Mutex::new(None),
        }
    }

    /// The first tick after `now`.
    pub(crate) fn next_after(&self, now: Instant) -> Instant {
        let since = now.saturating_duration_since(self.epoch).as_nanos();
        let period = self.period.as_nanos();
        let ticks = since / period + 1;
        let offset = u64::try_from(ticks * period).unwrap_or(u64::MAX);
        self.epoch + Duration::from_nanos(offset)
    }

    /// The source's id key and header, read after this call began: shared
    /// with the other probes that call before the read goes out.
    pub(crate) async fn read(&self) -> etcd::Result<RangeResponse> {
        let round = self.join();
        let shared = round
            .read
            .get_or_init(|| async {
                tokio::time::sleep_until(round.opened + GATHER).await;
                round.sent.store(true, SeqCst);
                self.local.range(Range::key(self.key.clone())).await.ok()
            })
            .await;
        match shared {
            Some(resp) => Ok(resp.clone()),
            None => self.local.range(Range::key(self.key.clone())).await,
        }
    }

    /// The round whose read has not gone yet, or a new one.
    fn join(&self) -> Arc<Round> {
        let mut slot = self.round.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            // Taken under the lock, after the caller's probe instant: a
            // read not sent by now is sent after it.
            Some(r) if !r.sent.load(SeqCst) => r.clone(),
            _ => {
                let r = Arc::new(Round {
                    opened: Instant::now(),
                    sent: AtomicBool::new(false),
                    read: OnceCell::new(),
                });
                *slot = Some(r.clone());
                r
            }
        }
    }
}
