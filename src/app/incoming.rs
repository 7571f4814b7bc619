//! The incoming side: the copies other regions mirror into this region's
//! etcd, as seen from here.
//!
//! Each origin's replicator keeps its state key, `<state_root><origin>/state`
//! (see [`crate::mirror::state`]), in this region's etcd under the lease its
//! copy hangs on. The key exists exactly while the copy is alive: it goes
//! with the lease when the origin's replicators are gone for a lease TTL.
//! Every replica of this region, leader or standby, follows those keys, so
//! an operator sees from any of them whether the other regions' copies are
//! alive here:
//!
//! - `aether_replicator_origin_copy_present{region,origin}`: 1 while the
//!   origin's state key exists in the local etcd;
//! - `aether_replicator_origin_lease_remaining_seconds{region,origin}`: time left
//!   on the lease it is attached to;
//! - `aether_replicator_origin_staleness_seconds{region,origin}`: now minus
//!   the heartbeat in the state key (left out while the copy is absent or
//!   its key carries none). The origin's engine writes the heartbeat when
//!   its freshness probe finds the copy current, so this grows when the
//!   copy falls behind even while its lease is kept alive.
//!
//! `region` is this region, `origin` the one that wrote the copy. The
//! origins expected are the configured peers (a region mirrors to its peers
//! and they mirror back), so a missing copy reports 0 rather than nothing.
//!
//! The keys are followed with a watch on the state prefix, not polled.
//! Lease TTLs are looked up when an origin's lease changes, then again
//! every half of the granted TTL, at most every [`DEFAULT_TTL_REFRESH`]:
//! a lease kept alive reads between two thirds of its TTL and all of it
//! at every lookup, and one whose keep-alives stopped shows it at the next
//! lookup, before it runs out. At a lookup every quarter TTL they were a
//! fifth of all the requests an etcd of a mesh at rest answered, each
//! costing about what a heartbeat txn does (docs/scale.md).
//! The exported TTL is the last lookup's, not counted down in between: the
//! origin's keep-alives (every third of the TTL) refill it unseen, so a
//! countdown would dip far below the truth and trip "lease low" alerts,
//! while the lookup's value is at most a refresh interval old. Errors
//! restart the loop (a fresh read, then a new watch) after a jittered
//! backoff.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::etcd::LeaseId;
use crate::etcd::{Backoff, Client, EventKind, KeyValue, Range, WatchOptions};
use crate::mirror::state::State;
use crate::mirror::stats::unix_ms;

/// Longest interval between lookups of a present copy's lease TTL: half
/// of a 60 s TTL. No alert reads the looked-up TTL (the origin's own
/// `keepalive_age_seconds` is what warns of a lease running down), so the
/// metric may be this old.
pub const DEFAULT_TTL_REFRESH: Duration = Duration::from_secs(30);
/// Shortest interval between lookups (and the check for due ones).
const MIN_TTL_REFRESH: Duration = Duration::from_secs(1);

/// One origin's copy in the local etcd.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OriginStatus {
    /// The state key exists.
    pub present: bool,
    /// Its parsed value (`None` if absent or unreadable).
    pub state: Option<State>,
    /// The lease the key is attached to ([`LeaseId::NONE`]: none).
    pub lease: LeaseId,
    /// The last lookup of the lease; `None` until looked up, or when the
    /// lease is gone.
    pub ttl: Option<LeaseLookup>,
}

/// One lookup of a copy's lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseLookup {
    /// TTL left when looked up.
    pub left: Duration,
    /// The TTL it was granted with.
    pub granted: Duration,
    /// When it was looked up.
    pub at: Instant,
}

impl OriginStatus {
    /// Time left on the lease at the last lookup; 0 when absent or unknown.
    pub fn ttl_left(&self) -> Duration {
        match (self.present, self.ttl) {
            (true, Some(t)) => t.left,
            _ => Duration::ZERO,
        }
    }

