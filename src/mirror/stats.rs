//! Per-peer counters and gauges, updated by the engine and read by whoever
//! exports them (the application renders them as Prometheus text).
//!
//! Plain atomics: the engine's hot path pays one relaxed add per update and
//! the engine does not depend on any metrics library.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;
use tokio::time::Instant;

use tokio::sync::watch;

use crate::etcd::LeaseId;
use crate::etcd::LeaseStatus;

/// Why a full range-diff sync ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResyncReason {
    /// First sync of this engine on the peer, with nothing to adopt.
    Initial,
    /// The watch resume revision had been compacted.
    Compacted,
    /// The peer lease expired or was revoked.
    LeaseLost,
    /// A txn's fence compare failed with no other holder (the state key was
    /// removed under the engine).
    Fenced,
    /// The resume lag was past the configured limit.
    Lag,
    /// The source etcd changed under the copy (cluster id, or revision back).
    SourceChanged,
    /// The peer etcd changed under the copy (cluster id, or revision back).
    PeerChanged,
    /// The adopted lease's granted TTL differs from the configured one: a
    /// new lease, and the subtree re-put under it.
    LeaseTtl,
    /// The copy stayed stale past the bound; a re-sync before lapsing.
    Stale,
    /// A sync was interrupted before it completed (the link or the source
    /// failed mid-way), or a copy was left not synced (an out-of-band
    /// change not yet repaired, or a gap in the copy watch not yet
    /// verified, when its writer's session ended); the next session syncs
    /// again.
    Interrupted,
    /// The freshness probe found the copy changed out of band (emptied,
    /// grown, or its keys removed with a revoked lease).
    CopyChanged,
}

impl ResyncReason {
    /// Every reason, in metric order.
    pub const ALL: [ResyncReason; 11] = [
        ResyncReason::Initial,
        ResyncReason::Compacted,
        ResyncReason::LeaseLost,
        ResyncReason::Fenced,
        ResyncReason::Lag,
        ResyncReason::SourceChanged,
        ResyncReason::PeerChanged,
        ResyncReason::LeaseTtl,
        ResyncReason::Stale,
        ResyncReason::Interrupted,
        ResyncReason::CopyChanged,
    ];
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ResyncReason::Initial => "initial",
            ResyncReason::Compacted => "compacted",
            ResyncReason::LeaseLost => "lease_lost",
            ResyncReason::Fenced => "fenced",
            ResyncReason::Lag => "lag",
            ResyncReason::SourceChanged => "source_changed",
            ResyncReason::PeerChanged => "peer_changed",
            ResyncReason::LeaseTtl => "lease_ttl",
            ResyncReason::Stale => "stale",
            ResyncReason::Interrupted => "interrupted",
            ResyncReason::CopyChanged => "copy_changed",
        }
    }
}

/// Why a verification pass could not finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerifySkip {
    /// The revision it compared at was compacted before it finished.
    Compacted,
    /// The session ended while it ran (the link, the source, a handoff).
    Interrupted,
}

impl VerifySkip {
    /// Every reason, in metric order.
    pub const ALL: [VerifySkip; 2] = [VerifySkip::Compacted, VerifySkip::Interrupted];
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            VerifySkip::Compacted => "compacted",
            VerifySkip::Interrupted => "interrupted",
        }
    }
}

/// A class of error, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The peer or the source could not be reached, or a call timed out.
    Unavailable,
    /// A TLS handshake failed: a certificate or CA needs fixing.
    Tls,
    /// Another replicator holds the peer.
    Fenced,
    /// The peer lease was lost.
    LeaseLost,
    /// The source watch start revision was compacted.
    Compacted,
    /// A single value exceeds the peer's request size limit; the key is
    /// deleted on the peer rather than left at an older value.
    TooLarge,
    /// The peer refused a txn for its op count; its limit was lowered.
    TooManyOps,
    /// The peer is out of space (NOSPACE alarm).
    NoSpace,
    /// Another source claims this region on the peer.
    Conflict,
    /// The source or the peer changed under the copy.
    Identity,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Every kind, in metric order.
    pub const ALL: [ErrorKind; 11] = [
        ErrorKind::Unavailable,
        ErrorKind::Tls,
        ErrorKind::Fenced,
        ErrorKind::LeaseLost,
        ErrorKind::Compacted,
        ErrorKind::TooLarge,
        ErrorKind::TooManyOps,
        ErrorKind::NoSpace,
        ErrorKind::Conflict,
        ErrorKind::Identity,
        ErrorKind::Other,
    ];
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Tls => "tls",
            ErrorKind::Fenced => "fenced",
            ErrorKind::LeaseLost => "lease_lost",
            ErrorKind::Compacted => "compacted",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::TooManyOps => "too_many_ops",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Identity => "identity",
            ErrorKind::Other => "other",
        }
    }
}

