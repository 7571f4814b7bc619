//! One etcd's connection: its endpoints, TLS files and credentials, from
//! the `--local-*` flags, a `--peer-*` flag or a table of the config file
//! (`[local]`, `[peers.<region>]`). TLS and password files are read here,
//! so that a missing one stops the start rather than the first request, and
//! so are the certificates' dates and the key's match ([`certs`]).

use std::time::SystemTime;

use super::super::certs;
use super::super::parse::{self, CERTIFICATE, PRIVATE_KEY};
use super::args::LocalEtcdArgs;
use super::error::{CONFIG_FLAG, ConfigError, in_file, place};
use super::file::EtcdTable;
use crate::etcd::{ClientConfig, Credentials, TlsConfig};

/// The default `--local-etcd`.
pub const DEFAULT_LOCAL_ETCD: &str = "http://127.0.0.1:2379";

/// A user whose password is read from a file (and re-read on rotation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PasswordFile {
    /// The etcd user.
    pub user: String,
    /// The file holding the password.
    pub path: String,
}

impl LocalEtcdArgs {
    /// Checks the flags as a run does and builds the client config.
    pub fn validate(&self) -> Result<ClientConfig, ConfigError> {
        Ok(self.validate_with(None)?.0)
    }

    /// Like [`LocalEtcdArgs::validate`], with the config file's `[local]`
    /// table under the flags: `--local-etcd` replaces its `endpoints`; any
    /// of the TLS flags replace its `ca`, `cert`, `key` and `server_name`
    /// together; `--local-user`/`--local-password-file` replace its `username`
    /// and `password_file`. Also returns the password file in use.
    pub(super) fn validate_with(
        &self,
        file: Option<(&str, &EtcdTable)>,
    ) -> Result<(ClientConfig, Option<PasswordFile>), ConfigError> {
        const TABLE: &[&str] = &["local"];
        let table = file.map(|(_, t)| t);
        let endpoints = match (&self.local_etcd, file) {
            (Some(list), _) => parse_endpoints("--local-etcd", "--local-etcd", list)?,
            (
                None,
                Some((
                    path,
                    EtcdTable {
                        endpoints: Some(items),
                        ..
                    },
                )),
            ) => file_endpoints(path, TABLE, items)?,
            (None, _) => parse_endpoints("--local-etcd", "--local-etcd", DEFAULT_LOCAL_ETCD)?,
        };
        let flags = TlsParts {
            ca: self.local_ca.clone(),
            cert: self.local_cert.clone(),
            key: self.local_key.clone(),
            server_name: self.local_server_name.clone(),
        };
        let (tls, scope) = match file {
            Some((path, t)) if flags == TlsParts::default() => {
                (file_tls(t), Scope::File { path, table: TABLE })
            }
            _ => (flags, Scope::Local),
        };
        let tls = build_tls(tls, scope)?;
        check_tls_for_endpoints(scope, &endpoints, tls.as_ref())?;
        if self.local_password.is_some() {
            return Err(ConfigError::new(
                "--local-password",
                "--local-password (or AETHER_REPLICATOR_LOCAL_PASSWORD): passwords are read from \
                 files only, never from the command line or the environment: give \
                 --local-password-file PATH (or password_file in the config file's [local])",
            ));
        }
        let flag_auth = self.local_user.is_some() || self.local_password_file.is_some();
        let (credentials, password_file) = match (flag_auth, file) {
            (false, Some((path, _))) => {
                file_credentials(path, TABLE, table.cloned().unwrap_or_default())?
            }
            _ => self.flag_credentials()?,
        };
        let mut config = ClientConfig::new(endpoints);
        config.tls = tls;
        config.credentials = credentials;
        Ok((config, password_file))
    }

    fn flag_credentials(&self) -> Result<(Option<Credentials>, Option<PasswordFile>), ConfigError> {
        match (&self.local_user, &self.local_password_file) {
            (None, None) => Ok((None, None)),
            (Some(_), None) => Err(ConfigError::new(
                "--local-user",
                "--local-user needs --local-password-file",
            )),
            (None, Some(_)) => Err(ConfigError::new(
                "--local-password-file",
                "--local-password-file needs --local-user",
            )),
            (Some(user), Some(path)) => {
                if user.is_empty() {
                    return Err(ConfigError::new("--local-user", "--local-user: empty user"));
                }
                let password = read_password(path).map_err(|why| {
                    ConfigError::new(
                        "--local-password-file",
                        format!("--local-password-file {path:?}: {why}"),
                    )
                })?;
                Ok((
                    Some(Credentials {
                        user: user.clone(),
                        password,
                    }),
                    Some(PasswordFile {
                        user: user.clone(),
                        path: path.clone(),
                    }),
                ))
            }
        }
    }
}

/// Splits and checks a comma-separated endpoint list. `label` prefixes the
/// messages (`--peer-etcd b`).
pub(super) fn parse_endpoints(
    flag: &'static str,
    label: &str,
    list: &str,
) -> Result<Vec<String>, ConfigError> {
    parse::parse_endpoint_list(list)
        .map_err(|why| ConfigError::new(flag, format!("{label}: {why}")))
}

