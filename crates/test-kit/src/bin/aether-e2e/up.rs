//! `up`: etcds, link proxies, an optional preload, replicas, an optional
//! Prometheus; returns once every region has one leader synced to every
//! peer, everything still running. Also the REPORT/STAT helpers `up
//! --preload` and `burst` share.

use std::path::PathBuf;
use std::process::Command;

use clap::Args;

use crate::procs::{cpu_ticks, hwm_kib, ours};
use crate::state::{ALL_REGIONS, MARKER, Mesh, State, fmt_ms, now_ms};

#[derive(Args)]
pub(crate) struct UpArgs {
    /// Regions a, b, ... (2 to 10); verify and alerts use a, b and c.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(2..=10))]
    regions: u32,
    /// Mirror lease TTL in seconds (a trailing `s` is allowed), at least
    /// twice the election TTL, which is a third of it and at least 2s.
    #[arg(long, default_value = "6", value_parser = parse_secs)]
    ttl: u64,
    /// The aether-replicator binary (default: the release build, brought up
    /// to date with `cargo build --release`); copied into the
    /// state dir so every replica runs the same build.
    #[arg(long, value_name = "PATH")]
    bin: Option<PathBuf>,
    /// Also run a Prometheus on loopback scraping every replica, the
    /// shipped rules loaded with `for:` shortened to 2s.
    #[arg(long)]
    prometheus: bool,
    /// Put every link R->P through its own delay proxy adding MS each way.
    #[arg(long, value_name = "MS")]
    link_delay: Option<u64>,
    /// Plus a uniform random 0..MS per chunk, order kept (implies the
    /// proxies).
    #[arg(long, value_name = "MS")]
    link_jitter: Option<u64>,
    /// Replicas per region (verify, alerts and record need 2).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=2))]
    replicas: u32,
    /// Endpoint keys written into every region before the replicators start.
    #[arg(long, default_value_t = 0)]
    preload: u64,
    /// How long to wait for every region to be ready.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    sync_timeout: u64,
    /// One more argument (no spaces) for every replicator. Repeatable.
    #[arg(
        long = "replicator-arg",
        value_name = "ARG",
        allow_hyphen_values = true
    )]
    replicator_args: Vec<String>,
    /// One more argument (no spaces) for every etcd. Repeatable.
    #[arg(long = "etcd-arg", value_name = "ARG", allow_hyphen_values = true)]
    etcd_args: Vec<String>,
}

fn parse_secs(s: &str) -> Result<u64, String> {
    s.strip_suffix('s')
        .unwrap_or(s)
        .parse()
        .map_err(|_| format!("{s}: not a whole number of seconds"))
}

/// `cargo build --release ARGS` in the repository (always: cargo returns
/// at once when it is up to date, and a stale binary would test old code);
/// the executable cargo names for the target `name`. Cargo says where it
/// put it (CARGO_TARGET_DIR, a target-dir in a .cargo/config): a path
/// assumed here broke the harness under another target dir once.
pub(crate) fn cargo_build(args: &[&str], name: &str) -> Result<PathBuf, String> {
    let out = Command::new("cargo")
        .args([
            "build",
            "--release",
            "--message-format=json-render-diagnostics",
        ])
        .args(args)
        .current_dir(crate::repo())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo build --release {} failed", args.join(" ")));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| {
            format!(
                "cargo build --release {} named no {name} executable",
                args.join(" ")
            )
        })
}

pub(crate) fn loadgen_bin() -> Result<PathBuf, String> {
    cargo_build(&["--quiet", "--example", "loadgen"], "loadgen")
}

