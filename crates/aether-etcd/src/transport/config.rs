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
/// The endpoint of [`ClientConfig::default`]: etcd's own default client URL.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:2379";
/// Whether watches ask for a member with a leader by default (see
/// [`ClientConfig::watch_require_leader`]).
pub const DEFAULT_WATCH_REQUIRE_LEADER: bool = true;
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
///
/// The CA and the client identity each come from a file or from PEM held in
/// memory; a file is read again by [`Client::reload_tls`](crate::Client::reload_tls)
/// (rotated certificates), PEM in memory never changes. Giving both for the
/// same item is refused when the client is built.
///
/// Without a CA (neither `ca_file` nor `ca_pem`) the server is verified
/// against the system's roots (feature `tls-native-roots`, on by default);
/// a configured CA is trusted alone, the system's roots are not added.
///
/// ```
/// use aether_etcd::{ClientConfig, TlsConfig};
///
/// # let (ca, cert, key) = (Vec::<u8>::new(), Vec::<u8>::new(), Vec::<u8>::new());
/// let tls = TlsConfig::new()
///     .with_ca_pem(ca)
///     .with_client_pem(cert, key)
///     .with_server_name("etcd.internal");
/// let config = ClientConfig::new(["https://10.0.0.1:2379"]).with_tls(tls);
/// # let _ = config;
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
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
    /// The CA bundle as PEM in memory, instead of `ca_file`.
    pub ca_pem: Option<Vec<u8>>,
    /// The client certificate (chain) as PEM in memory, instead of
    /// `cert_file`.
    pub cert_pem: Option<Vec<u8>>,
    /// The client certificate's private key as PEM in memory, instead of
    /// `key_file`. Never printed by `Debug`.
    pub key_pem: Option<Vec<u8>>,
}

impl TlsConfig {
    /// No CA (the system's roots), no client certificate.
    pub fn new() -> TlsConfig {
        TlsConfig::default()
    }

    /// Trusts the CAs in the PEM file at `path` (re-read on reload).
    #[must_use]
    pub fn with_ca_file(mut self, path: impl Into<String>) -> TlsConfig {
        self.ca_file = Some(path.into());
        self
    }

