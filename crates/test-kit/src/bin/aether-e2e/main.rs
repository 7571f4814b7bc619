//! `aether-e2e`: a multi-region aether-replicator deployment of real
//! processes on loopback (per region one etcd and one or two replicator
//! replicas), and the end-to-end checks run against it.
//!
//! ```text
//! aether-e2e up      [--state DIR] [--regions 2..10] [--ttl SECONDS] [--bin PATH] [--prometheus]
//!                    [--link-delay MS] [--link-jitter MS] [--replicas 1|2]
//!                    [--preload N] [--sync-timeout SECONDS]
//!                    [--replicator-arg ARG]... [--etcd-arg ARG]...
//! aether-e2e verify  [--state DIR]
//! aether-e2e alerts  [--state DIR]
//! aether-e2e quiet   [--state DIR] [--seconds N]
//! aether-e2e record  [--state DIR] --scenario healthy|link-cut|region-down --out FILE
//! aether-e2e down    [--state DIR]
//! aether-e2e restart REGION [--state DIR]
//! aether-e2e cut     REGION PEER [--state DIR]
//! aether-e2e heal    REGION PEER [--state DIR]
//! aether-e2e burst   [--state DIR] [--revisions N] [--writers W] [--rounds K] [--loadgen PATH]
//! aether-e2e demo-test [--runs N] [--bin PATH] [--view-timeout SECONDS]
//! aether-e2e bench-make-mirror [--keys N] [--burst N] [--writers N] [--rss-keys N] [--rss-only]
//!                    [--rss-rtt MS] [--wan RTTS] [--wan-window S] [--wan-only]
//! ```
//!
//! `aether-e2e help SUBCOMMAND` says what each does; every line it prints
//! (the `ok`/`FAIL` line per step, `REPORT` and `STAT` lines) is the one
//! the shell harness it replaces printed, so logs and the benchmark notes
//! stay comparable. Build it with
//! `cargo build --release -p aether-test-kit --bin aether-e2e`; the e2e
//! scripts do that themselves.
//!
//! # Design
//!
//! * Its modules sit beside this file, not in the kit's library: the suites
//!   that link the library need none of this, and nothing here is API.
//!   One file per concern: [`state`] (the state dir), [`procs`] (spawning,
//!   recognising and stopping processes), [`http`] (a minimal HTTP/1.0
//!   client for metrics pages, Prometheus and etcd's JSON gateway),
//!   [`kv`] (etcd reads and writes), [`etcd`], [`links`], [`replicas`],
//!   [`prom`] (the processes), and one per subcommand.
//! * `up` returns while everything keeps running: every process is spawned
//!   in its own session (`setsid`), its pid written to `DIR/state.json`
//!   (JSON, serde) at once. A sourceable `DIR/env` with the shell
//!   harness's variable names (`ETCD_URL_a`, `REPLICA_PID_a_1`, ...) is
//!   written beside it for shell callers (e2e/demo.sh).
//! * Every spawned process's command line names the state dir (replicas
//!   run a copy of the binary in `DIR/bin`, etcd's data dir and
//!   Prometheus's storage are in it, the helper processes get
//!   `--state DIR`), so `pgrep -f DIR` finds them all, and a pid is only
//!   signalled while its command line still names the dir (no recycled
//!   pid is ever killed). `down` stops recorded pids and, in case one was
//!   started but not recorded, any process of ours naming the dir.
//! * The Python helpers are hidden subcommands of this binary: `link-proxy`
//!   (the delay/jitter proxy of a link, which must outlive `up`) and
//!   `churn` (the quiet and record phases' load through etcd's JSON
//!   gateway). Plain threads, no async runtime: a few dozen sockets.
//! * etcd is read and written with `etcdctl` (`ETCDCTL_API=3`, bounded by
//!   `timeout`), as the shell harness did: the checks compare what an
//!   operator's tool sees, and a hung call cannot hang a step.
//! * Every wait is bounded and, when it gives up, says what it last saw.
//! * Network traffic goes to 127.0.0.1 only.

mod alerts;
mod bench;
mod burst;
mod churn;
mod demo_test;
mod demo_view;
mod down;
mod etcd;
mod http;
mod kv;
mod links;
mod procs;
mod prom;
mod quiet;
mod record;
mod replicas;
mod state;
mod up;
mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// Where the repository is: the harness builds and copies its binaries and
/// reads the shipped Prometheus rules from it.
pub(crate) fn repo() -> PathBuf {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    dir.canonicalize().unwrap_or(dir)
}

