//! A low-level etcd v3 client over tonic, generated from etcd's own protos.
//!
//! It was written for a replicator (`aether-replicator`, built on this
//! public API alone) and is tuned for what a
//! replicator does: batched txn writes ([`TxnBatcher`]), many watchers on
//! one pipelined stream ([`WatchStream`]), many leases on one keep-alive
//! stream ([`LeaseKeeper`]), and snapshot scans in bounded pages
//! ([`Client::scan`]).
//!
//! # A tour of the client
//!
//! Start an etcd on `127.0.0.1:2379` (`etcd --data-dir /tmp/e`) and this
//! runs as it is. Generated code stays private; everything here is the
//! public API, the same the mirror engine (the `aether-replicator` crate)
//! is built on.
//!
//! ```no_run
//! use aether_etcd::{
//!     Client, ClientConfig, Compare, CompareOp, LeaseId, Put, Range, Txn, TxnBatcher, TxnLimits,
//!     WatchOptions,
//! };
//! use futures_util::StreamExt;
//! use std::time::Duration;
//!
//! # #[tokio::main] async fn main() -> aether_etcd::Result<()> {
//! let client = Client::connect(ClientConfig::new(["http://127.0.0.1:2379"]))?;
//!
//! // Plain KV, and a guarded txn.
//! let rev = client.put(Put::new("/tour/a", "1")).await?.header.revision;
//! let txn = Txn::new()
//!     .when([Compare::mod_revision("/tour/a", CompareOp::Equal, rev)])
//!     .and_then([Put::new("/tour/a", "2")]);
//! assert!(client.txn(txn).await?.succeeded);
//!
//! // Any number of writes, packed into the fewest txns the server takes.
//! let mut packer = TxnBatcher::new(TxnLimits::default());
//! for i in 0..1000 {
//!     packer.put(format!("/tour/k/{i}"), "v", LeaseId::NONE);
//! }
//! for txn in packer.finish() {
//!     client.txn(txn).await?;
//! }
//!
//! // A lease kept alive on the client's one keep-alive stream; dropping
//! // the handle stops the keep-alive, never revokes.
//! // TTLs are Durations, rounded up to etcd's whole seconds.
//! let grant = client.lease_grant(Duration::from_secs(10)).await?;
//! let lease = client.lease_keeper().keep_alive(&grant).await?;
//! client.put(Put::new("/tour/alive", "yes").lease(lease.id())).await?;
//!
//! // A snapshot scan in bounded pages, all at one revision.
//! let mut scan = client.scan_prefix("/tour/k/", 250, 0);
//! while let Some(page) = scan.next_page().await? {
//!     println!("{} keys at revision {}", page.kvs.len(), page.revision);
//! }
//!
//! // A watch is a Stream, resumed across reconnects without loss or
//! // duplicates; it keeps its stream alive by itself. Each response
//! // carries its header, and says whether it is a progress notice.
//! let (_, watcher) = client.watch(WatchOptions::prefix("/tour/").start_revision(rev))?;
//! let mut events = watcher.take(2);
//! while let Some(resp) = events.next().await {
//!     for event in resp?.events {
//!         println!("{:?} {:?}", event.kind, event.kv.key());
//!     }
//! }
//! let _ = client.range(Range::prefix("/tour/")).await?;
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! - `tls-ring` (default): `https://` endpoints, rustls with the ring
//!   provider.
//! - `tls-aws-lc`: the same with aws-lc-rs; pick one provider.
//! - `tls-native-roots` (default): an `https://` endpoint with no CA is
//!   verified against the system's roots (`SSL_CERT_FILE` and
//!   `SSL_CERT_DIR` are honoured). A configured CA is trusted alone.
//! - `tls-webpki-roots`: the same against Mozilla's roots compiled in
//!   (webpki-roots) rather than the system's, for an image or a host
//!   without a trust store; with `tls-native-roots` too, either set is
//!   trusted.
//! - `model`: the `model` module, an in-memory etcd on tokio's clock that takes
//!   this crate's requests and returns its responses and errors, for
//!   deterministic simulations and tests; no dependencies of its own.
//!
//! Apart from `model`, no item of the API depends on a feature: without a TLS provider an
//! `https://` endpoint is refused by [`Client::connect`] with one
//! [`Error::InvalidConfig`] line that names the features. With
//! `default-features = false` the crate is plain-`http://` and pulls the
//! fewest dependencies (the repository's README has the counts).
//!
//! # Layout
//!
//! From the bottom up: each file imports only what is listed before it,
//! so a change to a service never reaches the transport, and a new service
//! needs nothing but the transport.
//!
//! - `pb` (the generated code, private), `error` (the one error type),
//!   `backoff` (the retry policy) and `task` (background tasks that stop
//!   when their owner's guard drops): leaves, shared by everything.
//! - `transport/`: the connection to one cluster, all a service needs to
//!   make calls: `config` (what the caller sets: TLS, balancing, retry
//!   policy), `endpoints` (the channels per member URL, their health, and
//!   the TLS they were built with, replaced as a whole), `token` (the auth
//!   token every request carries), `retry` (which requests may be sent
//!   again after which failures, by request type), `warm` (opening every
//!   connection at once, before a call needs it, and warming the server's
//!   flow-control window on them), and in its `mod.rs` the
//!   balancing, failover, retries, re-authentication, the unary call path
//!   and the opening of a server stream (the snapshot). It knows no
//!   service: the token fetch is the one call it makes itself, because
//!   every other call may need it midway (`warm`'s call is to a method no
//!   server has).
//! - `header`: the response header, the one type every service returns.
//! - The services, each a small client over a `Transport` clone, none
//!   importing another: `kv/` (`types`, the requests and answers as plain
//!   values; `range_opts`, sorted and revision-bounded ranges;
//!   `service`, the calls; `scan`, paginated scans), `lease` (grant,
//!   revoke, TTL, list, and the keep-alive actor), `cluster` (member
//!   listing and membership changes), `maintenance` (status, alarms,
//!   defragment, KV and backend hashes, the snapshot stream, leader
//!   transfer) and `auth`
//!   (fetching a token; users, roles, permissions, enable/disable/status;
//!   its prefix helper borrows `kv`'s `prefix_end`, a pure function).
//! - What builds on a service's types or calls: `watch/` (the watch
//!   service, with resume across reconnects: `types`, the events, which
//!   carry `kv`'s key-values; `options`, what to watch; `watcher`, the
//!   consumer's stream and its byte budget; `stream`, the handles;
//!   `actor`, the task behind a stream), `batch` (packing writes into the
//!   fewest txns etcd accepts) and `endpoint_sync` (the optional task that
//!   points the transport at the members `cluster` lists; here, not in the
//!   transport, so the transport never depends on a service).
//! - `client`: the [`Client`] facade. It owns the transport, builds each
//!   service on it, starts the endpoint sync, and hands every call on, so
//!   callers see one type.
//! - On the facade: `namespace` (a key-prefix view of a client,
//!   [`Namespace`]) and [`concurrency`] (sessions, leader election and
//!   locks, with Go's `concurrency` package semantics).
//!
//! Works against etcd 3.4 and later.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod auth;
mod backoff;
mod batch;
mod client;
mod cluster;
pub mod concurrency;
mod endpoint_sync;
mod error;
mod header;
mod kv;
mod lease;
mod lease_id;
mod maintenance;
#[cfg(feature = "model")]
#[cfg_attr(docsrs, doc(cfg(feature = "model")))]
pub mod model;
mod namespace;
mod pb;
mod task;
mod transport;
mod watch;

