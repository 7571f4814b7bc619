//! The summary and the report file.

use std::fmt::Write as _;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;

use crate::checker::Checker;
use crate::load::LoadStats;
use crate::mesh::REGIONS;
use crate::nemesis::Log;

pub(crate) struct Outcome {
    pub seed: u64,
    pub duration: std::time::Duration,
    pub etcd: String,
    pub time_to_exact: Option<std::time::Duration>,
    pub last_inexact: String,
    pub peak_rss_kib: u64,
    /// How long the large cluster's preload took, and the first sync of
    /// every copy after it.
    pub preload: std::time::Duration,
    pub first_sync: std::time::Duration,
    pub report_path: std::path::PathBuf,
}

pub(crate) fn summary(
    o: &Outcome,
    c: &Checker,
    log: &Log,
    loads: &[std::sync::Arc<LoadStats>],
) -> String {
    let f = &c.figures;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "SEED={} DURATION={}s etcd={}",
        o.seed,
        o.duration.as_secs(),
        o.etcd
    );
    let _ = writeln!(
        s,
        "large copy: {} keys of {} preloaded in {:.1}s, every copy synced {:.1}s later",
        crate::load::BIG_KEYS,
        REGIONS[crate::load::BIG],
        o.preload.as_secs_f64(),
        o.first_sync.as_secs_f64()
    );
    let kinds = log.by_kind();
    let total: usize = kinds.values().sum();
    let _ = writeln!(s, "faults injected: {total} {kinds:?}");
    let _ = writeln!(s, "  of them on the large copy: {:?}", log.large_by_kind());
    for (i, l) in loads.iter().enumerate() {
        let _ = writeln!(
            s,
            "load {}: puts={} deletes={} large={} bulk={} failures={}",
            REGIONS[i],
            l.puts.load(Ordering::Relaxed),
            l.deletes.load(Ordering::Relaxed),
            l.large.load(Ordering::Relaxed),
            l.bulk.load(Ordering::Relaxed),
            l.failures.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(
        s,
        "samples: {} taken, {} evaluated, {} skipped (fault/gap/restore), {} not caught up",
        f.samples.load(Ordering::Relaxed),
        f.evaluated.load(Ordering::Relaxed),
        f.skipped.load(Ordering::Relaxed),
        f.not_caught_up.load(Ordering::Relaxed)
    );
    let _ = writeln!(
        s,
        "discrepant samples: {} ({} signalled), excused out-of-band problems: {}, excused after a lapse: {}, violating samples: {}, violations: {} ({} distinct)",
        f.discrepant_samples.load(Ordering::Relaxed),
        f.signalled_discrepancies.load(Ordering::Relaxed),
        f.excused_oob.load(Ordering::Relaxed),
        f.excused_lapse.load(Ordering::Relaxed),
        f.violation_samples.load(Ordering::Relaxed),
        f.violations.load(Ordering::Relaxed),
        f.list.lock().unwrap_or_else(PoisonError::into_inner).len()
    );
    let per_pair = f
        .per_pair
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(&(a, b), &(n, ms))| {
            (
                format!("{}->{}", REGIONS[a], REGIONS[b]),
                format!("{n} at {:.0}ms", ms as f64 / n.max(1) as f64),
            )
        })
        .collect::<std::collections::BTreeMap<_, _>>();
    let _ = writeln!(s, "evaluated per pair (mean time): {per_pair:?}");
    let claims = f
        .claims
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(&(a, b), &(any, sender, receiver))| {
            (
                format!("{}->{}", REGIONS[a], REGIONS[b]),
                format!("{any} (sender {sender}, receiver {receiver})"),
            )
        })
        .collect::<std::collections::BTreeMap<_, _>>();
    let _ = writeln!(s, "judged under a claim per pair: {claims:?}");
    let _ = writeln!(
        s,
        "metric series in leader scrapes (present, absent): {:?}",
        f.series_seen.lock().unwrap_or_else(PoisonError::into_inner)
    );
    let longest = f
        .longest_signalled
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(&(a, b), &ms)| {
            (
                format!("{}->{}", REGIONS[a], REGIONS[b]),
                ms as f64 / 1000.0,
            )
        })
        .collect::<std::collections::BTreeMap<_, _>>();
    let max = longest.values().copied().fold(0.0, f64::max);
    let _ = writeln!(
        s,
        "longest signalled-stale period: {max:.1}s, per pair {longest:?}"
    );
    let mut by_kind = std::collections::BTreeMap::<String, usize>::new();
    for v in f.list.lock().unwrap_or_else(PoisonError::into_inner).iter() {
        *by_kind
            .entry(format!("{} {}->{}", v.kind, v.origin, v.peer))
            .or_default() += 1;
    }
    if !by_kind.is_empty() {
        let _ = writeln!(s, "violation kinds (distinct keys): {by_kind:?}");
    }
    match o.time_to_exact {
        Some(d) => {
            let _ = writeln!(s, "time to exact after heal: {:.1}s", d.as_secs_f64());
        }
        None => {
            let _ = writeln!(s, "NOT exact in time; last difference: {}", o.last_inexact);
        }
    }
    let _ = writeln!(s, "peak RSS of replicators (VmHWM): {} KiB", o.peak_rss_kib);
    let ready = f.ready_seen.lock().unwrap_or_else(PoisonError::into_inner);
    let _ = writeln!(
        s,
        "readyz (200, other) per replica: {:?}",
        ready.iter().collect::<std::collections::BTreeMap<_, _>>()
    );
    let _ = writeln!(s, "report: {}", o.report_path.display());
    s
}