/// Prints `aether-e2e: MSG` and exits 1: bad input or a missing tool.
pub(crate) fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("aether-e2e: {msg}");
    std::process::exit(1)
}

#[derive(Parser)]
#[command(
    name = "aether-e2e",
    about = "A multi-region aether-replicator deployment on loopback, and its end-to-end checks",
    after_help = "Everything listens on 127.0.0.1 only. DIR/env is a sourceable file with every port, \
                  pid and URL (ETCD_URL_a, REPLICA_PID_a_1, REPLICA_PORT_a_1, LINK_PORT_a_b, E2E_BIN, \
                  PROM_URL); DIR/instances maps every replica's metrics port to its region and slot."
)]
struct Cli {
    /// Where pids, ports, data dirs and logs live (default
    /// ${TMPDIR:-/tmp}/aether-e2e); `down` removes it.
    #[arg(long, global = true, value_name = "DIR")]
    state: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Starts everything and returns once every region has exactly one
    /// leader whose peers are all synced.
    Up(up::UpArgs),
    /// The end-to-end checks (visibility, data path, leader handoff,
    /// lease-lapse failover, recovery, peer etcd restart), one line per
    /// step; exits non-zero at the first failure.
    Verify,
    /// (needs `up --prometheus`) Stops both replicas of region a and
    /// asserts through Prometheus that AetherReplicatorNoLeader fires for a
    /// and AetherReplicatorOriginCopyLapsed for origin a in every other
    /// region, then restarts them and asserts both resolve.
    Alerts,
    /// (needs `up --prometheus`) N seconds of moderate churn in every
    /// region (3 puts or deletes of endpoint keys per second per region),
    /// then asserts that no alert fired at any evaluation of the window
    /// nor is firing now, and that every target was up throughout.
    Quiet {
        /// The window in seconds, at least 10; 180 by default, the length
        /// of the recorded healthy scenario it is the live counterpart of.
        #[arg(long, default_value_t = 180)]
        seconds: u64,
    },
    /// (needs `up --prometheus --link-delay MS`, 3 regions) Runs a scenario
    /// under churn and writes FILE, a promtool test of the recorded series
    /// with the expectations of deploy/prometheus/recorded/expect/SCENARIO.yml.
    Record {
        #[arg(long, value_enum)]
        scenario: Scenario,
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Stops every process the harness started (by pid) and removes the
    /// state dir. Idempotent.
    Down,
    /// Starts again whichever replicas of REGION are not running.
    Restart { region: String },
    /// Stops the delay proxy of the link REGION->PEER (REGION's replicas to
    /// PEER's etcd): connections break and new ones are refused.
    Cut { region: String, peer: String },
    /// Starts the proxy of REGION->PEER again, on the same port.
    Heal { region: String, peer: String },
    /// K rounds: every region's etcd takes N single-put revisions from W
    /// writers at once, then every peer is waited for until it holds them
    /// all; one REPORT line per round, then REPORT totals and STAT lines.
    Burst {
        #[arg(long, default_value_t = 5000)]
        revisions: u64,
        #[arg(long, default_value_t = 16)]
        writers: u64,
        #[arg(long, default_value_t = 3)]
        rounds: u64,
        /// The loadgen example to write with (default: the release build,
        /// brought up to date with `cargo build --release`).
        #[arg(long, value_name = "PATH")]
        loadgen: Option<PathBuf>,
    },
    /// The demo as a person runs it: one `DEMO_ONESHOT=1` run (3 frames,
    /// exit 0), then RUNS runs of `e2e/demo.sh | tee FILE` in a process
    /// group of their own, each pasting the `etcdctl put` the demo prints,
    /// waiting for that key in region b, then Ctrl-C (SIGINT to the
    /// group). Fails if any run leaves a process or a state dir behind.
    /// Ignores --state: the demos run under a temp dir of their own.
    DemoTest {
        #[arg(long, default_value_t = 1, value_name = "N")]
        runs: u32,
        /// An aether-replicator binary for the demo to run (DEMO_BIN), and
        /// this aether-e2e for its harness, instead of the release builds
        /// the demo makes: CI passes the debug build its suites made.
        #[arg(long, value_name = "PATH")]
        bin: Option<PathBuf>,
        /// How long to wait for the demo's view (the release build is made
        /// before the clock starts).
        #[arg(long, default_value_t = 120, value_name = "SECONDS")]
        view_timeout: u64,
    },
    /// `etcdctl make-mirror` and aether-replicator (release build) side by
    /// side on fresh etcd pairs: base sync rate, time to complete after a
    /// live burst, CPU-seconds per 100k keys and events (the mirror's and
    /// both etcds'), and with --rss-keys and --wan, peak RSS and keys per
    /// second through delayed links. Ignores --state.
    BenchMakeMirror(bench::BenchArgs),
    /// The demo's live view of a mesh that is up (e2e/demo.sh runs it): per
    /// region the leader, its replication, each origin's copy as consumers
    /// see it and the newest keys, one frame a second.
    #[command(hide = true)]
    DemoView {
        /// Render this many frames, then exit (DEMO_ONESHOT); default: until
        /// Ctrl-C, or until the reader of its output goes away.
        #[arg(long, value_name = "N")]
        frames: Option<u32>,
        /// How the view names the harness in the commands it prints.
        #[arg(long, default_value = "e2e/mesh.sh", value_name = "CMD")]
        mesh_cmd: String,
    },
    /// A loopback TCP proxy delaying every chunk by ONE_WAY_MS (plus
    /// 0..JITTER_MS, order kept) each way; prints "ready" once listening.
    #[command(hide = true)]
    LinkProxy {
        listen: u16,
        upstream: u16,
        one_way_ms: u64,
        #[arg(default_value_t = 0)]
        jitter_ms: u64,
    },
    /// RATE puts/deletes of endpoint keys per second per region, through
    /// etcd's JSON gateway, until SIGTERM; then "puts=N deletes=N errors=N".
    #[command(hide = true)]
    Churn {
        rate: f64,
        #[arg(required = true, value_name = "REGION=URL")]
        targets: Vec<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Scenario {
    Healthy,
    LinkCut,
    RegionDown,
}

impl Scenario {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::Healthy => "healthy",
            Scenario::LinkCut => "link-cut",
            Scenario::RegionDown => "region-down",
        }
    }
}

/// The state dir, absolute and without a trailing slash (it is matched
/// against command lines), never `/`.
fn resolve_state(arg: Option<PathBuf>) -> PathBuf {
    let dir = arg.unwrap_or_else(|| {
        let tmp = std::env::var_os("TMPDIR")
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| "/tmp".into());
        PathBuf::from(tmp).join("aether-e2e")
    });
    if dir.as_os_str().is_empty() {
        die("--state must not be empty");
    }
    let dir = if dir.is_absolute() {
        dir
    } else {
        match std::env::current_dir() {
            Ok(cwd) => cwd.join(dir),
            Err(e) => die(format!("cannot read the current directory: {e}")),
        }
    };
    let mut s = dir.to_string_lossy().into_owned();
    while s.len() > 1 && s.ends_with('/') {
        s.pop();
    }
    if s == "/" {
        die("--state / is not allowed");
    }
    PathBuf::from(s)
}

