//! Leases: their TTLs and deadlines on the tokio clock, and the keys
//! attached to each.
//!
//! Deadlines are `tokio::time::Instant`s, so a test on paused time moves
//! them by advancing the clock; the cluster's expiry task sleeps until the
//! earliest one. The keys of a lease are kept here as etcd's lessor keeps
//! them, so a revoke deletes them without scanning the store.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::error::{Error, Result};

/// etcd's largest TTL (`MaxLeaseTTL`), in seconds.
pub(super) const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// One lease.
#[derive(Clone, Debug)]
pub(super) struct Lease {
    /// The TTL it was granted with (raised to the minimum).
    pub(super) ttl: i64,
    /// When it expires unless kept alive.
    pub(super) deadline: Instant,
    /// The keys attached to it, in key order (etcd revokes them sorted).
    pub(super) keys: BTreeSet<Bytes>,
}

/// Every lease, by id.
#[derive(Clone, Debug, Default)]
pub(super) struct Leases {
    pub(super) map: BTreeMap<i64, Lease>,
    /// The next server-chosen id's counter.
    next: i64,
}

impl Leases {
    /// Grants a lease; `id` 0 lets the model choose. A TTL under
    /// `min_ttl` is raised to it, as etcd raises it to its minimum.
    pub(super) fn grant(
        &mut self,
        id: i64,
        ttl: i64,
        min_ttl: i64,
        id_base: i64,
        now: Instant,
    ) -> Result<(i64, i64)> {
        if ttl > MAX_LEASE_TTL {
            return Err(Error::server(
                crate::error::Code::OutOfRange,
                "etcdserver: too large lease TTL",
            ));
        }
        let id = if id == 0 {
            // Deterministic ids, unique while the model lives; etcd's are
            // built from the member id and a clock, so nobody may rely on
            // their values.
            loop {
                self.next += 1;
                let candidate = id_base.wrapping_add(self.next) & i64::MAX;
                if candidate != 0 && !self.map.contains_key(&candidate) {
                    break candidate;
                }
            }
        } else {
            id
        };
        if self.map.contains_key(&id) {
            return Err(Error::LeaseExists);
        }
        let ttl = ttl.max(min_ttl);
        self.map.insert(
            id,
            Lease {
                ttl,
                deadline: now + secs(ttl),
                keys: BTreeSet::new(),
            },
        );
        Ok((id, ttl))
    }

    /// Refreshes a lease's deadline; its TTL.
    pub(super) fn keep_alive(&mut self, id: i64, now: Instant) -> Result<i64> {
        let lease = self.map.get_mut(&id).ok_or(Error::LeaseNotFound)?;
        lease.deadline = now + secs(lease.ttl);
        Ok(lease.ttl)
    }

    /// Whether the lease exists.
    pub(super) fn exists(&self, id: i64) -> bool {
        self.map.contains_key(&id)
    }

    /// Records that `key` now belongs to `new` (0: no lease) instead of
    /// `old`.
    pub(super) fn reattach(&mut self, key: &Bytes, old: i64, new: i64) {
        if old == new {
            return;
        }
        if let Some(l) = self.map.get_mut(&old) {
            l.keys.remove(key);
        }
        if let Some(l) = self.map.get_mut(&new) {
            l.keys.insert(key.clone());
        }
    }

    /// The earliest deadline.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.map.values().map(|l| l.deadline).min()
    }

    /// The leases whose deadline has passed, in id order.
    pub(super) fn due(&self, now: Instant) -> Vec<i64> {
        self.map
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Seconds left, truncated as etcd truncates them (never negative).
    pub(super) fn remaining(&self, id: i64, now: Instant) -> Option<i64> {
        let l = self.map.get(&id)?;
        let left = l.deadline.saturating_duration_since(now);
        Some(left.as_secs() as i64)
    }

    /// Every lease's deadline moved to `now + ttl`: what a new leader does
    /// on promotion, and so what a restore does here.
    pub(super) fn renew_all(&mut self, now: Instant) {
        for l in self.map.values_mut() {
            l.deadline = now + secs(l.ttl);
        }
    }
}

fn secs(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_raises_the_ttl_refuses_a_taken_id_and_chooses_unique_ids() {
        let now = Instant::now();
        let mut l = Leases::default();
        assert_eq!(l.grant(7, 1, 2, 0, now).unwrap(), (7, 2));
        assert!(matches!(l.grant(7, 5, 2, 0, now), Err(Error::LeaseExists)));
        let (a, _) = l.grant(0, 5, 2, 6, now).unwrap();
        let (b, _) = l.grant(0, 5, 2, 6, now).unwrap();
        assert!(a != b && a != 7 && b != 7, "{a} {b}");
        assert!(matches!(l.keep_alive(99, now), Err(Error::LeaseNotFound)));
        assert_eq!(l.remaining(a, now + Duration::from_millis(1500)), Some(3));
        assert_eq!(l.due(now + Duration::from_secs(2)), [7]);
    }
}
