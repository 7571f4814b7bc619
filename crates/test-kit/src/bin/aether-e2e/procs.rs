//! Processes: detached starts, "is it still ours", bounded stops, and
//! what /proc says about them (listening sockets, CPU time, peak RSS).

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Starts `cmd` in its own session (so a Ctrl-C of the caller's terminal or
/// the end of `up` does not reach it), stdin from /dev/null, stdout and
/// stderr appended to `log`. Returns its pid; the child is never waited
/// for here (it outlives this process, init reaps it).
pub(crate) fn spawn_detached(mut cmd: Command, log: &Path) -> Result<i32, String> {
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    cmd.stdout(out).stderr(err);
    spawn_configured(cmd)
}

/// Starts `cmd` (stdout and stderr already set) in its own session, stdin
/// from /dev/null; its pid.
pub(crate) fn spawn_configured(mut cmd: Command) -> Result<i32, String> {
    cmd.stdin(Stdio::null());
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    Ok(child.id() as i32)
}

/// The process exists and is not a zombie.
pub(crate) fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    match st.rfind(") ") {
        Some(i) => !st[i + 2..].starts_with('Z'),
        None => false,
    }
}

/// Every pid in /proc.
pub(crate) fn all_pids() -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .collect()
}

pub(crate) fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
    )
}

/// Alive, and its command line names the state dir: a recycled pid is
/// never signalled.
pub(crate) fn ours(dir: &str, pid: i32) -> bool {
    alive(pid) && cmdline(pid).is_some_and(|a| a.join(" ").contains(dir))
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a positive pid checked to be ours just before.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Reaps `pid` if it is a child of this process that has exited (a no-op
/// for anyone else's).
fn reap(pid: i32) {
    // SAFETY: waitpid with WNOHANG and no status pointer.
    unsafe {
        libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
    }
}

fn wait_gone(pids: &[i32], within: Duration) -> Vec<i32> {
    let deadline = Instant::now() + within;
    loop {
        for &p in pids {
            reap(p);
        }
        let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        sleep(Duration::from_millis(100));
    }
}

/// SIGTERM to each of ours, up to 5 s for them to go, then SIGKILL and 2 s
/// more. Returns those still alive.
pub(crate) fn stop_pids(dir: &str, pids: &[i32]) -> Vec<i32> {
    let live: Vec<i32> = pids.iter().copied().filter(|p| ours(dir, *p)).collect();
    for &p in &live {
        signal(p, libc::SIGTERM);
    }
    if live.is_empty() {
        return live;
    }
    let left = wait_gone(&live, Duration::from_secs(5));
    if left.is_empty() {
        return left;
    }
    eprintln!("  SIGKILL after 5s: {}", join(&left));
    for &p in &left {
        if ours(dir, p) {
            signal(p, libc::SIGKILL);
        }
    }
    wait_gone(&left, Duration::from_secs(2))
}

/// SIGKILL one of ours and wait (up to 5 s) until it is gone.
pub(crate) fn kill9(dir: &str, pid: i32) -> bool {
    if !ours(dir, pid) {
        return true;
    }
    signal(pid, libc::SIGKILL);
    wait_gone(&[pid], Duration::from_secs(5)).is_empty()
}

pub(crate) fn join(pids: &[i32]) -> String {
    pids.iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// N distinct loopback ports that were free a moment ago; the starts check
/// that the intended process owns its port and retry on new ones if not.
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
    let socks: Vec<std::net::TcpListener> = (0..n)
        .filter_map(|_| std::net::TcpListener::bind("127.0.0.1:0").ok())
        .collect();
    let ports: Vec<u16> = socks
        .iter()
        .filter_map(|s| s.local_addr().ok().map(|a| a.port()))
        .collect();
    if ports.len() != n {
        crate::die("cannot bind a free port on 127.0.0.1");
    }
    ports
}

pub(crate) fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `pid` owns a socket listening on 127.0.0.1:`port`.
pub(crate) fn listens(pid: i32, port: u16) -> bool {
    let Ok(tcp) = std::fs::read_to_string("/proc/net/tcp") else {
        return false;
    };
    let want = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[1] == want && f[3] == "0A").then(|| format!("socket:[{}]", f[9]))
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(Result::ok).any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|t| inodes.iter().any(|i| t.as_os_str() == i.as_str()))
    })
}

/// utime + stime of `pid` in clock ticks (0 if gone).
pub(crate) fn cpu_ticks(pid: i32) -> u64 {
    let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    let Some(i) = st.rfind(") ") else { return 0 };
    // After the command name: state is field 3, utime 14 and stime 15.
    let f: Vec<&str> = st[i + 2..].split_whitespace().collect();
    let n = |k: usize| f.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    n(11) + n(12)
}

/// Peak RSS (VmHWM) of `pid` in KiB (0 if gone).
pub(crate) fn hwm_kib(pid: i32) -> u64 {
    let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return 0;
    };
    st.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

pub(crate) fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { hz as f64 } else { 100.0 }
}

/// `command -v NAME`.
pub(crate) fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|d| {
            let f = d.join(name);
            std::fs::metadata(&f).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            })
        })
    })
}

/// Runs `cmd` to its end with output captured, at most `secs` seconds
/// (through coreutils' `timeout`, which kills it then). None if it could
/// not start.
pub(crate) fn run_timeout(
    secs: u64,
    program: &str,
    args: &[String],
) -> Option<std::process::Output> {
    Command::new("timeout")
        .arg(secs.to_string())
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()
}
