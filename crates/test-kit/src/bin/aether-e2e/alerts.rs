//! `alerts`: region a's replicas stopped, the no-leader and lapse alerts
//! must fire (through the harness's Prometheus), and resolve once they are
//! back.

use std::path::PathBuf;
use std::thread::sleep;
use std::time::Duration;

use crate::procs::stop_pids;
use crate::state::{Mesh, fmt_ms, now_ms};

impl Mesh {
    /// Polls Prometheus's alerts until `want` holds of them; else fails
    /// STEP with the alerts last seen. Returns them.
    pub(crate) fn wait_alerts(
        &self,
        step: &str,
        secs: u64,
        want: impl Fn(&[String]) -> bool,
        desc: &str,
    ) -> Vec<String> {
        let deadline = now_ms() + secs * 1000;
        loop {
            let seen = match self.prom_alerts() {
                Some(a) if want(&a) => return a,
                Some(a) => a.join(";"),
                None => "<Prometheus unreachable>".into(),
            };
            if now_ms() >= deadline {
                self.fail(
                    step,
                    &format!("{desc} not seen within {secs}s; active alerts: {seen}"),
                );
            }
            sleep(Duration::from_millis(500));
        }
    }
}

/// NoLeader firing for region a, and OriginCopyLapsed firing for origin a
/// in every other region.
fn a_down_fire(others: &[String], lines: &[String]) -> bool {
    lines
        .iter()
        .any(|l| l == "firing AetherReplicatorNoLeader region=a")
        && others.iter().all(|r| {
            lines.iter().any(|l| {
                *l == format!("firing AetherReplicatorOriginCopyLapsed region={r} origin=a")
            })
        })
}

/// Neither alert active (firing or pending) any more.
fn a_down_gone(lines: &[String]) -> bool {
    !lines.iter().any(|l| {
        l.ends_with("AetherReplicatorNoLeader region=a")
            || (l.contains("AetherReplicatorOriginCopyLapsed region=") && l.ends_with(" origin=a"))
    })
}

pub(crate) fn cmd_alerts(dir: PathBuf) {
    let step = "alerts";
    let mut m = Mesh::load_with_prom(dir, step);
    m.quiet = true;
    let regions = m.st.regions.clone();
    if let Err(e) = m.wait_ready(30, &regions) {
        m.fail(step, &format!("regions not ready: {e}"));
    }
    // Every replica scraped, and neither alert active, before anything is stopped.
    m.wait_targets_up(step);
    m.wait_alerts(
        step,
        20,
        a_down_gone,
        "a healthy start (no NoLeader for a, no lapse of a)",
    );
    // The lapse alert needs the incoming-side metric from every other
    // region; without it the alert can never fire, so say that instead of
    // timing out.
    let others = m.peers_of("a");
    for r in &others {
        if m.prom_count(&format!(
            "aether_replicator_origin_copy_present{{origin=\"a\",region=\"{r}\"}}"
        )) == 0
        {
            m.fail(
                step,
                &format!(
                    "Prometheus has no aether_replicator_origin_copy_present{{origin=\"a\"}} from region {r}: this replicator binary does not export the incoming-side metrics, so AetherReplicatorOriginCopyLapsed cannot fire"
                ),
            );
        }
    }
    for &s in &m.st.slots {
        stop_pids(&m.dir_str(), &[m.replica("a", s).pid]);
    }
    let t0 = now_ms();
    let fired = m.wait_alerts(
        step,
        m.st.ttl + 30,
        |l| a_down_fire(&others, l),
        &format!(
            "AetherReplicatorNoLeader{{region=a}} and AetherReplicatorOriginCopyLapsed{{origin=a}} in {}",
            others.join(" ")
        ),
    );
    let t_fire = now_ms() - t0;
    let fired: Vec<&str> = fired
        .iter()
        .filter_map(|l| l.strip_prefix("firing "))
        .collect();
    let t0 = now_ms();
    let a: Vec<String> = m.st.slots.iter().map(|s| format!("a/{s}")).collect();
    if m.start_replicas(&a).is_err() {
        m.fail(step, "could not restart a's replicas");
    }
    if let Err(e) = m.wait_ready(30, &["a".to_string()]) {
        m.fail(step, &format!("a not ready after the restart: {e}"));
    }
    m.wait_alerts(
        step,
        60,
        a_down_gone,
        "resolution of both alerts after the restart",
    );
    let t_resolve = now_ms() - t0;
    m.ok(
        step,
        &format!(
            "stopped both a replicas: firing after {} (lease TTL {}s, for: 2s): {}; restarted: both resolved after {}",
            fmt_ms(t_fire),
            m.st.ttl,
            fired.join("; "),
            fmt_ms(t_resolve)
        ),
    );
}
