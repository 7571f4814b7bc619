//! The engine's settings.

use std::collections::BTreeMap;
use std::time::Duration;

use super::clock::Clock;
use crate::etcd::{ClientConfig, TxnLimits};

/// Default TTL of the lease each peer holds for this region's copy.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
/// Default cap on the mirror txns in flight to one peer. The window itself
/// adapts (see `window`); the cap must cover the bandwidth-delay product of
/// the longest link: 80k keys/s × 250 ms ≈ 160 txns of 127 puts.
pub const DEFAULT_MAX_INFLIGHT_TXNS: usize = 256;
/// Default HTTP/2 connections to each peer endpoint
/// ([`ClientConfig::connections`]). etcd's server (grpc-go) opens each
/// connection's receive window at 64 KiB and doubles it at most every
/// second round trip while it is kept full (its BDP estimator needs a
/// sample of two thirds of the new window, and the first round trip after
/// a doubling still carries the old one). The session start's warming
/// takes each to ~120 KiB before the first data txn, so the connections
/// alone set what a sync's first round trips can carry: 8 gave ~0.9 MiB
/// per round trip for the first two at 250 ms, where the peer applies
/// ~4 MiB in one; 32 carry that from the first (BENCHMARKS.md §7). An idle
/// connection costs a keep-alive ping per interval and some tens of KiB
/// of buffers on each side (grpc-go reads and writes through 32 KiB ones).
pub const DEFAULT_PEER_CONNECTIONS: usize = 32;
/// Default cap on the request bytes in flight to one peer, so memory stays
/// flat whatever the values' size (each txn in flight is held twice: the
/// encoded request and the ops kept for a retry).
pub const DEFAULT_MAX_INFLIGHT_BYTES: usize = 16 << 20;
/// Default keys per page when scanning the source and the peer. Large
/// because etcd 3.4 walks its index over the whole rest of a range for every
/// limited page (the scan's windows soften that, see `etcd::Scan`); memory
/// is about four pages per running sync, ~8 MiB at 200-byte entries.
/// A page is also bounded by bytes ([`etcd::DEFAULT_PAGE_BYTES`], 16 MiB,
/// and at most a quarter of the client's decode limit): with large values
/// it holds fewer keys, so a page always fits the decode limit and the
/// sync's memory stays under ~64 MiB per running sync whatever the values' size.
///
/// [`etcd::DEFAULT_PAGE_BYTES`]: crate::etcd::DEFAULT_PAGE_BYTES
pub const DEFAULT_PAGE_SIZE: usize = 10_000;
/// Default cap on the range-diff syncs one engine runs at once, over all
/// its peers. Each sync holds a few pages of both sides (about 15 MiB at
/// pages of 10,000 ~250-byte entries) and reads the whole source subtree
/// again, so at ten regions nine concurrent syncs held over 150 MiB per
/// replicator and loaded every etcd with nine writers at once; four keep a
/// replicator under 100 MiB (BENCHMARKS.md §4). Further peers wait for a
/// slot: on links where each peer's write rate, not the source, bounds a
/// sync, raise it to the number of peers to start them all at once.
pub const DEFAULT_MAX_CONCURRENT_SYNCS: usize = 4;
/// Default cap on the backoff between attempts to reach a failing peer.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The shortest lease TTL the engine asks for: etcd grants at least
/// `ceil(1.5 × election timeout)` (2 s at its default 1 s election timeout)
/// whatever is asked, and a lease granted with another TTL than the
/// configured one reads as a changed TTL to the next session.
pub const MIN_LEASE_TTL: Duration = Duration::from_secs(2);
/// Default prefix, outside the registry root, of the per-origin state keys
/// the engine keeps on each peer.
pub const DEFAULT_STATE_ROOT: &str = "/aether/v1/replication/";
/// Default lag, in source revisions, past which a resume re-syncs by range
/// instead of catching up through the watch (etcd replays history at about
/// 6k revisions/s, a range diff reads tens of thousands of keys/s).
pub const DEFAULT_RESYNC_LAG: i64 = 100_000;
/// Default time a clean shutdown gives the txns in flight, and the final
/// state write, before abandoning them. Abandoning is safe (the successor's
/// fence refuses anything late, and it replays from the state revision);
/// waiting longer only delays the process manager.
pub(crate) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(3);
/// Default interval of the freshness probe: how often the engine checks
/// the source's and the peer's identity and revision, and writes the
/// heartbeat into the state key when the copy is current. It is also the
/// resolution of `peer_staleness_seconds`.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
/// Default bound on staleness before the engine lets a peer's copy lapse
/// on purpose (after a re-sync that did not help). Five minutes: long
/// enough that a peer restart, a leader election or a large re-sync never
/// trips it, short enough that consumers do not route to a region's
/// endpoints of long ago. See README, "Exact, current, or gone".
pub const DEFAULT_LAPSE_AFTER: Duration = Duration::from_secs(300);
/// Default interval at which txn limits found below the configured ones
/// (a peer run with a lower `--max-txn-ops` or `--max-request-bytes`) are
/// probed again, so a peer whose limits were raised gets them back.
pub const DEFAULT_LIMIT_REPROBE: Duration = Duration::from_secs(60);
/// Default interval of the verification pass (anti-entropy). An hour: the
/// copy watch (`live/copy.rs`) sees every change to the copy as it happens,
/// and a gap in it brings a pass at once, so the scheduled pass is only the
/// backstop for what no watch shows. Each pass reads the whole subtree on
/// both etcds: at 10 minutes, ten regions of 100k keys spent about 0.5
/// CPU-seconds a second of their etcds on passes alone
/// (docs/benchmarks-log.md §10). A pass that would compare only what the
/// last one found exact, neither side having changed since, is skipped
/// (`verify::Unchanged`), at most 23 in a row.
pub const DEFAULT_VERIFY_INTERVAL: Duration = Duration::from_secs(3600);
/// Default interval of the backstop count: how often, at most, the probe
/// compares the copy's key count with the source's once a count matched
/// and the copy watch sees every change (`live/copy.rs`). Ten minutes: the
/// count only re-checks what the watch already saw (a watch that had to
/// be re-armed brings a count at once), and each count walks the subtree
/// on both etcds. At three minutes the counts were a third of what ten
/// regions of 100k keys cost their etcds at rest (docs/benchmarks-log.md
/// §10). A count due while neither watch delivered anything since the last
/// one is skipped, at most five in a row (`count::Cadence`).
pub const DEFAULT_RECOUNT_INTERVAL: Duration = Duration::from_secs(600);
/// Default pace of the verification pass, in keys read per second per
/// peer: about a tenth of what one range-diff sync reads, so the pass never
/// starves the peer's own writers.
pub const DEFAULT_VERIFY_RATE: u32 = 5_000;

