//! The consumer side: a live, merged view of the endpoint registry in one
//! region's etcd.
//!
//! A region's etcd holds its own subtree, written by its control plane, and
//! the subtrees the replicators of the other regions mirror into it. A
//! [`RegistryView`] watches the whole root and keeps
//! `service → protocol → [Endpoint]` in memory, each endpoint ranked by
//! locality ([`Endpoint::priority`]): 0 in the viewer's zone, 1 elsewhere
//! in its region, 2 in a foreign region (for failover only).
//!
//! # Design
//!
//! - **One snapshot, then one watch.** [`RegistryView::start`] scans the root
//!   in pages, all at one revision S, and watches from S+1. The client's
//!   watch resumes across reconnects without loss or duplicates, so the view
//!   is exact at every revision it has applied.
//! - **Compaction.** A resume whose revision has been compacted cannot be
//!   caught up. The view then takes a new snapshot, emits the difference
//!   from the old one as ordinary changes, then [`Change::Resynced`]. A
//!   consumer that applies changes to its own state needs nothing else.
//! - **Lease lapse.** A region that stops keeping its mirror lease alive
//!   loses its keys on every peer; they arrive here as deletes, so its
//!   endpoints leave the view as [`Change::Removed`]. The view itself never
//!   judges a region dead.
//! - **Copy-on-write snapshots.** One task owns the map and publishes an
//!   `Arc<Registry>` after each watch response. A reader's
//!   [`RegistryView::snapshot`] is a clone of that `Arc`, consistent at one
//!   revision, and never blocks the task. Services are shared between
//!   snapshots and endpoints are `Arc`s, so a change copies one service's
//!   list of pointers, not the registry.
//! - **Notifications never hold the view back.** Changes go out on a
//!   `tokio::sync::broadcast` channel; a subscriber that falls behind loses
//!   the oldest ones (`RecvError::Lagged`) and should re-read the snapshot.
//!   [`RegistryView::snapshot_and_subscribe`] returns a snapshot and a
//!   receiver that starts exactly after it.
//! - **Bad data is not fatal.** A key under the root that is not an endpoint
//!   key is counted ([`RegistryView::skipped`]) and ignored; a value that is
//!   not JSON is kept as bytes ([`EndpointValue::NotJson`]).
//!
//! - **Origins: synced and current.** Each origin region's replicator
//!   keeps a state key, `<state_root><origin>/state`, in this etcd under
//!   its mirror lease (see [`crate::mirror::state`]). The view watches that
//!   prefix too, on the same watch stream, and keeps one [`OriginStatus`]
//!   per origin: whether a state key is there, whether a complete copy was
//!   made under the origin's lease (`synced`), and its heartbeat, from
//!   which [`OriginStatus::staleness`] is read *on demand* (the view emits
//!   nothing per heartbeat). The viewer's own region is the source: it is
//!   always listed, synced and current. An origin is listed while it has a
//!   state key or endpoints; one with endpoints but no state key (its lease
//!   just lapsed, or keys written by hand) is listed as not synced.
//!   [`Change::Origin`] is emitted when an origin is listed or unlisted or
//!   its `synced` or `state_present` changes. Origins are part of the
//!   [`Registry`] snapshot, so a reader sees endpoints and their origins'
//!   status at one point. **A consumer never acts on a half-synced first
//!   copy without knowing it:** [`Registry::is_synced`] tells per origin,
//!   and [`RegistryView::endpoints_synced_only`] leaves out the endpoints
//!   of origins not synced (never the viewer's own).
//! - **Ordering of the two watches.** When a state response arrives, the
//!   registry responses already delivered are applied first. While both
//!   watchers are caught up, etcd sends one stream's responses in commit
//!   order, so an origin turns synced only once every endpoint written
//!   before its synced marker is in the view. While a watcher catches up
//!   after a reconnect, etcd may send the two backlogs in either order for
//!   one catch-up pass (about 100 ms); the state can then run ahead of the
//!   endpoints by that much. A compaction of either watch resyncs both.
//!
//! Dropping the view stops its task and the watch stream with it.
//!
//! # Layout
//! - `config`: [`ViewConfig`], its defaults and validation, and which keys
//!   are state keys.
//! - `endpoint`: [`Endpoint`] and its decoded [`EndpointValue`].
//! - `rank`: locality: the priorities, how a viewer assigns them, the order
//!   within one protocol, and the lookup of a key in it.
//! - `origin`: [`OriginStatus`], one origin region's copy as the view
//!   knows it, and its staleness.
//! - `change`: [`Change`], what the view emits.
//! - `registry`: [`Registry`], the merged snapshot, its queries and the
//!   copy-on-write updates.
//! - `diff`: the changes between two registries, which a resync emits.
//! - `watch`: the task: snapshot, watch, apply, publish, resync.
//! - `handle`: [`RegistryView`], what a consumer holds.
//! - `test_support` (tests only): the endpoints and configs the unit tests
//!   build.

mod change;
mod config;
mod diff;
mod endpoint;
mod handle;
mod origin;
mod rank;
mod registry;
#[cfg(test)]
mod test_support;
mod watch;

pub use change::Change;
pub use config::{
    DEFAULT_CHANNEL_CAPACITY, DEFAULT_VIEW_MAX_BACKOFF, DEFAULT_VIEW_PAGE_SIZE, ViewConfig,
};
pub use endpoint::{Endpoint, EndpointValue};
pub use handle::RegistryView;
pub use origin::{OriginStatus, unix_ms_now};
pub use rank::{PRIORITY_FOREIGN, PRIORITY_REGION, PRIORITY_ZONE};
pub use registry::Registry;
