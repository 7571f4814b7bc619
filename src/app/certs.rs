//! What the TLS files hold: certificates that are valid now, a key that
//! belongs to its certificate, and when each file stops working.
//!
//! Checked at start-up and by `--check-config` (a refusal names the
//! setting and the file), and again by the reloader before rotated files
//! are handed to the client, so that a bad rotation keeps the files in use
//! instead of breaking the next handshake. The expiry of every file is
//! exported as `certificate_expiry_timestamp_seconds{origin,peer,file}`:
//!
//! - a certificate file (the client certificate and any intermediates
//!   after it) works until the *first* of its certificates expires, and
//!   every one of them must be valid now;
//! - a CA bundle works while *any* of its CAs does: during a CA rotation it
//!   holds the old CA next to the new one, and the old one expiring is
//!   expected, not a fault. It is refused only when none is valid now.
//!
//! Parsing is `x509-parser`'s; whether the key matches is rustls's own
//! check (`CertifiedKey::from_der`), the one a handshake would fail.

use std::time::{SystemTime, UNIX_EPOCH};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::pem::Pem;
use x509_parser::time::ASN1Time;

use crate::etcd::TlsConfig;

/// When one TLS file stops working.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileExpiry {
    /// The file's path, as configured.
    pub file: String,
    /// Unix seconds of the expiry (see the module docs for a bundle).
    pub not_after: i64,
}

/// One certificate's validity, in Unix seconds.
#[derive(Clone, Copy, Debug)]
struct Validity {
    not_before: i64,
    not_after: i64,
}

/// Which setting a problem is about (`"ca"`, `"cert"` or `"key"`), and
/// why, without the file's path (the caller names the setting and path).
pub type Problem = (&'static str, String);

/// Checks every file of `tls` at `now`; returns the expiry of the CA
/// bundle and of the certificate file, or the first problem found.
pub fn check(tls: &TlsConfig, now: SystemTime) -> Result<Vec<FileExpiry>, Problem> {
    let now = unix(now);
    let mut out = Vec::new();
    if let Some(path) = &tls.ca_file {
        let certs = read_certs(path).map_err(|e| ("ca", e))?;
        let valid: Vec<&Validity> = certs.iter().filter(|v| v.covers(now)).collect();
        if valid.is_empty() {
            // Name the one that comes closest, so the message says what to fix.
            let latest = certs.iter().max_by_key(|v| v.not_after).expect("one");
            return Err((
                "ca",
                format!("no CA in it is valid now: {}", latest.why(now)),
            ));
        }
        out.push(FileExpiry {
            file: path.clone(),
            not_after: valid.iter().map(|v| v.not_after).max().expect("one"),
        });
    }
    if let Some(path) = &tls.cert_file {
        let certs = read_certs(path).map_err(|e| ("cert", e))?;
        if let Some(bad) = certs.iter().find(|v| !v.covers(now)) {
            return Err(("cert", bad.why(now)));
        }
        out.push(FileExpiry {
            file: path.clone(),
            not_after: certs.iter().map(|v| v.not_after).min().expect("one"),
        });
        if let Some(key) = &tls.key_file {
            key_matches(path, key)?;
        }
    }
    Ok(out)
}

impl Validity {
    fn covers(&self, now: i64) -> bool {
        self.not_before <= now && now <= self.not_after
    }

    /// Why it is not valid at `now`.
    fn why(&self, now: i64) -> String {
        if now < self.not_before {
            format!("not valid before {}", utc(self.not_before))
        } else {
            format!("expired on {}", utc(self.not_after))
        }
    }
}

/// The validity of every certificate in a PEM file (at least one).
fn read_certs(path: &str) -> Result<Vec<Validity>, String> {
    let pem = std::fs::read(path).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for block in Pem::iter_from_buffer(&pem) {
        let block = block.map_err(|e| format!("not PEM: {e}"))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let cert = block
            .parse_x509()
            .map_err(|e| format!("not an X.509 certificate: {e}"))?;
        let v = cert.validity();
        out.push(Validity {
            not_before: v.not_before.timestamp(),
            not_after: v.not_after.timestamp(),
        });
    }
    if out.is_empty() {
        return Err("no certificate in it".to_string());
    }
    Ok(out)
}

/// The key in `key_path` is the private half of the first certificate in
/// `cert_path`.
fn key_matches(cert_path: &str, key_path: &str) -> Result<(), Problem> {
    let chain = CertificateDer::pem_file_iter(cert_path)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| ("cert", e.to_string()))?;
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| ("key", format!("no private key in it: {e}")))?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain, key, &provider)
        .map(|_| ())
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => (
                "key",
                format!("does not match the certificate in {cert_path:?}"),
            ),
            e => ("key", e.to_string()),
        })
}

