//! Validation: the flags as given, checked and turned into the settings
//! the program runs with ([`Config`], [`EndpointsConfig`],
//! [`MigrateConfig`]). Every refusal is a one-line [`ConfigError`] naming
//! the flag at fault.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::super::endpoints::EndpointsOptions;
use super::super::migrate::MigrateOptions;
use super::super::parse::{
    self, CERTIFICATE, PEER_AUTH_FORM, PEER_ETCD_FORM, PEER_TLS_FORM, PRIVATE_KEY, normalize_url,
    parse_byte_size, parse_duration,
};
use super::args::{EndpointsArgs, LocalEtcdArgs, LogFormat, MigrateArgs, RunArgs, Secret};
use super::{MAX_LEASE_TTL_SECS, MAX_MAX_REQUEST_BYTES, MIN_MAX_REQUEST_BYTES, MIN_MAX_TXN_OPS};
use crate::etcd::{ClientConfig, Credentials, TlsConfig, TxnLimits};
use crate::mirror::{DEFAULT_STATE_ROOT, MirrorConfig, PeerConfig};
use crate::schema::{Schema, SchemaError, validate_segment};
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
        self.local.validate()
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
                Some(parts) => build_tls(parts, Scope::Peer(&peer))?,
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

/// The local etcd's client config from its flags (`--local-*`).
fn local_client_config(
    local_etcd: &str,
    tls: TlsParts,
    local_user: Option<&String>,
    local_password: Option<&Secret>,
) -> Result<ClientConfig, ConfigError> {
    let endpoints = parse_endpoints("--local-etcd", "--local-etcd", local_etcd)?;
    let tls = build_tls(tls, Scope::Local)?;
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
    parse::check_peer_region(peer)
        .map_err(|what| ConfigError::new(flag, format!("{flag} {spec:?}: {what}")))
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
    parse::parse_endpoint_list(list)
        .map_err(|why| ConfigError::new(flag, format!("{label}: {why}")))
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
