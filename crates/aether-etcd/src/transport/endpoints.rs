//! One set of endpoints and their channels, and the TLS material they were
//! built with. A set is never changed in place: a new member list or a
//! rotated certificate builds a new one, so calls under way keep the
//! channels they started on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tonic::transport::{Channel, Endpoint};

use super::config::{ClientConfig, TlsConfig, UNHEALTHY_FOR};
use crate::error::{Error, Result};

/// One set of endpoints and their lazily connected channels. Replaced as a
/// whole by [`Transport::set_endpoints`](super::Transport::set_endpoints)
/// and [`Transport::reload_tls`](super::Transport::reload_tls).
pub(super) struct Endpoints {
    pub(super) urls: Vec<String>,
    /// Per URL, [`ClientConfig::connections`] channels.
    pub(super) channels: Vec<Vec<Channel>>,
    /// A second connection per URL for the lease keep-alive stream only,
    /// so that a keep-alive never waits behind bulk traffic (mirror txns,
    /// range pages) in the shared connection's HTTP/2 flow-control windows
    /// and TCP send buffer. Over a long, full link that queue can hold
    /// seconds of data, longer than a short lease's TTL/3. Lazily
    /// connected: a client that keeps no lease never opens it.
    pub(super) lease_channels: Vec<Channel>,
    pub(super) tls: Option<TlsMaterial>,
    /// Per URL, until when round-robin balancing skips it (milliseconds
    /// since `born`; 0: healthy). Lives with the set, so new members start
    /// healthy.
    unhealthy_until: Vec<AtomicU64>,
    born: Instant,
}

