//! The mirror engine: this region's subtree, mirrored verbatim into every
//! peer region's etcd under a lease only this region keeps alive.
//!
//! For own region R and each peer P the engine runs one task (`peer`)
//! that:
//! - holds a lease on P, kept alive through P's shared keep-alive stream;
//!   if R stops, the lease lapses and R's copy expires on P by itself;
//! - brings P's copy of `<root>R/` to the source at one revision with a
//!   range diff (`sync`), comparing the lease as well as the value;
//! - then mirrors R's watch from the next revision, batching consecutive
//!   revisions into as few txns as P's limits allow ([`batch`]);
//! - guards every txn with a fence on P's state key ([`state`]), so a
//!   deposed engine cannot overwrite a successor's writes, and a successor
//!   that finds the lease alive adopts it and resumes by watch, rewriting
//!   nothing.
//!
//! Peers never wait on each other: each has its own task, its own watch
//! stream on the local etcd and its own connection. A clean shutdown stops
//! the keep-alives and never revokes a lease.
//!
//! The engine is schema-agnostic: it copies every key under the prefix,
//! whatever its bytes, and never anything outside it apart from the state
//! key. It never mirrors another region's subtree, which is what keeps
//! replication between regions loop-free.
//!
//! # Layout
//! The folders are the phases of one peer's task, top to bottom; nothing
//! imports upward.
//! - `peer/`: what one peer's task holds across sessions (`Peer`, and the
//!   engine's handles it shares), and its lifecycle:
//!   - `session`: claim, sync or resume, live; retry with backoff,
//!     re-sync, or let a stale copy lapse (a state diagram in its doc);
//!   - `claim`: identity checks, the lease (adopt or grant), the
//!     compare-and-swap on the state key, and whether to resume or re-sync.
//! - `sync`: the range-diff sync at one pinned revision, over `diff` (the
//!   merge-join of both sides' pages); `Peer::pin_sync` pins it and starts
//!   its scans beside the claim's last txn.
//! - `live/`: the live loop (`mod.rs`: the select loop) and its parts:
//!   [`batch`] turns watch events into batches of whole revisions;
//!   `inflight` keeps per-key order and the acknowledged watermark of the
//!   txns in flight; `copy` watches the copy on the peer and repairs what
//!   others change there; `probe` reads both stores for the freshness
//!   probe and checks their identity; `fresh` decides whether the copy is
//!   current.
//! - `count`: key counts split into pieces, so a count never holds a
//!   store's writes for a whole walk of the subtree.
//! - `verify`: the periodic verification pass, the last backstop for what
//!   the copy watch and the counts can't see.
//! - `send/`: **the one send path** of the sync and the live loop
//!   (`mod.rs`: the pipeline: txns in flight, their bytes, refusals and
//!   re-sends) and what it draws on:
//!   - `pacer`: the *window*, the one thing that word names here: how many
//!     txns and bytes may be in flight, from the measured round trip and
//!     throughput;
//!   - `limits`: the peer's txn limits, discovered by probing after a
//!     refusal;
//!   - `writer`: builds every fenced txn and tells why one failed;
//!   - `own`: books every write txn and the revision it committed at, so
//!     the copy watch tells our changes from everyone else's.
//! - [`state`]: the state key's format, the fence and the claim;
//!   [`stats`]: per-peer counters and signals; [`check`]: the offline
//!   comparison behind `aether-replicator check`; `config`: [`MirrorConfig`].
//!
//! # Where to look
//! - *Where is a copy declared current?* Only in `live/fresh.rs`; a
//!   consumer judges the state key's heartbeat by
//!   [`state::State::staleness_at`].
//! - *Who changed this key on the peer?* `live/copy.rs` asks
//!   `send/own.rs`: ours if a txn of ours committed at its revision.
//! - *Where is a txn packed?* Sync: `sync` with the client's
//!   [`crate::etcd::TxnBatcher`]. Live: [`batch::Batcher`]. Both pack for
//!   the limits the pipeline reports.
//! - *Where are limits discovered?* `send/limits.rs` (`Limits::refused`,
//!   called by the pipeline when the peer refuses a txn for its size).
//! - *Where is the window sized?* `send/pacer.rs` (`Pacer`), fed only by
//!   the pipeline.
//! - *Which etcd calls does the engine make?* Those of
//!   [`crate::store::Backend`], and no others: every etcd is a
//!   [`Store`].
//! - *Where is a flag added?* In the app, not here: see `app::config`'s
//!   module doc; the engine takes it as a [`MirrorConfig`] field.

pub mod check;
pub mod clock;
mod config;
mod count;
mod diff;
mod live;
mod peer;
mod send;
pub mod state;
pub mod stats;
mod sync;
mod verify;

