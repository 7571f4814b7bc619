//! `verify`: the end-to-end checks, one line per step, exit 1 at the first
//! failure (with what was seen).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::sleep;
use std::time::Duration;

use crate::http::{metric, metrics_of};
use crate::kv::{endpoint_key, endpoint_value, poll};
use crate::procs::{kill9, ours, stop_pids};
use crate::state::{Mesh, STATE_KEY_ROOT, fmt_ms, now_ms};

pub(crate) fn cmd_verify(dir: PathBuf) {
    let hint = format!(": run 'aether-e2e up --state {}' first", dir.display());
    let mut m = Mesh::load_or_die(dir, &hint);
    m.quiet = true;
    let t0 = now_ms();
    m.step_setup();
    m.step_visibility();
    m.step_data_path();
    m.step_handoff();
    m.step_lease_lapse();
    m.step_recovery();
    m.step_peer_restart();
    println!(
        "== verify: all steps passed in {} ({} regions)",
        fmt_ms(now_ms() - t0),
        m.st.regions.len()
    );
}

impl Mesh {
    fn others_than(&self, r: &str) -> Vec<String> {
        self.peers_of(r)
    }

    /// `aether-replicator check` for R against every peer: Ok(output) if it
    /// exits 0, else Err(output).
    fn check_cmd(&self, r: &str) -> Result<String, String> {
        let mut args = vec![
            "check".to_string(),
            "--region".into(),
            r.into(),
            "--local-etcd".into(),
            self.etcd_url(r),
        ];
        for p in self.peers_of(r) {
            args.push("--peer-etcd".into());
            args.push(format!("{p}={}", self.etcd_url(&p)));
        }
        let bin = self.path("bin/aether-replicator").display().to_string();
        let Some(out) = crate::procs::run_timeout(30, &bin, &args) else {
            return Err("could not run aether-replicator check".into());
        };
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        if out.status.success() {
            Ok(text)
        } else {
            Err(text)
        }
    }

    /// Polls `check` for each region until all exit 0; the last output.
    pub(crate) fn wait_check(&self, step: &str, secs: u64, regions: &[String]) -> String {
        let mut last = String::new();
        let r = poll(secs, 300, || {
            for r in regions {
                match self.check_cmd(r) {
                    Ok(out) => last = out,
                    Err(out) => {
                        return Err(format!(
                            "check --region {r} still failing after {secs}s: {}",
                            out.replace('\n', " ")
                        ));
                    }
                }
            }
            Ok(())
        });
        if let Err(e) = r {
            self.fail(step, &e);
        }
        last
    }

    fn step_setup(&self) {
        let d = self.dir_str();
        for r in &self.st.regions {
            let pid = self.etcd_pid(r);
            if !ours(&d, pid) {
                self.fail("setup", &format!("etcd {r} (pid {pid}) is not running"));
            }
            for &s in &self.st.slots {
                let pid = self.replica(r, s).pid;
                if !ours(&d, pid) {
                    self.fail(
                        "setup",
                        &format!("replica {r}/{s} (pid {pid}) is not running"),
                    );
                }
            }
        }
        if let Err(e) = self.wait_ready(30, &self.st.regions) {
            self.fail("setup", &format!("regions not ready: {e}"));
        }
    }

    fn step_visibility(&self) {
        let t0 = now_ms();
        for (i, r) in self.st.regions.iter().enumerate() {
            let octet = i + 1;
            // 20 endpoints in a, 8 in each other region.
            let n = if r == "a" { 5 } else { 2 };
            for s in 0..n {
                for j in 1..=4 {
                    let key = endpoint_key(r, &format!("svc-{s}"), &format!("10.{octet}.{s}.{j}"));
                    self.put(
                        "visibility",
                        r,
                        &key,
                        &endpoint_value(r, &format!("{r}-{}", j % 2 + 1), 8080, ""),
                    );
                }
            }
        }
        self.wait_mirrored("visibility", 20, &self.st.regions);
        let mut detail = Vec::new();
        for r in &self.st.regions {
            for p in self.peers_of(r) {
                let cnt = self.leased(&p, r).map_or(0, |(n, _)| n);
                if cnt == 0 {
                    self.fail("visibility", &format!("{p} holds no keys of {r}"));
                }
                detail.push(format!("{r}->{p} {cnt} keys"));
            }
        }
        self.ok(
            "visibility",
            &format!(
                "{}, all on a lease, in {}",
                detail.join(", "),
                fmt_ms(now_ms() - t0)
            ),
        );
    }

