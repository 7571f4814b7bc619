//! Signals that must not lie, and the holes a chaos soak found: a copy
//! changed out of band is not reported fresh, verification can't be
//! starved or stopped, two sites with one region name never mix, resync
//! reasons say what happened, and a clock can't freeze staleness. Real
//! etcd processes throughout.

mod common;

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use aether_replicator::etcd::{Delete, Put, Range};
use aether_replicator::mirror::{
    Engine, ErrorKind, MirrorConfig, PeerStats, ResyncReason, VerifySkip,
};
use common::mirror::{
    CONVERGE, Scene, backstop, client, converged, fast, key, put_each, put_in_revisions_of,
    put_many, start_synced, when,
};
use common::{Etcd, FaultProxy};

/// Two etcds that share one cluster id and member id, as one manifest
/// deployed at two sites makes them: same member name, advertised peer URL
/// and cluster token (each listens on its own ports).
fn twin_etcds() -> (Etcd, Etcd) {
    let twin = [
        "--initial-advertise-peer-urls=http://127.0.0.1:1",
        "--initial-cluster=twin=http://127.0.0.1:1",
        "--initial-cluster-token=one-manifest",
    ];
    (
        Etcd::builder().name("twin").extra_args(&twin).start(),
        Etcd::builder().name("twin").extra_args(&twin).start(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sites_whose_etcds_share_a_cluster_id_never_mix_their_copies() {
    let (one_etcd, two_etcd) = twin_etcds();
    let peer_etcd = Etcd::start();
    let one = client(&one_etcd.endpoint());
    let two = client(&two_etcd.endpoint());
    let peer = client(&peer_etcd.endpoint());
    let h1 = one.range(Range::key("x")).await.unwrap().header;
    let h2 = two.range(Range::key("x")).await.unwrap().header;
    assert_eq!(h1.cluster_id, h2.cluster_id, "the twins share a cluster id");
    put_each(&one, 0..20, "one").await;
    put_each(&two, 10..30, "two").await;
    let cfg = fast(3);
    let first = start_synced(&one, peer.clone(), &peer, &cfg).await;
    let second = Engine::start(two.clone(), vec![("b".into(), peer.clone())], cfg.clone()).unwrap();
    let s2 = second.stats()[0].clone();
    // The loser keeps retrying (once per lease TTL); each attempt must end
    // in the conflict, never in a takeover.
    common::eventually("the second site retried and conflicted again")
        .until(async || when(s2.errors(ErrorKind::Conflict) >= 2, &s2))
        .await;
    assert!(s2.conflicted.load(Relaxed));
    assert_eq!(s2.conflicts.load(Relaxed), 1, "one episode, counted once");
    assert!(!second.is_synced());
    assert_eq!(s2.txns.load(Relaxed), 0, "the loser wrote nothing");
    assert!(first.is_synced());
    // The incumbent's copy is exactly site one's subtree.
    converged(&one, &peer, &cfg).await;
    first.shutdown().await;
    // Site one is gone for good: its lease lapses, and site two takes over
    // with a full sync of its own subtree.
    converged(&two, &peer, &cfg).await;
    // `initial` once the incumbent's state key expired with its lease;
    // `source_changed` if the takeover read it just before.
    let s2 = &second.stats()[0];
    assert!(
        s2.resyncs(ResyncReason::Initial) + s2.resyncs(ResyncReason::SourceChanged) >= 1,
        "the takeover was not a full sync"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_emptied_or_grown_on_the_peer_is_not_reported_fresh() {
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    put_each(&src, 0..30, "v").await;
    // No verification: only the freshness probe can see it.
    let cfg = backstop(10);
    let engine = start_synced(&src, peer.clone(), &peer, &cfg).await;
    let s = engine.stats()[0].clone();
    // Emptied by hand, as `etcdctl del --prefix` does.
    peer.delete(Delete::prefix(common::mirror::PREFIX))
        .await
        .unwrap();
    common::eventually("the emptied copy is re-synced")
        .until(async || when(s.resyncs(ResyncReason::CopyChanged) >= 1, &s))
        .await;
    converged(&src, &peer, &cfg).await;
    // Grown by hand: keys the source never had.
    for i in 100..110 {
        peer.put(Put::new(key(i), "stray")).await.unwrap();
    }
    common::eventually("the grown copy is re-synced")
        .until(async || when(s.resyncs(ResyncReason::CopyChanged) >= 2, &s))
        .await;
    converged(&src, &peer, &cfg).await;
    assert!(s.errors(ErrorKind::Identity) >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verification_skips_a_value_too_large_for_the_peer_and_repairs_the_rest() {
    let src_etcd = Etcd::start();
    let peer_etcd = Etcd::builder()
        .extra_args(&["--max-request-bytes=65536"])
        .start();
    let (src, peer) = (client(&src_etcd.endpoint()), client(&peer_etcd.endpoint()));
    put_each(&src, 0..10, "v").await;
    src.put(Put::new(key(1), vec![b'x'; 100 * 1024]))
        .await
        .unwrap();
    let cfg = backstop(10).with_verify_interval(Some(Duration::from_millis(300)));
    let engine = Engine::start(src.clone(), vec![("b".into(), peer.clone())], cfg.clone()).unwrap();
    tokio::time::timeout(CONVERGE, engine.wait_synced())
        .await
        .expect("synced");
    let s = engine.stats()[0].clone();
    assert_eq!(peer.range(Range::key(key(1))).await.unwrap().count, 0);
    // An operator's edit of another key: the pass must reach it.
    let runs = s.verify_runs.load(Relaxed);
    peer.put(Put::new(key(5), "edited")).await.unwrap();
    common::eventually("verification repaired the edit")
        .until(async || {
            let v = peer.range(Range::key(key(5))).await.unwrap();
            let held = v.kvs().first().map(|kv| kv.value().clone());
            when(held.as_deref() == Some(b"v5".as_slice()), &s)
                .map_err(|s| format!("{held:?} held; {s}"))
        })
        .await;
    common::eventually("passes keep completing")
        .until(async || when(s.verify_runs.load(Relaxed) >= runs + 2, &s))
        .await;
    assert!(s.verify_repairs.load(Relaxed) >= 1);
    assert!(engine.is_synced());
    assert_eq!(
        peer.range(Range::key(key(1))).await.unwrap().count,
        0,
        "the oversized key stays absent"
    );
    // Counted once, by the sync; the passes skip it quietly.
    assert_eq!(s.errors(ErrorKind::TooLarge), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verification_runs_even_when_sessions_end_sooner_than_its_interval() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    put_each(&src, 0..20, "v").await;
    let proxy = FaultProxy::start(scene.peer_etcd.client_addr()).await;
    let every = Duration::from_secs(2);
    let cfg = fast(10).with_verify_interval(Some(every));
    let engine = start_synced(&src, client(&proxy.endpoint()), &dst, &cfg).await;
    let s = engine.stats()[0].clone();
    dst.put(Put::new(key(3), "edited")).await.unwrap();
    // Every session ends after about half the interval: a timer made per
    // session would never fire.
    let mut cuts = 0;
    while s.verify_runs.load(Relaxed) == 0 && cuts < 12 {
        let mut synced = s.synced_signal();
        tokio::time::timeout(CONVERGE, synced.wait_for(|v| *v))
            .await
            .expect("the session came back")
            .unwrap();
        tokio::time::sleep(every / 2).await;
        proxy.cut();
        tokio::time::timeout(CONVERGE, synced.wait_for(|v| !*v))
            .await
            .expect("the cut ended the session")
            .unwrap();
        proxy.heal();
        cuts += 1;
    }
    assert!(
        s.verify_runs.load(Relaxed) >= 1,
        "no pass completed in {cuts} sessions of half the interval each (skips: {} interrupted)",
        s.verify_skips(VerifySkip::Interrupted)
    );
    converged(&src, &dst, &cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verification_that_cannot_finish_is_counted_and_the_copy_reported_not_synced() {
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    put_many(&src, (0..300).map(|i| (key(i), format!("v{i}")))).await;
    // Small pages read slowly: a compaction lands between two of them.
    let mut cfg = fast(10).with_verify_interval(Some(Duration::from_millis(200)));
    cfg.page_size = 10;
    cfg.verify_rate = 100;
    let engine = start_synced(&src, peer.clone(), &peer, &cfg).await;
    let s = engine.stats()[0].clone();
    let compact = async {
        for _ in 0..600 {
            let rev = src
                .put(Put::new("/elsewhere/tick", "x"))
                .await
                .unwrap()
                .header
                .revision;
            src.compact(rev, false).await.unwrap();
            if s.verify_skips(VerifySkip::Compacted) >= 3 && !s.is_synced() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    };
    assert!(
        compact.await,
        "after {} compacted passes in a row the copy still reads synced={}",
        s.verify_skips(VerifySkip::Compacted),
        s.is_synced()
    );
    // Compactions stop: a pass completes and the copy is vouched for again.
    let mut synced = s.synced_signal();
    tokio::time::timeout(CONVERGE, synced.wait_for(|v| *v))
        .await
        .expect("a pass completed and the copy reads synced again")
        .unwrap();
    assert!(s.verify_runs.load(Relaxed) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_sync_is_counted_as_interrupted() {
    let scene = Scene::start();
    let (src, dst) = scene.clients();
    put_many(&src, (0..3000).map(|i| (key(i), format!("{i:0>200}")))).await;
    let proxy = FaultProxy::start(scene.peer_etcd.client_addr()).await;
    proxy.set_bandwidth(Some(64 * 1024));
    let cfg = fast(10);
    let engine = Engine::start(
        src.clone(),
        vec![("b".into(), client(&proxy.endpoint()))],
        cfg.clone(),
    )
    .unwrap();
    let s = engine.stats()[0].clone();
    // The claim is made (the lease is on the stats) just before the sync
    // starts; at this bandwidth the sync then takes seconds.
    common::eventually("the peer is claimed")
        .until(async || when(s.lease_id.load(Relaxed) != 0, &s))
        .await;
    proxy.cut();
    common::eventually("the cut ended the session")
        .until(async || when(s.errors(ErrorKind::Unavailable) >= 1, &s))
        .await;
    proxy.set_bandwidth(None);
    proxy.heal();
    tokio::time::timeout(CONVERGE, engine.wait_synced())
        .await
        .expect("synced after the cut");
    converged(&src, &dst, &cfg).await;
    assert_eq!(s.resyncs(ResyncReason::Initial), 1);
    assert!(s.resyncs(ResyncReason::Interrupted) >= 1);
    assert_eq!(s.resyncs(ResyncReason::Fenced), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_verifies_the_copy_it_adopts_at_once() {
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    put_each(&src, 0..20, "v").await;
    // An hour between passes and no copy watch: only the takeover's own
    // pass can repair. (The copy watch resumes from past the predecessor's
    // last write, so it sees the edit as out of band too, and its repair
    // raced the pass: the pass then found nothing to repair.)
    let cfg = backstop(10).with_verify_interval(Some(Duration::from_secs(3600)));
    let first = start_synced(&src, peer.clone(), &peer, &cfg).await;
    first.shutdown().await;
    // Edited while no leader runs; the key count stays the same.
    peer.put(Put::new(key(4), "edited")).await.unwrap();
    let second = Engine::start(src.clone(), vec![("b".into(), peer.clone())], cfg.clone()).unwrap();
    let s = second.stats()[0].clone();
    common::eventually("the successor's first pass repaired the edit")
        .until(async || when(s.verify_repairs.load(Relaxed) >= 1, &s))
        .await;
    converged(&src, &peer, &cfg).await;
    assert_eq!(
        s.resyncs(ResyncReason::Initial) + s.resyncs(ResyncReason::Fenced),
        0,
        "the successor resumed the copy rather than re-syncing it"
    );
}

/// A leader that adopts a copy emptied out of band while no leader ran
/// must not report it current before it has counted it: staleness keeps
/// growing from the predecessor's last heartbeat until the copy is whole
/// again (the soak's seed 11 found a new leader marking such a copy
/// current on its first probe, which skipped the count while replaying).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_does_not_report_an_adopted_emptied_copy_fresh() {
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    put_each(&src, 0..30, "v").await;
    // No verification: only the freshness probe's count can find it.
    let cfg = fast(10);
    let first = start_synced(&src, peer.clone(), &peer, &cfg).await;
    first.shutdown().await;
    let emptied_at = std::time::Instant::now();
    peer.delete(Delete::prefix(common::mirror::PREFIX))
        .await
        .unwrap();
    // The source moves on meanwhile, so the successor resumes with a tail
    // to replay (as after a crash, when the state key lags the source),
    // long enough that its first probe goes out while it replays.
    for round in 0..10 {
        put_each(&src, 0..30, &format!("w{round}-")).await;
    }
    let second = Engine::start(src.clone(), vec![("b".into(), peer.clone())], cfg.clone()).unwrap();
    let s = second.stats()[0].clone();
    // From the claim on (it adopts the predecessor's lease and heartbeat).
    common::eventually("the successor claimed the peer")
        .until(async || when(s.lease_status().is_some(), &s))
        .await;
    let copy = async || {
        peer.range(Range::prefix(common::mirror::PREFIX).count_only())
            .await
            .unwrap()
            .count
    };
    let mut samples = 0;
    loop {
        // Staleness first, then the copy: the copy only fills up from
        // here, so an incomplete copy now was incomplete then too, and
        // nothing can have been counted current since it was emptied.
        let (staleness, at) = (s.staleness(), std::time::Instant::now());
        let held = copy().await;
        if held >= 30 {
            break;
        }
        let since_emptied = at - emptied_at;
        assert!(
            staleness + Duration::from_millis(50) >= since_emptied,
            "the copy holds {held} of 30 keys, emptied {since_emptied:?} ago, yet reads {staleness:?} stale (sample {samples})"
        );
        samples += 1;
        assert!(
            emptied_at.elapsed() < CONVERGE,
            "the emptied copy was never restored: it holds {held} keys after {samples} samples"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The replayed tail re-puts every key: the copy is whole again
    // without a re-sync, and only then current.
    converged(&src, &peer, &cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_counted_in_pieces_is_not_reported_fresh_when_one_key_goes() {
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    put_each(&src, 0..30, "v").await;
    let cfg = backstop(10);
    let engine = start_synced(&src, peer.clone(), &peer, &cfg).await;
    let s = engine.stats()[0].clone();
    // Enough keys through the live stream for the probe to count the copy
    // in several pieces: every 4096th key the engine offers becomes a
    // boundary. The sync offered the 30 synced keys, the live stream then
    // offers keys in the order they are written, so the first boundary is
    // key(5065) (the 4096th offered). A re-sync walks the subtree in key
    // order and starts the boundaries afresh: then they are the 4096th and
    // 8192nd keys in key order. The pieces must cover the copy exactly
    // once, or a key lost at or between boundaries would read fresh.
    // Revisions of 64 puts: one revision never spans two of the engine's
    // txns.
    put_in_revisions_of(&src, 64, (1000..10_000).map(|i| (key(i), format!("w{i}")))).await;
    converged(&src, &peer, &cfg).await;
    let sorted = src
        .range(Range::prefix(common::mirror::PREFIX).keys_only())
        .await
        .unwrap();
    let sorted: Vec<String> = sorted
        .kvs()
        .iter()
        .map(|kv| String::from_utf8(kv.key().to_vec()).unwrap())
        .collect();
    let gone_keys = [
        key(5065),
        sorted[8191].clone(),
        sorted[4095].clone(),
        key(7000),
        key(20),
    ];
    for gone in gone_keys {
        resynced_without(&gone, &scene, &s, &cfg).await;
    }
}

/// Deletes `gone` from the peer's copy and waits for the count to notice:
/// a re-sync for a changed copy, then the copy whole again.
async fn resynced_without(gone: &str, scene: &Scene, s: &PeerStats, cfg: &MirrorConfig) {
    let (src, peer) = scene.clients();
    let before = s.resyncs(ResyncReason::CopyChanged);
    peer.delete(Delete::key(gone.to_string())).await.unwrap();
    let what = format!("the copy without {gone} is re-synced");
    common::eventually(&what)
        .until(async || when(s.resyncs(ResyncReason::CopyChanged) > before, s))
        .await;
    converged(&src, &peer, cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revision_once_split_over_txns_does_not_blunt_the_count_for_good() {
    // The source takes 300-op txns, the peer 128: each such revision goes
    // out in three of the engine's txns, and while only the first parts
    // are applied the peer holds keys of a revision above the watermark.
    // The probe must allow for those while they exist, and only then.
    let scene = Scene::with(
        Etcd::builder().extra_args(&["--max-txn-ops=1024"]).start(),
        Etcd::start(),
    );
    let (src, peer) = scene.clients();
    put_each(&src, 0..30, "v").await;
    let cfg = backstop(10);
    let engine = start_synced(&src, peer.clone(), &peer, &cfg).await;
    let s = engine.stats()[0].clone();
    put_in_revisions_of(&src, 300, (1000..1900).map(|i| (key(i), format!("w{i}")))).await;
    converged(&src, &peer, &cfg).await;
    assert!(
        s.split_revisions.load(Relaxed) >= 3,
        "each 300-op revision is split for the peer; split: {}",
        s.split_revisions.load(Relaxed)
    );
    for gone in [1500, 20] {
        resynced_without(&key(gone), &scene, &s, &cfg).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_base_synced_copy_is_counted_in_pieces_from_its_first_probe() {
    // No live traffic at all: the pieces come from the sync's walk of the
    // subtree. Counted in one piece, a count of a large subtree holds the
    // store's writes for its whole walk (the saturated live stall).
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    put_many(&src, (0..9000).map(|i| (key(i), format!("v{i}")))).await;
    let cfg = backstop(10);
    let engine = start_synced(&src, peer.clone(), &peer, &cfg).await;
    let s = engine.stats()[0].clone();
    let pieces = || s.count_pieces.load(Relaxed);
    // 9,000 keys at a boundary every 4,096th: three pieces.
    common::eventually("the probe counts the copy in three pieces")
        .until_eq(3, async || pieces())
        .await;
    // Each piece still counts: a key gone from the peer is noticed.
    resynced_without(&key(4500), &scene, &s, &cfg).await;
    // The re-sync started the pieces afresh rather than adding to them.
    common::eventually("three pieces again after the re-sync")
        .until_eq(3, async || pieces())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_copy_is_counted_every_few_heartbeats_and_reads_fresh_in_between() {
    // 45,000 keys, over twice what the probe counts per heartbeat: it
    // counts every second heartbeat (`mirror::count`), since every count
    // walks the whole subtree on both stores. The probes in between must
    // still mark the copy current (a healthy copy never reads stale), and
    // a copy changed out of band must still be found.
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    put_many(&src, (0..45_000).map(|i| (key(i), format!("v{i}")))).await;
    let cfg = backstop(10);
    let engine = start_synced(&src, peer.clone(), &peer, &cfg).await;
    let s = engine.stats()[0].clone();
    let counts = || s.copy_counts.load(Relaxed);
    common::eventually("the probe has counted the copy")
        .until(async || when(counts() >= 1, &s))
        .await;
    // Every heartbeat that marks the copy current moves this on (ms, and
    // the heartbeats are 300 ms apart).
    let from = counts();
    let mut marks = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + CONVERGE;
    while counts() < from + 4 && tokio::time::Instant::now() < deadline {
        marks.insert(s.current_unix_ms.load(Relaxed));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let counted = counts() - from;
    assert!(
        counted >= 4,
        "not within {CONVERGE:?}: 4 more counts (saw {counted}, and {} marks current)",
        marks.len()
    );
    // Four counts span about eight probes; counting every probe, as before,
    // they would be four or five.
    assert!(
        marks.len() >= 6,
        "{} marks current over {counted} counts: the probes between counts did not mark the copy current, or each probe counted",
        marks.len()
    );
    // Every other probe still counts, and each count still sees one key.
    resynced_without(&key(22_500), &scene, &s, &cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_adopted_without_a_sync_is_counted_in_pieces_after_its_first_pass() {
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    put_many(&src, (0..9000).map(|i| (key(i), format!("v{i}")))).await;
    // An hour between passes: only the takeover's own pass runs.
    let cfg = backstop(10).with_verify_interval(Some(Duration::from_secs(3600)));
    let first = start_synced(&src, peer.clone(), &peer, &cfg).await;
    first.shutdown().await;
    let second = Engine::start(src.clone(), vec![("b".into(), peer.clone())], cfg.clone()).unwrap();
    let s = second.stats()[0].clone();
    // The successor resumes without a sync and writes nothing live: only
    // its verification pass sees the subtree's keys.
    common::eventually("the successor's first pass is done")
        .until(async || when(s.verify_runs.load(Relaxed) >= 1, &s))
        .await;
    common::eventually("the probe counts the copy in three pieces")
        .until_eq(3, async || s.count_pieces.load(Relaxed))
        .await;
    assert_eq!(
        s.resyncs(ResyncReason::Initial) + s.resyncs(ResyncReason::Fenced),
        0,
        "the successor resumed the copy rather than re-syncing it"
    );
}

/// The copy watch: with the probe an hour apart and no verification pass,
/// only the watch on the copy can see a hand edit. Each kind (a stray key,
/// a deleted key, a value edited in place, a `del --prefix` of part of the
/// copy) is seen, counted and repaired key by key, without a re-sync; the
/// engine's own writes, a busy stream of them, never count as out of band.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_band_changes_are_seen_by_the_copy_watch_and_repaired_key_by_key() {
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    put_each(&src, 0..100, "v").await;
    let cfg = common::mirror::config(10)
        .with_heartbeat_interval(Duration::from_secs(3600))
        .with_verify_interval(None);
    let engine = start_synced(&src, peer.clone(), &peer, &cfg).await;
    let s = engine.stats()[0].clone();
    // Our own writes, many txns of them in flight at once.
    put_many(&src, (100..2100).map(|i| (key(i), format!("w{i}")))).await;
    put_each(&src, 0..50, "again").await;
    converged(&src, &peer, &cfg).await;
    assert_eq!(
        s.out_of_band.load(Relaxed),
        0,
        "our own writes read as out of band"
    );

    for (what, edit) in [
        ("a stray key", Edit::Put(key(9_999), "stray")),
        ("a deleted key", Edit::Delete(key(7))),
        ("a value edited in place", Edit::Put(key(8), "edited")),
        (
            "del --prefix of part of the copy",
            Edit::DeletePrefix("/aether/v1/regions/a/clusters/c1/services/s3/".into()),
        ),
    ] {
        let (seen, repaired) = (s.out_of_band.load(Relaxed), s.repaired.load(Relaxed));
        let at = tokio::time::Instant::now();
        edit.apply(&peer).await;
        common::eventually(format!("{what}: seen and repaired"))
            .until(async || {
                when(
                    s.out_of_band.load(Relaxed) > seen && s.repaired.load(Relaxed) > repaired,
                    &s,
                )
            })
            .await;
        converged(&src, &peer, &cfg).await;
        eprintln!("{what}: exact again after {:?}", at.elapsed());
    }
    assert_eq!(
        s.resyncs(ResyncReason::CopyChanged),
        0,
        "repaired, not re-synced"
    );
    // Exact, and current again once the repairs are done.
    common::eventually("the copy reads synced again")
        .until(async || when(s.is_synced(), &s))
        .await;
}

/// One hand edit on a peer.
enum Edit {
    Put(String, &'static str),
    Delete(String),
    DeletePrefix(String),
}

impl Edit {
    async fn apply(&self, peer: &aether_replicator::etcd::Client) {
        match self {
            Edit::Put(k, v) => drop(peer.put(Put::new(k.clone(), *v)).await.unwrap()),
            Edit::Delete(k) => drop(peer.delete(Delete::key(k.clone())).await.unwrap()),
            // Deleting a million keys outlasts etcd's own request timeout;
            // it goes on in the store all the same.
            Edit::DeletePrefix(p) => match peer.delete(Delete::prefix(p.clone())).await {
                Ok(_)
                | Err(
                    aether_replicator::etcd::Error::ServerTimeout(_)
                    | aether_replicator::etcd::Error::Timeout(_),
                ) => {}
                Err(e) => panic!("del --prefix {p}: {e}"),
            },
        }
    }
}

/// The peer compacts past the copy watch while it is cut off, after a
/// stray key was written there: the watch, re-armed from what the peer
/// still has, cannot replay the stray key, so the copy is counted at once,
/// the count finds it, and the copy is re-synced. Without the re-arm's
/// count, the stray key would wait for the backstop (minutes) or the
/// verification pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_watch_the_peer_compacted_past_is_re_armed_with_a_count() {
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    let proxy = FaultProxy::start(scene.peer_etcd.client_addr()).await;
    put_each(&src, 0..50, "v").await;
    // No probe but the first and the re-arm's, no verification pass.
    let cfg = common::mirror::config(30)
        .with_heartbeat_interval(Duration::from_secs(3600))
        .with_verify_interval(None)
        .with_lapse_after(None);
    let engine = start_synced(&src, client(&proxy.endpoint()), &peer, &cfg).await;
    let s = engine.stats()[0].clone();
    common::eventually("the first probe counted the copy")
        .until(async || when(s.copy_counts.load(Relaxed) >= 1, &s))
        .await;
    proxy.cut();
    peer.put(Put::new(key(9_999), "stray")).await.unwrap();
    let mut last = 0;
    for i in 0..20 {
        last = peer
            .put(Put::new(format!("/elsewhere/{i}"), "x"))
            .await
            .unwrap()
            .header
            .revision;
    }
    peer.compact(last, true).await.unwrap();
    proxy.heal();
    common::eventually("the re-armed watch's count found the stray key")
        .until(async || when(s.resyncs(ResyncReason::CopyChanged) >= 1, &s))
        .await;
    converged(&src, &peer, &cfg).await;
}

/// Measures, with default settings, how long a copy of `AETHER_KEYS` keys
/// (default 10,000) takes to read not current and then exact again after
/// each kind of out-of-band change on the peer. A measurement, not a
/// check: `cargo nextest run --test signals --run-ignored only
/// measure_out_of_band --no-capture`; the figures are in
/// docs/benchmarks-log.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run by hand"]
async fn measure_out_of_band() {
    let n: usize = std::env::var("AETHER_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let big = || {
        Etcd::builder()
            .extra_args(&["--quota-backend-bytes=8589934592"])
            .start()
    };
    let scene = Scene::with(big(), big());
    let (src, peer) = scene.clients();
    put_many(&src, (0..n).map(|i| (key(i), format!("value-{i}")))).await;
    let mut cfg = MirrorConfig::new("a");
    cfg.max_backoff = Duration::from_millis(500);
    let engine =
        Engine::start(src.clone(), vec![("b".into(), peer.clone())], cfg.clone()).expect("engine");
    let at = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(900), engine.wait_synced())
        .await
        .expect("synced within 15 minutes");
    eprintln!("{n} keys: synced after {:?}", at.elapsed());
    let s = engine.stats()[0].clone();
    let prefix = common::mirror::PREFIX;
    for (what, edit) in [
        ("put of a stray key", Edit::Put(key(n + 1), "stray")),
        ("delete", Edit::Delete(key(n / 2))),
        ("value edit", Edit::Put(key(n / 3), "edited")),
        ("del --prefix", Edit::DeletePrefix(prefix.into())),
    ] {
        common::eventually("synced before the edit")
            .until(async || when(s.is_synced(), &s))
            .await;
        // The copy watch's count of changes, read before the edit: a
        // repair can turn the copy current again within the 1 ms this
        // loop sleeps, and a loop that waited for `peer_synced` 0 alone
        // then waited for ever (it did, twice in twenty runs).
        let seen = s.out_of_band.load(Relaxed);
        let at = std::time::Instant::now();
        edit.apply(&peer).await;
        // etcd's own time for the change: a `del --prefix` of a large copy
        // is answered only once every key is deleted, and its watch events
        // follow that, so detection cannot start before it.
        let answered = at.elapsed();
        let limit = Duration::from_secs(900);
        while s.is_synced() && s.out_of_band.load(Relaxed) == seen && at.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let not_current = at.elapsed();
        while !s.is_synced() && at.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let synced_again = at.elapsed();
        // `peer_synced` can read 1 again before the copy is whole: a
        // session that resumes the copy trusts the state key's word until
        // its copy watch delivers the change (a million deletes arrive as
        // one response, after etcd has read them all). So the copy is
        // counted too, until it holds every key again.
        let count = || async {
            let r = Range::prefix(prefix.to_owned()).count_only();
            peer.range(r).await.map(|r| r.count).unwrap_or(-1)
        };
        while count().await != n as i64 && at.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let exact = at.elapsed();
        eprintln!(
            "{n} keys, {what}: answered after {answered:?}, not current after {not_current:?}, synced again after {synced_again:?}, whole again after {exact:?}"
        );
        // A whole compare of a million keys outlasts the test kit's bound:
        // the smaller copies are compared, the largest trusted to the
        // smaller ones' result.
        if n <= 200_000 {
            converged(&src, &peer, &cfg).await;
        }
    }
}

/// A value edited on the peer after its writer crashed and before a
/// successor adopts the copy: nobody watched then, so the successor's copy
/// watch starts just past the predecessor's last write and sees it. With
/// the probe an hour apart and no verification pass, nothing else could.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_while_no_engine_watched_is_seen_by_the_successor() {
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    put_each(&src, 0..50, "v").await;
    let cfg = common::mirror::config(30)
        .with_heartbeat_interval(Duration::from_secs(3600))
        .with_verify_interval(None);
    let first = start_synced(&src, peer.clone(), &peer, &cfg).await;
    first.abort();
    peer.put(Put::new(key(8), "edited while nobody watched"))
        .await
        .unwrap();
    let second = Engine::start(src.clone(), vec![("b".into(), peer.clone())], cfg.clone()).unwrap();
    let s = second.stats()[0].clone();
    common::eventually("the successor saw the edit and repaired it")
        .until(async || {
            when(
                s.out_of_band.load(Relaxed) >= 1 && s.repaired.load(Relaxed) >= 1,
                &s,
            )
        })
        .await;
    converged(&src, &peer, &cfg).await;
    assert_eq!(
        s.resyncs(ResyncReason::Initial) + s.resyncs(ResyncReason::Fenced),
        0,
        "the successor resumed the copy rather than re-syncing it"
    );
}
