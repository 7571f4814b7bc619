//! Running the real `aether-replicator` binary, and talking HTTP to it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The binary cargo built for these tests.
pub(crate) fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_aether-replicator"))
}

/// A loopback address that refuses connections for the whole test: a
/// port below 1024, outside the range the kernel hands out for a bind to
/// port 0, so no etcd, proxy or replicator of a test running beside this
/// one can take it. A port bound to 0 and released can be: an etcd of
/// another test once answered on one, and a peer meant to be unreachable
/// read as reachable with no copy.
pub(crate) fn dead_addr() -> SocketAddr {
    (1..1024u16)
        .map(|port| SocketAddr::from(([127, 0, 0, 1], port)))
        .find(|addr| TcpStream::connect_timeout(addr, Duration::from_millis(200)).is_err())
        .expect("every loopback port below 1024 accepts connections")
}

/// A minimal HTTP/1.0 GET: (status, body). None if nothing answers.
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split(' ').nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// The value of the first sample in a Prometheus text page that matches
/// `selector`: `name` or `name{k="v",...}`, where the sample has the same
/// name and at least the selector's labels (in any order), so a selector
/// keeps matching when a label is added next to the ones it names.
pub(crate) fn metric(page: &str, selector: &str) -> Option<f64> {
    let (name, want) = split_sample(selector)?;
    page.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, labels) = split_sample(series)?;
        (n == name && want.iter().all(|w| labels.contains(w)))
            .then(|| value.parse().ok())
            .flatten()
    })
}

/// `name{a="x",b="y"}` -> ("name", ["a=\"x\"", "b=\"y\""]). Label values
/// with `",` inside are not supported (the replicator has none).
fn split_sample(series: &str) -> Option<(&str, Vec<String>)> {
    let Some((name, rest)) = series.split_once('{') else {
        return Some((series, Vec::new()));
    };
    let body = rest.strip_suffix('}')?;
    let labels = body
        .split("\",")
        .filter(|p| !p.is_empty())
        .map(|p| {
            let p = p.strip_suffix('"').unwrap_or(p);
            format!("{p}\"")
        })
        .collect();
    Some((name, labels))
}

/// A replicator process, killed on drop.
///
/// It listens for metrics on `127.0.0.1:0` and says where in its
/// "replicator started" log line: a port picked by the test and released
/// before the binary binds it can be taken in between by an etcd of a test
/// running beside this one, whose own `/metrics` then answers the scrapes.
pub(crate) struct Replicator {
    pub child: Child,
    metrics: OnceLock<SocketAddr>,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Replicator {
    /// Starts the binary with `args` plus `--metrics-addr`.
    pub(crate) fn spawn(args: &[String]) -> Replicator {
        Replicator::spawn_with_env(args, &[])
    }

    /// [`Replicator::spawn`] with extra environment variables.
    pub(crate) fn spawn_with_env(args: &[String], env: &[(&str, &str)]) -> Replicator {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("replicator.log");
        let child = Command::new(binary())
            .args(args)
            .arg("--metrics-addr=127.0.0.1:0")
            .envs(env.iter().copied())
            .env("AETHER_REPLICATOR_LOG_LEVEL", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn aether-replicator");
        Replicator {
            child,
            metrics: OnceLock::new(),
            log,
            _dir: dir,
        }
    }

    /// Where its metrics server listens, once its log has said so.
    pub(crate) fn metrics(&self) -> Option<SocketAddr> {
        if let Some(addr) = self.metrics.get() {
            return Some(*addr);
        }
        let addr = bound_metrics_addr(&self.log_text())?;
        Some(*self.metrics.get_or_init(|| addr))
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The /metrics page, if it answers.
    pub(crate) fn scrape(&self) -> Option<String> {
        http_get(self.metrics()?, "/metrics").map(|(_, b)| b)
    }

    pub(crate) fn is_leader(&self) -> bool {
        self.scrape()
            .and_then(|p| metric(&p, "aether_replicator_is_leader"))
            == Some(1.0)
    }

    /// `/readyz` answers 200: this replica holds its election role (leader
    /// or standby). Says nothing about the peers; see [`Replicator::synced`].
    pub(crate) fn ready(&self) -> bool {
        self.metrics()
            .and_then(|addr| http_get(addr, "/readyz"))
            .is_some_and(|(s, _)| s == 200)
    }

    /// This replica leads and reports `peer_synced 1` for every peer it has.
    pub(crate) fn synced(&self) -> bool {
        self.scrape().is_some_and(|p| {
            let synced: Vec<&str> = p
                .lines()
                .filter(|l| l.starts_with("aether_replicator_peer_synced{"))
                .collect();
            metric(&p, "aether_replicator_is_leader") == Some(1.0)
                && !synced.is_empty()
                && synced.iter().all(|l| l.ends_with(" 1"))
        })
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL and reap.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait up to `timeout` for the exit status.
    pub(crate) fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

/// The address in a log's "replicator started" line: `addr=…` in the
/// text format, `"addr":"…"` in JSON.
fn bound_metrics_addr(log: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains("replicator started"))?;
    let value = match line.split_once(" addr=") {
        Some((_, rest)) => rest.split_whitespace().next()?,
        None => line.split_once("\"addr\":\"")?.1.split('"').next()?,
    };
    value.parse().ok()
}

impl Drop for Replicator {
    fn drop(&mut self) {
        self.kill();
    }
}