    fn step_data_path(&self) {
        let t0 = now_ms();
        let want = endpoint_value("a", "a-9", 9090, r#","weight":2"#);
        // Overwrite svc-0's endpoints, delete svc-4's.
        for i in 1..=4 {
            self.put(
                "data-path",
                "a",
                &endpoint_key("a", "svc-0", &format!("10.1.0.{i}")),
                &want,
            );
            self.del(
                "data-path",
                "a",
                &endpoint_key("a", "svc-4", &format!("10.1.4.{i}")),
            );
        }
        self.wait_mirrored("data-path", 20, &["a".to_string()]);
        for p in self.peers_of("a") {
            for i in 1..=4 {
                let key = endpoint_key("a", "svc-4", &format!("10.1.4.{i}"));
                match self.ectl(&p, &["get", &key, "--keys-only"]) {
                    None => self.fail("data-path", &format!("reading {p} failed")),
                    Some(v) if !v.trim().is_empty() => {
                        self.fail("data-path", &format!("deleted {key} still in {p}"))
                    }
                    Some(_) => {}
                }
                let key = endpoint_key("a", "svc-0", &format!("10.1.0.{i}"));
                let v = self.value_in(&p, &key);
                if v != want {
                    self.fail("data-path", &format!("{key} in {p} is {v}, want {want}"));
                }
            }
        }
        self.ok(
            "data-path",
            &format!(
                "4 overwritten and 4 deleted in a; copies in {} match a ({} keys) in {}",
                self.peer_list("a"),
                self.count_keys("a", "a"),
                fmt_ms(now_ms() - t0)
            ),
        );
    }

    fn step_handoff(&mut self) {
        let step = "handoff";
        let Some(old) = self.leader_slot("a") else {
            self.fail(step, "a has no leader")
        };
        let standby = if old == 1 { 2 } else { 1 };
        let pid = self.replica("a", old).pid;
        let Ok(expected) = self.count_keys("a", "a").parse::<u64>() else {
            self.fail(step, "cannot count a's keys")
        };
        let key = endpoint_key("a", "handoff", "10.1.99.1");
        let val = endpoint_value("a", "a-1", 8080, &format!(",\"gen\":{}", now_ms()));
        if !kill9(&self.dir_str(), pid) {
            self.fail(
                step,
                &format!("leader a/{old} (pid {pid}) survived SIGKILL"),
            );
        }
        let t_kill = now_ms();
        self.put(step, "a", &key, &val);
        let (mut t_lead, mut t_seen, mut minc, mut samples) = (None, None, None::<u64>, 0);
        loop {
            let mut all_seen = true;
            for p in self.peers_of("a") {
                if let Ok(c) = self.count_keys(&p, "a").parse::<u64>() {
                    samples += 1;
                    if c < expected {
                        self.fail(
                            step,
                            &format!(
                                "{p}'s copy of a dropped to {c} keys (expected >= {expected}) {} after the kill",
                                fmt_ms(now_ms() - t_kill)
                            ),
                        );
                    }
                    minc = Some(minc.map_or(c, |m| m.min(c)));
                }
                if self.value_in(&p, &key) != val {
                    all_seen = false;
                }
            }
            if t_lead.is_none()
                && metric(
                    &metrics_of(self.replica("a", standby).port),
                    "aether_replicator_is_leader",
                )
                .as_deref()
                    == Some("1")
            {
                t_lead = Some(now_ms() - t_kill);
            }
            if all_seen && t_seen.is_none() {
                t_seen = Some(now_ms() - t_kill);
            }
            if let (Some(l), Some(s)) = (t_lead, t_seen) {
                // a gets its second replica back.
                if self.start_replicas(&[format!("a/{old}")]).is_err() {
                    self.fail(
                        step,
                        &format!("could not start a replacement replica a/{old}"),
                    );
                }
                if let Err(e) = self.wait_ready(30, &["a".to_string()]) {
                    self.fail(step, &format!("a not ready after the replacement: {e}"));
                }
                let leader = self.region_ready("a").unwrap_or(0);
                if leader != standby {
                    self.fail(
                        step,
                        &format!("a/{leader} leads after the replacement, expected a/{standby}"),
                    );
                }
                self.ok(
                    step,
                    &format!(
                        "killed leader a/{old} (pid {pid}); a/{standby} leads after {}, fresh write in {} after {}; copies never below {expected} keys (min {}, {samples} samples); replacement a/{old} pid {}",
                        fmt_ms(l),
                        self.peer_list("a"),
                        fmt_ms(s),
                        minc.map_or("?".into(), |m| m.to_string()),
                        self.replica("a", old).pid
                    ),
                );
                return;
            }
            if now_ms() >= t_kill + 30_000 {
                let f = |t: Option<u64>| t.map_or("no".into(), |t| t.to_string());
                self.fail(
                    step,
                    &format!(
                        "after 30s: standby a/{standby} leader={}, fresh write mirrored={}",
                        f(t_lead),
                        f(t_seen)
                    ),
                );
            }
            sleep(Duration::from_millis(100));
        }
    }

    fn step_lease_lapse(&self) {
        let step = "lease-lapse";
        // Every other region's subtree, in every etcd: must not change.
        let mut base = BTreeMap::new();
        for r in self.st.regions.iter().filter(|r| *r != "a") {
            for e in &self.st.regions {
                let d = self.digest(e, r);
                if d == "unreadable" {
                    self.fail(step, &format!("cannot read {r}'s subtree in {e}"));
                }
                base.insert((e.clone(), r.clone()), d);
            }
        }
        for &s in &self.st.slots {
            if !kill9(&self.dir_str(), self.replica("a", s).pid) {
                self.fail(step, &format!("replica a/{s} survived SIGKILL"));
            }
        }
        let t_kill = now_ms();
        let ttl = self.st.ttl;
        let t_gone = loop {
            let all_gone = self
                .peers_of("a")
                .iter()
                .all(|p| self.count_keys(p, "a") == "0");
            for ((e, r), b) in &base {
                let d = self.digest(e, r);
                if d != *b {
                    self.fail(
                        step,
                        &format!(
                            "{r}'s subtree in {e}'s etcd changed while a was down ({d} != {b})"
                        ),
                    );
                }
            }
            if all_gone {
                break now_ms() - t_kill;
            }
            if now_ms() >= t_kill + (ttl + 5) * 1000 {
                let seen: Vec<String> = self
                    .peers_of("a")
                    .iter()
                    .map(|p| format!("{p}={}", self.count_keys(p, "a")))
                    .collect();
                self.fail(
                    step,
                    &format!(
                        "a's copy still present {}s after both replicas died: {}",
                        ttl + 5,
                        seen.join(" ")
                    ),
                );
            }
            sleep(Duration::from_millis(250));
        };
        for p in self.peers_of("a") {
            match self.ectl(
                &p,
                &["get", &format!("{STATE_KEY_ROOT}a/state"), "--keys-only"],
            ) {
                None => self.fail(step, &format!("cannot read a's state key in {p}")),
                Some(v) if !v.trim().is_empty() => {
                    self.fail(step, &format!("a's state key is still in {p}"))
                }
                Some(_) => {}
            }
        }
        self.ok(
            step,
            &format!(
                "killed both a replicas; a's copy gone from {} after {} (TTL {ttl}s), state key gone; other regions' subtrees untouched in every etcd",
                self.peer_list("a"),
                fmt_ms(t_gone)
            ),
        );
    }

    fn step_recovery(&mut self) {
        let step = "recovery";
        let t0 = now_ms();
        let a: Vec<String> = self.st.slots.iter().map(|s| format!("a/{s}")).collect();
        if self.start_replicas(&a).is_err() {
            self.fail(step, "could not restart a's replicas");
        }
        let first = self.wait_check(step, 60, &["a".to_string()]);
        let first = first.lines().collect::<Vec<_>>().join("; ");
        if let Err(e) = self.wait_ready(30, &["a".to_string()]) {
            self.fail(step, &format!("a not ready: {e}"));
        }
        let leader = self.region_ready("a").map_or("?".into(), |s| s.to_string());
        self.wait_check(step, 30, &self.others_than("a"));
        self.ok(
            step,
            &format!(
                "a's replicas restarted (leader a/{leader}); check --region a exits 0 after {}: {first}",
                fmt_ms(now_ms() - t0)
            ),
        );
    }

    fn step_peer_restart(&mut self) {
        let step = "peer-restart";
        let t0 = now_ms();
        // Watch b's copy in a while b's etcd is away: informational (b's
        // leader may lose its election session if the restart is slow, and
        // then b's copy can lapse in a; see the note at the end of the line).
        let before = self.count_keys("a", "b");
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let stop = stop.clone();
            let dir = self.dir.clone();
            std::thread::spawn(move || {
                let m = Mesh::load(&dir)?;
                let mut min: Option<u64> = None;
                let end = now_ms() + 120_000;
                while !stop.load(Ordering::Relaxed) && now_ms() < end {
                    if let Ok(n) = m.count_keys("a", "b").parse::<u64>() {
                        min = Some(min.map_or(n, |x| x.min(n)));
                    }
                    sleep(Duration::from_millis(200));
                }
                min
            })
        };
        let pid = self.etcd_pid("b");
        if !stop_pids(&self.dir_str(), &[pid]).is_empty() {
            self.fail(step, &format!("b's etcd (pid {pid}) did not stop"));
        }
        let t_down = now_ms();
        if let Err(e) = self.wait_etcds(false, &["b".to_string()]) {
            self.fail(
                step,
                &format!("b's etcd did not come back on its ports: {e}"),
            );
        }
        let t_down = now_ms() - t_down;
        let key = endpoint_key("a", "svc-0", "10.1.0.99");
        let val = endpoint_value("a", "a-1", 8080, &format!(",\"gen\":{}", now_ms()));
        self.put(step, "a", &key, &val);
        // And one in b, which must flow out of the restarted etcd.
        let bkey = endpoint_key("b", "svc-0", "10.2.0.99");
        let bval = endpoint_value("b", "b-1", 8080, &format!(",\"gen\":{}", now_ms()));
        self.put(step, "b", &bkey, &bval);
        let mut to_check = vec!["a".to_string(), "b".to_string()];
        if self.st.regions.iter().any(|r| r == "c") {
            to_check.push("c".into());
        }
        self.wait_check(step, 60, &to_check);
        if self.value_in("b", &key) != val {
            self.fail(step, "new key of a not in b");
        }
        if self.value_in("a", &bkey) != bval {
            self.fail(step, "new key of b not in a");
        }
        if let Err(e) = self.wait_ready(60, &["b".to_string()]) {
            self.fail(step, &format!("b's replicators not healthy again: {e}"));
        }
        let leader = self.region_ready("b").map_or("?".into(), |s| s.to_string());
        stop.store(true, Ordering::Relaxed);
        let min_ba = sampler.join().ok().flatten();
        let note = match min_ba {
            Some(0) => {
                format!("; NOTE: b's copy in a lapsed (0 of {before} keys) during the restart")
            }
            m => format!(
                "; b's copy in a stayed >= {} keys (was {before})",
                m.map_or("?".into(), |m| m.to_string())
            ),
        };
        self.ok(
            step,
            &format!(
                "b's etcd restarted (SIGTERM, pid {pid} -> {}, back in {}); check {} exits 0 and b's leader b/{leader} is synced to {} after {}{note}",
                self.etcd_pid("b"),
                fmt_ms(t_down),
                to_check.join(" "),
                self.peer_list("b"),
                fmt_ms(now_ms() - t0)
            ),
        );
    }
}
