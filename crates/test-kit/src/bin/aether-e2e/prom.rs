//! The harness's Prometheus (`up --prometheus`): its start, its scrape
//! targets, and the reads of its HTTP API the checks make.

use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::http::{code, get, urlencode};
use crate::procs::{alive, free_port, listens, spawn_detached};
use crate::state::{Mesh, PortPid, utc_hms, write_atomic};

/// e2e only: 1 s scrapes and evaluations (production: 15-30 s).
const PROMETHEUS_YML: &str = "global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files:
  - rules.yml
scrape_configs:
  - job_name: aether-replicator
    # As the ServiceMonitor: the series' own `region` wins over the target's (same value), not renamed
    # to exported_region.
    honor_labels: true
    file_sd_configs:
      - files: [targets.json]
        refresh_interval: 2s
";

/// The shipped rules with every `for:` shortened to 2s, so that the alerts
/// step takes seconds, not minutes. Expressions and thresholds unchanged.
pub(crate) fn shortened_rules(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let body = line.trim_start();
        if body.starts_with("for: ") {
            out.push_str(&line[..line.len() - body.len()]);
            out.push_str("for: 2s");
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

impl Mesh {
    /// One target group per region with the `region` label the rules group
    /// by (the ServiceMonitor of deploy/kubernetes sets the same).
    /// Rewritten whenever replicas start (a started replica gets a new
    /// port); Prometheus re-reads the file on change.
    pub(crate) fn write_prom_targets(&self) {
        let groups: Vec<String> = self
            .st
            .regions
            .iter()
            .map(|r| {
                let t: Vec<String> = self
                    .st
                    .slots
                    .iter()
                    .map(|&s| format!("\"127.0.0.1:{}\"", self.replica(r, s).port))
                    .collect();
                format!(
                    "  {{\"labels\": {{\"region\": \"{r}\"}}, \"targets\": [{}]}}",
                    t.join(", ")
                )
            })
            .collect();
        write_atomic(
            &self.path("prometheus/targets.json"),
            &format!("[\n{}\n]\n", groups.join(",\n")),
        );
    }

    pub(crate) fn prom_start(&mut self) -> Result<(), String> {
        if !crate::procs::on_path("prometheus") {
            crate::die("--prometheus: prometheus is not installed (apt-get install -y prometheus)");
        }
        let dir = self.path("prometheus");
        std::fs::create_dir_all(dir.join("data")).map_err(|e| format!("{}: {e}", dir.display()))?;
        let rules_src = crate::repo().join("deploy/prometheus/aether-replicator.rules.yml");
        let rules = std::fs::read_to_string(&rules_src)
            .map_err(|e| format!("{}: {e}", rules_src.display()))?;
        write_atomic(&dir.join("rules.yml"), &shortened_rules(&rules));
        write_atomic(&dir.join("prometheus.yml"), PROMETHEUS_YML);
        self.st.prometheus = Some(PortPid::default());
        self.write_prom_targets();
        let log = self.path("logs/prometheus.log");
        for attempt in 1..=5 {
            let port = free_port();
            self.log_line(&log, &format!("start prometheus :{port}"));
            let mut cmd = Command::new("prometheus");
            cmd.arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg("--storage.tsdb.retention.time=2h")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn");
            let pid = spawn_detached(cmd, &log)?;
            self.st.prometheus = Some(PortPid { port, pid });
            self.save();
            let deadline = Instant::now() + Duration::from_secs(20);
            while alive(pid) && Instant::now() < deadline {
                if listens(pid, port) && code(port, "/-/ready") == "200" {
                    println!(
                        "  prometheus: {} (pid {pid}), rules {}",
                        self.prom_url(),
                        dir.join("rules.yml").display()
                    );
                    return Ok(());
                }
                sleep(Duration::from_millis(200));
            }
            if alive(pid) {
                return Err(format!(
                    "prometheus did not become ready within 20s (/-/ready: {})",
                    code(port, "/-/ready")
                ));
            }
            if attempt < 5 {
                eprintln!(
                    "  prometheus exited (port taken?); starting it again (attempt {})",
                    attempt + 1
                );
            }
        }
        Err("prometheus did not start after 5 attempts".into())
    }

    /// The `data` of a successful Prometheus API answer.
    pub(crate) fn prom_api(&self, path_and_query: &str, timeout_s: u64) -> Option<Value> {
        let port = self.st.prometheus?.port;
        let body = get(port, path_and_query, Duration::from_secs(timeout_s))?;
        let v: Value = serde_json::from_str(&body).ok()?;
        (v.get("status")?.as_str()? == "success").then(|| v.get("data").cloned())?
    }

    /// One line per active alert: "STATE NAME region=R origin=O peer=P".
    pub(crate) fn prom_alerts(&self) -> Option<Vec<String>> {
        let data = self.prom_api("/api/v1/alerts", 2)?;
        let alerts = data.get("alerts")?.as_array()?;
        Some(
            alerts
                .iter()
                .map(|a| {
                    let l = &a["labels"];
                    let mut line = format!(
                        "{} {}",
                        a["state"].as_str().unwrap_or("?"),
                        l["alertname"].as_str().unwrap_or("?")
                    );
                    for k in ["region", "origin", "peer"] {
                        if let Some(v) = l.get(k).and_then(Value::as_str) {
                            line.push_str(&format!(" {k}={v}"));
                        }
                    }
                    line
                })
                .collect(),
        )
    }

    /// How many series QUERY returns now (0 if Prometheus fails).
    pub(crate) fn prom_count(&self, query: &str) -> usize {
        self.prom_api(&format!("/api/v1/query?query={}", urlencode(query)), 2)
            .and_then(|d| d.get("result")?.as_array().map(Vec::len))
            .unwrap_or(0)
    }

    /// (up, total) of the active scrape targets.
    pub(crate) fn prom_targets_up(&self) -> (usize, Option<usize>) {
        let Some(t) = self
            .prom_api("/api/v1/targets", 2)
            .and_then(|d| d.get("activeTargets")?.as_array().cloned())
        else {
            return (0, None);
        };
        (
            t.iter().filter(|x| x["health"] == "up").count(),
            Some(t.len()),
        )
    }

    /// Within 20 s, Prometheus scrapes every replica; else fails STEP.
    pub(crate) fn wait_targets_up(&self, step: &str) {
        let want = self.st.regions.len() * self.st.slots.len();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (up, total) = self.prom_targets_up();
            if total == Some(want) && up == want {
                return;
            }
            if Instant::now() >= deadline {
                let total = total.map_or("?".into(), |t| t.to_string());
                self.fail(
                    step,
                    &format!("Prometheus scrapes {up} of {total} targets (want {want})"),
                );
            }
            sleep(Duration::from_millis(500));
        }
    }

    /// One `(series, value)` per series of an instant query (labels
    /// sorted, `__name__` first); None if Prometheus does not answer.
    pub(crate) fn prom_query(
        &self,
        expr: &str,
        time: Option<f64>,
    ) -> Option<Vec<(String, String)>> {
        let mut q = format!("/api/v1/query?query={}", urlencode(expr));
        if let Some(t) = time {
            q.push_str(&format!("&time={t:.3}"));
        }
        let data = self.prom_api(&q, 10)?;
        let res = data.get("result")?.as_array()?;
        Some(
            res.iter()
                .map(|r| {
                    let m = r["metric"].as_object().cloned().unwrap_or_default();
                    let name = m
                        .get("__name__")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    let mut ls: Vec<(&String, &Value)> =
                        m.iter().filter(|(k, _)| *k != "__name__").collect();
                    ls.sort_by(|a, b| a.0.cmp(b.0));
                    let ls: Vec<String> = ls
                        .iter()
                        .map(|(k, v)| format!("{k}=\"{}\"", v.as_str().unwrap_or("")))
                        .collect();
                    (
                        format!("{name}{{{}}}", ls.join(", ")),
                        r["value"][1].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect(),
        )
    }

    /// Every alert firing at some evaluation in [start, end] (Unix
    /// seconds): its labels and the first and last moment seen firing.
    pub(crate) fn prom_fired(&self, start: u64, end: u64) -> Option<Vec<String>> {
        let q = format!(
            "/api/v1/query_range?query={}&start={start}&end={end}&step=1s",
            urlencode("ALERTS{alertstate=\"firing\"}")
        );
        let data = self.prom_api(&q, 30)?;
        let mut res = data.get("result")?.as_array()?.clone();
        let key = |s: &Value| {
            let mut m: Vec<(String, String)> = s["metric"]
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                        .collect()
                })
                .unwrap_or_default();
            m.sort();
            m
        };
        res.sort_by_key(key);
        Some(
            res.iter()
                .map(|s| {
                    let m = s["metric"].as_object().cloned().unwrap_or_default();
                    let name = m.get("alertname").and_then(Value::as_str).unwrap_or("?");
                    let mut ls: Vec<(&String, &Value)> = m
                        .iter()
                        .filter(|(k, _)| !["alertname", "__name__", "alertstate"].contains(&k.as_str()))
                        .collect();
                    ls.sort_by(|a, b| a.0.cmp(b.0));
                    let ls: Vec<String> =
                        ls.iter().map(|(k, v)| format!("{k}=\"{}\"", v.as_str().unwrap_or(""))).collect();
                    let ts: Vec<f64> = s["values"]
                        .as_array()
                        .map(|v| v.iter().filter_map(|p| p[0].as_f64()).collect())
                        .unwrap_or_default();
                    let (first, last) = (ts.first().copied().unwrap_or(0.0), ts.last().copied().unwrap_or(0.0));
                    format!(
                        "{name}{{{}}} firing from {} to {} UTC (+{:.0}s..+{:.0}s into the window, {} evaluations)",
                        ls.join(", "),
                        utc_hms(first as u64),
                        utc_hms(last as u64),
                        first - start as f64,
                        last - start as f64,
                        ts.len()
                    )
                })
                .collect(),
        )
    }

    /// The Prometheus of a state dir that is up with one, running; else
    /// exits (not up, no Prometheus) or fails STEP (it died).
    pub(crate) fn load_with_prom(dir: std::path::PathBuf, step: &str) -> Mesh {
        let hint = format!(
            ": run 'aether-e2e up --prometheus --state {}' first",
            dir.display()
        );
        let m = Mesh::load_or_die(dir, &hint);
        let Some(p) = m.st.prometheus else {
            crate::die(format!(
                "{} has no Prometheus: run up with --prometheus",
                m.dir.display()
            ))
        };
        if !crate::procs::ours(&m.dir_str(), p.pid) {
            m.fail(step, &format!("prometheus (pid {}) is not running", p.pid));
        }
        m
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_for_is_shortened_and_nothing_else() {
        let rules = "      - alert: X\n        expr: up == 0\n        for: 10m\n";
        assert_eq!(
            super::shortened_rules(rules),
            "      - alert: X\n        expr: up == 0\n        for: 2s\n"
        );
    }
}
