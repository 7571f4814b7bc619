//! The argument definitions: every flag once, shared through
//! `#[command(flatten)]`.

// The doc comments below are the --help text, so their <placeholders> are
// meant literally, not as HTML.
#![allow(rustdoc::invalid_html_tags)]

use std::fmt;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use super::super::endpoints::Output;
use super::super::metrics::LONG_VERSION;
use super::super::migrate::DEFAULT_LEGACY_PREFIX;
use super::super::parse::parse_duration;
use super::super::status::StatusOutput;
use super::settings::Settings;
use crate::etcd::{DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS};
use crate::mirror::DEFAULT_PAGE_SIZE;
use crate::schema::DEFAULT_ROOT;

/// Mirrors this region's subtree of the endpoint registry into the etcd of
/// every peer region.
#[derive(Debug, Parser)]
#[command(
    name = "aether-replicator",
    version = LONG_VERSION,
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
    /// Validate the settings (file, flags, environment; TLS and password
    /// files readable) exactly as a run would, print a summary and exit 0,
    /// or the error and exit 2. Connects to nothing.
    #[arg(long)]
    pub check_config: bool,
}

/// The help headings of a run's flags that tune the engine and the
/// process. `check`, `status` and `setup-auth` accept them (so the very
/// command line and variables of a run work), but do not list them: they
/// connect and compare, and these do not change what they do.
const RUN_ONLY_HEADINGS: [&str; 3] = ["Mirror", "Freshness", "Process"];

/// The run flags under [`RUN_ONLY_HEADINGS`] that a subcommand does use.
fn used_by(subcommand: &str, id: &str) -> bool {
    match subcommand {
        "check" => matches!(id, "root" | "page_size"),
        _ => id == "root",
    }
}

impl Cli {
    /// The command line as the binary parses it and as `--help`, the shell
    /// completions and the man page show it: [`Cli`]'s, with the run flags a
    /// subcommand accepts but does not use hidden from its help.
    pub fn command_line() -> clap::Command {
        let mut cmd = Cli::command();
        for sub in ["check", "status", "setup-auth"] {
            cmd = cmd.mut_subcommand(sub, |mut c| {
                let hidden: Vec<clap::Id> = c
                    .get_arguments()
                    .filter(|a| {
                        a.get_help_heading()
                            .is_some_and(|h| RUN_ONLY_HEADINGS.contains(&h))
                            && !used_by(sub, a.get_id().as_str())
                    })
                    .map(|a| a.get_id().clone())
                    .collect();
                for id in hidden {
                    c = c.mut_arg(id, |a| a.hide(true));
                }
                c
            });
        }
        cmd
    }

    /// Parses the process's arguments with [`Cli::command_line`].
    pub fn parse_args() -> Result<Cli, clap::Error> {
        let mut cmd = Cli::command_line();
        let matches = cmd.try_get_matches_from_mut(std::env::args_os())?;
        Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
    }

    /// The flags in effect: the subcommand's, or the top-level ones.
    /// `endpoints` and `migrate` have their own flags; for them this is the
    /// (unset) top-level ones.
    pub fn run_args(&self) -> &RunArgs {
        match &self.command {
            Some(Command::Check(check)) => &check.run,
            Some(Command::Status(status)) => &status.run,
            Some(Command::SetupAuth(setup)) => &setup.run,
            Some(
                Command::Endpoints(_)
                | Command::Migrate(_)
                | Command::Completions(_)
                | Command::Man,
            )
            | None => &self.run,
        }
    }
}

/// The subcommands.
// Parsed once at start-up: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Compare this region's subtree in the local etcd with each peer's copy
    /// once, report the differences and exit.
    Check(CheckArgs),
    /// Print the merged endpoint registry as this region's consumers see
    /// it: first each origin region (synced yes/no, staleness in seconds),
    /// then its own endpoints and those mirrored in from other regions,
    /// ranked by locality. With --watch, keep printing changes.
    Endpoints(EndpointsArgs),
    /// Move the legacy flat layout (PREFIX SERVICE/protocols/PROTO/endpoints/IP)
    /// to the v1 keys. A dry run unless --apply or --delete-legacy.
    Migrate(MigrateArgs),
    /// Print this region's leader and, per peer, the state of its copy
    /// there (lease left, applied revision, lag, staleness, synced). Exit 1
    /// when something is wrong, with the reason on the row.
    Status(StatusArgs),
    /// Print the etcd users, roles and permissions this region's replicator
    /// needs (on its own etcd and on each peer's) as etcdctl commands, or
    /// with --apply create them, as --admin-user.
    SetupAuth(SetupAuthArgs),
    /// Print a shell completion script, e.g.
    /// `aether-replicator completions bash > /etc/bash_completion.d/aether-replicator`.
    Completions(CompletionsArgs),
    /// Print the man page (roff), e.g.
    /// `aether-replicator man > /usr/local/share/man/man1/aether-replicator.1`.
    Man,
}

/// The arguments of `completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// The flags of `check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The connection and mirror flags, as for a run.
    #[command(flatten)]
    pub run: RunArgs,
}