impl Endpoints {
    /// One lazily connected channel per URL, with the client's settings.
    pub(super) fn build(
        config: &ClientConfig,
        urls: Vec<String>,
        tls: Option<TlsMaterial>,
    ) -> Result<Endpoints> {
        if urls.is_empty() {
            return Err(Error::InvalidConfig("no endpoints".into()));
        }
        if config.connections == 0 {
            return Err(Error::InvalidConfig(
                "connections per endpoint must be at least 1".into(),
            ));
        }
        let server_name = config.tls.as_ref().and_then(|t| t.server_name.as_deref());
        let mut channels = Vec::with_capacity(urls.len());
        let mut lease_channels = Vec::with_capacity(urls.len());
        for url in &urls {
            let https = url.starts_with("https://");
            if !https && !url.starts_with("http://") {
                return Err(Error::InvalidConfig(format!(
                    "endpoint {url:?} must start with http:// or https://"
                )));
            }
            let mut ep = Endpoint::from_shared(url.clone())
                .map_err(|e| Error::InvalidConfig(format!("endpoint {url:?}: {e}")))?
                .connect_timeout(config.connect_timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(config.keepalive_interval)
                .keep_alive_timeout(config.keepalive_timeout)
                .keep_alive_while_idle(true)
                .initial_stream_window_size(config.stream_window)
                .initial_connection_window_size(config.connection_window);
            if https {
                ep = with_tls(ep, url, tls.as_ref(), server_name)?;
            }
            channels.push((0..config.connections).map(|_| ep.connect_lazy()).collect());
            lease_channels.push(ep.connect_lazy());
        }
        Ok(Endpoints {
            unhealthy_until: urls.iter().map(|_| AtomicU64::new(0)).collect(),
            born: Instant::now(),
            urls,
            channels,
            lease_channels,
            tls,
        })
    }

    /// Whether round-robin balancing should pass over endpoint `i` now.
    pub(super) fn is_unhealthy(&self, i: usize) -> bool {
        let until = self.unhealthy_until[i].load(Ordering::Relaxed);
        until != 0 && self.now_ms() < until
    }

    /// Endpoint `i` failed a call in transport: skip it for a while.
    pub(super) fn mark_unhealthy(&self, i: usize) {
        let until = self.now_ms() + UNHEALTHY_FOR.as_millis() as u64;
        self.unhealthy_until[i].store(until.max(1), Ordering::Relaxed);
    }

    /// Endpoint `i` answered a call.
    pub(super) fn mark_healthy(&self, i: usize) {
        // Read first: a store on every call would bounce the cache line
        // between the cores making calls.
        if self.unhealthy_until[i].load(Ordering::Relaxed) != 0 {
            self.unhealthy_until[i].store(0, Ordering::Relaxed);
        }
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// Takes over `old`'s channels for the URLs both sets have, so that a
    /// member list naming the same members opens no new connection.
    pub(super) fn keep_channels_of(mut self, old: &Endpoints) -> Endpoints {
        for j in 0..self.urls.len() {
            if let Some(i) = old.urls.iter().position(|u| *u == self.urls[j]) {
                self.channels[j] = old.channels[i].clone();
                self.lease_channels[j] = old.lease_channels[i].clone();
            }
        }
        self
    }
}

/// The TLS material as last read (files) or given (PEM), to tell whether
/// a reload changed anything.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct TlsMaterial {
    ca: Option<Vec<u8>>,
    cert: Option<Vec<u8>>,
    key: Option<Vec<u8>>,
}

impl TlsMaterial {
    /// Reads the files `tls` names and takes its in-memory PEM.
    pub(super) fn read(tls: &TlsConfig) -> Result<TlsMaterial> {
        let one = |what: &str, file: &Option<String>, pem: &Option<Vec<u8>>| match (file, pem) {
            (Some(_), Some(_)) => Err(Error::InvalidConfig(format!(
                "TLS {what}: give a file or PEM, not both"
            ))),
            (Some(path), None) => read_file(path).map(Some),
            (None, pem) => Ok(pem.clone()),
        };
        let material = TlsMaterial {
            ca: one("CA", &tls.ca_file, &tls.ca_pem)?,
            cert: one("client certificate", &tls.cert_file, &tls.cert_pem)?,
            key: one("client key", &tls.key_file, &tls.key_pem)?,
        };
        // rustls skips what it cannot parse, so a CA that is not PEM would
        // leave no root at all and fail every handshake later.
        if let Some(ca) = &material.ca
            && !ca.windows(PEM_CERT.len()).any(|w| w == PEM_CERT)
        {
            let from = tls.ca_file.as_deref().unwrap_or("ca_pem");
            return Err(Error::InvalidConfig(format!(
                "TLS CA {from:?}: no PEM certificate in it"
            )));
        }
        if material.cert.is_some() != material.key.is_some() {
            return Err(Error::InvalidConfig(
                "a client certificate needs both cert and key".into(),
            ));
        }
        Ok(material)
    }
}

/// `ep` with TLS from `material` (no material: no CA, no client
/// certificate). Without a CA the system's roots verify the server, or,
/// built without them, the endpoint is refused: no server could pass.
#[cfg(any(feature = "tls-ring", feature = "tls-aws-lc"))]
fn with_tls(
    ep: Endpoint,
    url: &str,
    material: Option<&TlsMaterial>,
    server_name: Option<&str>,
) -> Result<Endpoint> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};

    let mut cfg = ClientTlsConfig::new();
    match material.and_then(|m| m.ca.as_ref()) {
        Some(ca) => cfg = cfg.ca_certificate(Certificate::from_pem(ca)),
        None => cfg = system_roots(cfg, url)?,
    }
    if let Some(TlsMaterial {
        cert: Some(cert),
        key: Some(key),
        ..
    }) = material
    {
        cfg = cfg.identity(Identity::from_pem(cert, key));
    }
    if let Some(name) = server_name {
        cfg = cfg.domain_name(name);
    }
    // tonic builds the rustls config here (and loads the system's roots),
    // so a bad PEM or an empty trust store is an error now, not at the
    // first call.
    ep.tls_config(cfg)
        .map_err(|e| Error::InvalidConfig(format!("endpoint {url:?}: TLS: {}", chain(&e))))
}

