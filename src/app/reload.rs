//! Certificate and password rotation without a restart.
//!
//! Every `reload_interval` (10 s by default) the reloader re-reads, for the
//! local etcd and each peer, the TLS files (CA, certificate, key) named in
//! its client config and the password file named in the config, and hands
//! what changed to the client: [`Client::reload_tls`] (new connections use
//! the new files) and [`Client::set_credentials`] (the next call
//! authenticates with the new password).
//!
//! It compares file *contents*, not file events: Kubernetes updates a
//! mounted Secret by swapping a `..data` symlink atomically, which inotify
//! on the visible file names does not report, and polling a few small files
//! every few seconds costs nothing. A file caught half-written, or a
//! certificate and key that do not match yet, fails this round (logged at
//! warn) and is read again on the next; the client keeps what it had.
//!
//! One owner: the reloader holds the clients only while the replicator
//! runs. It stops when the replicator's cancel token fires (on shutdown,
//! or when [`super::run`] returns for any reason), and drops them then.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::certs::{self, FileExpiry};
use super::config::{PasswordFile, read_password};
use crate::etcd::{Client, Credentials};

/// Reloads done and refused, and when each TLS file expires, by etcd: the
/// label `peer` is the peer's region, or this region's name for the local
/// etcd (no peer can have it).
#[derive(Debug, Default)]
pub struct ReloadCounts {
    done: Mutex<BTreeMap<String, u64>>,
    failed: Mutex<BTreeMap<String, u64>>,
    /// (peer, file) -> Unix seconds.
    expiry: Mutex<BTreeMap<(String, String), i64>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ReloadCounts {
    /// Counts one reload for `peer`.
    pub fn add(&self, peer: &str) {
        *lock(&self.done).entry(peer.to_string()).or_default() += 1;
    }

    /// Counts one refused round for `peer`.
    pub fn fail(&self, peer: &str) {
        *lock(&self.failed).entry(peer.to_string()).or_default() += 1;
    }

    /// Records when `peer`'s TLS files expire, replacing what it had.
    pub fn set_expiry(&self, peer: &str, files: &[FileExpiry]) {
        let mut m = lock(&self.expiry);
        m.retain(|(p, _), _| p != peer);
        for f in files {
            m.insert((peer.to_string(), f.file.clone()), f.not_after);
        }
    }

    /// Reloads so far, by peer (every watched etcd, zero included).
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        lock(&self.done).clone()
    }

    /// Refused rounds so far, by peer (every watched etcd, zero included).
    pub fn failures(&self) -> BTreeMap<String, u64> {
        lock(&self.failed).clone()
    }

    /// When each TLS file expires, by (peer, file), in Unix seconds.
    pub fn expiries(&self) -> BTreeMap<(String, String), i64> {
        lock(&self.expiry).clone()
    }

    /// Makes `peer` show (at zero) before its first reload.
    fn register(&self, peer: &str) {
        lock(&self.done).entry(peer.to_string()).or_default();
        lock(&self.failed).entry(peer.to_string()).or_default();
    }
}

/// One etcd whose files are watched.
pub struct Target {
    /// The metrics label: the peer's region, or this region for the local
    /// etcd.
    pub name: String,
    /// The client to update.
    pub client: Client,
    /// Where its password comes from, if from a file.
    pub password_file: Option<PasswordFile>,
    /// The password last handed to the client.
    last_password: Option<String>,
    /// The last problem logged, so that a file that stays bad is logged
    /// once (and counted every round).
    last_problem: Option<String>,
}

// By hand: the password stays out of logs and panic messages.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("client", &self.client)
            .field("password_file", &self.password_file)
            .field("has_password", &self.last_password.is_some())
            .field("last_problem", &self.last_problem)
            .finish()
    }
}

impl Target {
    /// A target whose client was built with `password` (read from
    /// `password_file` at validation).
    pub fn new(
        name: impl Into<String>,
        client: Client,
        password_file: Option<PasswordFile>,
    ) -> Target {
        let last_password = client
            .config()
            .credentials
            .as_ref()
            .map(|c| c.password.clone());
        Target {
            name: name.into(),
            client,
            password_file,
            last_password,
            last_problem: None,
        }
    }

