//! The TOML config file (`--config PATH`): its tables and keys, and errors
//! that name the file, the table and the key.
//!
//! Keys are the long flag names in snake_case; one table for the local
//! etcd (`[local]`) and one per peer (`[peers.<region>]`). Unknown keys are
//! refused. Secrets come from files only (`password_file`), never from the
//! config file itself.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use toml::de::{DeTable, DeValue};

use super::validate::ConfigError;

/// The flag whose value a config-file error is about.
pub(super) const CONFIG_FLAG: &str = "--config";

/// The whole file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub region: Option<String>,
    pub lease_ttl: Option<String>,
    pub election_ttl: Option<String>,
    pub metrics_addr: Option<String>,
    pub log_format: Option<String>,
    pub root: Option<String>,
    pub max_inflight: Option<usize>,
    pub peer_connections: Option<usize>,
    pub page_size: Option<usize>,
    pub max_txn_ops: Option<usize>,
    #[serde(default, deserialize_with = "byte_size")]
    pub max_request_bytes: Option<String>,
    pub replica_id: Option<String>,
    pub reload_interval: Option<String>,
    pub heartbeat_interval: Option<String>,
    pub lapse_after: Option<String>,
    pub verify_interval: Option<String>,
    pub verify_rate: Option<u32>,
    pub local: Option<EtcdTable>,
    #[serde(default)]
    pub peers: BTreeMap<String, PeerTable>,
}

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

impl PeerTable {
    /// The connection keys, as for `[local]`.
    pub fn etcd(&self) -> EtcdTable {
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
pub(super) fn load(path: &str) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(CONFIG_FLAG, format!("{CONFIG_FLAG} {path:?}: {e}")))?;
    parse(path, &text)
}

/// Parses `text`, the contents of `path`.
pub(super) fn parse(path: &str, text: &str) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e| located(path, text, &e))
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
fn byte_size<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let e = load("/nonexistent/a.toml").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("--config \"/nonexistent/a.toml\": "),
            "{e}"
        );
    }
}
