//! The replicator's command line, and its validation into a [`Config`].
//!
//! ```text
//! aether-replicator [FLAGS]            run the replicator
//! aether-replicator check [FLAGS]      compare once and exit
//! aether-replicator endpoints [FLAGS]  print (or --watch) the merged registry
//! aether-replicator migrate [FLAGS]    move the legacy flat layout to v1 keys
//! ```
//!
//! `endpoints` ([`EndpointsArgs`]) and `migrate` ([`MigrateArgs`]) talk to
//! the local etcd only and take its flags as a run does ([`LocalEtcdArgs`]).
//! A run and `check` take the same flags ([`RunArgs`]), which go after the
//! subcommand:
//!
//! - `--region <name>` (required): the region this replicator mirrors.
//! - `--local-etcd <url>[,<url>...]`: this region's etcd, with
//!   `--local-ca`, `--local-cert`, `--local-key`, `--local-server-name`,
//!   `--local-user` and `--local-password` for its TLS and auth.
//! - `--peer-etcd <region>=<url>[,<url>...]`, once per peer region, with
//!   per peer `--peer-tls <region>=ca=<path>,cert=<path>,key=<path>,server-name=<name>`
//!   (any subset) and `--peer-auth <region>=<user>:<password>`.
//! - Mirror tuning: `--lease-ttl`, `--election-ttl`, `--max-txn-ops`,
//!   `--max-request-bytes`, `--max-inflight`, `--page-size`, `--root`.
//! - Process: `--metrics-addr`, `--log-format`.
//!
//! TLS and auth are per peer because regions are separate trust domains:
//! each region's etcd has its own CA, its own client certificates and its own
//! users, and one region's credentials must not be offered to another.
//! The client has no system roots, so an `https://` endpoint needs a CA.
//!
//! Every flag can also be set from the environment as
//! `AETHER_REPLICATOR_<FLAG>`, the long name in upper snake case
//! (`--peer-etcd` is `AETHER_REPLICATOR_PEER_ETCD`). A flag on the command
//! line wins over its variable. The repeatable flags (`--peer-etcd`,
//! `--peer-tls`, `--peer-auth`) split a value on `;`, so one variable can
//! hold several peers: `AETHER_REPLICATOR_PEER_ETCD='b=http://b:2379;c=http://c:2379'`.
//! Passwords are best given through the environment
//! (`AETHER_REPLICATOR_LOCAL_PASSWORD`, `AETHER_REPLICATOR_PEER_AUTH`),
//! which `--help` does not print.
//!
//! clap checks the syntax (a missing `--region`, a number that is not one);
//! [`RunArgs::validate`] checks everything else and names the flag at fault
//! in a one-line [`ConfigError`].
//!
//! The module is split by concern: `args` defines the flags (clap),
//! `validate` turns them into the settings the program runs with, and
//! the general-purpose parsers they use (durations, byte sizes, URLs, PEM
//! files, peer specs) live in [`crate::app::parse`].

mod args;
mod validate;

pub use args::{
    CheckArgs, Cli, Command, EndpointsArgs, LocalEtcdArgs, LogFormat, MigrateArgs, RunArgs, Secret,
};
pub use validate::{Config, ConfigError, EndpointsConfig, MigrateConfig};

use crate::etcd::DEFAULT_MAX_ENCODING_MESSAGE_SIZE;

/// Prefix of every flag's environment variable.
pub const ENV_PREFIX: &str = "AETHER_REPLICATOR_";
/// Smallest `--max-txn-ops`.
pub const MIN_MAX_TXN_OPS: usize = 2;
/// Smallest `--max-request-bytes`.
pub const MIN_MAX_REQUEST_BYTES: usize = 4096;
/// Largest `--max-request-bytes`: the client's largest outgoing message.
pub const MAX_MAX_REQUEST_BYTES: usize = DEFAULT_MAX_ENCODING_MESSAGE_SIZE;
/// Largest lease TTL etcd grants, in seconds (etcd's `MaxLeaseTTL`).
pub const MAX_LEASE_TTL_SECS: u64 = 9_000_000_000;

#[cfg(test)]
mod tests;