/// Now, in Unix milliseconds.
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `at` in microseconds since a process-wide origin on the monotonic clock,
/// offset by a day so that a predecessor's heartbeat up to a day old can
/// be placed before the process started.
pub(crate) fn mono_us(at: Instant) -> u64 {
    static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    const DAY_US: u64 = 86_400_000_000;
    let origin = *ORIGIN.get_or_init(Instant::now);
    DAY_US + at.saturating_duration_since(origin).as_micros() as u64
}

/// Upper bounds of the apply-latency histogram buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// A fixed-bucket histogram of durations.
#[derive(Default, Debug)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records `n` observations of `d`.
    pub fn observe(&self, d: Duration, n: u64) {
        let secs = d.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(n, Relaxed);
        }
        self.count.fetch_add(n, Relaxed);
        self.sum_micros.fetch_add(d.as_micros() as u64 * n, Relaxed);
    }
    /// Cumulative counts per bucket (Prometheus `le` semantics), the total
    /// count, and the sum in seconds.
    pub fn snapshot(&self) -> (Vec<u64>, u64, f64) {
        let mut acc = 0;
        let cumulative = self
            .buckets
            .iter()
            .map(|b| {
                acc += b.load(Relaxed);
                acc
            })
            .collect();
        (
            cumulative,
            self.count.load(Relaxed),
            self.sum_micros.load(Relaxed) as f64 / 1e6,
        )
    }
}

/// Everything the engine reports about one peer.
#[derive(Debug)]
pub struct PeerStats {
    /// The peer region.
    pub region: String,
    /// The latest source revision seen on the watch.
    pub source_revision: AtomicI64,
    /// Every source revision up to this one is applied on the peer.
    pub applied_revision: AtomicI64,
    /// Watch events applied.
    pub events: AtomicU64,
    /// Txns committed on the peer.
    pub txns: AtomicU64,
    /// Request bytes committed on the peer.
    pub bytes: AtomicU64,
    /// Keys written by range-diff syncs.
    pub sync_puts: AtomicU64,
    /// Keys deleted by range-diff syncs.
    pub sync_deletes: AtomicU64,
    /// Source revisions that had to be split over several txns.
    pub split_revisions: AtomicU64,
    /// Receipt-to-commit latency of applied events.
    pub apply_latency: Histogram,
    /// The peer answered the last request.
    pub up: AtomicBool,
    /// The peer is in the live phase (synced, mirroring the watch),
    /// published as a signal: see [`PeerStats::synced_signal`].
    synced: watch::Sender<bool>,
    /// The current lease id (0: none).
    pub lease_id: AtomicI64,
    /// When the peer was last known to hold everything through the
    /// source's revision of that moment, Unix ms (engine start until then).
    /// For the state key's heartbeat; staleness is measured on the
    /// monotonic clock instead (`current_mono_us`), so a wall clock set
    /// ahead, here or at a predecessor, can't freeze it.
    pub current_unix_ms: AtomicI64,
    current_mono_us: AtomicU64,
    /// The engine let this copy lapse on purpose (it could not be made
    /// current); cleared by the next complete sync.
    pub lapsed: AtomicBool,
    /// Lapses so far.
    pub lapses: AtomicU64,
    /// Another source holds this region on the peer (see `Error::Conflict`).
    pub conflicted: AtomicBool,
    /// Conflicts seen (episodes).
    pub conflicts: AtomicU64,
    /// Verification passes completed.
    pub verify_runs: AtomicU64,
    /// Keys the verification passes repaired.
    pub verify_repairs: AtomicU64,
    /// Scheduled passes not run: neither the source nor the copy changed
    /// since a pass found the copy exact (`verify::Unchanged`).
    pub verify_unchanged: AtomicU64,
    /// Verification is overdue: several passes in a row could not finish,
    /// so the copy is reported not synced until one does.
    pub verify_overdue: AtomicBool,
    /// The peer's txn op limit as discovered (starts at the configured one).
    pub txn_ops_limit: AtomicU64,
    /// The peer's request size limit as discovered.
    pub request_bytes_limit: AtomicU64,
    /// The adaptive window: txns allowed in flight now.
    pub window_txns: AtomicU64,
    /// Ranges the freshness probe's last key count of the source was
    /// split into (see `mirror::count`).
    pub count_pieces: AtomicU64,
    /// Key counts of the copy the freshness probe has taken (one per
    /// count, source and peer together; see `mirror::count`).
    pub copy_counts: AtomicU64,
    /// Changes to the copy on the peer that were not this engine's, seen
    /// by the copy watch (one per key and revision).
    pub out_of_band: AtomicU64,
    /// Keys the copy watch's repairs rewrote or deleted on the peer.
    pub repaired: AtomicU64,
    /// The adaptive window in request bytes (txn window × mean txn size,
    /// capped by the byte cap).
    pub window_bytes: AtomicU64,
    /// The measured round trip (minimum commit latency over the last 10 s),
    /// in microseconds; see [`PeerStats::rtt_seconds`].
    pub rtt_micros: AtomicU64,
    errors: [AtomicU64; ErrorKind::ALL.len()],
    resyncs: [AtomicU64; ResyncReason::ALL.len()],
    verify_skips: [AtomicU64; VerifySkip::ALL.len()],
    keepalive_base: [AtomicU64; 2],
    lease: Mutex<Option<watch::Receiver<LeaseStatus>>>,
}

