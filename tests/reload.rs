//! Certificate rotation without a restart (`app::reload`), on the real
//! binary and a real mutual-TLS etcd.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use aether_replicator::etcd::{Client, ClientConfig, Put, Range, TlsConfig};
use common::replicator::{Replicator, metric};
use common::{Etcd, TlsFiles, generate_mtls, wait_until, write_file};

const PREFIX: &str = "/aether/v1/regions/a/clusters/c/services/s/protocols/http/endpoints/";

/// A directory laid out as Kubernetes mounts a Secret: the visible files
/// are symlinks through `..data`, a symlink to a timestamped directory that
/// an update replaces by renaming a new `..data` over it.
struct SecretMount {
    dir: PathBuf,
    version: u32,
}

impl SecretMount {
    const FILES: [&str; 3] = ["ca.crt", "tls.crt", "tls.key"];

    fn new(dir: &Path, pki: &TlsFiles) -> SecretMount {
        std::fs::create_dir_all(dir).unwrap();
        let mut m = SecretMount {
            dir: dir.to_path_buf(),
            version: 0,
        };
        m.update(pki);
        for f in Self::FILES {
            std::os::unix::fs::symlink(Path::new("..data").join(f), dir.join(f)).unwrap();
        }
        m
    }

    /// Writes `pki`'s CA, client certificate and key as a new version and
    /// swaps `..data` to it atomically.
    fn update(&mut self, pki: &TlsFiles) {
        self.version += 1;
        let name = format!("..v{}", self.version);
        let version = self.dir.join(&name);
        std::fs::create_dir(&version).unwrap();
        for (f, from) in Self::FILES
            .iter()
            .zip([&pki.ca, &pki.client_cert, &pki.client_key])
        {
            std::fs::copy(from, version.join(f)).unwrap();
        }
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }

    fn path(&self, f: &str) -> String {
        self.dir.join(f).to_str().unwrap().to_string()
    }
}

/// A client of `etcd` trusting (and presenting) what `pki` holds now.
fn reader(etcd: &Etcd, pki: &TlsFiles) -> Client {
    let mut cfg = ClientConfig::new(etcd.endpoints());
    cfg.tls = Some({
        let mut c = TlsConfig::default();
        c.ca_file = Some(pki.ca.to_str().unwrap().into());
        c.cert_file = Some(pki.client_cert.to_str().unwrap().into());
        c.key_file = Some(pki.client_key.to_str().unwrap().into());
        c
    });
    cfg.request_timeout = Duration::from_secs(3);
    Client::connect(cfg).unwrap()
}

fn has(rt: &tokio::runtime::Runtime, c: &Client, key: &str) -> bool {
    rt.block_on(c.range(Range::key(key.to_string())))
        .is_ok_and(|r| !r.kvs().is_empty())
}

/// The replicator of region a, from the file `config` and with `src` as its
/// local etcd.
fn spawn(config: &str, src: &Etcd) -> Replicator {
    Replicator::spawn(&[
        format!("--config={config}"),
        format!("--local-etcd={}", src.endpoint()),
    ])
}

/// The replicator of region a, reading peer b's TLS files from `mount`
/// and re-reading them every second.
fn spawn_with_mount(dir: &Path, src: &Etcd, dst: &Etcd, mount: &SecretMount) -> Replicator {
    let config = write_file(
        dir,
        "a.toml",
        &format!(
            r#"
region = "a"
lease_ttl = "20s"
reload_interval = "1s"
[peers.b]
endpoints = ["{dst}"]
ca = "{ca}"
cert = "{cert}"
key = "{key}"
"#,
            dst = dst.endpoint(),
            ca = mount.path("ca.crt"),
            cert = mount.path("tls.crt"),
            key = mount.path("tls.key"),
        ),
    );
    spawn(&config, src)
}

/// A running replicator and a client of its local etcd.
struct Rig<'a> {
    rt: &'a tokio::runtime::Runtime,
    replica: &'a Replicator,
    src: Client,
}

