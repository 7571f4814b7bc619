//! Validation: the flags as given, checked and turned into the settings
//! the program runs with ([`Config`], [`EndpointsConfig`],
//! [`MigrateConfig`]). Every refusal is a one-line [`ConfigError`] naming
//! the flag at fault.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use super::super::endpoints::EndpointsOptions;
use super::super::migrate::MigrateOptions;
use super::super::parse::{
    self, CERTIFICATE, PEER_AUTH_FORM, PEER_ETCD_FORM, PEER_TLS_FORM, PRIVATE_KEY, normalize_url,
    parse_byte_size, parse_duration,
};
use super::super::status::StatusOptions;
use super::args::{
    EndpointsArgs, LocalEtcdArgs, LogFormat, MigrateArgs, RootArg, RunArgs, StatusArgs,
};
use super::file::{self, CONFIG_FLAG, EtcdTable, FileConfig, place};
use super::{MAX_LEASE_TTL_SECS, MAX_MAX_REQUEST_BYTES, MIN_MAX_REQUEST_BYTES, MIN_MAX_TXN_OPS};
use crate::etcd::{
    ClientConfig, Credentials, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS, TlsConfig, TxnLimits,
};
use crate::mirror::{
    DEFAULT_MAX_INFLIGHT_TXNS, DEFAULT_PAGE_SIZE, DEFAULT_PEER_CONNECTIONS, DEFAULT_STATE_ROOT,
    MirrorConfig, PeerConfig,
};
use crate::schema::{DEFAULT_ROOT, Schema, SchemaError, validate_segment};
use crate::view::ViewConfig;

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
    /// This replica's id in the leader election.
    pub replica_id: String,
    /// How often to re-read TLS and password files; `None`: never.
    pub reload_interval: Option<Duration>,
    /// The local etcd's password file, when the password came from one.
    pub local_password_file: Option<PasswordFile>,
    /// Each peer's password file, by region, when its password came from
    /// one.
    pub peer_password_files: BTreeMap<String, PasswordFile>,
}

/// A user whose password is read from a file (and re-read on rotation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PasswordFile {
    /// The etcd user.
    pub user: String,
    /// The file holding the password.
    pub path: String,
}

/// One peer, validated.
struct ValidPeer {
    config: PeerConfig,
    /// Limits of its own, from its table in the config file.
    limits: Option<TxnLimits>,
    password_file: Option<PasswordFile>,
}

/// The default `--local-etcd`.
pub const DEFAULT_LOCAL_ETCD: &str = "http://127.0.0.1:2379";
/// The default `--metrics-addr`.
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9464";
/// The default `--lease-ttl`, as given.
const DEFAULT_LEASE_TTL_FLAG: &str = "30s";
/// The default `--reload-interval`.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(10);
/// A `[local]` table with nothing in it.
const EMPTY_TABLE: EtcdTable = EtcdTable {
    endpoints: None,
    ca: None,
    cert: None,
    key: None,
    server_name: None,
    username: None,
    password_file: None,
};

/// A flag that is wrong: one line naming the flag and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    flag: &'static str,
    message: String,
}

