//! A run's settings (and `status`'s, which takes a run's flags): the flags laid over the config file ([`Layers`]),
//! checked, and built into the [`Config`] the program runs with, the
//! engine's [`MirrorConfig`] among them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::super::status::StatusOptions;
use super::args::{RunArgs, StatusArgs};
use super::connection::PasswordFile;
use super::error::{ConfigError, Origin};
use super::file::EtcdTable;
use super::limits::{
    MIN_LEASE_TTL_SECS, at_least, at_least_one, duration_or_off, lease_ttl, prefix, segment,
    txn_limits,
};
use super::settings::{
    DEFAULT_LEASE_TTL_FLAG, DEFAULT_LOG_LEVEL, DEFAULT_METRICS_ADDR, DEFAULT_RELOAD_INTERVAL,
    Layers, LogFormat, Settings, layered,
};
use crate::etcd::{ClientConfig, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS};
use crate::mirror::{
    DEFAULT_MAX_CONCURRENT_SYNCS, DEFAULT_MAX_INFLIGHT_TXNS, DEFAULT_PAGE_SIZE,
    DEFAULT_PEER_CONNECTIONS, MirrorConfig, PeerConfig,
};
use crate::schema::{DEFAULT_ROOT, validate_segment};

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
    /// What to log: a `tracing` filter (a level, or directives per module).
    pub log_level: String,
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

impl RunArgs {
    /// Reads the config file (if any), lays the flags over it and checks
    /// everything, reading the TLS and password files, and builds the
    /// [`Config`]. The first error found is returned. Connects to nothing.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let file = match &self.config {
            Some(path) => Some((path.as_str(), Settings::load(path)?)),
            None => None,
        };
        self.validate_with(file.as_ref().map(|(p, f)| (*p, f)))
    }

    fn validate_with(&self, file: Option<(&str, &Settings)>) -> Result<Config, ConfigError> {
        let layers = Layers::new(&self.settings, file);
        let region = match layered!(layers, region) {
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
        let (root, root_origin) = layered!(layers, root);
        let root = prefix(&root_origin, root.as_deref().unwrap_or(DEFAULT_ROOT))?
            .root()
            .to_string();
        let (lease_ttl, election_ttl) = validate_ttls(&layers)?;
        let (ops, ops_origin) = layered!(layers, max_txn_ops);
        let (bytes, bytes_origin) = layered!(layers, max_request_bytes);
        let default_bytes = DEFAULT_MAX_REQUEST_BYTES.to_string();
        let limits = txn_limits(
            (ops.unwrap_or(DEFAULT_MAX_TXN_OPS), &ops_origin),
            (bytes.as_deref().unwrap_or(&default_bytes), &bytes_origin),
        )?;
        let count = |(n, origin): (Option<usize>, Origin), default| {
            at_least_one(&origin, n.unwrap_or(default))
        };
        let max_inflight = count(layered!(layers, max_inflight), DEFAULT_MAX_INFLIGHT_TXNS)?;
        let connections = count(layered!(layers, peer_connections), DEFAULT_PEER_CONNECTIONS)?;
        let page_size = count(layered!(layers, page_size), DEFAULT_PAGE_SIZE)?;
        let max_concurrent_syncs = count(
            layered!(layers, max_concurrent_syncs),
            DEFAULT_MAX_CONCURRENT_SYNCS,
        )?;

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
        mirror.max_concurrent_syncs = max_concurrent_syncs;
        let (raw, origin) = layered!(layers, heartbeat_interval);
        if let Some(raw) = raw {
            mirror.heartbeat_interval = at_least(&origin, &raw, Duration::from_millis(100))?;
        }
        let (raw, origin) = layered!(layers, lapse_after);
        mirror.lapse_after = duration_or_off(&origin, raw.as_deref(), mirror.lapse_after)?;
        let (raw, origin) = layered!(layers, verify_interval);
        mirror.verify_interval = duration_or_off(&origin, raw.as_deref(), mirror.verify_interval)?;
        let (rate, origin) = layered!(layers, verify_rate);
        if let Some(rate) = rate {
            mirror.verify_rate = at_least_one(&origin, rate as usize)? as u32;
        }

        let (local, local_password_file) = self
            .local
            .validate_with(file.map(|(p, f)| (p, f.local.as_ref().unwrap_or(&EtcdTable::EMPTY))))?;
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

        let metrics_addr = layered!(layers, metrics_addr)
            .0
            .unwrap_or_else(|| DEFAULT_METRICS_ADDR.parse().expect("a valid default"));
        let log_format = layered!(layers, log_format).0.unwrap_or_default();
        let (log_level, origin) = layered!(layers, log_level);
        let log_level = log_level.unwrap_or_else(|| DEFAULT_LOG_LEVEL.to_string());
        check_log_level(&log_level).map_err(|why| origin.refuse("log level", &log_level, why))?;
        let (replica_id, origin) = layered!(layers, replica_id);
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
        let (raw, origin) = layered!(layers, reload_interval);
        let reload_interval =
            duration_or_off(&origin, raw.as_deref(), Some(DEFAULT_RELOAD_INTERVAL))?;

        Ok(Config {
            region,
            local,
            peers: peers.into_iter().map(|p| p.config).collect(),
            mirror,
            election_ttl,
            metrics_addr,
            log_format,
            log_level,
            replica_id,
            reload_interval,
            local_password_file,
            peer_password_files,
        })
    }
}

