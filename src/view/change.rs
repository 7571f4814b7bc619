//! What the view emits: one [`Change`] per endpoint added, updated or
//! removed, per origin status change, and per resync.

use std::sync::Arc;

use super::endpoint::Endpoint;
use super::origin::OriginStatus;

/// One change to the view.
#[derive(Clone, Debug)]
pub enum Change {
    /// A new endpoint.
    Added {
        /// The endpoint.
        endpoint: Arc<Endpoint>,
        /// The revision of the change.
        revision: i64,
    },
    /// An endpoint whose value changed. A rewrite of an equal value (a
    /// mirror moving a key to a new lease) is not a change.
    Updated {
        /// Before.
        old: Arc<Endpoint>,
        /// After.
        new: Arc<Endpoint>,
        /// The revision of the change.
        revision: i64,
    },
    /// An endpoint that is gone: deleted, or its origin's lease lapsed.
    Removed {
        /// The endpoint as it was.
        endpoint: Arc<Endpoint>,
        /// The revision of the change.
        revision: i64,
    },
    /// The watch fell behind a compaction and the view took a new snapshot.
    /// The difference from the old view has just been sent as
    /// Added/Updated/Removed changes (the counts say how many).
    Resynced {
        /// The new snapshot's revision.
        revision: i64,
        /// The compaction that forced it, when etcd said.
        compact_revision: Option<i64>,
        /// Endpoints added by the resync.
        added: usize,
        /// Endpoints updated by the resync.
        updated: usize,
        /// Endpoints removed by the resync.
        removed: usize,
    },
    /// An origin was listed or unlisted, or its `synced` or
    /// `state_present` changed (not its heartbeat: read staleness on
    /// demand). A resync sends these too, after its endpoint changes and
    /// before [`Change::Resynced`].
    Origin {
        /// The origin region.
        region: String,
        /// Its status now; `None` once it is no longer listed (no state
        /// key and no endpoints).
        status: Option<OriginStatus>,
        /// The revision of the change.
        revision: i64,
    },
}

impl Change {
    /// The revision at which the view reflects this change.
    pub fn revision(&self) -> i64 {
        match self {
            Change::Added { revision, .. }
            | Change::Updated { revision, .. }
            | Change::Removed { revision, .. }
            | Change::Resynced { revision, .. }
            | Change::Origin { revision, .. } => *revision,
        }
    }

    /// The endpoint concerned (after the change for an update); `None` for
    /// a resync or an origin change.
    pub fn endpoint(&self) -> Option<&Arc<Endpoint>> {
        match self {
            Change::Added { endpoint, .. } | Change::Removed { endpoint, .. } => Some(endpoint),
            Change::Updated { new, .. } => Some(new),
            Change::Resynced { .. } | Change::Origin { .. } => None,
        }
    }

    /// `"added"`, `"updated"`, `"removed"`, `"resynced"` or `"origin"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Change::Added { .. } => "added",
            Change::Updated { .. } => "updated",
            Change::Removed { .. } => "removed",
            Change::Resynced { .. } => "resynced",
            Change::Origin { .. } => "origin",
        }
    }
}