/// What the engine mirrors, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorConfig {
    /// This region: the engine mirrors `<root><region>/` and nothing else.
    pub region: String,
    /// The registry root, `/aether/v1/regions/` by default.
    pub root: String,
    /// TTL of the peer-side lease.
    pub lease_ttl: Duration,
    /// The peers' txn limits.
    pub limits: TxnLimits,
    /// Limits of their own for some peers, by region, in place of
    /// `limits` (a peer whose etcd runs with other `--max-txn-ops` or
    /// `--max-request-bytes`).
    pub peer_limits: BTreeMap<String, TxnLimits>,
    /// Cap on the adaptive window: mirror txns in flight to one peer.
    pub max_inflight: usize,
    /// Cap on the request bytes in flight to one peer.
    pub max_inflight_bytes: usize,
    /// Keys per page in the initial sync.
    pub page_size: usize,
    /// Range-diff syncs run at once over all peers (at least 1); the
    /// others wait for a slot before pinning the source.
    pub max_concurrent_syncs: usize,
    /// Cap on the retry backoff for a failing peer.
    pub max_backoff: Duration,
    /// Prefix of the state key; the key is `<state_root><region>/state`.
    pub state_root: String,
    /// Resume lag (in revisions) past which a range diff replaces the
    /// watch catch-up.
    pub resync_lag: i64,
    /// How long a clean shutdown waits for txns in flight.
    pub shutdown_grace: Duration,
    /// Interval of the freshness probe and heartbeat.
    pub heartbeat_interval: Duration,
    /// Staleness past which a peer's copy is let lapse; `None`: never.
    pub lapse_after: Option<Duration>,
    /// Interval of the verification pass; `None`: off.
    pub verify_interval: Option<Duration>,
    /// Keys per second the verification pass reads, per peer.
    pub verify_rate: u32,
    /// How often limits found below `limits` are probed again.
    pub limit_reprobe: Duration,
    /// How often, at most, the probe counts a copy that the copy watch
    /// follows (once a count matched); `Duration::ZERO`: by the subtree's
    /// size alone, as without the watch (see `count::Cadence`).
    pub recount_interval: Duration,
    /// Whether each live phase watches its copy on the peer and repairs
    /// out-of-band changes at once (`live/copy.rs`). Off, only the count
    /// and the verification pass see them: for tests of those backstops.
    #[doc(hidden)]
    pub copy_watch: bool,
    /// The wall clock and the source of fresh ids ([`Clock::system`]
    /// unless a simulation supplies its own).
    #[doc(hidden)]
    pub clock: Clock,
}

