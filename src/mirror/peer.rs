//! One peer's replication task: what it holds across sessions.
//!
//! The task itself is split by job: the session lifecycle
//! ([`super::session`]), the claim and lease ([`super::claim`]) and the
//! live loop ([`super::live`]), each an `impl Peer` of its own over this
//! state. What is learnt about the link (the adaptive window, the
//! discovered txn limits: [`super::pipeline::Link`]) outlives sessions.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::config::MirrorConfig;
use super::count::CountSplits;
use super::limits::Limits;
use super::pipeline::Link;
use super::stats::{PeerStats, ResyncReason};
use super::verify::VerifySchedule;
use super::window::Pacer;
use super::writer::FencedWriter;
use crate::etcd::{Client, LeaseHandle};

/// One peer's replication task (see the module doc).
pub(crate) struct Peer {
    pub(super) writer: FencedWriter,
    pub(super) local: Client,
    pub(super) cfg: Arc<MirrorConfig>,
    pub(super) prefix: Bytes,
    pub(super) cancel: CancellationToken,
    /// Set when the owner steps down: stop writing at once, but keep the
    /// lease alive for one more TTL so a successor can adopt it.
    pub(super) pause: CancellationToken,
    /// No session has claimed the peer yet.
    pub(super) fresh: bool,
    /// The next session re-syncs in full, for this reason (the source or
    /// the peer changed under the copy, or the copy went stale).
    pub(super) force_sync: Option<ResyncReason>,
    /// A predecessor's lease whose TTL differs from ours, kept alive until
    /// the subtree is re-put under our own lease.
    pub(super) prev_lease: Option<LeaseHandle>,
    /// When the last range-diff sync started, Unix ms.
    pub(super) sync_started_ms: i64,
    /// A sync of this engine's started and has not completed: the next
    /// one is counted as `interrupted`.
    pub(super) sync_pending: bool,
    /// The source's revision when the session resumed a copy: until the
    /// watermark passes it, the peer may hold a predecessor's writes beyond
    /// the watermark, and key counts can't be compared (0: no such span).
    pub(super) replay_horizon: i64,
    /// `<state_root><region>/source-id` in the local etcd: the source's
    /// own id ([`super::state::source_id`]).
    pub(super) source_id_key: Bytes,
    /// The verification schedule: it belongs to the peer, not to a
    /// session, so a session that restarts more often than the interval
    /// still gets verified.
    pub(super) verify: VerifySchedule,
    /// The adaptive window and the discovered limits: they outlive
    /// sessions, so what was learnt about the link in the sync carries into
    /// the live phase and across retries.
    pub(super) link: Link,
    /// The engine's sync slots ([`MirrorConfig::max_concurrent_syncs`]),
    /// shared by all its peers.
    pub(super) sync_slots: Arc<Semaphore>,
    /// Where the freshness probe splits its key counts: learnt from the
    /// keys written, so it outlives sessions like the copy does.
    pub(super) splits: CountSplits,
}

impl Peer {
    pub(crate) fn new(
        region: String,
        local: Client,
        peer: Client,
        cfg: Arc<MirrorConfig>,
        stats: Arc<PeerStats>,
        holder: u64,
        // The engine's handles every peer shares: its stop, its step-down,
        // its sync slots.
        (cancel, pause, sync_slots): (CancellationToken, CancellationToken, Arc<Semaphore>),
    ) -> Peer {
        // Staleness counts from this engine's start until a store says
        // better (a resumed state key's heartbeat, or a probe): counters
        // kept across leadership terms must not make a new leader's copy
        // look as old as the process.
        stats.reset_current();
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
            writer: FencedWriter::new(region, peer, Bytes::from(cfg.state_key()), holder, stats),
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
            source_id_key,
            verify,
            sync_slots,
            splits: CountSplits::default(),
        }
    }

    pub(super) fn region(&self) -> &str {
        &self.writer.region
    }

    pub(super) fn stats(&self) -> &PeerStats {
        &self.writer.stats
    }
}
