//! Reading the TOML config file (`--config PATH`), with errors that name
//! the file, the table and the key; its two kinds of table, `[local]` and
//! `[peers.<region>]`; and the parsers of values that TOML may write in
//! more than one way.
//!
//! The top level is [`Settings`](super::settings::Settings): one key per
//! flag. Unknown keys are refused. Secrets come from files only
//! (`password_file`), never from the config file itself.

use std::fmt;
use std::ops::Range;

use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use toml::de::{DeTable, DeValue};

use super::error::{CONFIG_FLAG, ConfigError, place};

/// `[local]`: how to reach this region's etcd.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EtcdTable {
    pub endpoints: Option<Vec<String>>,
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    pub server_name: Option<String>,
    pub username: Option<String>,
    pub password_file: Option<String>,
}

/// `[peers.<region>]`: one peer's etcd, and optional limits of its own.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PeerTable {
    pub endpoints: Option<Vec<String>>,
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
    pub server_name: Option<String>,
    pub username: Option<String>,
    pub password_file: Option<String>,
    pub max_txn_ops: Option<usize>,
    #[serde(default, deserialize_with = "byte_size")]
    pub max_request_bytes: Option<String>,
}

impl EtcdTable {
    /// A table with nothing in it.
    pub(crate) const EMPTY: EtcdTable = EtcdTable {
        endpoints: None,
        ca: None,
        cert: None,
        key: None,
        server_name: None,
        username: None,
        password_file: None,
    };
}

impl PeerTable {
    /// The connection keys, as for `[local]`.
    pub(crate) fn etcd(&self) -> EtcdTable {
        EtcdTable {
            endpoints: self.endpoints.clone(),
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            server_name: self.server_name.clone(),
            username: self.username.clone(),
            password_file: self.password_file.clone(),
        }
    }
}

/// Reads and parses the file at `path`. Every error is one line naming the
/// file and, where it can be told, the table and the key.
pub(super) fn load<T: DeserializeOwned>(path: &str) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(CONFIG_FLAG, format!("{CONFIG_FLAG} {path:?}: {e}")))?;
    parse(path, &text)
}

/// Parses `text`, the contents of `path`.
pub(super) fn parse<T: DeserializeOwned>(path: &str, text: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| located(path, text, &e))
}

/// A parse or type error, with the table and key it is about.
fn located(path: &str, text: &str, e: &toml::de::Error) -> ConfigError {
    let message = e.message().trim();
    // serde's words, in the file's terms.
    let message = message
        .replace("unknown field", "unknown key")
        .replace("missing field", "missing key");
    let Some(span) = e.span() else {
        return ConfigError::new(CONFIG_FLAG, format!("{path}: {message}"));
    };
    let found = DeTable::parse(text)
        .ok()
        .and_then(|root| locate(root.get_ref(), &span, &[]));
    let line = |at: usize| {
        let before = &text[..at.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        format!("line {line}, column {column}")
    };
    let message = match found {
        // "unknown key `x`, expected ..." names the key already.
        Some((table, Some(key))) if message.starts_with("unknown key") => {
            let tail = message.split_once(", ").map_or("", |(_, t)| t);
            let t: Vec<&str> = table.iter().map(String::as_str).collect();
            format!("{}: unknown key ({tail})", place(&t, Some(&key)))
        }
        Some((table, key)) => {
            let t: Vec<&str> = table.iter().map(String::as_str).collect();
            format!("{}: {message}", place(&t, key.as_deref()))
        }
        None => format!("{}: {message}", line(span.start)),
    };
    ConfigError::new(CONFIG_FLAG, format!("{path}: {message}"))
}

/// The table path and key whose text overlaps `err`; `None` for the key
/// when `err` is a whole table (a missing key).
fn locate(
    table: &DeTable<'_>,
    err: &Range<usize>,
    path: &[String],
) -> Option<(Vec<String>, Option<String>)> {
    // Tables first: an implicit table's own span need not cover its keys.
    for (k, v) in table {
        if let DeValue::Table(inner) = v.get_ref() {
            let mut p = path.to_vec();
            p.push(k.get_ref().to_string());
            if v.span() == *err {
                return Some((p, None));
            }
            if let Some(found) = locate(inner, err, &p) {
                return Some(found);
            }
        }
    }
    let overlaps = |s: Range<usize>| s.start < err.end.max(err.start + 1) && err.start < s.end;
    for (k, v) in table {
        let leaf = !matches!(v.get_ref(), DeValue::Table(_));
        if overlaps(k.span()) || (leaf && overlaps(v.span())) {
            return Some((path.to_vec(), Some(k.get_ref().to_string())));
        }
    }
    None
}

/// A byte size as a string (`"1536KiB"`) or a plain integer of bytes.
pub(super) fn byte_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a byte size such as \"1536KiB\" or 1572864")
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
            Ok(Some(s.to_string()))
        }
        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
            Ok(Some(n.to_string()))
        }
        fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
            Ok(Some(n.to_string()))
        }
    }
    d.deserialize_any(V)
}

/// A value written as a string and parsed by `parse`, refused as
/// `invalid <what> "<text>": <expected>` (for a key's own deserializer).
pub(super) fn parsed<'de, D: Deserializer<'de>, T>(
    d: D,
    what: &str,
    expected: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<Option<T>, D::Error> {
    let raw = String::deserialize(d)?;
    match parse(&raw) {
        Some(v) => Ok(Some(v)),
        None => Err(de::Error::custom(format!(
            "invalid {what} {raw:?}: {expected}"
        ))),
    }
}
