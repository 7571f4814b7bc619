//! `bench-make-mirror`: `etcdctl make-mirror` and aether-replicator doing
//! the same work on fresh etcd pairs, side by side in one run, on one host.
//!
//! 1. Base sync: N keys (100-byte values) at the source, an empty peer;
//!    time from starting the mirror to the peer holding all N.
//! 2. Live burst: a synced, idle mirror; BURST single-put revisions from
//!    WRITERS concurrent writers at the source; time from the last write
//!    returning to the peer holding everything.
//!
//!    For both, the CPU-seconds (utime + stime from /proc) the mirror
//!    process spent, and the two etcds', per 100k keys synced and per 100k
//!    live events: what a pod is sized by.
//! 3. `--rss-keys N`: the replicator's peak RSS (VmHWM) during a base sync
//!    of N keys (`--rss-rtt MS`: through a delay proxy of that round trip).
//! 4. `--wan 0,20,100,250`: for each round trip, a delay proxy (the e2e
//!    harness's `link-proxy`) between the mirror and the peer, and the base
//!    sync of N keys through it by both tools over a window of
//!    `--wan-window` seconds (make-mirror cannot finish at 100 ms): keys on
//!    the peer at the end of the window, or at completion, per second.
//!
//! Loopback only. The etcds are the test kit's ([`aether_test_kit::Etcd`],
//! stopped when dropped); the mirrors and proxies are children stopped by
//! pid when their step ends, or when this process unwinds.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aether_test_kit::{Etcd, etcdctl_command};

use crate::procs;
use crate::state::now_ms;

/// The source region's subtree, which both tools mirror.
const PREFIX: &str = "/aether/v1/regions/a/";

#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Keys for the base sync (100-byte values), and for each WAN sync.
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    pub(crate) keys: u64,
    /// Single-put revisions of the live burst.
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    pub(crate) burst: u64,
    /// Concurrent writers of the live burst.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub(crate) writers: u64,
    /// Also the replicator's peak RSS during a base sync of N keys (e.g.
    /// 1000000); 0 skips it.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub(crate) rss_keys: u64,
    /// Only the RSS sync (with --rss-keys).
    #[arg(long)]
    pub(crate) rss_only: bool,
    /// The RSS sync through a delay proxy of this round trip.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub(crate) rss_rtt: u64,
    /// Round trips to sync through, e.g. 0,20,100,250.
    #[arg(long, value_delimiter = ',', value_name = "RTTS")]
    pub(crate) wan: Vec<u64>,
    /// How long each WAN sync may take.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    pub(crate) wan_window: u64,
    /// Only the WAN syncs (with --wan).
    #[arg(long)]
    pub(crate) wan_only: bool,
}

/// The two tools compared.
#[derive(Clone, Copy, PartialEq)]
enum Tool {
    MakeMirror,
    Aether,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Tool::MakeMirror => "make-mirror",
            Tool::Aether => "aether-replicator",
        }
    }
}

/// A child process stopped (SIGKILL, then reaped) when dropped.
struct Proc(Child);

