//! The replicator application: what the `aether-replicator` binary runs.
//!
//! - [`config`]: the command line, validated into a [`config::Config`].
//! - [`election`]: leader election among one region's replicas.
//! - [`metrics`]: `/metrics`, `/healthz` and `/readyz`.
//! - [`replicator`]: [`run`], which ties them to the mirror engine.
//! - [`check`]: the one-shot comparison behind `aether-replicator check`.
//!
//! Behind the default `app` feature, so the client and the engine can be
//! used without clap and the HTTP server.

pub mod check;
pub mod config;
pub mod election;
pub mod metrics;
pub mod replicator;

pub use replicator::run;