impl ConfigError {
    pub(super) fn new(flag: &'static str, message: impl Into<String>) -> Self {
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

impl LocalEtcdArgs {
    /// Checks the flags as a run does and builds the client config.
    pub fn validate(&self) -> Result<ClientConfig, ConfigError> {
        Ok(self.validate_with(None)?.0)
    }

    /// Like [`LocalEtcdArgs::validate`], with the config file's `[local]`
    /// table under the flags: `--local-etcd` replaces its `endpoints`; any
    /// of the TLS flags replace its `ca`, `cert`, `key` and `server_name`
    /// together; `--local-user`/`--local-password` replace its `username`
    /// and `password_file`. Also returns the password file in use.
    fn validate_with(
        &self,
        file: Option<(&str, &EtcdTable)>,
    ) -> Result<(ClientConfig, Option<PasswordFile>), ConfigError> {
        const TABLE: &[&str] = &["local"];
        let table = file.map(|(_, t)| t);
        let endpoints = match (&self.local_etcd, file) {
            (Some(list), _) => parse_endpoints("--local-etcd", "--local-etcd", list)?,
            (
                None,
                Some((
                    path,
                    EtcdTable {
                        endpoints: Some(items),
                        ..
                    },
                )),
            ) => file_endpoints(path, TABLE, items)?,
            (None, _) => parse_endpoints("--local-etcd", "--local-etcd", DEFAULT_LOCAL_ETCD)?,
        };
        let flags = TlsParts {
            ca: self.local_ca.clone(),
            cert: self.local_cert.clone(),
            key: self.local_key.clone(),
            server_name: self.local_server_name.clone(),
        };
        let (tls, scope) = match file {
            Some((path, t)) if flags == TlsParts::default() => {
                (file_tls(t), Scope::File { path, table: TABLE })
            }
            _ => (flags, Scope::Local),
        };
        let tls = build_tls(tls, scope)?;
        check_tls_for_endpoints(scope, &endpoints, tls.as_ref())?;
        let flag_auth = self.local_user.is_some() || self.local_password.is_some();
        let (credentials, password_file) = match (flag_auth, file) {
            (false, Some((path, _))) => {
                file_credentials(path, TABLE, table.cloned().unwrap_or_default())?
            }
            _ => (self.flag_credentials()?, None),
        };
        let config = ClientConfig {
            tls,
            credentials,
            ..ClientConfig::new(endpoints)
        };
        Ok((config, password_file))
    }

    fn flag_credentials(&self) -> Result<Option<Credentials>, ConfigError> {
        match (&self.local_user, &self.local_password) {
            (None, None) => Ok(None),
            (Some(_), None) => Err(ConfigError::new(
                "--local-user",
                "--local-user needs --local-password (or AETHER_REPLICATOR_LOCAL_PASSWORD)",
            )),
            (None, Some(_)) => Err(ConfigError::new(
                "--local-password",
                "--local-password needs --local-user",
            )),
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
                Ok(Some(Credentials {
                    user: user.clone(),
                    password: password.expose().to_string(),
                }))
            }
        }
    }
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
        let schema = self.root.schema()?;
        let root = schema.root();
        if root.starts_with(DEFAULT_STATE_ROOT) || DEFAULT_STATE_ROOT.starts_with(root) {
            return Err(ConfigError::new(
                "--root",
                format!(
                    "--root {root:?}: overlaps the replication state prefix {DEFAULT_STATE_ROOT:?}"
                ),
            ));
        }
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
        let schema = self.root.schema()?;
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
        let limits = txn_limits(
            (self.max_txn_ops, &Origin::Flag("--max-txn-ops")),
            (
                &self.max_request_bytes,
                &Origin::Flag("--max-request-bytes"),
            ),
        )?;
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

/// Where a setting's value came from, for messages: a flag (or its
/// environment variable, or its default), or a key of the config file.
#[derive(Clone, Debug)]
enum Origin {
    Flag(&'static str),
    File {
        /// The config file's path.
        path: String,
        /// `lease_ttl`, `[peers.b] max_request_bytes`.
        place: String,
    },
}

impl Origin {
    fn file(path: &str, table: &[&str], key: &str) -> Origin {
        Origin::File {
            path: path.to_string(),
            place: place(table, Some(key)),
        }
    }

    /// The flag named in [`ConfigError::flag`].
    fn flag(&self) -> &'static str {
        match self {
            Origin::Flag(f) => f,
            Origin::File { .. } => CONFIG_FLAG,
        }
    }

    /// `--lease-ttl`, `/etc/a.toml: lease_ttl`.
    fn name(&self) -> String {
        match self {
            Origin::Flag(f) => f.to_string(),
            Origin::File { path, place } => format!("{path}: {place}"),
        }
    }

    /// Refuses `raw`, a `what` (e.g. "duration"), because of `why`: for a
    /// flag `--lease-ttl "0s": why`, for the file
    /// `/etc/a.toml: lease_ttl: invalid duration "0s": why`.
    fn refuse(&self, what: &str, raw: impl fmt::Debug, why: impl fmt::Display) -> ConfigError {
        let message = match self {
            Origin::Flag(f) => format!("{f} {raw:?}: {why}"),
            Origin::File { .. } => format!("{}: invalid {what} {raw:?}: {why}", self.name()),
        };
        ConfigError::new(self.flag(), message)
    }
}

/// A flag's value, else the file's; with its origin (the flag when
/// neither is given, as the default is the flag's).
fn layer<T>(
    flag: Option<T>,
    flag_name: &'static str,
    file: Option<(&str, Option<T>)>,
    key: &str,
) -> (Option<T>, Origin) {
    if flag.is_some() {
        return (flag, Origin::Flag(flag_name));
    }
    if let Some((path, Some(v))) = file {
        return (Some(v), Origin::file(path, &[], key));
    }
    (None, Origin::Flag(flag_name))
}

impl RunArgs {
    /// Reads the config file (if any), lays the flags over it and checks
    /// everything, reading the TLS and password files, and builds the
    /// [`Config`]. The first error found is returned. Connects to nothing.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let file = match &self.config {
            Some(path) => Some((path.as_str(), file::load(path)?)),
            None => None,
        };
        self.validate_with(file.as_ref().map(|(p, f)| (*p, f)))
    }

