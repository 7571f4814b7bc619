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

// The doc comments below are the --help text, so their <placeholders> are
// meant literally, not as HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::endpoints::{EndpointsOptions, Output};
use super::migrate::{DEFAULT_LEGACY_PREFIX, MigrateOptions};
use crate::etcd::{
    ClientConfig, Credentials, DEFAULT_MAX_ENCODING_MESSAGE_SIZE, DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_MAX_TXN_OPS, TlsConfig, TxnLimits,
};
use crate::mirror::{
    DEFAULT_MAX_INFLIGHT_TXNS, DEFAULT_PAGE_SIZE, DEFAULT_STATE_ROOT, MirrorConfig, PeerConfig,
};
use crate::schema::{DEFAULT_ROOT, Schema, SchemaError, validate_segment};
use crate::view::ViewConfig;

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

/// Mirrors this region's subtree of the endpoint registry into the etcd of
/// every peer region.
#[derive(Debug, Parser)]
#[command(
    name = "aether-replicator",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    /// What to do; none runs the replicator with the top-level flags.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The flags of a plain run (not used when there is a subcommand).
    #[command(flatten)]
    pub run: RunArgs,
}

impl Cli {
    /// The flags in effect: the subcommand's, or the top-level ones.
    /// `endpoints` and `migrate` have their own flags; for them this is the
    /// (unset) top-level ones.
    pub fn run_args(&self) -> &RunArgs {
        match &self.command {
            Some(Command::Check(check)) => &check.run,
            Some(Command::Endpoints(_) | Command::Migrate(_)) | None => &self.run,
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Compare this region's subtree in the local etcd with each peer's copy
    /// once, report the differences and exit.
    Check(CheckArgs),
    /// Print the merged endpoint registry as this region's consumers see
    /// it: its own endpoints and those mirrored in from other regions,
    /// ranked by locality. With --watch, keep printing changes.
    Endpoints(EndpointsArgs),
    /// Move the legacy flat layout (PREFIX SERVICE/protocols/PROTO/endpoints/IP)
    /// to the v1 keys. A dry run unless --apply or --delete-legacy.
    Migrate(MigrateArgs),
}

/// The flags of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The connection and mirror flags, as for a run.
    #[command(flatten)]
    pub run: RunArgs,
}

/// The local etcd's connection flags, as a run takes them, for the
/// subcommands that talk to the local etcd only.
#[derive(Clone, Debug, Args)]
pub struct LocalEtcdArgs {
    /// This region's etcd: comma-separated member URLs.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_ETCD",
        value_name = "URL[,URL...]",
        default_value = "http://127.0.0.1:2379",
        help_heading = "Local etcd"
    )]
    pub local_etcd: String,

    /// CA bundle (PEM) for the local etcd's https:// endpoints.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_CA",
        value_name = "PATH",
        help_heading = "Local etcd"
    )]
    pub local_ca: Option<String>,

    /// Client certificate (PEM) for mutual TLS with the local etcd; needs
    /// --local-key.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_CERT",
        value_name = "PATH",
        help_heading = "Local etcd"
    )]
    pub local_cert: Option<String>,

    /// Private key (PEM) of --local-cert.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_KEY",
        value_name = "PATH",
        help_heading = "Local etcd"
    )]
    pub local_key: Option<String>,

    /// Name to verify the local etcd's certificate against, instead of the
    /// host in the URL.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_SERVER_NAME",
        value_name = "NAME",
        help_heading = "Local etcd"
    )]
    pub local_server_name: Option<String>,

    /// etcd user for the local etcd; needs --local-password.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_USER",
        value_name = "USER",
        help_heading = "Local etcd"
    )]
    pub local_user: Option<String>,

    /// Password of --local-user. Prefer the environment variable: a command
    /// line is visible to every local user.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD",
        help_heading = "Local etcd"
    )]
    pub local_password: Option<Secret>,
}

impl LocalEtcdArgs {
    /// Checks the flags as a run does and builds the client config.
    pub fn validate(&self) -> Result<ClientConfig, ConfigError> {
        local_client_config(
            &self.local_etcd,
            TlsParts {
                ca: self.local_ca.clone(),
                cert: self.local_cert.clone(),
                key: self.local_key.clone(),
                server_name: self.local_server_name.clone(),
            },
            self.local_user.as_ref(),
            self.local_password.as_ref(),
        )
    }
}

/// The flags of `endpoints`.
#[derive(Clone, Debug, Args)]
pub struct EndpointsArgs {
    /// The local etcd.
    #[command(flatten)]
    pub local: LocalEtcdArgs,

    /// The viewer's region: its endpoints rank before other regions'.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_REGION",
        value_name = "NAME",
        required = true
    )]
    pub region: Option<String>,

    /// The viewer's zone: endpoints of this region in it rank first
    /// (priority 0).
    #[arg(long, env = "AETHER_REPLICATOR_ZONE", value_name = "NAME")]
    pub zone: Option<String>,

    /// Only this service.
    #[arg(long, env = "AETHER_REPLICATOR_SERVICE", value_name = "NAME")]
    pub service: Option<String>,

    /// Keep printing changes, one line each, until SIGINT or SIGTERM.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_WATCH",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub watch: bool,

    /// Output format: an aligned table, or JSON (JSON lines with --watch).
    #[arg(
        long,
        env = "AETHER_REPLICATOR_OUTPUT",
        value_name = "FORMAT",
        value_enum,
        default_value_t = Output::Table
    )]
    pub output: Output,

    /// The registry root: starts and ends with '/'.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_ROOT",
        value_name = "PREFIX",
        default_value = DEFAULT_ROOT
    )]
    pub root: String,

    /// Keys per page when reading the registry (at least 1).
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PAGE_SIZE",
        value_name = "N",
        default_value_t = DEFAULT_PAGE_SIZE
    )]
    pub page_size: usize,
}

/// The validated settings of `endpoints`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointsConfig {
    /// The local etcd.
    pub local: ClientConfig,
    /// What to show and how.
    pub options: EndpointsOptions,
}

impl EndpointsArgs {
    /// Checks every flag; the first error found is returned.
    pub fn validate(&self) -> Result<EndpointsConfig, ConfigError> {
        let Some(region) = &self.region else {
            return Err(ConfigError::new("--region", "--region: required"));
        };
        segment_flag("--region", "region", region)?;
        if let Some(zone) = &self.zone
            && zone.is_empty()
        {
            return Err(ConfigError::new("--zone", "--zone \"\": must not be empty"));
        }
        if let Some(service) = &self.service {
            segment_flag("--service", "service", service)?;
        }
        let schema = prefix_flag("--root", &self.root)?;
        let page_size = page_size_flag(self.page_size)?;
        let local = self.local.validate()?;
        let mut view = ViewConfig::new(region.clone());
        view.schema = schema;
        view.zone = self.zone.clone();
        view.page_size = page_size;
        Ok(EndpointsConfig {
            local,
            options: EndpointsOptions {
                view,
                service: self.service.clone(),
                watch: self.watch,
                output: self.output,
            },
        })
    }
}

/// The flags of `migrate`.
///
/// `--apply` and `--delete-legacy` have no environment variable: what
/// writes or deletes is asked for on the command line.
#[derive(Clone, Debug, Args)]
pub struct MigrateArgs {
    /// The local etcd.
    #[command(flatten)]
    pub local: LocalEtcdArgs,

    /// Region of the endpoints whose value has no `region` field.
    #[arg(long, env = "AETHER_REPLICATOR_REGION", value_name = "NAME")]
    pub region: Option<String>,

    /// Cluster of the endpoints whose value has no `clusterName` field.
    #[arg(long, env = "AETHER_REPLICATOR_CLUSTER", value_name = "NAME")]
    pub cluster: Option<String>,

    /// Prefix of the legacy layout: keys are PREFIX followed by
    /// SERVICE/protocols/PROTO/endpoints/IP.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LEGACY_PREFIX",
        value_name = "PREFIX",
        default_value = DEFAULT_LEGACY_PREFIX
    )]
    pub legacy_prefix: String,

    /// The registry root: starts and ends with '/'.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_ROOT",
        value_name = "PREFIX",
        default_value = DEFAULT_ROOT
    )]
    pub root: String,

    /// Write the v1 keys that do not exist yet. Without it, only report.
    #[arg(long)]
    pub apply: bool,

    /// Delete the legacy prefix, only if every legacy key has a v1 key with
    /// an equal value (after --apply, if given); otherwise refuse and exit 1.
    #[arg(long)]
    pub delete_legacy: bool,

    /// Most ops in one txn: the etcd's --max-txn-ops (at least 2). Each key
    /// costs a put and a compare; at most 64 keys go in one txn.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_MAX_TXN_OPS",
        value_name = "N",
        default_value_t = DEFAULT_MAX_TXN_OPS
    )]
    pub max_txn_ops: usize,

    /// Largest txn request: the etcd's --max-request-bytes, e.g. 1.5MiB.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_MAX_REQUEST_BYTES",
        value_name = "BYTES",
        default_value_t = DEFAULT_MAX_REQUEST_BYTES.to_string()
    )]
    pub max_request_bytes: String,

    /// Keys per page when reading (at least 1).
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PAGE_SIZE",
        value_name = "N",
        default_value_t = DEFAULT_PAGE_SIZE
    )]
    pub page_size: usize,
}

/// The validated settings of `migrate`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrateConfig {
    /// The local etcd.
    pub local: ClientConfig,
    /// What to migrate and how.
    pub options: MigrateOptions,
}

