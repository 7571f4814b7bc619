//! `quiet`: N seconds of churn, then no alert may have fired at any
//! evaluation of the window nor fire now, and every target must have been
//! up throughout. The harness's `for:` is 2s, so this is stricter than
//! production; on failure each alert that fired is printed with its labels
//! and when.

use std::path::PathBuf;
use std::thread::sleep;
use std::time::Duration;

use crate::state::{Mesh, now_ms};

pub(crate) fn cmd_quiet(dir: PathBuf, seconds: u64) {
    let step = "quiet";
    let mut m = Mesh::load_with_prom(dir, step);
    if seconds < 10 {
        crate::die("--seconds must be a whole number, at least 10");
    }
    let regions = m.st.regions.clone();
    if let Err(e) = m.wait_ready(30, &regions) {
        m.fail(step, &format!("regions not ready: {e}"));
    }
    m.wait_targets_up(step);
    let want = regions.len() * m.st.slots.len();
    if let Err(e) = m.churn_start(3) {
        m.fail(step, &format!("cannot start the churn: {e}"));
    }
    let t0 = now_ms();
    m.sleep_until(step, t0 + seconds * 1000);
    let counts = m.churn_stop();
    let t1 = now_ms();
    if !counts.ends_with("errors=0") {
        m.fail(
            step,
            &format!("the churn had failures ({counts}): {}", m.churn_log_tail()),
        );
    }
    // The load got through: every copy matches its source again.
    m.wait_mirrored(step, 30, &regions);
    // One more evaluation and scrape past the window's end.
    sleep(Duration::from_secs(2));
    let secs = (t1 - t0).div_ceil(1000);
    let at = Some(t1 as f64 / 1000.0);
    let Some(n) = m.prom_query(
        &format!("count(max_over_time(ALERTS{{alertstate=\"firing\"}}[{secs}s])) or vector(0)"),
        at,
    ) else {
        m.fail(step, "Prometheus does not answer")
    };
    let Some(fired) = m.prom_fired(t0 / 1000, t1 / 1000 + 1) else {
        m.fail(step, "Prometheus does not answer")
    };
    let now_firing: Vec<String> = m
        .prom_alerts()
        .unwrap_or_default()
        .into_iter()
        .filter(|l| l.starts_with("firing"))
        .collect();
    let Some(targets) = m.prom_query(
        &format!("min_over_time(up{{job=\"aether-replicator\"}}[{secs}s])"),
        at,
    ) else {
        m.fail(step, "Prometheus does not answer")
    };
    let links = m.links_desc();
    let count = n.first().map_or("?", |(_, v)| v.as_str());
    if count != "0" || !fired.is_empty() || !now_firing.is_empty() {
        println!(
            "FAIL quiet: alerts fired during {secs}s of churn ({links}; for: shortened to 2s in this harness, so stricter than production):"
        );
        for f in &fired {
            println!("  {f}");
        }
        for f in &now_firing {
            println!("  now: {f}");
        }
        std::process::exit(1);
    }
    let down = targets.iter().filter(|(_, v)| v != "1").count();
    if targets.len() != want || down > 0 {
        let seen: Vec<String> = targets.iter().map(|(s, v)| format!("{s} {v}")).collect();
        m.fail(
            step,
            &format!(
                "not every target up throughout the window (want {want}): {}",
                seen.join(";")
            ),
        );
    }
    m.ok(
        step,
        &format!(
            "{secs}s of churn in {} (3 ops/s/region: {}; {links}), copies converged after; no alert firing at any evaluation of the window nor now (every for: shortened to 2s here, so stricter than production), {want}/{want} targets up throughout",
            regions.join(" "),
            counts.trim_end_matches(" errors=0")
        ),
    );
}
