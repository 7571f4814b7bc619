//! The settings of `endpoints` and `migrate`, from their flags alone (they
//! read no config file).

use super::super::endpoints::EndpointsOptions;
use super::super::migrate::MigrateOptions;
use super::args::{EndpointsArgs, MigrateArgs};
use super::error::{ConfigError, Origin};
use super::limits::{page_size_flag, prefix_flag, segment_flag, txn_limits};
use crate::etcd::ClientConfig;
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
