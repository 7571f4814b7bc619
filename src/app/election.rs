//! Leader election among one region's replicas, on the local etcd.
//!
//! Built on the client's [`concurrency::Election`], so it has etcd's
//! own election layout and semantics: each replica campaigns with the key
//! `/aether/v1/replicator/<region>/leader/<lease id in hex>` under a session
//! lease with the election TTL, holding the replica's id. The oldest key
//! leads; each standby waits for the key created just before its own to go
//! (a resignation, or a crashed replica's lease expiring), so a handoff
//! wakes one standby. `etcdctl elect --listen /aether/v1/replicator/<region>/leader`
//! shows the leader. The election TTL is at most half the mirror lease
//! TTL, so a standby takes over before the mirror can lapse.
//!
//! A leader that loses its session, because the lease expired or because
//! the local etcd has not answered a keep-alive for a whole TTL, must stop
//! mirroring at once; [`Leadership::lost`] resolves then, or when its
//! campaign key is removed. The engine's fence covers the moment between a
//! new leader's claim and the old one noticing.
//!
//! Earlier builds campaigned on the prefix itself (`.../<region>/leader`,
//! one key created if absent). Replicas of the two layouts do not see each
//! other's campaigns: upgrade a region's replicas together. Should both
//! kinds lead at once meanwhile, the peers' fences let only one engine
//! write, and the other steps down.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;

use crate::error::Result;
use crate::etcd::concurrency::{self, Session, SessionOptions};
use crate::etcd::{
    Backoff, Client, Compare, CompareOp, Delete, EventKind, Range, Txn, WatchOptions,
};

/// Longest a resignation waits for the local etcd.
pub const RESIGN_TIMEOUT: Duration = Duration::from_secs(2);

/// Default prefix of the campaign keys.
pub const DEFAULT_ELECTION_ROOT: &str = "/aether/v1/replicator/";

/// One replica's candidacy.
#[derive(Debug)]
pub struct Election {
    local: Client,
    prefix: Bytes,
    id: Bytes,
    ttl: Duration,
    /// The session of the campaign under way, so that [`Election::withdraw`]
    /// can revoke it after the campaign future was dropped.
    campaigning: std::sync::Mutex<Option<Session>>,
}

/// A won election. Dropping it stops the session keep-alive (the campaign
/// key then expires); [`Leadership::resign`] deletes it at once.
#[derive(Debug)]
pub struct Leadership {
    local: Client,
    election: concurrency::Election,
    session: Session,
    key: Bytes,
    /// The campaign key's create revision.
    created: i64,
}

impl Election {
    /// A candidate for `region`, identified by `id` (for example
    /// `hostname/pid`), with a session TTL of `ttl`.
    pub fn new(local: Client, region: &str, id: impl Into<Bytes>, ttl: Duration) -> Election {
        Election {
            local,
            prefix: Bytes::from(format!("{DEFAULT_ELECTION_ROOT}{region}/leader")),
            id: id.into(),
            ttl,
            campaigning: std::sync::Mutex::new(None),
        }
    }

    /// The election prefix; each candidate's key is `<prefix>/<lease hex>`.
    pub fn prefix(&self) -> &Bytes {
        &self.prefix
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
        let opts = SessionOptions::default().with_ttl(self.ttl);
        let session = Session::with_options(&self.local, opts).await?;
        *self.campaigning.lock().unwrap_or_else(|e| e.into_inner()) = Some(session.clone());
        healthy.store(true, Relaxed);
        let result = self.contend(session).await;
        self.campaigning
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        healthy.store(result.is_ok(), Relaxed);
        result
    }

    /// Withdraws from a campaign whose future was dropped (a standby
    /// shutting down): revokes its session, so its queued key does not hold
    /// up a handoff for a TTL. Bounded by [`RESIGN_TIMEOUT`].
    pub async fn withdraw(&self) {
        let session = self
            .campaigning
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(session) = session {
            let _ = tokio::time::timeout(RESIGN_TIMEOUT, session.close()).await;
        }
    }