impl Proc {
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Bench {
    replicator: PathBuf,
    loadgen: PathBuf,
    dir: tempfile::TempDir,
}

/// One tool's base sync and live burst figures.
#[derive(Default)]
struct Figures {
    sync_keys_per_s: u64,
    sync_cpu: f64,
    sync_etcd_cpu: f64,
    live_ms: u64,
    live_cpu: f64,
    live_etcd_cpu: f64,
}

/// CPU ticks as CPU-seconds per 100k of `n`.
fn per_100k(ticks: u64, n: u64) -> f64 {
    let v = ticks as f64 / procs::clk_tck() * 100_000.0 / n.max(1) as f64;
    (v * 100.0).round() / 100.0
}

fn ratio(a: f64, b: f64) -> f64 {
    (a / b * 10.0).round() / 10.0
}

pub(crate) fn cmd_bench(a: BenchArgs) {
    if let Err(e) = run(a) {
        eprintln!("bench-make-mirror: {e}");
        std::process::exit(1);
    }
}

fn run(a: BenchArgs) -> Result<(), String> {
    for (tool, var) in [("etcd", "ETCD_BIN"), ("etcdctl", "ETCDCTL_BIN")] {
        if std::env::var_os(var).is_none() && !procs::on_path(tool) {
            return Err(format!(
                "{tool} not found (nor {var}): apt-get update && apt-get install -y etcd-server etcd-client"
            ));
        }
    }
    let b = Bench {
        replicator: crate::up::cargo_build(
            &["--quiet", "--bin", "aether-replicator"],
            "aether-replicator",
        )?,
        loadgen: crate::up::loadgen_bin()?,
        dir: tempfile::Builder::new()
            .prefix("aether-bench.")
            .tempdir()
            .map_err(|e| format!("cannot make a temp dir: {e}"))?,
    };
    if !a.rss_only && !a.wan_only {
        let mm = b.compare(Tool::MakeMirror, &a)?;
        let ar = b.compare(Tool::Aether, &a)?;
        print_table(&a, &mm, &ar);
    }
    if a.rss_keys > 0 {
        b.rss(a.rss_keys, a.rss_rtt)?;
    }
    if !a.wan.is_empty() {
        println!();
        println!(
            "{:<8} {:>22} {:>22} {:>8}",
            "rtt", "make-mirror (keys/s)", "aether (keys/s)", "ratio"
        );
        for &rtt in &a.wan {
            let mm = b.wan(Tool::MakeMirror, rtt, a.keys, a.wan_window)?;
            let ar = b.wan(Tool::Aether, rtt, a.keys, a.wan_window)?;
            println!(
                "{:<8} {mm:>22} {ar:>22} {:>7}x",
                format!("{rtt} ms"),
                ratio(ar as f64, mm.max(1) as f64)
            );
            println!(
                "REPORT make_mirror_wan rtt_ms={rtt} make_mirror_keys_per_s={mm} aether_keys_per_s={ar}"
            );
        }
    }
    Ok(())
}

impl Bench {
    fn log(&self, name: &str) -> Result<std::fs::File, String> {
        let p = self.dir.path().join(name);
        std::fs::File::create(&p).map_err(|e| format!("cannot create {}: {e}", p.display()))
    }

    fn start_mirror(&self, tool: Tool, src: &str, dst: &str) -> Result<Proc, String> {
        let log = self.log(&format!("{}.log", tool.name()))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = match tool {
            Tool::MakeMirror => {
                let mut c = etcdctl_command();
                c.args([
                    &format!("--endpoints={src}"),
                    "make-mirror",
                    &format!("--prefix={PREFIX}"),
                    dst,
                ]);
                c
            }
            Tool::Aether => {
                let mut c = Command::new(&self.replicator);
                c.env("AETHER_REPLICATOR_LOG_LEVEL", "warn").args([
                    "--region",
                    "a",
                    "--local-etcd",
                    src,
                    "--peer-etcd",
                    &format!("b={dst}"),
                    "--metrics-addr",
                    &format!("127.0.0.1:{}", procs::free_port()),
                ]);
                c
            }
        };
        cmd.stdin(Stdio::null()).stdout(log).stderr(err);
        cmd.spawn()
            .map(Proc)
            .map_err(|e| format!("cannot start {}: {e}", tool.name()))
    }

    /// Runs loadgen to its end; its stdout, trimmed.
    fn loadgen(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(&self.loadgen)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run loadgen: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "loadgen {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn fill(&self, url: &str, n: u64) -> Result<(), String> {
        self.loadgen(&["fill", url, PREFIX, &n.to_string()])
            .map(drop)
    }

    /// Waits (at most `secs`) until `url` holds `n` keys; the Unix ms then.
    fn wait_keys(&self, url: &str, n: u64, secs: u64) -> Result<u64, String> {
        let out = self.loadgen(&["wait", url, PREFIX, &n.to_string(), &secs.to_string()])?;
        out.parse()
            .map_err(|_| format!("loadgen wait printed {out:?}, not a time"))
    }

    /// Keys under the prefix now, from loadgen's answer when it gives up.
    fn count_keys(&self, url: &str) -> u64 {
        match self.loadgen(&["wait", url, PREFIX, "999999999", "0"]) {
            Ok(_) => 0,
            Err(e) => e
                .split("with ")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
        }
    }

