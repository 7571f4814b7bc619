//! What operators see: the `/metrics` page as Prometheus tooling judges it.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use aether_replicator::mirror::state::State;
use common::replicator::{Replicator, metric};
use common::{Etcd, FaultProxy, wait_until};

/// Runs `promtool check metrics` on `page`: (exit success, its output).
/// promtool missing is a failure with the install command, not a skip.
fn promtool_check_metrics(page: &str) -> (bool, String) {
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            panic!("promtool not runnable ({e}): install it with `apt-get install -y prometheus`")
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn metrics_page_passes_promtool_and_names_origin_build_and_process() {
    let (src, dst) = (Etcd::start(), Etcd::start());
    let r = Replicator::spawn(&[
        "--region=a".into(),
        format!("--local-etcd={}", src.endpoint()),
        format!("--peer-etcd=b={}", dst.endpoint()),
        "--lease-ttl=6s".into(),
    ]);
    // A leader with a synced peer and one applied event, so every family,
    // the histogram included, has samples.
    assert!(
        wait_until(Duration::from_secs(30), || r.scrape().is_some_and(|p| {
            metric(&p, "aether_replicator_peer_synced{origin=\"a\",peer=\"b\"}") == Some(1.0)
        })),
        "never synced: {}",
        r.log_text()
    );
    src.etcdctl_ok(&["put", "/aether/v1/regions/a/k", "v"]);
    let mut page = String::new();
    assert!(
        wait_until(Duration::from_secs(15), || {
            page = r.scrape().unwrap_or_default();
            metric(
                &page,
                "aether_replicator_apply_latency_seconds_count{origin=\"a\",peer=\"b\"}",
            ) == Some(1.0)
        }),
        "{page}"
    );

    let (ok, out) = promtool_check_metrics(&page);
    assert!(ok, "promtool check metrics failed:\n{out}\n---\n{page}");
    assert!(out.trim().is_empty(), "promtool lint findings:\n{out}");

    // The exact label sets operators' rules rely on.
    let build = page
        .lines()
        .find(|l| l.starts_with("aether_replicator_build_info{"))
        .unwrap_or_else(|| panic!("no build_info:\n{page}"));
    assert!(
        build.starts_with(&format!(
            "aether_replicator_build_info{{version=\"{}\",revision=\"",
            env!("CARGO_PKG_VERSION")
        )) && build.ends_with("} 1"),
        "{build}"
    );
    assert!(!build.contains("revision=\"\""), "{build}");
    assert_eq!(
        metric(&page, "aether_replicator_is_leader{region=\"a\"}"),
        Some(1.0)
    );
    // The ServiceMonitor honours the series' own labels (so `region` is
    // not renamed `exported_region`): that is safe only while no series
    // carries a label that Prometheus or the operator sets on the target.
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        for target in [
            "job",
            "instance",
            "pod",
            "namespace",
            "service",
            "endpoint",
            "container",
        ] {
            assert!(
                !line.contains(&format!("{{{target}=\""))
                    && !line.contains(&format!(",{target}=\"")),
                "a series carries the target label {target}, which honorLabels would let override the target's: {line}"
            );
        }
    }
    for line in page.lines().filter(|l| l.contains("peer=\"")) {
        assert!(
            line.contains("{origin=\"a\",peer=\"b\""),
            "per-peer series without origin next to peer: {line}"
        );
    }
    for name in [
        "aether_replicator_events_applied_total",
        "aether_replicator_errors_total",
        "aether_replicator_resyncs_total",
        "aether_replicator_keepalive_age_seconds",
        "aether_replicator_apply_latency_seconds_bucket",
        "aether_replicator_peer_staleness_seconds",
        "aether_replicator_peer_lapsed",
        "aether_replicator_lapses_total",
        "aether_replicator_conflicts_total",
        "aether_replicator_verify_runs_total",
        "aether_replicator_verify_repairs_total",
        "aether_replicator_verify_skipped_total",
        "aether_replicator_peer_conflicted",
        "aether_replicator_peer_txn_ops_limit",
        "aether_replicator_peer_request_bytes_limit",
        "aether_replicator_origin_copy_present",
        "aether_replicator_origin_lease_remaining_seconds",
    ] {
        assert!(metric(&page, name).is_some(), "{name} missing:\n{page}");
    }

    // Process metrics, unprefixed, with plausible values.
    if cfg!(target_os = "linux") {
        let rss = metric(&page, "process_resident_memory_bytes").unwrap();
        assert!(rss > 1e6, "rss {rss}");
        assert!(metric(&page, "process_virtual_memory_bytes").unwrap() >= rss);
        assert!(metric(&page, "process_open_fds").unwrap() >= 3.0);
        assert!(metric(&page, "process_max_fds").is_some());
        assert!(metric(&page, "process_cpu_seconds_total").unwrap() >= 0.0);
        let start = metric(&page, "process_start_time_seconds").unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            start <= now + 2.0 && start > now - 600.0,
            "{start} vs {now}"
        );
    }
}

