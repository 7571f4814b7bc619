//! The state dir: `state.json` (what `up` started: ports, pids, settings),
//! the sourceable `env` written from it for shell callers, `instances`,
//! `logs/`, `bin/`, and the marker file that says the dir is ours.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The file whose presence says a dir is an e2e state dir (so `up` may
/// clear it and `down` may remove it).
pub(crate) const MARKER: &str = ".aether-e2e-state";
pub(crate) const KEY_ROOT: &str = "/aether/v1/regions/";
pub(crate) const STATE_KEY_ROOT: &str = "/aether/v1/replication/";
pub(crate) const ALL_REGIONS: [&str; 10] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];

#[derive(Serialize, Deserialize, Default, Clone, Copy)]
pub(crate) struct EtcdProc {
    pub(crate) client_port: u16,
    pub(crate) peer_port: u16,
    pub(crate) pid: i32,
}

#[derive(Serialize, Deserialize, Default, Clone, Copy)]
pub(crate) struct PortPid {
    pub(crate) port: u16,
    pub(crate) pid: i32,
}

#[derive(Serialize, Deserialize, Default)]
pub(crate) struct State {
    pub(crate) regions: Vec<String>,
    pub(crate) slots: Vec<u32>,
    pub(crate) ttl: u64,
    pub(crate) election_ttl: u64,
    pub(crate) replicator_args: Vec<String>,
    pub(crate) etcd_args: Vec<String>,
    /// Whether every link R->P goes through its own delay proxy.
    pub(crate) links_proxied: bool,
    pub(crate) link_delay_ms: u64,
    pub(crate) link_jitter_ms: u64,
    /// By region.
    pub(crate) etcds: BTreeMap<String, EtcdProc>,
    /// By "R/S" (region, slot).
    pub(crate) replicas: BTreeMap<String, PortPid>,
    /// By "R>P": the proxy R's replicas reach P's etcd through.
    pub(crate) links: BTreeMap<String, PortPid>,
    pub(crate) prometheus: Option<PortPid>,
    /// The churn process of a running quiet or record, so `down` stops it.
    pub(crate) churn: Option<i32>,
}

