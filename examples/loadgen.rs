//! Load generator for the comparison scripts in `e2e/`:
//!
//! ```text
//! loadgen fill  <endpoint> <prefix> <n>            # n keys (100-byte values) in 128-put txns
//! loadgen burst <endpoint> <prefix> <n> <writers>  # n single-put revisions from <writers> tasks
//! loadgen wait  <endpoint> <prefix> <n> <timeout-s> # until <prefix> holds n keys
//! loadgen scan  <endpoint> <prefix> <page-size>     # pages through <prefix>, prints keys and ms
//! ```
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
        "fill" => {
            let mut b = TxnBatcher::new(TxnLimits::default());
            for i in 0..n {
                b.put(key(&prefix, i), value.clone(), LeaseId::NONE);
            }
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