impl RunArgs {
    /// [`RunArgs::validate`] for a run, `--check-config` and `check`, which
    /// also need at least one peer: a replicator without one has nothing to
    /// do, and would only hold its region's election.
    pub fn validate_run(&self) -> Result<Config, ConfigError> {
        let config = self.validate()?;
        if config.peers.is_empty() {
            let file = match &self.config {
                Some(path) => format!(" or a [peers.<region>] table in {path}"),
                None => " or a [peers.<region>] table in the --config file".into(),
            };
            return Err(ConfigError::new(
                "--peer-etcd",
                format!(
                    "--peer-etcd: no peer regions: name at least one with --peer-etcd REGION=URL{file}"
                ),
            ));
        }
        Ok(config)
    }
}

impl Config {
    /// The effective settings, one `key = value` line each under the config
    /// file's names, for `--check-config`: what the run would use after
    /// the flags, variables, file and defaults are laid over each other.
    /// Secrets are never printed, only where they come from.
    pub fn effective(&self) -> String {
        use std::fmt::Write;
        let m = &self.mirror;
        let secs = |d: Duration| format!("{}s", d.as_secs_f64());
        let off = |d: Option<Duration>| d.map_or("off".to_string(), secs);
        let mut out = String::new();
        let mut line = |k: &str, v: String| {
            let _ = writeln!(out, "{k} = {v}");
        };
        line("region", self.region.clone());
        line("root", m.root.clone());
        line("lease_ttl", secs(m.lease_ttl));
        line("election_ttl", secs(self.election_ttl));
        line("heartbeat_interval", secs(m.heartbeat_interval));
        line("lapse_after", off(m.lapse_after));
        line("verify_interval", off(m.verify_interval));
        line("verify_rate", m.verify_rate.to_string());
        line("max_txn_ops", m.limits.max_ops.to_string());
        line("max_request_bytes", m.limits.max_bytes.to_string());
        line("max_inflight", m.max_inflight.to_string());
        line("page_size", m.page_size.to_string());
        line("max_concurrent_syncs", m.max_concurrent_syncs.to_string());
        line("metrics_addr", self.metrics_addr.to_string());
        line(
            "log_format",
            format!("{:?}", self.log_format).to_lowercase(),
        );
        line("log_level", self.log_level.clone());
        line("replica_id", self.replica_id.clone());
        line("reload_interval", off(self.reload_interval));
        let etcd = |c: &ClientConfig, password: Option<&PasswordFile>| {
            let mut v = c.endpoints.join(",");
            if c.tls.is_some() {
                v.push_str(" tls");
            }
            if let Some(creds) = &c.credentials {
                let _ = write!(v, " user {}", creds.user);
                if let Some(f) = password {
                    let _ = write!(v, " password from {}", f.path);
                }
            }
            v
        };
        line(
            "local",
            etcd(&self.local, self.local_password_file.as_ref()),
        );
        for p in &self.peers {
            let mut v = etcd(&p.client, self.peer_password_files.get(&p.region));
            if let Some(l) = m.peer_limits.get(&p.region) {
                let _ = write!(
                    v,
                    " max_txn_ops {} max_request_bytes {}",
                    l.max_ops, l.max_bytes
                );
            }
            line(&format!("peers.{}", p.region), v);
        }
        out
    }
}

