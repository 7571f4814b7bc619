//! Registry-like churn in one region: puts of new keys, overwrites and
//! deletes on ~300 endpoint keys, every value unique; now and then a whole
//! block of keys written or deleted in one txn (a cluster rolled out or
//! taken down), as large as the source takes, so the engine must split
//! one source revision over several of its own txns.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use aether_replicator::etcd::{Client, Delete, Put, Txn};

use crate::common::mirror::{Lcg, key_in};

pub(crate) const KEYS: u64 = 300;
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
    while !stop.load(Ordering::SeqCst) {
        let i = rng.below(KEYS) as usize;
        let key = key_in(region, i);
        let roll = rng.below(1000);
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