    /// Trusts the CAs in this PEM bundle.
    #[must_use]
    pub fn with_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> TlsConfig {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Presents the client certificate and key in these PEM files (mutual
    /// TLS; re-read on reload).
    #[must_use]
    pub fn with_client_files(
        mut self,
        cert: impl Into<String>,
        key: impl Into<String>,
    ) -> TlsConfig {
        self.cert_file = Some(cert.into());
        self.key_file = Some(key.into());
        self
    }

    /// Presents this PEM client certificate and key (mutual TLS).
    #[must_use]
    pub fn with_client_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> TlsConfig {
        self.cert_pem = Some(cert.into());
        self.key_pem = Some(key.into());
        self
    }

    /// Verifies the server certificate against `name` instead of the host
    /// in the URL (an endpoint given by IP address).
    #[must_use]
    pub fn with_server_name(mut self, name: impl Into<String>) -> TlsConfig {
        self.server_name = Some(name.into());
        self
    }
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes = |p: &Option<Vec<u8>>| p.as_ref().map(|p| format!("<{} bytes>", p.len()));
        f.debug_struct("TlsConfig")
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("server_name", &self.server_name)
            .field("ca_pem", &bytes(&self.ca_pem))
            .field("cert_pem", &bytes(&self.cert_pem))
            .field("key_pem", &self.key_pem.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Which member a unary call goes to.
///
/// Watches and the lease keep-alive stream are not balanced whatever this
/// says: each stays on one member (the current one) until it fails, so
/// that a watch resumes on one history and a keep-alive has one path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Balance {
    /// Every call goes to one current member; a transport failure moves
    /// all of them to the next. The default, because a caller that compares
    /// a unary read with what a watch delivered needs both from one member:
    /// the replicator's freshness probe reads the source's revision with a
    /// range and takes a peer as current once its watch has delivered that
    /// far. On another member the revision could be ahead of what the
    /// watch's member has applied (serializable reads, a lagging member),
    /// and a copy would be reported fresh before it is.
    #[default]
    Pinned,
    /// Unary calls go round-robin over the members that have not failed in
    /// the last few seconds (all of them when every one has), spreading
    /// read load like Go's clientv3 does. A member that fails a call is
    /// skipped for [`UNHEALTHY_FOR`](crate::UNHEALTHY_FOR), then tried again.
    RoundRobin,
}

/// How long [`Balance::RoundRobin`] skips a member after a call to it
/// failed in transport (refused, reset, timed out, no leader).
pub const UNHEALTHY_FOR: Duration = Duration::from_secs(5);

/// Default bound on the retries of one unary call.
pub const DEFAULT_MAX_RETRIES: u32 = 8;
/// Default first wait between retries of a unary call.
pub const DEFAULT_RETRY_BACKOFF_BASE: Duration = Duration::from_millis(50);
/// Default longest wait between retries of a unary call.
pub const DEFAULT_RETRY_BACKOFF_CAP: Duration = Duration::from_secs(1);

/// When a unary call is sent again after a failure, as Go's clientv3 does.
///
/// - A call that never left (the connection could not be made) is sent
///   again, read or write.
/// - A read (range, a txn without writes, lease TTL, member list, status,
///   alarm list, hash, auth reads) is sent again after any transient
///   failure: unavailable, reset, no leader.
/// - A write that may have reached the server (the connection broke or
///   timed out after it was sent) is never sent again: its error says
///   [`Error::maybe_applied`](crate::Error::maybe_applied), and only the
///   caller knows whether it may be repeated.
///
/// A retry to a member this call has not tried yet goes at once; once every
/// member has been tried, each retry waits for the jittered
/// [`Backoff`](crate::Backoff) first. Retries stop after `max_retries`, or
/// when the next wait would pass the call's timeout, which bounds the whole
/// call (every attempt and wait) and not each attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Retries after the first attempt (0: never retry, not even a call
    /// that never left).
    pub max_retries: u32,
    /// First wait between retries.
    pub backoff_base: Duration,
    /// Longest wait between retries.
    pub backoff_cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: DEFAULT_MAX_RETRIES,
            backoff_base: DEFAULT_RETRY_BACKOFF_BASE,
            backoff_cap: DEFAULT_RETRY_BACKOFF_CAP,
        }
    }
}

impl RetryPolicy {
    /// Up to `max_retries` retries with the default backoff.
    pub fn new(max_retries: u32) -> RetryPolicy {
        RetryPolicy {
            max_retries,
            ..RetryPolicy::default()
        }
    }

    /// No retry at all: every failure is returned as it happened.
    pub fn none() -> RetryPolicy {
        RetryPolicy::new(0)
    }

    /// The same policy waiting from `base` up to `cap` between retries.
    #[must_use]
    pub fn with_backoff(mut self, base: Duration, cap: Duration) -> RetryPolicy {
        self.backoff_base = base;
        self.backoff_cap = cap;
        self
    }

    /// The backoff one call retries with.
    pub(crate) fn backoff(&self) -> crate::Backoff {
        crate::Backoff::new(self.backoff_base, self.backoff_cap)
    }
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
#[non_exhaustive]
pub struct ClientConfig {
    /// Member URLs, `http://host:port` or `https://host:port`.
    pub endpoints: Vec<String>,
    /// TLS settings, used for `https://` endpoints.
    pub tls: Option<TlsConfig>,
    /// Auth credentials, if the cluster has auth enabled.
    pub credentials: Option<Credentials>,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
    /// Timeout of each unary call, every retry and wait included; sent to
    /// the server as the `grpc-timeout` of each attempt (what is left of
    /// it). [`Client::with_timeout`](crate::Client::with_timeout) gives
    /// other calls another one.
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
    /// Which member each unary call goes to; [`Balance::Pinned`] by
    /// default (see there why).
    pub balance: Balance,
    /// When unary calls are retried; see [`RetryPolicy`].
    pub retry: RetryPolicy,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            endpoints: vec![DEFAULT_ENDPOINT.to_string()],
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
            watch_require_leader: DEFAULT_WATCH_REQUIRE_LEADER,
            auto_sync_interval: None,
            watcher_buffer_bytes: DEFAULT_WATCHER_BUFFER_BYTES,
            connections: DEFAULT_CONNECTIONS,
            balance: Balance::Pinned,
            retry: RetryPolicy::default(),
        }
    }
}

