//! `record`: a scenario under churn, written as a promtool test of the
//! recorded series (every series the shipped rules read, from
//! `query_range` at a 15 s step) with the hand-written expectations of
//! deploy/prometheus/recorded/expect/SCENARIO.yml (deploy/prometheus/README.md).
//!
//! Timelines (t=0 is the window start): healthy, 180 s of churn; link-cut,
//! cut a->b at 60 s, heal it at 480 s, end at 600 s; region-down, stop
//! both replicas of a at 60 s, start them again at 240 s, end at 360 s.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::Duration;

use crate::Scenario;
use crate::http::urlencode;
use crate::state::{Mesh, fmt_ms, now_ms, utc_hms, utc_iso};

const STEP: u64 = 15;
const LABEL_ORDER: [&str; 5] = ["job", "instance", "region", "origin", "peer"];

impl Mesh {
    /// At `at` runs `f`, failing STEP if it fails; appends
    /// "+SECONDS WHAT (done at +SECONDS)" to the timeline.
    fn record_at(
        &mut self,
        timeline: &mut Vec<String>,
        t0: u64,
        at: u64,
        what: &str,
        f: impl FnOnce(&mut Mesh) -> Result<(), String>,
    ) {
        self.sleep_until("record", at);
        let t = now_ms();
        if let Err(e) = f(self) {
            self.fail("record", &format!("{what} failed: {e}"));
        }
        timeline.push(format!(
            "+{} {what} (done at +{})",
            fmt_ms(t - t0),
            fmt_ms(now_ms() - t0)
        ));
    }
}

