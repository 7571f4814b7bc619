//! The settings of a run that are one flag and one top-level key of the
//! config file each: [`Settings`], where each is declared once, and
//! [`Layers`], which lays the flags over the file.
//!
//! A field is the flag `--<field-in-kebab-case>` (clap), its variable
//! `AETHER_REPLICATOR_<FIELD>` (`env = ...`) and the file key `<field>`
//! (serde); the flags (and variables) win over the file, the file over the
//! default. The `[local]` and `[peers.<region>]` tables, which group the
//! `--local-*` and `--peer-*` flags differently, are fields of the file
//! only (`#[arg(skip)]`).

// The doc comments below are the --help text, so their <placeholders> are
// meant literally, not as HTML, and their [brackets] are not links.
#![allow(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Deserializer};

use super::error::{ConfigError, Origin};
use super::file::{self, EtcdTable, PeerTable};
use crate::app::parse::{LISTEN_ADDR_FORM, parse_listen_addr};

/// The default `--metrics-addr`.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";
/// The default `--lease-ttl`, as given.
pub(super) const DEFAULT_LEASE_TTL_FLAG: &str = "30s";
/// The default `--log-level`.
pub const DEFAULT_LOG_LEVEL: &str = "info";
/// The default `--reload-interval`.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// A run's settings given by one flag (or its variable) or one top-level
/// key of the config file, by the same name; and the file's tables. As
/// flags, `local` and `peers` are always empty.
#[derive(Clone, Debug, Default, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// This region's name: the replicator mirrors <root><region>/ and
    /// nothing else.
    #[arg(
        long,
        env = "AETHER_REPLICATOR_REGION",
        value_name = "NAME",
        required_unless_present = "config",
        help_heading = "Regions"
    )]
    pub region: Option<String>,

    /// TTL of the lease under which each peer holds this region's copy: if
    /// the replicator is gone that long, the copy disappears. Whole seconds,
    /// at least 4s (etcd grants no lease under 2s, and the election TTL is
    /// at most half of this).
    ///
    /// Durations are a number and a unit, units from largest to smallest:
    /// 30s, 500ms, 2m, 1h, 1m30s, 1.5h (units h, m, s, ms, us, ns).
    /// [default: 30s]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LEASE_TTL",
        value_name = "DURATION",
        help_heading = "Mirror"
    )]
    pub lease_ttl: Option<String>,

    /// TTL of the leader-election session in the local etcd: how long a dead
    /// leader blocks a successor. Whole seconds, at least 2s (etcd's shortest
    /// lease), at most half of --lease-ttl so a successor takes over before
    /// the peers' copies expire. [default: a third of --lease-ttl, rounded
    /// up, at least 2s]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_ELECTION_TTL",
        value_name = "DURATION",
        help_heading = "Mirror"
    )]
    pub election_ttl: Option<String>,

    /// Most ops in one txn: the peers' etcd --max-txn-ops (at least 2).
    /// [default: 128, etcd's default]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_MAX_TXN_OPS",
        value_name = "N",
        help_heading = "Mirror"
    )]
    pub max_txn_ops: Option<usize>,

    /// Largest txn request: the peers' etcd --max-request-bytes. A number of
    /// bytes, or with a unit: 512KiB, 1.5MiB (B, KiB, MiB, GiB). At least
    /// 4096.
    /// [default: 1.5MiB, etcd's default]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_MAX_REQUEST_BYTES",
        value_name = "BYTES",
        help_heading = "Mirror"
    )]
    #[serde(default, deserialize_with = "file::byte_size")]
    pub max_request_bytes: Option<String>,

    /// Cap on the mirror txns in flight to one peer (at least 1); the
    /// window adapts below it to the measured round trip and throughput.
    /// [default: 256]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_MAX_INFLIGHT",
        value_name = "N",
        help_heading = "Mirror"
    )]
    pub max_inflight: Option<usize>,

    /// HTTP/2 connections to each peer endpoint (at least 1). Over a long
    /// link each new connection's flow-control window starts small at the
    /// server and grows a doubling every other round trip; several
    /// connections fill the pipe sooner.
    /// [default: 32]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PEER_CONNECTIONS",
        value_name = "N",
        help_heading = "Mirror"
    )]
    pub peer_connections: Option<usize>,

    /// Keys per page when scanning the local etcd and the peers (at least 1).
    /// Pages are also held to 16 MiB (and a quarter of the decode limit), so
    /// large values make pages of fewer keys. [default: 10000]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_PAGE_SIZE",
        value_name = "N",
        help_heading = "Mirror"
    )]
    pub page_size: Option<usize>,

    /// Range-diff syncs run at once over all peers (at least 1). Each holds
    /// a few pages of both sides and reads the source subtree in full, so
    /// this bounds the memory of a start (or of a regional outage's
    /// recovery) with many peers; peers beyond it wait for a slot. Raise it
    /// to the number of peers when each peer's write rate, not the source
    /// or memory, bounds a sync. [default: 4]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_MAX_CONCURRENT_SYNCS",
        value_name = "N",
        help_heading = "Mirror"
    )]
    pub max_concurrent_syncs: Option<usize>,

    /// How often to check each peer's and the source's identity and
    /// revision and write the heartbeat into the peer's state key; also the
    /// resolution of peer_staleness_seconds.
    /// [default: 5s]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_HEARTBEAT_INTERVAL",
        value_name = "DURATION",
        help_heading = "Freshness"
    )]
    pub heartbeat_interval: Option<String>,

    /// Let a peer's copy lapse (stop its keep-alive) once it has been
    /// stale this long even through a re-sync; "off" never does.
    /// [default: 5m]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LAPSE_AFTER",
        value_name = "DURATION|off",
        help_heading = "Freshness"
    )]
    pub lapse_after: Option<String>,

    /// How often to compare each peer's copy with the source and repair
    /// differences (anti-entropy); "off" never does.
    /// [default: 1h]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_VERIFY_INTERVAL",
        value_name = "DURATION|off",
        help_heading = "Freshness"
    )]
    pub verify_interval: Option<String>,

    /// Keys per second a verification pass reads from each peer (at
    /// least 1).
    /// [default: 5000]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_VERIFY_RATE",
        value_name = "N",
        help_heading = "Freshness"
    )]
    pub verify_rate: Option<u32>,

    /// The registry root: starts and ends with '/'.
    /// [default: /aether/v1/regions/]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_ROOT",
        value_name = "PREFIX",
        help_heading = "Mirror"
    )]
    pub root: Option<String>,

    /// Address to serve metrics and health checks on: IP:PORT, [IPv6]:PORT,
    /// localhost:PORT, or :PORT for every interface.
    /// [default: 127.0.0.1:9464]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_METRICS_ADDR",
        value_name = "HOST:PORT",
        value_parser = parse_listen_addr,
        help_heading = "Process"
    )]
    #[serde(default, deserialize_with = "metrics_addr")]
    pub metrics_addr: Option<SocketAddr>,

    /// Log line format.
    /// [default: text]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOG_FORMAT",
        value_name = "FORMAT",
        value_enum,
        help_heading = "Process"
    )]
    #[serde(default, deserialize_with = "log_format")]
    pub log_format: Option<LogFormat>,

    /// What to log: a level (error, warn, info, debug, trace), or
    /// directives per module, e.g. "info,aether_replicator::mirror=debug".
    /// [default: info]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_LOG_LEVEL",
        value_name = "LEVEL",
        help_heading = "Process"
    )]
    pub log_level: Option<String>,

    /// This replica's id in the leader election (shown as the leader).
    /// Unique per process; Kubernetes sets it from the pod name. [default:
    /// <hostname or "replica">-<pid>-<random>]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_REPLICA_ID",
        value_name = "ID",
        help_heading = "Process"
    )]
    pub replica_id: Option<String>,

    /// How often to re-read the TLS and password files, so that rotated
    /// certificates and passwords are used without a restart; "off" never
    /// re-reads them.
    /// [default: 10s]
    #[arg(
        long,
        env = "AETHER_REPLICATOR_RELOAD_INTERVAL",
        value_name = "DURATION",
        help_heading = "Process"
    )]
    pub reload_interval: Option<String>,

    /// `[local]`: the local etcd, as the `--local-*` flags give it.
    #[arg(skip)]
    pub(super) local: Option<EtcdTable>,

    /// `[peers.<region>]`: the peers, as the `--peer-*` flags give them.
    #[arg(skip)]
    #[serde(default)]
    pub(super) peers: BTreeMap<String, PeerTable>,
}

