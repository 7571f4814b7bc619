#![allow(dead_code)]
#![allow(unused_imports)]
//! Shared integration-test harness.
//!
//! Include from an integration test with `mod common;`.
//!
//! * [`etcd::Etcd`]: a real single-member etcd on free loopback ports, owned by
//!   the test (killed and its temp dir removed on drop).
//! * [`tls::generate_tls`]: a throw-away CA plus server and client certificates.
//! * [`proxy::FaultProxy`]: a loopback TCP proxy that can cut, black-hole,
//!   delay and throttle traffic.
//!
//! Everything binds to 127.0.0.1 only.

pub mod etcd;
pub mod mirror;
pub mod proxy;
pub mod replicator;
pub mod tls;

use std::time::{Duration, Instant};

pub use etcd::{Etcd, EtcdBuilder, etcdctl_command};
pub use proxy::FaultProxy;
pub use tls::{TlsFiles, generate_mtls, generate_tls};

/// Polls `cond` every 20ms until it returns true or `timeout` elapses.
/// Returns whether the condition became true. Blocking: do not use it on a
/// current-thread runtime while async tasks (e.g. a [`FaultProxy`]) must run;
/// use [`wait_until_async`] there.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
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
pub async fn wait_until_async(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
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