fn run_args(region: &str, local: &Etcd, peer: &str, peer_etcd: &Etcd) -> Vec<String> {
    vec![
        format!("--region={region}"),
        format!("--local-etcd={}", local.endpoint()),
        format!("--peer-etcd={peer}={}", peer_etcd.endpoint()),
        "--lease-ttl=4s".into(),
    ]
}

fn incoming(r: &Replicator, name: &str, origin: &str) -> Option<f64> {
    r.scrape().and_then(|p| {
        metric(
            &p,
            &format!("aether_replicator_{name}{{region=\"a\",origin=\"{origin}\"}}"),
        )
    })
}

#[test]
fn every_replica_reports_the_incoming_copies_and_their_lapse() {
    let (etcd_a, etcd_b) = (Etcd::start(), Etcd::start());
    let a_args = run_args("a", &etcd_a, "b", &etcd_b);
    let leader_a = Replicator::spawn(&a_args);
    assert!(wait_until(Duration::from_secs(20), || leader_a.is_leader()));
    let standby_a = Replicator::spawn(&a_args);
    // b has never run: its copy is expected (b is a's peer) and absent.
    for r in [&leader_a, &standby_a] {
        assert!(
            wait_until(Duration::from_secs(20), || incoming(
                r,
                "origin_copy_present",
                "b"
            ) == Some(0.0)),
            "{}",
            r.log_text()
        );
        assert_eq!(
            incoming(r, "origin_lease_remaining_seconds", "b"),
            Some(0.0)
        );
    }

    // b mirrors into a's etcd: both replicas of a see the copy and its lease.
    let mut b = Replicator::spawn(&run_args("b", &etcd_b, "a", &etcd_a));
    for r in [&leader_a, &standby_a] {
        assert!(
            wait_until(Duration::from_secs(30), || incoming(
                r,
                "origin_copy_present",
                "b"
            ) == Some(1.0)
                && incoming(r, "origin_lease_remaining_seconds", "b")
                    .is_some_and(|t| t > 0.0)),
            "{}\n---\n{}",
            r.log_text(),
            b.log_text()
        );
    }
    // The heartbeat b's engine writes into its state key: fresh.
    for r in [&leader_a, &standby_a] {
        assert!(
            wait_until(Duration::from_secs(20), || incoming(
                r,
                "origin_staleness_seconds",
                "b"
            )
            .is_some_and(|s| (0.0..15.0).contains(&s))),
            "{:?}",
            r.scrape()
        );
    }
    let ttl = incoming(&standby_a, "origin_lease_remaining_seconds", "b").unwrap();
    assert!(ttl <= 4.0, "{ttl}");
    assert!(!standby_a.is_leader());

    // b dies without resigning: its lease in a's etcd lapses within a TTL
    // (plus etcd's expiry check), and both replicas report the copy gone.
    b.kill();
    for r in [&leader_a, &standby_a] {
        assert!(
            wait_until(Duration::from_secs(20), || incoming(
                r,
                "origin_copy_present",
                "b"
            ) == Some(0.0)
                && incoming(r, "origin_lease_remaining_seconds", "b") == Some(0.0)),
            "{}",
            r.log_text()
        );
        // No copy, no heartbeat: the staleness series is left out.
        assert_eq!(incoming(r, "origin_staleness_seconds", "b"), None);
    }
    assert_eq!(
        etcd_a
            .etcdctl_ok(&[
                "get",
                "--prefix",
                "/aether/v1/replication/b/",
                "--keys-only"
            ])
            .trim(),
        ""
    );
}

