//! Registry-like churn in one region: puts of new keys, overwrites and
//! deletes on ~300 endpoint keys, every value unique.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use aether_replicator::etcd::{Client, Delete, Put};

use crate::common::mirror::{Lcg, key_in};

pub const KEYS: u64 = 300;

#[derive(Default)]
pub struct LoadStats {
    pub puts: AtomicU64,
    pub deletes: AtomicU64,
    pub large: AtomicU64,
    pub failures: AtomicU64,
}

/// A unique value: region, sequence number, then filler up to `len`.
pub fn value(region: &str, seq: u64, len: usize) -> String {
    let mut v = format!("{region}-{seq:09}-");
    while v.len() < len {
        v.push_str("abcdefghijklmnopqrstuvwxyz0123456789");
    }
    v.truncate(len.max(12));
    v
}

pub async fn run(
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
        let roll = rng.below(100);
        let res = if roll < 25 {
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
