//! The regions' etcds: one single-member cluster per region, data in the
//! state dir (so its command line names it).

use std::collections::BTreeMap;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::procs::{alive, free_ports, listens, spawn_detached};
use crate::state::{EtcdProc, Mesh};

impl Mesh {
    fn etcd_start(&mut self, r: &str) -> Result<(), String> {
        let e = self.st.etcds.get(r).copied().unwrap_or_default();
        let (cp, pp) = (e.client_port, e.peer_port);
        let log = self.path(&format!("logs/etcd-{r}.log"));
        self.log_line(&log, &format!("start etcd {r} client :{cp} peer :{pp}"));
        let mut cmd = Command::new("etcd");
        cmd.arg("--name")
            .arg(r)
            .arg("--data-dir")
            .arg(self.path(&format!("etcd-{r}")))
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{cp}")])
            .args(["--advertise-client-urls", &format!("http://127.0.0.1:{cp}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{pp}")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{pp}"),
            ])
            .args(["--initial-cluster", &format!("{r}=http://127.0.0.1:{pp}")])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &format!("aether-e2e-{r}")])
            .args(["--logger=zap", "--log-outputs=stderr", "--log-level=error"])
            .args(&self.st.etcd_args);
        let pid = spawn_detached(cmd, &log)?;
        self.st.etcds.insert(
            r.to_string(),
            EtcdProc {
                client_port: cp,
                peer_port: pp,
                pid,
            },
        );
        self.save();
        Ok(())
    }

    fn assign_etcd_ports(&mut self, r: &str) {
        let p = free_ports(2);
        self.st.etcds.insert(
            r.to_string(),
            EtcdProc {
                client_port: p[0],
                peer_port: p[1],
                pid: 0,
            },
        );
        let _ = std::fs::remove_dir_all(self.path(&format!("etcd-{r}")));
    }

    /// R's etcd process owns its client port and answers.
    pub(crate) fn etcd_healthy(&self, r: &str) -> bool {
        let e = self.st.etcds.get(r).copied().unwrap_or_default();
        alive(e.pid)
            && listens(e.pid, e.client_port)
            && self.ectl(r, &["endpoint", "health"]).is_some()
    }

    /// Starts (`fresh`: on new ports, retried on new ports if a port turns
    /// out taken) or restarts (same ports and data) the regions' etcds and
    /// waits until all are healthy.
    pub(crate) fn wait_etcds(&mut self, fresh: bool, regions: &[String]) -> Result<(), String> {
        let mut tries: BTreeMap<String, u32> = BTreeMap::new();
        let mut healthy: BTreeMap<String, bool> = BTreeMap::new();
        for r in regions {
            tries.insert(r.clone(), 1);
            healthy.insert(r.clone(), false);
            if fresh {
                self.assign_etcd_ports(r);
            }
            self.etcd_start(r)?;
        }
        let deadline = Instant::now() + Duration::from_secs(45);
        loop {
            let mut all = true;
            for r in regions {
                if healthy[r] {
                    continue;
                }
                if self.etcd_healthy(r) {
                    healthy.insert(r.clone(), true);
                    self.say(&format!(
                        "  etcd {r}: {} (pid {})",
                        self.etcd_url(r),
                        self.etcd_pid(r)
                    ));
                    continue;
                }
                all = false;
                if !alive(self.etcd_pid(r)) {
                    let t = tries[r];
                    if t >= 5 {
                        return Err(format!("etcd {r} did not start after {t} attempts"));
                    }
                    tries.insert(r.clone(), t + 1);
                    eprintln!(
                        "  etcd {r} exited (port taken?); starting it again (attempt {})",
                        t + 1
                    );
                    if fresh {
                        self.assign_etcd_ports(r);
                    } else {
                        sleep(Duration::from_secs(1));
                    }
                    self.etcd_start(r)?;
                }
            }
            if all {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let waiting: Vec<&String> = regions.iter().filter(|r| !healthy[*r]).collect();
                return Err(format!(
                    "etcd did not become healthy within 45s (not healthy: {waiting:?})"
                ));
            }
            sleep(Duration::from_millis(200));
        }
    }
}