pub(crate) fn write(o: &Outcome, summary: &str, c: &Checker, log: &Log) {
    let mut s = String::new();
    let _ = writeln!(s, "{summary}");
    let _ = writeln!(s, "== faults (unix ms) ==");
    for (i, f) in log
        .faults
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .enumerate()
    {
        let _ = writeln!(
            s,
            "#{i} {:?}{} start={} heal={} {} {}",
            f.kind,
            if f.large { " (large copy)" } else { "" },
            f.start_ms,
            f.heal_ms.map_or("-".into(), |h| h.to_string()),
            f.desc,
            f.outcome
        );
    }
    let _ = writeln!(s, "== out-of-band changes (unix ms) ==");
    for x in log
        .oob
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
    {
        let _ = writeln!(
            s,
            "on {} copy of {} key {} start={} done={}",
            REGIONS[x.peer],
            x.origin.map_or("every region", |o| REGIONS[o]),
            x.key
                .as_ref()
                .map_or("(all)".into(), |k| String::from_utf8_lossy(k).into_owned()),
            x.t_start,
            x.t_done.map_or("-".into(), |d| d.to_string()),
        );
    }
    let _ = writeln!(s, "== history resets ==");
    for (r, reg) in c.regions.iter().enumerate() {
        let h = reg.history.lock().unwrap_or_else(PoisonError::into_inner);
        for (t, what) in &h.resets {
            let _ = writeln!(s, "{} {t} {what}", REGIONS[r]);
        }
        let _ = writeln!(s, "{}: {} events recorded", REGIONS[r], h.events);
    }
    let _ = writeln!(s, "== violations (first occurrence, count) ==");
    for v in c
        .figures
        .list
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
    {
        let _ = writeln!(
            s,
            "t={} {}->{} key={} kind={} x{} (until t={})\n  peer value: {}\n  allowed: {:?}\n  signals: {}",
            v.t_ms,
            v.origin,
            v.peer,
            v.key,
            v.kind,
            v.count,
            v.last_t_ms,
            v.peer_value,
            v.allowed,
            v.signals
        );
        if v.count > 1 {
            let _ = writeln!(
                s,
                "  last sample: peer value: {}\n  last signals: {}",
                v.last_peer_value, v.last_signals
            );
        }
    }
    std::fs::write(&o.report_path, s).expect("write report");
}
