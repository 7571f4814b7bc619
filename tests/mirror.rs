//! The mirror engine against real etcd processes.

mod common;

use aether_replicator::etcd::LeaseId;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use aether_replicator::etcd::{Client, Delete, Put, Range, Txn, TxnBatcher, TxnLimits};
use aether_replicator::mirror::{Engine, ResyncReason};
use common::mirror::{
    PREFIX, Scene, client, config, converged, count, key, put_many, start_synced,
};
use common::{Etcd, FaultProxy};

const T: Duration = common::mirror::CONVERGE;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_sync_repairs_a_stale_peer() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    put_many(&src, (0..500).map(|i| (key(i), format!("v{i}")))).await;
    // Another region's subtree in the local etcd is never mirrored.
    src.put(Put::new("/aether/v1/regions/b/x", "foreign"))
        .await
        .unwrap();
    // The peer: 100 keys missing, 50 with another value, 50 value-equal on
    // a foreign lease, 50 value-equal without lease, 30 extra keys.
    let foreign = dst.lease_grant(Duration::from_secs(600)).await.unwrap().id;
    let mut b = TxnBatcher::new(TxnLimits::default());
    for i in 100..500 {
        let (value, lease) = match i {
            100..150 => ("changed".to_string(), LeaseId::NONE),
            150..200 => (format!("v{i}"), foreign),
            200..250 => (format!("v{i}"), LeaseId::NONE),
            _ => (format!("v{i}"), foreign),
        };
        b.put(key(i), value, lease);
    }
    for i in 0..30 {
        b.put(format!("{PREFIX}stale/{i}"), "old", LeaseId::NONE);
    }
    b.put("/outside/untouched", "keep", LeaseId::NONE);
    for t in b.finish() {
        dst.txn(t).await.unwrap();
    }
    let cfg = config(10);
    let engine = Engine::start(src.clone(), vec![("b".into(), dst.clone())], cfg.clone()).unwrap();
    tokio::time::timeout(T, engine.wait_synced()).await.unwrap();
    let report = converged(&src, &dst, &cfg).await;
    assert_eq!(report.source_keys, 500);
    let stats = &engine.stats()[0];
    // Everything was rewritten except nothing: all 400 present keys were on
    // another lease than the fresh one, so all 500 are put; 30 deleted.
    assert_eq!(stats.sync_puts.load(Ordering::Relaxed), 500);
    assert_eq!(stats.sync_deletes.load(Ordering::Relaxed), 30);
    assert_eq!(stats.resyncs(ResyncReason::Initial), 1);
    assert_eq!(count(&dst, "/aether/v1/regions/b/").await, 0);
    assert_eq!(count(&dst, "/outside/").await, 1);
    // Only the registry prefix and the state key were written.
    let all = dst.range(Range::prefix("/")).await.unwrap();
    for kv in all.kvs() {
        let k = String::from_utf8_lossy(kv.key());
        assert!(
            k.starts_with(PREFIX)
                || k == "/aether/v1/replication/a/state"
                || k == "/outside/untouched",
            "unexpected key {k}"
        );
    }
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopted_lease_means_only_changed_keys_are_rewritten() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    put_many(&src, (0..300).map(|i| (key(i), format!("v{i}")))).await;
    let cfg = config(10);
    let e1 = start_synced(&src, dst.clone(), &dst, &cfg).await;
    e1.shutdown().await;
    // Changes while no engine runs; the state revision is still in history,
    // so the successor resumes by watch.
    src.put(Put::new(key(1), "changed")).await.unwrap();
    src.delete(Delete::key(key(2))).await.unwrap();
    let e2 = start_synced(&src, dst.clone(), &dst, &cfg).await;
    let s = &e2.stats()[0];
    assert_eq!(
        s.sync_puts.load(Ordering::Relaxed),
        0,
        "nothing rewritten by a sync"
    );
    assert_eq!(
        s.resyncs(ResyncReason::Initial),
        0,
        "resumed, not re-synced"
    );
    assert_eq!(s.events.load(Ordering::Relaxed), 2);
    e2.shutdown().await;
}

