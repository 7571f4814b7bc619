//! aether-replicator: an etcd v3 client and a mirror that replicates a
//! service mesh's endpoint registry between regions.
//!
//! # Layout
//! - [`etcd`]: the client, which is its own crate, `aether-etcd`
//!   (`crates/aether-etcd`), re-exported here. It depends on nothing in
//!   this crate; depend on `aether-etcd` to get the client alone.
//! - [`schema`]: the origin-first key layout of the endpoint registry.
//! - [`store`]: the narrow interface between the engine and an etcd:
//!   the calls the engine makes, which the client implements.
//! - [`mirror`]: the engine that mirrors one region's subtree into every
//!   peer region's etcd under an origin-heartbeat lease.
//! - [`view`]: the consumer side: a live, merged, locality-ranked view of
//!   the registry in one region's etcd.
//! - [`error`]: the error type above the client.
//! - `app` (feature `app`, on by default): the replicator binary's
//!   config, leader election, metrics and `run`. Hidden from these docs
//!   and not part of the library's API: it is public only for the binary
//!   and the tests.

// Public only so that the binary (src/main.rs) and the integration tests
// reach it; hidden from the docs and outside the semver promise. Library
// users want `etcd` (the `aether-etcd` crate), `mirror`, `view` and `schema`.
#[cfg(feature = "app")]
#[doc(hidden)]
pub mod app;
pub mod error;
pub use aether_etcd as etcd;
pub mod mirror;
pub mod schema;
pub mod store;
pub mod view;

pub use error::{Error, Result};

// The README's Rust examples are compiled as doc tests, so they stay true
// to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
