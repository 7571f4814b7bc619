//! One replica's life: serve metrics, campaign, mirror while leading, and
//! hand over cleanly on shutdown.
//!
//! ```text
//!   start ──▶ campaign ──won──▶ lead (engine runs) ──shutdown──▶ stop engine,
//!     ▲          │ error                 │ session lost / fenced   resign, exit
//!     │          ▼                       ▼
//!     └──── back off ◀──────────── drop engine at once
//! ```
//!
//! Nothing here is fatal at runtime: an unreachable local etcd or peer is
//! logged, counted, and retried with backoff while the metrics and health
//! endpoints keep answering.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::config::Config;
use super::election::Election;
use super::metrics::{self, AppState};
use super::reload;
use crate::error::Result;
use crate::etcd::{Backoff, Client};
use crate::mirror::{Engine, PeerStats};

/// Longest pause between campaign attempts after errors.
const MAX_CAMPAIGN_BACKOFF: Duration = Duration::from_secs(5);

/// Runs the replicator until `shutdown` resolves.
///
/// Returns an error only for what cannot be retried: a metrics address that
/// cannot be bound, or a config the engine refuses.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<()> {
    run_with_state(config, Arc::new(AppState::default()), shutdown).await
}

/// Like [`run`], sharing the health and metrics state with the caller (for
/// tests that want to watch leadership without scraping).
pub async fn run_with_state(
    config: Config,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let _ = state.region.set(config.region.clone());
    let cancel = CancellationToken::new();
    let _stop_server = cancel.clone().drop_guard();
    let (addr, _server) =
        metrics::serve(config.metrics_addr, state.clone(), cancel.clone()).await?;
    let _ = state.bound.set(addr);
    tracing::info!(
        version = metrics::LONG_VERSION,
        %addr,
        region = %config.region,
        replica_id = %config.replica_id,
        peers = config.peers.len(),
        "replicator started"
    );

    let local = Client::connect(config.local.clone())?;
    let peers: Vec<(String, Client, Arc<PeerStats>)> = config
        .peers
        .iter()
        .map(|p| {
            Ok((
                p.region.clone(),
                Client::connect(p.client.clone())?,
                Arc::new(PeerStats::new(p.region.clone())),
            ))
        })
        .collect::<Result<_>>()?;
    *state.peers.lock().unwrap_or_else(|e| e.into_inner()) =
        peers.iter().map(|(_, _, s)| s.clone()).collect();

    // Rotated certificates and passwords, re-read while this runs; the task
    // (and its client handles) ends with `cancel`, when this returns.
    let mut targets = vec![reload::Target::new(
        config.region.clone(),
        local.clone(),
        config.local_password_file.clone(),
    )];
    for (region, client, _) in &peers {
        targets.push(reload::Target::new(
            region.clone(),
            client.clone(),
            config.peer_password_files.get(region).cloned(),
        ));
    }
    // Certificate expiry shows from the start, reloads or not.
    for t in &targets {
        t.record_expiry(&state.reloads);
    }
    if let Some(interval) = config.reload_interval {
        tokio::spawn(reload::run(
            targets,
            interval,
            state.reloads.clone(),
            cancel.child_token(),
        ));
    }
    // Leader or standby, every replica reports the copies the peers mirror
    // into the local etcd; the task stops with the server's token.
    tokio::spawn(super::incoming::run(
        local.clone(),
        config.mirror.state_root.clone(),
        config.peers.iter().map(|p| p.region.clone()).collect(),
        super::incoming::DEFAULT_TTL_REFRESH,
        state.incoming.clone(),
        cancel.clone(),
    ));

    let election = Election::new(
        local.clone(),
        &config.region,
        config.replica_id.clone(),
        config.election_ttl,
    );
    tokio::pin!(shutdown);
    let mut backoff = Backoff::new(Duration::from_millis(100), MAX_CAMPAIGN_BACKOFF);
    // A deposed engine still keeping the peer leases alive (see
    // `Engine::step_down`); replaced or dropped as leadership changes.
    let mut stepped_down = None;
    loop {
        // Standby: campaign until we lead. `session_ok` says whether the
        // campaign holds a live session (a healthy standby).
        let mut leadership = tokio::select! {
            _ = &mut shutdown => {
                // A standby's queued campaign key would otherwise hold up
                // a handoff for a TTL.
                election.withdraw().await;
                return Ok(());
            }
            r = election.campaign_reporting(&state.session_ok) => match r {
                Ok(l) => l,
                Err(e) => {
                    state.session_ok.store(false, Relaxed);
                    let wait = backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?wait, "campaign failed");
                    if !Backoff::sleep_unless(wait, &mut shutdown).await {
                        return Ok(());
                    }
                    continue;
                }
            },
        };
        backoff.reset();

        // Leader: mirror until shutdown, loss of the session, or a fence.
        let mut engine =
            Engine::start_with_stats(local.clone(), peers.clone(), config.mirror.clone())?;
        // The previous engine's lease keep-alives run until this one has
        // had the chance to adopt the leases.
        let _previous = stepped_down.take();
        state.is_leader.store(true, Relaxed);
        tracing::info!(region = %config.region, "leading: mirroring to every peer");
        enum Why {
            Shutdown,
            Lost,
            Fenced(Option<String>),
        }
        let why = tokio::select! {
            _ = &mut shutdown => Why::Shutdown,
            _ = leadership.lost() => Why::Lost,
            peer = engine.fenced() => Why::Fenced(peer),
        };
        state.is_leader.store(false, Relaxed);
        match why {
            Why::Shutdown => {
                engine.shutdown().await;
                leadership.resign().await;
                tracing::info!("shut down cleanly; mirror leases left to run out or be adopted");
                return Ok(());
            }
            Why::Lost => {
                // Stop writing at once; the fence covers anything in
                // flight. The peer leases stay alive for one more TTL so
                // that a successor (maybe this replica) adopts them.
                stepped_down = Some(engine.step_down());
                state.session_ok.store(false, Relaxed);
            }
            Why::Fenced(peer) => {
                tracing::warn!(peer = ?peer, "another replicator took over a peer; stepping down");
                engine.shutdown().await;
                leadership.resign().await;
                if !Backoff::sleep_unless(config.election_ttl, &mut shutdown).await {
                    return Ok(());
                }
            }
        }
    }
}
