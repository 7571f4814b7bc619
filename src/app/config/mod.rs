//! The replicator's command line, and its validation into a [`Config`].
//!
//! ```text
//! aether-replicator [FLAGS]            run the replicator
//! aether-replicator check [FLAGS]      compare once and exit
//! aether-replicator endpoints [FLAGS]  print (or --watch) the merged registry
//! aether-replicator migrate [FLAGS]    move the legacy flat layout to v1 keys
//! aether-replicator status [FLAGS]     the region's leader and its copies; exit 1 if unhealthy
//! aether-replicator setup-auth [FLAGS] the etcd users and roles the replicator needs (print, or --apply)
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
//!   `--local-user` and `--local-password-file` for its TLS and auth.
//! - `--peer-etcd <region>=<url>[,<url>...]`, once per peer region, with
//!   per peer `--peer-tls <region>=ca=<path>,cert=<path>,key=<path>,server-name=<name>`
//!   (any subset) and `--peer-auth <region>=<user>:@<password-file>`.
//! - Mirror tuning: `--lease-ttl`, `--election-ttl`, `--max-txn-ops`,
//!   `--max-request-bytes`, `--max-inflight`, `--page-size`, `--root`.
//! - Process: `--metrics-addr`, `--log-format`, `--replica-id`,
//!   `--reload-interval`.
//! - `--config <path>`: a TOML file holding any of the above (see below).
//! - `--check-config` (before any subcommand): validate exactly as a run
//!   would, print `config ok: region <r>, <n> peers` and exit 0, or the
//!   one-line error and exit 2, connecting to nothing.
//!
//! # The config file
//!
//! `--config PATH` (or `AETHER_REPLICATOR_CONFIG`) names a TOML file whose
//! keys are the long flag names in snake_case, with a `[local]` table and
//! one `[peers.<region>]` table per peer:
//!
//! ```toml
//! region = "a"
//! lease_ttl = "30s"
//! replica_id = "aether-replicator-a-5d9c7-x2x9q"
//! [local]
//! endpoints = ["http://etcd-a.aether.svc:2379"]
//! [peers.b]
//! endpoints = ["https://etcd-b.example:2379"]
//! ca = "/etc/aether/peers/b/ca.crt"
//! cert = "/etc/aether/peers/b/tls.crt"
//! key = "/etc/aether/peers/b/tls.key"
//! server_name = "etcd-b.example"
//! username = "replicator"
//! password_file = "/etc/aether/peers/b/password"
//! max_txn_ops = 128                # this peer's own limits (optional)
//! max_request_bytes = "1536KiB"
//! ```
//!
//! - Flags and environment variables win over the file, the file over the
//!   defaults. A peer may come from the file, from `--peer-etcd`, or both:
//!   then `--peer-etcd` replaces its `endpoints`, `--peer-tls` its `ca`,
//!   `cert`, `key` and `server_name` together, and `--peer-auth` its
//!   `username` and `password_file`. Likewise for `[local]`: any of the
//!   `--local-{ca,cert,key,server-name}` flags replace the table's TLS keys
//!   together, `--local-user`/`--local-password` its credentials. A group
//!   is replaced whole so that a flag never pairs with half of the file's
//!   settings (a certificate from one, its key from the other).
//! - Secrets come from files only: `password_file` is read at validation
//!   (less one trailing newline), and re-read while running (see
//!   `app::reload`). The file itself holds no secret.
//! - Unknown keys are refused, and every error names the file, the table
//!   and the key: `/etc/a.toml: [peers.b] max_request_bytes: invalid byte
//!   size "12QB": ...`.
//! - A peer table's `max_txn_ops`/`max_request_bytes` override the global
//!   ones for that peer only (`MirrorConfig::peer_limits`); the one it
//!   leaves out is the global value.
//!
//! # The replica id
//!
//! `--replica-id` (Kubernetes sets `AETHER_REPLICATOR_REPLICA_ID` from the
//! pod name) is this process's value in the leader election. Without one,
//! the id is `<$HOSTNAME or "replica">-<pid>-<32 random bits in hex>`:
//! containers without a host name all have pid 1, and must still not
//! share an id. The bits come from /dev/urandom, or std's randomly seeded
//! hasher where that cannot be read.
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
//! Passwords are read from files only, as the config file's
//! `password_file`: a command line is visible to every local user and an
//! environment to `kubectl describe` and crash reporters. A password given
//! by flag or variable (`--local-password`, `--peer-auth b=u:pw`) is refused
//! with the file form in the error, and never echoed. Password files given
//! by flag are re-read on rotation like the file's.
//!
//! clap checks the syntax (a missing `--region`, a number that is not one);
//! [`RunArgs::validate`] checks everything else and names the flag at fault
//! in a one-line [`ConfigError`].
//!
//! # Layout
//!
//! From the bottom up (no file imports one above it):
//!
//! - `error`: [`ConfigError`], and how a message names a flag or a place in
//!   the file (`Origin`, `place`).
//! - `file`: reading the TOML file with errors naming the file, the table
//!   and the key; the `[local]` and `[peers.<region>]` tables.
//! - `settings`: [`Settings`], the settings that are one flag, one
//!   variable and one top-level file key each, declared once; `Layers`,
//!   the flags over the file.
//! - `args`: the command line ([`Cli`], the subcommands, [`RunArgs`],
//!   [`LocalEtcdArgs`]), flattening [`Settings`] into a run's flags.
//! - `connection`: one etcd's endpoints, TLS and credentials (flags or a
//!   table), reading the TLS and password files.
//! - `limits`: single values with bounds (txn limits, counts, durations,
//!   prefixes, segments).
//! - `peers`: the peers, from their tables and the `--peer-*` flags.
//! - `run`: [`RunArgs::validate`]: everything above into a [`Config`] and
//!   the engine's `MirrorConfig`.
//! - `subcommands`: the settings of `endpoints` and `migrate`.
//! - `tests`: the flags' and validation's tests.
//!
//! The general-purpose parsers (durations, byte sizes, URLs, PEM files,
//! peer specs) live in [`crate::app::parse`].
//!
//! # Adding a flag
//!
//! A setting of a run goes in one place: a field of [`Settings`]
//! (`settings.rs`), `Option<T>`, with its `--help` text as the doc comment
//! and `#[arg(long, env = "AETHER_REPLICATOR_<FIELD>", ...)]`. The field's
//! name makes the flag (`--foo-bar`) and the file key (`foo_bar`); its
//! default is a constant beside it or the engine's. Then read it where the
//! [`Config`] is built (`run.rs`, `layered!(layers, foo_bar)` gives the
//! value and where it came from, for messages) and hand it to
//! `MirrorConfig` or [`Config`]. The test
//! `every_flag_has_its_variable_and_its_file_key_and_none_is_orphaned`
//! walks clap's `Command` and checks that every flag has its variable and
//! every run flag its file key (the exceptions, and the `[local]`/`[peers]`
//! keys of the grouped `--local-*`/`--peer-*` flags, are listed there with
//! their reasons), and that no file key and no variable named in the
//! sources, manifests or docs belongs to no flag.

mod args;
mod connection;
mod error;
mod file;
mod limits;
mod peers;
mod run;
mod settings;
mod subcommands;

pub use args::{
    CheckArgs, Cli, Command, CompletionsArgs, EndpointsArgs, LocalEtcdArgs, MigrateArgs, RootArg,
    RunArgs, Secret, SetupAuthArgs, StatusArgs,
};
pub(crate) use connection::read_password;
pub use connection::{DEFAULT_LOCAL_ETCD, PasswordFile};
pub use error::ConfigError;
pub use limits::{
    MAX_LEASE_TTL_SECS, MAX_MAX_REQUEST_BYTES, MIN_MAX_REQUEST_BYTES, MIN_MAX_TXN_OPS,
};
pub use run::Config;
pub use settings::{
    DEFAULT_LOG_LEVEL, DEFAULT_METRICS_ADDR, DEFAULT_RELOAD_INTERVAL, LogFormat, Settings,
};
pub use subcommands::{EndpointsConfig, MigrateConfig, SetupAuthConfig};

/// Prefix of every flag's environment variable.
pub const ENV_PREFIX: &str = "AETHER_REPLICATOR_";

#[cfg(test)]
mod tests;