    /// Checks the TLS files in use and records when they expire. At
    /// start-up, whether or not anything is reloaded later.
    pub fn record_expiry(&self, counts: &ReloadCounts) {
        if let Some(tls) = &self.client.config().tls
            && let Ok(files) = certs::check(tls, std::time::SystemTime::now())
        {
            counts.set_expiry(&self.name, &files);
        }
    }

    /// Counts a refused round and logs it, once while it stays the same.
    fn refuse(&mut self, counts: &ReloadCounts, what: &str, problem: String) {
        counts.fail(&self.name);
        if self.last_problem.as_ref() != Some(&problem) {
            tracing::warn!(
                peer = %self.name,
                error = %problem,
                "{what} could not be reloaded; keeping the ones in use"
            );
            self.last_problem = Some(problem);
        }
    }

    /// Whether there is anything to watch.
    fn watches_anything(&self) -> bool {
        self.client.config().tls.is_some() || self.password_file.is_some()
    }

    /// One round: re-reads the files, updates the client. Returns what was
    /// reloaded ("tls", "password"); a refusal is counted in `counts`.
    ///
    /// TLS files are checked first ([`certs::check`]): an expired or not
    /// yet valid certificate, or a key of another certificate, is not
    /// handed to the client, which keeps the files it has.
    fn check(&mut self, counts: &ReloadCounts) -> Vec<&'static str> {
        let mut done = Vec::new();
        let mut problem = None;
        if let Some(tls) = self.client.config().tls.clone() {
            match certs::check(&tls, std::time::SystemTime::now()) {
                Err((field, why)) => problem = Some(format!("{field}: {why}")),
                Ok(files) => match self.client.reload_tls() {
                    Ok(changed) => {
                        counts.set_expiry(&self.name, &files);
                        if changed {
                            done.push("tls");
                        }
                    }
                    Err(e) => problem = Some(e.to_string()),
                },
            }
        }
        let mut refused = problem.is_some();
        if let Some(p) = problem {
            self.refuse(counts, "TLS files", p);
        }
        if let Some(file) = self.password_file.clone() {
            match read_password(&file.path) {
                Ok(password) if self.last_password.as_ref() != Some(&password) => {
                    self.client.set_credentials(Some(Credentials {
                        user: file.user.clone(),
                        password: password.clone(),
                    }));
                    self.last_password = Some(password);
                    done.push("password");
                }
                Ok(_) => {}
                Err(e) => {
                    refused = true;
                    self.refuse(counts, "the password file", format!("{:?}: {e}", file.path));
                }
            }
        }
        if !refused {
            self.last_problem = None;
        }
        done
    }
}