impl Rig<'_> {
    /// Writes `key` = `value` to the local etcd and waits up to `secs` for
    /// `d`, a reader of the peer, to have it; `when` completes the failure
    /// message.
    #[track_caller]
    fn assert_mirrored(&self, d: &Client, key: &str, value: &str, secs: u64, when: &str) {
        let put = Put::new(key.to_string(), value.to_string());
        self.rt.block_on(self.src.put(put)).unwrap();
        assert!(
            wait_until(Duration::from_secs(secs), || has(self.rt, d, key)),
            "never mirrored{when}; log:\n{}",
            self.replica.log_text()
        );
    }
}

/// The reload counter says peer b's files were reloaded at least once.
#[track_caller]
fn assert_reloaded(replica: &Replicator) {
    let page = replica.scrape().unwrap_or_default();
    let reloads = metric(&page, "aether_replicator_reloads_total{peer=\"b\"}");
    assert!(reloads.is_some_and(|n| n >= 1.0), "{page}");
}

/// The replicator starts with the peer's files from CA1. While it runs, the
/// mounted files are replaced by ones from a new CA2 (client certificate
/// too), and the peer etcd restarts trusting and presenting CA2 only: the
/// replicator reaches the peer again, unrestarted, and says it reloaded.
#[test]
fn rotated_certificates_are_used_without_a_restart() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in_runtime = rt.enter();
    let pki = tempfile::tempdir().unwrap();
    // The peer's own files: rewritten in place with CA2 before its restart.
    let server = generate_mtls(&pki.path().join("server"));
    let src = Etcd::start();
    let mut dst = Etcd::builder().tls(server.clone()).start();
    let mut mount = SecretMount::new(&pki.path().join("mount"), &server);
    let replica = spawn_with_mount(pki.path(), &src, &dst, &mount);
    let rig = Rig {
        rt: &rt,
        replica: &replica,
        src: Client::connect(ClientConfig::new(src.endpoints())).unwrap(),
    };
    let d = reader(&dst, &server);
    let before = format!("{PREFIX}10.0.0.1");
    rig.assert_mirrored(&d, &before, "1", 30, " with CA1");

    // Rotation: a new CA, new server and client certificates.
    let ca2 = generate_mtls(&pki.path().join("ca2"));
    mount.update(&ca2);
    for (from, to) in [
        (&ca2.ca, &server.ca),
        (&ca2.ca_key, &server.ca_key),
        (&ca2.server_cert, &server.server_cert),
        (&ca2.server_key, &server.server_key),
        (&ca2.client_cert, &server.client_cert),
        (&ca2.client_key, &server.client_key),
    ] {
        std::fs::copy(from, to).unwrap();
    }
    dst.restart();
    let d = reader(&dst, &server);
    let after = format!("{PREFIX}10.0.0.2");
    rig.assert_mirrored(&d, &after, "2", 60, " after the rotation to CA2");
    assert!(has(&rt, &d, &before), "the earlier key is still there");
    assert_reloaded(&replica);
    assert!(
        replica.log_text().contains("reloaded rotated files"),
        "{}",
        replica.log_text()
    );
}

