//! A seeded fault soak with a history checker, in the manner of etcd's
//! functional tester: three regions in full mesh under registry-like
//! churn, a nemesis injecting faults, and a checker that judges every
//! sample of every copy against the source's recorded history and the
//! freshness the replicators claim. `SEED=<n> DURATION=<d>` replays a run.

// Regions, links and replicas are named by index throughout (REGIONS[o],
// links[o][p]): index loops read better here than zipped iterators.
#![allow(clippy::needless_range_loop)]

#[path = "../common/mod.rs"]
mod common;

mod checker;
mod load;
mod mesh;
mod nemesis;
mod report;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aether_replicator::etcd::{LeaseId, OpResponse, Range, Txn};

use checker::{Checker, parse_state};
use mesh::{Mesh, REGIONS, prefix, state_key};

/// Bound on the wait for exact copies after the heal.
const EXACT_WITHIN: Duration = Duration::from_secs(90);

fn parse_duration(s: &str) -> Duration {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.parse().unwrap_or_else(|_| panic!("bad DURATION {s:?}"));
    Duration::from_secs_f64(v * mul)
}

/// Every (origin, peer) copy exact: same keys and values as the source
/// (values too large for the peer absent), every key on the lease the
/// state key names, that lease alive. Err: the first difference.
async fn exact(mesh: &Mesh) -> Result<(), String> {
    for o in 0..3 {
        let src = mesh.regions[o]
            .client
            .range(Range::prefix(prefix(REGIONS[o])))
            .await
            .map_err(|e| format!("read {}: {e}", REGIONS[o]))?;
        for p in 0..3 {
            if p == o {
                continue;
            }
            let peer = &mesh.regions[p];
            let want: BTreeMap<Vec<u8>, Vec<u8>> = src
                .kvs()
                .iter()
                .filter(|kv| kv.value().len() < peer.max_value)
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                .collect();
            let read = peer
                .client
                .txn(Txn::new().and_then([
                    Range::prefix(prefix(REGIONS[o])),
                    Range::key(state_key(REGIONS[o])),
                ]))
                .await
                .map_err(|e| format!("read {}: {e}", REGIONS[p]))?;
            let mut rs = read.responses.into_iter().filter_map(|r| match r {
                OpResponse::Range(r) => Some(r),
                _ => None,
            });
            let copy = rs.next().unwrap().into_kvs();
            let state = rs
                .next()
                .and_then(|r| r.into_kvs().into_iter().next())
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                .ok_or(format!("{}->{}: no state key", REGIONS[o], REGIONS[p]))?;
            let lease = parse_state(&state)
                .get("lease")
                .and_then(|l| l.parse::<i64>().ok())
                .map(LeaseId::new)
                .ok_or(format!(
                    "{}->{}: state without lease: {state}",
                    REGIONS[o], REGIONS[p]
                ))?;
            let got: BTreeMap<Vec<u8>, Vec<u8>> = copy
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                .collect();
            if got != want {
                let missing = want.keys().filter(|k| !got.contains_key(*k)).count();
                let extra = got.keys().filter(|k| !want.contains_key(*k)).count();
                let differ = want
                    .iter()
                    .filter(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
                    .count();
                return Err(format!(
                    "{}->{}: {missing} missing, {extra} extra, {differ} differ (of {})",
                    REGIONS[o],
                    REGIONS[p],
                    want.len()
                ));
            }
            if let Some(kv) = copy.iter().find(|kv| kv.lease() != lease) {
                return Err(format!(
                    "{}->{}: {} on lease {:x}, state names {lease:x}",
                    REGIONS[o],
                    REGIONS[p],
                    String::from_utf8_lossy(kv.key()),
                    kv.lease()
                ));
            }
            let ttl = peer
                .client
                .lease_time_to_live(lease, false)
                .await
                .map_err(|e| format!("lease ttl on {}: {e}", REGIONS[p]))?;
            if ttl.ttl <= 0 {
                return Err(format!(
                    "{}->{}: lease {lease:x} not alive ({})",
                    REGIONS[o], REGIONS[p], ttl.ttl
                ));
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a seeded fault soak of DURATION (default 120s); e2e/test-all.sh runs it on each etcd version"]
async fn soak() {
    let seed: u64 = std::env::var("SEED")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("SEED must be a u64"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000_000
        });
    let duration = std::env::var("DURATION")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| parse_duration(&s))
        .unwrap_or(Duration::from_secs(120));
    let etcd = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd (PATH)".into());
    println!("SEED={seed} DURATION={}s", duration.as_secs());
    eprintln!("SEED={seed} DURATION={}s", duration.as_secs());

    let report_dir = std::env::var_os("SOAK_REPORT_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("../soak"));
    let run_dir = report_dir.join(format!("seed-{seed}-{}", checker::now_ms()));
    std::fs::create_dir_all(&run_dir).expect("report dir");
    let run_dir = run_dir.canonicalize().expect("report dir");
    let report_path = run_dir.join("report.txt");
    let tmp = tempfile::Builder::new()
        .prefix("aether-soak-")
        .tempdir()
        .unwrap();

    let mesh = Arc::new(Mesh::start(tmp.path().to_path_buf(), run_dir.clone()).await);
    // The large cluster goes in before any replicator runs: the first sync
    // carries it to both peers.
    let preload = load::preload(&mesh.regions[load::BIG].client, REGIONS[load::BIG], seed).await;
    eprintln!(
        "preloaded {} keys into {} in {preload:?}",
        load::BIG_KEYS,
        REGIONS[load::BIG]
    );
    mesh.spawn_all();

    // Wait for the first complete copies.
    let t0 = Instant::now();
    loop {
        let mut all = true;
        for o in 0..3 {
            for p in 0..3 {
                if o == p {
                    continue;
                }
                let st = mesh.regions[p]
                    .client
                    .range(Range::key(state_key(REGIONS[o])))
                    .await
                    .ok()
                    .and_then(|r| {
                        r.kvs()
                            .first()
                            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                    });
                all &= st.is_some_and(|s| {
                    parse_state(&s).get("synced").map(String::as_str) == Some("1")
                });
            }
        }
        if all {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the mesh did not sync within 60s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first_sync = t0.elapsed();
    eprintln!("mesh synced after {first_sync:?}");

    let checker = Arc::new(Checker::new());
    let mut tasks = Vec::new();
    for r in 0..3 {
        tasks.push(tokio::spawn(checker.clone().record(mesh.clone(), r)));
    }
    let stop_load = Arc::new(AtomicBool::new(false));
    let loads: Vec<Arc<load::LoadStats>> = (0..3).map(|_| Arc::default()).collect();
    let mut load_tasks = Vec::new();
    for r in 0..3 {
        load_tasks.push(tokio::spawn(load::run(
            REGIONS[r],
            mesh.regions[r].client.clone(),
            seed.wrapping_mul(31).wrapping_add(r as u64 + 1),
            stop_load.clone(),
            loads[r].clone(),
        )));
    }
    let log = Arc::new(nemesis::Log::default());
    for o in 0..3 {
        for p in 0..3 {
            if o != p {
                tasks.push(tokio::spawn(checker.clone().sample(
                    mesh.clone(),
                    log.clone(),
                    o,
                    p,
                )));
            }
        }
    }
    let peak_rss = Arc::new(AtomicU64::new(0));
    let stop_rss = Arc::new(AtomicBool::new(false));
    let rss_task = {
        let (mesh, peak, stop) = (mesh.clone(), peak_rss.clone(), stop_rss.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                for reg in &mesh.regions {
                    for rep in &reg.replicas {
                        let pid = rep.lock().unwrap_or_else(PoisonError::into_inner).pid();
                        if let Some(k) = pid.and_then(mesh::vm_hwm_kib) {
                            peak.fetch_max(k, Ordering::Relaxed);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let stop_nemesis = Arc::new(AtomicBool::new(false));
    let nem = tokio::spawn(
        nemesis::Nemesis::new(mesh.clone(), seed, log.clone()).run(stop_nemesis.clone()),
    );

    tokio::time::sleep(duration).await;
    eprintln!("DURATION over: stopping the load and the nemesis, healing");
    stop_load.store(true, Ordering::SeqCst);
    stop_nemesis.store(true, Ordering::SeqCst);
    for t in load_tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
    }
    let nem_ok = tokio::time::timeout(Duration::from_secs(120), nem).await;
    // Again, in case the nemesis did not get there.
    nemesis::heal_all(&mesh).await;
    let healed = Instant::now();
    checker.stop.store(true, Ordering::SeqCst);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }

    let mut last = String::new();
    let mut time_to_exact = None;
    while healed.elapsed() < EXACT_WITHIN {
        match exact(&mesh).await {
            Ok(()) => {
                time_to_exact = Some(healed.elapsed());
                break;
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop_rss.store(true, Ordering::SeqCst);
    let _ = rss_task.await;
    mesh.save_logs();
    let outcome = report::Outcome {
        seed,
        duration,
        etcd,
        time_to_exact,
        last_inexact: last,
        peak_rss_kib: peak_rss.load(Ordering::Relaxed),
        preload,
        first_sync,
        report_path: report_path.clone(),
    };
    let summary = report::summary(&outcome, &checker, &log, &loads);
    report::write(&outcome, &summary, &checker, &log);
    println!("{summary}");
    drop(mesh);
    let violations = checker.figures.violations.load(Ordering::Relaxed);
    assert!(
        nem_ok.is_ok(),
        "the nemesis did not finish healing in time\n{summary}"
    );
    assert!(
        violations == 0 && time_to_exact.is_some(),
        "soak failed (replay with SEED={seed} DURATION={}s):\n{summary}",
        duration.as_secs()
    );
}
