//! One peer's replication task: what it holds across sessions.
//!
//! The task itself is split by job: the session lifecycle
//! ([`self::session`]), the claim and lease ([`self::claim`]) and the
//! live loop ([`super::live`]), each an `impl Peer` of its own over this
//! state. What is learnt about the link (the adaptive window, the
//! discovered txn limits: [`super::send::Link`]) outlives sessions.

mod claim;
#[cfg(test)]
mod fixture;
mod session;

use std::sync::Arc;
use tokio::time::Instant;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::config::MirrorConfig;
use super::count::CountSplits;
use super::diff::Seed;
use super::live::source::Continuity;
use super::live::tick::Ticks;
use super::send::Link;
use super::send::limits::Limits;
use super::send::pacer::Pacer;
use super::send::writer::FencedWriter;
use super::stats::{PeerStats, ResyncReason};
use super::sync::Pinned;
use super::verify::VerifySchedule;
use crate::error::Result;
use crate::store::{Lease, Store};

/// The engine's handles that every peer's task shares.
pub(crate) struct Shared {
    /// The engine's stop (a child token per peer).
    pub(crate) cancel: CancellationToken,
    /// The engine's step-down: stop writing, keep the lease alive.
    pub(crate) pause: CancellationToken,
    /// The engine's sync slots ([`MirrorConfig::max_concurrent_syncs`]).
    pub(crate) sync_slots: Arc<Semaphore>,
    /// The engine's probe clock and the source read its probes share.
    pub(crate) ticks: Arc<Ticks>,
}

/// One peer's replication task (see the module doc).
pub(crate) struct Peer {
    pub(crate) writer: FencedWriter,
    pub(crate) local: Store,
    pub(crate) cfg: Arc<MirrorConfig>,
    pub(crate) prefix: Bytes,
    pub(crate) cancel: CancellationToken,
    /// Set when the owner steps down: stop writing at once, but keep the
    /// lease alive for one more TTL so a successor can adopt it.
    pub(crate) pause: CancellationToken,
    /// No session has claimed the peer yet.
    pub(crate) fresh: bool,
    /// The next session re-syncs in full, for this reason (the source or
    /// the peer changed under the copy, or the copy went stale).
    pub(crate) force_sync: Option<ResyncReason>,
    /// A predecessor's lease whose TTL differs from ours, kept alive until
    /// the subtree is re-put under our own lease.
    pub(crate) prev_lease: Option<Box<dyn Lease>>,
    /// When the last range-diff sync started, Unix ms.
    pub(crate) sync_started_ms: i64,
    /// A sync of this engine's started and has not completed: the next
    /// one is counted as `interrupted`.
    pub(crate) sync_pending: bool,
    /// The source's revision when the session resumed a copy: until the
    /// watermark passes it, the peer may hold a predecessor's writes beyond
    /// the watermark, and key counts can't be compared (0: no such span).
    pub(crate) replay_horizon: i64,
    /// Where the session's copy watch starts, as the claim decided.
    pub(crate) copy_from: i64,
    /// The session resumed a copy another engine wrote last: a change on
    /// it that engine's copy watch saw and did not repair lies before
    /// `copy_from`, where this session's watch cannot see it, so the copy
    /// is current again only after a verification pass begun since (a gap,
    /// `live/fresh.rs` rule 4). Cleared by a sync, which compares every key.
    pub(crate) inherited: bool,
    /// `<state_root><region>/source-id` in the local etcd: the source's
    /// own id ([`super::state::source_id`]).
    pub(crate) source_id_key: Bytes,
    /// Lease ids this peer's claims have drawn (`claim::next_lease_id`).
    pub(crate) lease_draws: u64,
    /// The session's opening of the peer's connections
    /// ([`Peer::open_connections`]): the task, aborted when the next
    /// session replaces it, and whether to warm them, until it starts.
    pub(crate) opening: tokio::task::JoinSet<()>,
    pub(crate) open_pending: Option<bool>,
    /// The verification schedule: it belongs to the peer, not to a
    /// session, so a session that restarts more often than the interval
    /// still gets verified.
    pub(crate) verify: VerifySchedule,
    /// The adaptive window and the discovered limits: they outlive
    /// sessions, so what was learnt about the link in the sync carries into
    /// the live phase and across retries.
    pub(crate) link: Link,
    /// The engine's sync slots ([`MirrorConfig::max_concurrent_syncs`]),
    /// shared by all its peers.
    pub(crate) sync_slots: Arc<Semaphore>,
    /// Where the freshness probe splits its key counts: learnt from the
    /// keys written, so it outlives sessions like the copy does.
    pub(crate) splits: CountSplits,
    /// The source's history as the last phase's watch delivered it, for
    /// the next phase to check (a session that ends when the source's etcd
    /// restarts is followed by one that resumes).
    pub(crate) continuity: Continuity,
    /// The engine's probe clock and shared source read.
    pub(crate) ticks: Arc<Ticks>,
    /// Stops the release of the peer's read buffer after the last sync
    /// (`Peer::release_after_sync`) when dropped.
    pub(crate) releasing: Option<DropGuard>,
}