pub use live::batch;

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use config::{
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_LAPSE_AFTER, DEFAULT_LEASE_TTL, DEFAULT_LIMIT_REPROBE,
    DEFAULT_MAX_BACKOFF, DEFAULT_MAX_CONCURRENT_SYNCS, DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_MAX_INFLIGHT_TXNS, DEFAULT_PAGE_SIZE, DEFAULT_PEER_CONNECTIONS,
    DEFAULT_RECOUNT_INTERVAL, DEFAULT_RESYNC_LAG, DEFAULT_STATE_ROOT, DEFAULT_VERIFY_INTERVAL,
    DEFAULT_VERIFY_RATE, MIN_LEASE_TTL, MirrorConfig, PeerConfig,
};
pub use stats::{ErrorKind, PeerStats, ResyncReason, VerifySkip};

use crate::error::{Error, Result};
use crate::schema::{Schema, validate_segment};
use crate::store::Store;

/// A running engine. Dropping it cancels every peer task; [`Engine::shutdown`]
/// also waits for them.
pub struct Engine {
    cancel: CancellationToken,
    pause: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    stats: Vec<Arc<PeerStats>>,
    fenced: mpsc::UnboundedReceiver<String>,
    holder: u64,
}

impl Engine {
    /// Validates the config and starts one task per peer.
    ///
    /// Refuses a peer named like this region, duplicate peers, and invalid
    /// names or limits. Unreachable etcds are not an error: the tasks retry.
    ///
    /// Each etcd is an [`etcd::Client`](crate::etcd::Client) or any other
    /// [`Store`].
    pub fn start<L: Into<Store>, P: Into<Store>>(
        local: L,
        peers: Vec<(String, P)>,
        config: MirrorConfig,
    ) -> Result<Engine> {
        let peers = peers
            .into_iter()
            .map(|(region, client)| {
                let stats = Arc::new(PeerStats::new(region.clone()));
                (region, client.into(), stats)
            })
            .collect();
        Engine::start_with_stats(local, peers, config)
    }

    /// Like [`Engine::start`], reporting into stats the caller keeps, so
    /// counters carry on across engines (for example across leadership
    /// changes in one process).
    pub fn start_with_stats<P: Into<Store>>(
        local: impl Into<Store>,
        peers: Vec<(String, P, Arc<PeerStats>)>,
        config: MirrorConfig,
    ) -> Result<Engine> {
        let local = local.into();
        validate(&config, peers.iter().map(|(r, _, _)| r.as_str()))?;
        let cfg = Arc::new(config);
        let holder = cfg.clock.fresh_id();
        let cancel = CancellationToken::new();
        let pause = CancellationToken::new();
        let (fenced_tx, fenced) = mpsc::unbounded_channel();
        // Shared by every peer: a sync takes a slot before it pins the
        // source and gives it back when it completes or is dropped.
        let sync_slots = Arc::new(tokio::sync::Semaphore::new(cfg.max_concurrent_syncs));
        // Shared by every peer: their probes tick together and share one
        // read of the source (`live/tick.rs`).
        let ticks = Arc::new(live::tick::Ticks::new(
            local.clone(),
            bytes::Bytes::from(cfg.source_id_key()),
            cfg.heartbeat_interval,
            cfg.clock.unix_ms(),
        ));
        let mut tasks = Vec::new();
        let mut all_stats = Vec::new();
        for (region, client, stats) in peers {
            let client = client.into();
            all_stats.push(stats.clone());
            // A peer with limits of its own gets its own copy of the config.
            let peer_cfg = match cfg.peer_limits.get(&region) {
                Some(&limits) => Arc::new(MirrorConfig {
                    limits,
                    ..MirrorConfig::clone(&cfg)
                }),
                None => cfg.clone(),
            };
            let peer = peer::Peer::new(
                region.clone(),
                local.clone(),
                client,
                peer_cfg,
                stats,
                holder,
                peer::Shared {
                    cancel: cancel.child_token(),
                    pause: pause.clone(),
                    sync_slots: sync_slots.clone(),
                    ticks: ticks.clone(),
                },
            );
            let fenced_tx = fenced_tx.clone();
            let span = tracing::info_span!("peer", peer = %region);
            tasks.push(tokio::spawn(tracing::Instrument::instrument(
                async move {
                    if let Err(Error::Fenced { peer }) = peer.run().await {
                        let _ = fenced_tx.send(peer);
                    }
                },
                span,
            )));
        }
        Ok(Engine {
            cancel,
            pause,
            tasks,
            stats: all_stats,
            fenced,
            holder,
        })
    }

    /// Per-peer stats, in the order the peers were given.
    pub fn stats(&self) -> &[Arc<PeerStats>] {
        &self.stats
    }

    /// This engine's incarnation id, as written in the peers' state keys.
    pub fn holder(&self) -> u64 {
        self.holder
    }

    /// Whether every peer is in the live phase.
    pub fn is_synced(&self) -> bool {
        self.stats.iter().all(|s| s.is_synced())
    }

    /// Resolves once every peer is in the live phase. Wrap it in a timeout.
    pub async fn wait_synced(&self) {
        for s in &self.stats {
            let mut signal = s.synced_signal();
            // Err: the stats were dropped, which cannot happen while
            // `self` holds them.
            let _ = signal.wait_for(|synced| *synced).await;
        }
    }