impl PeerStats {
    /// Fresh stats for `region`.
    pub fn new(region: impl Into<String>) -> Self {
        PeerStats {
            region: region.into(),
            source_revision: AtomicI64::new(0),
            applied_revision: AtomicI64::new(0),
            events: AtomicU64::new(0),
            txns: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            sync_puts: AtomicU64::new(0),
            sync_deletes: AtomicU64::new(0),
            split_revisions: AtomicU64::new(0),
            apply_latency: Histogram::default(),
            up: AtomicBool::new(false),
            synced: watch::Sender::new(false),
            lease_id: AtomicI64::new(0),
            current_unix_ms: AtomicI64::new(unix_ms()),
            current_mono_us: AtomicU64::new(mono_us(Instant::now())),
            lapsed: AtomicBool::new(false),
            lapses: AtomicU64::new(0),
            conflicted: AtomicBool::new(false),
            conflicts: AtomicU64::new(0),
            verify_runs: AtomicU64::new(0),
            verify_unchanged: AtomicU64::new(0),
            verify_repairs: AtomicU64::new(0),
            verify_overdue: AtomicBool::new(false),
            txn_ops_limit: AtomicU64::new(0),
            request_bytes_limit: AtomicU64::new(0),
            window_txns: AtomicU64::new(0),
            count_pieces: AtomicU64::new(0),
            copy_counts: AtomicU64::new(0),
            out_of_band: AtomicU64::new(0),
            repaired: AtomicU64::new(0),
            window_bytes: AtomicU64::new(0),
            rtt_micros: AtomicU64::new(0),
            errors: Default::default(),
            resyncs: Default::default(),
            verify_skips: Default::default(),
            keepalive_base: Default::default(),
            lease: Mutex::new(None),
        }
    }

    /// Whether the peer is in the live phase now.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }
    /// Changes of the live-phase flag, to wait on instead of polling.
    pub fn synced_signal(&self) -> watch::Receiver<bool> {
        self.synced.subscribe()
    }
    pub(crate) fn set_synced(&self, synced: bool) {
        self.synced
            .send_if_modified(|s| std::mem::replace(s, synced) != synced);
    }

