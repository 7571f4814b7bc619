//! aether-replicator: an etcd v3 client and a mirror that replicates a
//! service mesh's endpoint registry between regions.
//!
//! # Layout
//! - [`etcd`]: the client. Stands alone; depend on this crate with
//!   `default-features = false` to get it without the application.
//! - [`schema`]: the origin-first key layout of the endpoint registry.
pub mod etcd;
pub mod schema;