/// What `--log-level` takes: comma-separated directives, each a level or
/// `TARGET=LEVEL`. A bare word that is no level is refused, where
/// `tracing`'s own parser would take it as a module name and log nothing
/// of this program: `--log-level verbose` is a mistake, not a filter.
fn check_log_level(raw: &str) -> Result<(), String> {
    const LEVELS: [&str; 6] = ["error", "warn", "info", "debug", "trace", "off"];
    for directive in raw.split(',') {
        let level = match directive.rsplit_once('=') {
            Some((_, level)) => level,
            None if directive.contains("::") || directive.contains('[') => continue,
            None => directive,
        };
        if !LEVELS.contains(&level.trim().to_ascii_lowercase().as_str()) {
            return Err(format!(
                "{level:?} is not a level (expected error, warn, info, debug, trace or off, or TARGET=LEVEL directives separated by ',')"
            ));
        }
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(raw)
        .map(drop)
        .map_err(|e| e.to_string())
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

/// `lease_ttl` and `election_ttl`: whole seconds, the election at most half
/// the lease, by default a third of it.
fn validate_ttls(layers: &Layers<'_>) -> Result<(Duration, Duration), ConfigError> {
    let (lease_raw, lease_origin) = layered!(layers, lease_ttl);
    let lease_raw = lease_raw.as_deref().unwrap_or(DEFAULT_LEASE_TTL_FLAG);
    let lease = lease_ttl(&lease_origin, lease_raw)?;
    let (raw, origin) = layered!(layers, election_ttl);
    let Some(raw) = raw else {
        let election = default_election_ttl(lease);
        // After a crash the peers' copies may have only two thirds of the
        // lease TTL left (keep-alives go every third); a successor needs the
        // election TTL and a moment to adopt them. Half leaves a sixth spare.
        if election * 2 > lease {
            // The user wrote the lease only: name it, and the smallest lease
            // the default election TTL fits under.
            let min = (MIN_LEASE_TTL_SECS..)
                .find(|&s| default_election_ttl(Duration::from_secs(s)).as_secs() * 2 <= s)
                .expect("a lease twice the shortest election TTL fits");
            return Err(lease_origin.refuse(
                "duration",
                lease_raw,
                format_args!(
                    "must be at least {min}s: the election TTL (by default a third of the lease, at least {MIN_LEASE_TTL_SECS}s) must be at most half the lease, so a successor takes over before the peers' copies can expire"
                ),
            ));
        }
        return Ok((lease, election));
    };
    let election = lease_ttl(&origin, &raw)?;
    if election * 2 > lease {
        let max = lease.as_secs() / 2;
        let also = if max < MIN_LEASE_TTL_SECS {
            format!(
                " (no election TTL fits: raise {} to at least {}s)",
                lease_origin.name(),
                2 * MIN_LEASE_TTL_SECS
            )
        } else {
            String::new()
        };
        return Err(origin.refuse(
            "duration",
            raw,
            format_args!(
                "must be at most {max}s, half of {} {}s, so a successor takes over before the peers' copies can expire{also}",
                lease_origin.name(),
                lease.as_secs()
            ),
        ));
    }
    Ok((lease, election))
}

/// The election TTL when none is given: a third of the lease, rounded up,
/// and never below etcd's shortest lease.
fn default_election_ttl(lease: Duration) -> Duration {
    Duration::from_secs(lease.as_secs().div_ceil(3).max(MIN_LEASE_TTL_SECS))
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
