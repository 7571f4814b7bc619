//! The settings of `endpoints` and `migrate`, from their flags alone (they
//! read no config file), and of `setup-auth`, a run's settings and its
//! admin credential.

use super::super::election::DEFAULT_ELECTION_ROOT;
use super::super::endpoints::EndpointsOptions;
use super::super::migrate::MigrateOptions;
use super::super::setup_auth::{self, EtcdPlan, Layout, Target};
use super::args::{EndpointsArgs, MigrateArgs, SetupAuthArgs};
use super::connection::read_password;
use super::error::{ConfigError, Origin};
use super::limits::{page_size_flag, prefix_flag, segment_flag, txn_limits};
use crate::etcd::{ClientConfig, Credentials};
use crate::mirror::DEFAULT_STATE_ROOT;
use crate::view::ViewConfig;

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
            (self.max_txn_ops, &Origin::Flag("--max-txn-ops".into())),
            (
                &self.max_request_bytes,
                &Origin::Flag("--max-request-bytes".into()),
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

/// The validated settings of `setup-auth`.
#[derive(Clone, Debug)]
pub struct SetupAuthConfig {
    /// This region.
    pub region: String,
    /// What each etcd needs: the local etcd's first, then each peer's.
    pub plans: Vec<EtcdPlan>,
    /// With `--apply`, per plan (same order): how to connect as the admin,
    /// and the password to give the replicator's user.
    pub apply: Option<Vec<(ClientConfig, Credentials)>>,
}

impl SetupAuthArgs {
    /// Validates the run's flags as a run does, then the admin credential.
    pub fn validate(&self) -> Result<SetupAuthConfig, ConfigError> {
        let config = self.run.validate()?;
        let layout = Layout {
            region: config.region.clone(),
            root: config.mirror.root.clone(),
            state_root: config.mirror.state_root.clone(),
            election_root: DEFAULT_ELECTION_ROOT.to_string(),
        };
        let user_of = |c: &ClientConfig, default: String| {
            c.credentials.as_ref().map_or(default, |c| c.user.clone())
        };
        let local = Target {
            name: "local".into(),
            endpoints: config.local.endpoints.clone(),
            user: user_of(&config.local, setup_auth::DEFAULT_LOCAL_USER.into()),
            password_file: config.local_password_file.as_ref().map(|f| f.path.clone()),
        };
        let peers = config
            .peers
            .iter()
            .map(|p| Target {
                name: p.region.clone(),
                endpoints: p.client.endpoints.clone(),
                user: user_of(&p.client, setup_auth::default_peer_user(&config.region)),
                password_file: config
                    .peer_password_files
                    .get(&p.region)
                    .map(|f| f.path.clone()),
            })
            .collect();
        let plans = setup_auth::plan(&layout, local, peers);
        for plan in &plans {
            if plan.user == "root" || (self.apply && plan.user == self.admin_user) {
                return Err(ConfigError::new(
                    "--config",
                    format!(
                        "setup-auth: the replicator's user on {} is {:?}, an admin: give it a user of its own",
                        etcd_name(&plan.name),
                        plan.user
                    ),
                ));
            }
        }

        let mut per_peer = std::collections::BTreeMap::new();
        for spec in &self.peer_admin_password_file {
            let flag = "--peer-admin-password-file";
            let Some((region, path)) = spec.split_once('=') else {
                return Err(ConfigError::new(
                    flag,
                    format!("{flag} {spec:?}: expected REGION=PATH"),
                ));
            };
            if !config.peers.iter().any(|p| p.region == region) {
                return Err(ConfigError::new(
                    flag,
                    format!("{flag} {spec:?}: {region:?} is not a peer"),
                ));
            }
            per_peer.insert(region.to_string(), password(flag, path)?);
        }
        let admin = match &self.admin_password_file {
            Some(path) => Some(password("--admin-password-file", path)?),
            None => None,
        };
        if !self.apply {
            return Ok(SetupAuthConfig {
                region: config.region,
                plans,
                apply: None,
            });
        }
        let clients = std::iter::once(("local", &config.local))
            .chain(config.peers.iter().map(|p| (p.region.as_str(), &p.client)));
        let mut apply = Vec::new();
        for (name, client) in clients {
            let admin_password = match per_peer.get(name).or(admin.as_ref()) {
                Some(pw) => pw.clone(),
                None => {
                    return Err(ConfigError::new(
                        "--admin-password-file",
                        format!(
                            "--apply: no admin password for {}: give --admin-password-file",
                            etcd_name(name)
                        ),
                    ));
                }
            };
            let Some(user) = client.credentials.clone() else {
                let table = if name == "local" {
                    "[local]".to_string()
                } else {
                    format!("[peers.{name}]")
                };
                return Err(ConfigError::new(
                    "--apply",
                    format!(
                        "--apply: {} has no username and password_file ({table}, or the --local-user/--peer-auth flags): \
                         the replicator would not authenticate with the user set up for it",
                        etcd_name(name)
                    ),
                ));
            };
            let mut admin_config = client.clone();
            admin_config.credentials = Some(Credentials {
                user: self.admin_user.clone(),
                password: admin_password,
            });
            apply.push((admin_config, user));
        }
        Ok(SetupAuthConfig {
            region: config.region,
            plans,
            apply: Some(apply),
        })
    }
}

/// `local` -> "the local etcd", `b` -> "peer b".
fn etcd_name(name: &str) -> String {
    if name == "local" {
        "the local etcd".into()
    } else {
        format!("peer {name}")
    }
}

/// A password file given by `flag`.
fn password(flag: &'static str, path: &str) -> Result<String, ConfigError> {
    read_password(path).map_err(|e| ConfigError::new(flag, format!("{flag} {path:?}: {e}")))
}
