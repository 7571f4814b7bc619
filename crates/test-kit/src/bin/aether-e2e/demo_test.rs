//! `demo-test`: the demo as a person runs it, `e2e/demo.sh | tee FILE`
//! then Ctrl-C; fails if anything the demo started is left behind.
//!
//! First one `DEMO_ONESHOT=1` run, which must render 3 frames, exit 0 and
//! leave nothing. Then each run starts the pipeline in a process group of
//! its own, as a shell starts a foreground job (SIGINT, SIGQUIT and SIGPIPE
//! at their defaults, as a terminal's job has them); waits (bounded) until
//! the demo's view is up, pastes the `etcdctl put` the demo prints and
//! waits until that key is listed among region b's newest keys; then sends
//! SIGINT to the whole group, as a terminal does on Ctrl-C (tee gets it
//! too, so the demo cleans up writing to a pipe nobody reads). It then
//! checks that the group ended, that no process the demo started is left
//! (the pids it recorded, and any process whose command line names its
//! state dir) and that no `aether-demo.*` state dir is left. Whatever is
//! left is reported, stopped (by pid) and removed, and the run fails.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::procs;

/// The line the demo prints once its view is up.
const VIEW_UP: &str = "Ctrl-C stops the demo";
/// The key the demo's printed `etcdctl put` writes in region a.
const PASTED_IP: &str = "10.1.9.9";

pub(crate) fn cmd_demo_test(runs: u32, bin: Option<PathBuf>, view_timeout: u64) {
    if runs == 0 {
        crate::die("--runs must be at least 1");
    }
    for tool in ["etcd", "etcdctl", "timeout"] {
        if !procs::on_path(tool) {
            crate::die(format!("{tool} is not on PATH (the demo needs it)"));
        }
    }
    let repo = crate::repo();
    let demo = repo.join("e2e/demo.sh");
    // The demo asks cargo where the binary is (CARGO_TARGET_DIR, a
    // target-dir in .cargo/config): a path of its own under target/ broke
    // that once.
    let script = fs::read_to_string(&demo)
        .unwrap_or_else(|e| crate::die(format!("cannot read {}: {e}", demo.display())));
    if script.contains("target/release") || script.contains("target/debug") {
        fail_now(
            "e2e/demo.sh assumes where cargo puts the binary; ask cargo (--message-format=json)",
        );
    }
    // Built first, so that the bounded waits below measure the demo, not
    // rustc; or given, with this harness for the demo's own.
    let mut env: Vec<(&str, PathBuf)> = Vec::new();
    match bin {
        Some(bin) => {
            if !bin.is_file() {
                crate::die(format!("--bin {}: not an executable", bin.display()));
            }
            let me = std::env::current_exe()
                .unwrap_or_else(|e| crate::die(format!("cannot name this binary: {e}")));
            env.push(("DEMO_BIN", std::path::absolute(&bin).unwrap_or(bin)));
            env.push(("AETHER_E2E_BIN", me));
        }
        None => {
            let built = Command::new("cargo")
                .args(["build", "--release", "--bin", "aether-replicator"])
                .current_dir(&repo)
                .status();
            if !built.is_ok_and(|s| s.success()) {
                fail_now("cargo build --release --bin aether-replicator failed");
            }
        }
    }
    // The demos make their state dirs under TMPDIR: a dir of this test's
    // own, so that another demo on the machine is neither checked nor
    // touched.
    let work = tempfile::Builder::new()
        .prefix("aether-demo-test.")
        .tempdir()
        .unwrap_or_else(|e| crate::die(format!("cannot make a temp dir: {e}")));
    let t = DemoTest {
        demo,
        env,
        work: work.path().to_path_buf(),
        view_timeout: Duration::from_secs(view_timeout),
    };
    if !t.oneshot() {
        std::process::exit(1);
    }
    let mut failed = 0;
    for i in 1..=runs {
        if t.run(i) {
            println!("== demo-test: run {i} of {runs}: nothing left");
        } else {
            println!("FAIL: demo-test: run {i} of {runs} (above)");
            failed += 1;
        }
    }
    println!("== demo-test: {runs} runs, {failed} left something behind or failed");
    drop(work);
    if failed > 0 {
        std::process::exit(1);
    }
}

fn fail_now(msg: &str) -> ! {
    println!("FAIL: {msg}");
    std::process::exit(1)
}

struct DemoTest {
    demo: PathBuf,
    /// DEMO_BIN and AETHER_E2E_BIN when given.
    env: Vec<(&'static str, PathBuf)>,
    work: PathBuf,
    view_timeout: Duration,
}

/// A demo pipeline running in a process group of its own; dropping it
/// interrupts the group and kills what is left of it (a run that panics or
/// returns early leaves nothing running).
struct Group {
    child: Child,
    pgid: i32,
}

impl Group {
    fn interrupt(&self) {
        // SAFETY: kill(2) on our own child's process group.
        unsafe {
            libc::kill(-self.pgid, libc::SIGINT);
        }
    }

