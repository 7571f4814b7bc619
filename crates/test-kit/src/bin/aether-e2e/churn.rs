//! Moderate endpoint churn for `quiet` and `record`: puts and deletes of
//! endpoint keys in every region's etcd through etcd's JSON gateway
//! (`/v3/kv/put`, `/v3/kv/deleterange`), as a detached process
//! (`aether-e2e churn`, its pid in the state so `down` stops it too).
//!
//! Each region gets a pool of 24 endpoint keys under
//! `/aether/v1/regions/R/clusters/c1/services/churn-N/...`: an absent key is
//! put, a present one overwritten (two times in three) or deleted. On
//! SIGTERM it prints one line, `puts=N deletes=N errors=N`, and exits 0.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::http::{base64, request};
use crate::links::Rng;
use crate::procs::{ours, stop_pids};
use crate::state::Mesh;

const POOL: u64 = 24;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn call(port: u16, path: &str, body: &str) -> Result<(), String> {
    match request(port, "POST", path, Some(body), Duration::from_secs(5)) {
        Ok((200, _)) => Ok(()),
        Ok((c, b)) => Err(format!("{path}: HTTP {c}: {}", b.trim())),
        Err(e) => Err(e),
    }
}

/// SIGTERM and SIGINT set STOP instead of ending the process: the churn
/// prints its counts, and a quiet or record stops its churn before it exits.
pub(crate) fn catch_stop_signals() {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_term as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_term as *const () as libc::sighandler_t);
    }
}

/// Back to the default: a signal ends the process again.
fn default_stop_signals() {
    // SAFETY: resets two dispositions to their defaults.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
        libc::signal(libc::SIGINT, libc::SIG_DFL);
    }
}

/// `aether-e2e churn RATE REGION=URL...`: RATE operations per second per
/// region until SIGTERM or SIGINT.
pub(crate) fn run_churn(rate: f64, targets: &[String]) {
    if rate.is_nan() || rate <= 0.0 {
        crate::die(format!("churn: RATE {rate}: must be above 0"));
    }
    let mut regions = Vec::new();
    for t in targets {
        let Some((name, url)) = t.split_once('=') else {
            crate::die(format!("churn: {t}: not REGION=URL"))
        };
        let Some(port) = url
            .strip_prefix("http://127.0.0.1:")
            .and_then(|p| p.parse::<u16>().ok())
        else {
            crate::die(format!(
                "churn: {url}: loopback URLs (http://127.0.0.1:PORT) only"
            ))
        };
        regions.push((name.to_string(), port, BTreeSet::<u64>::new()));
    }
    catch_stop_signals();
    let (mut puts, mut deletes, mut errors) = (0u64, 0u64, 0u64);
    let mut rng = Rng::new();
    // One operation per region per tick, the regions' ticks spread evenly.
    let tick = Duration::from_secs_f64(1.0 / (rate * regions.len() as f64));
    let mut next = Instant::now();
    let mut generation = 0u64;
    'run: while !STOP.load(Ordering::Relaxed) {
        for (name, port, present) in &mut regions {
            if STOP.load(Ordering::Relaxed) {
                break 'run;
            }
            let i = rng.next() % POOL;
            let octet = "abcde"
                .find(name.as_str())
                .filter(|_| name.len() == 1)
                .map_or(9, |x| x + 1);
            let key = format!(
                "/aether/v1/regions/{name}/clusters/c1/services/churn-{}/protocols/http/endpoints/10.{octet}.50.{i}",
                i % 3
            );
            let r = if present.contains(&i) && rng.unit() < 1.0 / 3.0 {
                let r = call(
                    *port,
                    "/v3/kv/deleterange",
                    &format!(r#"{{"key":"{}"}}"#, base64(key.as_bytes())),
                );
                if r.is_ok() {
                    present.remove(&i);
                    deletes += 1;
                }
                r
            } else {
                generation += 1;
                let value = format!(
                    r#"{{"clusterName":"c1","region":"{name}","zone":"{name}-1","port":8080,"gen":{generation}}}"#
                );
                let body = format!(
                    r#"{{"key":"{}","value":"{}"}}"#,
                    base64(key.as_bytes()),
                    base64(value.as_bytes())
                );
                let r = call(*port, "/v3/kv/put", &body);
                if r.is_ok() {
                    present.insert(i);
                    puts += 1;
                }
                r
            };
            if let Err(e) = r {
                if STOP.load(Ordering::Relaxed) {
                    // Cut short by the stop itself, not a failure of etcd.
                    break 'run;
                }
                // Counted and reported, never fatal.
                errors += 1;
                eprintln!("churn: {name}: {e}");
            }
            next += tick;
            let now = Instant::now();
            if next > now {
                sleep(next - now);
            } else {
                next = now;
            }
        }
    }
    println!("puts={puts} deletes={deletes} errors={errors}");
}

/// Stops the churn of a failing quiet or record, if one runs.
impl Mesh {
    /// The churn in every region, `rate` operations per second each.
    pub(crate) fn churn_start(&mut self, rate: u32) -> Result<(), String> {
        catch_stop_signals();
        let mut cmd = Command::new(self.e2e_bin());
        cmd.arg("--state")
            .arg(&self.dir)
            .arg("churn")
            .arg(rate.to_string());
        for r in &self.st.regions {
            cmd.arg(format!("{r}={}", self.etcd_url(r)));
        }
        // Its one line of counts goes to churn.out, its errors to the log.
        let out = self.path("churn.out");
        let _ = std::fs::remove_file(&out);
        let log = self.path("logs/churn.log");
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        cmd.stderr(err);
        let pid = spawn_detached_out(cmd, &out)?;
        self.st.churn = Some(pid);
        self.save();
        Ok(())
    }

    /// Stops the churn: its counts line ("puts=N deletes=N errors=N").
    pub(crate) fn churn_stop(&mut self) -> String {
        if let Some(pid) = self.st.churn.take() {
            stop_pids(&self.dir_str(), &[pid]);
            self.save();
        }
        default_stop_signals();
        std::fs::read_to_string(self.path("churn.out"))
            .unwrap_or_default()
            .lines()
            .last()
            .unwrap_or("")
            .to_string()
    }

    pub(crate) fn churn_running(&self) -> bool {
        self.st.churn.is_some_and(|p| ours(&self.dir_str(), p))
    }

    /// The churn log's last lines, joined (for a failure message).
    pub(crate) fn churn_log_tail(&self) -> String {
        let t = std::fs::read_to_string(self.path("logs/churn.log")).unwrap_or_default();
        let l: Vec<&str> = t.lines().collect();
        l[l.len().saturating_sub(3)..].join(" ")
    }

    /// Sleeps until `at` (ms since the epoch), failing STEP if the churn
    /// dies meanwhile.
    pub(crate) fn sleep_until(&self, step: &str, at: u64) {
        loop {
            let now = crate::state::now_ms();
            if now >= at {
                return;
            }
            if STOP.load(Ordering::Relaxed) {
                self.fail(
                    step,
                    "interrupted (SIGINT or SIGTERM); the churn is stopped",
                );
            }
            if !self.churn_running() {
                self.fail(step, &format!("the churn died: {}", self.churn_log_tail()));
            }
            sleep(Duration::from_millis((at - now).min(1000)));
        }
    }
}

/// spawn_detached, but stdout to `out` (truncated) and stderr as set.
fn spawn_detached_out(mut cmd: Command, out: &std::path::Path) -> Result<i32, String> {
    let f = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    cmd.stdout(f);
    crate::procs::spawn_configured(cmd)
}
