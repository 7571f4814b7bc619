//! The peers: the file's `[peers.<region>]` tables and the `--peer-etcd`,
//! `--peer-tls` and `--peer-auth` flags, each flag replacing its group of
//! the table's keys whole.

use std::collections::{BTreeMap, HashMap};

use super::super::parse::{self, PEER_AUTH_FORM, PEER_ETCD_FORM, PEER_TLS_FORM, normalize_url};
use super::args::{RunArgs, Secret};
use super::connection::{
    PasswordFile, Scope, build_tls, check_tls_for_endpoints, file_credentials, file_endpoints,
    file_tls, parse_endpoints, read_password,
};
use super::error::{CONFIG_FLAG, ConfigError, Origin, in_file, place};
use super::limits::txn_limits;
use super::settings::Settings;
use crate::etcd::{ClientConfig, Credentials, TxnLimits};
use crate::mirror::PeerConfig;

/// One peer, validated.
pub(super) struct ValidPeer {
    pub(super) config: PeerConfig,
    /// Limits of its own, from its table in the config file.
    pub(super) limits: Option<TxnLimits>,
    pub(super) password_file: Option<PasswordFile>,
}

impl RunArgs {
    pub(super) fn validate_peers(
        &self,
        region: &str,
        local: &ClientConfig,
        limits: TxnLimits,
        connections: usize,
        file: Option<(&str, &Settings)>,
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
        let mut tls = by_region(
            "--peer-tls",
            PEER_TLS_FORM,
            self.peer_tls.iter().map(String::as_str),
            false,
            &is_peer,
            parse::parse_tls_settings,
        )?;
        let mut auth = by_region(
            "--peer-auth",
            PEER_AUTH_FORM,
            self.peer_auth.iter().map(Secret::expose),
            true,
            &is_peer,
            |creds| {
                let (user, path) = parse::parse_user_password(creds)?;
                let password = read_password(path).map_err(|why| format!("{path:?}: {why}"))?;
                Ok((
                    Credentials {
                        user: user.to_string(),
                        password,
                    },
                    PasswordFile {
                        user: user.to_string(),
                        path: path.to_string(),
                    },
                ))
            },
        )?;

        let mut out = Vec::with_capacity(order.len());
        for peer in order {
            let table_path = ["peers", peer.as_str()];
            let table = tables.get(&peer);
            let refuse = |why: String| in_file(path, &table_path, None, why);
            if table.is_some() {
                parse::check_peer_region(&peer).map_err(refuse)?;
                if peer == region {
                    return Err(refuse(format!("peer region is this region ({region})")));
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
                    return Err(refuse(format!(
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
                (Some((c, file)), _) => (Some(c), Some(file)),
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
            let mut client = ClientConfig::new(endpoints);
            client.tls = tls;
            client.credentials = credentials;
            client.connections = connections;
            out.push(ValidPeer {
                config: PeerConfig {
                    client,
                    region: peer,
                },
                limits: peer_limits,
                password_file,
            });
        }
        Ok(out)
    }
}

/// The entries of a per-peer flag, `--peer-tls` or `--peer-auth`:
/// `<region>=<value>`, at most one per peer (`is_peer`), each value parsed
/// by `parse`. No message quotes a `secret` entry: it holds a password.
fn by_region<'a, T>(
    flag: &'static str,
    form: &str,
    entries: impl IntoIterator<Item = &'a str>,
    secret: bool,
    is_peer: &dyn Fn(&str) -> bool,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<HashMap<String, T>, ConfigError> {
    let mut out = HashMap::new();
    for spec in entries {
        let Some((peer, value)) = spec.split_once('=') else {
            let entry = if secret {
                ": an entry has no '='".to_string()
            } else {
                format!(" {spec:?}: missing '='")
            };
            return Err(ConfigError::new(
                flag,
                format!("{flag}{entry} (expected {form})"),
            ));
        };
        if !secret {
            check_peer_region(flag, spec, peer)?;
        }
        if !is_peer(peer) {
            // A region with ':' is most likely "<user>:<pass=word>" with
            // the region left out; do not echo it.
            let message = if secret && (peer.contains(':') || peer.is_empty()) {
                format!(
                    "{flag}: an entry does not start with a --peer-etcd region (expected {form})"
                )
            } else {
                format!("{flag} {peer}: there is no --peer-etcd for region {peer:?}")
            };
            return Err(ConfigError::new(flag, message));
        }
        if out.contains_key(peer) {
            return Err(ConfigError::new(
                flag,
                format!("{flag}: duplicate entry for peer region {peer:?}"),
            ));
        }
        let value =
            parse(value).map_err(|why| ConfigError::new(flag, format!("{flag} {peer}: {why}")))?;
        out.insert(peer.to_string(), value);
    }
    Ok(out)
}

/// Checks the region part of a `<region>=...` spec.
pub(super) fn check_peer_region(
    flag: &'static str,
    spec: &str,
    peer: &str,
) -> Result<(), ConfigError> {
    parse::check_peer_region(peer)
        .map_err(|what| ConfigError::new(flag, format!("{flag} {spec:?}: {what}")))
}
