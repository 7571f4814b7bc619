//! `down` (stop everything by pid, remove the state dir; idempotent) and
//! `restart` (start a region's replicas that are not running).

use std::path::{Path, PathBuf};

use crate::procs::{all_pids, cmdline, ours, stop_pids};
use crate::state::{Mesh, fmt_ms, now_ms};

/// Every pid recorded in the state file, plus any process of ours whose
/// command line names the state dir (one started but not recorded).
fn harness_pids(dir: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    if let Some(m) = Mesh::load(Path::new(dir)) {
        let st = &m.st;
        pids.extend(st.replicas.values().map(|r| r.pid));
        pids.extend(st.etcds.values().map(|e| e.pid));
        pids.extend(st.links.values().map(|l| l.pid));
        pids.extend(st.prometheus.map(|p| p.pid));
        pids.extend(st.churn);
    }
    let me = std::process::id() as i32;
    for pid in all_pids() {
        if pid == me || pids.contains(&pid) {
            continue;
        }
        let Some(argv) = cmdline(pid) else { continue };
        if is_harness_process(dir, &argv) {
            pids.push(pid);
        }
    }
    pids.retain(|p| *p > 0);
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// A process the harness starts for state dir `dir`: a replica (its copy
/// of the binary), a link proxy or churn (its copy of this binary), an etcd
/// or a Prometheus with its data in the dir. A harness command the user
/// runs (`aether-e2e verify --state DIR`) is none of these.
fn is_harness_process(dir: &str, argv: &[String]) -> bool {
    let Some(exe) = argv.first() else {
        return false;
    };
    let base = exe.rsplit('/').next().unwrap_or("");
    let joined = format!(" {} ", argv.join(" "));
    *exe == format!("{dir}/bin/aether-replicator")
        || *exe == format!("{dir}/bin/aether-e2e")
        || (base == "etcd" && joined.contains(&format!(" --data-dir {dir}/")))
        || (base == "prometheus" && joined.contains(&format!(" --storage.tsdb.path={dir}/")))
}

pub(crate) fn live_harness_pids(dir: &str) -> Vec<i32> {
    harness_pids(dir)
        .into_iter()
        .filter(|p| ours(dir, *p))
        .collect()
}

/// Stops every harness process: replicas and helpers first, so they do
/// not spend their shutdown on a dead etcd, then etcds and Prometheus.
pub(crate) fn stop_all(dir: &str) {
    let (first, rest): (Vec<i32>, Vec<i32>) = harness_pids(dir).into_iter().partition(|p| {
        cmdline(*p)
            .and_then(|a| a.first().cloned())
            .is_some_and(|exe| exe.starts_with(&format!("{dir}/bin/")))
    });
    stop_pids(dir, &first);
    stop_pids(dir, &rest);
}

pub(crate) fn cmd_down(dir: PathBuf) {
    let t0 = now_ms();
    let d = dir.display().to_string();
    if !dir.is_dir() {
        println!("== down: nothing at {d}");
        return;
    }
    if !Mesh::is_marked(&dir) {
        if std::fs::read_dir(&dir)
            .map(|mut x| x.next().is_none())
            .unwrap_or(false)
        {
            let _ = std::fs::remove_dir(&dir);
            println!("== down: removed empty {d}");
            return;
        }
        crate::die(format!("{d} is not an e2e state dir; not touching it"));
    }
    stop_all(&d);
    let left = live_harness_pids(&d);
    if !left.is_empty() {
        crate::die(format!(
            "processes still running after down: {}",
            crate::procs::join(&left)
        ));
    }
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        crate::die(format!("cannot remove {d}: {e}"));
    }
    println!(
        "== down: stopped and removed {d} in {}",
        fmt_ms(now_ms() - t0)
    );
}

pub(crate) fn cmd_restart(dir: PathBuf, r: &str) {
    let mut m = Mesh::load_or_die(dir, "");
    if !m.st.regions.iter().any(|x| x == r) {
        crate::die(format!(
            "no region {r} (regions: {})",
            m.st.regions.join(" ")
        ));
    }
    let dead: Vec<String> =
        m.st.slots
            .clone()
            .into_iter()
            .filter(|&s| !m.replica_running(r, s))
            .map(|s| format!("{r}/{s}"))
            .collect();
    if dead.is_empty() {
        println!("both replicas of {r} are running");
        return;
    }
    if let Err(e) = m.start_replicas(&dead) {
        crate::die(e);
    }
}