/// Re-reads every target's files each `interval` until `cancel` fires,
/// counting reloads in `counts`. Returns at once when no target has TLS or
/// a password file.
pub async fn run(
    mut targets: Vec<Target>,
    interval: Duration,
    counts: std::sync::Arc<ReloadCounts>,
    cancel: CancellationToken,
) {
    targets.retain(Target::watches_anything);
    if targets.is_empty() {
        return;
    }
    for t in &targets {
        counts.register(&t.name);
    }
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; the files were read at start-up.
    tick.tick().await;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        for t in &mut targets {
            let done = t.check(&counts);
            if !done.is_empty() {
                tracing::info!(peer = %t.name, reloaded = ?done, "reloaded rotated files");
                counts.add(&t.name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::ClientConfig;

    #[tokio::test]
    async fn a_rotated_password_file_is_handed_to_the_client() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "one\n").unwrap();
        let path = path.to_str().unwrap().to_string();
        let mut cfg = ClientConfig::new(["http://127.0.0.1:1"]);
        cfg.credentials = Some(Credentials {
            user: "u".into(),
            password: "one".into(),
        });
        let client = Client::connect(cfg).unwrap();
        let file = PasswordFile {
            user: "u".into(),
            path: path.clone(),
        };
        let mut t = Target::new("b", client, Some(file));
        let counts = ReloadCounts::default();
        assert!(t.check(&counts).is_empty(), "nothing changed yet");
        // Rotation by rename, as an atomic writer does.
        let tmp = dir.path().join("pw.tmp");
        std::fs::write(&tmp, "two").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert_eq!(t.check(&counts), ["password"]);
        assert_eq!(t.last_password.as_deref(), Some("two"));
        assert!(t.check(&counts).is_empty(), "reloaded once");
        assert!(counts.failures().is_empty());
        // A missing file keeps the password in use, and every round that
        // finds it missing is counted.
        std::fs::remove_file(&path).unwrap();
        assert!(t.check(&counts).is_empty());
        assert!(t.check(&counts).is_empty());
        assert_eq!(t.last_password.as_deref(), Some("two"));
        assert_eq!(counts.failures().get("b"), Some(&2));
    }

    /// A rotation to an expired certificate, or to a key of another
    /// certificate, is refused and counted; the expiry gauge keeps the
    /// files in use. A good rotation is taken, and its expiry shows.
    #[tokio::test]
    async fn a_bad_certificate_rotation_is_refused_and_counted() {
        use std::time::SystemTime;
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let write = |from: i64, to: i64| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
            let at = |t| {
                x509_parser::time::ASN1Time::from_timestamp(t)
                    .unwrap()
                    .to_datetime()
            };
            params.not_before = at(from);
            params.not_after = at(to);
            (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
        };
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (c, k) = write(now - 60, now + 86_400);
        std::fs::write(&cert, &c).unwrap();
        std::fs::write(&key, &k).unwrap();
        let mut cfg = ClientConfig::new(["https://127.0.0.1:1"]);
        cfg.tls = Some(
            crate::etcd::TlsConfig::new()
                .with_ca_file(cert.to_str().unwrap())
                .with_client_files(cert.to_str().unwrap(), key.to_str().unwrap()),
        );
        let client = Client::connect(cfg).unwrap();
        let mut t = Target::new("b", client, None);
        let counts = ReloadCounts::default();
        t.record_expiry(&counts);
        let expiry = |c: &ReloadCounts| {
            c.expiries()
                .into_iter()
                .map(|((p, _), v)| (p, v))
                .collect::<Vec<_>>()
        };
        // One file serves as CA and certificate here: one series.
        let day = vec![("b".to_string(), now + 86_400)];
        assert_eq!(expiry(&counts), day);
        assert!(t.check(&counts).is_empty(), "nothing changed yet");

        // Expired: refused, counted, the gauge unchanged.
        let (old, old_key) = write(now - 10 * 86_400, now - 86_400);
        std::fs::write(&cert, &old).unwrap();
        std::fs::write(&key, &old_key).unwrap();
        assert!(t.check(&counts).is_empty());
        assert_eq!(counts.failures().get("b"), Some(&1));
        assert_eq!(
            t.last_problem.as_deref().map(|p| p.starts_with("ca: ")),
            Some(true)
        );
        assert_eq!(expiry(&counts), day);

        // A valid certificate with the key of another one: refused too.
        let (fresh, _) = write(now - 60, now + 30 * 86_400);
        std::fs::write(&cert, &fresh).unwrap();
        std::fs::write(&key, &k).unwrap();
        assert!(t.check(&counts).is_empty());
        assert_eq!(counts.failures().get("b"), Some(&2));
        assert!(
            t.last_problem
                .as_deref()
                .unwrap()
                .contains("does not match"),
            "{:?}",
            t.last_problem
        );

        // Its own key: taken, and the new expiry shows.
        let (fresh, fresh_key) = write(now - 60, now + 30 * 86_400);
        std::fs::write(&cert, &fresh).unwrap();
        std::fs::write(&key, &fresh_key).unwrap();
        assert_eq!(t.check(&counts), ["tls"]);
        assert_eq!(counts.failures().get("b"), Some(&2));
        assert_eq!(t.last_problem, None);
        assert_eq!(expiry(&counts), vec![("b".to_string(), now + 30 * 86_400)]);
    }

    #[tokio::test]
    async fn nothing_to_watch_ends_at_once() {
        let client = Client::connect(ClientConfig::new(["http://127.0.0.1:1"])).unwrap();
        let counts = std::sync::Arc::new(ReloadCounts::default());
        tokio::time::timeout(
            Duration::from_secs(5),
            run(
                vec![Target::new("b", client, None)],
                Duration::from_millis(10),
                counts.clone(),
                CancellationToken::new(),
            ),
        )
        .await
        .expect("returns at once");
        assert!(counts.snapshot().is_empty());
    }
}