impl MigrateArgs {
    /// Checks every flag; the first error found is returned.
    pub fn validate(&self) -> Result<MigrateConfig, ConfigError> {
        if let Some(region) = &self.region {
            segment_flag("--region", "region", region)?;
        }
        if let Some(cluster) = &self.cluster {
            segment_flag("--cluster", "cluster", cluster)?;
        }
        let schema = prefix_flag("--root", &self.root)?;
        let legacy = prefix_flag("--legacy-prefix", &self.legacy_prefix)?;
        let legacy = legacy.root().to_string();
        for (other, what) in [
            (schema.root(), "--root"),
            (DEFAULT_STATE_ROOT, "the replication state prefix"),
        ] {
            if legacy.starts_with(other) || other.starts_with(&legacy) {
                return Err(ConfigError::new(
                    "--legacy-prefix",
                    format!("--legacy-prefix {legacy:?}: overlaps {what} {other:?}"),
                ));
            }
        }
        let limits = RunArgs::txn_limits(self.max_txn_ops, &self.max_request_bytes)?;
        let page_size = page_size_flag(self.page_size)?;
        let local = self.local.validate()?;
        let mut options = MigrateOptions::new(self.region.clone(), self.cluster.clone());
        options.schema = schema;
        options.legacy_prefix = legacy;
        options.apply = self.apply;
        options.delete_legacy = self.delete_legacy;
        options.limits = limits;
        options.page_size = page_size;
        Ok(MigrateConfig { local, options })
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// A password: never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret text.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_string()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The flags shared by a run and by `check`, as given. [`RunArgs::validate`]
/// turns them into a [`Config`].
#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    /// This region's name: the replicator mirrors <root><region>/ and
    /// nothing else.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_REGION",
        value_name = "NAME",
        required = true,
        help_heading = "Regions"
    )]
    pub region: Option<String>,

    /// This region's etcd: comma-separated member URLs.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_ETCD",
        value_name = "URL[,URL...]",
        default_value = "http://127.0.0.1:2379",
        help_heading = "Regions"
    )]
    pub local_etcd: String,

    /// A peer region and its etcd's member URLs. Repeat for each peer.
    ///
    /// One value may also hold several peers separated by ';', which is how
    /// the environment variable gives more than one.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PEER_ETCD",
        value_name = "REGION=URL[,URL...]",
        value_delimiter = ';',
        help_heading = "Regions"
    )]
    pub peer_etcd: Vec<String>,

    /// CA bundle (PEM) for the local etcd's https:// endpoints.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_CA",
        value_name = "PATH",
        help_heading = "Local etcd TLS and auth"
    )]
    pub local_ca: Option<String>,

    /// Client certificate (PEM) for mutual TLS with the local etcd; needs
    /// --local-key.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_CERT",
        value_name = "PATH",
        help_heading = "Local etcd TLS and auth"
    )]
    pub local_cert: Option<String>,

    /// Private key (PEM) of --local-cert.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_KEY",
        value_name = "PATH",
        help_heading = "Local etcd TLS and auth"
    )]
    pub local_key: Option<String>,

    /// Name to verify the local etcd's certificate against, instead of the
    /// host in the URL.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_SERVER_NAME",
        value_name = "NAME",
        help_heading = "Local etcd TLS and auth"
    )]
    pub local_server_name: Option<String>,

    /// etcd user for the local etcd; needs --local-password.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_USER",
        value_name = "USER",
        help_heading = "Local etcd TLS and auth"
    )]
    pub local_user: Option<String>,

    /// Password of --local-user. Prefer the environment variable: a command
    /// line is visible to every local user.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD",
        help_heading = "Local etcd TLS and auth"
    )]
    pub local_password: Option<Secret>,

    /// TLS for one peer's etcd: any of ca=<path>, cert=<path>, key=<path>,
    /// server-name=<name>, comma-separated. Once per peer.
    ///
    /// cert and key go together. An https:// peer endpoint needs ca (there
    /// are no system roots). Paths cannot contain ',' or ';'. Several peers
    /// may be given in one value separated by ';'.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PEER_TLS",
        value_name = "REGION=ca=PATH,cert=PATH,key=PATH,server-name=NAME",
        value_delimiter = ';',
        help_heading = "Peer etcd TLS and auth"
    )]
    pub peer_tls: Vec<String>,

    /// etcd user and password for one peer's etcd. Once per peer.
    ///
    /// The password is everything after the first ':' and cannot contain
    /// ';', which separates several peers in one value. Prefer the
    /// environment variable: a command line is visible to every local user.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PEER_AUTH",
        hide_env_values = true,
        value_name = "REGION=USER:PASSWORD",
        value_delimiter = ';',
        help_heading = "Peer etcd TLS and auth"
    )]
    pub peer_auth: Vec<Secret>,

    /// TTL of the lease under which each peer holds this region's copy: if
    /// the replicator is gone that long, the copy disappears. Whole seconds.
    ///
    /// Durations are a number and a unit, units from largest to smallest:
    /// 30s, 500ms, 2m, 1h, 1m30s, 1.5h (units h, m, s, ms, us, ns).
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LEASE_TTL",
        value_name = "DURATION",
        default_value = "30s",
        help_heading = "Mirror"
    )]
    pub lease_ttl: String,

    /// TTL of the leader-election session in the local etcd: how long a dead
    /// leader blocks a successor. Whole seconds, at most half of --lease-ttl
    /// so a successor takes over before the peers' copies expire. [default:
    /// a third of --lease-ttl, rounded up]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_ELECTION_TTL",
        value_name = "DURATION",
        help_heading = "Mirror"
    )]
    pub election_ttl: Option<String>,

    /// Most ops in one txn: the peers' etcd --max-txn-ops (at least 2).
    #[arg(
        long,
        env = "AETHER_REPLICATOR_MAX_TXN_OPS",
        value_name = "N",
        default_value_t = DEFAULT_MAX_TXN_OPS,
        help_heading = "Mirror"
    )]
    pub max_txn_ops: usize,

    /// Largest txn request: the peers' etcd --max-request-bytes. A number of
    /// bytes, or with a unit: 512KiB, 1.5MiB (B, KiB, MiB, GiB). At least
    /// 4096.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_MAX_REQUEST_BYTES",
        value_name = "BYTES",
        default_value_t = DEFAULT_MAX_REQUEST_BYTES.to_string(),
        help_heading = "Mirror"
    )]
    pub max_request_bytes: String,

    /// Mirror txns in flight to one peer (at least 1).
    #[arg(
        long,
        env = "AETHER_REPLICATOR_MAX_INFLIGHT",
        value_name = "N",
        default_value_t = DEFAULT_MAX_INFLIGHT_TXNS,
        help_heading = "Mirror"
    )]
    pub max_inflight: usize,

    /// Keys per page when scanning the local etcd and the peers (at least 1).
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PAGE_SIZE",
        value_name = "N",
        default_value_t = DEFAULT_PAGE_SIZE,
        help_heading = "Mirror"
    )]
    pub page_size: usize,

    /// The registry root: starts and ends with '/'.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_ROOT",
        value_name = "PREFIX",
        default_value = DEFAULT_ROOT,
        help_heading = "Mirror"
    )]
    pub root: String,

    /// Address to serve metrics on.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_METRICS_ADDR",
        value_name = "HOST:PORT",
        default_value = "127.0.0.1:9464",
        help_heading = "Process"
    )]
    pub metrics_addr: SocketAddr,

    /// Log line format.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOG_FORMAT",
        value_name = "FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
        help_heading = "Process"
    )]
    pub log_format: LogFormat,
}

/// The validated settings of a run or a `check`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This region.
    pub region: String,
    /// This region's etcd.
    pub local: ClientConfig,
    /// The peer regions, in command-line order.
    pub peers: Vec<PeerConfig>,
    /// The engine's settings: region, root, lease TTL, txn limits, in-flight
    /// txns and page size from the flags, the rest at their defaults.
    pub mirror: MirrorConfig,
    /// TTL of the leader-election session lease, whole seconds, shorter
    /// than `mirror.lease_ttl`.
    pub election_ttl: Duration,
    /// Where to serve metrics.
    pub metrics_addr: SocketAddr,
    /// How to write logs.
    pub log_format: LogFormat,
}

/// A flag that is wrong: one line naming the flag and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    flag: &'static str,
    message: String,
}

impl ConfigError {
    fn new(flag: &'static str, message: impl Into<String>) -> Self {
        ConfigError {
            flag,
            message: message.into(),
        }
    }

    /// The flag at fault, e.g. `"--peer-etcd"`.
    pub fn flag(&self) -> &'static str {
        self.flag
    }
}

const PEER_ETCD_FORM: &str = "<region>=<url>[,<url>...]";
const PEER_TLS_FORM: &str = "<region>=ca=<path>,cert=<path>,key=<path>,server-name=<name>";
const PEER_AUTH_FORM: &str = "<region>=<user>:<password>";
const URL_FORM: &str = "http://host:port or https://host:port";

impl RunArgs {
    /// Checks every flag and builds the [`Config`]. The first error found is
    /// returned.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let region = self.validate_region()?;
        let root = self.validate_root()?;
        let (lease_ttl, election_ttl) = self.validate_ttls()?;
        let limits = self.validate_limits()?;
        if self.max_inflight < 1 {
            return Err(ConfigError::new(
                "--max-inflight",
                "--max-inflight 0: must be at least 1",
            ));
        }
        if self.page_size < 1 {
            return Err(ConfigError::new(
                "--page-size",
                "--page-size 0: must be at least 1",
            ));
        }

        let mut mirror = MirrorConfig::new(region.clone());
        if root.starts_with(&mirror.state_root) || mirror.state_root.starts_with(&root) {
            return Err(ConfigError::new(
                "--root",
                format!(
                    "--root {root:?}: overlaps the replication state prefix {:?}",
                    mirror.state_root
                ),
            ));
        }
        mirror.root = root;
        mirror.lease_ttl = lease_ttl;
        mirror.limits = limits;
        mirror.max_inflight = self.max_inflight;
        mirror.page_size = self.page_size;

        let local = self.validate_local()?;
        let peers = self.validate_peers(&region, &local)?;