pub(crate) fn cmd_record(dir: PathBuf, scenario: Scenario, out: PathBuf) {
    let step = "record";
    let mut m = Mesh::load_with_prom(dir, step);
    m.quiet = true;
    let out = if out.is_absolute() {
        out
    } else {
        std::env::current_dir().unwrap_or_default().join(out)
    };
    if m.st.regions.len() < 3 || m.st.regions[..3] != ["a", "b", "c"] {
        crate::die("record needs 3 regions (up --regions 3)");
    }
    if m.link("a", "b").is_none() {
        crate::die(
            "record needs the link proxies: up --prometheus --regions 3 --link-delay 5 --link-jitter 20",
        );
    }
    let name = scenario.name();
    let expect = crate::repo().join(format!("deploy/prometheus/recorded/expect/{name}.yml"));
    if !expect.is_file() {
        crate::die(format!("no expectations for {name}: {}", expect.display()));
    }
    let t_step = now_ms();
    let regions = m.st.regions.clone();
    if let Err(e) = m.wait_ready(30, &regions) {
        m.fail(step, &format!("regions not ready: {e}"));
    }
    m.wait_targets_up(step);
    if let Err(e) = m.churn_start(3) {
        m.fail(step, &format!("cannot start the churn: {e}"));
    }
    // The window starts on a whole second, a few seconds into the churn.
    let t0 = (now_ms() / 1000 + 3) * 1000;
    m.sleep_until(step, t0);
    println!("== record {name}: window from {} UTC", utc_hms(t0 / 1000));
    let mut timeline = Vec::new();
    let end = match scenario {
        Scenario::Healthy => t0 + 180_000,
        Scenario::LinkCut => {
            m.record_at(&mut timeline, t0, t0 + 60_000, "cut a->b", |m| {
                m.link_cut("a", "b").map(|_| ())
            });
            m.record_at(&mut timeline, t0, t0 + 480_000, "heal a->b", |m| {
                m.link_heal("a", "b").map(|_| ())
            });
            t0 + 600_000
        }
        Scenario::RegionDown => {
            m.record_at(
                &mut timeline,
                t0,
                t0 + 60_000,
                "stop a/1 and a/2 (SIGTERM)",
                |m| {
                    let pids: Vec<i32> =
                        m.st.slots.iter().map(|&s| m.replica("a", s).pid).collect();
                    let left = crate::procs::stop_pids(&m.dir_str(), &pids);
                    left.is_empty()
                        .then_some(())
                        .ok_or_else(|| format!("still running: {left:?}"))
                },
            );
            m.record_at(
                &mut timeline,
                t0,
                t0 + 240_000,
                "start a/1 and a/2 again",
                |m| {
                    m.start_replicas(&["a/1".into(), "a/2".into()])?;
                    m.wait_ready(30, &["a".to_string()])
                },
            );
            t0 + 360_000
        }
    };
    m.sleep_until(step, end);
    let counts = m.churn_stop();
    // The last scrape and evaluation of the window in.
    sleep(Duration::from_secs(3));
    let timeline = if timeline.is_empty() {
        "load only".to_string()
    } else {
        timeline.join("; ")
    };
    let st = &m.st;
    let comment = format!(
        "Scenario {name}, recorded {} with aether-e2e: {} regions ({}),\n\
         two replicas each (instances a1, a2, ...; a1.2 is a1's slot started again), lease TTL {}s, election TTL {}s,\n\
         links {}ms + 0..{}ms jitter each way, churn 3 ops/s/region ({counts}), 1 s scrapes.\n\
         Timeline: {timeline}; window {}s.",
        utc_iso(t0 / 1000),
        st.regions.len(),
        st.regions.join(" "),
        st.ttl,
        st.election_ttl,
        st.link_delay_ms,
        st.link_jitter_ms,
        (end - t0) / 1000
    );
    if let Some(parent) = out.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    if let Err(e) = m.write_fixture(t0 / 1000, end / 1000, &expect, &out, &comment) {
        m.fail(step, &format!("writing {} failed: {e}", out.display()));
    }
    // What the harness's Prometheus (for: 2s) saw firing: for comparison only.
    println!("   firing in the harness's Prometheus (every for: 2s) during the window:");
    match m.prom_fired(t0 / 1000, end / 1000) {
        Some(f) if !f.is_empty() => f.iter().for_each(|l| println!("     {l}")),
        _ => println!("     none"),
    }
    let res = std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&out)
        .output();
    match res {
        Ok(o) if o.status.success() => m.ok(
            step,
            &format!(
                "{name} in {} ({timeline}); {} passes promtool test rules",
                fmt_ms(now_ms() - t_step),
                out.display()
            ),
        ),
        other => {
            let text = match other {
                Ok(o) => format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
                Err(e) => format!("cannot run promtool: {e}"),
            };
            for l in text.lines() {
                println!("   {l}");
            }
            println!(
                "FAIL record: {} written ({name}), but promtool test rules fails on it (above)",
                out.display()
            );
            std::process::exit(1);
        }
    }
}

/// Every aether_replicator_* name the rules read (the raw metrics, not the
/// `aether_replicator:` recordings), and `up`.
fn metric_names(rules: &str) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    let b = rules.as_bytes();
    let mut i = 0;
    while let Some(off) = rules[i..].find("aether_replicator_") {
        let start = i + off;
        let word_start =
            start == 0 || !(b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_');
        let mut end = start + "aether_replicator_".len();
        while end < b.len()
            && (b[end].is_ascii_lowercase() || b[end].is_ascii_digit() || b[end] == b'_')
        {
            end += 1;
        }
        if word_start && end > start + "aether_replicator_".len() {
            names.insert(rules[start..end].to_string());
        }
        i = end;
    }
    let mut v: Vec<String> = names.into_iter().collect();
    v.push("up".into());
    v
}

/// "PORT REGION SLOT" lines in start order: the first replica of a's slot
/// 1 is a1, a later one a1.2.
fn instance_names(path: &Path) -> BTreeMap<String, String> {
    let (mut names, mut gens) = (BTreeMap::new(), BTreeMap::<String, u32>::new());
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let p: Vec<&str> = line.split_whitespace().collect();
        if let [port, region, slot] = p[..] {
            let key = format!("{region}{slot}");
            let g = gens.entry(key.clone()).or_insert(0);
            *g += 1;
            names.insert(
                format!("127.0.0.1:{port}"),
                if *g == 1 { key } else { format!("{key}.{g}") },
            );
        }
    }
    names
}