impl Peer {
    pub(crate) fn new(
        region: String,
        local: Store,
        peer: Store,
        cfg: Arc<MirrorConfig>,
        stats: Arc<PeerStats>,
        holder: u64,
        shared: Shared,
    ) -> Peer {
        let Shared {
            cancel,
            pause,
            sync_slots,
            ticks,
        } = shared;
        // Staleness counts from this engine's start until a store says
        // better (a resumed state key's heartbeat, or a probe): counters
        // kept across leadership terms must not make a new leader's copy
        // look as old as the process.
        stats.reset_current(cfg.clock.unix_ms());
        let link = Link {
            pacer: Pacer::new(cfg.max_inflight, cfg.max_inflight_bytes, Instant::now()),
            limits: Limits::new(cfg.limits, cfg.limit_reprobe),
        };
        let source_id_key = Bytes::from(cfg.source_id_key());
        let verify = VerifySchedule::new(cfg.verify_interval, Instant::now());
        link.pacer.publish(&stats);
        link.limits.publish(&stats);
        Peer {
            link,
            writer: FencedWriter::new(
                region,
                peer,
                Bytes::from(cfg.state_key()),
                holder,
                stats,
                cfg.clock.clone(),
            ),
            prefix: Bytes::from(cfg.prefix()),
            local,
            cfg,
            cancel,
            pause,
            fresh: true,
            force_sync: None,
            prev_lease: None,
            sync_started_ms: 0,
            sync_pending: false,
            replay_horizon: 0,
            copy_from: 0,
            inherited: false,
            source_id_key,
            lease_draws: 0,
            opening: tokio::task::JoinSet::new(),
            open_pending: None,
            verify,
            sync_slots,
            splits: CountSplits::default(),
            continuity: Continuity::default(),
            ticks,
            releasing: None,
        }
    }

    /// Pins a sync of this peer's copy: the source's revision, the watch
    /// opened from the next one, and the first pages of both sides' scans
    /// under way (see [`super::sync::pin`]), and the copy watch from
    /// `copy_from`, the peer's first page being `seed` if the claim read it.
    /// Waits for a sync slot.
    pub(crate) fn pin_sync(
        &self,
        copy_from: i64,
        seed: Option<Seed>,
    ) -> impl std::future::Future<Output = Result<Pinned>> + Send + 'static {
        super::sync::pin(
            self.local.clone(),
            self.writer.client.clone(),
            self.prefix.clone(),
            self.cfg.page_size,
            self.link.pacer.min_rtt(),
            self.sync_slots.clone(),
            self.cfg
                .copy_watch
                .then(|| (copy_from, self.writer.own.clone())),
            seed,
        )
    }

    pub(crate) fn region(&self) -> &str {
        &self.writer.region
    }

    pub(crate) fn stats(&self) -> &PeerStats {
        &self.writer.stats
    }
}