        Ok(Config {
            region,
            local,
            peers,
            mirror,
            election_ttl,
            metrics_addr: self.metrics_addr,
            log_format: self.log_format,
        })
    }

    fn validate_region(&self) -> Result<String, ConfigError> {
        let Some(region) = &self.region else {
            return Err(ConfigError::new("--region", "--region: required"));
        };
        validate_segment("region", region).map_err(|e| {
            ConfigError::new("--region", format!("--region {region:?}: {}", segment(&e)))
        })?;
        Ok(region.clone())
    }

    fn validate_root(&self) -> Result<String, ConfigError> {
        Ok(prefix_flag("--root", &self.root)?.root().to_string())
    }

    fn validate_ttls(&self) -> Result<(Duration, Duration), ConfigError> {
        let lease = lease_ttl("--lease-ttl", &self.lease_ttl)?;
        let (election, default) = match &self.election_ttl {
            Some(raw) => (lease_ttl("--election-ttl", raw)?, ""),
            None => (
                Duration::from_secs(lease.as_secs().div_ceil(3).max(1)),
                " (the default, a third of --lease-ttl rounded up)",
            ),
        };
        // After a crash the peers' copies may have only two thirds of the
        // lease TTL left (keep-alives go every third); a successor needs the
        // election TTL and a moment to adopt them. Half leaves a sixth spare.
        if election * 2 > lease {
            return Err(ConfigError::new(
                "--election-ttl",
                format!(
                    "--election-ttl {election:?}{default} must be at most half of --lease-ttl {lease:?}, so a successor takes over before the peers' copies can expire"
                ),
            ));
        }
        Ok((lease, election))
    }

    fn validate_limits(&self) -> Result<TxnLimits, ConfigError> {
        RunArgs::txn_limits(self.max_txn_ops, &self.max_request_bytes)
    }

    /// `--max-txn-ops` and `--max-request-bytes`, checked.
    fn txn_limits(max_txn_ops: usize, raw: &str) -> Result<TxnLimits, ConfigError> {
        if max_txn_ops < MIN_MAX_TXN_OPS {
            return Err(ConfigError::new(
                "--max-txn-ops",
                format!("--max-txn-ops {max_txn_ops}: must be at least {MIN_MAX_TXN_OPS}"),
            ));
        }
        let flag = "--max-request-bytes";
        let bytes = parse_byte_size(raw)
            .map_err(|e| ConfigError::new(flag, format!("{flag} {raw:?}: {e}")))?;
        let max_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        if max_bytes < MIN_MAX_REQUEST_BYTES {
            return Err(ConfigError::new(
                flag,
                format!("{flag} {raw:?}: must be at least {MIN_MAX_REQUEST_BYTES}"),
            ));
        }
        if max_bytes > MAX_MAX_REQUEST_BYTES {
            return Err(ConfigError::new(
                flag,
                format!(
                    "{flag} {raw:?}: must be at most {MAX_MAX_REQUEST_BYTES} (64MiB, the client's largest request)"
                ),
            ));
        }
        Ok(TxnLimits {
            max_ops: max_txn_ops,
            max_bytes,
        })
    }

    fn validate_local(&self) -> Result<ClientConfig, ConfigError> {
        local_client_config(
            &self.local_etcd,
            TlsParts {
                ca: self.local_ca.clone(),
                cert: self.local_cert.clone(),
                key: self.local_key.clone(),
                server_name: self.local_server_name.clone(),
            },
            self.local_user.as_ref(),
            self.local_password.as_ref(),
        )
    }

    fn validate_peers(
        &self,
        region: &str,
        local: &ClientConfig,
    ) -> Result<Vec<PeerConfig>, ConfigError> {
        const FLAG: &str = "--peer-etcd";
        // Every endpoint seen so far, normalized, and who has it.
        let mut owners: HashMap<String, String> = local
            .endpoints
            .iter()
            .map(|e| (normalize_url(e), "--local-etcd".to_string()))
            .collect();
        let mut peers: Vec<(String, Vec<String>)> = Vec::new();
        for spec in &self.peer_etcd {
            let Some((peer, urls)) = spec.split_once('=') else {
                return Err(ConfigError::new(
                    FLAG,
                    format!("{FLAG} {spec:?}: missing '=' (expected {PEER_ETCD_FORM})"),
                ));
            };
            check_peer_region(FLAG, spec, peer)?;
            if peer == region {
                return Err(ConfigError::new(
                    FLAG,
                    format!("{FLAG} {spec:?}: peer region is this region (--region {region})"),
                ));
            }
            if peers.iter().any(|(r, _)| r == peer) {
                return Err(ConfigError::new(
                    FLAG,
                    format!("{FLAG}: duplicate peer region {peer:?}"),
                ));
            }
            let label = format!("{FLAG} {peer}");
            let endpoints = parse_endpoints(FLAG, &label, urls)?;
            for e in &endpoints {
                if let Some(owner) = owners.insert(normalize_url(e), label.clone()) {
                    return Err(ConfigError::new(
                        FLAG,
                        format!("{label}: endpoint {e:?} is also in {owner}"),
                    ));
                }
            }
            peers.push((peer.to_string(), endpoints));
        }

        let is_peer = |r: &str| peers.iter().any(|(p, _)| p == r);
        let mut tls = self.peer_tls_by_region(&is_peer)?;
        let mut auth = self.peer_auth_by_region(&is_peer)?;

        let mut out = Vec::with_capacity(peers.len());
        for (peer, endpoints) in peers {
            let tls = match tls.remove(&peer) {
                Some(parts) => parts.build(Scope::Peer(&peer))?,
                None => None,
            };
            check_tls_for_endpoints(Scope::Peer(&peer), &endpoints, tls.as_ref())?;
            out.push(PeerConfig {
                client: ClientConfig {
                    tls,
                    credentials: auth.remove(&peer),
                    ..ClientConfig::new(endpoints)
                },
                region: peer,
            });
        }
        Ok(out)
    }

    fn peer_tls_by_region(
        &self,
        is_peer: &dyn Fn(&str) -> bool,
    ) -> Result<HashMap<String, TlsParts>, ConfigError> {
        const FLAG: &str = "--peer-tls";
        let mut out = HashMap::new();
        for spec in &self.peer_tls {
            let Some((peer, fields)) = spec.split_once('=') else {
                return Err(ConfigError::new(
                    FLAG,
                    format!("{FLAG} {spec:?}: missing '=' (expected {PEER_TLS_FORM})"),
                ));
            };
            check_peer_region(FLAG, spec, peer)?;
            if !is_peer(peer) {
                return Err(ConfigError::new(
                    FLAG,
                    format!("{FLAG} {peer}: there is no --peer-etcd for region {peer:?}"),
                ));
            }
            if out.contains_key(peer) {
                return Err(ConfigError::new(
                    FLAG,
                    format!("{FLAG}: duplicate entry for peer region {peer:?}"),
                ));
            }
            let mut parts = TlsParts::default();
            if fields.is_empty() {
                return Err(ConfigError::new(
                    FLAG,
                    format!("{FLAG} {peer}: no settings (expected {PEER_TLS_FORM})"),
                ));
            }
            for field in fields.split(',') {
                let Some((name, value)) = field.split_once('=') else {
                    return Err(ConfigError::new(
                        FLAG,
                        format!(
                            "{FLAG} {peer}: setting {field:?} is missing '=' (expected {PEER_TLS_FORM})"
                        ),
                    ));
                };
                let slot = match name {
                    "ca" => &mut parts.ca,
                    "cert" => &mut parts.cert,
                    "key" => &mut parts.key,
                    "server-name" => &mut parts.server_name,
                    _ => {
                        return Err(ConfigError::new(
                            FLAG,
                            format!(
                                "{FLAG} {peer}: unknown setting {name:?} (expected ca, cert, key or server-name)"
                            ),
                        ));
                    }
                };
                if slot.is_some() {
                    return Err(ConfigError::new(
                        FLAG,
                        format!("{FLAG} {peer}: {name} given twice"),
                    ));
                }
                if value.is_empty() {
                    return Err(ConfigError::new(
                        FLAG,
                        format!("{FLAG} {peer}: empty {name}"),
                    ));
                }
                *slot = Some(value.to_string());
            }
            out.insert(peer.to_string(), parts);
        }
        Ok(out)
    }

    /// Parses --peer-auth. No message quotes the value: it holds a password.
    fn peer_auth_by_region(
        &self,
        is_peer: &dyn Fn(&str) -> bool,
    ) -> Result<HashMap<String, Credentials>, ConfigError> {
        const FLAG: &str = "--peer-auth";
        let mut out = HashMap::new();
        for spec in &self.peer_auth {
            let Some((peer, creds)) = spec.expose().split_once('=') else {
                return Err(ConfigError::new(
                    FLAG,
                    format!("{FLAG}: an entry has no '=' (expected {PEER_AUTH_FORM})"),
                ));
            };
            if !is_peer(peer) {
                // A region with ':' is most likely "<user>:<pass=word>" with
                // the region left out; do not echo it.
                let message = if peer.contains(':') || peer.is_empty() {
                    format!(
                        "{FLAG}: an entry does not start with a --peer-etcd region (expected {PEER_AUTH_FORM})"
                    )
                } else {
                    format!("{FLAG} {peer}: there is no --peer-etcd for region {peer:?}")
                };
                return Err(ConfigError::new(FLAG, message));
            }
            if out.contains_key(peer) {
                return Err(ConfigError::new(
                    FLAG,
                    format!("{FLAG}: duplicate entry for peer region {peer:?}"),
                ));
            }
            let Some((user, password)) = creds.split_once(':') else {
                return Err(ConfigError::new(
                    FLAG,
                    format!("{FLAG} {peer}: missing ':' (expected {PEER_AUTH_FORM})"),
                ));
            };
            if user.is_empty() {
                return Err(ConfigError::new(FLAG, format!("{FLAG} {peer}: empty user")));
            }
            if password.is_empty() {
                return Err(ConfigError::new(
                    FLAG,
                    format!("{FLAG} {peer}: empty password"),
                ));
            }
            out.insert(
                peer.to_string(),
                Credentials {
                    user: user.to_string(),
                    password: password.to_string(),
                },
            );
        }
        Ok(out)
    }
}

