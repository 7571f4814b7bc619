//! Real etcd servers owned by a test: a single member ([`Etcd`]) or a
//! cluster ([`Cluster`]).
//!
//! All calls here are blocking (std::process / std::net). Calling them from a
//! `#[tokio::test]` is fine as long as nothing on the *same* current-thread
//! runtime must make progress meanwhile (e.g. a [`crate::FaultProxy`] that an
//! `etcdctl` call goes through): use a multi-thread runtime or
//! `tokio::task::spawn_blocking` in that case.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aether_etcd::{ClientConfig, Credentials};

use crate::tls::TlsFiles;

const NOT_FOUND: &str = "etcd not found: install it with `apt-get update && apt-get install -y etcd-server etcd-client`, or set ETCD_BIN";
const ETCDCTL_NOT_FOUND: &str = "etcdctl not found: install it with `apt-get update && apt-get install -y etcd-server etcd-client`, or set ETCDCTL_BIN";

/// Launch attempts (fresh ports for `start`, same ports for `restart`).
const ATTEMPTS: u32 = 5;
/// Readiness deadline per attempt.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(100);
/// A member that has a leader and is published, but whose /health stays false
/// (e.g. an active NOSPACE alarm persisted in the data dir), counts as ready
/// after this long.
const LEADER_GRACE: Duration = Duration::from_secs(2);
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
const LOG_TAIL_LINES: usize = 30;

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Options for [`Etcd`]; see [`Etcd::builder`].
#[derive(Default, Clone, Debug)]
pub struct EtcdBuilder {
    tls: Option<TlsFiles>,
    extra_args: Vec<String>,
    data_dir: Option<PathBuf>,
    name: Option<String>,
}

impl EtcdBuilder {
    /// The member name (`--name`), instead of a unique one: two etcds given
    /// the same name, advertised peer URL and cluster token share a member
    /// id and a cluster id, as one manifest deployed at two sites does.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Serve clients over TLS (`--cert-file/--key-file`), and with
    /// `tls.client_cert_auth` also require client certificates
    /// (`--client-cert-auth --trusted-ca-file`). The endpoint becomes https://.
    pub fn tls(mut self, tls: TlsFiles) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Extra etcd flags, appended after the harness' own flags (so they win
    /// for single-valued flags), e.g. `&["--max-txn-ops=1024"]`. May be called
    /// repeatedly.
    pub fn extra_args(mut self, args: &[&str]) -> Self {
        self.extra_args.extend(args.iter().map(|s| s.to_string()));
        self
    }

    /// Use (and possibly reuse) this data dir instead of one inside the
    /// harness' temp dir. It is not removed on drop (but `restart_empty`
    /// wipes it).
    pub fn data_dir(mut self, path: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(path.into());
        self
    }

    /// Starts etcd and waits until it is ready; panics (with the log tail) if
    /// it cannot be started.
    pub fn start(self) -> Etcd {
        let mut etcd = self.unstarted();
        // Only a data dir that holds no member yet may be wiped between
        // attempts (a failed attempt may have initialised it with the wrong
        // peer URL).
        let fresh = !etcd.data_dir.join("member").exists();
        let mut failures = Vec::new();
        for attempt in 1..=ATTEMPTS {
            if attempt > 1 {
                if fresh {
                    // etcd keeps everything under <data-dir>/member.
                    let _ = fs::remove_dir_all(etcd.data_dir.join("member"));
                }
                etcd.ports = Ports::pick();
            }
            match etcd.launch(attempt) {
                Ok(()) => return etcd,
                Err(e) => failures.push(format!("attempt {attempt} ({:?}): {e}", etcd.ports)),
            }
        }
        etcd.fail("start", &failures)
    }

