//! General-purpose parsers for the settings: durations, byte sizes,
//! endpoint URLs and lists, PEM files, and the `<region>=...` peer specs of
//! the older per-peer flags.
//!
//! They know nothing about flags or files: each returns the reason a value
//! is refused, without repeating the value, and the caller names where the
//! value came from (`--lease-ttl "0s": ...`, `/etc/a.toml: lease_ttl: ...`).
//! The fuzz targets in `fuzz/` call them directly.

use std::collections::HashSet;
use std::time::Duration;

use crate::schema::{SchemaError, validate_segment};

/// What an endpoint URL looks like.
pub const URL_FORM: &str = "http://host:port or https://host:port";
/// PEM marker of a certificate (the end of `-----BEGIN CERTIFICATE-----`).
pub const CERTIFICATE: &str = "CERTIFICATE-----";
/// PEM marker of a private key (any of PKCS#8, RSA or EC).
pub const PRIVATE_KEY: &str = "PRIVATE KEY-----";

/// What a listen address looks like, for errors.
pub const LISTEN_ADDR_FORM: &str =
    "expected IP:PORT, [IPv6]:PORT, localhost:PORT or :PORT (every interface), e.g. 0.0.0.0:9464";

const DURATION_UNITS: &str = "h, m, s, ms, us or ns";
const TOO_LARGE: &str = "too large";

/// Parses a duration: one or more `<number><unit>`, units from largest to
/// smallest and each at most once: `30s`, `500ms`, `2m`, `1h`, `1m30s`,
/// `1.5s`. Units are `h`, `m`, `s`, `ms`, `us` (or `µs`) and `ns`. Zero,
/// negative, unitless and malformed durations are refused; the error says
/// why, without repeating the input.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.is_empty() {
        return Err("empty duration (expected e.g. 30s, 500ms, 2m, 1h or 1m30s)".into());
    }
    if s.starts_with('-') {
        return Err("must not be negative".into());
    }
    let mut rest = s;
    let mut total: u128 = 0;
    let mut prev_rank = None;
    while !rest.is_empty() {
        let Some((int, frac, after)) = split_number(rest) else {
            return Err("not a duration (expected e.g. 30s, 500ms, 2m, 1h or 1m30s)".into());
        };
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let number = &rest[..rest.len() - unit.len() - after.len()];
        let (rank, nanos) = match unit {
            "h" => (0, 3_600_000_000_000),
            "m" => (1, 60_000_000_000),
            "s" => (2, 1_000_000_000),
            "ms" => (3, 1_000_000),
            "us" | "µs" => (4, 1_000),
            "ns" => (5, 1),
            "" => {
                return Err(format!(
                    "missing unit after {number:?} (expected {DURATION_UNITS})"
                ));
            }
            _ => return Err(format!("unknown unit {unit:?} (expected {DURATION_UNITS})")),
        };
        if prev_rank.is_some_and(|p| rank <= p) {
            return Err(
                "units must go from largest to smallest, each at most once (e.g. 1m30s)".into(),
            );
        }
        prev_rank = Some(rank);
        let value = scale(int, frac, nanos).map_err(|e| match e {
            Inexact => "more precise than a nanosecond",
            e => e.as_str(),
        })?;
        total = total.checked_add(value).ok_or(TOO_LARGE)?;
        rest = after;
    }
    if total == 0 {
        return Err("must be greater than zero".into());
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| TOO_LARGE)?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// Parses an address to listen on, as Go and Prometheus servers take one:
/// `IP:PORT`, `[IPv6]:PORT`, `localhost:PORT` (127.0.0.1) or `:PORT` (every
/// IPv4 interface). Other host names are refused rather than resolved: a
/// listener bound to whatever a name resolved to at start-up surprises.
pub fn parse_listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::{Ipv4Addr, SocketAddr};
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("no port ({LISTEN_ADDR_FORM})"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("invalid port {port:?} ({LISTEN_ADDR_FORM})"))?;
    match host {
        "" => Ok(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))),
        "localhost" => Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
        _ => Err(format!(
            "host {host:?} is not an IP address ({LISTEN_ADDR_FORM})"
        )),
    }
}