fn main() {
    let cli = Cli::parse();
    let dir = resolve_state(cli.state);
    match cli.cmd {
        Cmd::Up(args) => up::cmd_up(dir, args),
        Cmd::Verify => verify::cmd_verify(dir),
        Cmd::BenchMakeMirror(args) => bench::cmd_bench(args),
        Cmd::DemoView { frames, mesh_cmd } => demo_view::cmd_demo_view(dir, frames, mesh_cmd),
        Cmd::Alerts => alerts::cmd_alerts(dir),
        Cmd::Quiet { seconds } => quiet::cmd_quiet(dir, seconds),
        Cmd::Record { scenario, out } => record::cmd_record(dir, scenario, out),
        Cmd::Down => down::cmd_down(dir),
        Cmd::Restart { region } => down::cmd_restart(dir, &region),
        Cmd::Cut { region, peer } => links::cmd_cut(dir, &region, &peer),
        Cmd::Heal { region, peer } => links::cmd_heal(dir, &region, &peer),
        Cmd::Burst {
            revisions,
            writers,
            rounds,
            loadgen,
        } => burst::cmd_burst(dir, revisions, writers, rounds, loadgen),
        Cmd::LinkProxy {
            listen,
            upstream,
            one_way_ms,
            jitter_ms,
        } => links::run_proxy(listen, upstream, one_way_ms, jitter_ms),
        Cmd::Churn { rate, targets } => churn::run_churn(rate, &targets),
        Cmd::DemoTest {
            runs,
            bin,
            view_timeout,
        } => demo_test::cmd_demo_test(runs, bin, view_timeout),
    }
}