/// The local etcd's client config from its flags (`--local-*`).
fn local_client_config(
    local_etcd: &str,
    tls: TlsParts,
    local_user: Option<&String>,
    local_password: Option<&Secret>,
) -> Result<ClientConfig, ConfigError> {
    let endpoints = parse_endpoints("--local-etcd", "--local-etcd", local_etcd)?;
    let tls = tls.build(Scope::Local)?;
    check_tls_for_endpoints(Scope::Local, &endpoints, tls.as_ref())?;
    let credentials = match (local_user, local_password) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(ConfigError::new(
                "--local-user",
                "--local-user needs --local-password (or AETHER_REPLICATOR_LOCAL_PASSWORD)",
            ));
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                "--local-password",
                "--local-password needs --local-user",
            ));
        }
        (Some(user), Some(password)) => {
            if user.is_empty() {
                return Err(ConfigError::new("--local-user", "--local-user: empty user"));
            }
            if password.expose().is_empty() {
                return Err(ConfigError::new(
                    "--local-password",
                    "--local-password: empty password",
                ));
            }
            Some(Credentials {
                user: user.clone(),
                password: password.expose().to_string(),
            })
        }
    };
    Ok(ClientConfig {
        tls,
        credentials,
        ..ClientConfig::new(endpoints)
    })
}

/// A prefix flag (`--root`, `--legacy-prefix`) checked as a schema root:
/// it starts and ends with '/', has a segment and no empty one.
fn prefix_flag(flag: &'static str, raw: &str) -> Result<Schema, ConfigError> {
    match Schema::new(raw) {
        Ok(schema) => Ok(schema),
        Err(SchemaError::InvalidRoot { root, reason }) => {
            Err(ConfigError::new(flag, format!("{flag} {root:?}: {reason}")))
        }
        Err(e) => Err(ConfigError::new(flag, format!("{flag} {raw:?}: {e}"))),
    }
}

/// A flag holding one key segment (`--region`, `--service`, ...).
fn segment_flag(flag: &'static str, kind: &'static str, value: &str) -> Result<(), ConfigError> {
    validate_segment(kind, value)
        .map_err(|e| ConfigError::new(flag, format!("{flag} {value:?}: {}", segment(&e))))
}

/// `--page-size`, at least 1.
fn page_size_flag(page_size: usize) -> Result<usize, ConfigError> {
    if page_size < 1 {
        return Err(ConfigError::new(
            "--page-size",
            "--page-size 0: must be at least 1",
        ));
    }
    Ok(page_size)
}

/// The reason in a segment error, without the segment's kind.
fn segment(e: &SchemaError) -> &'static str {
    match e {
        SchemaError::EmptySegment { .. } => "must not be empty",
        _ => "must not contain '/'",
    }
}

/// Checks the region part of a `<region>=...` spec.
fn check_peer_region(flag: &'static str, spec: &str, peer: &str) -> Result<(), ConfigError> {
    validate_segment("region", peer).map_err(|e| {
        let what = match e {
            SchemaError::EmptySegment { .. } => "empty peer region".to_string(),
            _ => format!("peer region {peer:?} contains '/'"),
        };
        ConfigError::new(flag, format!("{flag} {spec:?}: {what}"))
    })
}

/// Parses a TTL flag: a duration of whole seconds that etcd accepts.
fn lease_ttl(flag: &'static str, raw: &str) -> Result<Duration, ConfigError> {
    let ttl =
        parse_duration(raw).map_err(|e| ConfigError::new(flag, format!("{flag} {raw:?}: {e}")))?;
    if ttl.subsec_nanos() != 0 {
        return Err(ConfigError::new(
            flag,
            format!(
                "{flag} {raw:?}: must be a whole number of seconds (etcd lease TTLs are whole seconds)"
            ),
        ));
    }
    if ttl.as_secs() > MAX_LEASE_TTL_SECS {
        return Err(ConfigError::new(
            flag,
            format!(
                "{flag} {raw:?}: must be at most {MAX_LEASE_TTL_SECS}s (etcd's largest lease TTL)"
            ),
        ));
    }
    Ok(ttl)
}

/// Splits and checks a comma-separated endpoint list. `label` prefixes the
/// messages (`--peer-etcd b`).
fn parse_endpoints(
    flag: &'static str,
    label: &str,
    list: &str,
) -> Result<Vec<String>, ConfigError> {
    let items: Vec<&str> = list.split(',').map(str::trim).collect();
    if items.iter().all(|i| i.is_empty()) {
        return Err(ConfigError::new(
            flag,
            format!("{label}: empty endpoint list"),
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        if item.is_empty() {
            return Err(ConfigError::new(
                flag,
                format!("{label}: empty URL in endpoint list {list:?}"),
            ));
        }
        if !is_valid_url(item) {
            return Err(ConfigError::new(
                flag,
                format!("{label}: {item:?} is not a valid URL (expected {URL_FORM})"),
            ));
        }
        if !seen.insert(normalize_url(item)) {
            return Err(ConfigError::new(
                flag,
                format!("{label}: duplicate endpoint {item:?}"),
            ));
        }
        out.push(item.to_string());
    }
    let https = out.iter().filter(|u| u.starts_with("https://")).count();
    if https != 0 && https != out.len() {
        return Err(ConfigError::new(
            flag,
            format!("{label}: mixes http:// and https:// endpoints"),
        ));
    }
    Ok(out)
}

/// `http://host[:port][/]` or `https://...`, and nothing else: no user
/// info, path, query or fragment.
fn is_valid_url(s: &str) -> bool {
    // http::Uri drops a fragment silently.
    if !(s.starts_with("http://") || s.starts_with("https://")) || s.contains('#') {
        return false;
    }
    let Ok(uri) = s.parse::<http::Uri>() else {
        return false;
    };
    let Some(authority) = uri.authority() else {
        return false;
    };
    let host = authority.host();
    if host.is_empty() || authority.as_str().contains('@') {
        return false;
    }
    // Without user info the authority is the host, then maybe ":<port>".
    match authority.as_str().strip_prefix(host) {
        Some("") => {}
        Some(port) => {
            let Some(port) = port.strip_prefix(':') else {
                return false;
            };
            if !port.bytes().all(|b| b.is_ascii_digit()) || !matches!(port.parse::<u16>(), Ok(1..))
            {
                return false;
            }
        }
        None => return false,
    }
    matches!(
        uri.path_and_query().map(|p| p.as_str()),
        None | Some("" | "/")
    )
}

/// A URL reduced to what identifies a server, for duplicate checks.
fn normalize_url(s: &str) -> String {
    s.trim_end_matches('/').to_ascii_lowercase()
}

/// Where a TLS setting came from, for messages.
#[derive(Clone, Copy)]
enum Scope<'a> {
    Local,
    Peer(&'a str),
}

impl Scope<'_> {
    /// The flag a setting comes from.
    fn flag(self, field: &str) -> &'static str {
        match (self, field) {
            (Scope::Peer(_), _) => "--peer-tls",
            (Scope::Local, "ca") => "--local-ca",
            (Scope::Local, "cert") => "--local-cert",
            (Scope::Local, "key") => "--local-key",
            (Scope::Local, _) => "--local-server-name",
        }
    }

    /// The full name of a setting: `--local-ca`, `--peer-tls b: ca`.
    fn setting(self, field: &str) -> String {
        match self {
            Scope::Local => format!("--local-{field}"),
            Scope::Peer(peer) => format!("--peer-tls {peer}: {field}"),
        }
    }

    /// The short name of a setting, after one named with [`Scope::setting`].
    fn other(self, field: &str) -> String {
        match self {
            Scope::Local => format!("--local-{field}"),
            Scope::Peer(_) => field.to_string(),
        }
    }
}

/// TLS settings as given.
#[derive(Default)]
struct TlsParts {
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
    server_name: Option<String>,
}