/// Parses a size in bytes: a plain number (`1572864`) or a number and a
/// binary unit (`512KiB`, `1.5MiB`, `1GiB`; also `B`). The result must be a
/// whole number of bytes. Decimal units (`KB`, `MB`) are refused as
/// ambiguous.
pub fn parse_byte_size(s: &str) -> Result<u64, String> {
    if s.is_empty() {
        return Err("empty size (expected e.g. 1572864, 512KiB or 1.5MiB)".into());
    }
    let Some((int, frac, unit)) = split_number(s) else {
        return Err("not a size (expected e.g. 1572864, 512KiB or 1.5MiB)".into());
    };
    let unit = unit.trim_start();
    let multiplier: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "k" | "kb" | "m" | "mb" | "g" | "gb" => {
            return Err(format!(
                "ambiguous unit {unit:?} (use KiB, MiB or GiB, or a plain number of bytes)"
            ));
        }
        _ => {
            return Err(format!(
                "unknown unit {unit:?} (expected B, KiB, MiB or GiB)"
            ));
        }
    };
    let bytes = scale(int, frac, multiplier).map_err(|e| match e {
        Inexact => "not a whole number of bytes",
        e => e.as_str(),
    })?;
    u64::try_from(bytes).map_err(|_| TOO_LARGE.to_string())
}

/// Decimal places accepted in a number.
const MAX_DECIMALS: usize = 18;

/// Splits a leading `<digits>[.<digits>]` off `s`: (integer part, fraction
/// part, rest). None if `s` does not start with one.
fn split_number(s: &str) -> Option<(&str, &str, &str)> {
    let int_len = s.bytes().take_while(u8::is_ascii_digit).count();
    let (int, rest) = s.split_at(int_len);
    if int.is_empty() {
        return None;
    }
    match rest.strip_prefix('.') {
        Some(after_dot) => {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            if frac_len == 0 {
                return None;
            }
            let (frac, rest) = after_dot.split_at(frac_len);
            Some((int, frac, rest))
        }
        None => Some((int, "", rest)),
    }
}

/// Why [`scale`] failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ScaleError {
    TooLarge,
    TooManyDecimals,
    /// The result has a fraction of the unit's smallest step.
    Inexact,
}

use ScaleError::{Inexact, TooLarge, TooManyDecimals};

impl ScaleError {
    fn as_str(self) -> &'static str {
        match self {
            TooLarge => TOO_LARGE,
            TooManyDecimals => "too many decimal places",
            Inexact => "not a whole number",
        }
    }
}

/// `<int>.<frac> * unit`, exactly.
fn scale(int: &str, frac: &str, unit: u128) -> Result<u128, ScaleError> {
    let whole = int
        .parse::<u128>()
        .ok()
        .and_then(|i| i.checked_mul(unit))
        .ok_or(TooLarge)?;
    if frac.is_empty() {
        return Ok(whole);
    }
    if frac.len() > MAX_DECIMALS {
        return Err(TooManyDecimals);
    }
    let denominator = 10u128.pow(frac.len() as u32);
    // frac < 10^18 and unit < 2^42, so this cannot overflow.
    let numerator = frac.parse::<u128>().map_err(|_| TooLarge)? * unit;
    if !numerator.is_multiple_of(denominator) {
        return Err(Inexact);
    }
    whole.checked_add(numerator / denominator).ok_or(TooLarge)
}

/// Splits and checks a comma-separated endpoint list (blanks around items
/// are trimmed), as [`check_endpoints`] does.
pub fn parse_endpoint_list(list: &str) -> Result<Vec<String>, String> {
    let items: Vec<&str> = list.split(',').map(str::trim).collect();
    if items.iter().all(|i| i.is_empty()) {
        return Err("empty endpoint list".into());
    }
    if items.iter().any(|i| i.is_empty()) {
        return Err(format!("empty URL in endpoint list {list:?}"));
    }
    check_endpoints(&items)
}