    fn validate_with(&self, file: Option<(&str, &FileConfig)>) -> Result<Config, ConfigError> {
        macro_rules! layered {
            ($field:ident, $flag:literal) => {
                layer(
                    self.$field.clone(),
                    $flag,
                    file.map(|(p, f)| (p, f.$field.clone())),
                    stringify!($field),
                )
            };
        }
        let region = match layered!(region, "--region") {
            (Some(region), origin) => {
                validate_segment("region", &region)
                    .map_err(|e| origin.refuse("region", &region, segment(&e)))?;
                region
            }
            (None, _) => {
                let also = if file.is_some() {
                    " (or region in the config file)"
                } else {
                    ""
                };
                return Err(ConfigError::new(
                    "--region",
                    format!("--region: required{also}"),
                ));
            }
        };
        let (root, root_origin) = layered!(root, "--root");
        let root = prefix(&root_origin, root.as_deref().unwrap_or(DEFAULT_ROOT))?
            .root()
            .to_string();
        let (lease_ttl, election_ttl) = self.validate_ttls(file)?;
        let ops = layered!(max_txn_ops, "--max-txn-ops");
        let bytes = layered!(max_request_bytes, "--max-request-bytes");
        let limits = txn_limits(
            (ops.0.unwrap_or(DEFAULT_MAX_TXN_OPS), &ops.1),
            (
                bytes
                    .0
                    .as_deref()
                    .unwrap_or(&DEFAULT_MAX_REQUEST_BYTES.to_string()),
                &bytes.1,
            ),
        )?;
        let (max_inflight, origin) = layered!(max_inflight, "--max-inflight");
        let max_inflight =
            at_least_one(&origin, max_inflight.unwrap_or(DEFAULT_MAX_INFLIGHT_TXNS))?;
        let (connections, origin) = layered!(peer_connections, "--peer-connections");
        let connections = at_least_one(&origin, connections.unwrap_or(DEFAULT_PEER_CONNECTIONS))?;
        let (page_size, origin) = layered!(page_size, "--page-size");
        let page_size = at_least_one(&origin, page_size.unwrap_or(DEFAULT_PAGE_SIZE))?;

        let mut mirror = MirrorConfig::new(region.clone());
        if root.starts_with(&mirror.state_root) || mirror.state_root.starts_with(&root) {
            let state_root = mirror.state_root.clone();
            return Err(root_origin.refuse(
                "root",
                &root,
                format!("overlaps the replication state prefix {state_root:?}"),
            ));
        }
        mirror.root = root;
        mirror.lease_ttl = lease_ttl;
        mirror.limits = limits;
        mirror.max_inflight = max_inflight;
        mirror.page_size = page_size;
        // Freshness: durations, two of which may be "off".
        let duration_or_off = |raw: Option<String>,
                               origin: Origin,
                               default: Option<Duration>|
         -> Result<Option<Duration>, ConfigError> {
            match raw.as_deref() {
                None => Ok(default),
                Some("off") => Ok(None),
                Some(raw) => match parse_duration(raw) {
                    Ok(d) if d.is_zero() => Ok(None),
                    Ok(d) => Ok(Some(d)),
                    Err(why) => Err(origin.refuse("duration", raw, why)),
                },
            }
        };
        let (raw, origin) = layered!(heartbeat_interval, "--heartbeat-interval");
        mirror.heartbeat_interval = match raw.as_deref() {
            None => mirror.heartbeat_interval,
            Some(raw) => match parse_duration(raw) {
                Ok(d) if d >= Duration::from_millis(100) => d,
                Ok(_) => return Err(origin.refuse("duration", raw, "must be at least 100ms")),
                Err(why) => return Err(origin.refuse("duration", raw, why)),
            },
        };
        let (raw, origin) = layered!(lapse_after, "--lapse-after");
        mirror.lapse_after = duration_or_off(raw, origin, mirror.lapse_after)?;
        let (raw, origin) = layered!(verify_interval, "--verify-interval");
        mirror.verify_interval = duration_or_off(raw, origin, mirror.verify_interval)?;
        let (rate, origin) = layered!(verify_rate, "--verify-rate");
        if let Some(rate) = rate {
            mirror.verify_rate = at_least_one(&origin, rate as usize)? as u32;
        }

        let (local, local_password_file) = self
            .local
            .validate_with(file.map(|(p, f)| (p, f.local.as_ref().unwrap_or(&EMPTY_TABLE))))?;
        let peers = self.validate_peers(&region, &local, limits, connections, file)?;
        let mut peer_password_files = BTreeMap::new();
        for p in &peers {
            if let Some(l) = p.limits {
                mirror.peer_limits.insert(p.config.region.clone(), l);
            }
            if let Some(f) = &p.password_file {
                peer_password_files.insert(p.config.region.clone(), f.clone());
            }
        }

        let metrics_addr = match (
            self.metrics_addr,
            file.and_then(|(p, f)| Some((p, f.metrics_addr.as_ref()?))),
        ) {
            (Some(addr), _) => addr,
            (None, Some((path, raw))) => raw.parse().map_err(|_| {
                Origin::file(path, &[], "metrics_addr").refuse(
                    "address",
                    raw,
                    "expected HOST:PORT with an IP address, e.g. 0.0.0.0:9464",
                )
            })?,
            (None, None) => DEFAULT_METRICS_ADDR.parse().expect("a valid default"),
        };
        let log_format = match (
            self.log_format,
            file.and_then(|(p, f)| Some((p, f.log_format.as_ref()?))),
        ) {
            (Some(format), _) => format,
            (None, Some((path, raw))) => <LogFormat as clap::ValueEnum>::from_str(raw, false)
                .map_err(|_| {
                    Origin::file(path, &[], "log_format").refuse(
                        "log format",
                        raw,
                        "expected text or json",
                    )
                })?,
            (None, None) => LogFormat::default(),
        };
        let (replica_id, origin) = layered!(replica_id, "--replica-id");
        let replica_id = match replica_id {
            Some(id) if id.is_empty() || id.chars().any(char::is_control) => {
                return Err(origin.refuse(
                    "replica id",
                    &id,
                    "must be non-empty, without control characters",
                ));
            }
            Some(id) => id,
            None => generated_replica_id(),
        };
        let (reload, origin) = layered!(reload_interval, "--reload-interval");
        let reload_interval = match reload.as_deref() {
            None => Some(DEFAULT_RELOAD_INTERVAL),
            Some("off") => None,
            Some(raw) => {
                Some(parse_duration(raw).map_err(|why| origin.refuse("duration", raw, why))?)
            }
        };

        Ok(Config {
            region,
            local,
            peers: peers.into_iter().map(|p| p.config).collect(),
            mirror,
            election_ttl,
            metrics_addr,
            log_format,
            replica_id,
            reload_interval,
            local_password_file,
            peer_password_files,
        })
    }

