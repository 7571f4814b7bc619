//! Registry-like churn in one region: puts of new keys, overwrites and
//! deletes on ~300 endpoint keys, every value unique; now and then a whole
//! block of keys written or deleted in one txn (a cluster rolled out or
//! taken down), as large as the source takes, so the engine must split
//! one source revision over several of its own txns.
//!
//! One region ([`BIG`]) also holds a large, mostly static cluster
//! ([`BIG_KEYS`] endpoints, [`preload`]ed before the replicators start),
//! so its copies on the peers are larger than a repair takes at once
//! (`MAX_REPAIR_KEYS` in `src/mirror/live/copy.rs`): a `del --prefix` of
//! one must end the session and re-sync, and a single key changed in it
//! must still be seen at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aether_replicator::etcd::{Client, Delete, LeaseId, Put, Txn, TxnBatcher, TxnLimits};
use futures_util::StreamExt;

use crate::common::mirror::{Lcg, key_in};

pub(crate) const KEYS: u64 = 300;
/// The region whose subtree holds the large cluster (b: its copies live
/// on a's 3-member cluster and on c, which takes small requests only).
pub(crate) const BIG: usize = 1;
/// Endpoints of the large cluster.
pub(crate) const BIG_KEYS: u64 = 25_000;
/// Services the large cluster's endpoints are spread over.
pub(crate) const BIG_SERVICES: u64 = 61;
/// Txns of the preload in flight at once.
const PRELOAD_IN_FLIGHT: usize = 4;
/// Keys of the bulk blocks, after the single-key ones.
const BLOCK: u64 = 128;
const BLOCKS: u64 = 2;

#[derive(Default)]
pub(crate) struct LoadStats {
    pub puts: AtomicU64,
    pub deletes: AtomicU64,
    pub large: AtomicU64,
    /// Txns of a whole block (each one source revision).
    pub bulk: AtomicU64,
    pub failures: AtomicU64,
}

/// Endpoint `i` of the large cluster, in the registry's key shape (its own
/// cluster, so never one of the churn keys).
pub(crate) fn big_key(region: &str, i: u64) -> String {
    format!(
        "{}protocols/http/endpoints/10.{}.{}.{}",
        big_service(region, i % BIG_SERVICES),
        1 + i / 65536,
        (i / 256) % 256,
        i % 256
    )
}

/// The large cluster in `region`'s subtree.
pub(crate) fn big_prefix(region: &str) -> String {
    format!("/aether/v1/regions/{region}/clusters/big/")
}

/// Service `j` of the large cluster.
pub(crate) fn big_service(region: &str, j: u64) -> String {
    format!("{}services/s{j}/", big_prefix(region))
}

/// Where the churn's keys live in `region`'s subtree (every key but the
/// large cluster's).
pub(crate) fn churn_prefix(region: &str) -> String {
    format!("/aether/v1/regions/{region}/clusters/c1/")
}

/// Writes the large cluster into `region`: [`BIG_KEYS`] unique values of
/// 60 to 200 bytes, in txns as large as etcd's default limits take,
/// several in flight. Returns how long it took.
pub(crate) async fn preload(client: &Client, region: &str, seed: u64) -> Duration {
    let started = Instant::now();
    let mut rng = Lcg(seed ^ 0x7072656c);
    let mut b = TxnBatcher::new(TxnLimits::default());
    for i in 0..BIG_KEYS {
        let v = value(&format!("{region}-pre"), i, 60 + rng.below(140) as usize);
        b.put(big_key(region, i), v, LeaseId::NONE);
    }
    let txns = b.finish();
    let mut sent = futures_util::stream::iter(txns)
        .map(|t| client.txn(t))
        .buffer_unordered(PRELOAD_IN_FLIGHT);
    while let Some(r) = sent.next().await {
        r.expect("preload txn");
    }
    started.elapsed()
}

/// A unique value: region, sequence number, then filler up to `len`.
pub(crate) fn value(region: &str, seq: u64, len: usize) -> String {
    let mut v = format!("{region}-{seq:09}-");
    while v.len() < len {
        v.push_str("abcdefghijklmnopqrstuvwxyz0123456789");
    }
    v.truncate(len.max(12));
    v
}

pub(crate) async fn run(
    region: &'static str,
    client: Client,
    seed: u64,
    stop: Arc<AtomicBool>,
    stats: Arc<LoadStats>,
) {
    let mut rng = Lcg(seed);
    let mut seq = 0u64;
    let big = crate::mesh::REGIONS[BIG] == region;
    while !stop.load(Ordering::SeqCst) {
        let i = rng.below(KEYS) as usize;
        let mut key = key_in(region, i);
        let roll = rng.below(1000);
        // The large cluster changes too, now and then: a key repaired on a
        // peer may race a live write of its own.
        if big && rng.below(10) == 0 {
            key = big_key(region, rng.below(BIG_KEYS));
        }
        let res = if roll < 6 {
            // 64 to 128 ops (etcd's default limit): from 128 on, the engine
            // needs a second txn for its own state put.
            stats.bulk.fetch_add(1, Ordering::Relaxed);
            let first = KEYS + rng.below(BLOCKS) * BLOCK;
            let n = 64 + rng.below(BLOCK - 63);
            let keys = (first..first + n).map(|i| key_in(region, i as usize));
            let txn = if roll < 3 {
                Txn::new().and_then(keys.map(Delete::key))
            } else {
                Txn::new().and_then(keys.map(|k| {
                    seq += 1;
                    Put::new(k, value(region, seq, 40 + rng.below(200) as usize))
                }))
            };
            client.txn(txn).await.map(|_| ())
        } else if roll < 250 {
            stats.deletes.fetch_add(1, Ordering::Relaxed);
            client.delete(Delete::key(key)).await.map(|_| ())
        } else {
            seq += 1;
            let len = if rng.below(50) == 0 {
                stats.large.fetch_add(1, Ordering::Relaxed);
                16 * 1024 + rng.below(48 * 1024) as usize
            } else {
                40 + rng.below(200) as usize
            };
            stats.puts.fetch_add(1, Ordering::Relaxed);
            client
                .put(Put::new(key, value(region, seq, len)))
                .await
                .map(|_| ())
        };
        if res.is_err() {
            stats.failures.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_millis(25 + rng.below(20))).await;
    }
}
