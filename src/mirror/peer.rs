//! One peer's replication task: what it holds across sessions.
//!
//! The task itself is split by job: the session lifecycle
//! ([`super::session`]), the claim and lease ([`super::claim`]) and the
//! live loop ([`super::live`]), each an `impl Peer` of its own over this
//! state. What is learnt about the link (the adaptive window, the
//! discovered txn limits: [`super::pipeline::Link`]) outlives sessions.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::config::MirrorConfig;
use super::limits::Limits;
use super::pipeline::Link;
use super::stats::{PeerStats, ResyncReason, unix_ms};
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
    /// The adaptive window and the discovered limits: they outlive
    /// sessions, so what was learnt about the link in the sync carries into
    /// the live phase and across retries.
    pub(super) link: Link,
}

impl Peer {
    pub(crate) fn new(
        region: String,
        local: Client,
        peer: Client,
        cfg: Arc<MirrorConfig>,
        stats: Arc<PeerStats>,
        holder: u64,
        (cancel, pause): (CancellationToken, CancellationToken),
    ) -> Peer {
        // Staleness counts from this engine's start until a store says
        // better (a resumed state key's heartbeat, or a probe): counters
        // kept across leadership terms must not make a new leader's copy
        // look as old as the process.
        stats.current_unix_ms.store(unix_ms(), Relaxed);
        let link = Link {
            pacer: Pacer::new(cfg.max_inflight, cfg.max_inflight_bytes, Instant::now()),
            limits: Limits::new(cfg.limits, cfg.limit_reprobe),
        };
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
        }
    }

    pub(super) fn region(&self) -> &str {
        &self.writer.region
    }

    pub(super) fn stats(&self) -> &PeerStats {
        &self.writer.stats
    }
}