/// A state dir and what it holds.
pub(crate) struct Mesh {
    pub(crate) dir: PathBuf,
    pub(crate) st: State,
    /// Keeps the per-process start lines off stdout (a step inside verify
    /// or alerts prints only its own line, as the shell harness did).
    pub(crate) quiet: bool,
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Milliseconds as the harness has always printed them: `1.2s`.
pub(crate) fn fmt_ms(ms: u64) -> String {
    format!("{}.{}s", ms / 1000, (ms % 1000) / 100)
}

/// `YYYY-MM-DDTHH:MM:SSZ` of Unix seconds (UTC).
pub(crate) fn utc_iso(secs: u64) -> String {
    let (y, mo, d) = civil_from_days((secs / 86400) as i64);
    format!("{y:04}-{mo:02}-{d:02}T{}Z", utc_hms(secs))
}

/// `HH:MM:SS` of Unix seconds (UTC).
pub(crate) fn utc_hms(secs: u64) -> String {
    let s = secs % 86400;
    format!("{:02}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
}

/// Howard Hinnant's days-to-civil: (year, month, day) of days since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A value as bash's `printf %q` would quote it, for the sourceable env.
fn shell_quote(v: &str) -> String {
    if !v.is_empty()
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-:+=,@".contains(&b))
    {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', r"'\''"))
    }
}

impl Mesh {
    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    pub(crate) fn dir_str(&self) -> String {
        self.dir.to_string_lossy().into_owned()
    }

    pub(crate) fn is_marked(dir: &Path) -> bool {
        dir.join(MARKER).exists()
    }

    /// The mesh of a state dir that is up, or exits with `hint` (what to
    /// run first).
    pub(crate) fn load_or_die(dir: PathBuf, hint: &str) -> Mesh {
        match Mesh::load(&dir) {
            Some(m) => m,
            None => crate::die(format!("{} is not up{hint}", dir.display())),
        }
    }

    pub(crate) fn load(dir: &Path) -> Option<Mesh> {
        if !Mesh::is_marked(dir) {
            return None;
        }
        let text = std::fs::read_to_string(dir.join("state.json")).ok()?;
        let st = serde_json::from_str(&text).ok()?;
        Some(Mesh {
            dir: dir.to_path_buf(),
            st,
            quiet: false,
        })
    }

    /// Writes state.json and env (each through a rename, so a reader never
    /// sees half a file).
    pub(crate) fn save(&self) {
        let json = match serde_json::to_string_pretty(&self.st) {
            Ok(j) => j,
            Err(e) => crate::die(format!("cannot serialise the state: {e}")),
        };
        write_atomic(&self.path("state.json"), &json);
        write_atomic(&self.path("env"), &self.env_text());
    }

    /// The shell harness's variables, for `source DIR/env`.
    fn env_text(&self) -> String {
        let st = &self.st;
        let mut vars: Vec<(String, String)> = vec![
            ("E2E_STATE".into(), self.dir_str()),
            ("E2E_REGIONS".into(), st.regions.join(" ")),
            ("E2E_TTL".into(), st.ttl.to_string()),
            ("E2E_ELECTION_TTL".into(), st.election_ttl.to_string()),
            (
                "E2E_SLOTS".into(),
                st.slots
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            ("E2E_REPLICATOR_ARGS".into(), st.replicator_args.join(" ")),
            ("E2E_ETCD_ARGS".into(), st.etcd_args.join(" ")),
            (
                "E2E_BIN".into(),
                self.path("bin/aether-replicator")
                    .to_string_lossy()
                    .into_owned(),
            ),
            ("E2E_LINK_DELAY".into(), st.link_delay_ms.to_string()),
            ("E2E_LINK_JITTER".into(), st.link_jitter_ms.to_string()),
        ];
        for (r, e) in &st.etcds {
            vars.push((format!("ETCD_CLIENT_PORT_{r}"), e.client_port.to_string()));
            vars.push((format!("ETCD_PEER_PORT_{r}"), e.peer_port.to_string()));
            vars.push((
                format!("ETCD_URL_{r}"),
                format!("http://127.0.0.1:{}", e.client_port),
            ));
            vars.push((format!("ETCD_PID_{r}"), e.pid.to_string()));
        }
        for (k, l) in &st.links {
            let k = k.replace('>', "_");
            vars.push((format!("LINK_PORT_{k}"), l.port.to_string()));
            vars.push((format!("LINK_PID_{k}"), l.pid.to_string()));
        }
        for (k, r) in &st.replicas {
            let k = k.replace('/', "_");
            vars.push((format!("REPLICA_PORT_{k}"), r.port.to_string()));
            vars.push((format!("REPLICA_PID_{k}"), r.pid.to_string()));
        }
        if let Some(p) = st.prometheus {
            vars.push(("PROM_PID".into(), p.pid.to_string()));
            vars.push(("PROM_PORT".into(), p.port.to_string()));
            vars.push(("PROM_URL".into(), format!("http://127.0.0.1:{}", p.port)));
        }
        let mut out = format!(
            "# aether-replicator e2e state ({}); source this file.\n",
            utc_iso(now_ms() / 1000)
        );
        for (k, v) in vars {
            let _ = writeln!(out, "{k}={}", shell_quote(&v));
        }
        out
    }

    pub(crate) fn peers_of(&self, r: &str) -> Vec<String> {
        self.st
            .regions
            .iter()
            .filter(|p| *p != r)
            .cloned()
            .collect()
    }

    pub(crate) fn peer_list(&self, r: &str) -> String {
        self.peers_of(r).join(" ")
    }

    pub(crate) fn etcd_url(&self, r: &str) -> String {
        format!(
            "http://127.0.0.1:{}",
            self.st.etcds.get(r).map_or(0, |e| e.client_port)
        )
    }

    pub(crate) fn etcd_pid(&self, r: &str) -> i32 {
        self.st.etcds.get(r).map_or(0, |e| e.pid)
    }

    pub(crate) fn replica(&self, r: &str, s: u32) -> PortPid {
        self.st
            .replicas
            .get(&format!("{r}/{s}"))
            .copied()
            .unwrap_or_default()
    }

    pub(crate) fn link(&self, r: &str, p: &str) -> Option<PortPid> {
        self.st.links.get(&format!("{r}>{p}")).copied()
    }

    pub(crate) fn prom_url(&self) -> String {
        format!(
            "http://127.0.0.1:{}",
            self.st.prometheus.map_or(0, |p| p.port)
        )
    }

    pub(crate) fn links_desc(&self) -> String {
        if self.st.links_proxied {
            format!(
                "links {}ms + 0..{}ms jitter each way",
                self.st.link_delay_ms, self.st.link_jitter_ms
            )
        } else {
            "links direct".into()
        }
    }

    /// The last `n` lines of every log, on stderr.
    pub(crate) fn tail_logs(&self, n: usize) {
        let Ok(rd) = std::fs::read_dir(self.path("logs")) else {
            return;
        };
        let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files
            .iter()
            .filter(|f| f.extension().is_some_and(|x| x == "log"))
        {
            eprintln!("---- tail -n {n} {}", f.display());
            let text = std::fs::read_to_string(f).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            for l in &lines[lines.len().saturating_sub(n)..] {
                eprintln!("{l}");
            }
        }
    }

    /// Appends a line to a log (the start of a process, with its ports).
    pub(crate) fn log_line(&self, log: &Path, what: &str) {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            let _ = writeln!(f, "--- {} {what}", utc_iso(now_ms() / 1000));
        }
    }

    /// A progress line of a start, unless quiet.
    pub(crate) fn say(&self, line: &str) {
        if !self.quiet {
            println!("{line}");
        }
    }

    pub(crate) fn ok(&self, step: &str, msg: &str) {
        println!("ok   {step}: {msg}");
    }

    /// `FAIL STEP: MSG`, the logs' tails, exit 1. Stops a running churn
    /// first (it would outlive this process otherwise).
    pub(crate) fn fail(&self, step: &str, msg: &str) -> ! {
        if let Some(pid) = self.st.churn {
            crate::procs::stop_pids(&self.dir_str(), &[pid]);
        }
        println!("FAIL {step}: {msg}");
        self.tail_logs(8);
        eprintln!(
            "logs: {} (etcd-<region>.log, replica-<region>-<n>.log); state: {}",
            self.path("logs").display(),
            self.path("env").display()
        );
        std::process::exit(1)
    }
}

pub(crate) fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, path)) {
        crate::die(format!("cannot write {}: {e}", path.display()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_the_shell_harness_printed_them() {
        assert_eq!(fmt_ms(1234), "1.2s");
        assert_eq!(utc_iso(1_764_979_200), "2025-12-06T00:00:00Z");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("http://127.0.0.1:1"), "http://127.0.0.1:1");
    }
}
