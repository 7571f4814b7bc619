//! The client's examples (`crates/aether-etcd/examples/`) run against a
//! real etcd and print what their doc comments promise. They are what a
//! user copies first, so a broken one is a bug like any other.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::Etcd;

/// Longer than any example needs (the lease example sleeps 6 s); an
/// example that hangs fails the test with what it printed so far.
const EXAMPLE_DEADLINE: Duration = Duration::from_secs(60);

/// The directory the examples are built into: next to this test's own
/// binary (`target/<profile>/deps/` -> `target/<profile>/examples/`).
/// They are built here once, for the whole workspace so that the features
/// are the ones the test build used (a no-op after `cargo test` or
/// `nextest --workspace`, which build examples already).
fn examples_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
        let target_dir = profile_dir.parent().unwrap();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        // Without what cargo set for this test (its package's variables, and
        // the `rustc-env` of this crate's build script): build scripts rerun
        // when a variable they watch differs from the build that made this
        // binary, which had none of them. With them, this "no-op" rebuilt
        // ring and every crate above it (25 s), and the next `cargo test`
        // rebuilt them back.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k == "OUT_DIR"
                || k.starts_with("CARGO_PKG_")
                || k.starts_with("CARGO_BIN_")
                || k.starts_with("CARGO_MANIFEST_")
                || k.starts_with("CARGO_CRATE_")
                || k.starts_with("CARGO_PRIMARY_")
                || k.starts_with("CARGO_TARGET_TMPDIR")
                || k.starts_with("CARGO_RUSTC_")
                || k.starts_with("NEXTEST")
                || k.starts_with("AETHER_REPLICATOR_")
            {
                build.env_remove(k.as_ref());
            }
        }
        build
            .args([
                "build",
                "--workspace",
                "--examples",
                "--quiet",
                "--target-dir",
            ])
            .arg(target_dir)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let out = build.output().expect("running cargo to build the examples");
        assert!(
            out.status.success(),
            "cargo build --examples failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        profile_dir.join("examples")
    })
}

/// Runs one example to its end and returns its stdout; fails with its
/// output if it exits non-zero or outlives [`EXAMPLE_DEADLINE`].
fn run_example(name: &str, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("stdout");
    let err_path = dir.path().join("stderr");
    let mut child = Command::new(examples_dir().join(name))
        .args(args)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("starting example {name}: {e}"));
    let deadline = Instant::now() + EXAMPLE_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    match status {
        Some(s) if s.success() => stdout,
        Some(s) => panic!("example {name} exited with {s}\nstdout:\n{stdout}\nstderr:\n{stderr}"),
        None => panic!(
            "example {name} still running after {EXAMPLE_DEADLINE:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        ),
    }
}

/// Asserts that `out` has these lines, in this order (others may sit in
/// between), each matched by its start.
fn assert_lines(out: &str, expected: &[&str]) {
    let mut lines = out.lines();
    for want in expected {
        assert!(
            lines.any(|l| l.starts_with(want)),
            "expected a line starting with {want:?} (in order) in:\n{out}"
        );
    }
}

#[test]
fn put_get_example() {
    let etcd = Etcd::start();
    let out = run_example("put_get", &[&etcd.endpoint()]);
    assert_lines(
        &out,
        &[
            "put /examples/put_get/greeting at revision",
            "get /examples/put_get/greeting = hello (version 1)",
            "cas attempt 1 succeeded: true",
            "cas attempt 2 succeeded: false",
            "deleted 1 key(s)",
        ],
    );
}

#[test]
fn watch_example_resumes_without_loss_or_repeat() {
    let etcd = Etcd::start();
    let out = run_example("watch", &[&etcd.endpoint()]);
    assert_lines(
        &out,
        &[
            "first run: PUT /examples/watch/a=1",
            "first run: PUT /examples/watch/b=2",
            "resumed: PUT /examples/watch/c=3",
            "resumed: DELETE /examples/watch/a=",
        ],
    );
    assert_eq!(out.lines().count(), 4, "exactly four events:\n{out}");
}

