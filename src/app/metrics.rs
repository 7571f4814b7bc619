//! The metrics and health endpoints.
//!
//! `/metrics` renders the engine's per-peer [`PeerStats`] and the replica's
//! leadership as Prometheus text, written by hand: the format is simple and
//! the engine keeps plain atomics, so no metrics library is needed.
//! `/healthz` answers while the process runs; `/readyz` answers 200 when
//! this replica is a leader whose peers are all synced, or a standby whose
//! election session is healthy.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::mirror::stats::{ErrorKind, LATENCY_BUCKETS, PeerStats, ResyncReason};

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
    pub bound: std::sync::OnceLock<SocketAddr>,
    /// Rotated TLS or password files reloaded, by etcd.
    pub reloads: Arc<super::reload::ReloadCounts>,
}

impl AppState {
    /// Whether `/readyz` answers 200.
    pub fn ready(&self) -> bool {
        if !self.session_ok.load(Relaxed) {
            return false;
        }
        if !self.is_leader.load(Relaxed) {
            return true;
        }
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers.iter().all(|p| p.is_synced())
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut out = String::with_capacity(4096);
        let mut family =
            |name: &str, kind: &str, help: &str, rows: &mut dyn Iterator<Item = (String, f64)>| {
                let _ = writeln!(out, "# HELP aether_replicator_{name} {help}");
                let _ = writeln!(out, "# TYPE aether_replicator_{name} {kind}");
                for (labels, v) in rows {
                    let _ = writeln!(out, "aether_replicator_{name}{labels} {v}");
                }
            };
        let per_peer = |f: &dyn Fn(&PeerStats) -> f64| {
            peers
                .iter()
                .map(|p| (format!("{{peer=\"{}\"}}", escape(&p.region)), f(p)))
                .collect::<Vec<_>>()
                .into_iter()
        };
        family(
            "is_leader",
            "gauge",
            "1 if this replica leads its region and mirrors.",
            &mut std::iter::once((
                String::new(),
                f64::from(u8::from(self.is_leader.load(Relaxed))),
            )),
        );
        family(
            "source_revision",
            "gauge",
            "Newest source revision of this region's subtree seen on the watch.",
            &mut per_peer(&|p| p.source_revision.load(Relaxed) as f64),
        );
        family(
            "applied_revision",
            "gauge",
            "Every source revision up to this one is applied on the peer.",
            &mut per_peer(&|p| p.applied_revision.load(Relaxed) as f64),
        );
        family(
            "lag_revisions",
            "gauge",
            "Source revisions not yet applied on the peer.",
            &mut per_peer(&|p| p.lag() as f64),
        );
        family(
            "events_applied_total",
            "counter",
            "Watch events applied on the peer.",
            &mut per_peer(&|p| p.events.load(Relaxed) as f64),
        );
        family(
            "txns_applied_total",
            "counter",
            "Txns committed on the peer.",
            &mut per_peer(&|p| p.txns.load(Relaxed) as f64),
        );
        family(
            "bytes_applied_total",
            "counter",
            "Request bytes of live batches committed on the peer.",
            &mut per_peer(&|p| p.bytes.load(Relaxed) as f64),
        );
        family(
            "sync_keys_put_total",
            "counter",
            "Keys written by range-diff syncs.",
            &mut per_peer(&|p| p.sync_puts.load(Relaxed) as f64),
        );
        family(
            "sync_keys_deleted_total",
            "counter",
            "Keys deleted by range-diff syncs.",
            &mut per_peer(&|p| p.sync_deletes.load(Relaxed) as f64),
        );
        family(
            "split_revisions_total",
            "counter",
            "Source revisions too large for one txn, split over several.",
            &mut per_peer(&|p| p.split_revisions.load(Relaxed) as f64),
        );
        family(
            "window_txns",
            "gauge",
            "The adaptive window: mirror txns allowed in flight to the peer now.",
            &mut per_peer(&|p| p.window_txns.load(Relaxed) as f64),
        );
        family(
            "window_bytes",
            "gauge",
            "The adaptive window in request bytes.",
            &mut per_peer(&|p| p.window_bytes.load(Relaxed) as f64),
        );
        family(
            "rtt_seconds",
            "gauge",
            "Measured round trip to the peer: the minimum txn commit latency over the last 10 s.",
            &mut per_peer(&|p| p.rtt_seconds()),
        );
        family(
            "peer_up",
            "gauge",
            "1 if the peer answered the last request.",
            &mut per_peer(&|p| f64::from(u8::from(p.up.load(Relaxed)))),
        );
        family(
            "peer_synced",
            "gauge",
            "1 if the peer is synced and mirroring live.",
            &mut per_peer(&|p| f64::from(u8::from(p.is_synced()))),
        );
        family(
            "keepalive_success_total",
            "counter",
            "Lease keep-alives answered by the peer.",
            &mut per_peer(&|p| p.keepalives().0 as f64),
        );
        family(
            "keepalive_failure_total",
            "counter",
            "Lease keep-alive stream failures.",
            &mut per_peer(&|p| p.keepalives().1 as f64),
        );
        family(
            "keepalive_age_seconds",
            "gauge",
            "Seconds since the last answered keep-alive (-1: no lease).",
            &mut per_peer(&|p| {
                p.lease_status()
                    .and_then(|s| s.last_ok)
                    .map_or(-1.0, |t| Instant::now().duration_since(t).as_secs_f64())
            }),
        );
        family(
            "lease_ttl_seconds",
            "gauge",
            "Seconds left on the peer lease, judged from the last keep-alive.",
            &mut per_peer(&|p| p.lease_status().map_or(0.0, |s| s.ttl_left().as_secs_f64())),
        );
        let errors: Vec<(String, f64)> = peers
            .iter()
            .flat_map(|p| {
                ErrorKind::ALL.iter().map(move |k| {
                    (
                        format!("{{peer=\"{}\",kind=\"{}\"}}", escape(&p.region), k.as_str()),
                        p.errors(*k) as f64,
                    )
                })
            })
            .collect();
        family(
            "errors_total",
            "counter",
            "Errors by kind.",
            &mut errors.into_iter(),
        );
        let resyncs: Vec<(String, f64)> = peers
            .iter()
            .flat_map(|p| {
                ResyncReason::ALL.iter().map(move |r| {
                    (
                        format!(
                            "{{peer=\"{}\",reason=\"{}\"}}",
                            escape(&p.region),
                            r.as_str()
                        ),
                        p.resyncs(*r) as f64,
                    )
                })
            })
            .collect();
        family(
            "resyncs_total",
            "counter",
            "Range-diff syncs by reason.",
            &mut resyncs.into_iter(),
        );

        let _ = writeln!(
            out,
            "# HELP aether_replicator_apply_latency_seconds Time from watch receipt to peer commit, per event."
        );
        let _ = writeln!(
            out,
            "# TYPE aether_replicator_apply_latency_seconds histogram"
        );
        for p in &peers {
            let (buckets, count, sum) = p.apply_latency.snapshot();
            let peer = escape(&p.region);
            for (le, n) in LATENCY_BUCKETS.iter().zip(buckets) {
                let _ = writeln!(
                    out,
                    "aether_replicator_apply_latency_seconds_bucket{{peer=\"{peer}\",le=\"{le}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "aether_replicator_apply_latency_seconds_bucket{{peer=\"{peer}\",le=\"+Inf\"}} {count}"
            );
            let _ = writeln!(
                out,
                "aether_replicator_apply_latency_seconds_sum{{peer=\"{peer}\"}} {sum}"
            );
            let _ = writeln!(
                out,
                "aether_replicator_apply_latency_seconds_count{{peer=\"{peer}\"}} {count}"
            );
        }
        // Rotation (app::reload): the local etcd is labelled with this
        // region's name.
        let reloads = self.reloads.snapshot();
        if !reloads.is_empty() {
            let _ = writeln!(
                out,
                "# HELP aether_replicator_reloads_total Rotated TLS or password files reloaded without a restart."
            );
            let _ = writeln!(out, "# TYPE aether_replicator_reloads_total counter");
            for (peer, n) in reloads {
                let _ = writeln!(
                    out,
                    "aether_replicator_reloads_total{{peer=\"{}\"}} {n}",
                    escape(&peer)
                );
            }
        }
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Binds `addr` now (so a bad address fails at startup) and serves until
/// `cancel`.
pub async fn serve(
    addr: SocketAddr,
    state: Arc<AppState>,
    cancel: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
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
            let cancel = cancel.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(req, state.clone()));
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
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match req.uri().path() {
        "/metrics" => (StatusCode::OK, state.render()),
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
            hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
        );
    }
    Ok(resp)
}