/// Writes to one key wait for the txn in flight on that key, and pile up in
/// the batcher meanwhile: twenty of them reach the peer as one txn holding
/// the last value (etcd refuses a key twice in one txn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_writes_to_one_key_coalesce_into_one_txn() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    // A slow link to the peer keeps the first txn in flight while the
    // other nineteen writes arrive.
    let proxy = FaultProxy::start(scene.peer_etcd.client_addr()).await;
    // No heartbeat after the first: its state-only txn, if its tick fell
    // among the twenty slow writes, would count as a txn of theirs.
    let cfg = config(20).with_heartbeat_interval(Duration::from_secs(3600));
    let engine = start_synced(&src, client(&proxy.endpoint()), &dst, &cfg).await;
    let s = engine.stats()[0].clone();
    let txns_before = s.txns.load(Ordering::Relaxed);
    let events_before = s.events.load(Ordering::Relaxed);
    proxy.set_latency(Duration::from_millis(300));
    src.put(Put::new(key(0), "first")).await.unwrap();
    for i in 1..20 {
        src.put(Put::new(key(0), format!("w{i}"))).await.unwrap();
    }
    let done = tokio::time::timeout(T, async {
        while s.events.load(Ordering::Relaxed) < events_before + 20 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(done.is_ok(), "all twenty events applied");
    proxy.set_latency(Duration::ZERO);
    let v = dst.range(Range::key(key(0))).await.unwrap();
    assert_eq!(v.kvs()[0].value(), "w19");
    // One txn when the watch hands over all twenty together; otherwise the
    // first goes alone and the rest wait for it and coalesce (two, or three
    // if the watch split them across responses). Never one per write. The
    // live loop's first freshness probe goes at once and may land its
    // heartbeat write (a txn of its own) among them: one more.
    let txns = s.txns.load(Ordering::Relaxed) - txns_before;
    assert!((1..=4).contains(&txns), "{txns} txns for 20 writes");
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_puts_overwrites_deletes_and_large_values() {
    let src_etcd = Etcd::builder().extra_args(&["--max-txn-ops=1000"]).start();
    let dst_etcd = Etcd::start();
    let (src, dst) = (client(&src_etcd.endpoint()), client(&dst_etcd.endpoint()));
    let cfg = config(10);
    let engine = Engine::start(src.clone(), vec![("b".into(), dst.clone())], cfg.clone()).unwrap();
    tokio::time::timeout(T, engine.wait_synced()).await.unwrap();

    for i in 0..50 {
        src.put(Put::new(key(i), format!("v{i}"))).await.unwrap();
    }
    for i in 0..20 {
        src.put(Put::new(key(0), format!("again{i}")))
            .await
            .unwrap();
    }
    for i in 40..50 {
        src.delete(Delete::key(key(i))).await.unwrap();
    }
    // One source revision of 300 ops: more than one peer txn can hold.
    src.txn(Txn::new().and_then((1000..1300).map(|i| Put::new(key(i), "bulk"))))
        .await
        .unwrap();
    // 1.2 MiB values in consecutive revisions: one per txn.
    let big = vec![0xabu8; 1200 * 1024];
    for i in 0..3 {
        src.put(Put::new(format!("{PREFIX}big/{i}"), big.clone()))
            .await
            .unwrap();
    }
    converged(&src, &dst, &cfg).await;
    let s = &engine.stats()[0];
    assert!(s.split_revisions.load(Ordering::Relaxed) >= 1);
    let v = dst.range(Range::key(key(0))).await.unwrap();
    assert_eq!(v.kvs()[0].value(), "again19");
    assert_eq!(
        dst.range(Range::key(format!("{PREFIX}big/2")))
            .await
            .unwrap()
            .kvs()[0]
            .value()
            .len(),
        big.len()
    );
    assert!(
        s.applied_revision.load(Ordering::Relaxed) >= s.source_revision.load(Ordering::Relaxed)
    );
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_engine_leaves_keys_that_expire_with_the_lease() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    put_many(&src, (0..50).map(|i| (key(i), "v".to_string()))).await;
    let cfg = config(2);
    let engine = Engine::start(src.clone(), vec![("b".into(), dst.clone())], cfg.clone()).unwrap();
    tokio::time::timeout(T, engine.wait_synced()).await.unwrap();
    let report = converged(&src, &dst, &cfg).await;
    let lease = report.state.unwrap().lease;
    engine.shutdown().await;
    // Not revoked: the keys are still there right after a clean stop.
    assert_eq!(count(&dst, PREFIX).await, 50);
    assert!(
        dst.lease_time_to_live(lease, false)
            .await
            .unwrap()
            .ttl
            .is_some_and(|t| !t.is_zero())
    );
    // With nobody keeping it alive the lease lapses and takes the copy.
    let gone = tokio::time::timeout(T, async {
        while count(&dst, PREFIX).await > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "copy did not expire");
    assert_eq!(
        dst.lease_time_to_live(lease, false).await.unwrap().ttl,
        None
    );
}

/// Polls the peer until `stop`, recording the smallest count seen.
fn watch_count(dst: Client, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<i64> {
    tokio::spawn(async move {
        let mut min = i64::MAX;
        while !stop.load(Ordering::Relaxed) {
            min = min.min(count(&dst, PREFIX).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        min
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_after_a_crash_never_drops_a_key() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    put_many(&src, (0..400).map(|i| (key(i), format!("v{i}")))).await;
    let cfg = config(4);
    let e1 = start_synced(&src, dst.clone(), &dst, &cfg).await;
    let stop = Arc::new(AtomicBool::new(false));
    let poll = watch_count(dst.clone(), stop.clone());
    // The source deletes nothing, so the peer must not either: not a key
    // expiring with the first lease, not a re-sync removing and re-adding.
    let from = dst.range(Range::key("x")).await.unwrap().header.revision + 1;
    let (_ws, mut peer_events) = dst
        .watch(aether_replicator::etcd::WatchOptions::prefix(PREFIX).start_revision(from))
        .unwrap();
    let deletes = Arc::new(AtomicUsize::new(0));
    let counter = {
        let deletes = deletes.clone();
        tokio::spawn(async move {
            while let Ok(Some(r)) = peer_events.message().await {
                let n = r
                    .events
                    .iter()
                    .filter(|e| e.kind == aether_replicator::etcd::EventKind::Delete)
                    .count();
                deletes.fetch_add(n, Ordering::Relaxed);
            }
        })
    };
    // Writes in flight when the first engine dies.
    for i in 400..450 {
        src.put(Put::new(key(i), "new")).await.unwrap();
    }
    e1.abort();
    for i in 450..470 {
        src.put(Put::new(key(i), "new")).await.unwrap();
    }
    let e2 = start_synced(&src, dst.clone(), &dst, &cfg).await;
    // Outlive the first lease's TTL: nothing may expire with it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let report = converged(&src, &dst, &cfg).await;
    stop.store(true, Ordering::Relaxed);
    let min = poll.await.unwrap();
    assert!(
        min >= 400,
        "peer dropped keys during the handoff: min {min}"
    );
    assert_eq!(report.source_keys, 470);
    counter.abort();
    assert_eq!(
        deletes.load(Ordering::Relaxed),
        0,
        "the peer deleted keys during the handoff"
    );
    let s = &e2.stats()[0];
    assert_eq!(
        s.sync_puts.load(Ordering::Relaxed),
        0,
        "a handoff within the TTL rewrites nothing"
    );
    e2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_engines_at_once_are_fenced_and_the_copy_stays_exact() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    put_many(&src, (0..100).map(|i| (key(i), "v0".to_string()))).await;
    let cfg = config(10);
    let mut e1 = Engine::start(src.clone(), vec![("b".into(), dst.clone())], cfg.clone()).unwrap();
    tokio::time::timeout(T, e1.wait_synced()).await.unwrap();
    // The second engine claims the peer: the first one's next txn fails its
    // fence compare and it stops.
    let e2 = Engine::start(src.clone(), vec![("b".into(), dst.clone())], cfg.clone()).unwrap();
    tokio::time::timeout(T, e2.wait_synced()).await.unwrap();
    for round in 1..=5 {
        put_many(&src, (0..100).map(|i| (key(i), format!("v{round}")))).await;
    }
    let fenced = tokio::time::timeout(T, e1.fenced())
        .await
        .expect("first engine fenced");
    assert_eq!(fenced.as_deref(), Some("b"));
    converged(&src, &dst, &cfg).await;
    let v = dst.range(Range::key(key(7))).await.unwrap();
    assert_eq!(v.kvs()[0].value(), "v5");
    assert!(e1.stats()[0].errors(aether_replicator::mirror::ErrorKind::Fenced) >= 1);
    e1.shutdown().await;
    e2.shutdown().await;
}

/// A successor whose claim races the predecessor's own writes to the state
/// key (say, txns still in flight from an aborted engine) looks again
/// rather than taking itself for fenced; once it holds the peer, the
/// predecessor is the one fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_racing_the_predecessors_writes_is_retried() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    let cfg = config(20);
    let mut e1 = start_synced(&src, dst.clone(), &dst, &cfg).await;
    // e1 writes the state key with every batch, many times a second.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (src, stop) = (src.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) && i < 100_000 {
                src.put(Put::new(key(i % 50), format!("{i}")))
                    .await
                    .unwrap();
                i += 1;
            }
        })
    };
    // e2 reaches the peer slowly: between its read of the state key and
    // its compare-and-delete, e1 moves the key on.
    let proxy = FaultProxy::start(scene.peer_etcd.client_addr()).await;
    proxy.set_latency(Duration::from_millis(50));
    let e2 = Engine::start(
        src.clone(),
        vec![("b".into(), client(&proxy.endpoint()))],
        cfg.clone(),
    )
    .unwrap();
    let raced = tokio::time::timeout(T, async {
        while e2.stats()[0].errors(aether_replicator::mirror::ErrorKind::Other) == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    assert!(raced.is_ok(), "e2's claim never raced e1's writes");
    tokio::time::timeout(T, e2.wait_synced())
        .await
        .expect("e2 claims the peer once it is quiet");
    // e1 notices at its next write.
    src.put(Put::new(key(0), "last")).await.unwrap();
    let fenced = tokio::time::timeout(T, e1.fenced())
        .await
        .expect("the predecessor is fenced");
    assert_eq!(fenced.as_deref(), Some("b"));
    let report = converged(&src, &dst, &cfg).await;
    assert_eq!(report.state.map(|s| s.holder), Some(e2.holder()));
    e1.shutdown().await;
    e2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_the_peer_is_cut_off_forces_a_resync() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    let proxy = FaultProxy::start(scene.peer_etcd.client_addr()).await;
    put_many(&src, (0..100).map(|i| (key(i), "v".to_string()))).await;
    let cfg = config(20);
    let engine = start_synced(&src, client(&proxy.endpoint()), &dst, &cfg).await;
    proxy.cut();
    for i in 0..30 {
        src.delete(Delete::key(key(i))).await.unwrap();
    }
    // Let the engine notice the cut so that it resumes from its state.
    src.put(Put::new(key(1000), "during cut")).await.unwrap();
    let s = engine.stats()[0].clone();
    assert!(common::wait_until_async(T, || !s.is_synced()).await);
    let rev = src.range(Range::key("x")).await.unwrap().header.revision;
    src.compact(rev, true).await.unwrap();
    proxy.heal();
    let report = converged(&src, &dst, &cfg).await;
    assert_eq!(report.source_keys, 71);
    assert!(s.resyncs(ResyncReason::Compacted) >= 1);
    engine.shutdown().await;
}

/// etcd-io/etcd#18089: etcd 3.4.23 accepts a watch that starts exactly at
/// the compaction revision, but the compaction has already dropped the
/// deletes of that revision. An engine resuming there must resync rather
/// than lose the delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_at_exactly_the_compaction_revision_is_not_lost() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    let proxy = FaultProxy::start(scene.peer_etcd.client_addr()).await;
    put_many(&src, (0..10).map(|i| (key(i), "v".to_string()))).await;
    let cfg = config(20);
    let engine = start_synced(&src, client(&proxy.endpoint()), &dst, &cfg).await;
    // The state names the source's last revision: a resume starts at the
    // next one.
    let applied = src.range(Range::key("x")).await.unwrap().header.revision;
    let at_head = tokio::time::timeout(T, async {
        loop {
            let r = converged(&src, &dst, &cfg).await;
            if r.state.is_some_and(|s| s.revision == applied) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(at_head.is_ok(), "state never reached revision {applied}");
    proxy.cut();
    let deleted = src
        .delete(Delete::key(key(0)))
        .await
        .unwrap()
        .header
        .revision;
    assert_eq!(deleted, applied + 1);
    let s = engine.stats()[0].clone();
    assert!(common::wait_until_async(T, || !s.is_synced()).await);
    // Compact at the delete itself: its tombstone is gone from history.
    src.compact(deleted, true).await.unwrap();
    proxy.heal();
    let report = converged(&src, &dst, &cfg).await;
    assert_eq!(report.source_keys, 9);
    assert!(s.resyncs(ResyncReason::Compacted) >= 1);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_restart_and_a_cut_longer_than_the_ttl() {
    let (src_etcd, mut dst_etcd) = (Etcd::start(), Etcd::start());
    let src = client(&src_etcd.endpoint());
    let proxy = FaultProxy::start(dst_etcd.client_addr()).await;
    put_many(&src, (0..100).map(|i| (key(i), "v".to_string()))).await;
    let cfg = config(2);
    let engine = Engine::start(
        src.clone(),
        vec![("b".into(), client(&proxy.endpoint()))],
        cfg.clone(),
    )
    .unwrap();
    tokio::time::timeout(T, engine.wait_synced()).await.unwrap();
    let dst = client(&dst_etcd.endpoint());
    converged(&src, &dst, &cfg).await;

    // Down and up again with its data.
    dst_etcd.kill();
    src.put(Put::new(key(500), "while down")).await.unwrap();
    dst_etcd.restart();
    converged(&src, &dst, &cfg).await;

    // Cut off for longer than the TTL: the copy lapses on the peer, and
    // comes back whole after the heal under a new lease.
    proxy.cut();
    let gone = tokio::time::timeout(T, async {
        while count(&dst, PREFIX).await > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "copy did not lapse during the cut");
    src.put(Put::new(key(501), "during cut")).await.unwrap();
    proxy.heal();
    let report = converged(&src, &dst, &cfg).await;
    assert_eq!(report.source_keys, 102);
    assert!(engine.stats()[0].resyncs(ResyncReason::LeaseLost) >= 1);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_convergence() {
    let seed = std::env::var("MIRROR_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026u64);
    println!("randomized_convergence seed {seed}");
    let mut rng = common::mirror::Lcg(seed);
    let (src_etcd, mut dst_etcd) = (Etcd::start(), Etcd::start());
    let src = client(&src_etcd.endpoint());
    let dst = client(&dst_etcd.endpoint());
    let cfg = config(3);
    let mut engine =
        Some(Engine::start(src.clone(), vec![("b".into(), dst.clone())], cfg.clone()).unwrap());
    for step in 0..40 {
        match rng.below(20) {
            0 => {
                let rev = src.range(Range::key("x")).await.unwrap().header.revision;
                src.compact(rev - rng.below(5) as i64, false).await.ok();
            }
            1 => {
                if let Some(e) = engine.take() {
                    if rng.below(2) == 0 {
                        e.abort()
                    } else {
                        e.shutdown().await
                    }
                }
                engine = Some(
                    Engine::start(src.clone(), vec![("b".into(), dst.clone())], cfg.clone())
                        .unwrap(),
                );
            }
            2 => {
                dst_etcd.kill();
                dst_etcd.restart();
            }
            _ => {
                let mut b = TxnBatcher::new(TxnLimits::default());
                for _ in 0..rng.below(30) + 1 {
                    let k = format!("{PREFIX}r/{}", rng.below(200));
                    if rng.below(4) == 0 {
                        b.delete(k);
                    } else {
                        let mut v = vec![0u8; rng.below(64) as usize];
                        v.iter_mut().for_each(|b| *b = rng.below(256) as u8);
                        b.put(k, v, LeaseId::NONE);
                    }
                }
                for t in b.finish() {
                    src.txn(t).await.unwrap();
                }
            }
        }
        if step % 10 == 9 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    converged(&src, &dst, &cfg).await;
    // Byte for byte, beyond what check looks at: every value equal.
    let a = src.range(Range::prefix(PREFIX)).await.unwrap();
    let b = dst.range(Range::prefix(PREFIX)).await.unwrap();
    let pairs = |r: &aether_replicator::etcd::RangeResponse| -> Vec<(Vec<u8>, Vec<u8>)> {
        r.kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
            .collect()
    };
    assert_eq!(pairs(&a), pairs(&b), "seed {seed}");
    if let Some(e) = engine {
        e.shutdown().await;
    }
}

/// The leases `etcd` holds, as etcdctl lists them (hex ids).
/// The leases `etcd` holds, as `etcdctl lease list` shows them: in hex,
/// zero-padded to 16 digits, so they are compared as numbers (an id whose
/// top digit is 0 would not match an unpadded `{:x}`).
fn leases_on(etcd: &Etcd) -> Vec<LeaseId> {
    let out = tokio::task::block_in_place(|| etcd.etcdctl_ok(&["lease", "list"]));
    let mut ids: Vec<LeaseId> = out
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let id = u64::from_str_radix(l, 16)
                .unwrap_or_else(|e| panic!("etcdctl lease list printed {l:?}: {e}"));
            LeaseId::new(id as i64)
        })
        .collect();
    ids.sort();
    ids
}

/// Waits (at most 15 s, well within the 60 s TTL of every lease granted
/// here, so no lease can run out meanwhile) until `etcd` holds exactly
/// `want`; panics naming `what` with what it held.
async fn only_leases(etcd: &Etcd, want: &[LeaseId], what: &str) {
    let mut want = want.to_vec();
    want.sort();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let held = leases_on(etcd);
        if held == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the peer holds leases {held:?}, expected only {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A session without a live lease of its own grants one beside its first
/// reads (a round trip less); every claim that does not end up with it
/// revokes it, so none is left on the peer for a TTL: one that adopts a
/// predecessor's lease instead, one that ends in a conflict with another
/// site, and one cancelled while the grant is in flight. Each lease here
/// has a 60 s TTL, so only a revoke removes it within the test's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_granted_beside_the_claim_never_outlives_a_claim_that_does_not_use_it() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    put_many(&src, (0..50).map(|i| (key(i), format!("v{i}")))).await;
    let cfg = config(60);

    // Adopted: a successor of this site takes over the live lease.
    let first = start_synced(&src, dst.clone(), &dst, &cfg).await;
    let lease = common::mirror::state_on(&dst, &cfg).await.unwrap().lease;
    first.shutdown().await;
    let second = start_synced(&src, dst.clone(), &dst, &cfg).await;
    assert_eq!(
        common::mirror::state_on(&dst, &cfg).await.unwrap().lease,
        lease,
        "the successor adopted the lease"
    );
    only_leases(&scene.peer_etcd, &[lease], "after an adoption").await;

    // A conflict: another site under the same region name finds the peer
    // held, and waits a TTL before it looks again.
    let other_etcd = Etcd::start();
    let other = client(&other_etcd.endpoint());
    put_many(&other, (0..5).map(|i| (key(i), "other".to_string()))).await;
    let rival = Engine::start(other, vec![("b".into(), dst.clone())], cfg.clone()).unwrap();
    let rs = rival.stats()[0].clone();
    common::eventually("the other site conflicted")
        .until(async || {
            common::mirror::when(
                rs.errors(aether_replicator::mirror::ErrorKind::Conflict) >= 1,
                &rs,
            )
        })
        .await;
    only_leases(&scene.peer_etcd, &[lease], "after a conflict").await;
    rival.shutdown().await;

    // Cancelled in flight: a third engine of this site, across a link of
    // 1 s each way, stops 300 ms after it starts; its grant reaches the
    // peer after it stopped, and its answer finds no claim waiting.
    let proxy = FaultProxy::start(scene.peer_etcd.client_addr()).await;
    proxy.set_latency(Duration::from_secs(1));
    let far = client(&proxy.endpoint());
    let third = Engine::start(src.clone(), vec![("b".into(), far)], cfg.clone()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    third.shutdown().await;
    // The grant does arrive (a lease appears) and is then revoked.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while leases_on(&scene.peer_etcd).len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cancelled engine's grant never reached the peer"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    only_leases(&scene.peer_etcd, &[lease], "after a cancelled claim").await;
    assert!(second.is_synced(), "the live engine was never disturbed");
    converged(&src, &dst, &cfg).await;
    second.shutdown().await;
}