/// Where a TLS setting came from, for messages.
#[derive(Clone, Copy)]
pub(super) enum Scope<'a> {
    Local,
    Peer(&'a str),
    /// A table of the config file: its path and the table (`local`,
    /// `peers.b`).
    File {
        path: &'a str,
        table: &'a [&'a str],
    },
}

impl Scope<'_> {
    /// The flag a setting comes from.
    fn flag(self, field: &str) -> &'static str {
        match (self, field) {
            (Scope::File { .. }, _) => CONFIG_FLAG,
            (Scope::Peer(_), _) => "--peer-tls",
            (Scope::Local, "ca") => "--local-ca",
            (Scope::Local, "cert") => "--local-cert",
            (Scope::Local, "key") => "--local-key",
            (Scope::Local, _) => "--local-server-name",
        }
    }

    /// The full name of a setting: `--local-ca`, `--peer-tls b: ca`,
    /// `/etc/a.toml: [peers.b] ca`.
    fn setting(self, field: &str) -> String {
        match self {
            Scope::Local => format!("--local-{field}"),
            Scope::Peer(peer) => format!("--peer-tls {peer}: {field}"),
            Scope::File { path, table } => {
                format!("{path}: {}", place(table, Some(&field.replace('-', "_"))))
            }
        }
    }

    /// The short name of a setting, after one named with [`Scope::setting`].
    fn other(self, field: &str) -> String {
        match self {
            Scope::Local => format!("--local-{field}"),
            Scope::Peer(_) => field.to_string(),
            Scope::File { .. } => field.replace('-', "_"),
        }
    }
}

/// TLS settings as given.
pub(super) type TlsParts = parse::TlsSettings;

/// Checks TLS settings (reading the files) and builds the client's.
pub(super) fn build_tls(
    parts: TlsParts,
    scope: Scope<'_>,
) -> Result<Option<TlsConfig>, ConfigError> {
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
    let mut tls = TlsConfig::new();
    tls.ca_file = parts.ca;
    tls.cert_file = parts.cert;
    tls.key_file = parts.key;
    tls.server_name = parts.server_name;
    // Expired, not yet valid, or a key of another certificate: refused
    // now, with the file named, not at the first handshake.
    if let Err((field, why)) = certs::check(&tls, SystemTime::now()) {
        let path = match field {
            "ca" => &tls.ca_file,
            "cert" => &tls.cert_file,
            _ => &tls.key_file,
        };
        let path = path.as_deref().unwrap_or_default();
        return Err(ConfigError::new(
            scope.flag(field),
            format!("{} {path:?}: {why}", scope.setting(field)),
        ));
    }
    Ok(Some(tls))
}

/// https:// endpoints need a CA (the client has no system roots), and TLS
/// settings for plain http:// endpoints would be silently ignored.
pub(super) fn check_tls_for_endpoints(
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
        Scope::File { path, table } if https && !has_ca => Err(in_file(
            path,
            table,
            None,
            "an https:// endpoint needs ca (there are no system roots)",
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
        Scope::File { path, table } if !https && tls.is_some() => Err(in_file(
            path,
            table,
            None,
            "ca, cert, key or server_name given but no endpoint is https://",
        )),
        _ => Ok(()),
    }
}

/// A config file's endpoint list, checked as a flag's would be.
pub(super) fn file_endpoints(
    path: &str,
    table: &[&str],
    items: &[String],
) -> Result<Vec<String>, ConfigError> {
    let items: Vec<&str> = items.iter().map(|s| s.trim()).collect();
    parse::check_endpoints(&items).map_err(|why| in_file(path, table, Some("endpoints"), why))
}

/// A table's TLS keys, as given.
pub(super) fn file_tls(t: &EtcdTable) -> TlsParts {
    TlsParts {
        ca: t.ca.clone(),
        cert: t.cert.clone(),
        key: t.key.clone(),
        server_name: t.server_name.clone(),
    }
}

/// A table's `username` and `password_file`: both or neither; the password
/// is read now, so that a missing file stops the start.
pub(super) fn file_credentials(
    path: &str,
    table: &[&str],
    t: EtcdTable,
) -> Result<(Option<Credentials>, Option<PasswordFile>), ConfigError> {
    let refuse = |key, why| in_file(path, table, Some(key), why);
    match (t.username, t.password_file) {
        (None, None) => Ok((None, None)),
        (Some(_), None) => Err(refuse("username", "needs password_file")),
        (None, Some(_)) => Err(refuse("password_file", "needs username")),
        (Some(user), Some(file)) => {
            if user.is_empty() {
                return Err(refuse("username", "empty user"));
            }
            let password = read_password(&file).map_err(|why| {
                // `password_file "/p": why`: the path before the colon.
                ConfigError::new(
                    CONFIG_FLAG,
                    format!(
                        "{path}: {} {file:?}: {why}",
                        place(table, Some("password_file"))
                    ),
                )
            })?;
            let credentials = Credentials {
                user: user.clone(),
                password,
            };
            Ok((Some(credentials), Some(PasswordFile { user, path: file })))
        }
    }
}

/// Reads a password file: its contents less one trailing newline (what
/// `echo` and most editors add; Kubernetes Secrets add none). Never
/// quotes the contents.
pub(crate) fn read_password(path: &str) -> Result<String, String> {
    let mut text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err("empty password".into());
    }
    Ok(text)
}