    fn validate_ttls(
        &self,
        file: Option<(&str, &FileConfig)>,
    ) -> Result<(Duration, Duration), ConfigError> {
        let (raw, lease_origin) = layer(
            self.lease_ttl.clone(),
            "--lease-ttl",
            file.map(|(p, f)| (p, f.lease_ttl.clone())),
            "lease_ttl",
        );
        let lease = lease_ttl(
            &lease_origin,
            raw.as_deref().unwrap_or(DEFAULT_LEASE_TTL_FLAG),
        )?;
        let (raw, origin) = layer(
            self.election_ttl.clone(),
            "--election-ttl",
            file.map(|(p, f)| (p, f.election_ttl.clone())),
            "election_ttl",
        );
        let (election, default) = match raw {
            Some(raw) => (lease_ttl(&origin, &raw)?, String::new()),
            None => (
                Duration::from_secs(lease.as_secs().div_ceil(3).max(1)),
                format!(
                    " (the default, a third of {} rounded up)",
                    lease_origin.name()
                ),
            ),
        };
        // After a crash the peers' copies may have only two thirds of the
        // lease TTL left (keep-alives go every third); a successor needs the
        // election TTL and a moment to adopt them. Half leaves a sixth spare.
        if election * 2 > lease {
            let election_name = match origin {
                Origin::Flag(_) => "--election-ttl".to_string(),
                ref o => o.name(),
            };
            return Err(ConfigError::new(
                origin.flag(),
                format!(
                    "{election_name} {election:?}{default} must be at most half of {} {lease:?}, so a successor takes over before the peers' copies can expire",
                    lease_origin.name()
                ),
            ));
        }
        Ok((lease, election))
    }