impl Settings {
    /// Reads the config file at `path`.
    pub(super) fn load(path: &str) -> Result<Settings, ConfigError> {
        file::load(path)
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

/// `metrics_addr` in the file: `HOST:PORT`, as `--metrics-addr` takes it.
fn metrics_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    file::parsed(d, "address", LISTEN_ADDR_FORM, |raw| {
        parse_listen_addr(raw).ok()
    })
}

/// `log_format` in the file, as `--log-format` takes it.
fn log_format<'de, D: Deserializer<'de>>(d: D) -> Result<Option<LogFormat>, D::Error> {
    file::parsed(d, "log format", "expected text or json", |raw| {
        LogFormat::from_str(raw, false).ok()
    })
}

/// The flags' settings over the file's.
pub(super) struct Layers<'a> {
    flags: &'a Settings,
    /// The file's path and contents.
    file: Option<(&'a str, &'a Settings)>,
}

impl<'a> Layers<'a> {
    pub(super) fn new(flags: &'a Settings, file: Option<(&'a str, &'a Settings)>) -> Self {
        Layers { flags, file }
    }

    /// The setting `key` (`field` of [`Settings`]): the flag's value, else
    /// the file's; with its origin (the flag when neither gives it, as the
    /// default is the flag's). See [`layered!`].
    pub(super) fn get<T: Clone>(
        &self,
        key: &'static str,
        field: impl Fn(&Settings) -> &Option<T>,
    ) -> (Option<T>, Origin) {
        if let Some(v) = field(self.flags) {
            return (Some(v.clone()), Origin::flag_of(key));
        }
        if let Some((path, file)) = self.file
            && let Some(v) = field(file)
        {
            return (Some(v.clone()), Origin::file(path, &[], key));
        }
        (None, Origin::flag_of(key))
    }
}