    /// The etcd, its name and ports picked, not started: a member to add
    /// to a running cluster (`member add` with its [`Etcd::peer_url`]),
    /// then start with [`Etcd::join`]. Dropping it kills whatever it
    /// started.
    pub fn unstarted(self) -> Etcd {
        crate::init_logging();
        let bin = etcd_bin();
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let name = self
            .name
            .unwrap_or_else(|| format!("etcd-{}-{id}", std::process::id()));
        let dir = tempfile::Builder::new()
            .prefix("aether-etcd-")
            .tempdir()
            .expect("create etcd temp dir");
        let data_dir = self.data_dir.unwrap_or_else(|| dir.path().join("data"));
        let log_path = dir.path().join("etcd.log");
        Etcd {
            bin,
            name,
            ports: Ports::pick(),
            tls: self.tls,
            extra_args: self.extra_args,
            data_dir,
            log_path,
            proc: None,
            last_pid: 0,
            cluster: None,
            advertise_peer: None,
            dir,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Ports {
    client: u16,
    peer: u16,
    metrics: u16,
}

impl Ports {
    /// Ports for `n` members, all distinct (all bound at once, then released).
    fn pick_many(n: usize) -> Vec<Ports> {
        let ls: Vec<TcpListener> = (0..3 * n)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
            .collect();
        let port = |i: usize| ls[i].local_addr().expect("local_addr").port();
        (0..n)
            .map(|m| Ports {
                client: port(3 * m),
                peer: port(3 * m + 1),
                metrics: port(3 * m + 2),
            })
            .collect()
    }

    /// Three distinct free loopback ports (all bound at once, then released).
    fn pick() -> Ports {
        let ls: Vec<TcpListener> = (0..3)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
            .collect();
        let port = |i: usize| ls[i].local_addr().expect("local_addr").port();
        Ports {
            client: port(0),
            peer: port(1),
            metrics: port(2),
        }
    }
}

#[derive(Debug)]
struct Proc {
    child: Child,
    /// `sh` blocked reading a pipe from this test process; when the test
    /// process dies without running destructors (SIGKILL, abort, exit) the
    /// pipe closes and the watchdog SIGKILLs etcd (so etcd is never orphaned)
    /// and removes the temp dir. Disarmed (SIGKILLed) before every normal
    /// stop/kill.
    watchdog: Option<Child>,
}

impl Proc {
    fn disarm_watchdog(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// A single-member etcd on 127.0.0.1 with its own temp dir (data + log).
/// Dropping it SIGKILLs and reaps the process and removes the temp dir.
#[derive(Debug)]
pub struct Etcd {
    bin: PathBuf,
    name: String,
    ports: Ports,
    tls: Option<TlsFiles>,
    extra_args: Vec<String>,
    data_dir: PathBuf,
    log_path: PathBuf,
    proc: Option<Proc>,
    last_pid: u32,
    /// Set for a member of a [`Cluster`]: its bootstrap membership.
    cluster: Option<ClusterArgs>,
    /// The peer URL it advertises when not its own listener's (a member
    /// whose peer traffic goes through a proxy, see
    /// [`Cluster::start_advertising`]).
    advertise_peer: Option<String>,
    // Last field: removed after the process has been killed in Drop.
    dir: tempfile::TempDir,
}

/// The bootstrap flags every member of one cluster shares.
#[derive(Clone, Debug)]
struct ClusterArgs {
    /// `name=http://127.0.0.1:peer,...` for every member.
    initial: String,
    token: String,
    /// `--initial-cluster-state existing`: a member added to a running
    /// cluster ([`Etcd::join`]).
    existing: bool,
}

impl Etcd {
    /// Starts a plain-HTTP etcd with default options.
    pub fn start() -> Etcd {
        Etcd::builder().start()
    }

    /// Options for an etcd to start: TLS, flags, data dir, name.
    pub fn builder() -> EtcdBuilder {
        EtcdBuilder::default()
    }

    // ---- accessors -------------------------------------------------------

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// `http://127.0.0.1:<port>` or `https://127.0.0.1:<port>` with TLS.
    pub fn endpoint(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.ports.client)
    }

    /// [`Etcd::endpoint`] alone, as a client configuration takes it.
    pub fn endpoints(&self) -> Vec<String> {
        vec![self.endpoint()]
    }

    /// The port clients connect to.
    pub fn client_port(&self) -> u16 {
        self.ports.client
    }

    /// `127.0.0.1:<client port>`, e.g. as a [`crate::FaultProxy`] upstream.
    pub fn client_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.ports.client))
    }

    /// The port it listens on for its peers (plain HTTP).
    pub fn peer_port(&self) -> u16 {
        self.ports.peer
    }

    /// Plain-HTTP port serving `/health` and `/metrics` (`--listen-metrics-urls`),
    /// even when the client port uses TLS.
    pub fn metrics_port(&self) -> u16 {
        self.ports.metrics
    }

    /// Pid of the running process, or of the last one if it is stopped.
    pub fn pid(&self) -> u32 {
        self.last_pid
    }

    /// Its data dir (`--data-dir`).
    pub fn data_dir(&self) -> PathBuf {
        self.data_dir.clone()
    }

    /// etcd's stdout+stderr (appended across restarts, with harness markers).
    pub fn log_path(&self) -> PathBuf {
        self.log_path.clone()
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Member name (`--name`), unique per `Etcd` instance.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The TLS material it serves clients with, if any.
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// Whether the process is alive (not exited, not stopped/killed).
    pub fn is_running(&mut self) -> bool {
        match self.proc.as_mut() {
            Some(p) => matches!(p.child.try_wait(), Ok(None)),
            None => false,
        }
    }

    // ---- lifecycle -------------------------------------------------------

    /// SIGTERM, wait up to 5s, then SIGKILL. No-op if not running.
    pub fn stop(&mut self) {
        let Some(mut p) = self.proc.take() else {
            return;
        };
        p.disarm_watchdog();
        if matches!(p.child.try_wait(), Ok(None)) {
            sigterm(p.child.id());
            if !wait_exit(&mut p.child, STOP_TIMEOUT) {
                let _ = p.child.kill();
            }
        }
        let _ = p.child.wait();
    }

    /// SIGKILL and reap. No-op if not running.
    pub fn kill(&mut self) {
        let Some(mut p) = self.proc.take() else {
            return;
        };
        p.disarm_watchdog();
        let _ = p.child.kill();
        let _ = p.child.wait();
    }

    /// Replaces the extra command-line flags for the next (re)start, e.g.
    /// a peer restarted with other limits.
    pub fn set_extra_args(&mut self, args: &[&str]) {
        self.extra_args = args.iter().map(|s| s.to_string()).collect();
    }

    /// (Gracefully stops etcd if it is running, then) starts it again on the
    /// same ports with the same data dir, retrying while a port is briefly busy.
    pub fn restart(&mut self) {
        self.stop();
        self.relaunch("restart");
    }

    /// Kills etcd if running, wipes the data dir and starts a brand-new
    /// member (new cluster id, revision 1) on the same ports.
    pub fn restart_empty(&mut self) {
        self.kill();
        match fs::remove_dir_all(&self.data_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("wipe etcd data dir {}: {e}", self.data_dir.display()),
        }
        self.relaunch("restart_empty");
    }

    /// Saves a snapshot of the store to `path` (`etcdctl snapshot save`).
    pub fn snapshot_save(&self, path: &Path) {
        self.etcdctl_ok(&["snapshot", "save", &path.display().to_string()]);
    }

    /// The peer URL it advertises (`--initial-advertise-peer-urls`).
    pub fn peer_url(&self) -> String {
        self.advertise_peer
            .clone()
            .unwrap_or_else(|| format!("http://127.0.0.1:{}", self.ports.peer))
    }

    /// Starts an [`EtcdBuilder::unstarted`] member that `member add` has
    /// added, with `--initial-cluster-state existing` and `initial` as
    /// `--initial-cluster` (`name=peer-url,...` for every member, this one
    /// included, as `etcdctl member add` prints it), on the ports picked
    /// when it was built (its peer URL is in the membership already), and
    /// waits until it is ready.
    pub fn join(&mut self, initial: &str) {
        self.cluster = Some(ClusterArgs {
            initial: initial.to_string(),
            token: self.name.clone(),
            existing: true,
        });
        self.relaunch("join");
    }

    /// Its `/metrics` text, if the metrics port answers.
    pub fn metrics(&self) -> Option<String> {
        http_get(self.ports.metrics, "/metrics").map(|(_, body)| body)
    }

    /// The value of a series on its `/metrics` page, if the page answers
    /// and has it: `selector` is a metric name
    /// (`etcd_debugging_mvcc_watcher_total`), or a name with some of the
    /// series' labels (`grpc_server_started_total{grpc_method="Range"}`),
    /// which picks the first series that has them all.
    pub fn metric(&self, selector: &str) -> Option<f64> {
        let (name, want) = match selector.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (selector, ""),
        };
        let want: Vec<&str> = want.split(',').filter(|l| !l.is_empty()).collect();
        self.metrics()?.lines().find_map(|l| {
            if l.starts_with('#') {
                return None;
            }
            let (series, value) = l.rsplit_once(' ')?;
            let (n, labels) = match series.split_once('{') {
                Some((n, labels)) => (n, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let has = |w: &&str| labels.split(',').any(|l| l == *w);
            (n == name && want.iter().all(has))
                .then(|| value.parse().ok())
                .flatten()
        })
    }

    /// Kills etcd, replaces its data dir with the snapshot at `path` and
    /// starts it again: what an operator's restore from a backup does. With
    /// the same name, peer URL and cluster token, the store keeps its
    /// cluster id and member id; its revision, keys and leases go back.
    pub fn restore_snapshot(&mut self, path: &Path) {
        self.kill();
        match fs::remove_dir_all(&self.data_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("wipe etcd data dir {}: {e}", self.data_dir.display()),
        }
        let peer_url = format!("http://127.0.0.1:{}", self.ports.peer);
        let out = etcdctl_command()
            .args([
                "snapshot".to_string(),
                "restore".into(),
                path.display().to_string(),
                format!("--data-dir={}", self.data_dir.display()),
                format!("--name={}", self.name),
                format!("--initial-cluster={}={peer_url}", self.name),
                format!("--initial-cluster-token={}", self.name),
                format!("--initial-advertise-peer-urls={peer_url}"),
            ])
            .output()
            .expect("run etcdctl snapshot restore");
        assert!(
            out.status.success(),
            "etcdctl snapshot restore failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.relaunch("restore_snapshot");
    }

    fn relaunch(&mut self, what: &str) {
        let mut failures = Vec::new();
        for attempt in 1..=ATTEMPTS {
            match self.launch(attempt) {
                Ok(()) => return,
                Err(e) => failures.push(format!("attempt {attempt}: {e}")),
            }
            std::thread::sleep(Duration::from_millis(200 * attempt as u64));
        }
        self.fail(what, &failures)
    }

    fn fail(&self, what: &str, failures: &[String]) -> ! {
        panic!(
            "etcd {what} failed ({} {:?}):\n  {}\n{}",
            self.name,
            self.ports,
            failures.join("\n  "),
            self.log_diagnostics(),
        )
    }

    /// The last 30 log lines, preceded by the first lines of the last launch
    /// attempt when it was longer than that (etcd prints a flag-parse error
    /// at the top of a long usage text).
    fn log_diagnostics(&self) -> String {
        let text = fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let attempt_start = lines
            .iter()
            .rposition(|l| l.starts_with("=== harness:"))
            .unwrap_or(0);
        let tail_start = lines.len().saturating_sub(LOG_TAIL_LINES);
        let mut out = String::new();
        if attempt_start + 1 < tail_start {
            let head_end = (attempt_start + 6).min(tail_start);
            out.push_str(&format!(
                "--- first lines of the last attempt in {} ---\n",
                self.log_path.display()
            ));
            out.push_str(&lines[attempt_start..head_end].join("\n"));
            out.push('\n');
        }
        out.push_str(&format!(
            "--- last {LOG_TAIL_LINES} lines of {} ---\n",
            self.log_path.display()
        ));
        out.push_str(&lines[tail_start..].join("\n"));
        out
    }

    fn args(&self) -> Vec<String> {
        let p = self.ports;
        let client_url = format!("{}://127.0.0.1:{}", self.scheme(), p.client);
        let peer_url = format!("http://127.0.0.1:{}", p.peer);
        let log_level = std::env::var("ETCD_HARNESS_LOG_LEVEL").unwrap_or_else(|_| "error".into());
        let mut a: Vec<String> = vec![
            format!("--name={}", self.name),
            format!("--data-dir={}", self.data_dir.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!(
                "--initial-advertise-peer-urls={}",
                self.advertise_peer.as_deref().unwrap_or(&peer_url)
            ),
            match &self.cluster {
                Some(c) => format!("--initial-cluster={}", c.initial),
                None => format!("--initial-cluster={}={peer_url}", self.name),
            },
            format!(
                "--initial-cluster-token={}",
                self.cluster.as_ref().map_or(&self.name, |c| &c.token)
            ),
            format!(
                "--initial-cluster-state={}",
                match &self.cluster {
                    Some(c) if c.existing => "existing",
                    _ => "new",
                }
            ),
            format!("--listen-metrics-urls=http://127.0.0.1:{}", p.metrics),
            "--logger=zap".into(),
            "--log-outputs=stderr".into(),
            format!("--log-level={log_level}"),
        ];
        if let Some(tls) = &self.tls {
            a.push(format!("--cert-file={}", tls.server_cert.display()));
            a.push(format!("--key-file={}", tls.server_key.display()));
            if tls.client_cert_auth {
                a.push("--client-cert-auth".into());
                a.push(format!("--trusted-ca-file={}", tls.ca.display()));
            }
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }

    /// One launch attempt on the current ports: spawn, then wait for
    /// readiness. On failure the process is killed and reaped.
    fn launch(&mut self, attempt: u32) -> Result<(), String> {
        self.spawn(attempt);
        match self.wait_ready() {
            Ok(()) => Ok(()),
            Err(e) => {
                self.kill();
                Err(e)
            }
        }
    }

    /// Starts the process on the current ports without waiting for it.
    fn spawn(&mut self, attempt: u32) {
        assert!(self.proc.is_none(), "etcd is already running");
        let args = self.args();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("open etcd log");
        let _ = writeln!(
            log,
            "=== harness: launch attempt {attempt}: {} {}",
            self.bin.display(),
            args.join(" ")
        );
        let mut cmd = Command::new(&self.bin);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log fd"))
            .stderr(log);
        // etcd 3.4 reads ETCD_* env vars as flags and refuses to start if one
        // shadows a command-line flag; don't leak the test environment's.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("ETCD_") {
                cmd.env_remove(&k);
            }
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.bin.display()));
        self.last_pid = child.id();
        let watchdog = spawn_watchdog(child.id(), self.dir.path());
        self.proc = Some(Proc { child, watchdog });
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut leader_since: Option<Instant> = None;
        let mut last = String::from("no probe yet");
        loop {
            let p = self.proc.as_mut().expect("process");
            match p.child.try_wait() {
                Ok(Some(status)) => {
                    return Err(format!("etcd exited early ({status}); last probe: {last}"));
                }
                Ok(None) => {}
                Err(e) => return Err(format!("try_wait: {e}")),
            }
            match self.probe() {
                Probe::Ready => return Ok(()),
                Probe::LeaderButUnhealthy(why) => {
                    let since = *leader_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= LEADER_GRACE {
                        return Ok(());
                    }
                    last = why;
                }
                Probe::NotYet(why) => {
                    leader_since = None;
                    last = why;
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "not ready after {READY_TIMEOUT:?}; last probe: {last}"
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Ready = client port accepts TCP, the peer port's `/members` lists our
    /// member name with the id that the metrics port reports (so every port
    /// belongs to *our* process, not to some other test's etcd that grabbed a
    /// released port), and `/health` is true.
    fn probe(&self) -> Probe {
        let p = self.ports;
        if TcpStream::connect_timeout(&self.client_addr(), Duration::from_millis(300)).is_err() {
            return Probe::NotYet("client port not accepting".into());
        }
        let Some((_, members)) = http_get(p.peer, "/members") else {
            return Probe::NotYet("peer /members unavailable".into());
        };
        let Some(member_id) = member_id_by_name(&members, &self.name) else {
            return Probe::NotYet(format!(
                "member {} not (yet) in peer /members: {members}",
                self.name
            ));
        };
        let Some((_, metrics)) = http_get(p.metrics, "/metrics") else {
            return Probe::NotYet("/metrics unavailable".into());
        };
        match metric_server_id(&metrics) {
            Some(id) if id == member_id => {}
            other => {
                return Probe::NotYet(format!(
                    "metrics port reports server id {other:x?}, member id is {member_id:x}"
                ));
            }
        }
        let has_leader = metrics
            .lines()
            .any(|l| l.trim() == "etcd_server_has_leader 1");
        match http_get(p.metrics, "/health") {
            Some((200, body)) if body.contains(r#""health":"true""#) => Probe::Ready,
            Some((status, body)) if has_leader => {
                Probe::LeaderButUnhealthy(format!("has leader, /health {status}: {}", body.trim()))
            }
            Some((status, body)) => {
                Probe::NotYet(format!("no leader, /health {status}: {}", body.trim()))
            }
            None => Probe::NotYet("/health unavailable".into()),
        }
    }

    // ---- etcdctl ---------------------------------------------------------

    /// Runs `etcdctl --endpoints=<endpoint> [TLS flags] <args>` (API v3) and
    /// returns its output. With TLS, `--cacert` is passed, and with client
    /// cert auth also `--cert/--key` of the `root` client certificate.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        self.etcdctl_at(&self.endpoint(), args)
    }

    /// Like [`Etcd::etcdctl`] but against other endpoints (e.g. a proxy's).
    pub fn etcdctl_at(&self, endpoints: &str, args: &[&str]) -> Output {
        let mut cmd = etcdctl_command();
        cmd.arg(format!("--endpoints={endpoints}"));
        if let Some(tls) = &self.tls {
            cmd.arg(format!("--cacert={}", tls.ca.display()));
            if tls.client_cert_auth {
                cmd.arg(format!("--cert={}", tls.client_cert.display()));
                cmd.arg(format!("--key={}", tls.client_key.display()));
            }
        }
        cmd.args(args);
        cmd.output().expect("run etcdctl")
    }

    /// [`Etcd::etcdctl`], asserting success; returns stdout.
    pub fn etcdctl_ok(&self, args: &[&str]) -> String {
        let out = self.etcdctl(args);
        assert!(
            out.status.success(),
            "etcdctl {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A client config for this etcd, authenticating as `user`.
    pub fn client_config_as(&self, user: &str, password: &str) -> ClientConfig {
        let mut cfg = ClientConfig::new(self.endpoints());
        cfg.credentials = Some(Credentials {
            user: user.into(),
            password: password.into(),
        });
        cfg
    }

    /// Adds user `root` (with `password` and the `root` role) and enables
    /// auth, the set-up every auth test starts from.
    pub fn enable_root_auth(&self, password: &str) {
        let root = format!("root:{password}");
        for args in [
            &["user", "add", root.as_str()][..],
            &["role", "add", "root"],
            &["user", "grant-role", "root", "root"],
            &["auth", "enable"],
        ] {
            self.etcdctl_ok(args);
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
        // `dir` (data dir unless user-provided, and the log) is removed next.
    }
}

enum Probe {
    Ready,
    LeaderButUnhealthy(String),
    NotYet(String),
}

/// A `Command` for etcdctl (env `ETCDCTL_BIN` or `etcdctl` on PATH) with
/// `ETCDCTL_API=3`, no other inherited `ETCDCTL_*` variables, stdin null.
pub fn etcdctl_command() -> Command {
    let bin = find_bin("ETCDCTL_BIN", "etcdctl").unwrap_or_else(|| panic!("{ETCDCTL_NOT_FOUND}"));
    let mut cmd = Command::new(bin);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("ETCDCTL_") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("ETCDCTL_API", "3").stdin(Stdio::null());
    cmd
}

fn etcd_bin() -> PathBuf {
    find_bin("ETCD_BIN", "etcd").unwrap_or_else(|| panic!("{NOT_FOUND}"))
}

/// `$env` (a path, or a name looked up on PATH) else `default` on PATH.
fn find_bin(env: &str, default: &str) -> Option<PathBuf> {
    let wanted = match std::env::var_os(env) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => PathBuf::from(default),
    };
    if wanted.components().count() > 1 {
        return is_executable(&wanted).then_some(wanted);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(&wanted))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// See [`Proc::watchdog`]. Also removes the harness temp dir `dir` then,
/// since `TempDir`'s destructor won't run either.
fn spawn_watchdog(pid: u32, dir: &Path) -> Option<Child> {
    Command::new("sh")
        .arg("-c")
        .arg(r#"read -r _ignored; kill -9 "$1" 2>/dev/null; sleep 0.2; rm -rf -- "$2""#)
        .arg("etcd-watchdog")
        .arg(pid.to_string())
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

fn sigterm(pid: u32) {
    let pid = pid.to_string();
    let ok = Command::new("kill")
        .args(["-TERM", &pid])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -TERM {pid}")])
            .status();
    }
}

/// Polls until the child exits (true) or `timeout` elapses (false).
fn wait_exit(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) => {}
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Minimal HTTP/1.0 GET against 127.0.0.1:`port`; returns (status, body).
/// Honours Content-Length: etcd's peer listener keeps the connection open
/// despite HTTP/1.0 + `Connection: close`.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    const MAX: usize = 16 << 20;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(1))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut expected_len: Option<usize> = None;
    loop {
        if let Some(want) = expected_len {
            if buf.len() >= want {
                break;
            }
        } else if let Some(head_end) = find(&buf, b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
            expected_len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .map(|n| head_end + 4 + n);
            if expected_len.is_some_and(|want| buf.len() >= want) {
                break;
            }
        }
        if buf.len() > MAX {
            return None;
        }
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Finds `"id":<decimal>` of the member named `name` in peer `/members` JSON:
/// `[{"id":123,"peerURLs":[..],"name":"x","clientURLs":[..]}, ...]`.
fn member_id_by_name(json: &str, name: &str) -> Option<u64> {
    let needle = format!(r#""name":"{name}""#);
    json.split('}')
        .find(|obj| obj.contains(&needle))
        .and_then(|obj| {
            let rest = &obj[obj.find(r#""id":"#)? + 5..];
            let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            digits.parse().ok()
        })
}

/// Parses `etcd_server_id{server_id="667880157b8812c8"} 1` from /metrics.
fn metric_server_id(metrics: &str) -> Option<u64> {
    let line = metrics.lines().find(|l| l.starts_with("etcd_server_id{"))?;
    let rest = &line[line.find("server_id=\"")? + 11..];
    u64::from_str_radix(&rest[..rest.find('"')?], 16).ok()
}

/// A cluster of real etcd members on 127.0.0.1, each an [`Etcd`] with its
/// own ports and temp dir (stop, kill and restart them one by one). The
/// members bootstrap together, so they are started together and then
/// waited for; a failed attempt kills every member and retries on fresh
/// ports. Dropping the cluster kills every member.
#[derive(Debug)]
pub struct Cluster {
    /// The members, in the order of their names (`<token>-m0`, `-m1`, ...).
    pub members: Vec<Etcd>,
}

impl Cluster {
    /// Starts `n` plain-HTTP members and waits until each has a leader.
    pub fn start(n: usize) -> Cluster {
        Cluster::start_advertising(n, |_, peer_port| format!("http://127.0.0.1:{peer_port}"))
    }

    /// Like [`Cluster::start`], but member `i`, listening for its peers on
    /// `peer_port`, advertises `advertise(i, peer_port)` as its peer URL,
    /// so the others reach it there: e.g. a proxy in front of its peer
    /// port that can cut it from its quorum. Called again with fresh ports
    /// when an attempt fails.
    pub fn start_advertising(n: usize, advertise: impl Fn(usize, u16) -> String) -> Cluster {
        crate::init_logging();
        let bin = etcd_bin();
        let token = format!(
            "cluster-{}-{}",
            std::process::id(),
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        );
        let mut members: Vec<Etcd> = (0..n)
            .map(|i| {
                let dir = tempfile::Builder::new()
                    .prefix("aether-etcd-")
                    .tempdir()
                    .expect("create etcd temp dir");
                Etcd {
                    bin: bin.clone(),
                    name: format!("{token}-m{i}"),
                    ports: Ports::pick(),
                    tls: None,
                    extra_args: Vec::new(),
                    data_dir: dir.path().join("data"),
                    log_path: dir.path().join("etcd.log"),
                    proc: None,
                    last_pid: 0,
                    cluster: None,
                    advertise_peer: None,
                    dir,
                }
            })
            .collect();
        let mut failures = Vec::new();
        for attempt in 1..=ATTEMPTS {
            if attempt > 1 {
                for m in &mut members {
                    m.kill();
                    let _ = fs::remove_dir_all(&m.data_dir);
                }
            }
            // Picked together, so no two members get the same port.
            let ports = Ports::pick_many(n);
            let urls: Vec<String> = ports
                .iter()
                .enumerate()
                .map(|(i, p)| advertise(i, p.peer))
                .collect();
            let initial = members
                .iter()
                .zip(&urls)
                .map(|(m, url)| format!("{}={url}", m.name))
                .collect::<Vec<_>>()
                .join(",");
            for ((m, p), url) in members.iter_mut().zip(ports).zip(urls) {
                m.ports = p;
                m.advertise_peer = Some(url);
                m.cluster = Some(ClusterArgs {
                    initial: initial.clone(),
                    token: token.clone(),
                    existing: false,
                });
                m.spawn(attempt);
            }
            let mut failed = None;
            for m in &mut members {
                if let Err(e) = m.wait_ready() {
                    failed = Some(format!("attempt {attempt}, {}: {e}", m.name));
                    break;
                }
            }
            match failed {
                None => return Cluster { members },
                Some(f) => failures.push(f),
            }
        }
        let logs: Vec<String> = members.iter().map(|m| m.log_diagnostics()).collect();
        panic!(
            "etcd cluster start failed:\n  {}\n{}",
            failures.join("\n  "),
            logs.join("\n")
        )
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.endpoint()).collect()
    }
}
