//! The engine's cap on concurrent range-diff syncs
//! (`MirrorConfig::max_concurrent_syncs`), against real etcd processes.

mod common;

use std::time::{Duration, Instant};

use aether_replicator::Error;
use aether_replicator::etcd::Client;
use aether_replicator::mirror::{Engine, MirrorConfig};
use common::Etcd;
use common::mirror::{PREFIX, client, config, converged, count, key, put_many};

const KEYS: usize = 5_000;

/// Three peers that each need a full sync, one slot: every peer still
/// syncs (a slot is given back when its sync ends), and no two copies are
/// ever being filled at once. The copies' key counts are sampled
/// throughout; without the cap all three fill side by side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sync_slot_syncs_every_peer_one_at_a_time() {
    let (src_etcd, peers) = (Etcd::start(), [Etcd::start(), Etcd::start(), Etcd::start()]);
    let src = client(&src_etcd.endpoint());
    let dsts: Vec<Client> = peers.iter().map(|e| client(&e.endpoint())).collect();
    put_many(&src, (0..KEYS).map(|i| (key(i), format!("v{i}")))).await;
    let mut cfg = config(10);
    cfg.page_size = 500;
    cfg.max_concurrent_syncs = 1;
    let engine = Engine::start(
        src.clone(),
        ["b", "c", "d"]
            .iter()
            .zip(&dsts)
            .map(|(r, c)| (r.to_string(), c.clone()))
            .collect(),
        cfg.clone(),
    )
    .unwrap();
    // Three syncs one after another: the bound of three.
    let bound = 3 * common::mirror::CONVERGE;
    let deadline = Instant::now() + bound;
    let (mut samples, mut partial_seen, mut overlap) = (0, 0, None);
    loop {
        let mut counts = Vec::new();
        for d in &dsts {
            counts.push(count(d, PREFIX).await);
        }
        samples += 1;
        let partial = counts.iter().filter(|&&n| n > 0 && n < KEYS as i64).count();
        partial_seen += usize::from(partial > 0);
        if partial > 1 && overlap.is_none() {
            overlap = Some(counts.clone());
        }
        if counts.iter().all(|&n| n == KEYS as i64) && engine.is_synced() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every peer synced within {bound:?}: counts {counts:?} after {samples} samples"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(
        overlap, None,
        "two copies were filled at once with one sync slot"
    );
    // Otherwise the samples could not have seen an overlap either.
    assert!(
        partial_seen > 0,
        "no sample caught a sync in progress ({samples} samples)"
    );
    for d in &dsts {
        assert_eq!(converged(&src, d, &cfg).await.source_keys, KEYS as u64);
    }
    engine.shutdown().await;
}

/// Zero slots would never sync: refused with a one-line error.
#[test]
fn zero_sync_slots_are_refused() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in = rt.enter();
    let mut cfg = MirrorConfig::new("a");
    cfg.max_concurrent_syncs = 0;
    let local = client("http://127.0.0.1:9");
    let err = Engine::start(local.clone(), vec![("b".into(), local)], cfg).expect_err("refused");
    assert!(
        matches!(&err, Error::Config(m) if m.contains("max concurrent syncs must be at least 1")),
        "{err}"
    );
}
