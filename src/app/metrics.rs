//! The metrics and health endpoints.
//!
//! `/metrics` is the Prometheus text format (0.0.4), encoded by
//! `prometheus-client`. Nothing is counted twice: [`AppCollector`] reads the
//! engine's per-peer [`PeerStats`] atomics and the replica's leadership at
//! scrape time, [`ProcessCollector`] reads `/proc/self`, and the build is a
//! constant `aether_replicator_build_info{version,revision} 1`.
//!
//! Every per-peer series carries `origin="<this region>"` next to
//! `peer="<peer region>"`, so that one query over every region's replicas
//! reads as a region x peer matrix without relabelling.
//! The incoming side ([`super::incoming`]) is labelled the same way round:
//! `region="<this region>"` holds the copy `origin="<other region>"` wrote,
//! so `origin` always names the region the data comes from.
//!
//! `/healthz` answers while the process runs; `/readyz` answers 200 when
//! this replica is fine: its local etcd answers and it holds its election
//! role, leader or standby (its election session's keep-alives are answered
//! within the election TTL). Peer health is deliberately not part of it:
//! readiness gates Kubernetes drains and rollouts, and a peer region that is
//! down is not something a drain or a restart of this replica fixes (it
//! would only stall the drain). Peers show in `aether-replicator status`,
//! the metrics and the alerts.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::incoming::Origins;
use super::process::ProcessCollector;
use crate::mirror::stats::{ErrorKind, LATENCY_BUCKETS, PeerStats, ResyncReason, VerifySkip};

/// The prefix of every replicator metric (not of the `process_*` ones).
pub const PREFIX: &str = "aether_replicator_";
/// The crate version, for `build_info`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git revision the binary was built from (`git rev-parse --short
/// HEAD` in build.rs), or "unknown" when built outside a git checkout.
/// `option_env!`, so that a build script output from another checkout
/// sharing the target directory cannot break the build.
pub const REVISION: &str = match option_env!("AETHER_REPLICATOR_REVISION") {
    Some(r) => r,
    None => "unknown",
};
/// The day the binary was built (UTC, `YYYY-MM-DD`; `SOURCE_DATE_EPOCH`'s
/// when the build set it), for `--version`.
pub const BUILD_DATE: &str = match option_env!("AETHER_REPLICATOR_BUILD_DATE") {
    Some(d) => d,
    None => "unknown",
};
/// What `--version` prints after the name, and the start-up log line
/// repeats: "0.1.0 (rev 1a2b3c4, built 2026-12-05)", joined by the build
/// script (`concat!` cannot join constants).
pub const LONG_VERSION: &str = match option_env!("AETHER_REPLICATOR_LONG_VERSION") {
    Some(v) => v,
    None => VERSION,
};

/// What the endpoints report, shared between the replicator and the server.
#[derive(Default)]
pub struct AppState {
    /// This replica leads its region.
    pub is_leader: AtomicBool,
    /// The election session is healthy (leader or standby).
    pub session_ok: AtomicBool,
    /// Per-peer stats; kept across leadership changes.
    pub peers: Mutex<Vec<Arc<PeerStats>>>,
    /// Where the endpoints listen, once bound.
    pub bound: OnceLock<SocketAddr>,
    /// This region: the `origin` label of the per-peer series and the
    /// `region` label of `is_leader`. Set once by the run.
    pub region: OnceLock<String>,
    /// Rotated TLS or password files reloaded, by etcd.
    pub reloads: Arc<super::reload::ReloadCounts>,
    /// The copies other regions mirror into the local etcd, published by
    /// [`super::incoming::run`].
    pub incoming: watch::Sender<Origins>,
}

impl AppState {
    /// Whether `/readyz` answers 200: the election session is healthy, as
    /// leader or standby. Not the peers (see the module docs).
    pub fn ready(&self) -> bool {
        self.session_ok.load(Relaxed)
    }
}

