//! The real-etcd test scene of this workspace: etcd processes owned by a
//! test, fault proxies in front of them, throw-away TLS material, and the
//! one way a test waits for something to happen.
//!
//! Not published. The client's integration tests
//! (`crates/aether-etcd/tests/`) and the root crate's (through
//! `tests/common`, which re-exports this crate's items under the names
//! they have always had) use it; it knows nothing of the mirror engine.
//!
//! Everything binds to 127.0.0.1 only, on ports picked free at start, so
//! tests run in parallel (under nextest, one process each). Every process
//! a test starts is stopped by its pid when its owner is dropped, and a
//! watchdog kills it if the test process dies without running destructors.
//! Without an etcd binary (`etcd` on `PATH`, or `ETCD_BIN`), starting one
//! panics with the command that installs it.
//!
//! # Layout
//!
//! * [`etcd`]: [`Etcd`], a single-member etcd on free loopback ports with
//!   its own temp dir ([`EtcdBuilder`] for TLS, flags, a data dir, a
//!   name); [`Cluster`], several members bootstrapped as one cluster;
//!   [`etcdctl_command`].
//! * [`proxy`]: [`FaultProxy`], a TCP proxy that cuts, black-holes,
//!   delays and throttles a client's connections.
//! * [`round_trips`]: [`RoundTrips`], a [`FaultProxy`]'s count of the
//!   round trips a client waited for in a row.
//! * [`peer_proxy`]: [`PeerProxy`], which cuts an etcd member from its
//!   quorum.
//! * [`tls`]: [`generate_tls`] / [`generate_mtls`], a CA with server and
//!   client certificates ([`TlsFiles`]).
//! * [`eventually`](mod@eventually): [`eventually()`], the wait that says
//!   what it last saw when it gives up, and [`wait_until`] /
//!   [`wait_until_async`], its forms for a plain condition.
//! * This page: [`init_logging`] and [`write_file`].

pub mod etcd;
pub mod eventually;
pub mod peer_proxy;
pub mod proxy;
pub mod round_trips;
pub mod tls;

pub use etcd::{Cluster, Etcd, EtcdBuilder, etcdctl_command};
pub use eventually::{Eventually, Outcome, TimedOut, eventually, wait_until, wait_until_async};
pub use peer_proxy::PeerProxy;
pub use proxy::FaultProxy;
pub use round_trips::RoundTrips;
pub use tls::{TlsFiles, generate_mtls, generate_tls};

/// With `RUST_LOG` set, the libraries' tracing goes to the test's captured
/// output, so a failing run shows what the client or engine was doing.
/// Called by every [`Etcd`] and [`Cluster`] start; idempotent.
pub fn init_logging() {
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
pub fn write_file(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}