/// Every setting has a `with_*` method that returns the changed config, so
/// a config is one expression; the fields stay public for code that reads
/// them or builds a config from a file.
///
/// ```
/// use std::time::Duration;
/// use aether_etcd::{Balance, ClientConfig, RetryPolicy};
///
/// let config = ClientConfig::new(["http://10.0.0.1:2379", "http://10.0.0.2:2379"])
///     .with_credentials("app", "secret")
///     .with_connect_timeout(Duration::from_secs(1))
///     .with_request_timeout(Duration::from_secs(5))
///     .with_keepalive(Duration::from_secs(5), Duration::from_secs(2))
///     .with_auto_sync_interval(Duration::from_secs(60))
///     .with_balance(Balance::RoundRobin)
///     .with_retry(RetryPolicy::new(3));
/// assert_eq!(config.connect_timeout, Duration::from_secs(1));
/// ```
impl ClientConfig {
    /// A config for these endpoints with every other setting at its default.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ..ClientConfig::default()
        }
    }

    /// The same config with these endpoints instead.
    #[must_use]
    pub fn with_endpoints<S: Into<String>>(
        mut self,
        endpoints: impl IntoIterator<Item = S>,
    ) -> Self {
        self.endpoints = endpoints.into_iter().map(Into::into).collect();
        self
    }

    /// The same config with these credentials (see
    /// [`ClientConfig::with_credentials`] for a user and password).
    #[must_use]
    pub fn with_credentials_of(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// The same config with another TCP connect timeout (see
    /// [`DEFAULT_CONNECT_TIMEOUT`]).
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The same config with another HTTP/2 keep-alive: a ping every
    /// `interval`, and the connection given up when one is not answered
    /// within `timeout` (see [`DEFAULT_KEEPALIVE_INTERVAL`] and
    /// [`DEFAULT_KEEPALIVE_TIMEOUT`]). Streams (watches, the lease
    /// keep-alive) find a dead connection by it.
    #[must_use]
    pub fn with_keepalive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keepalive_interval = interval;
        self.keepalive_timeout = timeout;
        self
    }

    /// The same config accepting messages from etcd up to `bytes` (see
    /// [`DEFAULT_MAX_DECODING_MESSAGE_SIZE`]).
    #[must_use]
    pub fn with_max_decoding_message_size(mut self, bytes: usize) -> Self {
        self.max_decoding_message_size = bytes;
        self
    }

    /// The same config sending messages up to `bytes` (see
    /// [`DEFAULT_MAX_ENCODING_MESSAGE_SIZE`]).
    #[must_use]
    pub fn with_max_encoding_message_size(mut self, bytes: usize) -> Self {
        self.max_encoding_message_size = bytes;
        self
    }

    /// The same config with other HTTP/2 flow-control windows, per stream
    /// and per connection (see [`DEFAULT_STREAM_WINDOW`] and
    /// [`DEFAULT_CONNECTION_WINDOW`] for why they are large).
    #[must_use]
    pub fn with_windows(mut self, stream: u32, connection: u32) -> Self {
        self.stream_window = stream;
        self.connection_window = connection;
        self
    }

    /// The same config with watches asking (or not) for a member that has
    /// a leader (see [`ClientConfig::watch_require_leader`]).
    #[must_use]
    pub fn with_watch_require_leader(mut self, require: bool) -> Self {
        self.watch_require_leader = require;
        self
    }

    /// The same config refreshing its endpoints from the member list every
    /// `interval` (see [`ClientConfig::auto_sync_interval`]).
    #[must_use]
    pub fn with_auto_sync_interval(mut self, interval: Duration) -> Self {
        self.auto_sync_interval = Some(interval);
        self
    }

    /// The same config with another byte budget per watcher's queue (see
    /// [`ClientConfig::watcher_buffer_bytes`] and
    /// [`DEFAULT_WATCHER_BUFFER_BYTES`]).
    #[must_use]
    pub fn with_watcher_buffer_bytes(mut self, bytes: usize) -> Self {
        self.watcher_buffer_bytes = bytes;
        self
    }

    /// The same config with `n` connections per endpoint (see
    /// [`ClientConfig::connections`]).
    #[must_use]
    pub fn with_connections(mut self, n: usize) -> Self {
        self.connections = n;
        self
    }

    /// The same config with these TLS settings (used for `https://`
    /// endpoints).
    #[must_use]
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The same config with another balancing of unary calls (see
    /// [`Balance`]).
    #[must_use]
    pub fn with_balance(mut self, balance: Balance) -> Self {
        self.balance = balance;
        self
    }

    /// The same config with another retry policy for unary calls.
    #[must_use]
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The same config with another timeout for each unary call.
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The same config authenticating as `user` with `password` (for a
    /// cluster with auth enabled): the token is fetched on first use.
    #[must_use]
    pub fn with_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.credentials = Some(Credentials {
            user: user.into(),
            password: password.into(),
        });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field can be set through a `with_*` method, and the default
    /// is made of the named constants.
    #[test]
    fn every_setting_has_a_builder() {
        let d = Duration::from_millis;
        let built = ClientConfig::default()
            .with_endpoints(["https://a:2379"])
            .with_tls(TlsConfig::new().with_server_name("a"))
            .with_credentials("u", "p")
            .with_connect_timeout(d(1))
            .with_request_timeout(d(2))
            .with_keepalive(d(3), d(4))
            .with_max_decoding_message_size(5)
            .with_max_encoding_message_size(6)
            .with_windows(7, 8)
            .with_watch_require_leader(false)
            .with_auto_sync_interval(d(9))
            .with_watcher_buffer_bytes(10)
            .with_connections(11)
            .with_balance(Balance::RoundRobin)
            .with_retry(RetryPolicy::none());
        // Field by field, with no `..` so a new field fails to compile
        // here until it has a builder too.
        let ClientConfig {
            endpoints,
            tls,
            credentials,
            connect_timeout,
            request_timeout,
            keepalive_interval,
            keepalive_timeout,
            max_decoding_message_size,
            max_encoding_message_size,
            stream_window,
            connection_window,
            watch_require_leader,
            auto_sync_interval,
            watcher_buffer_bytes,
            connections,
            balance,
            retry,
        } = built;
        assert_eq!(endpoints, ["https://a:2379"]);
        assert_eq!(tls.unwrap().server_name.as_deref(), Some("a"));
        assert_eq!(credentials.unwrap().user, "u");
        assert_eq!(
            (
                connect_timeout,
                request_timeout,
                keepalive_interval,
                keepalive_timeout
            ),
            (d(1), d(2), d(3), d(4))
        );
        assert_eq!(
            (max_decoding_message_size, max_encoding_message_size),
            (5, 6)
        );
        assert_eq!((stream_window, connection_window), (7, 8));
        assert!(!watch_require_leader);
        assert_eq!(auto_sync_interval, Some(d(9)));
        assert_eq!((watcher_buffer_bytes, connections), (10, 11));
        assert_eq!(balance, Balance::RoundRobin);
        assert_eq!(retry, RetryPolicy::none());

        let c = ClientConfig::default();
        assert_eq!(c.endpoints, [DEFAULT_ENDPOINT]);
        assert_eq!(c.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(c.stream_window, DEFAULT_STREAM_WINDOW);
        assert_eq!(c.connection_window, DEFAULT_CONNECTION_WINDOW);
        assert_eq!(c.connections, DEFAULT_CONNECTIONS);
        assert_eq!(c.watch_require_leader, DEFAULT_WATCH_REQUIRE_LEADER);
    }
}