    async fn contend(&self, session: Session) -> Result<Leadership> {
        let mut election = concurrency::Election::new(&session, &self.prefix);
        self.reclaim_stale(&session, election.prefix()).await?;
        match election.campaign(self.id.clone()).await {
            Ok(()) => {
                let (Some(key), Some(created)) = (election.key().cloned(), election.rev()) else {
                    return Err(crate::etcd::Error::NotLeader.into());
                };
                tracing::info!(key = %String::from_utf8_lossy(&key), "won the election");
                Ok(Leadership {
                    local: self.local.clone(),
                    election,
                    session,
                    key,
                    created,
                })
            }
            // The session ended (the local etcd stopped answering) or the
            // key was removed while waiting.
            Err(crate::etcd::Error::SessionExpired) => Err(crate::Error::LeaseLost {
                peer: "local".into(),
            }),
            // The key stays queued until the session's lease runs out; the
            // next campaign reclaims it.
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes campaign keys that hold this replica's id under another
    /// lease: left from an earlier session of this process (say, the local
    /// etcd restarted and renewed the old session lease). Ahead of the new
    /// key in the queue, they would make it wait them out.
    async fn reclaim_stale(&self, session: &Session, dir: &Bytes) -> Result<()> {
        for kv in self
            .local
            .range(Range::prefix(dir.clone()))
            .await?
            .into_kvs()
        {
            if kv.value() == &self.id && kv.lease() != session.lease() {
                let reclaim = Txn::new()
                    .when([Compare::mod_revision(
                        kv.key().clone(),
                        CompareOp::Equal,
                        kv.mod_revision(),
                    )])
                    .and_then([Delete::key(kv.key().clone())]);
                self.local.txn(reclaim).await?;
            }
        }
        Ok(())
    }
}

impl Leadership {
    /// The campaign key this replica leads with.
    pub fn key(&self) -> &Bytes {
        &self.key
    }

    /// Resolves when this replica can no longer be sure it leads: the
    /// session lease is lost, or no keep-alive has been answered for a TTL,
    /// or the campaign key was removed.
    pub async fn lost(&mut self) {
        let (key, created) = (self.key.clone(), self.created);
        let key_gone = async {
            // From just after the key was created, so a deletion right after
            // winning counts.
            let mut from = created + 1;
            let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
            loop {
                let opts = WatchOptions::key(key.clone()).start_revision(from);
                if let Ok((_, mut w)) = self.local.watch(opts) {
                    while let Ok(Some(r)) = w.message().await {
                        if r.events.iter().any(|e| e.kind == EventKind::Delete) {
                            return;
                        }
                    }
                }
                // The watch failed (say, compacted during a disconnection):
                // look at the key itself, then watch again from there. An
                // unreachable etcd proves nothing; the session covers it.
                tokio::time::sleep(backoff.next_delay()).await;
                if let Ok(r) = self.local.range(Range::key(key.clone())).await {
                    match r.kvs().first() {
                        Some(kv) if kv.create_revision() == created => {
                            from = r.header.revision + 1;
                        }
                        _ => return,
                    }
                }
            }
        };
        tokio::select! {
            _ = key_gone => tracing::warn!("campaign key removed; stepping down"),
            _ = self.session.lost() => tracing::warn!("election session lost; stepping down"),
        }
    }

    /// Gives up leadership: deletes the campaign key if it is still ours and
    /// revokes the session lease, so a standby takes over at once.
    /// Bounded by [`RESIGN_TIMEOUT`]: an unreachable etcd lets the key
    /// expire with the session instead of holding up the exit.
    pub async fn resign(mut self) {
        let resign = async {
            self.election.resign().await?;
            self.session.close().await
        };
        match tokio::time::timeout(RESIGN_TIMEOUT, resign).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not resign; the campaign key expires with the session")
            }
            Err(_) => {
                tracing::warn!("resigning timed out; the campaign key expires with the session")
            }
        }
    }
}
