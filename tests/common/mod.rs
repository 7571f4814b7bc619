#![allow(dead_code)]
#![allow(unused_imports)]
//! Shared integration-test harness.
//!
//! Include from an integration test with `mod common;`.
//!
//! * [`etcd::Etcd`]: a real single-member etcd on free loopback ports, owned by
//!   the test (killed and its temp dir removed on drop).
//! * [`etcd::Cluster`]: several such members bootstrapped as one cluster.
//! * [`tls::generate_tls`]: a throw-away CA plus server and client certificates.
//! * [`proxy::FaultProxy`]: a loopback TCP proxy that can cut, black-hole,
//!   delay and throttle traffic, and count a client's round trips in a row
//!   ([`round_trips::RoundTrips`]).
//! * [`peer_proxy::PeerProxy`]: cuts etcd members from their quorum.
//!
//! Everything binds to 127.0.0.1 only.

pub(crate) mod etcd;
pub(crate) mod keys;
pub(crate) mod mirror;
pub(crate) mod peer_proxy;
pub(crate) mod proxy;
pub(crate) mod replicator;
pub(crate) mod round_trips;
pub(crate) mod tls;

use std::time::{Duration, Instant};

pub(crate) use etcd::{Cluster, Etcd, EtcdBuilder, etcdctl_command};
pub(crate) use proxy::FaultProxy;
pub(crate) use tls::{TlsFiles, generate_mtls, generate_tls};

/// With `RUST_LOG` set, the library's tracing goes to the test's captured
/// output, so a failing run shows what the engine was doing.
pub(crate) fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
    });
}

/// Writes `text` to the file `name` in `dir` and returns its path.
pub(crate) fn write_file(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// Polls `cond` every 20ms until it returns true or `timeout` elapses.
/// Returns whether the condition became true. Blocking: do not use it on a
/// current-thread runtime while async tasks (e.g. a [`FaultProxy`]) must run;
/// use [`wait_until_async`] there.
pub(crate) fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Async version of [`wait_until`]: polls `cond` every 20ms (yielding to the
/// runtime in between) until it returns true or `timeout` elapses.
pub(crate) async fn wait_until_async(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
