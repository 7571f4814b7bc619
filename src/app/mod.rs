//! The replicator application: what the `aether-replicator` binary runs.
//!
//! - [`config`]: the command line, validated into a [`config::Config`].
//! - [`parse`]: the parsers behind it (durations, byte sizes, URLs, PEM
//!   files, peer specs).
//! - [`election`]: leader election among one region's replicas.
//! - [`metrics`]: `/metrics`, `/healthz` and `/readyz`; [`process`]: the
//!   `process_*` metrics.
//! - [`certs`]: certificates valid now, keys that match them, and when
//!   each TLS file expires.
//! - [`reload`]: re-reads rotated TLS and password files while running.
//! - [`incoming`]: every replica follows the copies other regions mirror
//!   into the local etcd.
//! - [`replicator`]: [`run`], which ties them to the mirror engine.
//! - [`check`]: the one-shot comparison behind `aether-replicator check`.
//! - [`endpoints`]: `aether-replicator endpoints`, the merged registry as
//!   one region's consumers see it.
//! - [`status`]: `aether-replicator status`, the region's leader and its
//!   copies on the peers, as a table or JSON, exit 1 when unhealthy.
//! - [`migrate`]: `aether-replicator migrate`, the cutover from the legacy
//!   flat layout.
//! - [`setup_auth`]: `aether-replicator setup-auth`, the least-privilege
//!   etcd users and roles the replicator needs, printed or applied.
//!
//! Behind the default `app` feature, so the client and the engine can be
//! used without clap and the HTTP server.

pub mod certs;
pub mod check;
pub mod config;
pub mod election;
pub mod endpoints;
pub mod incoming;
pub mod metrics;
pub mod migrate;
pub mod parse;
pub mod process;
pub mod reload;
pub mod replicator;
pub mod setup_auth;
pub mod status;

pub use replicator::run;
