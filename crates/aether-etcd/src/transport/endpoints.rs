//! One set of endpoints and their channels, and the TLS material they were
//! built with. A set is never changed in place: a new member list or a
//! rotated certificate builds a new one, so calls under way keep the
//! channels they started on.

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::config::{ClientConfig, TlsConfig};
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
        let tls_config = tls.as_ref().map(|m| m.client_config(server_name));
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
                ep = ep.tls_config(tls_config.clone().unwrap_or_default())?;
            }
            channels.push((0..config.connections).map(|_| ep.connect_lazy()).collect());
            lease_channels.push(ep.connect_lazy());
        }
        Ok(Endpoints {
            urls,
            channels,
            lease_channels,
            tls,
        })
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

/// The TLS files' contents as last read, to tell whether a reload changed
/// anything.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct TlsMaterial {
    ca: Option<Vec<u8>>,
    cert: Option<Vec<u8>>,
    key: Option<Vec<u8>>,
}

impl TlsMaterial {
    pub(super) fn read(tls: &TlsConfig) -> Result<TlsMaterial> {
        let read = |p: &Option<String>| p.as_deref().map(read_file).transpose();
        let material = TlsMaterial {
            ca: read(&tls.ca_file)?,
            cert: read(&tls.cert_file)?,
            key: read(&tls.key_file)?,
        };
        if material.cert.is_some() != material.key.is_some() {
            return Err(Error::InvalidConfig(
                "a client certificate needs both cert and key".into(),
            ));
        }
        Ok(material)
    }

    fn client_config(&self, server_name: Option<&str>) -> ClientTlsConfig {
        let mut cfg = ClientTlsConfig::new();
        if let Some(ca) = &self.ca {
            cfg = cfg.ca_certificate(Certificate::from_pem(ca));
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            cfg = cfg.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = server_name {
            cfg = cfg.domain_name(name);
        }
        cfg
    }
}

fn read_file(path: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_string(),
        source,
    })
}
