//! The error type of the mirror engine and the application.
//!
//! The etcd client keeps its own [`crate::etcd::Error`] so that it stands
//! alone; everything above it uses this one, which wraps it.

/// What can go wrong above the etcd client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An invalid setting, refused before anything connects.
    #[error("{0}")]
    Config(String),
    /// An etcd call failed.
    #[error(transparent)]
    Etcd(#[from] crate::etcd::Error),
    /// Another replicator has taken over this region's copy on a peer.
    #[error("fenced on peer {peer}: another replicator holds the mirror")]
    Fenced {
        /// The peer region.
        peer: String,
    },
    /// The peer-side lease expired or was revoked.
    #[error("mirror lease on peer {peer} lost")]
    LeaseLost {
        /// The peer region.
        peer: String,
    },
    /// The state key on a peer changed while this engine was claiming it:
    /// a predecessor's last txns landing, or another engine's claim. The
    /// engine looks again; only a claim it then sees held by another
    /// engine, after its own, fences it.
    #[error("claim of peer {peer} raced another write to its state key")]
    ClaimRaced {
        /// The peer region.
        peer: String,
    },
    /// The state key on a peer vanished (data loss, or an operator).
    #[error("state key on peer {peer} is gone")]
    StateGone {
        /// The peer region.
        peer: String,
    },
    /// Another source claims this region on a peer: its state key names
    /// another source (by the id kept in each source etcd, or by cluster id
    /// for a claim written before source ids), under a lease that is still
    /// alive. Two sites were given the same region name. The incumbent
    /// keeps the peer; this engine writes nothing there until that lease
    /// lapses.
    #[error(
        "conflict on peer {peer}: source {other:016x} already mirrors this region there (same region name at two sites?)"
    )]
    Conflict {
        /// The peer region.
        peer: String,
        /// The other source's id (or its cluster id, for an older claim).
        other: u64,
    },
    /// The source etcd is not the store the copy came from any more: its
    /// cluster id changed or its revision went back (data loss, restore).
    #[error("source changed under the mirror to peer {peer}: {why}")]
    SourceChanged {
        /// The peer region.
        peer: String,
        /// What was seen.
        why: String,
    },
    /// The peer etcd is not the store the engine wrote to any more: its
    /// cluster id changed or its revision went back (restore, data loss).
    #[error("peer {peer} changed under the mirror: {why}")]
    PeerChanged {
        /// The peer region.
        peer: String,
        /// What was seen.
        why: String,
    },
    /// The peer's copy was changed by someone else: the freshness probe
    /// found more or fewer keys than the source held, beyond what the txns
    /// in flight explain (a `del --prefix`, a revoked lease, keys written
    /// out of band).
    #[error("peer {peer}'s copy changed out of band: {why}")]
    CopyChanged {
        /// The peer region.
        peer: String,
        /// What was seen.
        why: String,
    },
    /// The peer's copy could not be brought current within the configured
    /// bound.
    #[error("peer {peer} has been stale for {stale_secs} s")]
    Stale {
        /// The peer region.
        peer: String,
        /// How long, in seconds.
        stale_secs: u64,
    },
    /// A local I/O failure (metrics listener, files).
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