    /// Resolves with a peer's region when another engine fences this one
    /// there. That peer's task has stopped; the owner should step down.
    pub async fn fenced(&mut self) -> Option<String> {
        self.fenced.recv().await
    }

    /// Stops every peer task at once, without draining anything: what a
    /// crash looks like to the peers. For tests and benches.
    #[doc(hidden)]
    pub fn abort(mut self) {
        for t in std::mem::take(&mut self.tasks) {
            t.abort();
        }
        self.mark_unsynced();
    }

    /// Stops writing to every peer at once (txns in flight are abandoned;
    /// the fence covers them) but keeps the peer leases alive for one more
    /// lease TTL, so a successor can adopt them. For a leader that lost its
    /// election session: a brief outage of the local etcd then does not
    /// wipe the region's copy from the peers. Dropping the returned
    /// [`SteppedDown`] ends the keep-alives early.
    pub fn step_down(mut self) -> SteppedDown {
        self.pause.cancel();
        self.mark_unsynced();
        // Hand the cancel token to the guard so dropping `self` does not
        // end the grace period.
        let cancel = std::mem::replace(&mut self.cancel, CancellationToken::new());
        SteppedDown {
            _cancel: cancel.drop_guard(),
            _tasks: std::mem::take(&mut self.tasks),
        }
    }

    fn mark_unsynced(&self) {
        for s in &self.stats {
            s.set_synced(false);
        }
    }

    /// Stops every peer: the watch stops, txns in flight finish (or are
    /// abandoned after [`MirrorConfig::shutdown_grace`]), keep-alives stop.
    /// Leases are never revoked.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
        self.mark_unsynced();
    }
}

/// An engine that stepped down: its tasks write nothing and keep the peer
/// leases alive until one lease TTL has passed or this is dropped.
#[derive(Debug)]
pub struct SteppedDown {
    _cancel: tokio_util::sync::DropGuard,
    _tasks: Vec<JoinHandle<()>>,
}

// By hand: a summary, not every peer's counters (those are in `stats`).
impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("holder", &format_args!("{:016x}", self.holder))
            .field("peers", &self.stats.len())
            .field("synced", &self.is_synced())
            .field("tasks", &self.tasks.len())
            .field("cancelled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn validate<'a>(cfg: &MirrorConfig, peers: impl Iterator<Item = &'a str>) -> Result<()> {
    let bad = |m: String| Err(Error::Config(m));
    validate_segment("region", &cfg.region).map_err(|e| Error::Config(e.to_string()))?;
    Schema::new(cfg.root.clone()).map_err(|e| Error::Config(e.to_string()))?;
    if cfg.lease_ttl < MIN_LEASE_TTL {
        return bad(format!(
            "lease TTL {:?} is below etcd's shortest lease, {MIN_LEASE_TTL:?} (at its default election timeout, etcd grants 2 s when asked for less)",
            cfg.lease_ttl
        ));
    }
    if cfg.limits.max_ops < 2 || cfg.peer_limits.values().any(|l| l.max_ops < 2) {
        return bad("max txn ops must be at least 2".into());
    }
    if cfg.max_concurrent_syncs == 0 {
        return bad("max concurrent syncs must be at least 1".into());
    }
    if !cfg.state_root.starts_with('/') || !cfg.state_root.ends_with('/') {
        return bad(format!(
            "state root {:?} must start and end with '/'",
            cfg.state_root
        ));
    }
    if cfg.state_root.starts_with(&cfg.root) || cfg.root.starts_with(&cfg.state_root) {
        return bad(format!(
            "state root {:?} must lie outside the registry root {:?}",
            cfg.state_root, cfg.root
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for p in peers {
        validate_segment("peer region", p).map_err(|e| Error::Config(e.to_string()))?;
        if p == cfg.region {
            return bad(format!("peer region {p:?} is this region"));
        }
        if !seen.insert(p) {
            return bad(format!("duplicate peer region {p:?}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_configs() {
        let cfg = MirrorConfig::new("a");
        assert!(validate(&cfg, ["b", "c"].into_iter()).is_ok());
        let err =
            |c: &MirrorConfig, p: &[&str]| validate(c, p.iter().copied()).unwrap_err().to_string();
        assert!(err(&cfg, &["a"]).contains("is this region"));
        assert!(err(&cfg, &["b", "b"]).contains("duplicate"));
        assert!(err(&cfg, &["b/c"]).contains("'/'"));
        let mut c = cfg.clone();
        c.region = String::new();
        assert!(err(&c, &[]).contains("empty"));
        let mut c = cfg.clone();
        c.lease_ttl = std::time::Duration::from_secs(1);
        assert!(err(&c, &[]).contains("shortest lease"));
        let mut c = cfg.clone();
        c.state_root = "/aether/v1/regions/x/".into();
        assert!(err(&c, &[]).contains("outside"));
    }
}