pub(crate) fn cmd_up(dir: PathBuf, a: UpArgs) {
    let t0 = now_ms();
    for c in ["etcd", "etcdctl", "timeout"] {
        if !crate::procs::on_path(c) {
            crate::die(format!("{c} is not installed"));
        }
    }
    for x in a.replicator_args.iter().chain(&a.etcd_args) {
        if x.chars().any(char::is_whitespace) {
            crate::die(format!("--replicator-arg/--etcd-arg {x}: no spaces"));
        }
    }
    // A third of the lease TTL, as the replicator's own default suggests: a
    // longer lease TTL is asked for when the machine is loaded (scale
    // runs), and an election lease of 2s would lapse there first.
    let election_ttl = (a.ttl / 3).max(2);
    if a.ttl < 2 * election_ttl {
        crate::die(format!(
            "--ttl must be at least twice the election TTL ({election_ttl}s)"
        ));
    }
    let bin = match &a.bin {
        Some(b) => {
            let b = if b.is_absolute() {
                b.clone()
            } else {
                std::env::current_dir().unwrap_or_default().join(b)
            };
            if !b.is_file() {
                crate::die(format!("--bin {}: not an executable", b.display()));
            }
            b
        }
        None => {
            println!("== building aether-replicator (cargo build --release)");
            cargo_build(&["--bin", "aether-replicator"], "aether-replicator")
                .unwrap_or_else(|e| crate::die(e))
        }
    };
    let dirs = dir.display().to_string();
    if dir.is_dir() {
        if Mesh::is_marked(&dir) {
            if !crate::down::live_harness_pids(&dirs).is_empty() {
                crate::die(format!(
                    "{dirs} is already up: run 'aether-e2e down --state {dirs}' first"
                ));
            }
            let _ = std::fs::remove_dir_all(&dir);
        } else if std::fs::read_dir(&dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
        {
            crate::die(format!(
                "{dirs} exists and is not an e2e state dir; choose another --state"
            ));
        }
    }
    for sub in ["logs", "bin"] {
        if let Err(e) = std::fs::create_dir_all(dir.join(sub)) {
            crate::die(format!("cannot create {dirs}/{sub}: {e}"));
        }
    }
    let _ = std::fs::write(dir.join(MARKER), "");
    let copy = |from: &std::path::Path, to: &str| {
        if let Err(e) = std::fs::copy(from, dir.join("bin").join(to)) {
            crate::die(format!(
                "cannot copy {} into {dirs}/bin: {e}",
                from.display()
            ));
        }
    };
    copy(&bin, "aether-replicator");
    match std::env::current_exe() {
        Ok(me) => copy(&me, "aether-e2e"),
        Err(e) => crate::die(format!("cannot find this binary: {e}")),
    }
    let proxied = a.link_delay.is_some() || a.link_jitter.is_some();
    let mut m = Mesh {
        dir,
        st: State {
            regions: ALL_REGIONS[..a.regions as usize]
                .iter()
                .map(|r| r.to_string())
                .collect(),
            slots: (1..=a.replicas).collect(),
            ttl: a.ttl,
            election_ttl,
            replicator_args: a.replicator_args,
            etcd_args: a.etcd_args,
            links_proxied: proxied,
            link_delay_ms: a.link_delay.unwrap_or(0),
            link_jitter_ms: a.link_jitter.unwrap_or(0),
            ..State::default()
        },
        quiet: false,
    };
    m.save();
    let regions = m.st.regions.clone();
    println!(
        "== up: {} regions ({}), lease TTL {}s, state {dirs}",
        regions.len(),
        regions.join(" "),
        a.ttl
    );
    let r = m.wait_etcds(true, &regions);
    m.up_step(r);
    if proxied {
        let r = m.start_links();
        m.up_step(r);
    }
    if a.preload > 0 {
        let r = m.preload(a.preload);
        m.up_step(r);
    }
    let rs: Vec<String> = m
        .all_replicas()
        .iter()
        .map(|(r, s)| format!("{r}/{s}"))
        .collect();
    let t_sync = now_ms();
    let r = m.start_replicas(&rs);
    m.up_step(r);
    let r = m
        .wait_ready(a.sync_timeout, &regions)
        .map_err(|e| format!("not ready after {}s: {e}", a.sync_timeout));
    m.up_step(r);
    let t_sync = now_ms() - t_sync;
    for r in &regions {
        let leader = m.region_ready(r).map_or("?".into(), |s| s.to_string());
        println!(
            "  region {r}: leader {r}/{leader}, peers synced: {}",
            m.peer_list(r)
        );
    }
    if a.preload > 0 {
        let r = m.check_preload(a.preload, t_sync);
        m.up_step(r);
    }
    if a.prometheus {
        let r = m.prom_start();
        m.up_step(r);
    }
    println!("== up in {}; env: {dirs}/env", fmt_ms(now_ms() - t0));
}

impl Mesh {
    /// On an error: the logs' tails, everything started stopped (logs
    /// kept), exit 1.
    fn up_step(&self, r: Result<(), String>) {
        let Err(e) = r else { return };
        eprintln!("{e}");
        self.tail_logs(20);
        eprintln!(
            "aether-e2e: up failed; stopping what was started (logs kept in {0}/logs; 'aether-e2e down --state {0}' removes them)",
            self.dir.display()
        );
        crate::down::stop_all(&self.dir_str());
        std::process::exit(1)
    }

    /// PRELOAD endpoint keys into every region's own subtree, all regions
    /// at once, before any replicator runs.
    fn preload(&self, n: u64) -> Result<(), String> {
        let load = loadgen_bin()?;
        let t0 = now_ms();
        let kids: Vec<_> = self
            .st
            .regions
            .iter()
            .map(|r| {
                Command::new(&load)
                    .args([
                        "fill-endpoints",
                        &self.etcd_url(r),
                        &crate::kv::prefix_of(r),
                        &n.to_string(),
                    ])
                    .spawn()
            })
            .collect();
        for k in kids {
            let ok = k.and_then(|mut c| c.wait()).is_ok_and(|s| s.success());
            if !ok {
                return Err("preload failed".into());
            }
        }
        println!(
            "  preloaded {n} keys into each of {} regions in {}",
            self.st.regions.len(),
            fmt_ms(now_ms() - t0)
        );
        Ok(())
    }

    /// Every peer holds all N keys of every other region (counted by
    /// etcd), 20 per region hold the source's value on a live lease in
    /// every peer; then REPORT sync and the STAT lines.
    fn check_preload(&self, n: u64, sync_ms: u64) -> Result<(), String> {
        let load = loadgen_bin()?;
        let t0 = now_ms();
        let quiet = |c: &mut Command| {
            c.stdout(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        for r in &self.st.regions {
            let prefix = crate::kv::prefix_of(r);
            let mut urls = Vec::new();
            for p in self.peers_of(r) {
                let url = self.etcd_url(&p);
                if !quiet(Command::new(&load).args(["wait", &url, &prefix, &n.to_string(), "0"])) {
                    return Err(format!("check: {p} does not hold all {n} keys of {r}"));
                }
                urls.push(url);
            }
            let mut spot = Command::new(&load);
            spot.args(["spot", &self.etcd_url(r), &prefix, &n.to_string(), "20"])
                .args(&urls);
            if !quiet(&mut spot) {
                return Err(format!("check: {r}'s copies fail the spot check"));
            }
        }
        let (regions, peers) = (
            self.st.regions.len() as u64,
            self.st.regions.len() as u64 - 1,
        );
        println!(
            "  checked: every peer holds all {n} keys of every region; 20 keys per region spot-checked in all {peers} peers (value, live lease) in {}",
            fmt_ms(now_ms() - t0)
        );
        println!(
            "REPORT sync regions={regions} streams={} keys_per_region={n} mirrored_writes={} synced_ms={sync_ms} {}",
            regions * peers,
            n * regions * peers,
            self.stat_totals()
        );
        self.print_stats();
        Ok(())
    }

    /// Replica and etcd CPU-seconds and peak RSS, summed and maxed.
    pub(crate) fn stat_totals(&self) -> String {
        let hz = crate::procs::clk_tck();
        let (mut rc, mut rcm, mut rh, mut ec, mut eh) = (0u64, 0u64, 0u64, 0u64, 0u64);
        for (r, s) in self.all_replicas() {
            let pid = self.replica(&r, s).pid;
            let c = cpu_ticks(pid);
            rc += c;
            rcm = rcm.max(c);
            rh = rh.max(hwm_kib(pid));
        }
        for r in &self.st.regions {
            let pid = self.etcd_pid(r);
            ec += cpu_ticks(pid);
            eh = eh.max(hwm_kib(pid));
        }
        format!(
            "replica_cpu_s_sum={:.1} replica_cpu_s_max={:.1} replica_peak_rss_mib_max={:.1} etcd_cpu_s_sum={:.1} etcd_peak_rss_mib_max={:.0}",
            rc as f64 / hz,
            rcm as f64 / hz,
            rh as f64 / 1024.0,
            ec as f64 / hz,
            eh as f64 / 1024.0
        )
    }

    /// One STAT line per replica and per etcd (CPU-seconds since it
    /// started, peak RSS).
    pub(crate) fn print_stats(&self) {
        let hz = crate::procs::clk_tck();
        let line = |name: String, pid: i32| {
            println!(
                "STAT {name} cpu_s={:.1} peak_rss_mib={:.1}",
                cpu_ticks(pid) as f64 / hz,
                hwm_kib(pid) as f64 / 1024.0
            );
        };
        for r in &self.st.regions {
            for &s in &self.st.slots {
                line(format!("replica-{r}-{s}"), self.replica(r, s).pid);
            }
            line(format!("etcd-{r}"), self.etcd_pid(r));
        }
    }

    /// Every replica still runs (and is ours).
    pub(crate) fn replica_running(&self, r: &str, s: u32) -> bool {
        ours(&self.dir_str(), self.replica(r, s).pid)
    }
}