    /// The live processes left in the group.
    fn members(&self) -> Vec<i32> {
        procs::all_pids()
            .into_iter()
            .filter(|pid| pgrp(*pid) == Some(self.pgid) && procs::alive(*pid))
            .collect()
    }

    /// Waits until the group is gone; on giving up, says what is left.
    fn wait_gone(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let _ = self.child.try_wait();
            let left = self.members();
            if left.is_empty() {
                return true;
            }
            if Instant::now() >= deadline {
                println!(
                    "  the demo's process group still runs {}s after SIGINT:",
                    within.as_secs()
                );
                for pid in left {
                    println!(
                        "    {pid} {}",
                        procs::cmdline(pid).unwrap_or_default().join(" ")
                    );
                }
                return false;
            }
            sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if self.members().is_empty() {
            let _ = self.child.wait();
            return;
        }
        self.interrupt();
        if !self.wait_gone(Duration::from_secs(30)) {
            // SAFETY: as above.
            unsafe {
                libc::kill(-self.pgid, libc::SIGKILL);
            }
        }
        let _ = self.child.wait();
    }
}

/// The process group of `pid`, from /proc/PID/stat.
fn pgrp(pid: i32) -> Option<i32> {
    let st = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's ")": state, ppid, pgrp.
    st[st.rfind(") ")? + 2..].split(' ').nth(2)?.parse().ok()
}

/// The state dir the demo names in its `== live view (state: DIR)` line.
fn state_dir(out: &str) -> Option<String> {
    out.lines().find_map(|l| {
        l.strip_prefix("== live view (state: ")?
            .strip_suffix(')')
            .map(str::to_string)
    })
}

/// A frame lists `ip` in region b's part (a `region b` heading, up to the
/// next blank line).
fn in_b_newest(out: &str, ip: &str) -> bool {
    let mut region = "";
    let needle = format!("{ip}:");
    for line in out.lines() {
        if let Some(rest) = line.strip_prefix("region ") {
            region = rest.split_whitespace().next().unwrap_or("");
        } else if line.is_empty() {
            region = "";
        }
        if region == "b" && line.contains(&needle) {
            return true;
        }
    }
    false
}

impl DemoTest {
    /// `DEMO_ONESHOT=1`: 3 frames, exit 0, nothing left.
    fn oneshot(&self) -> bool {
        println!("== demo-test: DEMO_ONESHOT=1");
        let log = self.work.join("oneshot.log");
        let status = (|| {
            let out = fs::File::create(&log).ok()?;
            let err = out.try_clone().ok()?;
            Command::new("timeout")
                .arg("600")
                .arg(&self.demo)
                .env("TMPDIR", &self.work)
                .envs(self.env.iter().map(|(k, v)| (k, v)))
                .env("DEMO_ONESHOT", "1")
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .status()
                .ok()
        })();
        let text = fs::read_to_string(&log).unwrap_or_default();
        let state = state_dir(&text);
        let frames = text
            .lines()
            .filter(|l| l.starts_with("DEMO_ONESHOT: rendering 3 times"))
            .count();
        let ok = status.is_some_and(|s| s.success()) && frames == 3;
        let clean = self.leftovers(state.as_deref(), &[]);
        if !ok || !clean {
            println!(
                "FAIL: DEMO_ONESHOT=1 exited {} after {frames} frames (or left the above); its output:",
                status.map_or("without starting".into(), |s| s.to_string())
            );
            print_tail(&text);
            return false;
        }
        true
    }

