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

use super::config::{PasswordFile, read_password};
use crate::etcd::{Client, Credentials};

/// Reloads done, by etcd: the label `peer` is the peer's region, or this
/// region's name for the local etcd (no peer can have it).
#[derive(Debug, Default)]
pub struct ReloadCounts(Mutex<BTreeMap<String, u64>>);

impl ReloadCounts {
    /// Counts one reload for `peer`.
    pub fn add(&self, peer: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(peer.to_string()).or_default() += 1;
    }

    /// Reloads so far, by peer (every watched etcd, zero included).
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes `peer` show (at zero) before its first reload.
    fn register(&self, peer: &str) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(peer.to_string()).or_default();
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
        }
    }

    /// Whether there is anything to watch.
    fn watches_anything(&self) -> bool {
        self.client.config().tls.is_some() || self.password_file.is_some()
    }

    /// One round: re-reads the files, updates the client. Returns what was
    /// reloaded ("tls", "password").
    fn check(&mut self) -> Vec<&'static str> {
        let mut done = Vec::new();
        match self.client.reload_tls() {
            Ok(true) => done.push("tls"),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                peer = %self.name,
                error = %e,
                "TLS files could not be reloaded; keeping the ones in use"
            ),
        }
        if let Some(file) = &self.password_file {
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
                Err(e) => tracing::warn!(
                    peer = %self.name,
                    path = %file.path,
                    error = %e,
                    "password file could not be read; keeping the password in use"
                ),
            }
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
            let done = t.check();
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
        assert!(t.check().is_empty(), "nothing changed yet");
        // Rotation by rename, as an atomic writer does.
        let tmp = dir.path().join("pw.tmp");
        std::fs::write(&tmp, "two").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        assert_eq!(t.check(), ["password"]);
        assert_eq!(t.last_password.as_deref(), Some("two"));
        assert!(t.check().is_empty(), "reloaded once");
        // A missing file keeps the password in use.
        std::fs::remove_file(&path).unwrap();
        assert!(t.check().is_empty());
        assert_eq!(t.last_password.as_deref(), Some("two"));
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
