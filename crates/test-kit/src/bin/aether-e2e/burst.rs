//! `burst` (the many-regions case): K rounds in which every region's etcd
//! takes N single-put revisions from W writers at once (examples/loadgen),
//! then every peer is waited for until it holds all of them. One REPORT
//! line per round: how long after the last write returned the last peer
//! held everything, the leaders' mirror txns and events per txn, the
//! largest peak RSS of a replica, and the CPU the replicas spent; then
//! REPORT totals and a STAT line per process.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::http::{metric_sum, metrics_of};
use crate::procs::{clk_tck, cpu_ticks, hwm_kib};
use crate::state::{KEY_ROOT, Mesh};

impl Mesh {
    /// Metric NAME summed over every replica (a standby's counters stand
    /// still, so differences are the leaders' work).
    fn replicas_sum(&self, name: &str) -> f64 {
        self.all_replicas()
            .iter()
            .map(|(r, s)| metric_sum(&metrics_of(self.replica(r, *s).port), name))
            .sum()
    }

    fn replicas_cpu_ticks(&self) -> Vec<u64> {
        self.all_replicas()
            .iter()
            .map(|(r, s)| cpu_ticks(self.replica(r, *s).pid))
            .collect()
    }
}

/// Waits for every child; the last line of each one's stdout (loadgen
/// prints the millisecond its work ended), or exits with `what`.
fn last_lines(kids: Vec<std::io::Result<Child>>, what: &str) -> Vec<u64> {
    let mut out = Vec::new();
    let mut failed = false;
    for k in kids {
        match k.and_then(Child::wait_with_output) {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                out.push(
                    text.lines()
                        .last()
                        .and_then(|l| l.trim().parse().ok())
                        .unwrap_or(0),
                );
            }
            _ => failed = true,
        }
    }
    if failed {
        crate::die(what);
    }
    out
}

pub(crate) fn cmd_burst(
    dir: PathBuf,
    revisions: u64,
    writers: u64,
    rounds: u64,
    loadgen: Option<PathBuf>,
) {
    let m = Mesh::load_or_die(dir, "");
    let load = match loadgen {
        Some(l) if l.is_file() => l,
        Some(l) => crate::die(format!("--loadgen {}: not an executable", l.display())),
        None => crate::up::loadgen_bin().unwrap_or_else(|e| crate::die(e)),
    };
    let regions = m.st.regions.clone();
    if let Err(e) = m.wait_ready(30, &regions) {
        crate::die(format!("regions not ready: {e}"));
    }
    let hz = clk_tck();
    let n = regions.len();
    for round in 0..rounds {
        let txns0 = m.replicas_sum("aether_replicator_txns_applied_total");
        let ev0 = m.replicas_sum("aether_replicator_events_applied_total");
        let cpu0 = m.replicas_cpu_ticks();
        let run = |args: Vec<String>| {
            Command::new(&load)
                .args(args)
                .stdout(Stdio::piped())
                .spawn()
        };
        let kids = regions
            .iter()
            .map(|r| {
                run(vec![
                    "burst".into(),
                    m.etcd_url(r),
                    format!("{KEY_ROOT}{r}/burst{round}/"),
                    revisions.to_string(),
                    writers.to_string(),
                ])
            })
            .collect();
        let t_end = last_lines(kids, &format!("a burst's writes failed (round {round})"))
            .into_iter()
            .max()
            .unwrap_or(0);
        let mut kids = Vec::new();
        for r in &regions {
            for p in m.peers_of(r) {
                kids.push(run(vec![
                    "wait".into(),
                    m.etcd_url(&p),
                    format!("{KEY_ROOT}{r}/burst{round}/"),
                    revisions.to_string(),
                    "120".into(),
                ]));
            }
        }
        let t_max = last_lines(
            kids,
            &format!("a peer never held a region's burst (round {round})"),
        )
        .into_iter()
        .max()
        .unwrap_or(0);
        let rss_max = m
            .all_replicas()
            .iter()
            .map(|(r, s)| hwm_kib(m.replica(r, *s).pid))
            .max()
            .unwrap_or(0);
        let txns = m.replicas_sum("aether_replicator_txns_applied_total") - txns0;
        let ev = m.replicas_sum("aether_replicator_events_applied_total") - ev0;
        let cpu1 = m.replicas_cpu_ticks();
        // CPU over the round (bursts, convergence and the checks' polling)
        // per replica; per 100k events applied by all of them.
        let d: Vec<u64> = cpu1
            .iter()
            .zip(&cpu0)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        let (s, mx) = (
            d.iter().sum::<u64>() as f64 / hz,
            d.iter().copied().max().unwrap_or(0) as f64 / hz,
        );
        let per = if ev > 0.0 { s * 100_000.0 / ev } else { 0.0 };
        println!(
            "REPORT burst regions={n} streams={} round={round} revisions={revisions} writers={writers} converged_after_last_write_ms={} txns={txns} events_per_txn={:.1} peak_rss_kib_max={rss_max} replica_cpu_s_sum={s:.2} replica_cpu_s_max={mx:.2} replica_cpu_s_per_100k_events={per:.2}",
            n * (n - 1),
            t_max as i64 - t_end as i64,
            if txns > 0.0 { ev / txns } else { 0.0 }
        );
    }
    println!("REPORT totals {}", m.stat_totals());
    m.print_stats();
}
