//! Leader election among one region's replicas, on the local etcd.
//!
//! The campaign key (`/aether/v1/replicator/<region>/leader` by default) is
//! created with a txn that succeeds only if the key does not exist, under a
//! session lease with the election TTL. The winner mirrors; the others watch
//! the key and campaign again when it is deleted (resignation) or expires
//! with its lease (a crashed leader). The election TTL is at most half the
//! mirror lease TTL, so a standby takes over before the mirror can lapse.
//!
//! A leader that loses its session, because the lease expired or because
//! the local etcd has not answered a keep-alive for a whole TTL, must stop
//! mirroring at once; [`Leadership::lost`] resolves then. The engine's fence
//! covers the moment between a new leader's claim and the old one noticing.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;

use crate::error::Result;
use crate::etcd::{
    Client, Compare, CompareOp, Delete, EventKind, LeaseHandle, Put, Range, Txn, WatchOptions,
};

/// Longest a resignation waits for the local etcd.
pub const RESIGN_TIMEOUT: Duration = Duration::from_secs(2);

/// Default prefix of the campaign keys.
pub const DEFAULT_ELECTION_ROOT: &str = "/aether/v1/replicator/";

/// One replica's candidacy.
pub struct Election {
    local: Client,
    key: Bytes,
    id: Bytes,
    ttl: Duration,
}

/// A won election. Dropping it stops the session keep-alive (the campaign
/// key then expires); [`Leadership::resign`] deletes it at once.
pub struct Leadership {
    local: Client,
    key: Bytes,
    id: Bytes,
    session: LeaseHandle,
    /// The revision that created the campaign key; the watch for its
    /// removal starts after it, so a deletion right after winning counts.
    won_at: i64,
}

impl Election {
    /// A candidate for `region`, identified by `id` (for example
    /// `hostname/pid`), with a session TTL of `ttl`.
    pub fn new(local: Client, region: &str, id: impl Into<Bytes>, ttl: Duration) -> Election {
        Election {
            local,
            key: Bytes::from(format!("{DEFAULT_ELECTION_ROOT}{region}/leader")),
            id: id.into(),
            ttl,
        }
    }

    /// The campaign key.
    pub fn key(&self) -> &Bytes {
        &self.key
    }

    /// Campaigns until this replica leads. Errors (an unreachable etcd) are
    /// returned so the caller can back off and count them.
    pub async fn campaign(&self) -> Result<Leadership> {
        self.campaign_reporting(&AtomicBool::new(false)).await
    }

    /// [`Election::campaign`], keeping `healthy` true while this candidate
    /// holds a live session: a standby that can no longer reach its etcd
    /// stops counting as one within a session TTL (and the campaign
    /// returns an error).
    pub async fn campaign_reporting(&self, healthy: &AtomicBool) -> Result<Leadership> {
        healthy.store(false, Relaxed);
        let ttl = self.ttl.as_secs().max(1) as i64;
        let grant = self.local.lease_grant(ttl, 0).await?;
        let session = self
            .local
            .lease_keeper()
            .keep_alive(grant.id, grant.ttl)
            .await?;
        healthy.store(true, Relaxed);
        let result = self.contend(session).await;
        healthy.store(result.is_ok(), Relaxed);
        result
    }