    /// A delay proxy of `rtt_ms` in front of `upstream`; its URL.
    fn proxy(&self, upstream: &Etcd, rtt_ms: u64) -> Result<(Proc, String), String> {
        let port = procs::free_port();
        let mut child = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .args([
                "link-proxy",
                &port.to_string(),
                &upstream.client_port().to_string(),
                &(rtt_ms / 2).to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the link proxy: {e}"))?;
        let mut line = String::new();
        let stdout = child.stdout.take().ok_or("the link proxy has no stdout")?;
        let proc = Proc(child);
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("the link proxy: {e}"))?;
        if line.trim() != "ready" {
            return Err(format!("the link proxy said {line:?}, not ready"));
        }
        Ok((proc, format!("http://127.0.0.1:{port}")))
    }

    /// Base sync, then live burst, for one tool.
    fn compare(&self, tool: Tool, a: &BenchArgs) -> Result<Figures, String> {
        let mut f = Figures::default();
        let (src, dst) = (Etcd::start(), Etcd::start());
        let etcd_ticks = || procs::cpu_ticks(src.pid() as i32) + procs::cpu_ticks(dst.pid() as i32);
        self.fill(&src.endpoint(), a.keys)?;
        let e0 = etcd_ticks();
        let t0 = now_ms();
        let m = self.start_mirror(tool, &src.endpoint(), &dst.endpoint())?;
        let t1 = self.wait_keys(&dst.endpoint(), a.keys, 600)?;
        let took = t1.saturating_sub(t0).max(1);
        f.sync_keys_per_s = a.keys * 1000 / took;
        // Since the mirror started: it did nothing but this sync.
        f.sync_cpu = per_100k(procs::cpu_ticks(m.pid()), a.keys);
        f.sync_etcd_cpu = per_100k(etcd_ticks().saturating_sub(e0), a.keys);
        println!(
            "base sync  {}: {} keys in {took} ms = {} keys/s; {} CPU-s per 100k keys",
            tool.name(),
            a.keys,
            f.sync_keys_per_s,
            f.sync_cpu
        );
        drop((m, src, dst));

        let (src, dst) = (Etcd::start(), Etcd::start());
        let etcd_ticks = || procs::cpu_ticks(src.pid() as i32) + procs::cpu_ticks(dst.pid() as i32);
        let m = self.start_mirror(tool, &src.endpoint(), &dst.endpoint())?;
        // Synced and live: one probe key makes it across.
        src.etcdctl_ok(&["put", &format!("{PREFIX}probe"), "x"]);
        self.wait_keys(&dst.endpoint(), 1, 60)?;
        let (c0, e0) = (procs::cpu_ticks(m.pid()), etcd_ticks());
        let start = now_ms();
        let end: u64 = self
            .loadgen(&[
                "burst",
                &src.endpoint(),
                PREFIX,
                &a.burst.to_string(),
                &a.writers.to_string(),
            ])?
            .parse()
            .map_err(|_| "loadgen burst printed no time".to_string())?;
        let conv = self.wait_keys(&dst.endpoint(), a.burst + 1, 600)?;
        f.live_cpu = per_100k(procs::cpu_ticks(m.pid()).saturating_sub(c0), a.burst);
        // The etcds' figure includes the burst's own writes at the source.
        f.live_etcd_cpu = per_100k(etcd_ticks().saturating_sub(e0), a.burst);
        f.live_ms = conv.saturating_sub(end);
        println!(
            "live burst {}: {} revisions at ~{} rev/s; peer complete {} ms after the last write; {} CPU-s per 100k events",
            tool.name(),
            a.burst,
            a.burst * 1000 / end.saturating_sub(start).max(1),
            f.live_ms,
            f.live_cpu
        );
        Ok(f)
    }

    fn rss(&self, keys: u64, rtt: u64) -> Result<(), String> {
        let (src, dst) = (Etcd::start(), Etcd::start());
        self.fill(&src.endpoint(), keys)?;
        let t0 = Instant::now();
        let proxy = if rtt > 0 {
            Some(self.proxy(&dst, rtt)?)
        } else {
            None
        };
        let target = proxy.as_ref().map_or(dst.endpoint(), |p| p.1.clone());
        let m = self.start_mirror(Tool::Aether, &src.endpoint(), &target)?;
        let mut peak = 0;
        // Bounded: at most ten minutes of 200 ms polls.
        loop {
            peak = peak.max(procs::hwm_kib(m.pid()));
            if self.wait_keys(&dst.endpoint(), keys, 0).is_ok() {
                break;
            }
            if t0.elapsed() > Duration::from_secs(600) {
                return Err(format!(
                    "the RSS sync of {keys} keys did not finish in 10 minutes ({} on the peer)",
                    self.count_keys(&dst.endpoint())
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let took = t0.elapsed().as_millis().max(1) as u64;
        peak = peak.max(procs::hwm_kib(m.pid()));
        println!();
        println!(
            "rss: base sync of {keys} keys at {rtt} ms RTT in {took} ms ({} keys/s); replicator peak RSS {} MiB",
            keys * 1000 / took,
            peak / 1024
        );
        Ok(())
    }

    /// One tool's keys per second through a link of `rtt` ms, over at most
    /// `window` seconds.
    fn wan(&self, tool: Tool, rtt: u64, keys: u64, window: u64) -> Result<u64, String> {
        let (src, dst) = (Etcd::start(), Etcd::start());
        self.fill(&src.endpoint(), keys)?;
        let (_proxy, url) = self.proxy(&dst, rtt)?;
        let t0 = now_ms();
        let _m = self.start_mirror(tool, &src.endpoint(), &url)?;
        let (got, t1) = match self.wait_keys(&dst.endpoint(), keys, window) {
            Ok(t1) => (keys, t1),
            Err(_) => (self.count_keys(&dst.endpoint()), now_ms()),
        };
        let took = t1.saturating_sub(t0).max(1);
        let rate = got * 1000 / took;
        eprintln!(
            "wan {rtt} ms {}: {got} of {keys} keys in {took} ms = {rate} keys/s",
            tool.name()
        );
        Ok(rate)
    }
}

fn print_table(a: &BenchArgs, mm: &Figures, ar: &Figures) {
    println!();
    println!(
        "{:<28} {:>16} {:>20} {:>8}",
        "", "make-mirror", "aether-replicator", "ratio"
    );
    let row = |what: &str, m: String, r: String, x: f64| {
        println!("{what:<28} {m:>16} {r:>20} {x:>7}x");
    };
    row(
        "base sync (keys/s)",
        mm.sync_keys_per_s.to_string(),
        ar.sync_keys_per_s.to_string(),
        ratio(ar.sync_keys_per_s as f64, mm.sync_keys_per_s.max(1) as f64),
    );
    row(
        "burst: done after last (ms)",
        mm.live_ms.to_string(),
        ar.live_ms.to_string(),
        ratio(mm.live_ms.max(1) as f64, ar.live_ms.max(1) as f64),
    );
    // CPU ratios: make-mirror's over ours, so > 1 means we spend less.
    row(
        "CPU-s per 100k keys synced",
        mm.sync_cpu.to_string(),
        ar.sync_cpu.to_string(),
        ratio(mm.sync_cpu, ar.sync_cpu.max(0.01)),
    );
    row(
        "CPU-s per 100k live events",
        mm.live_cpu.to_string(),
        ar.live_cpu.to_string(),
        ratio(mm.live_cpu, ar.live_cpu.max(0.01)),
    );
    println!(
        "{:<28} {:>16} {:>20}",
        "  both etcds, per 100k synced", mm.sync_etcd_cpu, ar.sync_etcd_cpu
    );
    println!(
        "{:<28} {:>16} {:>20}",
        "  both etcds, per 100k live", mm.live_etcd_cpu, ar.live_etcd_cpu
    );
    println!(
        "REPORT cpu keys={} burst={} mm_sync_cpu_s_per_100k={} ar_sync_cpu_s_per_100k={} mm_live_cpu_s_per_100k={} ar_live_cpu_s_per_100k={} mm_sync_keys_per_s={} ar_sync_keys_per_s={} etcd_sync_cpu_s_per_100k_mm={} etcd_sync_cpu_s_per_100k_ar={} etcd_live_cpu_s_per_100k_mm={} etcd_live_cpu_s_per_100k_ar={}",
        a.keys,
        a.burst,
        mm.sync_cpu,
        ar.sync_cpu,
        mm.live_cpu,
        ar.live_cpu,
        mm.sync_keys_per_s,
        ar.sync_keys_per_s,
        mm.sync_etcd_cpu,
        ar.sync_etcd_cpu,
        mm.live_etcd_cpu,
        ar.live_etcd_cpu
    );
}
