//! The config file (`--config` / `AETHER_REPLICATOR_CONFIG`) and
//! `--check-config`, on the real binary and real etcds.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use aether_replicator::etcd::{Client, ClientConfig, Put, Range};
use common::replicator::{Replicator, binary};
use common::{Etcd, wait_until, write_file};

const KEY: &str = "/aether/v1/regions/a/clusters/c/services/s/protocols/http/endpoints/10.0.0.1";

/// Writes a password file holding `password` and `a.toml`: region a with
/// `lease_ttl`, a `[local]` endpoint nothing listens on, then what `rest`
/// makes of the password file's path. Returns the config file's path.
fn region_a_file(
    dir: &Path,
    password: &str,
    lease_ttl: &str,
    rest: impl FnOnce(&str) -> String,
) -> String {
    let pw = write_file(dir, "password", password);
    let head = format!(
        r#"
region = "a"
lease_ttl = "{lease_ttl}"
[local]
endpoints = ["http://127.0.0.1:1"]
"#
    );
    write_file(dir, "a.toml", &(head + &rest(&pw)))
}

/// Runs the binary with `args` to completion: (exit code, stdout, stderr).
fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(binary()).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_accepts_a_good_file_without_connecting() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on these ports: --check-config must not connect.
    let file = region_a_file(dir.path(), "pw\n", "30s", |pw| {
        format!(
            r#"username = "replicator"
password_file = "{pw}"
[peers.b]
endpoints = ["http://127.0.0.1:2"]
max_request_bytes = "1536KiB"
[peers.c]
endpoints = ["http://127.0.0.1:3"]
"#
        )
    });
    let config = format!("--config={file}");
    let (code, out, err) = run(&["--check-config", &config]);
    assert_eq!(code, Some(0), "{err}");
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("config ok: region a, 2 peers; effective settings:")
    );
    // The effective settings: the file's, and the defaults for the rest.
    let settings: Vec<&str> = lines.collect();
    for line in [
        "region = a",
        "lease_ttl = 30s",
        "election_ttl = 10s",
        "peers.b = http://127.0.0.1:2 max_txn_ops 128 max_request_bytes 1572864",
        "peers.c = http://127.0.0.1:3",
    ] {
        assert!(settings.contains(&line), "{line:?} not in\n{out}");
    }
    // The password's file, never the password.
    assert!(
        !out.contains("pw\n") && out.contains(" password from "),
        "{out}"
    );
    // A flag adds a peer, exactly as a run would take it.
    let (code, out, err) = run(&[
        "--check-config",
        &config,
        "--peer-etcd=d=http://127.0.0.1:4",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("config ok: region a, 3 peers; effective settings:\n"),
        "{out}"
    );
}

#[test]
fn check_config_refuses_a_bad_file_with_one_line_naming_file_table_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let base = "region = \"a\"\n[peers.b]\nendpoints = [\"http://127.0.0.1:2\"]\n";
    for (name, extra, args, want) in [
        (
            "size.toml",
            "max_request_bytes = \"12QB\"\n",
            &[][..],
            "[peers.b] max_request_bytes: invalid byte size \"12QB\"",
        ),
        (
            "pw.toml",
            "username = \"u\"\npassword_file = \"/nonexistent/pw\"\n",
            &[],
            "[peers.b] password_file \"/nonexistent/pw\": ",
        ),
        (
            "key.toml",
            "sni = \"x\"\n",
            &[],
            "[peers.b] sni: unknown key",
        ),
        // A flag that is wrong is named as a flag, even with a file.
        ("flag.toml", "", &["--lease-ttl=0s"], "--lease-ttl \"0s\""),
    ] {
        let file = write_file(dir.path(), name, &format!("{base}{extra}"));
        let config = format!("--config={file}");
        let mut argv = vec!["--check-config", config.as_str()];
        argv.extend_from_slice(args);
        let (code, out, err) = run(&argv);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert_eq!(out, "", "{name}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{name}: {err}");
        let want = if want.starts_with("--") {
            format!("error: {want}")
        } else {
            format!("error: {file}: {want}")
        };
        assert!(
            lines[0].starts_with(&want),
            "{name}:\n got {err:?}\nwant {want:?}"
        );
    }
    let (code, _, err) = run(&["--check-config", "--config=/nonexistent/a.toml"]);
    assert_eq!(code, Some(2));
    assert!(
        err.starts_with("error: --config \"/nonexistent/a.toml\": "),
        "{err}"
    );
}

