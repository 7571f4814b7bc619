//! What a client is built from: endpoints, TLS, credentials, timeouts and
//! HTTP/2 tuning. Plain data; the transport reads it.

use std::time::Duration;

/// Default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default per-request timeout for unary calls.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Default HTTP/2 keep-alive ping interval.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// Default time to wait for a keep-alive ping's answer.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default largest message accepted from etcd. Watch responses that catch up
/// over history can be tens of MiB, far above tonic's 4 MiB default.
pub const DEFAULT_MAX_DECODING_MESSAGE_SIZE: usize = 256 * 1024 * 1024;
/// Default largest message sent. etcd's own receive limit is lower
/// (`--max-request-bytes` plus 512 KiB); it is the one that matters.
pub const DEFAULT_MAX_ENCODING_MESSAGE_SIZE: usize = 64 * 1024 * 1024;
/// Default budget of each watcher's queue, in encoded bytes of the
/// responses waiting for its consumer. A catch-up response can be tens of
/// MiB; once a watcher's queue is full its stream waits (and HTTP/2 flow
/// control holds back the server) instead of buffering more. Twice the
/// stream window: a paused consumer holds at most this much in the client
/// plus one window in flight.
pub const DEFAULT_WATCHER_BUFFER_BYTES: usize = 16 * 1024 * 1024;
/// Default HTTP/2 flow-control window of each stream: what etcd may send on
/// one watch, keep-alive or unary stream before the client reads it. 8 MiB
/// keeps a page of a range or a watch catch-up moving at full speed across
/// a region-to-region round trip.
pub const DEFAULT_STREAM_WINDOW: u32 = 8 * 1024 * 1024;
/// Default HTTP/2 flow-control window of the whole connection, the largest
/// HTTP/2 allows. The stream windows bound what is buffered; this one is
/// large because h2 (>= 0.4.16) closes a connection once too many *small*
/// DATA frames sit unread, with a budget of half this window. etcd sends
/// every watch response and keep-alive answer as one small frame, so with
/// the 64 KiB default a consumer that pauses for a few hundred responses,
/// or a few hundred concurrent small calls, got the whole connection (and
/// every call on it) reset with `too_many_data_frames`. The windows are
/// fixed: an adaptive window overrides both and, on a low-latency link,
/// keeps the budget near its 25 KiB floor. The 100k-key sync runs at the
/// same speed either way (BENCHMARKS.md).
pub const DEFAULT_CONNECTION_WINDOW: u32 = (1 << 31) - 1;
/// Default HTTP/2 connections per endpoint for calls and streams (the
/// keep-alive stream has one more of its own). One is right on a LAN; see
/// [`ClientConfig::connections`] for a long link.
pub const DEFAULT_CONNECTIONS: usize = 1;

/// TLS settings for `https://` endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM bundle of the CAs that sign the server certificates.
    pub ca_file: Option<String>,
    /// PEM client certificate for mutual TLS.
    pub cert_file: Option<String>,
    /// PEM private key for `cert_file`.
    pub key_file: Option<String>,
    /// Name to verify the server certificate against, instead of the host
    /// in the URL.
    pub server_name: Option<String>,
}

/// Username and password for etcd's auth.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The etcd user.
    pub user: String,
    /// The user's password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// How to reach one etcd cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// Member URLs, `http://host:port` or `https://host:port`.
    pub endpoints: Vec<String>,
    /// TLS settings, used for `https://` endpoints.
    pub tls: Option<TlsConfig>,
    /// Auth credentials, if the cluster has auth enabled.
    pub credentials: Option<Credentials>,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Timeout for each unary request.
    pub request_timeout: Duration,
    /// HTTP/2 keep-alive ping interval.
    pub keepalive_interval: Duration,
    /// Time to wait for a keep-alive ping's answer.
    pub keepalive_timeout: Duration,
    /// Largest message accepted from etcd.
    pub max_decoding_message_size: usize,
    /// Largest message sent to etcd.
    pub max_encoding_message_size: usize,
    /// HTTP/2 window of each stream, in bytes.
    pub stream_window: u32,
    /// HTTP/2 window of each connection, in bytes.
    pub connection_window: u32,
    /// Ask etcd to serve watches only from a member that has a leader
    /// (`hasleader` metadata), so a partitioned member's watch fails over
    /// instead of going quiet. On by default.
    pub watch_require_leader: bool,
    /// Refresh the endpoints from the cluster's member list this often
    /// (`None`: never). See
    /// [`Client::member_list`](crate::Client::member_list); the task
    /// ends with the last `Client` clone.
    pub auto_sync_interval: Option<Duration>,
    /// Bytes of responses each watcher may hold unread before its stream
    /// waits for the consumer (one larger response still passes, alone).
    /// 0 means one response at a time. See the `watch` module docs.
    pub watcher_buffer_bytes: usize,
    /// HTTP/2 connections per endpoint; calls and streams are spread over
    /// them round-robin. etcd's gRPC server (grpc-go) opens every
    /// connection's receive window at 64 KiB and grows it by about a
    /// doubling per round trip, so over a 250 ms link one new connection
    /// carries ~64 KiB in its first round trip, whatever the client has in
    /// flight: a 50k-key bulk write took 3.4 s on one connection and 1.2 s
    /// on 16 (BENCHMARKS.md §7). A long-haul bulk writer wants several;
    /// each costs a TCP (and TLS) handshake and a little memory. At least 1.
    pub connections: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            endpoints: vec!["http://127.0.0.1:2379".to_string()],
            tls: None,
            credentials: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            keepalive_interval: DEFAULT_KEEPALIVE_INTERVAL,
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            max_decoding_message_size: DEFAULT_MAX_DECODING_MESSAGE_SIZE,
            max_encoding_message_size: DEFAULT_MAX_ENCODING_MESSAGE_SIZE,
            stream_window: DEFAULT_STREAM_WINDOW,
            connection_window: DEFAULT_CONNECTION_WINDOW,
            watch_require_leader: true,
            auto_sync_interval: None,
            watcher_buffer_bytes: DEFAULT_WATCHER_BUFFER_BYTES,
            connections: DEFAULT_CONNECTIONS,
        }
    }
}

impl ClientConfig {
    /// A config for these endpoints with every other setting at its default.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ..ClientConfig::default()
        }
    }

    /// The same config with `n` connections per endpoint (see
    /// [`ClientConfig::connections`]).
    #[must_use]
    pub fn with_connections(mut self, n: usize) -> Self {
        self.connections = n;
        self
    }
}