    /// How stale the copy is by this process's clock, by
    /// [`State::staleness_at`]'s rule; `None` when absent or when the key
    /// carries no heartbeat.
    pub fn staleness(&self) -> Option<Duration> {
        self.state.filter(|_| self.present)?.staleness_at(unix_ms())
    }

    /// Whether the lease is due for another lookup under `max_refresh`.
    fn lookup_due(&self, max_refresh: Duration) -> bool {
        match self.ttl {
            _ if !self.present => false,
            None => true,
            Some(t) => {
                t.at.elapsed()
                    >= (t.granted / 2).clamp(MIN_TTL_REFRESH, max_refresh.max(MIN_TTL_REFRESH))
            }
        }
    }
}

/// Every origin's status, by origin region.
pub type Origins = BTreeMap<String, OriginStatus>;

/// Follows the state keys under `state_root` in `local` until `cancel`,
/// publishing on `tx`. `expected` origins are always reported; others from
/// the moment their key is first seen.
pub async fn run(
    local: Client,
    state_root: String,
    expected: Vec<String>,
    ttl_refresh: Duration,
    tx: watch::Sender<Origins>,
    cancel: CancellationToken,
) {
    let fresh = || -> Origins {
        expected
            .iter()
            .map(|o| (o.clone(), OriginStatus::default()))
            .collect()
    };
    tx.send_replace(fresh());
    let mut backoff = Backoff::default();
    loop {
        let round = follow(&local, &state_root, &tx, fresh(), ttl_refresh, &mut backoff);
        let err = tokio::select! {
            _ = cancel.cancelled() => return,
            e = round => e,
        };
        tracing::warn!(error = %err, "following the incoming copies failed; retrying");
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = backoff.wait() => {}
        }
    }
}

/// One round: read every state key, then follow the watch. Returns only on
/// an error.
async fn follow(
    local: &Client,
    state_root: &str,
    tx: &watch::Sender<Origins>,
    mut origins: Origins,
    ttl_refresh: Duration,
    backoff: &mut Backoff,
) -> crate::etcd::Error {
    let resp = match local.range(Range::prefix(state_root.to_string())).await {
        Ok(r) => r,
        Err(e) => return e,
    };
    for kv in resp.kvs() {
        if let Some(origin) = origin_of(state_root, kv.key()) {
            origins.insert(origin, status_of(Some(kv)));
        }
    }
    // Every present copy's TTL, before the first publication.
    for status in origins.values_mut() {
        if let Err(e) = lookup_ttl(local, status).await {
            return e;
        }
    }
    tx.send_replace(origins.clone());
    // The etcd answered in full: the next error starts the backoff over.
    backoff.reset();

    let opts =
        WatchOptions::prefix(state_root.to_string()).start_revision(resp.header.revision + 1);
    let (_stream, mut watcher) = match local.watch(opts) {
        Ok(w) => w,
        Err(e) => return e,
    };
    let mut refresh = tokio::time::interval(MIN_TTL_REFRESH.min(ttl_refresh));
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    refresh.reset();
    loop {
        tokio::select! {
            msg = futures_util::StreamExt::next(&mut watcher) => {
                let resp = match msg {
                    Some(Ok(r)) => r,
                    Some(Err(e)) => return e,
                    None => return crate::etcd::Error::Closed,
                };
                for ev in resp.events {
                    let Some(origin) = origin_of(state_root, ev.kv.key()) else {
                        continue;
                    };
                    let new = match ev.kind {
                        EventKind::Put => status_of(Some(&ev.kv)),
                        EventKind::Delete => status_of(None),
                    };
                    let old = origins.entry(origin).or_default();
                    // Batches rewrite the key often; the lease changes only
                    // when the origin claims the copy anew.
                    let ttl = if new.lease == old.lease { old.ttl } else { None };
                    *old = OriginStatus { ttl, ..new };
                    if old.present
                        && old.ttl.is_none()
                        && let Err(e) = lookup_ttl(local, old).await
                    {
                        return e;
                    }
                }
                tx.send_replace(origins.clone());
            }
            _ = refresh.tick() => {
                let mut looked = false;
                for status in origins.values_mut() {
                    if status.lookup_due(ttl_refresh) {
                        if let Err(e) = lookup_ttl(local, status).await {
                            return e;
                        }
                        looked = true;
                    }
                }
                if looked {
                    tx.send_replace(origins.clone());
                }
            }
        }
    }
}

