//! The replicator replicas: starts (on a fresh metrics port each time),
//! readiness (one leader per region, synced to every peer), the leader.

use std::io::Write;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::http::{code, metric, metrics_of};
use crate::kv::poll;
use crate::procs::{alive, free_port, listens, spawn_detached};
use crate::state::{Mesh, PortPid};

impl Mesh {
    fn replica_start(&mut self, r: &str, s: u32) -> Result<(), String> {
        let port = free_port();
        let mut args = vec![
            "--region".to_string(),
            r.to_string(),
            "--local-etcd".into(),
            self.etcd_url(r),
        ];
        for p in self.peers_of(r) {
            args.push("--peer-etcd".into());
            args.push(format!("{p}={}", self.peer_url(r, &p)));
        }
        // `record` names instances from this file, in start order.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("instances"))
        {
            let _ = writeln!(f, "{port} {r} {s}");
        }
        args.extend([
            "--lease-ttl".into(),
            format!("{}s", self.st.ttl),
            "--election-ttl".into(),
            format!("{}s", self.st.election_ttl),
            "--metrics-addr".into(),
            format!("127.0.0.1:{port}"),
        ]);
        args.extend(self.st.replicator_args.iter().cloned());
        let log = self.path(&format!("logs/replica-{r}-{s}.log"));
        self.log_line(&log, &format!("start replica {r}/{s} metrics :{port}"));
        let mut cmd = Command::new(self.path("bin/aether-replicator"));
        cmd.args(&args)
            .env("AETHER_E2E_STATE", &self.dir)
            .env("NO_COLOR", "1");
        // Flags can come from AETHER_REPLICATOR_* variables: none from the
        // caller's environment may change what the harness runs (the log
        // filter is kept).
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if k.starts_with("AETHER_REPLICATOR_") && k != "AETHER_REPLICATOR_LOG_LEVEL" {
                cmd.env_remove(&k);
            }
        }
        let pid = spawn_detached(cmd, &log)?;
        self.st
            .replicas
            .insert(format!("{r}/{s}"), PortPid { port, pid });
        self.save();
        Ok(())
    }

    /// Starts the replicas ("R/S") and waits until each owns its metrics
    /// port and serves /healthz; one that exited (port taken) is started
    /// again on a new port. Prints a line per replica.
    pub(crate) fn start_replicas(&mut self, rs: &[String]) -> Result<(), String> {
        for x in rs {
            let (r, s) = split_rs(x);
            self.replica_start(r, s)?;
        }
        for x in rs {
            let (r, s) = split_rs(x);
            let mut tries = 1;
            let mut deadline = Instant::now() + Duration::from_secs(15);
            loop {
                let rp = self.replica(r, s);
                if alive(rp.pid) && listens(rp.pid, rp.port) && code(rp.port, "/healthz") == "200" {
                    self.say(&format!(
                        "  replica {r}/{s}: pid {}, metrics http://127.0.0.1:{}/metrics",
                        rp.pid, rp.port
                    ));
                    break;
                }
                if !alive(rp.pid) {
                    if tries >= 5 {
                        return Err(format!(
                            "replica {r}/{s} did not start after {tries} attempts"
                        ));
                    }
                    tries += 1;
                    eprintln!(
                        "  replica {r}/{s} exited (port taken?); starting it again (attempt {tries})"
                    );
                    self.replica_start(r, s)?;
                    deadline = Instant::now() + Duration::from_secs(15);
                } else if Instant::now() >= deadline {
                    return Err(format!(
                        "replica {r}/{s} did not serve /healthz within 15s (last: {})",
                        code(rp.port, "/healthz")
                    ));
                }
                sleep(Duration::from_millis(100));
            }
        }
        if self.st.prometheus.is_some() {
            self.write_prom_targets();
        }
        Ok(())
    }

    /// Exactly one of R's replicas leads, the leader reports peer_synced 1
    /// for every peer, and all answer /readyz 200: the leader's slot, or
    /// why not.
    pub(crate) fn region_ready(&self, r: &str) -> Result<u32, String> {
        let mut leaders = 0;
        let mut leader = 0;
        let mut lm = String::new();
        let mut not_ready = None;
        for &s in &self.st.slots {
            let port = self.replica(r, s).port;
            let m = metrics_of(port);
            if metric(&m, "aether_replicator_is_leader").as_deref() == Some("1") {
                leaders += 1;
                leader = s;
                lm = m;
            }
            let c = code(port, "/readyz");
            if c != "200" {
                not_ready = Some(format!("{r}/{s} /readyz {c}"));
            }
        }
        if leaders != 1 {
            return Err(format!("{r} has {leaders} leaders"));
        }
        if let Some(why) = not_ready {
            return Err(why);
        }
        for p in self.peers_of(r) {
            if metric(
                &lm,
                &format!("aether_replicator_peer_synced{{peer=\"{p}\"}}"),
            )
            .as_deref()
                != Some("1")
            {
                return Err(format!(
                    "leader {r}/{leader}: peer_synced{{peer=\"{p}\"}} != 1"
                ));
            }
        }
        Ok(leader)
    }

    /// Until every region is ready, or `secs` pass: then why not.
    pub(crate) fn wait_ready(&self, secs: u64, regions: &[String]) -> Result<(), String> {
        poll(secs, 200, || {
            regions
                .iter()
                .try_for_each(|r| self.region_ready(r).map(|_| ()))
        })
    }

    /// The slot of R's leader, if one leads.
    pub(crate) fn leader_slot(&self, r: &str) -> Option<u32> {
        self.st.slots.iter().copied().find(|&s| {
            metric(
                &metrics_of(self.replica(r, s).port),
                "aether_replicator_is_leader",
            )
            .as_deref()
                == Some("1")
        })
    }

    pub(crate) fn all_replicas(&self) -> Vec<(String, u32)> {
        let mut v = Vec::new();
        for r in &self.st.regions {
            for &s in &self.st.slots {
                v.push((r.clone(), s));
            }
        }
        v
    }
}

/// "a/1" -> ("a", 1).
pub(crate) fn split_rs(x: &str) -> (&str, u32) {
    let (r, s) = x.split_once('/').unwrap_or((x, "1"));
    (r, s.parse().unwrap_or(1))
}