/// A value rounded to 1e-3, as Python's repr would print it.
fn fmt_value(v: f64) -> String {
    let v = (v * 1000.0).round() / 1000.0;
    let v = if v == 0.0 { 0.0 } else { v };
    if v == v.trunc() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// promtool's expanding notation: `vxN` runs, `stale` right after a
/// present sample, `_`/`_xN` for missing ones.
fn compress(values: &[Option<String>]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    let mut prev_present = false;
    while i < values.len() {
        match &values[i] {
            None if prev_present => {
                out.push("stale".to_string());
                prev_present = false;
                i += 1;
            }
            None => {
                let j = (i..values.len())
                    .find(|&j| values[j].is_some())
                    .unwrap_or(values.len());
                out.push(if j - i == 1 {
                    "_".into()
                } else {
                    format!("_x{}", j - i)
                });
                i = j;
            }
            Some(v) => {
                let j = (i..values.len())
                    .find(|&j| values[j].as_ref() != Some(v))
                    .unwrap_or(values.len());
                out.push(if j - i == 1 {
                    v.clone()
                } else {
                    format!("{v}x{}", j - i - 1)
                });
                prev_present = true;
                i = j;
            }
        }
    }
    out.join(" ")
}

impl Mesh {
    fn write_fixture(
        &self,
        start: u64,
        end: u64,
        expect: &Path,
        out: &Path,
        comment: &str,
    ) -> Result<(), String> {
        let rules_path = crate::repo().join("deploy/prometheus/aether-replicator.rules.yml");
        let rules = std::fs::read_to_string(&rules_path)
            .map_err(|e| format!("{}: {e}", rules_path.display()))?;
        let steps = ((end - start) as f64 / STEP as f64).round() as usize + 1;
        let inst = instance_names(&self.path("instances"));
        let query = format!(
            "{{__name__=~\"{}\", job=\"aether-replicator\"}}",
            metric_names(&rules).join("|")
        );
        let q = format!(
            "/api/v1/query_range?query={}&start={start}&end={end}&step={STEP}s",
            urlencode(&query)
        );
        let data = self
            .prom_api(&q, 30)
            .ok_or("Prometheus does not answer query_range")?;
        let mut series: BTreeMap<(bool, String), Vec<Option<String>>> = BTreeMap::new();
        for s in data["result"].as_array().cloned().unwrap_or_default() {
            let mut m: BTreeMap<String, String> = s["metric"]
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                        .collect()
                })
                .unwrap_or_default();
            let name = m.remove("__name__").unwrap_or_default();
            if let Some(n) = m.get("instance").and_then(|i| inst.get(i)) {
                m.insert("instance".into(), n.clone());
            }
            let mut keys: Vec<&String> = m.keys().collect();
            let rank = |k: &str| {
                LABEL_ORDER
                    .iter()
                    .position(|x| *x == k)
                    .unwrap_or(LABEL_ORDER.len())
            };
            keys.sort_by(|a, b| (rank(a), *a).cmp(&(rank(b), *b)));
            let labels: Vec<String> = keys.iter().map(|k| format!("{k}=\"{}\"", m[*k])).collect();
            let sel = format!("{name}{{{}}}", labels.join(", "));
            // `up` first, then by selector.
            let key = (name != "up", sel.clone());
            if series.contains_key(&key) {
                return Err(format!(
                    "two recorded series map to {sel} (instance names collide)"
                ));
            }
            let mut vals = vec![None; steps];
            for p in s["values"].as_array().cloned().unwrap_or_default() {
                let (Some(t), Some(v)) = (
                    p[0].as_f64(),
                    p[1].as_str().and_then(|v| v.parse::<f64>().ok()),
                ) else {
                    continue;
                };
                let k = ((t - start as f64) / STEP as f64).round();
                if k >= 0.0 && (k as usize) < steps && !v.is_nan() {
                    vals[k as usize] = Some(fmt_value(v));
                }
            }
            series.insert(key, vals);
        }
        if series.is_empty() {
            return Err("Prometheus returned no series for the window".into());
        }
        let expect_text =
            std::fs::read_to_string(expect).map_err(|e| format!("{}: {e}", expect.display()))?;
        let rel = relpath(expect, out.parent().unwrap_or(Path::new("/")));
        let mut f = String::new();
        let _ = writeln!(
            f,
            "# GENERATED by aether-e2e record (input_series), with the hand-written expectations"
        );
        let _ = writeln!(
            f,
            "# of {rel} copied in below them. Regenerate as deploy/prometheus/README.md says."
        );
        for line in comment.lines() {
            let _ = writeln!(f, "{}", format!("# {line}").trim_end());
        }
        let _ = writeln!(
            f,
            "# {} series, {steps} samples each ({STEP}s apart, t=0 is {}).",
            series.len(),
            utc_iso(start)
        );
        f.push_str("rule_files:\n  - ../aether-replicator.rules.yml\n");
        f.push_str("evaluation_interval: 15s\n");
        f.push_str(
            "group_eval_order:\n  - aether-replicator.recording\n  - aether-replicator.alerts\n",
        );
        f.push_str("tests:\n  - interval: 15s\n    input_series:\n");
        for ((_, sel), vals) in &series {
            let _ = writeln!(
                f,
                "      - series: '{sel}'\n        values: '{}'",
                compress(vals)
            );
        }
        for line in expect_text.lines() {
            let _ = writeln!(f, "{}", format!("    {line}").trim_end());
        }
        std::fs::write(out, f).map_err(|e| format!("{}: {e}", out.display()))?;
        println!(
            "{}: {} series x {steps} samples ({STEP}s step) from {} to {} UTC",
            out.display(),
            series.len(),
            utc_hms(start),
            utc_hms(end)
        );
        Ok(())
    }
}

