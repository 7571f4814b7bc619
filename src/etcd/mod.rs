//! A low-level etcd v3 client over tonic, generated from etcd's own protos.
//!
//! It depends on nothing else in this crate. It is tuned for what a
//! replicator does: batched txn writes ([`TxnBatcher`]), many watchers on
//! one pipelined stream ([`WatchStream`]), many leases on one keep-alive
//! stream ([`LeaseKeeper`]), and snapshot scans in bounded pages
//! ([`Client::scan`]).
//!
//! # Layout
//! - `client`: endpoints, failover, TLS, auth, and the unary call path.
//! - `kv`: range, put, delete, txn, compact, paginated scans.
//! - `batch`: packing writes into the fewest txns etcd accepts.
//! - `watch`: the watch-stream actor, with resume across reconnects.
//! - `lease`: grant, revoke, TTL, and the keep-alive actor.
//! - `maintenance`: member status.
//! - [`concurrency`]: sessions, leader election and locks (Go's
//!   `concurrency` package semantics).
//! - `range_opts`: sorted and create-revision-bounded ranges.
//! - `cluster`: member listing; `endpoint_sync`: the optional task that
//!   refreshes the endpoints from it.
//! - `maintenance_ops`: alarms, defragment, KV hash.
//! - `namespace`: a key-prefix view of a client ([`Namespace`]).
//! - `error`: the one error type.
//! - `pb`: the generated code, private.
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

pub use backoff::{Backoff, DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP};
pub use batch::{
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TXN_OPS, REQUEST_OVERHEAD_BYTES, TxnBatcher, TxnLimits,
};
pub use client::Client;
pub use cluster::{Member, MemberList};
pub use error::{Error, Result};
pub use header::Header;
pub use kv::{
    Compare, CompareOp, Delete, DeleteResponse, KeyValue, Op, OpResponse, Page, Put, PutResponse,
    Range, RangeResponse, Scan, SortOrder, SortTarget, Txn, TxnResponse, prefix_end,
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
