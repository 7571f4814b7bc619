//! Self-tests of the test kit: etcd processes, the fault proxy, TLS material.

use std::net::SocketAddr;
use std::process::Output;
use std::time::{Duration, Instant};

use aether_test_kit::{
    Etcd, FaultProxy, etcdctl_command, generate_mtls, generate_tls, wait_until, wait_until_async,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Asserts that `out` is a success (showing its stderr otherwise); its
/// trimmed stdout.
#[track_caller]
fn succeeded(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(out)
}

fn get_value(etcd: &Etcd, key: &str) -> String {
    etcd.etcdctl_ok(&["get", key, "--print-value-only"])
        .trim()
        .to_string()
}

/// Whether `pid` is gone (or a zombie nobody reaped yet).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
    }
}

#[test]
fn start_put_get() {
    let etcd = Etcd::start();
    assert!(
        etcd.endpoint().starts_with("http://127.0.0.1:"),
        "{}",
        etcd.endpoint()
    );
    assert_eq!(etcd.endpoints(), vec![etcd.endpoint()]);
    assert_eq!(etcd.client_addr().port(), etcd.client_port());
    assert!(etcd.pid() > 0);
    assert_eq!(etcd.etcdctl_ok(&["put", "foo", "bar"]).trim(), "OK");
    assert_eq!(get_value(&etcd, "foo"), "bar");
    assert!(etcd.log_path().exists());
    assert!(etcd.data_dir().join("member").is_dir());
}

#[test]
fn two_instances_are_independent() {
    let a = Etcd::start();
    let b = Etcd::start();
    assert_ne!(a.client_port(), b.client_port());
    assert_ne!(a.name(), b.name());
    a.etcdctl_ok(&["put", "k", "a"]);
    assert_eq!(get_value(&b, "k"), "");
    assert_eq!(get_value(&a, "k"), "a");
}

#[test]
fn restart_keeps_data() {
    let mut etcd = Etcd::start();
    let endpoint = etcd.endpoint();
    let pid = etcd.pid();
    etcd.etcdctl_ok(&["put", "foo", "bar"]);
    etcd.restart();
    assert!(etcd.is_running());
    assert_ne!(etcd.pid(), pid);
    assert_eq!(etcd.endpoint(), endpoint);
    assert!(process_gone(pid));
    assert_eq!(get_value(&etcd, "foo"), "bar");
}

#[test]
fn restart_empty_loses_data() {
    let mut etcd = Etcd::start();
    let endpoint = etcd.endpoint();
    for i in 0..5 {
        etcd.etcdctl_ok(&["put", &format!("k{i}"), "v"]);
    }
    etcd.restart_empty();
    assert_eq!(etcd.endpoint(), endpoint);
    assert_eq!(get_value(&etcd, "k0"), "");
    // A brand-new member: back to revision 1.
    let json = etcd.etcdctl_ok(&["get", "k0", "-w", "json"]);
    assert!(json.contains(r#""revision":1"#), "{json}");
}

#[test]
fn kill_then_restart() {
    let mut etcd = Etcd::start();
    etcd.etcdctl_ok(&["put", "foo", "bar"]);
    let pid = etcd.pid();
    etcd.kill();
    assert!(!etcd.is_running());
    assert!(process_gone(pid));
    let out = etcd.etcdctl(&["get", "foo", "--dial-timeout=1s", "--command-timeout=1s"]);
    assert!(
        !out.status.success(),
        "get on a killed etcd succeeded: {}",
        stdout(&out)
    );
    etcd.restart();
    assert!(etcd.is_running());
    assert_eq!(get_value(&etcd, "foo"), "bar");
}

#[test]
fn stop_is_graceful_and_drop_reaps() {
    let mut etcd = Etcd::start();
    let pid = etcd.pid();
    let t = Instant::now();
    etcd.stop();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "SIGTERM took {:?}",
        t.elapsed()
    );
    assert!(!etcd.is_running());
    assert!(process_gone(pid));
    etcd.stop(); // idempotent
    etcd.kill(); // idempotent

    let etcd = Etcd::start();
    let pid = etcd.pid();
    let dir = etcd.data_dir();
    assert!(dir.exists());
    drop(etcd);
    assert!(process_gone(pid));
    assert!(!dir.exists(), "temp dir not removed");
}

#[test]
fn extra_args_are_passed() {
    let etcd = Etcd::builder()
        .extra_args(&["--max-request-bytes=1024"])
        .start();
    etcd.etcdctl_ok(&["put", "small", "x"]);
    let big = "x".repeat(4096);
    let out = etcd.etcdctl(&["put", "big", &big]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("too large"), "unexpected error: {err}");
}

#[test]
fn data_dir_can_be_reused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("etcd-data");
    {
        let etcd = Etcd::builder().data_dir(&dir).start();
        assert_eq!(etcd.data_dir(), dir);
        etcd.etcdctl_ok(&["put", "persisted", "yes"]);
    }
    assert!(
        dir.join("member").is_dir(),
        "user data dir must survive drop"
    );
    let etcd = Etcd::builder().data_dir(&dir).start();
    assert_eq!(get_value(&etcd, "persisted"), "yes");
}