/// `path` relative to `base` (both absolute), as os.path.relpath.
fn relpath(path: &Path, base: &Path) -> String {
    let p: Vec<_> = path.components().collect();
    let b: Vec<_> = base.components().collect();
    let common = p.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let mut parts: Vec<String> = vec!["..".into(); b.len() - common];
    parts.extend(
        p[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compress_writes_promtools_expanding_notation() {
        let v = |s: &str| Some(s.to_string());
        assert_eq!(
            compress(&[v("1"), v("1"), v("1"), None, None, v("2")]),
            "1x2 stale _ 2"
        );
        assert_eq!(compress(&[None, None, v("0")]), "_x2 0");
    }

    #[test]
    fn values_are_rounded_as_the_python_fixture_writer_did() {
        assert_eq!(fmt_value(3.0), "3");
        assert_eq!(fmt_value(-0.0001), "0");
        assert_eq!(fmt_value(0.12345), "0.123");
    }

    #[test]
    fn metric_names_skip_recordings_and_add_up() {
        let rules = "expr: aether_replicator:lag > 0 and aether_replicator_peer_synced == 0\n\
                     expr: rate(aether_replicator_txns_applied_total[5m])";
        assert_eq!(
            metric_names(rules),
            [
                "aether_replicator_peer_synced",
                "aether_replicator_txns_applied_total",
                "up"
            ]
        );
    }

    #[test]
    fn relpath_climbs_to_the_common_dir() {
        let p = relpath(
            Path::new("/r/deploy/prometheus/recorded/expect/h.yml"),
            Path::new("/r/deploy/prometheus/recorded"),
        );
        assert_eq!(p, "expect/h.yml");
        assert_eq!(
            relpath(Path::new("/r/a/x.yml"), Path::new("/tmp/o")),
            "../../r/a/x.yml"
        );
    }
}
