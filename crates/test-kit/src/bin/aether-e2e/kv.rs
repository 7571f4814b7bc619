//! Reads and writes of the regions' etcds with `etcdctl` (15 s at most per
//! call), and what the checks compare: a subtree's digest, its key count,
//! how many of its keys are on a lease.

use std::hash::{DefaultHasher, Hash, Hasher};

use crate::state::{KEY_ROOT, Mesh};

pub(crate) fn prefix_of(r: &str) -> String {
    format!("{KEY_ROOT}{r}/")
}

pub(crate) fn endpoint_key(r: &str, svc: &str, ip: &str) -> String {
    format!("{KEY_ROOT}{r}/clusters/c1/services/{svc}/protocols/http/endpoints/{ip}")
}

pub(crate) fn endpoint_value(r: &str, zone: &str, port: u16, extra: &str) -> String {
    format!(r#"{{"clusterName":"c1","region":"{r}","zone":"{zone}","port":{port}{extra}}}"#)
}

impl Mesh {
    /// `etcdctl ARGS` against `e`'s etcd: its stdout if it exits 0.
    pub(crate) fn ectl(&self, e: &str, args: &[&str]) -> Option<String> {
        let mut a = vec![
            format!("--endpoints={}", self.etcd_url(e)),
            "--dial-timeout=2s".into(),
            "--command-timeout=5s".into(),
        ];
        a.extend(args.iter().map(|s| s.to_string()));
        let out = crate::procs::run_timeout(15, "etcdctl", &a)?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub(crate) fn put(&self, step: &str, r: &str, key: &str, value: &str) {
        if self.ectl(r, &["put", key, value]).is_none() {
            self.fail(step, &format!("put {key} in {r}'s etcd failed"));
        }
    }

    pub(crate) fn del(&self, step: &str, r: &str, key: &str) {
        if self.ectl(r, &["del", key]).is_none() {
            self.fail(step, &format!("delete {key} in {r}'s etcd failed"));
        }
    }

    /// A short digest of R's subtree (keys and values) as stored in E's etcd.
    pub(crate) fn digest(&self, e: &str, r: &str) -> String {
        match self.ectl(e, &["get", "--prefix", &prefix_of(r)]) {
            Some(out) => {
                let mut h = DefaultHasher::new();
                out.hash(&mut h);
                format!("{:016x}", h.finish())
            }
            None => "unreadable".into(),
        }
    }

    /// How many keys of R's subtree E's etcd holds ("?" if unreadable).
    pub(crate) fn count_keys(&self, e: &str, r: &str) -> String {
        match self.ectl(e, &["get", "--prefix", "--keys-only", &prefix_of(r)]) {
            Some(out) => out
                .lines()
                .filter(|l| !l.trim().is_empty())
                .count()
                .to_string(),
            None => "?".into(),
        }
    }

    /// `(keys, keys without a lease)` of R's subtree in E's etcd.
    pub(crate) fn leased(&self, e: &str, r: &str) -> Option<(usize, usize)> {
        let out = self.ectl(e, &["get", "--prefix", &prefix_of(r), "-w", "json"])?;
        let v: serde_json::Value = serde_json::from_str(&out).ok()?;
        let kvs = v
            .get("kvs")
            .and_then(|k| k.as_array())
            .cloned()
            .unwrap_or_default();
        let unleased = kvs
            .iter()
            .filter(|kv| {
                kv.get("lease")
                    .and_then(serde_json::Value::as_i64)
                    .unwrap_or(0)
                    == 0
            })
            .count();
        Some((kvs.len(), unleased))
    }

    pub(crate) fn value_in(&self, e: &str, key: &str) -> String {
        match self.ectl(e, &["get", key, "--print-value-only"]) {
            Some(v) => v.trim_end_matches('\n').to_string(),
            None => "<unreadable>".into(),
        }
    }

    /// Every peer holds R's subtree exactly, on a lease; else why not.
    pub(crate) fn mirrored(&self, r: &str) -> Result<(), String> {
        let src = self.digest(r, r);
        for p in self.peers_of(r) {
            if self.digest(&p, r) != src {
                return Err(format!(
                    "{p}'s copy of {r} differs from the source ({} vs {} keys)",
                    self.count_keys(&p, r),
                    self.count_keys(r, r)
                ));
            }
            match self.leased(&p, r) {
                Some((_, 0)) => {}
                Some((n, un)) => {
                    return Err(format!(
                        "{p}'s copy of {r}: {un} of {n} keys without a lease"
                    ));
                }
                None => return Err(format!("{p}'s copy of {r}: unreadable")),
            }
        }
        Ok(())
    }

    /// Polls `mirrored` for each region until all hold, or fails STEP.
    pub(crate) fn wait_mirrored(&self, step: &str, secs: u64, regions: &[String]) {
        let why = poll(secs, 100, || {
            regions.iter().try_for_each(|r| self.mirrored(r))
        });
        if let Err(why) = why {
            self.fail(step, &format!("not converged after {secs}s: {why}"));
        }
    }
}

/// Runs `f` every `interval_ms` until it succeeds or `secs` have passed;
/// then its last error.
pub(crate) fn poll<E>(
    secs: u64,
    interval_ms: u64,
    mut f: impl FnMut() -> Result<(), E>,
) -> Result<(), E> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        match f() {
            Ok(()) => return Ok(()),
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(interval_ms)),
        }
    }
}