impl TlsParts {
    fn build(self, scope: Scope<'_>) -> Result<Option<TlsConfig>, ConfigError> {
        match (&self.cert, &self.key) {
            (Some(_), None) => {
                return Err(ConfigError::new(
                    scope.flag("cert"),
                    format!(
                        "{} is given without {}",
                        scope.setting("cert"),
                        scope.other("key")
                    ),
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::new(
                    scope.flag("key"),
                    format!(
                        "{} is given without {}",
                        scope.setting("key"),
                        scope.other("cert")
                    ),
                ));
            }
            _ => {}
        }
        // Read now, so that an unreadable or non-PEM file is refused before
        // anything connects rather than failing the first TLS handshake.
        let pem = [
            ("ca", &self.ca, "CERTIFICATE-----"),
            ("cert", &self.cert, "CERTIFICATE-----"),
            ("key", &self.key, "PRIVATE KEY-----"),
        ];
        for (field, path, marker) in pem {
            if let Some(path) = path {
                let problem = match std::fs::metadata(path) {
                    Err(e) => e.to_string(),
                    Ok(m) if !m.is_file() => "not a file".to_string(),
                    Ok(_) => match std::fs::read(path) {
                        Err(e) => e.to_string(),
                        Ok(b)
                            if contains(&b, b"-----BEGIN ") && contains(&b, marker.as_bytes()) =>
                        {
                            continue;
                        }
                        Ok(_) => format!("no PEM \"-----BEGIN ...{marker}\" block"),
                    },
                };
                return Err(ConfigError::new(
                    scope.flag(field),
                    format!("{} {path:?}: {problem}", scope.setting(field)),
                ));
            }
        }
        if self.server_name.as_deref() == Some("") {
            return Err(ConfigError::new(
                scope.flag("server-name"),
                format!("{}: empty name", scope.setting("server-name")),
            ));
        }
        if self.ca.is_none()
            && self.cert.is_none()
            && self.key.is_none()
            && self.server_name.is_none()
        {
            return Ok(None);
        }
        Ok(Some(TlsConfig {
            ca_file: self.ca,
            cert_file: self.cert,
            key_file: self.key,
            server_name: self.server_name,
        }))
    }
}

/// https:// endpoints need a CA (the client has no system roots), and TLS
/// settings for plain http:// endpoints would be silently ignored.
fn check_tls_for_endpoints(
    scope: Scope<'_>,
    endpoints: &[String],
    tls: Option<&TlsConfig>,
) -> Result<(), ConfigError> {
    let https = endpoints.iter().any(|e| e.starts_with("https://"));
    let has_ca = tls.is_some_and(|t| t.ca_file.is_some());
    match scope {
        Scope::Local if https && !has_ca => Err(ConfigError::new(
            "--local-etcd",
            "--local-etcd: https endpoint needs --local-ca",
        )),
        Scope::Peer(peer) if https && !has_ca => Err(ConfigError::new(
            "--peer-etcd",
            format!("--peer-etcd {peer}: https endpoint needs --peer-tls {peer}=ca=..."),
        )),
        Scope::Local if !https && tls.is_some() => Err(ConfigError::new(
            "--local-etcd",
            "--local-etcd: TLS flags (--local-ca, --local-cert, --local-key, --local-server-name) \
             are given but no endpoint is https://",
        )),
        Scope::Peer(peer) if !https && tls.is_some() => Err(ConfigError::new(
            "--peer-tls",
            format!("--peer-tls {peer}: given but no --peer-etcd {peer} endpoint is https://"),
        )),
        _ => Ok(()),
    }
}

const DURATION_UNITS: &str = "h, m, s, ms, us or ns";
const TOO_LARGE: &str = "too large";

/// Parses a duration: one or more `<number><unit>`, units from largest to
/// smallest and each at most once: `30s`, `500ms`, `2m`, `1h`, `1m30s`,
/// `1.5s`. Units are `h`, `m`, `s`, `ms`, `us` (or `µs`) and `ns`. Zero,
/// negative, unitless and malformed durations are refused; the error says
/// why, without repeating the input.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.is_empty() {
        return Err("empty duration (expected e.g. 30s, 500ms, 2m, 1h or 1m30s)".into());
    }
    if s.starts_with('-') {
        return Err("must not be negative".into());
    }
    let mut rest = s;
    let mut total: u128 = 0;
    let mut prev_rank = None;
    while !rest.is_empty() {
        let Some((int, frac, after)) = split_number(rest) else {
            return Err("not a duration (expected e.g. 30s, 500ms, 2m, 1h or 1m30s)".into());
        };
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let number = &rest[..rest.len() - unit.len() - after.len()];
        let (rank, nanos) = match unit {
            "h" => (0, 3_600_000_000_000),
            "m" => (1, 60_000_000_000),
            "s" => (2, 1_000_000_000),
            "ms" => (3, 1_000_000),
            "us" | "µs" => (4, 1_000),
            "ns" => (5, 1),
            "" => {
                return Err(format!(
                    "missing unit after {number:?} (expected {DURATION_UNITS})"
                ));
            }
            _ => return Err(format!("unknown unit {unit:?} (expected {DURATION_UNITS})")),
        };
        if prev_rank.is_some_and(|p| rank <= p) {
            return Err(
                "units must go from largest to smallest, each at most once (e.g. 1m30s)".into(),
            );
        }
        prev_rank = Some(rank);
        let value = scale(int, frac, nanos).map_err(|e| match e {
            Inexact => "more precise than a nanosecond",
            e => e.as_str(),
        })?;
        total = total.checked_add(value).ok_or(TOO_LARGE)?;
        rest = after;
    }
    if total == 0 {
        return Err("must be greater than zero".into());
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| TOO_LARGE)?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// Parses a size in bytes: a plain number (`1572864`) or a number and a
/// binary unit (`512KiB`, `1.5MiB`, `1GiB`; also `B`). The result must be a
/// whole number of bytes. Decimal units (`KB`, `MB`) are refused as
/// ambiguous.
pub fn parse_byte_size(s: &str) -> Result<u64, String> {
    if s.is_empty() {
        return Err("empty size (expected e.g. 1572864, 512KiB or 1.5MiB)".into());
    }
    let Some((int, frac, unit)) = split_number(s) else {
        return Err("not a size (expected e.g. 1572864, 512KiB or 1.5MiB)".into());
    };
    let unit = unit.trim_start();
    let multiplier: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "k" | "kb" | "m" | "mb" | "g" | "gb" => {
            return Err(format!(
                "ambiguous unit {unit:?} (use KiB, MiB or GiB, or a plain number of bytes)"
            ));
        }
        _ => {
            return Err(format!(
                "unknown unit {unit:?} (expected B, KiB, MiB or GiB)"
            ));
        }
    };
    let bytes = scale(int, frac, multiplier).map_err(|e| match e {
        Inexact => "not a whole number of bytes",
        e => e.as_str(),
    })?;
    u64::try_from(bytes).map_err(|_| TOO_LARGE.to_string())
}

/// Decimal places accepted in a number.
const MAX_DECIMALS: usize = 18;

/// Splits a leading `<digits>[.<digits>]` off `s`: (integer part, fraction
/// part, rest). None if `s` does not start with one.
fn split_number(s: &str) -> Option<(&str, &str, &str)> {
    let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
    let (int, rest) = s.split_at(int_len);
    if int.is_empty() {
        return None;
    }
    match rest.strip_prefix('.') {
        Some(after_dot) => {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            if frac_len == 0 {
                return None;
            }
            let (frac, rest) = after_dot.split_at(frac_len);
            Some((int, frac, rest))
        }
        None => Some((int, "", rest)),
    }
}

/// Why [`scale`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScaleError {
    TooLarge,
    TooManyDecimals,
    /// The result has a fraction of the unit's smallest step.
    Inexact,
}

use ScaleError::{Inexact, TooLarge, TooManyDecimals};

impl ScaleError {
    fn as_str(self) -> &'static str {
        match self {
            TooLarge => TOO_LARGE,
            TooManyDecimals => "too many decimal places",
            Inexact => "not a whole number",
        }
    }
}