    fn validate_peers(
        &self,
        region: &str,
        local: &ClientConfig,
        limits: TxnLimits,
        connections: usize,
        file: Option<(&str, &FileConfig)>,
    ) -> Result<Vec<ValidPeer>, ConfigError> {
        const FLAG: &str = "--peer-etcd";
        // Every endpoint seen so far, normalized, and who has it.
        let local_name = match (&self.local.local_etcd, file) {
            (None, Some((path, f))) if f.local.as_ref().is_some_and(|l| l.endpoints.is_some()) => {
                format!("{path}: [local] endpoints")
            }
            _ => "--local-etcd".to_string(),
        };
        let mut owners: HashMap<String, String> = local
            .endpoints
            .iter()
            .map(|e| (normalize_url(e), local_name.clone()))
            .collect();
        let mut flag_peers: Vec<(String, Vec<String>)> = Vec::new();
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
            if flag_peers.iter().any(|(r, _)| r == peer) {
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
            flag_peers.push((peer.to_string(), endpoints));
        }

        // The file's peers first (in name order), then those only on the
        // command line (in its order). A flag replaces the same setting of
        // the file's peer.
        let empty = BTreeMap::new();
        let (path, tables) = match file {
            Some((path, f)) => (path, &f.peers),
            None => ("", &empty),
        };
        let mut order: Vec<String> = tables.keys().cloned().collect();
        for (peer, _) in &flag_peers {
            if !tables.contains_key(peer) {
                order.push(peer.clone());
            }
        }
        let is_peer = |r: &str| order.iter().any(|p| p == r);
        let mut tls = self.peer_tls_by_region(&is_peer)?;
        let mut auth = self.peer_auth_by_region(&is_peer)?;

        let mut out = Vec::with_capacity(order.len());
        for peer in order {
            let table_path = ["peers", peer.as_str()];
            let table = tables.get(&peer);
            let in_file = |why: String| {
                ConfigError::new(
                    CONFIG_FLAG,
                    format!("{path}: {}: {why}", place(&table_path, None)),
                )
            };
            if table.is_some() {
                parse::check_peer_region(&peer).map_err(&in_file)?;
                if peer == region {
                    return Err(in_file(format!("peer region is this region ({region})")));
                }
            }
            let flag_endpoints = flag_peers
                .iter()
                .find(|(r, _)| *r == peer)
                .map(|(_, e)| e.clone());
            let endpoints = match (flag_endpoints, table.and_then(|t| t.endpoints.as_ref())) {
                (Some(e), _) => e,
                (None, Some(items)) => {
                    let endpoints = file_endpoints(path, &table_path, items)?;
                    let label = format!("{path}: {}", place(&table_path, Some("endpoints")));
                    for e in &endpoints {
                        if let Some(owner) = owners.insert(normalize_url(e), label.clone()) {
                            return Err(ConfigError::new(
                                CONFIG_FLAG,
                                format!("{label}: endpoint {e:?} is also in {owner}"),
                            ));
                        }
                    }
                    endpoints
                }
                (None, None) => {
                    return Err(in_file(format!(
                        "missing key endpoints (or --peer-etcd {peer}=...)"
                    )));
                }
            };
            let (tls, scope) = match (tls.remove(&peer), table) {
                (Some(parts), _) => (build_tls(parts, Scope::Peer(&peer))?, Scope::Peer(&peer)),
                (None, Some(t)) => {
                    let scope = Scope::File {
                        path,
                        table: &table_path,
                    };
                    (build_tls(file_tls(&t.etcd()), scope)?, scope)
                }
                (None, None) => (None, Scope::Peer(&peer)),
            };
            check_tls_for_endpoints(scope, &endpoints, tls.as_ref())?;
            let (credentials, password_file) = match (auth.remove(&peer), table) {
                (Some(c), _) => (Some(c), None),
                (None, Some(t)) => file_credentials(path, &table_path, t.etcd())?,
                (None, None) => (None, None),
            };
            let peer_limits = match table {
                Some(t) if t.max_txn_ops.is_some() || t.max_request_bytes.is_some() => {
                    let ops_origin = Origin::file(path, &table_path, "max_txn_ops");
                    let bytes_origin = Origin::file(path, &table_path, "max_request_bytes");
                    let global_bytes = limits.max_bytes.to_string();
                    Some(txn_limits(
                        (t.max_txn_ops.unwrap_or(limits.max_ops), &ops_origin),
                        (
                            t.max_request_bytes.as_deref().unwrap_or(&global_bytes),
                            &bytes_origin,
                        ),
                    )?)
                }
                _ => None,
            };
            out.push(ValidPeer {
                config: PeerConfig {
                    client: ClientConfig {
                        tls,
                        credentials,
                        connections,
                        ..ClientConfig::new(endpoints)
                    },
                    region: peer,
                },
                limits: peer_limits,
                password_file,
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
                return Err(ConfigError::new(FLAG, no_such_peer(FLAG, peer)));
            }
            if out.contains_key(peer) {
                return Err(duplicate_peer(FLAG, peer));
            }
            let parts = parse::parse_tls_settings(fields)
                .map_err(|why| ConfigError::new(FLAG, format!("{FLAG} {peer}: {why}")))?;
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
                    no_such_peer(FLAG, peer)
                };
                return Err(ConfigError::new(FLAG, message));
            }
            if out.contains_key(peer) {
                return Err(duplicate_peer(FLAG, peer));
            }
            let (user, password) = parse::parse_user_password(creds)
                .map_err(|why| ConfigError::new(FLAG, format!("{FLAG} {peer}: {why}")))?;
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

impl RootArg {
    /// `--root` as a schema root (see [`prefix_flag`]).
    fn schema(&self) -> Result<Schema, ConfigError> {
        prefix_flag("--root", &self.root)
    }
}

/// A prefix flag (`--root`, `--legacy-prefix`) checked as a schema root:
/// it starts and ends with '/', has a segment and no empty one.
fn prefix_flag(flag: &'static str, raw: &str) -> Result<Schema, ConfigError> {
    prefix(&Origin::Flag(flag), raw)
}

/// A registry prefix from `origin`, checked as a schema root.
fn prefix(origin: &Origin, raw: &str) -> Result<Schema, ConfigError> {
    match Schema::new(raw) {
        Ok(schema) => Ok(schema),
        Err(SchemaError::InvalidRoot { root, reason }) => Err(origin.refuse("root", root, reason)),
        Err(e) => Err(origin.refuse("root", raw, e)),
    }
}

/// A count that must be at least 1 (`--max-inflight`, `--page-size`).
fn at_least_one(origin: &Origin, n: usize) -> Result<usize, ConfigError> {
    if n < 1 {
        return Err(origin.refuse("number", n, "must be at least 1"));
    }
    Ok(n)
}

/// `--max-txn-ops` and `--max-request-bytes` (or the file's keys),
/// checked.
fn txn_limits(
    (max_txn_ops, ops): (usize, &Origin),
    (raw, bytes_origin): (&str, &Origin),
) -> Result<TxnLimits, ConfigError> {
    if max_txn_ops < MIN_MAX_TXN_OPS {
        return Err(ops.refuse(
            "txn op limit",
            max_txn_ops,
            format!("must be at least {MIN_MAX_TXN_OPS}"),
        ));
    }
    let bytes = parse_byte_size(raw).map_err(|e| bytes_origin.refuse("byte size", raw, e))?;
    let max_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
    if max_bytes < MIN_MAX_REQUEST_BYTES {
        return Err(bytes_origin.refuse(
            "byte size",
            raw,
            format!("must be at least {MIN_MAX_REQUEST_BYTES}"),
        ));
    }
    if max_bytes > MAX_MAX_REQUEST_BYTES {
        return Err(bytes_origin.refuse(
            "byte size",
            raw,
            format!(
                "must be at most {MAX_MAX_REQUEST_BYTES} (64MiB, the client's largest request)"
            ),
        ));
    }
    Ok(TxnLimits {
        max_ops: max_txn_ops,
        max_bytes,
    })
}

/// A flag holding one key segment (`--region`, `--service`, ...).
fn segment_flag(flag: &'static str, kind: &'static str, value: &str) -> Result<(), ConfigError> {
    validate_segment(kind, value)
        .map_err(|e| ConfigError::new(flag, format!("{flag} {value:?}: {}", segment(&e))))
}

/// `--page-size`, at least 1.
fn page_size_flag(page_size: usize) -> Result<usize, ConfigError> {
    at_least_one(&Origin::Flag("--page-size"), page_size)
}

/// The reason in a segment error, without the segment's kind.
fn segment(e: &SchemaError) -> &'static str {
    match e {
        SchemaError::EmptySegment { .. } => "must not be empty",
        _ => "must not contain '/'",
    }
}

/// The message for a per-peer flag naming a region with no --peer-etcd.
fn no_such_peer(flag: &str, peer: &str) -> String {
    format!("{flag} {peer}: there is no --peer-etcd for region {peer:?}")
}

/// The refusal of a second per-peer flag entry for one region.
fn duplicate_peer(flag: &'static str, peer: &str) -> ConfigError {
    ConfigError::new(
        flag,
        format!("{flag}: duplicate entry for peer region {peer:?}"),
    )
}

/// Checks the region part of a `<region>=...` spec.
fn check_peer_region(flag: &'static str, spec: &str, peer: &str) -> Result<(), ConfigError> {
    parse::check_peer_region(peer)
        .map_err(|what| ConfigError::new(flag, format!("{flag} {spec:?}: {what}")))
}

/// Parses a TTL: a duration of whole seconds that etcd accepts.
fn lease_ttl(origin: &Origin, raw: &str) -> Result<Duration, ConfigError> {
    let refuse = |why: &dyn fmt::Display| origin.refuse("duration", raw, why);
    let ttl = parse_duration(raw).map_err(|e| refuse(&e))?;
    if ttl.subsec_nanos() != 0 {
        return Err(refuse(
            &"must be a whole number of seconds (etcd lease TTLs are whole seconds)",
        ));
    }
    if ttl.as_secs() > MAX_LEASE_TTL_SECS {
        return Err(refuse(&format_args!(
            "must be at most {MAX_LEASE_TTL_SECS}s (etcd's largest lease TTL)"
        )));
    }
    Ok(ttl)
}

/// A replica id unique to this process: the host name (or "replica"), the
/// pid, and 32 random bits, so that containers without a host name (or
/// with the same one) never share an id. The bits come from /dev/urandom,
/// or from std's randomly seeded hasher where that cannot be read.
fn generated_replica_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "replica".to_string());
    let mut bytes = [0u8; 4];
    let random = match std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
    {
        Ok(()) => u32::from_le_bytes(bytes),
        Err(_) => {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u32(std::process::id());
            h.finish() as u32
        }
    };
    format!("{host}-{}-{random:08x}", std::process::id())
}