    /// Counts an error.
    pub fn error(&self, kind: ErrorKind) {
        self.errors[kind as usize].fetch_add(1, Relaxed);
    }
    /// Errors of one kind so far.
    pub fn errors(&self, kind: ErrorKind) -> u64 {
        self.errors[kind as usize].load(Relaxed)
    }
    /// Counts a resync.
    pub fn resync(&self, reason: ResyncReason) {
        self.resyncs[reason as usize].fetch_add(1, Relaxed);
    }
    /// Resyncs for one reason so far.
    pub fn resyncs(&self, reason: ResyncReason) -> u64 {
        self.resyncs[reason as usize].load(Relaxed)
    }
    /// Counts a verification pass that could not finish.
    pub fn verify_skip(&self, reason: VerifySkip) {
        self.verify_skips[reason as usize].fetch_add(1, Relaxed);
    }
    /// Verification passes skipped for one reason so far.
    pub fn verify_skips(&self, reason: VerifySkip) -> u64 {
        self.verify_skips[reason as usize].load(Relaxed)
    }
    /// Time since the peer was last known current: 0 while it keeps up,
    /// also when the subtree is idle. On the monotonic clock.
    pub fn staleness(&self) -> Duration {
        let now = mono_us(Instant::now());
        Duration::from_micros(now.saturating_sub(self.current_mono_us.load(Relaxed)))
    }
    /// The peer held everything the source did at `at` (Unix ms `at_unix_ms`
    /// by the engine's clock, never ahead of it).
    ///
    /// Every wall time here comes from the caller, read off the engine's
    /// [`Clock`](super::clock::Clock), never from the system: the lapse
    /// decision compares it with the engine's own, and a simulation's
    /// clock is not the system's.
    pub(crate) fn mark_current(&self, at: Instant, at_unix_ms: i64) {
        self.current_mono_us.fetch_max(mono_us(at), Relaxed);
        // Stored, not the max: a wall clock stepped back must not leave a
        // heartbeat ahead of it.
        self.current_unix_ms.store(at_unix_ms, Relaxed);
    }
    /// Starts the staleness count now (a new engine, or a new leader), at
    /// `now_unix_ms` by the engine's clock.
    pub(crate) fn reset_current(&self, now_unix_ms: i64) {
        self.current_mono_us.store(mono_us(Instant::now()), Relaxed);
        self.current_unix_ms.store(now_unix_ms, Relaxed);
    }
    /// Takes a predecessor's heartbeat (Unix ms, by its clock): the copy
    /// is as old as that says by this engine's clock, which reads
    /// `now_ms`. A heartbeat ahead of this clock is of unknown age and
    /// changes nothing: the count runs on from this engine's own last
    /// mark, or its start.
    pub(crate) fn adopt_heartbeat(&self, heartbeat_unix_ms: i64, now_ms: i64) {
        if heartbeat_unix_ms > now_ms {
            return;
        }
        let age_ms = (now_ms - heartbeat_unix_ms) as u64;
        let now = mono_us(Instant::now());
        self.current_mono_us
            .store(now.saturating_sub(age_ms * 1000), Relaxed);
        self.current_unix_ms
            .store(heartbeat_unix_ms.min(now_ms), Relaxed);
    }

    /// The measured round trip to the peer, in seconds (0 before the first
    /// txn).
    pub fn rtt_seconds(&self) -> f64 {
        self.rtt_micros.load(Relaxed) as f64 / 1e6
    }
    /// Source revisions not yet applied.
    pub fn lag(&self) -> i64 {
        (self.source_revision.load(Relaxed) - self.applied_revision.load(Relaxed)).max(0)
    }

    pub(crate) fn set_lease(&self, id: LeaseId, status: Option<watch::Receiver<LeaseStatus>>) {
        let mut cur = self.lease.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = cur.as_ref() {
            let s = *old.borrow();
            self.keepalive_base[0].fetch_add(s.successes, Relaxed);
            self.keepalive_base[1].fetch_add(s.failures, Relaxed);
        }
        *cur = status;
        self.lease_id.store(id.get(), Relaxed);
    }

    /// The current lease's keep-alive status, if there is a lease.
    pub fn lease_status(&self) -> Option<LeaseStatus> {
        let cur = self.lease.lock().unwrap_or_else(|e| e.into_inner());
        cur.as_ref().map(|r| *r.borrow())
    }

    /// Keep-alive successes and failures, over every lease this engine held.
    pub fn keepalives(&self) -> (u64, u64) {
        let s = self.lease_status();
        (
            self.keepalive_base[0].load(Relaxed) + s.map_or(0, |s| s.successes),
            self.keepalive_base[1].load(Relaxed) + s.map_or(0, |s| s.failures),
        )
    }
}