/// `<state_root><origin>/state` -> origin.
fn origin_of(state_root: &str, key: &Bytes) -> Option<String> {
    let rest = key.strip_prefix(state_root.as_bytes())?;
    let origin = rest.strip_suffix(b"/state")?;
    if origin.is_empty() || origin.contains(&b'/') {
        return None;
    }
    String::from_utf8(origin.to_vec()).ok()
}

fn status_of(kv: Option<&KeyValue>) -> OriginStatus {
    match kv {
        Some(kv) => OriginStatus {
            present: true,
            state: State::decode(kv.value()),
            lease: kv.lease(),
            ttl: None,
        },
        None => OriginStatus::default(),
    }
}

/// Looks up the TTL of a present copy's lease.
async fn lookup_ttl(local: &Client, status: &mut OriginStatus) -> crate::etcd::Result<()> {
    if !status.present || status.lease.is_none() {
        status.ttl = None;
        return Ok(());
    }
    let t = local.lease_time_to_live(status.lease, false).await?;
    status.ttl = t.ttl.map(|left| LeaseLookup {
        left,
        granted: t.granted_ttl,
        at: Instant::now(),
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_from_keys() {
        let root = "/aether/v1/replication/";
        let o = |k: &'static str| origin_of(root, &Bytes::from_static(k.as_bytes()));
        assert_eq!(o("/aether/v1/replication/b/state"), Some("b".into()));
        assert_eq!(o("/aether/v1/replication//state"), None);
        assert_eq!(o("/aether/v1/replication/b/c/state"), None);
        assert_eq!(o("/aether/v1/replication/b/other"), None);
        assert_eq!(o("/elsewhere/b/state"), None);
    }

    #[test]
    fn lookups_are_due_every_half_ttl_within_bounds() {
        let looked = |granted: u64, ago: u64| OriginStatus {
            present: true,
            state: None,
            lease: LeaseId::new(7),
            ttl: Some(LeaseLookup {
                left: Duration::from_secs(granted / 2),
                granted: Duration::from_secs(granted),
                at: Instant::now() - Duration::from_secs(ago),
            }),
        };
        let max = DEFAULT_TTL_REFRESH;
        let mut fresh = looked(30, 0);
        assert_eq!(fresh.staleness(), None);
        fresh.state = Some(State {
            revision: 1,
            lease: LeaseId::new(7),
            holder: 1,
            source_cluster: 1,
            source_id: 0,
            heartbeat_unix_ms: unix_ms() - 3_000,
            synced: true,
            lease_ttl: 0,
        });
        let st = fresh.staleness().unwrap();
        assert!(st >= Duration::from_secs(3) && st < Duration::from_secs(10));
        fresh.present = false;
        assert_eq!(fresh.staleness(), None);
        assert!(!looked(30, 14).lookup_due(max));
        assert!(looked(30, 15).lookup_due(max));
        assert!(!looked(120, 29).lookup_due(max));
        assert!(looked(120, 30).lookup_due(max));
        assert!(!looked(8, 3).lookup_due(max));
        assert!(looked(8, 4).lookup_due(max));
        assert!(looked(2, 1).lookup_due(max));
        assert_eq!(looked(30, 0).ttl_left(), Duration::from_secs(15));
        let gone = OriginStatus {
            present: false,
            ..looked(30, 0)
        };
        assert!(!gone.lookup_due(max));
        assert_eq!(gone.ttl_left(), Duration::ZERO);
        assert!(
            OriginStatus {
                ttl: None,
                ..looked(30, 0)
            }
            .lookup_due(max)
        );
    }
}