fn unix(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// `2026-12-04 10:00:00 UTC`.
fn utc(unix: i64) -> String {
    match ASN1Time::from_timestamp(unix).map(|t| t.to_datetime()) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => format!("{unix} (Unix seconds)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const DAY: u64 = 86_400;

    /// A self-signed certificate valid from `from` to `to` (Unix seconds),
    /// written with its key into `dir`; returns (cert path, key path).
    fn cert(dir: &std::path::Path, name: &str, from: i64, to: i64) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        params.not_before = ASN1Time::from_timestamp(from).unwrap().to_datetime();
        params.not_after = ASN1Time::from_timestamp(to).unwrap().to_datetime();
        let c = params.self_signed(&key).unwrap();
        let (cp, kp) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cp, c.pem()).unwrap();
        std::fs::write(&kp, key.serialize_pem()).unwrap();
        (
            cp.to_str().unwrap().to_string(),
            kp.to_str().unwrap().to_string(),
        )
    }

    fn tls(ca: Option<&str>, cert: Option<&str>, key: Option<&str>) -> TlsConfig {
        let mut tls = TlsConfig::new();
        tls.ca_file = ca.map(String::from);
        tls.cert_file = cert.map(String::from);
        tls.key_file = key.map(String::from);
        tls
    }

    #[test]
    fn valid_files_report_their_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let now = unix(SystemTime::now());
        let (c, k) = cert(dir.path(), "c", now - 10, now + 30 * DAY as i64);
        let got = check(&tls(Some(&c), Some(&c), Some(&k)), SystemTime::now()).unwrap();
        assert_eq!(
            got,
            [
                FileExpiry {
                    file: c.clone(),
                    not_after: now + 30 * DAY as i64
                },
                FileExpiry {
                    file: c,
                    not_after: now + 30 * DAY as i64
                }
            ]
        );
    }

    #[test]
    fn expired_and_early_certificates_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let t = unix(now);
        let (old, old_key) = cert(dir.path(), "old", t - 30 * DAY as i64, t - DAY as i64);
        let (early, early_key) = cert(dir.path(), "early", t + DAY as i64, t + 30 * DAY as i64);
        let (p, why) = check(&tls(None, Some(&old), Some(&old_key)), now).unwrap_err();
        assert_eq!(p, "cert");
        assert!(why.starts_with("expired on "), "{why}");
        let (p, why) = check(&tls(None, Some(&early), Some(&early_key)), now).unwrap_err();
        assert_eq!(p, "cert");
        assert!(why.starts_with("not valid before "), "{why}");
        // The same files are fine on a day they cover.
        assert!(
            check(
                &tls(None, Some(&old), Some(&old_key)),
                now - Duration::from_secs(2 * DAY)
            )
            .is_ok()
        );
        let (p, why) = check(&tls(Some(&old), None, None), now).unwrap_err();
        assert_eq!(p, "ca");
        assert!(
            why.starts_with("no CA in it is valid now: expired on "),
            "{why}"
        );
    }

    #[test]
    fn a_ca_bundle_works_while_any_ca_does() {
        let dir = tempfile::tempdir().unwrap();
        let t = unix(SystemTime::now());
        let (old, _) = cert(dir.path(), "old", t - 30 * DAY as i64, t - DAY as i64);
        let (new, _) = cert(dir.path(), "new", t - DAY as i64, t + 90 * DAY as i64);
        let bundle = dir.path().join("bundle.crt");
        let pem = std::fs::read_to_string(&old).unwrap() + &std::fs::read_to_string(&new).unwrap();
        std::fs::write(&bundle, pem).unwrap();
        let bundle = bundle.to_str().unwrap();
        let got = check(&tls(Some(bundle), None, None), SystemTime::now()).unwrap();
        assert_eq!(got[0].not_after, t + 90 * DAY as i64);
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let t = unix(SystemTime::now());
        let (c, _) = cert(dir.path(), "c", t - 10, t + DAY as i64);
        let (_, other) = cert(dir.path(), "d", t - 10, t + DAY as i64);
        let (p, why) = check(&tls(None, Some(&c), Some(&other)), SystemTime::now()).unwrap_err();
        assert_eq!(p, "key");
        assert!(why.contains("does not match the certificate in"), "{why}");
        let (p, why) = check(&tls(None, Some(&c), Some(&c)), SystemTime::now()).unwrap_err();
        assert_eq!(p, "key");
        assert!(why.contains("no private key in it"), "{why}");
    }

    #[test]
    fn dates_are_shown_in_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_796_342_400), "2026-12-04 00:00:00 UTC");
    }
}