#[test]
fn tls_etcd() {
    let pki = tempfile::tempdir().unwrap();
    let tls = generate_tls(pki.path());
    for f in [
        &tls.ca,
        &tls.server_cert,
        &tls.server_key,
        &tls.client_cert,
        &tls.client_key,
    ] {
        assert!(f.exists(), "{} missing", f.display());
    }
    let etcd = Etcd::builder().tls(tls.clone()).start();
    assert!(
        etcd.endpoint().starts_with("https://127.0.0.1:"),
        "{}",
        etcd.endpoint()
    );
    etcd.etcdctl_ok(&["put", "secure", "1"]);
    assert_eq!(get_value(&etcd, "secure"), "1");

    // The server certificate is also valid for the SAN `localhost`.
    let local = etcd.endpoint().replace("127.0.0.1", "localhost");
    let out = etcd.etcdctl_at(&local, &["get", "secure", "--print-value-only"]);
    assert_eq!(succeeded(&out), "1");

    // Without the CA the server certificate is rejected.
    let out = etcdctl_command()
        .args([
            &format!("--endpoints={}", etcd.endpoint()),
            "get",
            "secure",
            "--dial-timeout=2s",
            "--command-timeout=2s",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "untrusted TLS succeeded");
}

#[test]
fn mtls_etcd() {
    let pki = tempfile::tempdir().unwrap();
    let tls = generate_mtls(pki.path());
    assert!(tls.client_cert_auth);
    let etcd = Etcd::builder().tls(tls.clone()).start();
    etcd.etcdctl_ok(&["put", "m", "tls"]);
    assert_eq!(get_value(&etcd, "m"), "tls");

    // CA but no client certificate: rejected.
    let out = etcdctl_command()
        .args([
            &format!("--endpoints={}", etcd.endpoint()),
            &format!("--cacert={}", tls.ca.display()),
            "get",
            "m",
            "--dial-timeout=2s",
            "--command-timeout=2s",
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "mTLS server accepted a client without a certificate"
    );

    // An extra client certificate from the same CA works.
    let (cert, key) = tls.issue_client_cert("alice");
    let out = etcdctl_command()
        .args([
            &format!("--endpoints={}", etcd.endpoint()),
            &format!("--cacert={}", tls.ca.display()),
            &format!("--cert={}", cert.display()),
            &format!("--key={}", key.display()),
            "get",
            "m",
            "--print-value-only",
        ])
        .output()
        .unwrap();
    assert_eq!(succeeded(&out), "tls");
}

#[test]
fn mtls_client_cert_cn_maps_to_user() {
    let pki = tempfile::tempdir().unwrap();
    let etcd = Etcd::builder().tls(generate_mtls(pki.path())).start();
    etcd.enable_root_auth("rootpw");
    // No --user: the client certificate's CN `root` authenticates us.
    etcd.etcdctl_ok(&["put", "authed", "by-cn"]);
    assert_eq!(get_value(&etcd, "authed"), "by-cn");
}

#[test]
fn missing_binary_panics_with_install_hint() {
    // Mutating the environment is unsafe in edition 2024: do it in a child.
    let out = run_helper("start", &[("ETCD_BIN", "/nonexistent/etcd")]);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "helper should have panicked: {all}");
    assert!(
        all.contains(
            "etcd not found: install it with `apt-get update && apt-get install -y etcd-server etcd-client`, or set ETCD_BIN"
        ),
        "{all}"
    );
}

/// Runs [`helper_start_with_env`] in a child process of this test binary
/// with `HARNESS_HELPER=mode` and the extra `env`.
fn run_helper(mode: &str, env: &[(&str, &str)]) -> std::process::Output {
    let exe = std::env::current_exe().unwrap();
    std::process::Command::new(exe)
        .args([
            "--exact",
            "helper_start_with_env",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HARNESS_HELPER", mode)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Helper for other tests (run in a child process); does nothing otherwise.
#[test]
#[ignore]
fn helper_start_with_env() {
    match std::env::var("HARNESS_HELPER").as_deref() {
        Ok("start") => {
            let _etcd = Etcd::start();
        }
        Ok("abort") => {
            let etcd = Etcd::start();
            println!("ETCD_PID={}", etcd.pid());
            println!("ETCD_DIR={}", etcd.log_path().parent().unwrap().display());
            use std::io::Write;
            std::io::stdout().flush().unwrap();
            // No destructors run: the watchdog must kill etcd.
            std::process::abort();
        }
        _ => {}
    }
}

#[test]
fn etcd_dies_with_the_test_process() {
    let out = run_helper("abort", &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let pid: u32 = text
        .lines()
        .find_map(|l| l.split_once("ETCD_PID=").map(|(_, p)| p.trim()))
        .unwrap_or_else(|| {
            panic!(
                "no pid in helper output: {text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .parse()
        .unwrap();
    let dir = text
        .lines()
        .find_map(|l| {
            l.split_once("ETCD_DIR=")
                .map(|(_, p)| std::path::PathBuf::from(p.trim()))
        })
        .expect("no dir in helper output");
    assert!(!out.status.success(), "helper should have aborted");
    assert!(
        wait_until(Duration::from_secs(5), || process_gone(pid)),
        "etcd {pid} outlived the aborted test process"
    );
    assert!(
        wait_until(Duration::from_secs(5), || !dir.exists()),
        "temp dir {} left behind",
        dir.display()
    );
}

// ---- FaultProxy -------------------------------------------------------------

/// Runs etcdctl off the async runtime (the proxy needs it to make progress).
async fn ctl_at(etcd: &Etcd, endpoint: &str, args: &[&str]) -> Output {
    let endpoint = endpoint.to_string();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let tls = etcd.tls().cloned();
    tokio::task::spawn_blocking(move || {
        let mut cmd = etcdctl_command();
        cmd.arg(format!("--endpoints={endpoint}"));
        if let Some(tls) = tls {
            cmd.arg(format!("--cacert={}", tls.ca.display()));
        }
        cmd.args(&args).output().unwrap()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_forwards_cuts_and_heals_etcd_traffic() {
    let etcd = Etcd::start();
    let proxy = FaultProxy::start(etcd.client_addr()).await;
    assert!(proxy.endpoint().starts_with("http://127.0.0.1:"));
    let ep = proxy.endpoint();
    let quick = ["--dial-timeout=1s", "--command-timeout=1s"];

    let out = ctl_at(&etcd, &ep, &["put", "via", "proxy"]).await;
    succeeded(&out);
    assert!(proxy.accepted_connections() >= 1);
    assert_eq!(get_value(&etcd, "via"), "proxy");

    proxy.cut();
    assert!(proxy.is_cut());
    let t = Instant::now();
    let out = ctl_at(&etcd, &ep, &[&["get", "via"][..], &quick[..]].concat()).await;
    assert!(
        !out.status.success(),
        "get through a cut proxy succeeded: {}",
        stdout(&out)
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    // etcd itself is fine.
    assert_eq!(get_value(&etcd, "via"), "proxy");

    proxy.heal();
    let out = ctl_at(
        &etcd,
        &ep,
        &[&["get", "via", "--print-value-only"][..], &quick[..]].concat(),
    )
    .await;
    assert_eq!(succeeded(&out), "proxy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_passes_tls_through() {
    let pki = tempfile::tempdir().unwrap();
    let etcd = Etcd::builder().tls(generate_tls(pki.path())).start();
    etcd.etcdctl_ok(&["put", "t", "1"]);
    let proxy = FaultProxy::start(etcd.client_addr()).await;
    let out = ctl_at(
        &etcd,
        &proxy.tls_endpoint(),
        &["get", "t", "--print-value-only"],
    )
    .await;
    assert_eq!(succeeded(&out), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_latency_slows_etcd_requests() {
    let etcd = Etcd::start();
    let proxy = FaultProxy::start(etcd.client_addr()).await;
    let ep = proxy.endpoint();
    let t = Instant::now();
    let out = ctl_at(&etcd, &ep, &["get", "x"]).await;
    assert!(out.status.success());
    let fast = t.elapsed();

    proxy.set_latency(Duration::from_millis(300));
    let t = Instant::now();
    let out = ctl_at(&etcd, &ep, &["get", "x", "--command-timeout=10s"]).await;
    succeeded(&out);
    let slow = t.elapsed();
    // At least one request/response round trip: 2 x 300ms.
    assert!(
        slow >= Duration::from_millis(600),
        "fast {fast:?}, slow {slow:?}"
    );
}

async fn echo_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

async fn read_exact_timeout(s: &mut TcpStream, n: usize, t: Duration) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; n];
    match tokio::time::timeout(t, s.read_exact(&mut buf)).await {
        Ok(Ok(_)) => Some(buf),
        _ => None,
    }
}

/// Asserts that `s`, through the proxy to [`echo_server`], echoes `msg`.
async fn assert_echoes(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).await.unwrap();
    assert_eq!(
        read_exact_timeout(s, msg.len(), Duration::from_secs(2))
            .await
            .as_deref(),
        Some(msg)
    );
}

/// Asserts that `s` is closed (end of stream or an error) within 2 s;
/// `what` says what should have closed it.
async fn assert_closed(s: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 16];
    let r = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
    assert!(matches!(r, Ok(Ok(0)) | Ok(Err(_))), "{what}: {r:?}");
}

/// Raw-TCP semantics on a current-thread runtime.
#[tokio::test(flavor = "current_thread")]
async fn proxy_cut_semantics_current_thread() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::start(upstream).await;

    let mut live = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_echoes(&mut live, b"ping").await;
    assert_eq!(proxy.accepted_connections(), 1);

    // cut: the live connection is closed...
    proxy.cut();
    let mut buf = [0u8; 16];
    assert_closed(&mut live, "live connection not closed by cut").await;

    // ...and a new one is accepted but black-holed (open, silent).
    let mut hole = TcpStream::connect(proxy.addr()).await.unwrap();
    hole.write_all(b"anyone?").await.unwrap();
    let r = tokio::time::timeout(Duration::from_millis(500), hole.read(&mut buf)).await;
    assert!(r.is_err(), "black-holed connection produced {r:?}");
    assert!(wait_until_async(Duration::from_secs(2), || proxy.accepted_connections() == 2).await);

    // heal: the black-holed connection is closed, new ones work.
    proxy.heal();
    assert_closed(&mut hole, "black-holed connection not closed by heal").await;
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_echoes(&mut fresh, b"again").await;
    assert!(wait_until_async(Duration::from_secs(2), || proxy.active_connections() == 1).await);

    // Dropping the proxy closes everything.
    let addr = proxy.addr();
    drop(proxy);
    assert_closed(&mut fresh, "connection survived proxy drop").await;
    // The listener is closed once the accept task has observed cancellation.
    let mut refused = false;
    for _ in 0..100 {
        if TcpStream::connect(addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "proxy still accepting after drop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_bandwidth_and_latency_raw() {
    let upstream = echo_server().await;
    let proxy = FaultProxy::start(upstream).await;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();

    // 32 KiB each way at 32 KiB/s: ~1s per direction, pipelined => >= ~0.9s.
    proxy.set_bandwidth(Some(32 * 1024));
    let data = vec![7u8; 32 * 1024];
    let t = Instant::now();
    let (mut r, mut w) = s.split();
    let (_, echoed) = tokio::join!(w.write_all(&data), async {
        let mut buf = vec![0u8; data.len()];
        tokio::time::timeout(Duration::from_secs(10), r.read_exact(&mut buf))
            .await
            .map(|_| buf)
    });
    let echoed = echoed.expect("echo timed out");
    assert_eq!(echoed, data);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(850),
        "bandwidth not applied: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "too slow: {took:?}");

    proxy.set_bandwidth(None);
    proxy.set_latency(Duration::from_millis(150));
    let t = Instant::now();
    s.write_all(b"x").await.unwrap();
    let got = read_exact_timeout(&mut s, 1, Duration::from_secs(5)).await;
    assert_eq!(got.as_deref(), Some(&b"x"[..]));
    let rtt = t.elapsed();
    assert!(
        rtt >= Duration::from_millis(300),
        "latency not applied: {rtt:?}"
    );
}

#[test]
#[should_panic(expected = "loopback")]
fn proxy_rejects_non_loopback_upstream() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(FaultProxy::start("10.1.2.3:2379".parse().unwrap()));
}
