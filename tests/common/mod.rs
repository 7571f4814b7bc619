#![allow(dead_code)]
#![allow(unused_imports)]
//! Shared integration-test harness.
//!
//! Include from an integration test with `mod common;`.
//!
//! The real-etcd scene is the workspace's test kit (`crates/test-kit`),
//! re-exported here under the names the tests have always used:
//!
//! * [`etcd::Etcd`]: a real single-member etcd on free loopback ports, owned by
//!   the test (killed and its temp dir removed on drop).
//! * [`etcd::Cluster`]: several such members bootstrapped as one cluster.
//! * [`tls::generate_tls`]: a throw-away CA plus server and client certificates.
//! * [`proxy::FaultProxy`]: a loopback TCP proxy that can cut, black-hole,
//!   delay and throttle traffic, and count a client's round trips in a row
//!   ([`round_trips::RoundTrips`]).
//! * [`peer_proxy::PeerProxy`]: cuts etcd members from their quorum.
//! * [`eventually`]: the wait that says what it last saw when it gives up.
//!
//! What needs the engine stays here: [`mirror`] (the mirror scene),
//! [`replicator`] (the binary as a process), and [`keys`].
//!
//! Everything binds to 127.0.0.1 only.

pub(crate) mod keys;
pub(crate) mod mirror;
pub(crate) mod replicator;

pub(crate) use aether_test_kit::{
    Cluster, Etcd, EtcdBuilder, Eventually, FaultProxy, PeerProxy, RoundTrips, TlsFiles,
    etcdctl_command, eventually, generate_mtls, generate_tls, init_logging, wait_until,
    wait_until_async, write_file,
};
pub(crate) use aether_test_kit::{etcd, peer_proxy, proxy, round_trips, tls};