impl MirrorConfig {
    /// A config for `region` with every other setting at its default.
    pub fn new(region: impl Into<String>) -> Self {
        MirrorConfig {
            region: region.into(),
            root: crate::schema::DEFAULT_ROOT.to_string(),
            lease_ttl: DEFAULT_LEASE_TTL,
            limits: TxnLimits::default(),
            peer_limits: BTreeMap::new(),
            max_inflight: DEFAULT_MAX_INFLIGHT_TXNS,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            page_size: DEFAULT_PAGE_SIZE,
            max_concurrent_syncs: DEFAULT_MAX_CONCURRENT_SYNCS,
            max_backoff: DEFAULT_MAX_BACKOFF,
            state_root: DEFAULT_STATE_ROOT.to_string(),
            resync_lag: DEFAULT_RESYNC_LAG,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            lapse_after: Some(DEFAULT_LAPSE_AFTER),
            verify_interval: Some(DEFAULT_VERIFY_INTERVAL),
            verify_rate: DEFAULT_VERIFY_RATE,
            limit_reprobe: DEFAULT_LIMIT_REPROBE,
            recount_interval: DEFAULT_RECOUNT_INTERVAL,
            copy_watch: true,
            clock: Clock::system(),
        }
    }

    /// With another freshness-probe interval.
    #[must_use]
    pub fn with_heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// With another staleness bound before lapsing (`None`: never lapse).
    #[must_use]
    pub fn with_lapse_after(mut self, bound: Option<Duration>) -> Self {
        self.lapse_after = bound;
        self
    }

    /// With another verification interval (`None`: no verification).
    #[must_use]
    pub fn with_verify_interval(mut self, interval: Option<Duration>) -> Self {
        self.verify_interval = interval;
        self
    }

    /// With another verification pace, in keys per second.
    #[must_use]
    pub fn with_verify_rate(mut self, keys_per_sec: u32) -> Self {
        self.verify_rate = keys_per_sec.max(1);
        self
    }

    /// With another interval for probing lowered txn limits again.
    #[must_use]
    pub fn with_limit_reprobe(mut self, interval: Duration) -> Self {
        self.limit_reprobe = interval;
        self
    }

    /// With another backstop count interval (see
    /// [`MirrorConfig::recount_interval`]).
    #[must_use]
    pub fn with_recount_interval(mut self, interval: Duration) -> Self {
        self.recount_interval = interval;
        self
    }

    /// Without the copy watch: only the count and the verification pass
    /// see out-of-band changes. For tests of those backstops.
    #[doc(hidden)]
    #[must_use]
    pub fn without_copy_watch(mut self) -> Self {
        self.copy_watch = false;
        self
    }

    /// With a wall clock and an id source of the caller's: for a
    /// simulation that steps each engine's wall clock on its own and
    /// replays a run from its seed.
    #[doc(hidden)]
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The source prefix: `<root><region>/`.
    pub fn prefix(&self) -> String {
        format!("{}{}/", self.root, self.region)
    }

    /// The source id key in the local etcd: `<state_root><region>/source-id`
    /// (see [`super::state`]).
    pub fn source_id_key(&self) -> String {
        format!("{}{}/source-id", self.state_root, self.region)
    }

    /// The state key on each peer: `<state_root><region>/state`.
    pub fn state_key(&self) -> String {
        format!("{}{}/state", self.state_root, self.region)
    }
}

/// One peer region and how to reach its etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerConfig {
    /// The peer's region name.
    pub region: String,
    /// Its etcd.
    pub client: ClientConfig,
}
