//! Over a long link: the engine writes to its peer through the fault proxy
//! with a 250 ms round trip and a narrow bandwidth limit, under traffic
//! that keeps the link full for several lease TTLs.

mod common;

use std::time::{Duration, Instant};

use aether_replicator::etcd::{Client, ClientConfig, LeaseId};
use aether_replicator::mirror::{Engine, ErrorKind, MirrorConfig, ResyncReason};
use common::FaultProxy;
use common::mirror::{PREFIX, Scene, config, converged, key, put_many};

/// One-way delay: a 250 ms round trip.
const ONE_WAY: Duration = Duration::from_millis(125);
/// Bytes per second per direction per connection: a few hundred mirrored
/// keys a second, so the traffic below fills the link for ~10 s.
const BANDWIDTH: u64 = 256 * 1024;
/// A short lease: a keep-alive every second.
const TTL_SECS: u64 = 3;

/// A client for the far peer: a request may wait its turn on the narrow
/// link for seconds, which is congestion, not a dead peer.
fn far_client(endpoint: &str) -> Client {
    let mut cfg = ClientConfig::new([endpoint]);
    cfg.request_timeout = Duration::from_secs(30);
    cfg.connect_timeout = Duration::from_secs(2);
    Client::connect(cfg).expect("client")
}

/// An engine mirroring `src` to the peer behind `proxy`, synced within
/// `within`.
async fn start_synced_over(
    src: &Client,
    proxy: &FaultProxy,
    cfg: &MirrorConfig,
    within: Duration,
) -> Engine {
    let engine = Engine::start(
        src.clone(),
        vec![("b".into(), far_client(&proxy.endpoint()))],
        cfg.clone(),
    )
    .expect("engine");
    tokio::time::timeout(within, engine.wait_synced())
        .await
        .expect("synced over the long link");
    engine
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_never_lapses_on_a_long_full_link() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    let proxy = FaultProxy::start(scene.peer_etcd.client_addr()).await;
    proxy.set_latency(ONE_WAY);
    proxy.set_bandwidth(Some(BANDWIDTH));
    let mut cfg = config(TTL_SECS);
    cfg.page_size = 1000;
    let engine = start_synced_over(&src, &proxy, &cfg, Duration::from_secs(30)).await;
    let stats = engine.stats()[0].clone();
    let lease = LeaseId::new(stats.lease_id.load(std::sync::atomic::Ordering::Relaxed));
    assert!(!lease.is_none());

    // Heavy traffic: 12k keys of ~200 bytes, ~2.4 MB, about ten seconds of
    // the link, written at the source at once.
    let value = "x".repeat(100);
    put_many(&src, (0..12_000).map(|i| (key(i), format!("{value}{i}")))).await;

    // Until the peer holds everything: the keep-alive's age (since the last
    // answered keep-alive) must stay below the TTL, and the peer, asked
    // directly, must always hold the lease.
    let started = Instant::now();
    let mut worst_age = Duration::ZERO;
    let mut min_ttl = i64::MAX;
    let deadline = started + Duration::from_secs(120);
    loop {
        let status = stats.lease_status().expect("a lease is held");
        let age = status.last_ok.map_or(Duration::MAX, |t| t.elapsed());
        worst_age = worst_age.max(age);
        assert!(
            age < Duration::from_secs(TTL_SECS),
            "keep-alive age {age:?} reached the TTL after {:?} of traffic",
            started.elapsed()
        );
        let ttl = dst.lease_time_to_live(lease, false).await.expect("ttl").ttl;
        min_ttl = min_ttl.min(ttl);
        assert!(ttl > 0, "the lease lapsed on the peer");
        if common::mirror::count(&dst, PREFIX).await >= 12_000 {
            break;
        }
        assert!(Instant::now() < deadline, "the traffic never got through");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let busy = started.elapsed();
    converged(&src, &dst, &cfg).await;
    println!(
        "link busy {busy:?}; worst keep-alive age {worst_age:?}; lowest TTL left on the peer {min_ttl}s; window {} txns; rtt {:.3}s",
        stats.window_txns.load(std::sync::atomic::Ordering::Relaxed),
        stats.rtt_seconds()
    );
    assert!(
        busy > Duration::from_secs(2 * TTL_SECS),
        "the link was not full for long enough ({busy:?}) to test anything"
    );
    assert_eq!(stats.errors(ErrorKind::LeaseLost), 0);
    assert_eq!(stats.resyncs(ResyncReason::LeaseLost), 0);
    assert_eq!(
        LeaseId::new(stats.lease_id.load(std::sync::atomic::Ordering::Relaxed)),
        lease,
        "the same lease throughout"
    );
    assert!(
        stats.rtt_seconds() >= 0.25,
        "measured rtt {}",
        stats.rtt_seconds()
    );
    engine.shutdown().await;
}

/// The range diff over a long link reads the peer's copy with several scans
/// at once (src/mirror/diff.rs); whatever the interleaving, the join must
/// see every key in order: a stale copy with extra, missing and changed
/// keys comes out exact, with exactly those keys written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_range_diff_over_a_long_link_repairs_exactly_what_differs() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    let n = 6_000;
    put_many(&src, (0..n).map(|i| (key(i), format!("v{i}")))).await;
    // The peer: every third key missing, every fifth changed, and extras
    // between and after the source's keys.
    let stale = (0..n)
        .filter(|i| i % 3 != 0)
        .map(|i| {
            let v = if i % 5 == 0 {
                format!("old{i}")
            } else {
                format!("v{i}")
            };
            (key(i), v)
        })
        .chain((n..n + 700).map(|i| (format!("{}~extra", key(i)), "x".to_string())))
        .chain((0..300).map(|i| (format!("{}~extra", key(i * 7)), "x".to_string())));
    put_many(&dst, stale).await;
    let missing = (0..n).filter(|i| i % 3 == 0).count() as u64;
    let changed = (0..n).filter(|i| i % 3 != 0 && i % 5 == 0).count() as u64;

    let proxy = FaultProxy::start(scene.peer_etcd.client_addr()).await;
    proxy.set_latency(Duration::from_millis(50));
    let mut cfg = config(10);
    cfg.page_size = 500;
    let engine = start_synced_over(&src, &proxy, &cfg, Duration::from_secs(60)).await;
    converged(&src, &dst, &cfg).await;
    let stats = engine.stats()[0].clone();
    // The first sync has no lease to compare against: every present key is
    // rewritten under the new lease; so count what it had to write.
    let puts = stats.sync_puts.load(std::sync::atomic::Ordering::Relaxed);
    let deletes = stats
        .sync_deletes
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(deletes, 1000, "every extra deleted, nothing else");
    assert_eq!(
        puts, n as u64,
        "{missing} missing and {changed} changed among them"
    );
    engine.shutdown().await;
}