pub use auth::{
    AuthStatus, AuthToken, NameList, Permission, PermissionKind, RoleInfo, UserAddOptions, UserInfo,
};
pub use backoff::{Backoff, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP};
pub use batch::{
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS, REQUEST_OVERHEAD_BYTES, TxnBatcher, TxnLimits,
};
pub use client::Client;
pub use cluster::{Member, MemberAdded, MemberList};
pub use error::{Code, Error, ErrorChain, Result};
pub use header::Header;
#[doc(hidden)]
pub use kv::extrapolate_scan_window;
pub use kv::{
    Compare, CompareOp, DEFAULT_PAGE_BYTES, Delete, DeleteResponse, KeyValue, Op, OpResponse,
    PAGE_DECODE_SHARE, Page, Put, PutResponse, Range, RangeResponse, Scan, SortOrder, SortTarget,
    Txn, TxnResponse, prefix_end,
};
pub use lease::{
    KeepAliveResponse, KeepAliveSender, KeepAliveStream, LeaseGrant, LeaseHandle, LeaseKeeper,
    LeaseList, LeaseStatus, LeaseTtl, MIN_KEEPALIVE_STALL,
};
pub use lease_id::LeaseId;
pub use maintenance::{
    Alarm, AlarmKind, DowngradeAction, DowngradeResponse, Hash, HashKv, Snapshot, SnapshotChunk,
    Status,
};
pub use namespace::{Namespace, NamespaceWatcher};
pub use transport::{
    Balance, ClientConfig, Credentials, DEFAULT_CONNECT_TIMEOUT, DEFAULT_CONNECTION_WINDOW,
    DEFAULT_CONNECTIONS, DEFAULT_ENDPOINT, DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_KEEPALIVE_TIMEOUT,
    DEFAULT_MAX_DECODING_MESSAGE_SIZE, DEFAULT_MAX_ENCODING_MESSAGE_SIZE, DEFAULT_MAX_RETRIES,
    DEFAULT_REQUEST_TIMEOUT, DEFAULT_RETRY_BACKOFF_BASE, DEFAULT_RETRY_BACKOFF_CAP,
    DEFAULT_STREAM_WINDOW, DEFAULT_WATCH_REQUIRE_LEADER, DEFAULT_WATCHER_BUFFER_BYTES, RetryPolicy,
    TlsConfig, UNHEALTHY_FOR,
};
pub use watch::{Event, EventKind, WatchOptions, WatchResponse, WatchStream, Watcher};

// The README's Rust examples are compiled as doc tests, so they stay true
// to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