/// `<int>.<frac> * unit`, exactly.
fn scale(int: &str, frac: &str, unit: u128) -> Result<u128, ScaleError> {
    let whole = int
        .parse::<u128>()
        .ok()
        .and_then(|i| i.checked_mul(unit))
        .ok_or(TooLarge)?;
    if frac.is_empty() {
        return Ok(whole);
    }
    if frac.len() > MAX_DECIMALS {
        return Err(TooManyDecimals);
    }
    let denominator = 10u128.pow(frac.len() as u32);
    // frac < 10^18 and unit < 2^42, so this cannot overflow.
    let numerator = frac.parse::<u128>().map_err(|_| TooLarge)? * unit;
    if !numerator.is_multiple_of(denominator) {
        return Err(Inexact);
    }
    whole.checked_add(numerator / denominator).ok_or(TooLarge)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;
    use crate::mirror::DEFAULT_LEASE_TTL;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("aether-replicator").chain(args.iter().copied()))
    }

    fn config(args: &[&str]) -> Result<Config, ConfigError> {
        parse(args)
            .expect("clap accepts the args")
            .run_args()
            .validate()
    }

    /// Asserts that validation refuses `args` with a one-line message that
    /// starts with `flag` and contains `needle`.
    #[track_caller]
    fn refused(args: &[&str], flag: &str, needle: &str) -> String {
        let err = config(args).expect_err("validation refuses the args");
        let msg = err.to_string();
        assert_eq!(err.flag(), flag, "{msg}");
        assert!(
            msg.starts_with(flag),
            "{msg:?} does not start with {flag:?}"
        );
        assert!(msg.contains(needle), "{msg:?} does not contain {needle:?}");
        assert!(!msg.contains('\n'), "{msg:?} is not one line");
        msg
    }

    /// PEM-shaped files for the TLS flags (validation reads only the
    /// framing; the handshake tests use real certificates).
    struct Pki {
        _dir: tempfile::TempDir,
        ca: String,
        cert: String,
        key: String,
    }

    fn pki() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, kind: &str| {
            let path = dir.path().join(name);
            std::fs::write(
                &path,
                format!("-----BEGIN {kind}-----\nAA==\n-----END {kind}-----\n"),
            )
            .unwrap();
            path.to_str().unwrap().to_string()
        };
        Pki {
            ca: file("ca.pem", "CERTIFICATE"),
            cert: file("cert.pem", "CERTIFICATE"),
            key: file("key.pem", "PRIVATE KEY"),
            _dir: dir,
        }
    }

    #[test]
    fn tls_files_that_are_not_pem() {
        let pki = pki();
        let local_ca = format!("--local-ca={}", pki.key);
        assert_eq!(
            refused(
                &["--region=a", "--local-etcd=https://x:1", &local_ca],
                "--local-ca",
                "no PEM",
            ),
            format!(
                "--local-ca {:?}: no PEM \"-----BEGIN ...CERTIFICATE-----\" block",
                pki.key
            )
        );
        let peer_tls = format!("b=ca={},cert={},key={}", pki.ca, pki.cert, pki.cert);
        refused(
            &[
                "--region=a",
                "--peer-etcd=b=https://b:1",
                &format!("--peer-tls={peer_tls}"),
            ],
            "--peer-tls",
            "PRIVATE KEY",
        );
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn every_flag_has_its_env_var() {
        let cli = Cli::command();
        let check = cli.find_subcommand("check").unwrap().clone();
        for cmd in [&cli, &check] {
            let mut n = 0;
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                let want = format!(
                    "{ENV_PREFIX}{}",
                    long.to_ascii_uppercase().replace('-', "_")
                );
                assert_eq!(
                    arg.get_env().and_then(|e| e.to_str()),
                    Some(want.as_str()),
                    "--{long}"
                );
                n += 1;
            }
            assert_eq!(n, 20);
        }
    }

    #[test]
    fn defaults() {
        let c = config(&["--region", "a"]).unwrap();
        assert_eq!(c.region, "a");
        assert_eq!(c.local, ClientConfig::new(["http://127.0.0.1:2379"]));
        assert!(c.peers.is_empty());
        let mirror = MirrorConfig {
            lease_ttl: DEFAULT_LEASE_TTL,
            ..MirrorConfig::new("a")
        };
        assert_eq!(c.mirror, mirror);
        assert_eq!(c.mirror.limits, TxnLimits::default());
        assert_eq!(c.mirror.root, DEFAULT_ROOT);
        assert_eq!(c.election_ttl, Duration::from_secs(10));
        assert_eq!(c.metrics_addr, "127.0.0.1:9464".parse().unwrap());
        assert_eq!(c.log_format, LogFormat::Text);
    }

    #[test]
    fn everything_set() {
        let pki = pki();
        let local_cert = format!("--local-cert={}", pki.cert);
        let local_key = format!("--local-key={}", pki.key);
        let local_ca = format!("--local-ca={}", pki.ca);
        let peer_tls = format!(
            "b=ca={},cert={},key={},server-name=etcd.b",
            pki.ca, pki.cert, pki.key
        );
        let c = config(&[
            "--region=a",
            "--local-etcd=https://l1:2379, https://l2:2379",
            &local_ca,
            &local_cert,
            &local_key,
            "--local-server-name=etcd.a",
            "--local-user=root",
            "--local-password=pw",
            "--peer-etcd=b=https://b1:2379,https://b2:2379",
            "--peer-etcd",
            "c=http://c:2379",
            "--peer-tls",
            &peer_tls,
            "--peer-auth=c=mirror:p:a=ss",
            "--lease-ttl=1m30s",
            "--election-ttl=20s",
            "--max-txn-ops=64",
            "--max-request-bytes=512KiB",
            "--max-inflight=3",
            "--page-size=500",
            "--root=/tenant/aether/v1/regions/",
            "--metrics-addr=[::1]:9000",
            "--log-format=json",
        ])
        .unwrap();
        assert_eq!(c.local.endpoints, ["https://l1:2379", "https://l2:2379"]);
        let tls = TlsConfig {
            ca_file: Some(pki.ca.clone()),
            cert_file: Some(pki.cert.clone()),
            key_file: Some(pki.key.clone()),
            server_name: Some("etcd.a".into()),
        };
        assert_eq!(c.local.tls, Some(tls.clone()));
        let root = Credentials {
            user: "root".into(),
            password: "pw".into(),
        };
        assert_eq!(c.local.credentials, Some(root));

        assert_eq!(c.peers.len(), 2);
        assert_eq!(c.peers[0].region, "b");
        assert_eq!(
            c.peers[0].client.endpoints,
            ["https://b1:2379", "https://b2:2379"]
        );
        let b_tls = TlsConfig {
            server_name: Some("etcd.b".into()),
            ..tls
        };
        assert_eq!(c.peers[0].client.tls, Some(b_tls));
        assert_eq!(c.peers[0].client.credentials, None);
        assert_eq!(c.peers[1].region, "c");
        assert_eq!(c.peers[1].client.tls, None);
        let mirror = Credentials {
            user: "mirror".into(),
            password: "p:a=ss".into(),
        };
        assert_eq!(c.peers[1].client.credentials, Some(mirror));

        assert_eq!(c.mirror.region, "a");
        assert_eq!(c.mirror.root, "/tenant/aether/v1/regions/");
        assert_eq!(c.mirror.lease_ttl, Duration::from_secs(90));
        assert_eq!(c.election_ttl, Duration::from_secs(20));
        let limits = TxnLimits {
            max_ops: 64,
            max_bytes: 512 * 1024,
        };
        assert_eq!(c.mirror.limits, limits);
        assert_eq!(c.mirror.max_inflight, 3);
        assert_eq!(c.mirror.page_size, 500);
        assert_eq!(c.metrics_addr, "[::1]:9000".parse().unwrap());
        assert_eq!(c.log_format, LogFormat::Json);
    }

    #[test]
    fn check_subcommand_takes_the_same_flags() {
        let cli = parse(&["check", "--region", "a", "--peer-etcd", "b=http://b:2379"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Check(_))));
        let c = cli.run_args().validate().unwrap();
        assert_eq!(c.region, "a");
        assert_eq!(c.peers[0].region, "b");

        let cli = parse(&["--region", "a"]).unwrap();
        assert!(cli.command.is_none());
        assert_eq!(cli.run_args().region.as_deref(), Some("a"));
    }

    #[test]
    fn clap_errors_exit_with_2() {
        for args in [
            &[][..],
            &["check"],
            &["--region", "a", "check"],
            &["--region", "a", "--max-txn-ops", "many"],
            &["--region", "a", "--log-format", "xml"],
            &["--region", "a", "--bogus"],
        ] {
            let err = parse(args).expect_err("clap refuses");
            assert_eq!(err.exit_code(), 2, "{args:?}: {err}");
        }
        let err = parse(&[]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingRequiredArgument);
        assert!(err.to_string().contains("--region"));
    }

    #[test]
    fn bad_metrics_addr_is_a_clap_error() {
        for addr in ["localhost", "127.0.0.1", "127.0.0.1:http", "1.2.3.4:70000"] {
            let err = parse(&["--region", "a", "--metrics-addr", addr]).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{addr}");
            assert!(err.to_string().contains("--metrics-addr"), "{err}");
        }
    }

    #[test]
    fn several_peers_in_one_value() {
        let c = config(&[
            "--region=a",
            "--peer-etcd",
            "b=http://b:2379;c=http://c1:2379,http://c2:2379",
            "--peer-auth",
            "b=u:p;c=v:q",
        ])
        .unwrap();
        let regions: Vec<_> = c.peers.iter().map(|p| p.region.as_str()).collect();
        assert_eq!(regions, ["b", "c"]);
        assert_eq!(
            c.peers[1].client.endpoints,
            ["http://c1:2379", "http://c2:2379"]
        );
        assert_eq!(c.peers[1].client.credentials.as_ref().unwrap().user, "v");
    }

    #[test]
    fn passwords_are_not_in_debug_output() {
        let cli = parse(&[
            "--region=a",
            "--local-user=root",
            "--local-password=hunter2",
            "--peer-etcd=b=http://b:2379",
            "--peer-auth=b=u:swordfish",
        ])
        .unwrap();
        let shown = format!("{cli:?} {:?}", cli.run_args().validate().unwrap());
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("swordfish"), "{shown}");
    }

    #[test]
    fn peer_spec_without_equals() {
        let msg = refused(
            &["--region=a", "--peer-etcd=b"],
            "--peer-etcd",
            "missing '='",
        );
        assert_eq!(
            msg,
            "--peer-etcd \"b\": missing '=' (expected <region>=<url>[,<url>...])"
        );
    }

    #[test]
    fn empty_endpoint_lists() {
        refused(
            &["--region=a", "--peer-etcd=b="],
            "--peer-etcd",
            "--peer-etcd b: empty endpoint list",
        );
        refused(
            &["--region=a", "--peer-etcd=b=,"],
            "--peer-etcd",
            "--peer-etcd b: empty endpoint list",
        );
        refused(
            &["--region=a", "--local-etcd="],
            "--local-etcd",
            "--local-etcd: empty endpoint list",
        );
        refused(
            &["--region=a", "--local-etcd", " , "],
            "--local-etcd",
            "empty endpoint list",
        );
        refused(
            &["--region=a", "--local-etcd=http://x:1,"],
            "--local-etcd",
            "empty URL in endpoint list",
        );
    }

    #[test]
    fn urls_that_are_not_endpoints() {
        let msg = refused(
            &["--region=a", "--peer-etcd=b=htp:/x"],
            "--peer-etcd",
            "not a valid URL",
        );
        assert_eq!(
            msg,
            "--peer-etcd b: \"htp:/x\" is not a valid URL (expected http://host:port or https://host:port)"
        );
        for url in [
            "127.0.0.1:2379",
            "ftp://x:21",
            "http://",
            "http://:2379",
            "http://x:0",
            "http://x:65536",
            "http://x:port",
            "http://x:",
            "http://user:pw@x:2379",
            "http://x:2379/v3",
            "http://x:2379?a=b",
            "http://x:2379#f",
            "http://x y:2379",
            "HTTP://x:2379",
        ] {
            refused(
                &["--region=a", "--local-etcd", url],
                "--local-etcd",
                "is not a valid URL",
            );
        }
        for url in [
            "http://x",
            "http://x:2379/",
            "https://[fd00::1]:2379",
            "http://10.0.0.1:2379",
        ] {
            let mut args = vec!["--region=a", "--local-etcd", url];
            let pki = pki();
            let ca = format!("--local-ca={}", pki.ca);
            if url.starts_with("https") {
                args.push(&ca);
            }
            config(&args).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    #[test]
    fn duplicate_endpoints() {
        refused(
            &["--region=a", "--local-etcd=http://x:1,http://X:1/"],
            "--local-etcd",
            "duplicate endpoint",
        );
        refused(
            &[
                "--region=a",
                "--local-etcd=http://x:1",
                "--peer-etcd=b=http://x:1",
            ],
            "--peer-etcd",
            "--peer-etcd b: endpoint \"http://x:1\" is also in --local-etcd",
        );
        refused(
            &[
                "--region=a",
                "--peer-etcd=b=http://x:1",
                "--peer-etcd=c=http://x:1",
            ],
            "--peer-etcd",
            "is also in --peer-etcd b",
        );
    }

    #[test]
    fn mixed_schemes() {
        let pki = pki();
        let ca = format!("--local-ca={}", pki.ca);
        refused(
            &["--region=a", "--local-etcd=http://x:1,https://y:1", &ca],
            "--local-etcd",
            "mixes http:// and https://",
        );
    }

    #[test]
    fn duplicate_peer_region() {
        let msg = refused(
            &[
                "--region=a",
                "--peer-etcd=b=http://b1:1",
                "--peer-etcd=b=http://b2:1",
            ],
            "--peer-etcd",
            "duplicate",
        );
        assert_eq!(msg, "--peer-etcd: duplicate peer region \"b\"");
    }

    #[test]
    fn peer_is_this_region() {
        let msg = refused(
            &["--region=a", "--peer-etcd=a=http://x:1"],
            "--peer-etcd",
            "this region",
        );
        assert_eq!(
            msg,
            "--peer-etcd \"a=http://x:1\": peer region is this region (--region a)"
        );
    }

    #[test]
    fn peer_region_with_slash_or_empty() {
        refused(
            &["--region=a", "--peer-etcd=b/c=http://x:1"],
            "--peer-etcd",
            "contains '/'",
        );
        refused(
            &["--region=a", "--peer-etcd==http://x:1"],
            "--peer-etcd",
            "empty peer region",
        );
    }

    #[test]
    fn region_empty_or_with_slash() {
        assert_eq!(
            refused(&["--region="], "--region", "must not be empty"),
            "--region \"\": must not be empty"
        );
        refused(&["--region=a/b"], "--region", "must not contain '/'");
    }

    #[test]
    fn zero_duration() {
        assert_eq!(
            refused(
                &["--region=a", "--lease-ttl=0s"],
                "--lease-ttl",
                "greater than zero"
            ),
            "--lease-ttl \"0s\": must be greater than zero"
        );
        refused(
            &["--region=a", "--election-ttl=0ms"],
            "--election-ttl",
            "greater than zero",
        );
        refused(
            &["--region=a", "--lease-ttl=0h0m0s"],
            "--lease-ttl",
            "greater than zero",
        );
    }

    #[test]
    fn malformed_durations() {
        for (raw, why) in [
            ("abc", "not a duration"),
            ("10", "missing unit"),
            ("10x", "unknown unit"),
            ("-5s", "negative"),
            ("", "empty duration"),
            ("1.s", "not a duration"),
            (".5s", "not a duration"),
            ("1s30m", "largest to smallest"),
            ("1s1s", "largest to smallest"),
            ("1m 30s", "unknown unit"),
            ("99999999999999999999999999999999999999999h", "too large"),
        ] {
            let flag = format!("--lease-ttl={raw}");
            refused(&["--region=a", &flag], "--lease-ttl", why);
        }
    }

    #[test]
    fn ttls_are_whole_seconds() {
        refused(
            &["--region=a", "--lease-ttl=1500ms"],
            "--lease-ttl",
            "whole number of seconds",
        );
        refused(
            &["--region=a", "--election-ttl=2.5s"],
            "--election-ttl",
            "whole number of seconds",
        );
        refused(
            &["--region=a", "--lease-ttl=9000000001s"],
            "--lease-ttl",
            "at most",
        );
        let c = config(&["--region=a", "--lease-ttl=2500ms", "--election-ttl=1s"]);
        assert!(c.is_err());
        let c = config(&["--region=a", "--lease-ttl=1.5m"]).unwrap();
        assert_eq!(c.mirror.lease_ttl, Duration::from_secs(90));
    }

    #[test]
    fn election_ttl_at_most_half_the_lease_ttl() {
        assert_eq!(
            refused(
                &["--region=a", "--lease-ttl=30s", "--election-ttl=16s"],
                "--election-ttl",
                "at most half"
            ),
            "--election-ttl 16s must be at most half of --lease-ttl 30s, so a successor takes over before the peers' copies can expire"
        );
        refused(
            &["--region=a", "--lease-ttl=30s", "--election-ttl=1m"],
            "--election-ttl",
            "must be at most half of --lease-ttl 30s",
        );
        let c = config(&["--region=a", "--lease-ttl=30s", "--election-ttl=15s"]).unwrap();
        assert_eq!(c.election_ttl, Duration::from_secs(15));
        refused(
            &["--region=a", "--lease-ttl=1s"],
            "--election-ttl",
            "the default",
        );
    }

    #[test]
    fn default_election_ttl_is_a_third_rounded_up() {
        for (lease, election) in [(30, 10), (31, 11), (2, 1), (3, 1), (4, 2), (90, 30)] {
            let lease_ttl = format!("--lease-ttl={lease}s");
            let c = config(&["--region=a", &lease_ttl]).unwrap();
            assert_eq!(c.election_ttl, Duration::from_secs(election), "{lease}s");
        }
    }

    #[test]
    fn limits() {
        refused(
            &["--region=a", "--max-txn-ops=1"],
            "--max-txn-ops",
            "at least 2",
        );
        refused(
            &["--region=a", "--max-inflight=0"],
            "--max-inflight",
            "at least 1",
        );
        refused(
            &["--region=a", "--page-size=0"],
            "--page-size",
            "at least 1",
        );
        refused(
            &["--region=a", "--max-request-bytes=4095"],
            "--max-request-bytes",
            "at least 4096",
        );
        refused(
            &["--region=a", "--max-request-bytes=65MiB"],
            "--max-request-bytes",
            "at most",
        );
        refused(
            &["--region=a", "--max-request-bytes=1.5MB"],
            "--max-request-bytes",
            "ambiguous",
        );
        refused(
            &["--region=a", "--max-request-bytes=1.3KiB"],
            "--max-request-bytes",
            "whole number",
        );
        refused(
            &["--region=a", "--max-request-bytes=lots"],
            "--max-request-bytes",
            "not a size",
        );
        let c = config(&[
            "--region=a",
            "--max-txn-ops=2",
            "--max-request-bytes=1.5 MiB",
        ])
        .unwrap();
        assert_eq!(
            c.mirror.limits,
            TxnLimits {
                max_ops: 2,
                max_bytes: 1572864
            }
        );
    }

    #[test]
    fn bad_root() {
        for (root, why) in [
            ("aether/", "must start with '/'"),
            ("/aether", "must end with '/'"),
            ("/", "at least one segment"),
            ("/a//b/", "empty segment"),
        ] {
            let root_flag = format!("--root={root}");
            refused(&["--region=a", &root_flag], "--root", why);
        }
        refused(&["--region=a", "--root=/aether/v1/"], "--root", "overlaps");
        refused(
            &["--region=a", "--root=/aether/v1/replication/x/"],
            "--root",
            "overlaps",
        );
    }

    #[test]
    fn cert_without_key() {
        let pki = pki();
        let cert = format!("--local-cert={}", pki.cert);
        let key = format!("--local-key={}", pki.key);
        let ca = format!("--local-ca={}", pki.ca);
        let https = "--local-etcd=https://x:1";
        assert_eq!(
            refused(
                &["--region=a", https, &ca, &cert],
                "--local-cert",
                "without"
            ),
            "--local-cert is given without --local-key"
        );
        refused(
            &["--region=a", https, &ca, &key],
            "--local-key",
            "--local-key is given without --local-cert",
        );
        let peer_tls = format!("b=ca={},cert={}", pki.ca, pki.cert);
        assert_eq!(
            refused(
                &[
                    "--region=a",
                    "--peer-etcd=b=https://b:1",
                    "--peer-tls",
                    &peer_tls
                ],
                "--peer-tls",
                "without"
            ),
            "--peer-tls b: cert is given without key"
        );
    }

    #[test]
    fn missing_tls_file() {
        let pki = pki();
        let msg = refused(
            &[
                "--region=a",
                "--local-etcd=https://x:1",
                "--local-ca=/nonexistent/ca.pem",
            ],
            "--local-ca",
            "/nonexistent/ca.pem",
        );
        assert!(
            msg.starts_with("--local-ca \"/nonexistent/ca.pem\": "),
            "{msg}"
        );
        let peer_tls = format!("b=ca={},key=/nonexistent/k.pem,cert={}", pki.ca, pki.cert);
        refused(
            &[
                "--region=a",
                "--peer-etcd=b=https://b:1",
                "--peer-tls",
                &peer_tls,
            ],
            "--peer-tls",
            "--peer-tls b: key \"/nonexistent/k.pem\": ",
        );
        let dir = format!("--local-ca={}", pki._dir.path().display());
        refused(
            &["--region=a", "--local-etcd=https://x:1", &dir],
            "--local-ca",
            "not a file",
        );
    }

    #[test]
    fn unknown_peer_tls_field() {
        let pki = pki();
        let peer_tls = format!("b=ca={},sni=x", pki.ca);
        let msg = refused(
            &[
                "--region=a",
                "--peer-etcd=b=https://b:1",
                "--peer-tls",
                &peer_tls,
            ],
            "--peer-tls",
            "unknown setting \"sni\"",
        );
        assert!(
            msg.contains("expected ca, cert, key or server-name"),
            "{msg}"
        );
        for bad in ["b=ca", "b=", "b", "b=ca=", "b=server-name=x,server-name=y"] {
            refused(
                &["--region=a", "--peer-etcd=b=https://b:1", "--peer-tls", bad],
                "--peer-tls",
                "",
            );
        }
    }

    #[test]
    fn peer_tls_for_unknown_region() {
        let pki = pki();
        let peer_tls = format!("c=ca={}", pki.ca);
        assert_eq!(
            refused(
                &[
                    "--region=a",
                    "--peer-etcd=b=https://b:1",
                    "--peer-tls",
                    &peer_tls
                ],
                "--peer-tls",
                "no --peer-etcd"
            ),
            "--peer-tls c: there is no --peer-etcd for region \"c\""
        );
        refused(
            &[
                "--region=a",
                "--peer-etcd=b=http://b:1",
                "--peer-auth=c=u:p",
            ],
            "--peer-auth",
            "no --peer-etcd for region \"c\"",
        );
    }

    #[test]
    fn duplicate_peer_tls() {
        let pki = pki();
        let peer_tls = format!("b=ca={}", pki.ca);
        refused(
            &[
                "--region=a",
                "--peer-etcd=b=https://b:1",
                "--peer-tls",
                &peer_tls,
                "--peer-tls",
                &peer_tls,
            ],
            "--peer-tls",
            "duplicate entry for peer region \"b\"",
        );
        refused(
            &[
                "--region=a",
                "--peer-etcd=b=http://b:1",
                "--peer-auth=b=u:p",
                "--peer-auth=b=v:q",
            ],
            "--peer-auth",
            "duplicate entry",
        );
    }

    #[test]
    fn https_needs_a_ca() {
        assert_eq!(
            refused(
                &["--region=a", "--peer-etcd=b=https://b:1"],
                "--peer-etcd",
                "needs"
            ),
            "--peer-etcd b: https endpoint needs --peer-tls b=ca=..."
        );
        refused(
            &["--region=a", "--local-etcd=https://x:1"],
            "--local-etcd",
            "needs --local-ca",
        );
        refused(
            &[
                "--region=a",
                "--peer-etcd=b=https://b:1",
                "--peer-tls=b=server-name=x",
            ],
            "--peer-etcd",
            "needs --peer-tls b=ca=",
        );
    }

    #[test]
    fn tls_for_plain_http_is_refused() {
        let pki = pki();
        let ca = format!("--local-ca={}", pki.ca);
        refused(
            &["--region=a", &ca],
            "--local-etcd",
            "no endpoint is https://",
        );
        let peer_tls = format!("b=ca={}", pki.ca);
        refused(
            &[
                "--region=a",
                "--peer-etcd=b=http://b:1",
                "--peer-tls",
                &peer_tls,
            ],
            "--peer-tls",
            "no --peer-etcd b endpoint is https://",
        );
    }

    #[test]
    fn auth_errors() {
        refused(
            &["--region=a", "--local-user=root"],
            "--local-user",
            "needs --local-password",
        );
        refused(
            &["--region=a", "--local-password=x"],
            "--local-password",
            "needs --local-user",
        );
        refused(
            &["--region=a", "--local-user=", "--local-password=x"],
            "--local-user",
            "empty",
        );
        let peer = "--peer-etcd=b=http://b:1";
        for (auth, why) in [
            ("b=user", "missing ':'"),
            ("b=:pw", "empty user"),
            ("b=user:", "empty password"),
            ("user:pw", "has no '='"),
            ("user:p=w", "does not start with a --peer-etcd region"),
        ] {
            let flag = format!("--peer-auth={auth}");
            let msg = refused(&["--region=a", peer, &flag], "--peer-auth", why);
            assert!(!msg.contains("pw") && !msg.contains("p=w"), "{msg}");
        }
    }

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        for (raw, want) in [
            ("30s", ms(30_000)),
            ("500ms", ms(500)),
            ("2m", ms(120_000)),
            ("1h", ms(3_600_000)),
            ("1m30s", ms(90_000)),
            ("1h2m3s4ms", ms(3_723_004)),
            ("1.5s", ms(1500)),
            ("0.001s", ms(1)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("7ns", Duration::from_nanos(7)),
            ("0m5s", ms(5000)),
        ] {
            assert_eq!(parse_duration(raw), Ok(want), "{raw}");
        }
        assert_eq!(parse_duration("30s"), Ok(DEFAULT_LEASE_TTL));
        for raw in ["0s", "0", "abc", "10", "10x", "-5s", "", "1.5ns", "s", "1S"] {
            assert!(parse_duration(raw).is_err(), "{raw}");
        }
    }

    #[test]
    fn byte_sizes() {
        for (raw, want) in [
            ("1572864", 1_572_864),
            ("1.5MiB", 1_572_864),
            ("512KiB", 524_288),
            ("512kib", 524_288),
            ("4096B", 4096),
            ("1GiB", 1 << 30),
            ("0.5 KiB", 512),
        ] {
            assert_eq!(parse_byte_size(raw), Ok(want), "{raw}");
        }
        assert_eq!(
            parse_byte_size(&DEFAULT_MAX_REQUEST_BYTES.to_string()),
            Ok(DEFAULT_MAX_REQUEST_BYTES as u64)
        );
        for raw in [
            "",
            "x",
            "-1",
            "1.5",
            "1MB",
            "1TiB",
            "1.KiB",
            "99999999999999999999999GiB",
        ] {
            assert!(parse_byte_size(raw).is_err(), "{raw}");
        }
    }

    fn endpoints_config(args: &[&str]) -> Result<EndpointsConfig, ConfigError> {
        let mut argv = vec!["endpoints"];
        argv.extend_from_slice(args);
        match parse(&argv).expect("clap accepts the args").command {
            Some(Command::Endpoints(a)) => a.validate(),
            other => panic!("not endpoints: {other:?}"),
        }
    }

    fn migrate_config(args: &[&str]) -> Result<MigrateConfig, ConfigError> {
        let mut argv = vec!["migrate"];
        argv.extend_from_slice(args);
        match parse(&argv).expect("clap accepts the args").command {
            Some(Command::Migrate(a)) => a.validate(),
            other => panic!("not migrate: {other:?}"),
        }
    }

    #[track_caller]
    fn refused_by(err: ConfigError, flag: &str, needle: &str) -> String {
        let msg = err.to_string();
        assert_eq!(err.flag(), flag, "{msg}");
        assert!(msg.starts_with(flag), "{msg:?}");
        assert!(msg.contains(needle), "{msg:?} does not contain {needle:?}");
        assert!(!msg.contains('\n'), "{msg:?} is not one line");
        msg
    }

    #[test]
    fn endpoints_flags() {
        let c = endpoints_config(&[
            "--region=b",
            "--zone=b-1",
            "--service=checkout",
            "--watch",
            "--output=json",
            "--root=/t/aether/v1/regions/",
            "--local-etcd=http://e1:2379,http://e2:2379",
            "--page-size=7",
        ])
        .unwrap();
        assert_eq!(
            c.local,
            ClientConfig::new(["http://e1:2379", "http://e2:2379"])
        );
        let o = c.options;
        assert_eq!(o.view.region, "b");
        assert_eq!(o.view.zone.as_deref(), Some("b-1"));
        assert_eq!(o.view.schema.root(), "/t/aether/v1/regions/");
        assert_eq!(o.view.page_size, 7);
        assert_eq!(o.service.as_deref(), Some("checkout"));
        assert!(o.watch);
        assert_eq!(o.output, Output::Json);
        let d = endpoints_config(&["--region=b"]).unwrap().options;
        assert_eq!(
            (d.watch, d.output, d.view.zone),
            (false, Output::Table, None)
        );
        assert!(parse(&["endpoints"]).is_err(), "--region is required");
    }

    #[test]
    fn endpoints_refusals() {
        for (args, flag, needle) in [
            (&["--region=a/b"][..], "--region", "'/'"),
            (&["--region="][..], "--region", "empty"),
            (&["--region=b", "--zone="][..], "--zone", "empty"),
            (&["--region=b", "--service=a/b"][..], "--service", "'/'"),
            (&["--region=b", "--root=/x"][..], "--root", "end with"),
            (
                &["--region=b", "--page-size=0"][..],
                "--page-size",
                "at least 1",
            ),
            (
                &["--region=b", "--local-etcd=ftp://x"][..],
                "--local-etcd",
                "not a valid URL",
            ),
            (
                &["--region=b", "--local-etcd=https://x:1"][..],
                "--local-etcd",
                "--local-ca",
            ),
            (
                &["--region=b", "--local-user=u"][..],
                "--local-user",
                "--local-password",
            ),
        ] {
            refused_by(endpoints_config(args).unwrap_err(), flag, needle);
        }
    }

    #[test]
    fn migrate_flags() {
        let c = migrate_config(&[
            "--region=a",
            "--cluster=c1",
            "--legacy-prefix=/old/services/",
            "--apply",
            "--delete-legacy",
            "--max-txn-ops=32",
            "--max-request-bytes=64KiB",
        ])
        .unwrap();
        let o = c.options;
        assert_eq!(o.region.as_deref(), Some("a"));
        assert_eq!(o.cluster.as_deref(), Some("c1"));
        assert_eq!(o.legacy_prefix, "/old/services/");
        assert!(o.apply && o.delete_legacy);
        assert_eq!(
            o.limits,
            TxnLimits {
                max_ops: 32,
                max_bytes: 65536
            }
        );
        let d = migrate_config(&[]).unwrap().options;
        assert_eq!(d, MigrateOptions::new(None, None), "a dry run by default");
    }

    #[test]
    fn migrate_refusals() {
        for (args, flag, needle) in [
            (&["--region=a/b"][..], "--region", "'/'"),
            (&["--cluster="][..], "--cluster", "empty"),
            (
                &["--legacy-prefix=aether/"][..],
                "--legacy-prefix",
                "start with",
            ),
            (
                &["--legacy-prefix=/aether/"][..],
                "--legacy-prefix",
                "overlaps --root",
            ),
            (
                &["--legacy-prefix=/aether/v1/regions/x/"][..],
                "--legacy-prefix",
                "overlaps --root",
            ),
            (
                &["--legacy-prefix=/aether/v1/replication/"][..],
                "--legacy-prefix",
                "replication state",
            ),
            (&["--max-txn-ops=1"][..], "--max-txn-ops", "at least 2"),
            (
                &["--max-request-bytes=1MB"][..],
                "--max-request-bytes",
                "ambiguous",
            ),
            (&["--page-size=0"][..], "--page-size", "at least 1"),
            (
                &["--local-password=x"][..],
                "--local-password",
                "--local-user",
            ),
        ] {
            refused_by(migrate_config(args).unwrap_err(), flag, needle);
        }
    }

    #[test]
    fn subcommand_flags_have_env_vars_except_the_destructive_ones() {
        let cli = Cli::command();
        for name in ["endpoints", "migrate"] {
            let cmd = cli.find_subcommand(name).unwrap();
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                let env = arg.get_env().and_then(|e| e.to_str());
                if matches!(long, "apply" | "delete-legacy") {
                    assert_eq!(env, None, "--{long}");
                    continue;
                }
                let want = format!(
                    "{ENV_PREFIX}{}",
                    long.to_ascii_uppercase().replace('-', "_")
                );
                assert_eq!(env, Some(want.as_str()), "{name} --{long}");
            }
        }
    }
}