/// The file names the region, the lease and the peer (with a password
/// from a file, on an etcd with auth enabled); `--local-etcd` overrides the
/// file's (wrong) local endpoint, and the file itself is given through
/// `AETHER_REPLICATOR_CONFIG`.
#[test]
fn a_config_file_with_an_override_mirrors_between_two_real_etcds() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in_runtime = rt.enter();
    let (src, dst) = (Etcd::start(), Etcd::start());
    dst.enable_root_auth("rootpw");
    let dir = tempfile::tempdir().unwrap();
    let file = region_a_file(dir.path(), "rootpw\n", "6s", |pw| {
        format!(
            r#"[peers.b]
endpoints = ["{dst}"]
username = "root"
password_file = "{pw}"
"#,
            dst = dst.endpoint()
        )
    });
    let replica = Replicator::spawn_with_env(
        &[format!("--local-etcd={}", src.endpoint())],
        &[("AETHER_REPLICATOR_CONFIG", &file)],
    );
    let s = Client::connect(ClientConfig::new(src.endpoints())).unwrap();
    rt.block_on(s.put(Put::new(KEY, "v1"))).unwrap();
    let d = Client::connect(dst.client_config_as("root", "rootpw")).unwrap();
    let mirrored = || {
        rt.block_on(d.range(Range::key(KEY)))
            .ok()
            .and_then(|r| r.kvs().first().map(|kv| kv.value().to_vec()))
            == Some(b"v1".to_vec())
    };
    assert!(
        wait_until(Duration::from_secs(30), mirrored),
        "never mirrored; log:\n{}",
        replica.log_text()
    );
    // The copy is under the file's lease TTL.
    let lease = rt.block_on(d.range(Range::key(KEY))).unwrap().kvs()[0].lease();
    assert!(!lease.is_none());
    let log = replica.log_text();
    assert!(log.contains("replica_id"));
    // Text logs to a file carry no terminal colours.
    assert!(!log.contains('\x1b'), "escape codes in a log file:\n{log}");
}

/// A certificate that expired yesterday, one not valid until tomorrow, and
/// a key of another certificate: `--check-config` refuses each with one
/// line naming the setting and the file, given by flag or by file.
#[test]
fn check_config_refuses_expired_early_and_mismatched_tls_files() {
    let dir = tempfile::tempdir().unwrap();
    let pki = common::generate_tls(&dir.path().join("pki"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    const DAY: i64 = 86_400;
    let (old, old_key) = pki.issue_client_cert_valid("old", now - 30 * DAY, now - DAY);
    let (early, early_key) = pki.issue_client_cert_valid("early", now + DAY, now + 30 * DAY);
    let (good, _) = pki.issue_client_cert_valid("good", now - DAY, now + 30 * DAY);
    let (ca, good_key) = (pki.ca.clone(), pki.client_key.clone());
    let p = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let by_flag = |cert: &str, key: &str| {
        run(&[
            "--check-config",
            "--region=a",
            "--local-etcd=http://127.0.0.1:1",
            "--peer-etcd=b=https://127.0.0.1:2",
            &format!("--peer-tls=b=ca={},cert={cert},key={key}", p(&ca)),
        ])
    };
    for (name, cert, key, field, want) in [
        ("expired", &old, &old_key, "cert", "expired on "),
        ("early", &early, &early_key, "cert", "not valid before "),
        (
            "mismatched",
            &good,
            &good_key,
            "key",
            "does not match the certificate in ",
        ),
    ] {
        let (cert, key) = (p(cert), p(key));
        let bad = if field == "cert" { &cert } else { &key };
        // By flag.
        let (code, out, err) = by_flag(&cert, &key);
        assert_eq!(code, Some(2), "{name}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        let head = format!("error: --peer-tls b: {field} {bad:?}: {want}");
        assert!(
            err.starts_with(&head),
            "{name}:\n got {err:?}\nwant {head:?}"
        );
        // By file.
        let file = write_file(
            dir.path(),
            &format!("{name}.toml"),
            &format!(
                "region = \"a\"\n[local]\nendpoints = [\"http://127.0.0.1:1\"]\n\
                 [peers.b]\nendpoints = [\"https://127.0.0.1:2\"]\n\
                 ca = \"{}\"\ncert = \"{cert}\"\nkey = \"{key}\"\n",
                p(&ca)
            ),
        );
        let (code, out, err) = run(&["--check-config", &format!("--config={file}")]);
        assert_eq!(code, Some(2), "{name}: {out}{err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        let head = format!("error: {file}: [peers.b] {field} {bad:?}: {want}");
        assert!(
            err.starts_with(&head),
            "{name}:\n got {err:?}\nwant {head:?}"
        );
    }
    // The good certificate with its own key passes.
    let (good, good_key) = pki.issue_client_cert_valid("good2", now - DAY, now + 30 * DAY);
    let (code, out, err) = by_flag(&p(&good), &p(&good_key));
    assert_eq!(code, Some(0), "{out}{err}");
}
