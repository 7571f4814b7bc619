//! What a view watches and who is looking: [`ViewConfig`], its defaults,
//! its validation, and which keys are replicators' state keys.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::mirror::DEFAULT_STATE_ROOT;
use crate::schema::{Schema, validate_segment};

/// Default keys per page of a snapshot scan.
pub const DEFAULT_VIEW_PAGE_SIZE: usize = 2000;
/// Default number of changes a subscriber may fall behind before it lags.
pub const DEFAULT_CHANNEL_CAPACITY: usize = 4096;
/// Default cap on the backoff between attempts after an error.
pub const DEFAULT_VIEW_MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a [`RegistryView`](super::RegistryView) watches and who is looking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewConfig {
    /// The key layout; its root is what is watched.
    pub schema: Schema,
    /// The viewer's region.
    pub region: String,
    /// The viewer's zone; without one, no endpoint has priority 0.
    pub zone: Option<String>,
    /// Keys per page of a snapshot scan.
    pub page_size: usize,
    /// Changes buffered per subscriber.
    pub channel_capacity: usize,
    /// Cap on the backoff between attempts after an error.
    pub max_backoff: Duration,
    /// Prefix of the replicators' state keys, `<state_root><origin>/state`
    /// (default [`DEFAULT_STATE_ROOT`]); must not overlap the root.
    pub state_root: String,
}

impl ViewConfig {
    /// A view for `region` under the default root, without a zone.
    pub fn new(region: impl Into<String>) -> Self {
        ViewConfig {
            schema: Schema::default(),
            region: region.into(),
            zone: None,
            page_size: DEFAULT_VIEW_PAGE_SIZE,
            channel_capacity: DEFAULT_CHANNEL_CAPACITY,
            max_backoff: DEFAULT_VIEW_MAX_BACKOFF,
            state_root: DEFAULT_STATE_ROOT.to_owned(),
        }
    }

    /// The same config with another state-key prefix (the one the
    /// replicators writing into this etcd use).
    #[must_use]
    pub fn with_state_root(mut self, state_root: impl Into<String>) -> Self {
        self.state_root = state_root.into();
        self
    }

    /// The same config with the viewer's zone set.
    pub fn zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        validate_segment("region", &self.region).map_err(|e| Error::Config(e.to_string()))?;
        if self.zone.as_deref() == Some("") {
            return Err(Error::Config("empty zone".into()));
        }
        if self.channel_capacity == 0 {
            return Err(Error::Config("channel capacity must be at least 1".into()));
        }
        let (root, state) = (self.schema.root(), self.state_root.as_str());
        if !state.starts_with('/') || !state.ends_with('/') {
            return Err(Error::Config(format!(
                "state root {state:?}: must start and end with '/'"
            )));
        }
        if root.starts_with(state) || state.starts_with(root) {
            return Err(Error::Config(format!(
                "state root {state:?} overlaps the registry root {root:?}"
            )));
        }
        Ok(())
    }

    /// The origin region a state key belongs to, if `key` is one.
    pub(super) fn state_origin<'k>(&self, key: &'k [u8]) -> Option<&'k str> {
        let rest = key.strip_prefix(self.state_root.as_bytes())?;
        let region = std::str::from_utf8(rest.strip_suffix(b"/state")?).ok()?;
        validate_segment("region", region).ok()?;
        Some(region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::test_support::cfg;

    #[test]
    fn state_keys_are_recognized() {
        let c = cfg();
        assert_eq!(c.state_origin(b"/aether/v1/replication/a/state"), Some("a"));
        assert_eq!(c.state_origin(b"/aether/v1/replication/a/other"), None);
        assert_eq!(c.state_origin(b"/aether/v1/replication/a/b/state"), None);
        assert_eq!(c.state_origin(b"/aether/v1/replication//state"), None);
        assert_eq!(c.state_origin(b"/aether/v1/regions/a/state"), None);
        let t = cfg().with_state_root("/t/state/");
        assert_eq!(t.state_origin(b"/t/state/eu/state"), Some("eu"));
    }

    #[test]
    fn config_is_validated() {
        assert!(
            ViewConfig::new("a")
                .with_state_root("/aether/v1/")
                .validate()
                .is_err()
        );
        assert!(
            ViewConfig::new("a")
                .with_state_root("x/")
                .validate()
                .is_err()
        );
        assert!(
            ViewConfig::new("a")
                .with_state_root("/s/")
                .validate()
                .is_ok()
        );
        assert!(ViewConfig::new("a/b").validate().is_err());
        assert!(ViewConfig::new("a").zone("").validate().is_err());
        let mut c = ViewConfig::new("a");
        c.channel_capacity = 0;
        assert!(c.validate().is_err());
        assert!(ViewConfig::new("a").zone("z").validate().is_ok());
    }
}