#[test]
fn lease_example_keeps_the_key_until_the_revoke() {
    let etcd = Etcd::start();
    let out = run_example("lease", &[&etcd.endpoint()]);
    assert_lines(
        &out,
        &[
            "granted lease",
            "after 6 s: key present = true, keep-alives answered = true, lost = false",
            "after revoke: lease lost, key present = false",
        ],
    );
}

#[test]
fn election_example_hands_over_on_resign() {
    let etcd = Etcd::start();
    let out = run_example("election", &[&etcd.endpoint()]);
    assert_lines(&out, &["leader: candidate-1", "leader: candidate-2"]);
}

#[test]
fn lock_example_loses_no_update() {
    let etcd = Etcd::start();
    let out = run_example("lock", &[&etcd.endpoint()]);
    assert_lines(&out, &["counter = 15 after 3 workers x 5 rounds"]);
}

#[test]
fn namespace_example_keeps_tenants_apart() {
    let etcd = Etcd::start();
    let out = run_example("namespace", &[&etcd.endpoint()]);
    assert_lines(
        &out,
        &[
            "tenant a reads config = a's",
            "tenant b reads config = b's",
            "stored as /examples/namespace/tenant-a/config",
            "stored as /examples/namespace/tenant-b/config",
        ],
    );
}

#[test]
fn tls_example_connects_with_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = common::generate_mtls(dir.path());
    let etcd = Etcd::builder().tls(pki.clone()).start();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let out = run_example(
        "tls",
        &[
            &etcd.endpoint(),
            &path(&pki.ca),
            &path(&pki.client_cert),
            &path(&pki.client_key),
        ],
    );
    assert_lines(&out, &["read /examples/tls/hello = over TLS from member"]);
}

#[test]
fn auth_example_reads_its_prefix_only_and_leaves_auth_off() {
    let etcd = Etcd::start();
    let out = run_example("auth", &[&etcd.endpoint()]);
    assert_lines(
        &out,
        &[
            "auth enabled: user app may read /examples/auth/app/*",
            "app reads /examples/auth/app/config = v1",
            "app may not write it: permission denied",
            "app may not read outside /examples/auth/app/",
            "a client without credentials is refused",
            "auth disabled; users app and root and role app-reader deleted",
        ],
    );
    // What it says is so: auth is off and its users are gone.
    let users = etcd.etcdctl_ok(&["user", "list"]);
    assert!(users.trim().is_empty(), "users left: {users}");
    etcd.etcdctl_ok(&["put", "/after", "anyone may write"]);
}

#[test]
fn cluster_example_lists_the_members_and_the_status() {
    let etcd = Etcd::start();
    let out = run_example("cluster", &[&etcd.endpoint()]);
    assert_lines(&out, &["1 member(s)", "member ", "answered by "]);
    let member = out.lines().find(|l| l.starts_with("member ")).unwrap();
    assert!(member.contains(&etcd.endpoint()), "{out}");
    // A single member leads itself.
    let status = out.lines().find(|l| l.starts_with("answered by ")).unwrap();
    let id = status
        .split_whitespace()
        .nth(2)
        .unwrap()
        .trim_end_matches(':');
    assert!(status.contains(&format!("leader {id},")), "{out}");
}

#[test]
fn snapshot_example_writes_a_file_etcdctl_reads() {
    let etcd = Etcd::start();
    for i in 0..3 {
        etcd.etcdctl_ok(&["put", &format!("/examples/snapshot/{i}"), "x"]);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("etcd.db");
    let out = run_example("snapshot", &[&etcd.endpoint(), path.to_str().unwrap()]);
    assert_lines(&out, &["wrote "]);
    let written: u64 = out
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {out}"));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), written, "{out}");
    // The file is a snapshot etcd's own tool reads, holding the keys put.
    let status = common::etcdctl_command()
        .args(["snapshot", "status", "-w", "json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "etcdctl snapshot status: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(status["totalKey"].as_u64().unwrap_or(0) >= 3, "{status}");
}