    async fn contend(&self, session: LeaseHandle) -> Result<Leadership> {
        loop {
            let txn = Txn::new()
                .when([Compare::create_revision(
                    self.key.clone(),
                    CompareOp::Equal,
                    0,
                )])
                .and_then([Put::new(self.key.clone(), self.id.clone()).lease(session.id())])
                .or_else([Range::key(self.key.clone())]);
            let resp = self.local.txn(txn).await?;
            if resp.succeeded {
                tracing::info!(key = %String::from_utf8_lossy(&self.key), "won the election");
                return Ok(Leadership {
                    local: self.local.clone(),
                    key: self.key.clone(),
                    id: self.id.clone(),
                    session,
                    won_at: resp.header.revision,
                });
            }
            // A key holding our own id is left from an earlier session of
            // this process (say, the local etcd restarted and renewed the
            // old session lease): take it back rather than wait it out.
            let held = resp.responses.iter().find_map(|r| match r {
                crate::etcd::OpResponse::Range(r) => r.kvs().first().cloned(),
                _ => None,
            });
            if let Some(kv) = held
                && kv.value() == &self.id
            {
                let reclaim = Txn::new()
                    .when([Compare::mod_revision(
                        self.key.clone(),
                        CompareOp::Equal,
                        kv.mod_revision(),
                    )])
                    .and_then([Delete::key(self.key.clone())]);
                self.local.txn(reclaim).await?;
                continue;
            }
            // Someone leads. Wait for the key to go, from the revision we
            // saw it at, so a deletion in between is not missed.
            let (_stream, mut watcher) = self.local.watch(
                WatchOptions::key(self.key.clone()).start_revision(resp.header.revision + 1),
            )?;
            loop {
                tokio::select! {
                    msg = watcher.next() => match msg {
                        Some(Ok(r)) if r.events.iter().any(|e| e.kind == EventKind::Delete) => break,
                        Some(Ok(_)) => {}
                        Some(Err(e)) => return Err(e.into()),
                        None => return Err(crate::etcd::Error::Closed.into()),
                    },
                    // The watch reconnects quietly; the session says whether
                    // the local etcd still answers.
                    _ = session_ends(&session) => {
                        return Err(crate::Error::LeaseLost {
                            peer: "local".into(),
                        });
                    }
                }
            }
        }
    }
}

impl Leadership {
    /// Resolves when this replica can no longer be sure it leads: the
    /// session lease is lost, or no keep-alive has been answered for a TTL,
    /// or the campaign key was removed.
    pub async fn lost(&mut self) {
        let key_gone = async {
            let mut from = self.won_at + 1;
            loop {
                let opts = WatchOptions::key(self.key.clone()).start_revision(from);
                if let Ok((_s, mut w)) = self.local.watch(opts) {
                    while let Some(Ok(r)) = w.next().await {
                        if r.events.iter().any(|e| e.kind == EventKind::Delete) {
                            return;
                        }
                    }
                }
                // The watch failed (say, compacted during a disconnection):
                // look at the key itself, then watch again from there. An
                // unreachable etcd proves nothing; the session check covers it.
                tokio::time::sleep(Duration::from_millis(500)).await;
                if let Ok(r) = self.local.range(Range::key(self.key.clone())).await {
                    match r.kvs().first() {
                        Some(kv) if kv.value() == &self.id => from = r.header.revision + 1,
                        _ => return,
                    }
                }
            }
        };
        let expired = session_ends(&self.session);
        tokio::select! {
            _ = key_gone => tracing::warn!("campaign key removed; stepping down"),
            _ = expired => tracing::warn!("election session lost; stepping down"),
        }
    }

    /// Gives up leadership: deletes the campaign key if it is still ours and
    /// revokes the session lease, so a standby takes over at once.
    /// Bounded by [`RESIGN_TIMEOUT`]: an unreachable etcd lets the key
    /// expire with the session instead of holding up the exit.
    pub async fn resign(self) {
        let txn = Txn::new()
            .when([Compare::value(
                self.key.clone(),
                CompareOp::Equal,
                self.id.clone(),
            )])
            .and_then([Delete::key(self.key.clone())]);
        let resign = async {
            self.local.txn(txn).await?;
            self.local.lease_revoke(self.session.id()).await
        };
        match tokio::time::timeout(RESIGN_TIMEOUT, resign).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not resign; the campaign key expires with the session")
            }
            Err(_) => {
                tracing::warn!("resigning timed out; the campaign key expires with the session")
            }
        }
    }
}

/// Resolves once `session` is lost or has gone a whole TTL without an
/// answered keep-alive.
async fn session_ends(session: &LeaseHandle) {
    loop {
        let s = session.status();
        if s.lost || s.ttl_left() == Duration::ZERO {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
