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
    DEFAULT_LEASE_TTL_FLAG, DEFAULT_METRICS_ADDR, DEFAULT_RELOAD_INTERVAL, Layers, LogFormat,
    Settings, layered,
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
            replica_id,
            reload_interval,
            local_password_file,
            peer_password_files,
        })
    }
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
    let (raw, lease_origin) = layered!(layers, lease_ttl);
    let lease = lease_ttl(
        &lease_origin,
        raw.as_deref().unwrap_or(DEFAULT_LEASE_TTL_FLAG),
    )?;
    let (raw, origin) = layered!(layers, election_ttl);
    let (election, default) = match raw {
        Some(raw) => (lease_ttl(&origin, &raw)?, String::new()),
        None => (
            Duration::from_secs(lease.as_secs().div_ceil(3).max(MIN_LEASE_TTL_SECS)),
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
        return Err(ConfigError::new(
            origin.flag(),
            format!(
                "{} {election:?}{default} must be at most half of {} {lease:?}, so a successor takes over before the peers' copies can expire",
                origin.name(),
                lease_origin.name()
            ),
        ));
    }
    Ok((lease, election))
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