/// Splits and checks a comma-separated endpoint list. `label` prefixes the
/// messages (`--peer-etcd b`).
fn parse_endpoints(
    flag: &'static str,
    label: &str,
    list: &str,
) -> Result<Vec<String>, ConfigError> {
    parse::parse_endpoint_list(list)
        .map_err(|why| ConfigError::new(flag, format!("{label}: {why}")))
}

/// Where a TLS setting came from, for messages.
#[derive(Clone, Copy)]
enum Scope<'a> {
    Local,
    Peer(&'a str),
    /// A table of the config file: its path and the table (`local`,
    /// `peers.b`).
    File {
        path: &'a str,
        table: &'a [&'a str],
    },
}

impl Scope<'_> {
    /// The flag a setting comes from.
    fn flag(self, field: &str) -> &'static str {
        match (self, field) {
            (Scope::File { .. }, _) => CONFIG_FLAG,
            (Scope::Peer(_), _) => "--peer-tls",
            (Scope::Local, "ca") => "--local-ca",
            (Scope::Local, "cert") => "--local-cert",
            (Scope::Local, "key") => "--local-key",
            (Scope::Local, _) => "--local-server-name",
        }
    }

    /// The full name of a setting: `--local-ca`, `--peer-tls b: ca`,
    /// `/etc/a.toml: [peers.b] ca`.
    fn setting(self, field: &str) -> String {
        match self {
            Scope::Local => format!("--local-{field}"),
            Scope::Peer(peer) => format!("--peer-tls {peer}: {field}"),
            Scope::File { path, table } => {
                format!("{path}: {}", place(table, Some(&field.replace('-', "_"))))
            }
        }
    }

    /// The short name of a setting, after one named with [`Scope::setting`].
    fn other(self, field: &str) -> String {
        match self {
            Scope::Local => format!("--local-{field}"),
            Scope::Peer(_) => field.to_string(),
            Scope::File { .. } => field.replace('-', "_"),
        }
    }
}

