//! A seeded fault soak with a history checker, in the manner of etcd's
//! functional tester: three regions in full mesh under registry-like
//! churn, a nemesis injecting faults, and a checker that judges every
//! sample of every copy against the source's recorded history and the
//! freshness the replicators claim. `SEED=<n> DURATION=<d>` replays a run.
//!
//! `PROFILE` picks how the replicators run: `ci` (unset: the default) with
//! short timers (lease 6 s, heartbeat 1 s, lapse after 30 s), or `default`
//! with no tuning flag at all, the engine's defaults (lease 30 s,
//! heartbeat 5 s, verification every hour, recount every 10 min). Both
//! carry the 25,000-key copy of region b.
//!
//! A run passes only if it proved something: every kind of fault injected,
//! samples judged and claims of freshness seen on every copy, each above a
//! minimum that scales with `DURATION` ([`Minimums`]); the metric series
//! the checker reads present on the replicators' pages; and the nemesis,
//! the checker and the load finished without an error or a panic.

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
use mesh::{Mesh, Profile, REGIONS, prefix, state_key};

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
            if ttl.ttl.is_none_or(|t| t.is_zero()) {
                return Err(format!(
                    "{}->{}: lease {lease:x} not alive ({:?})",
                    REGIONS[o], REGIONS[p], ttl.ttl
                ));
            }
        }
    }
    Ok(())
}

/// What a run must have done to count, scaled to its `DURATION` `d`.
#[derive(Debug)]
pub(crate) struct Minimums {
    /// Faults injected in all.
    pub faults: usize,
    /// Faults of each kind (every kind, from 60 s on).
    pub per_kind: usize,
    /// Samples judged per (origin, peer) copy.
    pub judged_per_pair: u64,
    /// Judged samples under a claim of freshness per copy.
    pub claimed_per_pair: u64,
    /// Of those, under the sender's claim, and under the receiver's.
    pub sender_per_pair: u64,
    pub receiver_per_pair: u64,
}

impl Minimums {
    /// About a fault every 8 s (a run injects one every 3.5 s on
    /// average, fewer while three are active); every kind once from 60 s
    /// on (the nemesis owes each kind until it has injected it), and one
    /// more per 10 min; a judged sample per copy every 4 s (each copy is
    /// sampled every 300 ms, the large copy's about every 0.8 s), half of
    /// them under a claim, a quarter under each kind of claim.
    pub(crate) fn for_duration(d: Duration) -> Minimums {
        let s = d.as_secs();
        Minimums {
            faults: (s / 8).max(1) as usize,
            per_kind: if s >= 60 { 1 + (s / 600) as usize } else { 0 },
            judged_per_pair: s / 4,
            claimed_per_pair: s / 8,
            sender_per_pair: s / 16,
            receiver_per_pair: s / 16,
        }
    }

    /// What the run fell short of, one line each.
    pub(crate) fn shortfalls(&self, checker: &Checker, log: &nemesis::Log) -> Vec<String> {
        let mut out = Vec::new();
        let kinds = log.by_kind();
        let total: usize = kinds.values().sum();
        if total < self.faults {
            out.push(format!(
                "{total} faults injected, fewer than {}",
                self.faults
            ));
        }
        for k in nemesis::kinds() {
            let n = kinds.get(&format!("{k:?}")).copied().unwrap_or(0);
            if n < self.per_kind {
                out.push(format!(
                    "{n} faults of kind {k:?}, fewer than {}",
                    self.per_kind
                ));
            }
        }
        let f = &checker.figures;
        let judged = f
            .per_pair
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let claims = f
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for o in 0..3 {
            for p in (0..3).filter(|&p| p != o) {
                let pair = format!("{}->{}", REGIONS[o], REGIONS[p]);
                let n = judged.get(&(o, p)).map_or(0, |e| e.0);
                if n < self.judged_per_pair {
                    out.push(format!(
                        "{pair}: {n} samples judged, fewer than {}",
                        self.judged_per_pair
                    ));
                }
                let (any, sender, receiver) = claims.get(&(o, p)).copied().unwrap_or_default();
                for (what, n, min) in [
                    ("a claim of freshness", any, self.claimed_per_pair),
                    ("the sender's claim", sender, self.sender_per_pair),
                    ("the receiver's claim", receiver, self.receiver_per_pair),
                ] {
                    if n < min {
                        out.push(format!(
                            "{pair}: {n} judged samples under {what}, fewer than {min}"
                        ));
                    }
                }
            }
        }
        for (name, (seen, absent)) in f
            .series_seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            if *seen == 0 {
                out.push(format!(
                    "metric {name} absent from all {absent} scrapes of a leader"
                ));
            }
        }
        out
    }
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
    let profile = Profile::from_env();
    println!(
        "SEED={seed} DURATION={}s PROFILE={profile:?}",
        duration.as_secs()
    );
    eprintln!(
        "SEED={seed} DURATION={}s PROFILE={profile:?}",
        duration.as_secs()
    );

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

    let mesh = Arc::new(Mesh::start(profile, tmp.path().to_path_buf(), run_dir.clone()).await);
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
    // The series the checker reads are on the leaders' pages: a renamed
    // metric must fail the run, not read as "no claim" throughout.
    if let Err(e) = checker::verify_series(&mesh).await {
        panic!("{e}");
    }

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
    // A task that panicked stopped doing its part (judging, loading)
    // early: the run proved less than it reports.
    let mut task_errors = Vec::new();
    for (i, t) in load_tasks.into_iter().enumerate() {
        match tokio::time::timeout(Duration::from_secs(10), t).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => task_errors.push(format!("load task {i}: {e}")),
            Err(_) => eprintln!("load task {i} did not stop within 10 s"),
        }
    }
    let nem_ok = tokio::time::timeout(Duration::from_secs(120), nem).await;
    // Again, in case the nemesis did not get there.
    nemesis::heal_all(&mesh).await;
    let healed = Instant::now();
    checker.stop.store(true, Ordering::SeqCst);
    for (i, t) in tasks.into_iter().enumerate() {
        match tokio::time::timeout(Duration::from_secs(15), t).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => task_errors.push(format!("checker task {i}: {e}")),
            Err(_) => eprintln!("checker task {i} did not stop within 15 s"),
        }
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
    let minimums = Minimums::for_duration(duration);
    let shortfalls = minimums.shortfalls(&checker, &log);
    let mut summary = report::summary(&outcome, &checker, &log, &loads);
    summary.push_str(&format!(
        "minimums for {}s: {minimums:?}\n",
        duration.as_secs()
    ));
    for s in &shortfalls {
        summary.push_str(&format!("SHORT: {s}\n"));
    }
    report::write(&outcome, &summary, &checker, &log);
    println!("{summary}");
    drop(mesh);
    let violations = checker.figures.violations.load(Ordering::Relaxed);
    match nem_ok {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("the nemesis failed: {e}\n{summary}"),
        Err(_) => panic!("the nemesis did not finish healing in time\n{summary}"),
    }
    let nemesis_errors = nemesis::errors();
    assert!(
        nemesis_errors.is_empty() && task_errors.is_empty(),
        "the nemesis or a task failed: {nemesis_errors:?} {task_errors:?}\n{summary}"
    );
    assert!(
        shortfalls.is_empty(),
        "the run fell short of what it must prove (replay with SEED={seed} DURATION={}s):\n{summary}",
        duration.as_secs()
    );
    assert!(
        violations == 0 && time_to_exact.is_some(),
        "soak failed (replay with SEED={seed} DURATION={}s):\n{summary}",
        duration.as_secs()
    );
}