/// The expiry of each file in use shows as a gauge from the start. A
/// rotation to an expired client certificate is refused and counted, every
/// round while it lasts; the replicator keeps the files it has and keeps
/// mirroring. A good rotation after it is taken, and its expiry shows.
#[test]
fn an_expired_rotation_is_refused_and_counted_and_expiry_shows() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in_runtime = rt.enter();
    let pki = tempfile::tempdir().unwrap();
    let server = generate_mtls(&pki.path().join("server"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    const DAY: i64 = 86_400;
    // The client certificate in use expires in 20 days.
    let (cert, key) = server.issue_client_cert_valid("root", now - DAY, now + 20 * DAY);
    let mut current = server.clone();
    (current.client_cert, current.client_key) = (cert, key);
    let src = Etcd::start();
    let dst = Etcd::builder().tls(server.clone()).start();
    let mut mount = SecretMount::new(&pki.path().join("mount"), &current);
    let replica = spawn_with_mount(pki.path(), &src, &dst, &mount);
    let rig = Rig {
        rt: &rt,
        replica: &replica,
        src: Client::connect(ClientConfig::new(src.endpoints())).unwrap(),
    };
    let d = reader(&dst, &server);
    rig.assert_mirrored(&d, &format!("{PREFIX}10.0.0.1"), "1", 30, "");
    let file = mount.path("tls.crt");
    let expiry = |page: &str| {
        metric(
            page,
            &format!(
                "aether_replicator_certificate_expiry_timestamp_seconds{{peer=\"b\",file=\"{file}\"}}"
            ),
        )
    };
    let failures = |page: &str| metric(page, "aether_replicator_reload_failures_total{peer=\"b\"}");
    let page = replica.scrape().unwrap_or_default();
    assert_eq!(expiry(&page), Some((now + 20 * DAY) as f64), "{page}");
    assert_eq!(failures(&page), Some(0.0), "{page}");

    // Rotated to a certificate that expired yesterday: refused, counted
    // round after round, the gauge still on the files in use.
    let (cert, key) = server.issue_client_cert_valid("expired", now - 30 * DAY, now - DAY);
    (current.client_cert, current.client_key) = (cert, key);
    mount.update(&current);
    let mut page = String::new();
    assert!(
        wait_until(Duration::from_secs(20), || {
            page = replica.scrape().unwrap_or_default();
            failures(&page).is_some_and(|n| n >= 2.0)
        }),
        "the expired rotation was not counted twice: {page}"
    );
    assert_eq!(expiry(&page), Some((now + 20 * DAY) as f64), "{page}");
    rig.assert_mirrored(
        &d,
        &format!("{PREFIX}10.0.0.2"),
        "2",
        30,
        " with the old files kept",
    );
    assert!(
        replica.log_text().contains("expired on"),
        "{}",
        replica.log_text()
    );

    // A good rotation: taken, and its expiry shows.
    let (cert, key) = server.issue_client_cert_valid("root2", now - DAY, now + 90 * DAY);
    (current.client_cert, current.client_key) = (cert, key);
    mount.update(&current);
    assert!(
        wait_until(Duration::from_secs(20), || {
            page = replica.scrape().unwrap_or_default();
            expiry(&page) == Some((now + 90 * DAY) as f64)
        }),
        "the good rotation's expiry never showed: {page}"
    );
    rig.assert_mirrored(
        &d,
        &format!("{PREFIX}10.0.0.3"),
        "3",
        30,
        " after the good rotation",
    );
}

/// The peer's password changes in etcd and in the password file while the
/// replicator runs: it re-reads the file and carries on, unrestarted.
#[test]
fn a_rotated_password_file_is_used_without_a_restart() {
    use std::io::Write;
    use std::process::Stdio;

    let rt = tokio::runtime::Runtime::new().unwrap();
    let _in_runtime = rt.enter();
    let (src, dst) = (Etcd::start(), Etcd::start());
    dst.enable_root_auth("pw-one");
    let dir = tempfile::tempdir().unwrap();
    let pw = write_file(dir.path(), "password", "pw-one\n");
    let config = write_file(
        dir.path(),
        "a.toml",
        &format!(
            r#"
region = "a"
reload_interval = "1s"
[peers.b]
endpoints = ["{dst}"]
username = "root"
password_file = "{pw}"
"#,
            dst = dst.endpoint(),
        ),
    );
    let replica = spawn(&config, &src);
    let reader = |password: &str| {
        let mut cfg = dst.client_config_as("root", password);
        cfg.request_timeout = Duration::from_secs(3);
        Client::connect(cfg).unwrap()
    };
    let rig = Rig {
        rt: &rt,
        replica: &replica,
        src: Client::connect(ClientConfig::new(src.endpoints())).unwrap(),
    };
    let d = reader("pw-one");
    let before = format!("{PREFIX}10.0.1.1");
    rig.assert_mirrored(&d, &before, "1", 30, "");

    // Rotation: etcd first, then the file (by rename, as a Secret update).
    let mut passwd = common::etcdctl_command()
        .arg(format!("--endpoints={}", dst.endpoint()))
        .args([
            "--user=root:pw-one",
            "user",
            "passwd",
            "root",
            "--interactive=false",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    passwd.stdin.take().unwrap().write_all(b"pw-two\n").unwrap();
    assert!(passwd.wait().unwrap().success(), "etcdctl user passwd");
    let tmp = dir.path().join("password.tmp");
    std::fs::write(&tmp, "pw-two\n").unwrap();
    std::fs::rename(&tmp, &pw).unwrap();

    let d = reader("pw-two");
    let after = format!("{PREFIX}10.0.1.2");
    rig.assert_mirrored(&d, &after, "2", 60, " after the password rotation");
    assert_reloaded(&replica);
}
