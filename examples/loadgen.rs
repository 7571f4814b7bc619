//! Load generator for the comparison scripts in `e2e/`:
//!
//! ```text
//! loadgen fill  <endpoint> <prefix> <n>            # n keys (100-byte values) in 128-put txns
//! loadgen burst <endpoint> <prefix> <n> <writers>  # n single-put revisions from <writers> tasks
//! loadgen wait  <endpoint> <prefix> <n> <timeout-s> # until <prefix> holds n keys
//! loadgen scan  <endpoint> <prefix> <page-size>     # pages through <prefix>, prints keys and ms
//! loadgen fill-endpoints <endpoint> <prefix> <n>  # like fill, with endpoint JSON values (~150 bytes)
//! loadgen spot  <source> <prefix> <n> <samples> <peer>...  # spot-check n keys' copies
//! ```
//!
//! `fill-endpoints` writes the value an endpoint registry stores (cluster,
//! zone, address, port, weight, labels), different for every key, so a
//! copy that swapped or truncated values would show. `spot` reads
//! `<samples>` of the first n keys (spread evenly) from the source and from
//! every peer, and fails unless each peer holds the same value on a lease
//! that is alive there; it prints `spot ok <samples> keys x <peers> peers`.
//!
//! `burst` prints the Unix time in ms when its last write returned, `wait`
//! the Unix time in ms when the count was reached, so a script can subtract.

use aether_replicator::etcd::LeaseId;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aether_replicator::etcd::{Client, ClientConfig, Put, Range, TxnBatcher, TxnLimits};

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

#[path = "../tests/common/keys.rs"]
mod keys;
use keys::load_key as key;

/// The value `fill-endpoints` stores at key i: an endpoint record of about
/// 150 bytes, as the registry writes it, distinct per key.
fn endpoint_value(i: usize) -> Vec<u8> {
    format!(
        r#"{{"clusterName":"c1","zone":"zone-{}","address":"10.{}.{}.{}","port":{},"weight":{},"labels":{{"version":"v{}","track":"stable"}},"ready":true}}"#,
        i % 3,
        (i >> 16) & 255,
        (i >> 8) & 255,
        i & 255,
        8000 + i % 1000,
        1 + i % 100,
        i % 7
    )
    .into_bytes()
}

/// Reads `samples` of the first `n` keys under `prefix` (evenly spread)
/// from `source` and from every peer: each peer must hold the source's
/// value, on a lease that is alive there. Says which key and peer differ.
async fn spot(
    source: &Client,
    peers: &[Client],
    prefix: &str,
    n: usize,
    samples: usize,
) -> Result<(), String> {
    for s in 0..samples {
        let k = key(prefix, s * n.max(1) / samples);
        let want = source
            .range(Range::key(k.clone()))
            .await
            .map_err(|e| format!("read {k} at the source: {e}"))?;
        let want = want
            .kvs()
            .first()
            .ok_or_else(|| format!("{k} is not at the source"))?
            .value()
            .clone();
        for (p, peer) in peers.iter().enumerate() {
            let got = peer
                .range(Range::key(k.clone()))
                .await
                .map_err(|e| format!("read {k} at peer {p}: {e}"))?;
            let kv = got
                .kvs()
                .first()
                .ok_or_else(|| format!("{k} is missing at peer {p}"))?;
            if *kv.value() != want {
                return Err(format!("{k} at peer {p}: value {:?}", kv.value()));
            }
            if kv.lease().is_none() {
                return Err(format!("{k} at peer {p} has no lease"));
            }
            let ttl = peer
                .lease_time_to_live(kv.lease(), false)
                .await
                .map_err(|e| format!("lease of {k} at peer {p}: {e}"))?;
            if ttl.ttl.is_none_or(|t| t.is_zero()) {
                return Err(format!("{k} at peer {p}: its lease has expired"));
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: loadgen fill|burst|wait <endpoint> <prefix> <n> [writers|timeout-s]";
    if args.len() < 5 {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let (cmd, endpoint, prefix) = (args[1].as_str(), args[2].clone(), args[3].clone());
    let Ok(n) = args[4].parse::<usize>() else {
        eprintln!("error: <n> {:?} is not a number", args[4]);
        std::process::exit(2);
    };
    let extra: usize = args.get(5).and_then(|s| s.parse().ok()).unwrap_or(64);
    let client = match Client::connect(ClientConfig::new([endpoint])) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let value = vec![b'v'; 100];
    match cmd {
        "fill-endpoints" => {
            let mut b = TxnBatcher::new(TxnLimits::default());
            for i in 0..n {
                b.put(key(&prefix, i), endpoint_value(i), LeaseId::NONE);
            }
            send_all(&client, b).await;
        }
        "spot" => {
            let samples = extra.max(1);
            let peers: Vec<Client> = args
                .iter()
                .skip(6)
                .map(|e| {
                    Client::connect(ClientConfig::new([e.clone()])).unwrap_or_else(|e| {
                        eprintln!("error: {e}");
                        std::process::exit(2);
                    })
                })
                .collect();
            if let Err(why) = spot(&client, &peers, &prefix, n, samples).await {
                eprintln!("error: spot check: {why}");
                std::process::exit(1);
            }
            println!("spot ok {samples} keys x {} peers", peers.len());
        }
        "fill" => {
            let mut b = TxnBatcher::new(TxnLimits::default());
            for i in 0..n {
                b.put(key(&prefix, i), value.clone(), LeaseId::NONE);
            }
            send_all(&client, b).await;
        }
        "burst" => {
            let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..extra.max(1) {
                let (c, next, prefix, value) =
                    (client.clone(), next.clone(), prefix.clone(), value.clone());
                set.spawn(async move {
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= n {
                            return;
                        }
                        c.put(Put::new(key(&prefix, i), value.clone()))
                            .await
                            .expect("put");
                    }
                });
            }
            while let Some(r) = set.join_next().await {
                r.expect("writer");
            }
            println!("{}", now_ms());
        }
        "scan" => {
            let start = std::time::Instant::now();
            let mut scan = client.scan_prefix(prefix.clone(), n, 0);
            let (mut keys, mut pages) = (0, 0);
            while let Some(p) = scan.next_page().await.expect("scan") {
                keys += p.kvs.len();
                pages += 1;
            }
            println!(
                "{keys} keys in {pages} pages, {} ms",
                start.elapsed().as_millis()
            );
        }
        "wait" => {
            let deadline = std::time::Instant::now() + Duration::from_secs(extra as u64);
            loop {
                let c = client
                    .range(Range::prefix(prefix.clone()).count_only())
                    .await
                    .map(|r| r.count)
                    .unwrap_or(-1);
                if c >= n as i64 {
                    println!("{}", now_ms());
                    return;
                }
                if std::time::Instant::now() > deadline {
                    eprintln!("error: timed out with {c} of {n} keys");
                    std::process::exit(1);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    }
}

/// Sends every txn of `b`, 16 at a time.
async fn send_all(client: &Client, b: TxnBatcher) {
    let mut set: tokio::task::JoinSet<aether_replicator::etcd::Result<_>> =
        tokio::task::JoinSet::new();
    for t in b.finish() {
        if set.len() >= 16
            && let Some(r) = set.join_next().await
        {
            r.expect("join").expect("txn");
        }
        let c = client.clone();
        set.spawn(async move { c.txn(t).await });
    }
    while let Some(r) = set.join_next().await {
        r.expect("join").expect("txn");
    }
}