    /// One run, Ctrl-C under a pipe; false if it failed.
    fn run(&self, i: u32) -> bool {
        let out_path = self.work.join(format!("demo-{i}.log"));
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(r#""$1" 2>&1 | tee "$2" >/dev/null"#)
            .arg("demo")
            .arg(&self.demo)
            .arg(&out_path)
            .env("TMPDIR", &self.work)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .process_group(0);
        // SAFETY: signal(2) is async-signal-safe. A foreground job's
        // dispositions: a bash cannot trap a signal ignored at its start.
        unsafe {
            cmd.pre_exec(|| {
                for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGPIPE] {
                    libc::signal(sig, libc::SIG_DFL);
                }
                Ok(())
            });
        }
        let child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                println!("  cannot start the demo: {e}");
                return false;
            }
        };
        let pgid = child.id() as i32;
        let mut group = Group { child, pgid };
        let read = || fs::read_to_string(&out_path).unwrap_or_default();
        let mut ok = false;
        let mut state = None;
        let mut pids = Vec::new();
        if self.until_seen(&mut group, self.view_timeout, "the live view", &read, |o| {
            o.lines().any(|l| l.starts_with(VIEW_UP))
        }) {
            let out = read();
            state = state_dir(&out);
            pids = state.as_deref().map(recorded_pids).unwrap_or_default();
            let put = out
                .lines()
                .find(|l| l.starts_with("    etcdctl --endpoints=") && l.contains(" put "));
            match put {
                None => println!("  the demo printed no `etcdctl put` to paste"),
                Some(put) => {
                    let pasted = Command::new("timeout")
                        .args(["10", "bash", "-c", put.trim()])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .status()
                        .is_ok_and(|s| s.success());
                    if !pasted {
                        println!("  the pasted command failed: {}", put.trim());
                    } else {
                        ok = self.until_seen(
                            &mut group,
                            Duration::from_secs(30),
                            &format!("the pasted key ({PASTED_IP}) in region b's newest keys"),
                            &read,
                            |o| in_b_newest(o, PASTED_IP),
                        );
                    }
                }
            }
        }
        // Ctrl-C: SIGINT to every process in the terminal's foreground group.
        group.interrupt();
        if !group.wait_gone(Duration::from_secs(60)) {
            ok = false;
        }
        drop(group);
        let clean = self.leftovers(state.as_deref(), &pids);
        ok && clean
    }

    /// Polls `seen` on the demo's output until it holds; gives up after
    /// `limit`, or when the demo's group ended, with the demo's output.
    fn until_seen(
        &self,
        group: &mut Group,
        limit: Duration,
        what: &str,
        read: &dyn Fn() -> String,
        seen: impl Fn(&str) -> bool,
    ) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            let out = read();
            if seen(&out) {
                return true;
            }
            let ended = group.child.try_wait().ok().flatten().is_some();
            if ended || Instant::now() >= deadline {
                println!(
                    "  not seen in {}s (or the demo ended): {what}; the demo's last output:",
                    limit.as_secs()
                );
                print_tail(&out);
                return false;
            }
            sleep(Duration::from_millis(200));
        }
    }

    /// Reports each process left of a demo (a recorded pid still naming
    /// `state`, or any process naming `state` or a state dir under the
    /// work dir) and each state dir left; stops them (as `down` does, then SIGKILL
    /// by pid) and removes them. True if there was nothing.
    fn leftovers(&self, state: Option<&str>, pids: &[i32]) -> bool {
        let mut clean = true;
        let mut dirs: Vec<String> = Vec::new();
        for d in demo_dirs(&self.work) {
            println!("  state dir left: {d}");
            clean = false;
            if Some(d.as_str()) != state {
                dirs.push(d);
            }
        }
        if let Some(state) = state {
            for &pid in pids {
                if procs::ours(state, pid) {
                    println!("  recorded pid {pid} still running");
                    clean = false;
                }
            }
            dirs.insert(0, state.to_string());
        }
        let mut stray = Vec::new();
        for d in &dirs {
            for (pid, line) in naming(d) {
                println!("  process left: {pid} {line}");
                stray.push(pid);
                clean = false;
            }
        }
        if clean {
            return true;
        }
        for d in &dirs {
            crate::down::stop_all(d);
        }
        let work = self.work.to_string_lossy();
        for pid in stray {
            procs::kill9(&work, pid);
        }
        for d in demo_dirs(&self.work) {
            let _ = fs::remove_dir_all(d);
        }
        false
    }
}

/// The `aether-demo.*` state dirs under `work`.
fn demo_dirs(work: &Path) -> Vec<String> {
    let Ok(dir) = fs::read_dir(work) else {
        return Vec::new();
    };
    let mut dirs: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("aether-demo."))
        .map(|e| e.path().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    dirs
}

/// The pids the demo recorded in `STATE/pids/*.pid`.
fn recorded_pids(state: &str) -> Vec<i32> {
    let Ok(dir) = fs::read_dir(Path::new(state).join("pids")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
        .filter_map(|e| fs::read_to_string(e.path()).ok()?.trim().parse().ok())
        .collect()
}

/// Each live process (but this one) whose command line names `dir`.
fn naming(dir: &str) -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let mut found: Vec<(i32, String)> = procs::all_pids()
        .into_iter()
        .filter(|pid| *pid != me && procs::alive(*pid))
        .filter_map(|pid| {
            let line = procs::cmdline(pid)?.join(" ");
            line.contains(dir).then_some((pid, line))
        })
        .collect();
    found.sort();
    found
}

fn print_tail(out: &str) {
    let lines: Vec<&str> = out.lines().collect();
    for l in &lines[lines.len().saturating_sub(40)..] {
        println!("    {l}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pasted_key_counts_only_in_region_b() {
        let frame =
            "region a  (leader: 1)\n  10.1.9.9:8080 v1\n\nregion b  (leader: 1)\n  10.2.0.1:80 v\n";
        assert!(!in_b_newest(frame, "10.1.9.9"));
        let frame = format!("{frame}  10.1.9.9:8080 v1\n");
        assert!(in_b_newest(&frame, "10.1.9.9"));
    }

    #[test]
    fn the_state_dir_is_read_off_the_view_line() {
        let out = "building\n== live view (state: /tmp/w/aether-demo.x1)\nCtrl-C stops the demo\n";
        assert_eq!(state_dir(out).as_deref(), Some("/tmp/w/aether-demo.x1"));
        assert_eq!(state_dir("nothing"), None);
    }
}