/// The registry `/metrics` encodes: the replicator's own series, the
/// process metrics and the build info.
pub fn registry(state: Arc<AppState>) -> Registry {
    let mut registry = Registry::default();
    registry.register(
        format!("{PREFIX}build"),
        "The version and git revision of this binary; always 1",
        Info::new([("version", VERSION), ("revision", REVISION)]),
    );
    registry.register_collector(Box::new(AppCollector(state)));
    registry.register_collector(Box::new(ProcessCollector));
    registry
}

/// The Prometheus text exposition of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = String::with_capacity(8192);
    // Writing to a String cannot fail; a collector error would be a bug.
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, registry) {
        tracing::error!(error = %e, "encoding metrics failed");
    }
    out
}

/// Reads [`AppState`] (and through it every [`PeerStats`]) at scrape time.
#[derive(Debug)]
pub struct AppCollector(pub Arc<AppState>);

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("region", &self.region.get())
            .field("is_leader", &self.is_leader)
            .finish_non_exhaustive()
    }
}

/// One metric family: its descriptor, then one sample per label set.
/// A family with no samples is left out.
fn family<L: EncodeLabelSet, V>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (L, V)>,
    mut sample: impl FnMut(&mut prometheus_client::encoding::MetricEncoder<'_>, &V) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut rows = rows.into_iter().peekable();
    if rows.peek().is_none() {
        return Ok(());
    }
    let name = format!("{PREFIX}{name}");
    let mut m = enc.encode_descriptor(&name, help, None, kind)?;
    for (labels, v) in rows {
        sample(&mut m.encode_family(&labels)?, &v)?;
    }
    Ok(())
}

fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, V)>,
) -> std::fmt::Result {
    family(enc, name, help, MetricType::Gauge, rows, |m, v| {
        m.encode_gauge(v)
    })
}

/// `name` without `_total`: the encoder appends it to counters.
fn counters<L: EncodeLabelSet, V: EncodeCounterValue>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, V)>,
) -> std::fmt::Result {
    family(enc, name, help, MetricType::Counter, rows, |m, v| {
        m.encode_counter::<NoLabelSet, _, u64>(v, None)
    })
}