/// Runs `aether-replicator status ARGS`: (exit code, stdout, stderr).
fn status(args: &[String]) -> (i32, String, String) {
    let out = Command::new(common::replicator::binary())
        .arg("status")
        .args(args)
        .output()
        .expect("run status");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The table row of `peer` in `status` output.
fn row<'a>(table: &'a str, peer: &str) -> &'a str {
    table
        .lines()
        .skip(1)
        .find(|l| l.split_whitespace().nth(1) == Some(peer))
        .unwrap_or_else(|| panic!("no row for {peer}:\n{table}"))
}

#[test]
fn status_reports_a_healthy_region_and_a_broken_one() {
    let (etcd_a, etcd_b) = (Etcd::start(), Etcd::start());
    let a_args = run_args("a", &etcd_a, "b", &etcd_b);
    let b_args = run_args("b", &etcd_b, "a", &etcd_a);
    let mut a = Replicator::spawn(&a_args);
    let b = Replicator::spawn(&b_args);
    etcd_a.etcdctl_ok(&["put", "/aether/v1/regions/a/k", "v"]);
    for r in [&a, &b] {
        assert!(
            wait_until(Duration::from_secs(30), || r.synced()),
            "{}",
            r.log_text()
        );
    }

    // Healthy: exit 0, one row a -> b naming the leader, a lease and "ok".
    let (code, out, err) = status(&a_args);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("REGION"), "{out}");
    let line = row(&out, "b");
    assert!(line.starts_with("a "), "{line}");
    assert!(line.ends_with("ok"), "{line}");
    assert!(line.contains(" yes "), "synced: {line}");
    assert!(line.contains("s/4s"), "lease left of granted: {line}");
    // JSON from the other region: the leader id is the replica's, the
    // staleness comes from the heartbeat (written every 5 s).
    let b_json = [b_args.clone(), vec!["--output=json".into()]].concat();
    let (mut code, mut out, mut err) = (0, String::new(), String::new());
    assert!(
        wait_until(Duration::from_secs(20), || {
            (code, out, err) = status(&b_json);
            out.contains("\"staleness_seconds\":") && !out.contains("\"staleness_seconds\":null")
        }),
        "{out}{err}"
    );
    assert_eq!(code, 0, "{out}{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    assert!(
        doc["peers"][0]["staleness_seconds"]
            .as_f64()
            .is_some_and(|s| (0.0..60.0).contains(&s)),
        "{doc}"
    );
    assert_eq!(doc["peers"][0]["synced"], true);
    assert_eq!(doc["region"], "b");
    assert_eq!(doc["healthy"], true);
    assert!(
        doc["leader"].as_str().is_some_and(|l| !l.is_empty()),
        "{doc}"
    );
    let peer = &doc["peers"][0];
    assert_eq!(peer["peer"], "a");
    assert_eq!(peer["present"], true);
    assert_eq!(peer["lease_granted_seconds"], 4);
    assert!(
        peer["lease_left_seconds"].as_i64().is_some_and(|l| l > 0),
        "{doc}"
    );
    assert!(
        peer["applied_revision"].as_i64().is_some_and(|r| r > 0),
        "{doc}"
    );
    assert_eq!(peer["problems"], serde_json::json!([]));

    // A peer nobody answers for: exit 1, the reason on its row only.
    let dead = common::replicator::dead_addr();
    let (code, out, err) =
        status(&[a_args.clone(), vec![format!("--peer-etcd=c=http://{dead}")]].concat());
    assert_eq!(code, 1, "{out}{err}");
    assert!(row(&out, "c").contains("peer c unreachable"), "{out}");
    assert!(row(&out, "b").ends_with("ok"), "{out}");

    // Broken: a's only replicator dies; once its election key and its
    // copy's lease on b have lapsed, status says so on the row, exit 1.
    a.kill();
    assert!(wait_until(Duration::from_secs(20), || {
        etcd_a
            .etcdctl_ok(&["get", "--prefix", "/aether/v1/replicator/a/", "--keys-only"])
            .trim()
            .is_empty()
            && etcd_b
                .etcdctl_ok(&[
                    "get",
                    "--prefix",
                    "/aether/v1/replication/a/",
                    "--keys-only",
                ])
                .trim()
                .is_empty()
    }));
    let (code, out, err) = status(&a_args);
    assert_eq!(code, 1, "{out}{err}");
    let line = row(&out, "b");
    assert!(line.contains("no leader in region a"), "{line}");
    assert!(line.contains("state key missing on b"), "{line}");
    let (code, out, _) = status(&[a_args.clone(), vec!["--output=json".into()]].concat());
    assert_eq!(code, 1);
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(doc["healthy"], false);
    assert_eq!(doc["leader"], serde_json::Value::Null);
    assert_eq!(doc["peers"][0]["present"], false);
    // Region b, still running, is healthy throughout.
    assert_eq!(status(&b_args).0, 0);
}