/// `layered!(layers, lease_ttl)`: [`Layers::get`] of a field of
/// [`Settings`], whose name is its file key.
macro_rules! layered {
    ($layers:expr, $field:ident) => {
        $layers.get(stringify!($field), |s| &s.$field)
    };
}
pub(super) use layered;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::config::error::CONFIG_FLAG;

    fn parse(path: &str, text: &str) -> Result<Settings, ConfigError> {
        file::parse(path, text)
    }

    #[track_caller]
    fn refused(text: &str) -> String {
        let e = parse("/etc/a.toml", text).expect_err("refused");
        assert_eq!(e.flag(), CONFIG_FLAG);
        let m = e.to_string();
        assert!(!m.contains('\n'), "{m:?}");
        m
    }

    #[test]
    fn the_agreed_format_parses() {
        let f = parse(
            "a.toml",
            r#"
region = "a"
lease_ttl = "30s"
election_ttl = "10s"
metrics_addr = "0.0.0.0:9464"
log_format = "json"
root = "/aether/v1/regions/"
max_inflight = 8
page_size = 10000
replica_id = "aether-replicator-a-5d9c7-x2x9q"
[local]
endpoints = ["http://etcd-a.aether.svc:2379"]
ca = "/etc/aether/local/ca.crt"
cert = "/etc/aether/local/tls.crt"
key = "/etc/aether/local/tls.key"
server_name = "etcd-a"
username = "replicator"
password_file = "/etc/aether/local/password"

[peers.b]
endpoints = ["https://etcd-b.example:2379"]
ca = "/etc/aether/peers/b/ca.crt"
username = "replicator"
password_file = "/etc/aether/peers/b/password"
max_txn_ops = 128
max_request_bytes = "1536KiB"

[peers.c]
endpoints = ["http://c:2379"]
max_request_bytes = 65536
"#,
        )
        .unwrap();
        assert_eq!(f.region.as_deref(), Some("a"));
        assert_eq!(f.max_inflight, Some(8));
        let local = f.local.unwrap();
        assert_eq!(local.server_name.as_deref(), Some("etcd-a"));
        assert_eq!(f.peers.len(), 2);
        assert_eq!(f.peers["b"].max_txn_ops, Some(128));
        assert_eq!(f.peers["b"].max_request_bytes.as_deref(), Some("1536KiB"));
        assert_eq!(f.peers["c"].max_request_bytes.as_deref(), Some("65536"));
    }

    #[test]
    fn errors_name_the_file_table_and_key() {
        for (text, want) in [
            (
                "region = 'a'\nfoo = 1\n",
                "/etc/a.toml: foo: unknown key (expected one of",
            ),
            (
                "[peers.b]\nendpoints = ['http://b:1']\npasword_file = 'x'\n",
                "/etc/a.toml: [peers.b] pasword_file: unknown key (expected",
            ),
            (
                "[peers.b]\nmax_txn_ops = 'many'\n",
                "/etc/a.toml: [peers.b] max_txn_ops: invalid type: string \"many\", expected usize",
            ),
            (
                "peers.b.max_txn_ops = -1\n",
                "/etc/a.toml: [peers.b] max_txn_ops: invalid value: integer `-1`",
            ),
            (
                "peers = { b = { endpoints = 3 } }\n",
                "/etc/a.toml: [peers.b] endpoints: invalid type: integer `3`",
            ),
            (
                "[local]\nendpoints = ['x']\nsni = 'y'\n",
                "/etc/a.toml: [local] sni: unknown key",
            ),
            (
                "region = 5\n",
                "/etc/a.toml: region: invalid type: integer `5`",
            ),
            (
                "[peers.b]\nmax_request_bytes = true\n",
                "/etc/a.toml: [peers.b] max_request_bytes: invalid type: boolean `true`, expected a byte size",
            ),
            ("region = 'a\n", "/etc/a.toml: line 1, column 12: "),
            (
                "[peers.\"b/c\"]\nx = 1\n",
                "/etc/a.toml: [peers.\"b/c\"] x: unknown key",
            ),
        ] {
            let m = refused(text);
            assert!(m.starts_with(want), "{text:?}:\n got {m:?}\nwant {want:?}");
        }
    }

    #[test]
    fn a_missing_file_names_the_flag_and_the_file() {
        let e = Settings::load("/nonexistent/a.toml").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--config \"/nonexistent/a.toml\": "),
            "{e}"
        );
    }
}
