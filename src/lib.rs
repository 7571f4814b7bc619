//! aether-replicator: an etcd v3 client and a mirror that replicates a
//! service mesh's endpoint registry between regions.
//!
//! # A tour of the client
//!
//! Start an etcd on `127.0.0.1:2379` (`etcd --data-dir /tmp/e`) and this
//! runs as it is. Generated code stays private; everything here is the
//! [`etcd`] module's public API, the same the mirror engine is built on.
//!
//! ```no_run
//! use aether_replicator::etcd::{
//!     Client, ClientConfig, Compare, CompareOp, Put, Range, Txn, TxnBatcher, TxnLimits,
//!     WatchOptions,
//! };
//! use futures_util::StreamExt;
//!
//! # #[tokio::main] async fn main() -> aether_replicator::etcd::Result<()> {
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
//!     packer.put(format!("/tour/k/{i}"), "v", 0);
//! }
//! for txn in packer.finish() {
//!     client.txn(txn).await?;
//! }
//!
//! // A lease kept alive on the client's one keep-alive stream; dropping
//! // the handle stops the keep-alive, never revokes.
//! let grant = client.lease_grant(10, 0).await?;
//! let lease = client.lease_keeper().keep_alive(grant.id, grant.ttl).await?;
//! client.put(Put::new("/tour/alive", "yes").lease(lease.id())).await?;
//!
//! // A snapshot scan in bounded pages, all at one revision.
//! let mut scan = client.scan_prefix("/tour/k/", 250, 0);
//! while let Some(page) = scan.next_page().await? {
//!     println!("{} keys at revision {}", page.kvs.len(), page.revision);
//! }
//!
//! // A watch is a Stream, resumed across reconnects without loss or
//! // duplicates; it keeps its stream alive by itself.
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
//! # Layout
//! - [`etcd`]: the client. Stands alone; depend on this crate with
//!   `default-features = false` to get it without the application.
//! - [`schema`]: the origin-first key layout of the endpoint registry.
//! - [`mirror`]: the engine that mirrors one region's subtree into every
//!   peer region's etcd under an origin-heartbeat lease.
//! - [`view`]: the consumer side: a live, merged, locality-ranked view of
//!   the registry in one region's etcd.
//! - [`error`]: the error type above the client.
//! - `app` (feature `app`, on by default): the replicator binary's
//!   config, leader election, metrics and `run`.

#[cfg(feature = "app")]
pub mod app;
pub mod error;
pub mod etcd;
pub mod mirror;
pub mod schema;
pub mod view;

pub use error::{Error, Result};