#[test]
fn status_refuses_invalid_flags_with_exit_2() {
    for argv in [
        vec!["--region=a", "--output=xml"],
        vec!["--region=a", "--max-staleness=soon"],
        vec!["--max-staleness=10s"],
        vec!["--region=a", "--peer-etcd=b"],
    ] {
        let argv: Vec<String> = argv.into_iter().map(String::from).collect();
        let (code, out, err) = status(&argv);
        assert_eq!(code, 2, "{argv:?}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "{argv:?}: {err}");
        assert!(err.starts_with("error"), "{argv:?}: {err}");
    }
}

/// Debian's libfaketime, preloaded into a replicator to step its wall
/// clock; `AETHER_FAKETIME_LIB` names another build.
fn faketime_lib() -> String {
    let lib = std::env::var("AETHER_FAKETIME_LIB")
        .unwrap_or_else(|_| "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1".into());
    assert!(
        std::path::Path::new(&lib).exists(),
        "libfaketime not found at {lib}: install it with `apt-get update && apt-get install -y libfaketime`, or set AETHER_FAKETIME_LIB"
    );
    lib
}

/// The state key region `origin` wrote into `etcd`, decoded.
fn state_in(etcd: &Etcd, origin: &str) -> Option<State> {
    let out = etcd.etcdctl_ok(&[
        "get",
        "--prefix",
        &format!("/aether/v1/replication/{origin}/"),
        "--print-value-only",
    ]);
    out.lines().find_map(|l| State::decode(l.as_bytes()))
}

fn unix_ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// An NTP step of the writer's wall clock, an hour ahead and back, with its
/// monotonic clock untouched; then the writer is cut from its own etcd and
/// the source changes. Its copy must read stale everywhere within a
/// heartbeat plus 5 s: a heartbeat written during the step must neither
/// stay ahead nor read as age 0.
#[test]
fn a_wall_clock_stepped_ahead_and_back_never_makes_a_copy_read_fresh() {
    let lib = faketime_lib();
    let (etcd_a, etcd_b) = (Etcd::start(), Etcd::start());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // a's only path to its own etcd, to cut.
    let local = rt.block_on(FaultProxy::start(etcd_a.client_addr()));
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("faketime");
    std::fs::write(&clock, "+0\n").unwrap();
    let heartbeat = Duration::from_secs(1);
    let a_args = vec![
        "--region=a".to_string(),
        format!("--local-etcd={}", local.endpoint()),
        format!("--peer-etcd=b={}", etcd_b.endpoint()),
        // Long enough that the copy outlives the test once a stops.
        "--lease-ttl=30s".into(),
        format!("--heartbeat-interval={}s", heartbeat.as_secs()),
    ];
    let clock_path = clock.to_str().unwrap();
    let a = Replicator::spawn_with_env(
        &a_args,
        &[
            ("LD_PRELOAD", &lib),
            ("FAKETIME_TIMESTAMP_FILE", clock_path),
            ("FAKETIME_NO_CACHE", "1"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    // b reads a's copy in b's etcd: its origin_staleness_seconds.
    let b = Replicator::spawn(&run_args("b", &etcd_b, "a", &etcd_a));
    etcd_a.etcdctl_ok(&["put", "/aether/v1/regions/a/k", "v0"]);
    assert!(
        wait_until(Duration::from_secs(30), || a.synced() && b.synced()),
        "{}\n---\n{}",
        a.log_text(),
        b.log_text()
    );

    // The step: a's heartbeats land an hour ahead...
    std::fs::write(&clock, "+3600\n").unwrap();
    let mut seen = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            seen = state_in(&etcd_b, "a");
            seen.is_some_and(|s| s.heartbeat_unix_ms > unix_ms_now() + 1_800_000)
        }),
        "no heartbeat written during the step: {seen:?}\n{}",
        a.log_text()
    );
    // ...and back, then at once a loses its own etcd and the source moves.
    std::fs::write(&clock, "+0\n").unwrap();
    local.cut();
    etcd_a.etcdctl_ok(&["put", "/aether/v1/regions/a/k", "v1"]);

    // status reads a's etcd directly: the cut is a's alone.
    let a_status = [
        run_args("a", &etcd_a, "b", &etcd_b),
        vec!["--max-staleness=3s".into()],
    ]
    .concat();
    let (mut key, mut metric, mut row_text) = (None, None, String::new());
    let all_stale = wait_until(heartbeat + Duration::from_secs(5), || {
        let now = unix_ms_now();
        key = state_in(&etcd_b, "a").and_then(|s| s.staleness_at(now));
        metric = incoming_in(&b, "b", "origin_staleness_seconds", "a");
        let (_, out, err) = status(&a_status);
        row_text = format!("{out}{err}");
        key.is_some_and(|s| s > Duration::from_secs(3))
            && metric.is_some_and(|s| s > 3.0)
            && row_text.contains("over --max-staleness")
    });
    assert!(
        all_stale,
        "within {heartbeat:?} + 5 s of the cut: state key staleness {key:?}, b's origin_staleness_seconds {metric:?}, status:\n{row_text}"
    );

    // Healed, the writer's heartbeats follow its clock again: none stays
    // ahead of it for having been written ahead once.
    local.heal();
    assert!(
        wait_until(Duration::from_secs(20), || {
            seen = state_in(&etcd_b, "a");
            seen.is_some_and(|s| s.staleness_at(unix_ms_now()) < Some(Duration::from_secs(3)))
        }),
        "the heartbeat did not come back to the writer's clock: {seen:?}\n{}",
        a.log_text()
    );
    drop(local);
    drop(rt);
}

/// An incoming-copy metric of region `region`'s replicator `r`.
fn incoming_in(r: &Replicator, region: &str, name: &str, origin: &str) -> Option<f64> {
    r.scrape().and_then(|p| {
        metric(
            &p,
            &format!("aether_replicator_{name}{{region=\"{region}\",origin=\"{origin}\"}}"),
        )
    })
}
