//! A low-level etcd v3 client over tonic, generated from etcd's own protos.
//!
//! It depends on nothing else in this crate. It is tuned for what a
//! replicator does: batched txn writes ([`TxnBatcher`]), many watchers on
//! one pipelined stream ([`WatchStream`]), many leases on one keep-alive
//! stream ([`LeaseKeeper`]), and snapshot scans in bounded pages
//! ([`Client::scan`]).
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
//!   make calls: `config` (what the caller sets), `endpoints` (the channels
//!   per member URL and the TLS they were built with, replaced as a whole),
//!   `token` (the auth token every request carries), and in its `mod.rs`
//!   the failover, the re-authentication and the unary call path. It knows
//!   no service: the token fetch is the one call it makes itself, because
//!   every other call may need it midway.
//! - `header`: the response header, the one type every service returns.
//! - The services, each a small client over a `Transport` clone, none
//!   importing another: `kv/` (`types`, the requests and answers as plain
//!   values; `range_opts`, sorted and create-revision-bounded ranges;
//!   `service`, the calls; `scan`, paginated scans), `lease` (grant,
//!   revoke, TTL, and the keep-alive actor), `cluster` (member listing),
//!   `maintenance` (status, alarms, defragment, KV hash) and `auth`
//!   (fetching a token; users, roles, permissions, enable/disable/status;
//!   its prefix helper borrows `kv`'s `prefix_end`, a pure function).
//! - What builds on a service's types or calls: `watch` (the watch
//!   service and its stream actor, with resume across reconnects; its
//!   events carry `kv`'s key-values), `batch` (packing writes into the
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
mod maintenance;
mod namespace;
mod pb;
mod task;
mod transport;
mod watch;

pub use auth::{
    AuthStatus, NameList, Permission, PermissionKind, RoleInfo, UserAddOptions, UserInfo,
};
pub use backoff::{Backoff, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP};
pub use batch::{
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS, REQUEST_OVERHEAD_BYTES, TxnBatcher, TxnLimits,
};
pub use client::Client;
pub use cluster::{Member, MemberList};
pub use error::{Error, Result};
pub use header::Header;
pub use kv::{
    Compare, CompareOp, DEFAULT_PAGE_BYTES, Delete, DeleteResponse, KeyValue, Op, OpResponse,
    PAGE_DECODE_SHARE, Page, Put, PutResponse, Range, RangeResponse, Scan, SortOrder, SortTarget,
    Txn, TxnResponse, prefix_end,
};
pub use lease::{LeaseGrant, LeaseHandle, LeaseKeeper, LeaseStatus, LeaseTtl, MIN_KEEPALIVE_STALL};
pub use maintenance::{Alarm, AlarmKind, HashKv, Status};
pub use namespace::{Namespace, NamespaceWatcher};
pub use transport::{
    ClientConfig, Credentials, DEFAULT_CONNECT_TIMEOUT, DEFAULT_KEEPALIVE_INTERVAL,
    DEFAULT_KEEPALIVE_TIMEOUT, DEFAULT_MAX_DECODING_MESSAGE_SIZE,
    DEFAULT_MAX_ENCODING_MESSAGE_SIZE, DEFAULT_REQUEST_TIMEOUT, DEFAULT_WATCHER_BUFFER_BYTES,
    TlsConfig,
};
pub use watch::{Event, EventKind, WatchOptions, WatchResponse, WatchStream, Watcher};
