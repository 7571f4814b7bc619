//! [`ConfigError`], and how its messages name where a value came from: a
//! flag, its environment variable or its default ([`Origin::Flag`]), or a
//! key of the config file ([`Origin::File`], [`place`]).

use std::borrow::Cow;
use std::fmt;

/// The flag whose value a config-file error is about.
pub(super) const CONFIG_FLAG: &str = "--config";

/// A flag that is wrong: one line naming the flag and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    flag: Cow<'static, str>,
    message: String,
}

impl ConfigError {
    pub(super) fn new(flag: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        ConfigError {
            flag: flag.into(),
            message: message.into(),
        }
    }

    /// The flag at fault, e.g. `"--peer-etcd"`; `"--config"` for the
    /// config file.
    pub fn flag(&self) -> &str {
        &self.flag
    }
}

/// Where a setting's value came from, for messages: a flag (or its
/// environment variable, or its default), or a key of the config file.
#[derive(Clone, Debug)]
pub(super) enum Origin {
    Flag(Cow<'static, str>),
    File {
        /// The config file's path.
        path: String,
        /// `lease_ttl`, `[peers.b] max_request_bytes`.
        place: String,
    },
}

impl Origin {
    /// The flag of a top-level file key: `lease_ttl` is `--lease-ttl`.
    pub(super) fn flag_of(key: &str) -> Origin {
        Origin::Flag(format!("--{}", key.replace('_', "-")).into())
    }

    /// `key` of `table` in the file at `path`.
    pub(super) fn file(path: &str, table: &[&str], key: &str) -> Origin {
        Origin::File {
            path: path.to_string(),
            place: place(table, Some(key)),
        }
    }

    /// The flag named in [`ConfigError::flag`].
    pub(super) fn flag(&self) -> Cow<'static, str> {
        match self {
            Origin::Flag(f) => f.clone(),
            Origin::File { .. } => CONFIG_FLAG.into(),
        }
    }

    /// `--lease-ttl`, `/etc/a.toml: lease_ttl`.
    pub(super) fn name(&self) -> String {
        match self {
            Origin::Flag(f) => f.to_string(),
            Origin::File { path, place } => format!("{path}: {place}"),
        }
    }

    /// Refuses `raw`, a `what` (e.g. "duration"), because of `why`: for a
    /// flag `--lease-ttl "0s": why`, for the file
    /// `/etc/a.toml: lease_ttl: invalid duration "0s": why`.
    pub(super) fn refuse(
        &self,
        what: &str,
        raw: impl fmt::Debug,
        why: impl fmt::Display,
    ) -> ConfigError {
        let message = match self {
            Origin::Flag(f) => format!("{f} {raw:?}: {why}"),
            Origin::File { .. } => format!("{}: invalid {what} {raw:?}: {why}", self.name()),
        };
        ConfigError::new(self.flag(), message)
    }
}

/// Where in the file something is: `lease_ttl` or `[peers.b] ca`.
pub(super) fn place(table: &[&str], key: Option<&str>) -> String {
    let table = table.iter().map(|s| toml_key(s)).collect::<Vec<_>>();
    match (table.is_empty(), key) {
        (true, Some(k)) => toml_key(k),
        (true, None) => "top level".to_string(),
        (false, Some(k)) => format!("[{}] {}", table.join("."), toml_key(k)),
        (false, None) => format!("[{}]", table.join(".")),
    }
}

/// A key as written in TOML: bare if it can be, quoted otherwise.
fn toml_key(k: &str) -> String {
    if !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        k.to_string()
    } else {
        format!("{k:?}")
    }
}

/// A refusal of the file at `path`, at `key` of `table` (the table itself
/// without one): `/etc/a.toml: [peers.b] username: needs password_file`.
pub(super) fn in_file(
    path: &str,
    table: &[&str],
    key: Option<&str>,
    what: impl fmt::Display,
) -> ConfigError {
    ConfigError::new(
        CONFIG_FLAG,
        format!("{path}: {}: {what}", place(table, key)),
    )
}