/// The roots an `https://` endpoint without a CA is verified against:
/// the system's (`tls-native-roots`), Mozilla's compiled in
/// (`tls-webpki-roots`), or both.
#[cfg(all(
    any(feature = "tls-ring", feature = "tls-aws-lc"),
    any(feature = "tls-native-roots", feature = "tls-webpki-roots")
))]
fn system_roots(
    cfg: tonic::transport::ClientTlsConfig,
    _url: &str,
) -> Result<tonic::transport::ClientTlsConfig> {
    #[cfg(feature = "tls-native-roots")]
    let cfg = cfg.with_native_roots();
    #[cfg(feature = "tls-webpki-roots")]
    let cfg = cfg.with_webpki_roots();
    Ok(cfg)
}

#[cfg(all(
    any(feature = "tls-ring", feature = "tls-aws-lc"),
    not(any(feature = "tls-native-roots", feature = "tls-webpki-roots"))
))]
fn system_roots(
    _cfg: tonic::transport::ClientTlsConfig,
    url: &str,
) -> Result<tonic::transport::ClientTlsConfig> {
    Err(Error::InvalidConfig(format!(
        "endpoint {url:?} is https:// without a CA: set TlsConfig's ca_file or ca_pem, \
         or build aether-etcd with feature tls-native-roots (the system's roots) \
         or tls-webpki-roots (Mozilla's, compiled in)"
    )))
}

#[cfg(not(any(feature = "tls-ring", feature = "tls-aws-lc")))]
fn with_tls(
    _ep: Endpoint,
    url: &str,
    _material: Option<&TlsMaterial>,
    _server_name: Option<&str>,
) -> Result<Endpoint> {
    Err(Error::InvalidConfig(format!(
        "endpoint {url:?} is https://, but aether-etcd was built without TLS: \
         enable feature tls-ring or tls-aws-lc"
    )))
}

/// An error and its sources on one line: tonic's own text is only
/// "transport error".
#[cfg(any(feature = "tls-ring", feature = "tls-aws-lc"))]
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        src = s.source();
    }
    out
}

const PEM_CERT: &[u8] = b"-----BEGIN CERTIFICATE-----";

fn read_file(path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Right in every feature set. CI runs it with the defaults (ring and
    /// the system's roots) and with `--no-default-features --features
    /// tls-aws-lc,tls-webpki-roots` (roots compiled in: no host can lack
    /// them); `--no-default-features` alone gives the no-provider error.
    #[tokio::test]
    async fn https_needs_a_provider_and_roots_or_it_is_a_one_line_error() {
        let config = ClientConfig::new(["https://127.0.0.1:2379"]);
        let built = Endpoints::build(&config, config.endpoints.clone(), None).map(|_| ());
        let provider = cfg!(any(feature = "tls-ring", feature = "tls-aws-lc"));
        let roots = cfg!(any(
            feature = "tls-native-roots",
            feature = "tls-webpki-roots"
        ));
        match (provider, roots, built) {
            (true, true, Ok(())) => {}
            // A machine without a system trust store, when the roots are
            // the system's alone.
            (true, true, Err(Error::InvalidConfig(m))) if !cfg!(feature = "tls-webpki-roots") => {
                assert!(m.contains("native"), "{m}")
            }
            (false, _, Err(Error::InvalidConfig(m))) => {
                assert!(m.contains("feature tls-ring or tls-aws-lc"), "{m}")
            }
            (true, false, Err(Error::InvalidConfig(m))) => {
                assert!(m.contains("feature tls-native-roots"), "{m}");
                assert!(m.contains("tls-webpki-roots"), "{m}")
            }
            (provider, roots, got) => panic!("provider {provider}, roots {roots}: {got:?}"),
        }
        // A CA makes the roots unnecessary, not the provider (a CA that
        // works is tests/client_transport.rs's).
        if !provider {
            let tls = TlsMaterial {
                ca: Some(b"-----BEGIN CERTIFICATE-----".to_vec()),
                cert: None,
                key: None,
            };
            let with_ca = Endpoints::build(&config, config.endpoints.clone(), Some(tls));
            assert!(matches!(with_ca, Err(Error::InvalidConfig(_))));
        }
        // Plain http needs neither.
        let http = ClientConfig::new(["http://127.0.0.1:2379"]);
        assert!(Endpoints::build(&http, http.endpoints.clone(), None).is_ok());
    }
}