/// TLS settings as given.
type TlsParts = parse::TlsSettings;

/// Checks TLS settings (reading the files) and builds the client's.
fn build_tls(parts: TlsParts, scope: Scope<'_>) -> Result<Option<TlsConfig>, ConfigError> {
    match (&parts.cert, &parts.key) {
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
        ("ca", &parts.ca, CERTIFICATE),
        ("cert", &parts.cert, CERTIFICATE),
        ("key", &parts.key, PRIVATE_KEY),
    ];
    for (field, path, marker) in pem {
        if let Some(path) = path
            && let Err(problem) = parse::check_pem(path, marker)
        {
            return Err(ConfigError::new(
                scope.flag(field),
                format!("{} {path:?}: {problem}", scope.setting(field)),
            ));
        }
    }
    if parts.server_name.as_deref() == Some("") {
        return Err(ConfigError::new(
            scope.flag("server-name"),
            format!("{}: empty name", scope.setting("server-name")),
        ));
    }
    if parts == TlsParts::default() {
        return Ok(None);
    }
    Ok(Some(TlsConfig {
        ca_file: parts.ca,
        cert_file: parts.cert,
        key_file: parts.key,
        server_name: parts.server_name,
    }))
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
        Scope::File { path, table } if https && !has_ca => Err(ConfigError::new(
            CONFIG_FLAG,
            format!(
                "{path}: {}: an https:// endpoint needs ca (there are no system roots)",
                place(table, None)
            ),
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
        Scope::File { path, table } if !https && tls.is_some() => Err(ConfigError::new(
            CONFIG_FLAG,
            format!(
                "{path}: {}: ca, cert, key or server_name given but no endpoint is https://",
                place(table, None)
            ),
        )),
        _ => Ok(()),
    }
}

/// A config file's endpoint list, checked as a flag's would be.
fn file_endpoints(
    path: &str,
    table: &[&str],
    items: &[String],
) -> Result<Vec<String>, ConfigError> {
    let items: Vec<&str> = items.iter().map(|s| s.trim()).collect();
    parse::check_endpoints(&items).map_err(|why| {
        ConfigError::new(
            CONFIG_FLAG,
            format!("{path}: {}: {why}", place(table, Some("endpoints"))),
        )
    })
}

/// A table's TLS keys, as given.
fn file_tls(t: &EtcdTable) -> TlsParts {
    TlsParts {
        ca: t.ca.clone(),
        cert: t.cert.clone(),
        key: t.key.clone(),
        server_name: t.server_name.clone(),
    }
}

/// A table's `username` and `password_file`: both or neither; the password
/// is read now, so that a missing file stops the start.
fn file_credentials(
    path: &str,
    table: &[&str],
    t: EtcdTable,
) -> Result<(Option<Credentials>, Option<PasswordFile>), ConfigError> {
    let name = |key: &str| format!("{path}: {}", place(table, Some(key)));
    match (t.username, t.password_file) {
        (None, None) => Ok((None, None)),
        (Some(_), None) => Err(ConfigError::new(
            CONFIG_FLAG,
            format!("{}: needs password_file", name("username")),
        )),
        (None, Some(_)) => Err(ConfigError::new(
            CONFIG_FLAG,
            format!("{}: needs username", name("password_file")),
        )),
        (Some(user), Some(file)) => {
            if user.is_empty() {
                return Err(ConfigError::new(
                    CONFIG_FLAG,
                    format!("{}: empty user", name("username")),
                ));
            }
            let password = read_password(&file).map_err(|why| {
                ConfigError::new(
                    CONFIG_FLAG,
                    format!("{} {file:?}: {why}", name("password_file")),
                )
            })?;
            let credentials = Credentials {
                user: user.clone(),
                password,
            };
            Ok((Some(credentials), Some(PasswordFile { user, path: file })))
        }
    }
}

/// Reads a password file: its contents less one trailing newline (what
/// `echo` and most editors add; Kubernetes Secrets add none). Never
/// quotes the contents.
pub(crate) fn read_password(path: &str) -> Result<String, String> {
    let mut text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err("empty password".into());
    }
    Ok(text)
}

impl StatusArgs {
    /// The run's [`Config`], validated as a run does, and the status
    /// options.
    pub fn validate(&self) -> Result<(Config, StatusOptions), ConfigError> {
        Ok((
            self.run.validate()?,
            StatusOptions::default().with_max_staleness(self.max_staleness),
        ))
    }
}