/// The rows of a per-peer counter broken down by `label` (the error kinds,
/// the resync reasons): one per peer and value of `all`, named by `name`
/// and counted by `count`. One place for the breakdowns' labels, so that
/// every broken-down family carries the same ones.
fn per_peer_by<K: Copy>(
    peers: &[Arc<PeerStats>],
    origin: &str,
    label: &'static str,
    all: &[K],
    name: fn(K) -> &'static str,
    count: fn(&PeerStats, K) -> u64,
) -> Vec<([(&'static str, String); 3], u64)> {
    peers
        .iter()
        .flat_map(|p| {
            all.iter().map(move |&k| {
                let labels = [
                    ("origin", origin.to_string()),
                    ("peer", p.region.clone()),
                    (label, name(k).to_string()),
                ];
                (labels, count(p, k))
            })
        })
        .collect()
}

impl Collector for AppCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        let state = &self.0;
        let origin = state.region.get().map_or("", String::as_str);
        let peers = state
            .peers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let labels = |p: &PeerStats| [("origin", origin.to_string()), ("peer", p.region.clone())];
        let per_peer = |f: fn(&PeerStats) -> i64| {
            peers
                .iter()
                .map(move |p| (labels(p), f(p)))
                .collect::<Vec<_>>()
        };
        let per_peer_count = |f: fn(&PeerStats) -> u64| {
            peers
                .iter()
                .map(move |p| (labels(p), f(p)))
                .collect::<Vec<_>>()
        };
        let per_peer_secs = |f: fn(&PeerStats) -> f64| {
            peers
                .iter()
                .map(move |p| (labels(p), f(p)))
                .collect::<Vec<_>>()
        };
        let e = &mut enc;

        gauges(
            e,
            "is_leader",
            "1 if this replica leads its region and mirrors.",
            [(
                [("region", origin)],
                i64::from(state.is_leader.load(Relaxed)),
            )],
        )?;
        gauges(
            e,
            "source_revision",
            "Newest source revision of this region's subtree seen on the watch.",
            per_peer(|p| p.source_revision.load(Relaxed)),
        )?;
        gauges(
            e,
            "applied_revision",
            "Every source revision up to this one is applied on the peer.",
            per_peer(|p| p.applied_revision.load(Relaxed)),
        )?;
        gauges(
            e,
            "lag_revisions",
            "Source revisions not yet applied on the peer.",
            per_peer(PeerStats::lag),
        )?;
        counters(
            e,
            "events_applied",
            "Watch events applied on the peer.",
            per_peer_count(|p| p.events.load(Relaxed)),
        )?;
        counters(
            e,
            "txns_applied",
            "Txns committed on the peer.",
            per_peer_count(|p| p.txns.load(Relaxed)),
        )?;
        counters(
            e,
            "bytes_applied",
            "Request bytes of live batches committed on the peer.",
            per_peer_count(|p| p.bytes.load(Relaxed)),
        )?;
        counters(
            e,
            "sync_keys_put",
            "Keys written by range-diff syncs.",
            per_peer_count(|p| p.sync_puts.load(Relaxed)),
        )?;
        counters(
            e,
            "sync_keys_deleted",
            "Keys deleted by range-diff syncs.",
            per_peer_count(|p| p.sync_deletes.load(Relaxed)),
        )?;
        counters(
            e,
            "copy_counts",
            "Key counts of the copy and the source taken by the freshness probe: at a session's start, then every few minutes as a backstop to the copy watch (mirror::count).",
            per_peer_count(|p| p.copy_counts.load(Relaxed)),
        )?;
        counters(
            e,
            "out_of_band_changes",
            "Changes to the copy on the peer that were not this engine's, seen by the copy watch: each turns the copy not current until repaired.",
            per_peer_count(|p| p.out_of_band.load(Relaxed)),
        )?;
        counters(
            e,
            "repaired_keys",
            "Keys the copy watch's repairs rewrote or deleted on the peer, from the source.",
            per_peer_count(|p| p.repaired.load(Relaxed)),
        )?;
        counters(
            e,
            "split_revisions",
            "Source revisions too large for one txn, split over several.",
            per_peer_count(|p| p.split_revisions.load(Relaxed)),
        )?;
        gauges(
            e,
            "window_txns",
            "The adaptive window: mirror txns allowed in flight to the peer now.",
            per_peer(|p| p.window_txns.load(Relaxed) as i64),
        )?;
        gauges(
            e,
            "count_pieces",
            "Ranges the freshness probe's last key count of the subtree was split into, so that no one count holds the store's writes for long.",
            per_peer(|p| p.count_pieces.load(Relaxed) as i64),
        )?;
        gauges(
            e,
            "window_bytes",
            "The adaptive window in request bytes.",
            per_peer(|p| p.window_bytes.load(Relaxed) as i64),
        )?;
        gauges(
            e,
            "rtt_seconds",
            "Measured round trip to the peer: the minimum txn commit latency over the last 10 s.",
            per_peer_secs(PeerStats::rtt_seconds),
        )?;
        gauges(
            e,
            "peer_up",
            "1 if the peer answered the last request.",
            per_peer(|p| i64::from(p.up.load(Relaxed))),
        )?;
        gauges(
            e,
            "peer_synced",
            "1 if the peer is synced and mirroring live.",
            per_peer(|p| i64::from(p.is_synced())),
        )?;
        counters(
            e,
            "keepalive_success",
            "Lease keep-alives answered by the peer.",
            per_peer_count(|p| p.keepalives().0),
        )?;
        counters(
            e,
            "keepalive_failure",
            "Lease keep-alive stream failures.",
            per_peer_count(|p| p.keepalives().1),
        )?;
        gauges(
            e,
            "keepalive_age_seconds",
            "Seconds since the last answered keep-alive (-1: no lease).",
            per_peer_secs(|p| {
                p.lease_status()
                    .and_then(|s| s.last_ok)
                    .map_or(-1.0, |t| Instant::now().duration_since(t).as_secs_f64())
            }),
        )?;
        // Named by meaning: the time left and the granted TTL are two
        // series, so that no rule has to derive one from the other (an
        // earlier `lease_ttl_seconds` was the time left, and a rule that
        // read it as the TTL paged on healthy links).
        gauges(
            e,
            "lease_remaining_seconds",
            "Seconds left on the peer lease now: its granted TTL less the time since the last answered keep-alive (0: no lease).",
            per_peer_secs(|p| p.lease_status().map_or(0.0, |s| s.ttl_left().as_secs_f64())),
        )?;
        gauges(
            e,
            "lease_granted_ttl_seconds",
            "The TTL the peer granted the lease, as its last keep-alive answer renewed it to (0: no lease).",
            per_peer_secs(|p| {
                p.lease_status()
                    .filter(|s| s.last_ok.is_some() && !s.lost)
                    .map_or(0.0, |s| s.ttl.as_secs_f64())
            }),
        )?;
        gauges(
            e,
            "peer_staleness_seconds",
            "Seconds since the peer was last known to hold everything through the source's current revision (0 while current; an idle subtree is current).",
            per_peer_secs(|p| p.staleness().as_secs_f64()),
        )?;
        gauges(
            e,
            "peer_lapsed",
            "1 if the engine let this peer's copy lapse on purpose because it could not be made current.",
            per_peer(|p| i64::from(p.lapsed.load(Relaxed))),
        )?;
        counters(
            e,
            "lapses",
            "Times the engine let this peer's copy lapse on purpose.",
            per_peer_count(|p| p.lapses.load(Relaxed)),
        )?;
        gauges(
            e,
            "peer_conflicted",
            "1 while another source holds this region on the peer (two sites with one region name): this engine writes nothing there and retries once per lease TTL.",
            per_peer(|p| i64::from(p.conflicted.load(Relaxed))),
        )?;
        counters(
            e,
            "conflicts",
            "Times another source claimed this region on the peer (two sites with one region name).",
            per_peer_count(|p| p.conflicts.load(Relaxed)),
        )?;
        counters(
            e,
            "verify_runs",
            "Anti-entropy verification passes completed on the peer.",
            per_peer_count(|p| p.verify_runs.load(Relaxed)),
        )?;
        counters(
            e,
            "verify_repairs",
            "Keys the verification passes repaired on the peer.",
            per_peer_count(|p| p.verify_repairs.load(Relaxed)),
        )?;
        counters(
            e,
            "verify_unchanged",
            "Scheduled verification passes not run because neither the source's subtree nor the copy changed since a pass found the copy exact (at least every 24th runs).",
            per_peer_count(|p| p.verify_unchanged.load(Relaxed)),
        )?;
        counters(
            e,
            "verify_skipped",
            "Verification passes that could not finish, by reason; after several in a row the copy is reported not synced.",
            per_peer_by(
                &peers,
                origin,
                "reason",
                &VerifySkip::ALL,
                VerifySkip::as_str,
                PeerStats::verify_skips,
            ),
        )?;
        gauges(
            e,
            "peer_txn_ops_limit",
            "The peer's txn op limit as discovered (lowered on 'too many operations').",
            per_peer_count(|p| p.txn_ops_limit.load(Relaxed)),
        )?;
        gauges(
            e,
            "peer_request_bytes_limit",
            "The peer's request size limit as discovered (lowered on 'too large').",
            per_peer_count(|p| p.request_bytes_limit.load(Relaxed)),
        )?;
        counters(
            e,
            "errors",
            "Errors by kind.",
            per_peer_by(
                &peers,
                origin,
                "kind",
                &ErrorKind::ALL,
                ErrorKind::as_str,
                PeerStats::errors,
            ),
        )?;
        counters(
            e,
            "resyncs",
            "Range-diff syncs by reason.",
            per_peer_by(
                &peers,
                origin,
                "reason",
                &ResyncReason::ALL,
                ResyncReason::as_str,
                PeerStats::resyncs,
            ),
        )?;
        family(
            e,
            "apply_latency_seconds",
            "Time from watch receipt to peer commit, per event.",
            MetricType::Histogram,
            peers
                .iter()
                .map(|p| (labels(p), p.apply_latency.snapshot())),
            |m, (cumulative, count, sum)| {
                // The encoder wants per-bucket counts and accumulates them.
                let mut prev = 0;
                let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
                    .iter()
                    .zip(cumulative)
                    .map(|(le, c)| {
                        let n = c - prev;
                        prev = *c;
                        (*le, n)
                    })
                    .collect();
                // Buckets and count are separate atomics: an observation
                // racing the scrape must not leave +Inf below a bucket.
                m.encode_histogram::<NoLabelSet>(*sum, (*count).max(prev), &buckets, None)
            },
        )?;
        // Rotation (app::reload): the local etcd is labelled with this
        // region's name.
        counters(
            e,
            "reloads",
            "Rotated TLS or password files reloaded without a restart.",
            state
                .reloads
                .snapshot()
                .into_iter()
                .map(|(peer, n)| ([("origin", origin.to_string()), ("peer", peer)], n)),
        )?;
        counters(
            e,
            "reload_failures",
            "Reload rounds that refused the files on disk (unreadable, expired or not yet valid certificates, a key of another certificate, a missing password file); the files in use are kept. Counted every round while it lasts.",
            state
                .reloads
                .failures()
                .into_iter()
                .map(|(peer, n)| ([("origin", origin.to_string()), ("peer", peer)], n)),
        )?;
        gauges(
            e,
            "certificate_expiry_timestamp_seconds",
            "Unix time at which a TLS file in use stops working: a certificate file's first certificate to expire, a CA bundle's last.",
            state
                .reloads
                .expiries()
                .into_iter()
                .map(|((peer, file), t)| {
                    (
                        [
                            ("origin", origin.to_string()),
                            ("peer", peer),
                            ("file", file),
                        ],
                        t,
                    )
                }),
        )?;

        // The incoming side: labelled by this region and the origin that
        // wrote the copy, as the per-peer series are by origin and peer.
        let incoming = state.incoming.borrow().clone();
        let by_origin = |o: &str| [("region", origin.to_string()), ("origin", o.to_string())];
        gauges(
            e,
            "origin_copy_present",
            "1 if the origin region's state key exists in this region's etcd: its copy is alive.",
            incoming
                .iter()
                .map(|(o, s)| (by_origin(o), i64::from(s.present))),
        )?;
        gauges(
            e,
            "origin_lease_remaining_seconds",
            "Seconds left on the lease of the origin region's copy in this region's etcd, as of the last lookup (0: none).",
            incoming
                .iter()
                .map(|(o, s)| (by_origin(o), s.ttl_left().as_secs_f64())),
        )?;
        gauges(
            e,
            "origin_staleness_seconds",
            "Seconds since the heartbeat the origin region wrote into its state key in this region's etcd.",
            incoming
                .iter()
                .filter_map(|(o, s)| Some((by_origin(o), s.staleness()?.as_secs_f64()))),
        )?;
        Ok(())
    }
}

/// Binds `addr` now (so a bad address fails at startup, naming the flag and
/// the address) and serves until `cancel`.
pub async fn serve(
    addr: SocketAddr,
    state: Arc<AppState>,
    cancel: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                ": another process listens there (another replica on this host?); give each its own --metrics-addr"
            }
            _ => "",
        };
        std::io::Error::new(
            e.kind(),
            format!("--metrics-addr {addr}: cannot listen: {e}{hint}"),
        )
    })?;
    let registry = Arc::new(registry(state.clone()));
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                _ = cancel.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "metrics accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let state = state.clone();
            let registry = registry.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(req, state.clone(), registry.clone()));
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = conn => {}
                }
            });
        }
    });
    Ok((local, task))
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<AppState>,
    registry: Arc<Registry>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match req.uri().path() {
        "/metrics" => (StatusCode::OK, render(&registry)),
        "/healthz" => (StatusCode::OK, "ok\n".to_string()),
        "/readyz" if state.ready() => (StatusCode::OK, "ready\n".to_string()),
        "/readyz" => (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_string()),
        _ => (StatusCode::NOT_FOUND, "not found\n".to_string()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if req.uri().path() == "/metrics" {
        resp.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            ),
        );
    }
    Ok(resp)
}