/// The flags of `status`: a run's, and how to print and judge.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Output format.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = StatusOutput::Table, help_heading = "Status")]
    pub output: StatusOutput,
    /// A copy whose heartbeat is older than this is reported stale (exit 1).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration, help_heading = "Status")]
    pub max_staleness: std::time::Duration,
    /// The connection flags, as for a run. After the flags above, so that
    /// `--help` lists this command's own options first.
    #[command(flatten)]
    pub run: RunArgs,
}

/// The local etcd's connection flags, as a run takes them, for the
/// subcommands that talk to the local etcd only.
#[derive(Clone, Debug, Args)]
pub struct LocalEtcdArgs {
    /// This region's etcd: comma-separated member URLs.
    /// [default: http://127.0.0.1:2379]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_ETCD",
        value_name = "URL[,URL...]",
        help_heading = "Local etcd"
    )]
    pub local_etcd: Option<String>,

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

    /// etcd user for the local etcd; needs --local-password-file.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_USER",
        value_name = "USER",
        help_heading = "Local etcd"
    )]
    pub local_user: Option<String>,

    /// File holding the password of --local-user (one line; re-read when it
    /// changes). Passwords are read from files only: a command line and an
    /// environment are visible to every local user and to `kubectl
    /// describe`.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_PASSWORD_FILE",
        value_name = "PATH",
        help_heading = "Local etcd"
    )]
    pub local_password_file: Option<String>,

    /// Refused, with the file form in the error: a password on the command
    /// line or in the environment (kept so that the error says what to do
    /// instead of "unexpected argument").
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOCAL_PASSWORD",
        hide = true,
        hide_env_values = true
    )]
    pub local_password: Option<Secret>,
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

    /// `--root`.
    #[command(flatten)]
    pub root: RootArg,

    /// Keys per page when reading the registry (at least 1). Pages are also
    /// held to 16 MiB, so large values make pages of fewer keys.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PAGE_SIZE",
        value_name = "N",
        default_value_t = DEFAULT_PAGE_SIZE
    )]
    pub page_size: usize,
}

/// `--root` of the subcommands that read the registry (`run`'s own is
/// optional: the config file may give it).
#[derive(Clone, Debug, Args)]
pub struct RootArg {
    /// The registry root: starts and ends with '/'.
    #[arg(long, env = "AETHER_REPLICATOR_ROOT", value_name = "PREFIX", default_value = DEFAULT_ROOT)]
    pub root: String,
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

    /// `--root`.
    #[command(flatten)]
    pub root: RootArg,

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

    /// Keys per page when reading (at least 1). Pages are also held to
    /// 16 MiB, so large values make pages of fewer keys.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PAGE_SIZE",
        value_name = "N",
        default_value_t = DEFAULT_PAGE_SIZE
    )]
    pub page_size: usize,
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

/// The flags shared by a run, `check` and `status`, as given.
/// [`RunArgs::validate`] lays them over the config file and turns them into
/// a [`Config`](super::Config).
#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    /// A TOML config file: the settings below by their long names in
    /// snake_case, with a table "local" and one table "peers.<region>" per peer.
    /// Flags and environment variables override it.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_CONFIG",
        value_name = "PATH",
        help_heading = "Regions"
    )]
    pub config: Option<String>,

    /// The local etcd: `--local-etcd` and its TLS and auth flags.
    #[command(flatten)]
    pub local: LocalEtcdArgs,

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

    /// etcd user for one peer's etcd, and the file holding its password
    /// (one line; re-read when it changes). Once per peer.
    ///
    /// Passwords are read from files only, never from the command line or
    /// the environment: `b=mirror-a:@/etc/aether/peer-b/password`.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PEER_AUTH",
        hide_env_values = true,
        value_name = "REGION=USER:@PATH",
        value_delimiter = ';',
        help_heading = "Peer etcd TLS and auth"
    )]
    pub peer_auth: Vec<Secret>,

    /// The settings that are one flag and one file key each.
    #[command(flatten)]
    pub settings: Settings,
}

/// The flags of `setup-auth`: a run's (whose users and password files it
/// sets up), and the admin credential `--apply` connects with.
///
/// `--apply` has no environment variable: what writes is asked for on the
/// command line.
#[derive(Debug, Args)]
pub struct SetupAuthArgs {
    /// Create the users, roles and permissions (idempotent: a role ends
    /// with exactly the planned permissions, a user with the password from
    /// the run's password file). Without it, print etcdctl commands.
    #[arg(long, help_heading = "Setup auth")]
    pub apply: bool,
    /// The user --apply connects as, on every etcd: one with the root role.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_ADMIN_USER",
        value_name = "USER",
        default_value = "root",
        help_heading = "Setup auth"
    )]
    pub admin_user: String,
    /// File holding --admin-user's password, for the local etcd and every
    /// peer without its own --peer-admin-password-file.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_ADMIN_PASSWORD_FILE",
        value_name = "PATH",
        help_heading = "Setup auth"
    )]
    pub admin_password_file: Option<String>,
    /// File holding --admin-user's password on one peer's etcd. Once per
    /// peer; several separated by ';'.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PEER_ADMIN_PASSWORD_FILE",
        value_name = "REGION=PATH",
        value_delimiter = ';',
        help_heading = "Setup auth"
    )]
    pub peer_admin_password_file: Vec<String>,
    /// The connection flags, as for a run: whose users and password files
    /// it sets up. After the flags above, so that `--help` lists this
    /// command's own options first.
    #[command(flatten)]
    pub run: RunArgs,
}