/// Checks an endpoint list: at least one URL, each valid
/// ([`is_valid_url`]), no duplicates, all http:// or all https://.
pub fn check_endpoints(items: &[&str]) -> Result<Vec<String>, String> {
    if items.is_empty() {
        return Err("empty endpoint list".into());
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(items.len());
    for &item in items {
        if item.is_empty() {
            return Err("empty URL in endpoint list".into());
        }
        if !is_valid_url(item) {
            return Err(format!("{item:?} is not a valid URL (expected {URL_FORM})"));
        }
        if !seen.insert(normalize_url(item)) {
            return Err(format!("duplicate endpoint {item:?}"));
        }
        out.push(item.to_string());
    }
    let https = out.iter().filter(|u| u.starts_with("https://")).count();
    if https != 0 && https != out.len() {
        return Err("mixes http:// and https:// endpoints".into());
    }
    Ok(out)
}

/// `http://host[:port][/]` or `https://...`, and nothing else: no user
/// info, path, query or fragment.
pub fn is_valid_url(s: &str) -> bool {
    // http::Uri drops a fragment silently.
    if !(s.starts_with("http://") || s.starts_with("https://")) || s.contains('#') {
        return false;
    }
    let Ok(uri) = s.parse::<http::Uri>() else {
        return false;
    };
    let Some(authority) = uri.authority() else {
        return false;
    };
    let host = authority.host();
    if host.is_empty() || authority.as_str().contains('@') {
        return false;
    }
    // Without user info the authority is the host, then maybe ":<port>".
    match authority.as_str().strip_prefix(host) {
        Some("") => {}
        Some(port) => {
            let Some(port) = port.strip_prefix(':') else {
                return false;
            };
            if !port.bytes().all(|b| b.is_ascii_digit()) || !matches!(port.parse::<u16>(), Ok(1..))
            {
                return false;
            }
        }
        None => return false,
    }
    matches!(
        uri.path_and_query().map(|p| p.as_str()),
        None | Some("" | "/")
    )
}

/// A URL reduced to what identifies a server, for duplicate checks.
pub fn normalize_url(s: &str) -> String {
    s.trim_end_matches('/').to_ascii_lowercase()
}

/// Checks that `path` is a readable file holding a PEM block whose BEGIN
/// line ends with `marker` ([`CERTIFICATE`] or [`PRIVATE_KEY`]). Only the
/// framing is checked: the handshake is what proves the contents.
pub fn check_pem(path: &str, marker: &str) -> Result<(), String> {
    match std::fs::metadata(path) {
        Err(e) => Err(e.to_string()),
        Ok(m) if !m.is_file() => Err("not a file".to_string()),
        Ok(_) => match std::fs::read(path) {
            Err(e) => Err(e.to_string()),
            Ok(b) if contains(&b, b"-----BEGIN ") && contains(&b, marker.as_bytes()) => Ok(()),
            Ok(_) => Err(format!("no PEM \"-----BEGIN ...{marker}\" block")),
        },
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The form of a `--peer-etcd` value.
pub const PEER_ETCD_FORM: &str = "<region>=<url>[,<url>...]";
/// The form of a `--peer-tls` value.
pub const PEER_TLS_FORM: &str = "<region>=ca=<path>,cert=<path>,key=<path>,server-name=<name>";
/// The form of a `--peer-auth` value.
pub const PEER_AUTH_FORM: &str = "<region>=<user>:@<password-file>";

/// Checks the region part of a `<region>=...` peer spec: a key segment.
pub fn check_peer_region(peer: &str) -> Result<(), String> {
    validate_segment("region", peer).map_err(|e| match e {
        SchemaError::EmptySegment { .. } => "empty peer region".to_string(),
        _ => format!("peer region {peer:?} contains '/'"),
    })
}

/// TLS file paths and server name, as given (nothing read yet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// CA bundle path.
    pub ca: Option<String>,
    /// Client certificate path.
    pub cert: Option<String>,
    /// Client key path.
    pub key: Option<String>,
    /// Name to verify the server certificate against.
    pub server_name: Option<String>,
}

/// Parses the settings part of a `--peer-tls` value (after `<region>=`):
/// `ca=<path>,cert=<path>,key=<path>,server-name=<name>`, any non-empty
/// subset, each at most once and none empty.
pub fn parse_tls_settings(fields: &str) -> Result<TlsSettings, String> {
    if fields.is_empty() {
        return Err(format!("no settings (expected {PEER_TLS_FORM})"));
    }
    let mut parts = TlsSettings::default();
    for field in fields.split(',') {
        let Some((name, value)) = field.split_once('=') else {
            return Err(format!(
                "setting {field:?} is missing '=' (expected {PEER_TLS_FORM})"
            ));
        };
        let slot = match name {
            "ca" => &mut parts.ca,
            "cert" => &mut parts.cert,
            "key" => &mut parts.key,
            "server-name" => &mut parts.server_name,
            _ => {
                return Err(format!(
                    "unknown setting {name:?} (expected ca, cert, key or server-name)"
                ));
            }
        };
        if slot.is_some() {
            return Err(format!("{name} given twice"));
        }
        if value.is_empty() {
            return Err(format!("empty {name}"));
        }
        *slot = Some(value.to_string());
    }
    Ok(parts)
}

/// Parses the credentials part of a `--peer-auth` value (after
/// `<region>=`): `<user>:@<path>`, the path of the password file being
/// everything after the first ":@". Returns (user, path). No error repeats
/// the value: it may hold a password given by mistake.
pub fn parse_user_password(creds: &str) -> Result<(&str, &str), String> {
    let Some((user, file)) = creds.split_once(':') else {
        return Err(format!("missing ':' (expected {PEER_AUTH_FORM})"));
    };
    if user.is_empty() {
        return Err("empty user".into());
    }
    // Never echo what follows the ':': it may be a password given by
    // mistake.
    let Some(path) = file.strip_prefix('@') else {
        return Err(format!(
            "passwords are read from files only, never from the command line or the \
             environment: give {PEER_AUTH_FORM}"
        ));
    };
    if path.is_empty() {
        return Err(format!(
            "empty password file path (expected {PEER_AUTH_FORM})"
        ));
    }
    Ok((user, path))
}

/// Endpoint URLs [`is_valid_url`] takes, for its tests and the command
/// line's.
#[cfg(test)]
pub(crate) const VALID_URLS: [&str; 4] = [
    "http://x",
    "http://x:2379/",
    "https://[fd00::1]:2379",
    "http://10.0.0.1:2379",
];

/// Endpoint URLs [`is_valid_url`] refuses, for its tests and the command
/// line's.
#[cfg(test)]
pub(crate) const INVALID_URLS: [&str; 10] = [
    "127.0.0.1:2379",
    "ftp://x:21",
    "http://",
    "http://:2379",
    "http://x:0",
    "http://x:65536",
    "http://user:pw@x:2379",
    "http://x:2379/v3",
    "http://x:2379#f",
    "HTTP://x:2379",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::DEFAULT_MAX_REQUEST_BYTES;
    use crate::mirror::DEFAULT_LEASE_TTL;

    #[test]
    fn listen_addresses() {
        for (raw, want) in [
            ("127.0.0.1:9464", "127.0.0.1:9464"),
            ("0.0.0.0:1", "0.0.0.0:1"),
            ("[::1]:9000", "[::1]:9000"),
            (":9999", "0.0.0.0:9999"),
            ("localhost:9999", "127.0.0.1:9999"),
        ] {
            assert_eq!(parse_listen_addr(raw), Ok(want.parse().unwrap()), "{raw}");
        }
        for (raw, why) in [
            ("9999", "no port"),
            ("localhost", "no port"),
            (":x", "invalid port \"x\""),
            (":70000", "invalid port"),
            (
                "example.com:80",
                "host \"example.com\" is not an IP address",
            ),
            ("", "no port"),
        ] {
            let e = parse_listen_addr(raw).unwrap_err();
            assert!(e.starts_with(why), "{raw}: {e}");
            assert!(e.contains(":PORT"), "{raw}: {e}");
        }
    }

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        for (raw, want) in [
            ("30s", ms(30_000)),
            ("500ms", ms(500)),
            ("2m", ms(120_000)),
            ("1h", ms(3_600_000)),
            ("1m30s", ms(90_000)),
            ("1h2m3s4ms", ms(3_723_004)),
            ("1.5s", ms(1500)),
            ("0.001s", ms(1)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("7ns", Duration::from_nanos(7)),
            ("0m5s", ms(5000)),
        ] {
            assert_eq!(parse_duration(raw), Ok(want), "{raw}");
        }
        assert_eq!(parse_duration("30s"), Ok(DEFAULT_LEASE_TTL));
        for raw in ["0s", "0", "abc", "10", "10x", "-5s", "", "1.5ns", "s", "1S"] {
            assert!(parse_duration(raw).is_err(), "{raw}");
        }
    }

    #[test]
    fn byte_sizes() {
        for (raw, want) in [
            ("1572864", 1_572_864),
            ("1.5MiB", 1_572_864),
            ("512KiB", 524_288),
            ("512kib", 524_288),
            ("4096B", 4096),
            ("1GiB", 1 << 30),
            ("0.5 KiB", 512),
        ] {
            assert_eq!(parse_byte_size(raw), Ok(want), "{raw}");
        }
        assert_eq!(
            parse_byte_size(&DEFAULT_MAX_REQUEST_BYTES.to_string()),
            Ok(DEFAULT_MAX_REQUEST_BYTES as u64)
        );
        for raw in [
            "",
            "x",
            "-1",
            "1.5",
            "1MB",
            "1TiB",
            "1.KiB",
            "99999999999999999999999GiB",
        ] {
            assert!(parse_byte_size(raw).is_err(), "{raw}");
        }
    }

    #[test]
    fn urls() {
        for ok in VALID_URLS {
            assert!(is_valid_url(ok), "{ok}");
        }
        for bad in INVALID_URLS {
            assert!(!is_valid_url(bad), "{bad}");
        }
        assert_eq!(normalize_url("HTTP://X:1/"), "http://x:1");
    }

    #[test]
    fn endpoint_lists() {
        assert_eq!(
            parse_endpoint_list(" http://a:1 ,http://b:1"),
            Ok(vec!["http://a:1".to_string(), "http://b:1".to_string()])
        );
        for (list, why) in [
            ("", "empty endpoint list"),
            (" , ", "empty endpoint list"),
            ("http://a:1,", "empty URL"),
            ("htp:/x", "not a valid URL"),
            ("http://a:1,http://A:1/", "duplicate endpoint"),
            ("http://a:1,https://b:1", "mixes"),
        ] {
            let err = parse_endpoint_list(list).unwrap_err();
            assert!(err.contains(why), "{list:?}: {err}");
        }
    }

    #[test]
    fn pem_files() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("c.pem");
        std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nAA==\n").unwrap();
        let cert = cert.to_str().unwrap();
        assert_eq!(check_pem(cert, CERTIFICATE), Ok(()));
        assert!(check_pem(cert, PRIVATE_KEY).unwrap_err().contains("no PEM"));
        assert!(check_pem("/nonexistent/x.pem", CERTIFICATE).is_err());
        let d = dir.path().to_str().unwrap();
        assert_eq!(check_pem(d, CERTIFICATE), Err("not a file".into()));
    }

    #[test]
    fn peer_specs() {
        assert_eq!(check_peer_region("b"), Ok(()));
        assert_eq!(check_peer_region(""), Err("empty peer region".into()));
        assert!(check_peer_region("b/c").unwrap_err().contains("'/'"));
        assert_eq!(
            parse_tls_settings("ca=/a,server-name=n"),
            Ok(TlsSettings {
                ca: Some("/a".into()),
                server_name: Some("n".into()),
                ..TlsSettings::default()
            })
        );
        for (bad, why) in [
            ("", "no settings"),
            ("ca", "missing '='"),
            ("sni=x", "unknown setting"),
            ("ca=x,ca=y", "given twice"),
            ("ca=", "empty ca"),
        ] {
            let err = parse_tls_settings(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
        assert_eq!(parse_user_password("u:@/p:a=ss"), Ok(("u", "/p:a=ss")));
        for (bad, why) in [
            ("u", "missing ':'"),
            (":@pw", "empty user"),
            ("u:@", "empty password file path"),
            ("u:pw", "passwords are read from files only"),
            ("u:", "passwords are read from files only"),
        ] {
            let err = parse_user_password(bad).unwrap_err();
            assert!(err.contains(why) && !err.contains("pw"), "{bad:?}: {err}");
        }
    }
}
