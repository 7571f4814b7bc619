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

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::etcd::{
    self, Backoff, Client, EventKind, KeyValue, Range, WatchOptions, WatchResponse, Watcher,
};
use crate::mirror::DEFAULT_STATE_ROOT;
use crate::mirror::state::State;
use crate::schema::{EndpointKey, Schema, validate_segment};

/// Priority of an endpoint in the viewer's own zone.
pub const PRIORITY_ZONE: u8 = 0;
/// Priority of an endpoint elsewhere in the viewer's region.
pub const PRIORITY_REGION: u8 = 1;
/// Priority of an endpoint in a foreign region: failover only.
pub const PRIORITY_FOREIGN: u8 = 2;

/// Default keys per page of a snapshot scan.
pub const DEFAULT_VIEW_PAGE_SIZE: usize = 2000;
/// Default number of changes a subscriber may fall behind before it lags.
pub const DEFAULT_CHANNEL_CAPACITY: usize = 4096;
/// Default cap on the backoff between attempts after an error.
pub const DEFAULT_VIEW_MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a [`RegistryView`] watches and who is looking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewConfig {
    /// The key layout; its root is what is watched.
    pub schema: Schema,
    /// The viewer's region.
    pub region: String,
    /// The viewer's zone; without one, no endpoint has priority 0.
    pub zone: Option<String>,
    /// Keys per page of a snapshot scan.
    pub page_size: usize,
    /// Changes buffered per subscriber.
    pub channel_capacity: usize,
    /// Cap on the backoff between attempts after an error.
    pub max_backoff: Duration,
    /// Prefix of the replicators' state keys, `<state_root><origin>/state`
    /// (default [`DEFAULT_STATE_ROOT`]); must not overlap the root.
    pub state_root: String,
}

impl ViewConfig {
    /// A view for `region` under the default root, without a zone.
    pub fn new(region: impl Into<String>) -> Self {
        ViewConfig {
            schema: Schema::default(),
            region: region.into(),
            zone: None,
            page_size: DEFAULT_VIEW_PAGE_SIZE,
            channel_capacity: DEFAULT_CHANNEL_CAPACITY,
            max_backoff: DEFAULT_VIEW_MAX_BACKOFF,
            state_root: DEFAULT_STATE_ROOT.to_owned(),
        }
    }

    /// The same config with another state-key prefix (the one the
    /// replicators writing into this etcd use).
    #[must_use]
    pub fn with_state_root(mut self, state_root: impl Into<String>) -> Self {
        self.state_root = state_root.into();
        self
    }

    /// The same config with the viewer's zone set.
    pub fn zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }

    fn validate(&self) -> Result<()> {
        validate_segment("region", &self.region).map_err(|e| Error::Config(e.to_string()))?;
        if self.zone.as_deref() == Some("") {
            return Err(Error::Config("empty zone".into()));
        }
        if self.channel_capacity == 0 {
            return Err(Error::Config("channel capacity must be at least 1".into()));
        }
        let (root, state) = (self.schema.root(), self.state_root.as_str());
        if !state.starts_with('/') || !state.ends_with('/') {
            return Err(Error::Config(format!(
                "state root {state:?}: must start and end with '/'"
            )));
        }
        if root.starts_with(state) || state.starts_with(root) {
            return Err(Error::Config(format!(
                "state root {state:?} overlaps the registry root {root:?}"
            )));
        }
        Ok(())
    }

    /// The origin region a state key belongs to, if `key` is one.
    fn state_origin<'k>(&self, key: &'k [u8]) -> Option<&'k str> {
        let rest = key.strip_prefix(self.state_root.as_bytes())?;
        let region = std::str::from_utf8(rest.strip_suffix(b"/state")?).ok()?;
        validate_segment("region", region).ok()?;
        Some(region)
    }

    /// The locality priority of an endpoint of `origin` region in `zone`,
    /// as seen by this viewer.
    pub fn priority(&self, origin: &str, zone: Option<&str>) -> u8 {
        if origin != self.region {
            PRIORITY_FOREIGN
        } else if self.zone.is_some() && zone == self.zone.as_deref() {
            PRIORITY_ZONE
        } else {
            PRIORITY_REGION
        }
    }
}

/// An endpoint's value, decoded.
#[derive(Clone, Debug, PartialEq)]
pub enum EndpointValue {
    /// Valid JSON, kept as it is (normally an object with `clusterName`,
    /// `region`, `zone` and whatever else the control plane writes).
    Json(serde_json::Value),
    /// Not JSON: the raw bytes.
    NotJson(Bytes),
}

impl EndpointValue {
    /// Decodes raw bytes; anything that is not JSON is kept as bytes.
    pub fn decode(raw: &Bytes) -> Self {
        match serde_json::from_slice(raw) {
            Ok(v) => EndpointValue::Json(v),
            Err(_) => EndpointValue::NotJson(raw.clone()),
        }
    }

    /// Whether the value is valid JSON.
    pub fn is_json(&self) -> bool {
        matches!(self, EndpointValue::Json(_))
    }

    /// A field of a JSON object value.
    pub fn field(&self, name: &str) -> Option<&serde_json::Value> {
        match self {
            EndpointValue::Json(v) => v.get(name),
            EndpointValue::NotJson(_) => None,
        }
    }

    /// A string field of a JSON object value.
    pub fn str_field(&self, name: &str) -> Option<&str> {
        self.field(name).and_then(serde_json::Value::as_str)
    }
}

/// One endpoint as the viewer sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    /// Origin region, cluster, service, protocol and ip, from the key.
    pub key: EndpointKey,
    /// The decoded value.
    pub value: EndpointValue,
    /// The value's `zone` field, if it is a string.
    pub zone: Option<String>,
    /// Locality: [`PRIORITY_ZONE`], [`PRIORITY_REGION`] or
    /// [`PRIORITY_FOREIGN`]; lower is closer.
    pub priority: u8,
    /// Revision of the key's last write.
    pub mod_revision: i64,
    /// Lease of the key (a mirrored key carries its origin's mirror lease).
    pub lease: i64,
    /// `key.ip` parsed, for ordering addresses numerically.
    addr: Option<IpAddr>,
}

/// Ordering within one protocol: priority, then address (parsed addresses
/// numerically, before unparsable ones), then region and cluster.
type SortKey<'a> = (u8, bool, Option<IpAddr>, &'a str, &'a str, &'a str);

impl Endpoint {
    /// Builds the endpoint a key-value stands for, as seen by `config`'s
    /// viewer.
    pub fn new(key: EndpointKey, kv: &KeyValue, config: &ViewConfig) -> Endpoint {
        let value = EndpointValue::decode(kv.value());
        let zone = value.str_field("zone").map(str::to_owned);
        let priority = config.priority(&key.region, zone.as_deref());
        Endpoint {
            addr: key.ip.parse().ok(),
            key,
            value,
            zone,
            priority,
            mod_revision: kv.mod_revision(),
            lease: kv.lease(),
        }
    }

    fn sort_key(&self) -> SortKey<'_> {
        probe(self.priority, self.addr, &self.key)
    }
}

fn probe(priority: u8, addr: Option<IpAddr>, key: &EndpointKey) -> SortKey<'_> {
    (
        priority,
        addr.is_none(),
        addr,
        &key.ip,
        &key.region,
        &key.cluster,
    )
}

/// What the view knows about one origin region's copy in this etcd; see
/// the [module docs](self). Read staleness with
/// [`OriginStatus::staleness`]: it moves with the clock, so it is not a
/// change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OriginStatus {
    /// The viewer's own region: the source itself, always synced and
    /// current (it has no state key in its own etcd).
    pub local: bool,
    /// The origin's state key is present (its mirror lease is live).
    pub state_present: bool,
    /// A complete copy was made under the origin's current lease. Always
    /// true for the viewer's own region; false without a state key, and
    /// for a state key whose value does not decode.
    pub synced: bool,
    /// When the copy was last known current, Unix ms; 0: never or unknown.
    pub heartbeat_unix_ms: i64,
    /// The origin's source revision the copy is applied through; 0:
    /// unknown or no complete sync yet.
    pub source_revision: i64,
    /// The origin's mirror lease; 0: unknown.
    pub lease: i64,
    /// The origin's source etcd cluster id; 0: unknown.
    pub source_cluster: u64,
    /// Revision (in this etcd) of the state key's last write; 0: none.
    pub state_mod_revision: i64,
    /// Endpoints of this origin in the view.
    pub endpoints: usize,
}

impl OriginStatus {
    /// How stale the copy is at `now_unix_ms`: now minus the heartbeat
    /// (the consumer's clock against the replicator's, skew included;
    /// never negative). Zero for the viewer's own region; `None` when
    /// unknown (no state key, or no heartbeat yet).
    pub fn staleness_at(&self, now_unix_ms: i64) -> Option<Duration> {
        if self.local {
            return Some(Duration::ZERO);
        }
        if !self.state_present || self.heartbeat_unix_ms <= 0 {
            return None;
        }
        let ms = now_unix_ms.saturating_sub(self.heartbeat_unix_ms).max(0);
        Some(Duration::from_millis(ms.unsigned_abs()))
    }

    /// [`OriginStatus::staleness_at`] by the system clock.
    pub fn staleness(&self) -> Option<Duration> {
        self.staleness_at(unix_ms_now())
    }

    /// Whether the origin stays listed.
    fn listed(&self) -> bool {
        self.local || self.state_present || self.endpoints > 0
    }

    /// What a [`Change::Origin`] is emitted for.
    fn signal(&self) -> (bool, bool) {
        (self.synced, self.state_present)
    }

    /// Takes a state key: its decoded value (`None` if it does not decode)
    /// and mod revision, or `None` once the key is gone. The viewer's own
    /// region is the source, whatever a stray state key says.
    fn set_state(&mut self, state: Option<(Option<State>, i64)>) {
        if self.local {
            return;
        }
        let endpoints = self.endpoints;
        *self = match state {
            None => OriginStatus::default(),
            Some((decoded, state_mod_revision)) => {
                let mut s = OriginStatus {
                    state_present: true,
                    state_mod_revision,
                    ..OriginStatus::default()
                };
                if let Some(d) = decoded {
                    s.synced = d.synced;
                    s.heartbeat_unix_ms = d.heartbeat_unix_ms;
                    s.source_revision = d.revision;
                    s.lease = d.lease;
                    s.source_cluster = d.source_cluster;
                }
                s
            }
        };
        self.endpoints = endpoints;
    }

    fn local(endpoints: usize) -> OriginStatus {
        OriginStatus {
            local: true,
            synced: true,
            endpoints,
            ..OriginStatus::default()
        }
    }
}

/// The system clock as Unix milliseconds.
pub fn unix_ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// One change to the view.
#[derive(Clone, Debug)]
pub enum Change {
    /// A new endpoint.
    Added {
        /// The endpoint.
        endpoint: Arc<Endpoint>,
        /// The revision of the change.
        revision: i64,
    },
    /// An endpoint whose value changed. A rewrite of an equal value (a
    /// mirror moving a key to a new lease) is not a change.
    Updated {
        /// Before.
        old: Arc<Endpoint>,
        /// After.
        new: Arc<Endpoint>,
        /// The revision of the change.
        revision: i64,
    },
    /// An endpoint that is gone: deleted, or its origin's lease lapsed.
    Removed {
        /// The endpoint as it was.
        endpoint: Arc<Endpoint>,
        /// The revision of the change.
        revision: i64,
    },
    /// The watch fell behind a compaction and the view took a new snapshot.
    /// The difference from the old view has just been sent as
    /// Added/Updated/Removed changes (the counts say how many).
    Resynced {
        /// The new snapshot's revision.
        revision: i64,
        /// The compaction that forced it, when etcd said.
        compact_revision: Option<i64>,
        /// Endpoints added by the resync.
        added: usize,
        /// Endpoints updated by the resync.
        updated: usize,
        /// Endpoints removed by the resync.
        removed: usize,
    },
    /// An origin was listed or unlisted, or its `synced` or
    /// `state_present` changed (not its heartbeat: read staleness on
    /// demand). A resync sends these too, after its endpoint changes and
    /// before [`Change::Resynced`].
    Origin {
        /// The origin region.
        region: String,
        /// Its status now; `None` once it is no longer listed (no state
        /// key and no endpoints).
        status: Option<OriginStatus>,
        /// The revision of the change.
        revision: i64,
    },
}

impl Change {
    /// The revision at which the view reflects this change.
    pub fn revision(&self) -> i64 {
        match self {
            Change::Added { revision, .. }
            | Change::Updated { revision, .. }
            | Change::Removed { revision, .. }
            | Change::Resynced { revision, .. }
            | Change::Origin { revision, .. } => *revision,
        }
    }

    /// The endpoint concerned (after the change for an update); `None` for
    /// a resync or an origin change.
    pub fn endpoint(&self) -> Option<&Arc<Endpoint>> {
        match self {
            Change::Added { endpoint, .. } | Change::Removed { endpoint, .. } => Some(endpoint),
            Change::Updated { new, .. } => Some(new),
            Change::Resynced { .. } | Change::Origin { .. } => None,
        }
    }

    /// `"added"`, `"updated"`, `"removed"`, `"resynced"` or `"origin"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Change::Added { .. } => "added",
            Change::Updated { .. } => "updated",
            Change::Removed { .. } => "removed",
            Change::Resynced { .. } => "resynced",
            Change::Origin { .. } => "origin",
        }
    }
}

/// One service's endpoints by protocol.
#[derive(Clone, Debug, Default)]
struct Service {
    protocols: BTreeMap<String, Vec<Arc<Endpoint>>>,
}

/// The merged registry at one revision: `service → protocol → [Endpoint]`,
/// each list ordered by priority, then address, region and cluster.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    revision: i64,
    len: usize,
    services: BTreeMap<String, Arc<Service>>,
    origins: BTreeMap<String, OriginStatus>,
}

/// What an upsert did.
enum Upsert {
    Added(Arc<Endpoint>),
    Updated(Arc<Endpoint>, Arc<Endpoint>),
    Unchanged,
}

impl Registry {
    /// The revision the registry reflects: the snapshot's, then that of the
    /// last change applied.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no endpoints.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The services, in name order.
    pub fn services(&self) -> impl Iterator<Item = &str> {
        self.services.keys().map(String::as_str)
    }

    /// One service's protocols and their endpoints, in protocol order.
    pub fn protocols(&self, service: &str) -> impl Iterator<Item = (&str, &[Arc<Endpoint>])> {
        self.services
            .get(service)
            .into_iter()
            .flat_map(|s| s.protocols.iter().map(|(p, v)| (p.as_str(), v.as_slice())))
    }

    /// The endpoints of one service and protocol, closest first.
    pub fn endpoints(&self, service: &str, protocol: &str) -> &[Arc<Endpoint>] {
        self.services
            .get(service)
            .and_then(|s| s.protocols.get(protocol))
            .map_or(&[], Vec::as_slice)
    }

    /// Every endpoint of one service: by protocol, then closest first.
    pub fn service_endpoints(&self, service: &str) -> Vec<Arc<Endpoint>> {
        self.protocols(service)
            .flat_map(|(_, eps)| eps.iter().cloned())
            .collect()
    }

    /// Every endpoint: by service, protocol, priority, address, region and
    /// cluster.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Endpoint>> {
        self.services
            .values()
            .flat_map(|s| s.protocols.values().flatten())
    }

    /// The endpoint at `key`, if present.
    pub fn get(&self, key: &EndpointKey) -> Option<&Arc<Endpoint>> {
        let list = self.endpoints(&key.service, &key.protocol);
        find(list, key).map(|i| &list[i])
    }

    /// Every listed origin, in region order: the viewer's own region, each
    /// region with a state key here, each region with endpoints here.
    pub fn origins(&self) -> impl Iterator<Item = (&str, &OriginStatus)> {
        self.origins.iter().map(|(r, s)| (r.as_str(), s))
    }

    /// One origin's status, if it is listed.
    pub fn origin(&self, region: &str) -> Option<&OriginStatus> {
        self.origins.get(region)
    }

    /// Whether `region`'s copy is synced: true for the viewer's own region
    /// and for an origin whose state key says a complete copy was made;
    /// false otherwise (not yet synced, no state key, unknown region).
    pub fn is_synced(&self, region: &str) -> bool {
        self.origins.get(region).is_some_and(|o| o.synced)
    }

    /// Like [`Registry::service_endpoints`], without the endpoints of
    /// origins whose copy is not synced.
    pub fn synced_endpoints(&self, service: &str) -> Vec<Arc<Endpoint>> {
        self.protocols(service)
            .flat_map(|(_, eps)| eps.iter())
            .filter(|e| self.is_synced(&e.key.region))
            .cloned()
            .collect()
    }

    #[cfg(test)]
    fn build(revision: i64, endpoints: Vec<Endpoint>) -> Registry {
        Registry::build_with(revision, endpoints, None, Vec::new())
    }

    /// The registry of `endpoints` at `revision`, with the origins: `local`
    /// (the viewer's region), those of `states` (region, decoded value, mod
    /// revision) and those with endpoints.
    fn build_with(
        revision: i64,
        endpoints: Vec<Endpoint>,
        local: Option<&str>,
        states: Vec<(String, Option<State>, i64)>,
    ) -> Registry {
        let mut origins: BTreeMap<String, OriginStatus> = BTreeMap::new();
        if let Some(local) = local {
            origins.insert(local.to_owned(), OriginStatus::local(0));
        }
        for (region, state, mod_revision) in states {
            origins
                .entry(region)
                .or_default()
                .set_state(Some((state, mod_revision)));
        }
        let mut services: BTreeMap<String, Service> = BTreeMap::new();
        let len = endpoints.len();
        for ep in endpoints {
            match origins.get_mut(&ep.key.region) {
                Some(o) => o.endpoints += 1,
                None => {
                    let o = OriginStatus {
                        endpoints: 1,
                        ..OriginStatus::default()
                    };
                    origins.insert(ep.key.region.clone(), o);
                }
            }
            services
                .entry(ep.key.service.clone())
                .or_default()
                .protocols
                .entry(ep.key.protocol.clone())
                .or_default()
                .push(Arc::new(ep));
        }
        for s in services.values_mut() {
            for list in s.protocols.values_mut() {
                list.sort_unstable_by(|a, b| a.sort_key().cmp(&b.sort_key()));
            }
        }
        Registry {
            revision,
            len,
            services: services
                .into_iter()
                .map(|(k, v)| (k, Arc::new(v)))
                .collect(),
            origins,
        }
    }

    /// Applies `f` to `region`'s status (a fresh unlisted one if there is
    /// none) and returns the [`Change::Origin`] it makes, if any.
    fn update_origin(
        &mut self,
        region: &str,
        revision: i64,
        f: impl FnOnce(&mut OriginStatus),
    ) -> Option<Change> {
        let (before, after) = match self.origins.get_mut(region) {
            Some(o) => {
                let before = Some(o.signal());
                f(o);
                if o.listed() {
                    (before, Some(o.signal()))
                } else {
                    self.origins.remove(region);
                    (before, None)
                }
            }
            None => {
                let mut o = OriginStatus::default();
                f(&mut o);
                if !o.listed() {
                    return None;
                }
                let after = Some(o.signal());
                self.origins.insert(region.to_owned(), o);
                (None, after)
            }
        };
        (before != after).then(|| Change::Origin {
            region: region.to_owned(),
            status: self.origins.get(region).cloned(),
            revision,
        })
    }

    fn upsert(&mut self, ep: Endpoint) -> Upsert {
        let service = Arc::make_mut(self.services.entry(ep.key.service.clone()).or_default());
        let list = service
            .protocols
            .entry(ep.key.protocol.clone())
            .or_default();
        let old = find(list, &ep.key).map(|i| list.remove(i));
        let unchanged = old.as_ref().is_some_and(|o| o.value == ep.value);
        let ep = Arc::new(ep);
        let at = list
            .binary_search_by(|e| e.sort_key().cmp(&ep.sort_key()))
            .unwrap_or_else(|i| i);
        list.insert(at, ep.clone());
        match old {
            None => {
                self.len += 1;
                Upsert::Added(ep)
            }
            Some(_) if unchanged => Upsert::Unchanged,
            Some(old) => Upsert::Updated(old, ep),
        }
    }

    fn remove(&mut self, key: &EndpointKey) -> Option<Arc<Endpoint>> {
        let slot = self.services.get_mut(&key.service)?;
        let i = find(slot.protocols.get(&key.protocol)?, key)?;
        let service = Arc::make_mut(slot);
        let list = service.protocols.get_mut(&key.protocol)?;
        let old = list.remove(i);
        if list.is_empty() {
            service.protocols.remove(&key.protocol);
            if service.protocols.is_empty() {
                self.services.remove(&key.service);
            }
        }
        self.len -= 1;
        Some(old)
    }

    /// Counts an endpoint of `region` in (`added`) or out, returning the
    /// origin change it makes, if any.
    fn count(&mut self, region: &str, added: bool, revision: i64) -> Option<Change> {
        self.update_origin(region, revision, |o| {
            if added {
                o.endpoints += 1;
            } else {
                o.endpoints = o.endpoints.saturating_sub(1);
            }
        })
    }

    /// The changes that turn `self` into `new`, in `new`'s order, then the
    /// removals in `self`'s order.
    fn diff(&self, new: &Registry) -> Vec<Change> {
        let revision = new.revision;
        let mut old: HashMap<&EndpointKey, &Arc<Endpoint>> =
            self.iter().map(|e| (&e.key, e)).collect();
        let mut changes = Vec::new();
        for ep in new.iter() {
            match old.remove(&ep.key) {
                None => changes.push(Change::Added {
                    endpoint: ep.clone(),
                    revision,
                }),
                Some(o) if o.value != ep.value => changes.push(Change::Updated {
                    old: o.clone(),
                    new: ep.clone(),
                    revision,
                }),
                Some(_) => {}
            }
        }
        for ep in self.iter() {
            if old.contains_key(&ep.key) {
                changes.push(Change::Removed {
                    endpoint: ep.clone(),
                    revision,
                });
            }
        }
        let regions: std::collections::BTreeSet<&String> =
            self.origins.keys().chain(new.origins.keys()).collect();
        for region in regions {
            let (o, n) = (self.origins.get(region), new.origins.get(region));
            if o.map(OriginStatus::signal) != n.map(OriginStatus::signal) {
                changes.push(Change::Origin {
                    region: region.clone(),
                    status: n.cloned(),
                    revision,
                });
            }
        }
        changes
    }
}

/// The index of `key` in a sorted list. Its priority is not known, so each
/// of the three is tried: three binary searches.
fn find(list: &[Arc<Endpoint>], key: &EndpointKey) -> Option<usize> {
    let addr = key.ip.parse().ok();
    (PRIORITY_ZONE..=PRIORITY_FOREIGN).find_map(|p| {
        let want = probe(p, addr, key);
        list.binary_search_by(|e| e.sort_key().cmp(&want)).ok()
    })
}

/// The frame both watches' responses are applied in: each event goes to
/// `event` with its revision, after the working copy's revision and
/// `watched` (that watch's resume point) are raised to it; then the
/// changes are published. A response without events (progress) publishes
/// nothing.
fn apply_events(
    current: &mut Arc<Registry>,
    watched: &mut i64,
    shared: &Shared,
    resp: WatchResponse,
    mut event: impl FnMut(&mut Registry, etcd::Event, i64, &mut Vec<Change>),
) {
    if resp.events.is_empty() {
        return;
    }
    let reg = Arc::make_mut(current);
    let mut changes = Vec::new();
    for ev in resp.events {
        let revision = ev.revision();
        reg.revision = reg.revision.max(revision);
        *watched = (*watched).max(revision);
        event(reg, ev, revision, &mut changes);
    }
    shared.publish(current.clone(), changes);
}

/// State shared between the view's handle and its task.
struct Shared {
    snapshot: RwLock<Arc<Registry>>,
    changes: broadcast::Sender<Change>,
    skipped: AtomicU64,
    resyncs: AtomicU64,
    /// The watch stream in use, for its connection state.
    stream: std::sync::Mutex<Option<etcd::WatchStream>>,
}

impl Shared {
    /// Publishes a new snapshot and the changes that led to it, atomically
    /// with respect to [`RegistryView::snapshot_and_subscribe`].
    fn publish(&self, registry: Arc<Registry>, changes: Vec<Change>) {
        let mut snap = self
            .snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        *snap = registry;
        for c in changes {
            // No subscriber is not an error.
            let _ = self.changes.send(c);
        }
    }
}

/// A live view of the registry in one etcd; see the [module docs](self).
/// Dropping it stops its task.
pub struct RegistryView {
    shared: Arc<Shared>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl RegistryView {
    /// Loads the snapshot, then starts the task that applies the watch.
    ///
    /// Fails if the config is invalid or the snapshot cannot be read; after
    /// that, errors are retried in the background.
    pub async fn start(client: Client, config: ViewConfig) -> Result<RegistryView> {
        config.validate()?;
        let (registry, skipped) = load(&client, &config).await?;
        let revision = registry.revision;
        let (changes, _) = broadcast::channel(config.channel_capacity);
        let shared = Arc::new(Shared {
            snapshot: RwLock::new(Arc::new(registry)),
            changes,
            skipped: AtomicU64::new(skipped),
            resyncs: AtomicU64::new(0),
            stream: std::sync::Mutex::new(None),
        });
        let cancel = CancellationToken::new();
        let task = Task {
            current: shared.snapshot().clone(),
            registry_revision: revision,
            state_revision: revision,
            client,
            config,
            shared: shared.clone(),
            cancel: cancel.clone(),
        };
        let task = tokio::spawn(task.run());
        Ok(RegistryView {
            shared,
            cancel,
            task: Some(task),
        })
    }

    /// The registry as of the last change applied.
    pub fn snapshot(&self) -> Arc<Registry> {
        self.shared.snapshot().clone()
    }

    /// Every endpoint of `service`: by protocol, then closest first.
    /// Includes endpoints of origins whose copy is not synced yet; see
    /// [`RegistryView::endpoints_synced_only`].
    pub fn endpoints(&self, service: &str) -> Vec<Arc<Endpoint>> {
        self.snapshot().service_endpoints(service)
    }

    /// Like [`RegistryView::endpoints`], without the endpoints of origins
    /// whose copy is not synced (a half-done first sync, or no state key).
    pub fn endpoints_synced_only(&self, service: &str) -> Vec<Arc<Endpoint>> {
        self.snapshot().synced_endpoints(service)
    }

    /// Every listed origin and its status, as of the last change applied.
    /// Staleness is read from a status on demand
    /// ([`OriginStatus::staleness`]).
    pub fn origins(&self) -> BTreeMap<String, OriginStatus> {
        self.snapshot().origins.clone()
    }

    /// Changes from now on. A receiver that falls more than the channel
    /// capacity behind gets `RecvError::Lagged` and should re-read
    /// [`RegistryView::snapshot`].
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.shared.changes.subscribe()
    }

    /// A snapshot and a receiver of exactly the changes after it.
    pub fn snapshot_and_subscribe(&self) -> (Arc<Registry>, broadcast::Receiver<Change>) {
        let snap = self.shared.snapshot();
        (snap.clone(), self.shared.changes.subscribe())
    }

    /// The revision the view reflects.
    pub fn revision(&self) -> i64 {
        self.shared.snapshot().revision()
    }

    /// Whether the view's watch is connected right now. While it is not,
    /// the view still serves its last state, which may be going stale.
    pub fn is_connected(&self) -> bool {
        self.shared
            .stream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(etcd::WatchStream::is_connected)
    }

    /// Key-values under the root skipped because their key is not an
    /// endpoint key: counted for each snapshot that holds one and each put
    /// of one.
    pub fn skipped(&self) -> u64 {
        self.shared.skipped.load(Ordering::Relaxed)
    }

    /// Snapshots taken again after a compaction.
    pub fn resyncs(&self) -> u64 {
        self.shared.resyncs.load(Ordering::Relaxed)
    }

    /// Stops the task and waits for it.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for RegistryView {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Shared {
    fn snapshot(&self) -> std::sync::RwLockReadGuard<'_, Arc<Registry>> {
        self.snapshot.read().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reads every key under the root and every state key at one revision:
/// the registry and the number of key-values skipped.
async fn load(client: &Client, config: &ViewConfig) -> etcd::Result<(Registry, u64)> {
    // The state keys first: their header revision pins the scan.
    let resp = client
        .range(Range::prefix(config.state_root.clone()))
        .await?;
    let revision = resp.header.revision;
    let states = resp
        .kvs()
        .iter()
        .filter_map(|kv| {
            let region = config.state_origin(kv.key())?;
            Some((
                region.to_owned(),
                State::decode(kv.value()),
                kv.mod_revision(),
            ))
        })
        .collect();
    let mut scan = client.scan_prefix(config.schema.root().to_owned(), config.page_size, revision);
    let mut endpoints = Vec::new();
    let mut skipped = 0;
    while let Some(page) = scan.next_page().await? {
        for kv in &page.kvs {
            match config.schema.parse(kv.key()) {
                Ok(key) => endpoints.push(Endpoint::new(key, kv, config)),
                Err(_) => skipped += 1,
            }
        }
    }
    let registry = Registry::build_with(revision, endpoints, Some(&config.region), states);
    Ok((registry, skipped))
}

/// The view's task: owns the working copy of the registry.
struct Task {
    client: Client,
    config: ViewConfig,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    current: Arc<Registry>,
    /// Last revision applied from the registry watch: it resumes after it.
    registry_revision: i64,
    /// Last revision applied from the state-key watch.
    state_revision: i64,
}

const MIN_BACKOFF: Duration = Duration::from_millis(100);

/// What a watch message asks the task to do next.
enum Flow {
    Continue,
    Compacted(Option<i64>),
    Failed,
    Stop,
}

impl Task {
    async fn run(mut self) {
        let mut backoff = Backoff::new(MIN_BACKOFF, self.config.max_backoff.max(MIN_BACKOFF));
        loop {
            // Both watches on one stream: etcd then sends caught-up
            // watchers' responses in commit order (see the module docs).
            let stream = self.client.watch_stream();
            let registry = WatchOptions::prefix(self.config.schema.root().to_owned())
                .start_revision(self.registry_revision + 1);
            let states = WatchOptions::prefix(self.config.state_root.clone())
                .start_revision(self.state_revision + 1);
            let (Ok(mut registry), Ok(mut states)) = (stream.watch(registry), stream.watch(states))
            else {
                return;
            };
            *self.shared.stream.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream);
            let flow = loop {
                let flow = tokio::select! {
                    biased;
                    _ = self.cancel.cancelled() => Flow::Stop,
                    msg = registry.next() => self.on_registry(msg),
                    msg = states.next() => self.on_state(msg, &mut registry),
                };
                match flow {
                    Flow::Continue => backoff.reset(),
                    other => break other,
                }
            };
            drop((registry, states));
            match flow {
                Flow::Continue | Flow::Stop => return,
                Flow::Compacted(compact_revision) => {
                    tracing::info!(
                        revision = self.current.revision,
                        ?compact_revision,
                        "registry watch compacted; taking a new snapshot"
                    );
                    if !self.resync(compact_revision, &mut backoff).await {
                        return;
                    }
                }
                Flow::Failed => {
                    if !self.sleep(&mut backoff).await {
                        return;
                    }
                }
            }
        }
    }

    /// Classifies a watch message; `apply` takes a response.
    fn flow(
        &mut self,
        msg: Option<etcd::Result<WatchResponse>>,
        what: &str,
        apply: impl FnOnce(&mut Self, WatchResponse),
    ) -> Flow {
        match msg {
            None => Flow::Stop,
            Some(Ok(resp)) => {
                apply(self, resp);
                Flow::Continue
            }
            Some(Err(etcd::Error::Compacted { compact_revision })) => {
                Flow::Compacted(compact_revision)
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, revision = self.current.revision, "{what} watch failed; retrying");
                Flow::Failed
            }
        }
    }

    fn on_registry(&mut self, msg: Option<etcd::Result<WatchResponse>>) -> Flow {
        self.flow(msg, "registry", Self::apply)
    }

    /// A state response: the registry responses already delivered go
    /// first, so that an origin does not turn synced ahead of endpoints
    /// written before its marker.
    fn on_state(
        &mut self,
        msg: Option<etcd::Result<WatchResponse>>,
        registry: &mut Watcher,
    ) -> Flow {
        while let Some(earlier) = registry.try_next() {
            match self.on_registry(Some(earlier)) {
                Flow::Continue => {}
                // The state response is not applied: the resync or the
                // resumed watch brings it again.
                other => return other,
            }
        }
        self.flow(msg, "state-key", Self::apply_state)
    }

    async fn sleep(&self, backoff: &mut Backoff) -> bool {
        backoff.wait_unless(self.cancel.cancelled()).await
    }

    /// Applies one watch response and publishes the result.
    fn apply(&mut self, resp: WatchResponse) {
        let (config, shared) = (&self.config, &self.shared);
        apply_events(
            &mut self.current,
            &mut self.registry_revision,
            shared,
            resp,
            |reg, ev, revision, changes| {
                let key = match config.schema.parse(ev.kv.key()) {
                    Ok(key) => key,
                    Err(e) => {
                        if ev.kind == EventKind::Put {
                            tracing::debug!(error = %e, "skipping a key that is not an endpoint key");
                            shared.skipped.fetch_add(1, Ordering::Relaxed);
                        }
                        return;
                    }
                };
                match ev.kind {
                    EventKind::Put => match reg.upsert(Endpoint::new(key, &ev.kv, config)) {
                        Upsert::Added(endpoint) => {
                            let origin = reg.count(&endpoint.key.region, true, revision);
                            changes.push(Change::Added { endpoint, revision });
                            changes.extend(origin);
                        }
                        Upsert::Updated(old, new) => {
                            changes.push(Change::Updated { old, new, revision })
                        }
                        Upsert::Unchanged => {}
                    },
                    EventKind::Delete => {
                        if let Some(endpoint) = reg.remove(&key) {
                            let origin = reg.count(&endpoint.key.region, false, revision);
                            changes.push(Change::Removed { endpoint, revision });
                            changes.extend(origin);
                        }
                    }
                }
            },
        );
    }

    /// Applies one response of the state-key watch and publishes the
    /// result. A heartbeat updates the status without a change.
    fn apply_state(&mut self, resp: WatchResponse) {
        let config = &self.config;
        apply_events(
            &mut self.current,
            &mut self.state_revision,
            &self.shared,
            resp,
            |reg, ev, revision, changes| {
                let Some(region) = config.state_origin(ev.kv.key()) else {
                    return;
                };
                let state = match ev.kind {
                    EventKind::Put => Some((State::decode(ev.kv.value()), revision)),
                    EventKind::Delete => None,
                };
                changes.extend(reg.update_origin(region, revision, |o| o.set_state(state)));
            },
        );
    }

    /// Takes a new snapshot (retrying until it succeeds or the view stops),
    /// emits the difference and `Resynced`. False if the view stopped.
    async fn resync(&mut self, compact_revision: Option<i64>, backoff: &mut Backoff) -> bool {
        loop {
            let loaded = tokio::select! {
                _ = self.cancel.cancelled() => return false,
                r = load(&self.client, &self.config) => r,
            };
            match loaded {
                Ok((registry, skipped)) => {
                    self.shared.skipped.fetch_add(skipped, Ordering::Relaxed);
                    self.shared.resyncs.fetch_add(1, Ordering::Relaxed);
                    let mut changes = self.current.diff(&registry);
                    let count = |k: &str| changes.iter().filter(|c| c.kind() == k).count();
                    let resynced = Change::Resynced {
                        revision: registry.revision,
                        compact_revision,
                        added: count("added"),
                        updated: count("updated"),
                        removed: count("removed"),
                    };
                    changes.push(resynced);
                    self.registry_revision = registry.revision;
                    self.state_revision = registry.revision;
                    self.current = Arc::new(registry);
                    self.shared.publish(self.current.clone(), changes);
                    backoff.reset();
                    return true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "registry snapshot failed; retrying");
                    if !self.sleep(backoff).await {
                        return false;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::Event;

    fn kv(key: &str, value: &str, rev: i64) -> KeyValue {
        Event::synthetic(
            EventKind::Put,
            Bytes::from(key.to_owned()),
            Bytes::from(value.to_owned()),
            rev,
        )
        .kv
    }

    fn ep(cfg: &ViewConfig, region: &str, ip: &str, value: &str) -> Endpoint {
        let key = EndpointKey::new(region, "c1", "svc", "http", ip).unwrap();
        let raw = cfg.schema.endpoint_key(&key);
        Endpoint::new(key, &kv(&raw, value, 1), cfg)
    }

    fn cfg() -> ViewConfig {
        ViewConfig::new("b").zone("b-1")
    }

    #[test]
    fn priorities_by_locality() {
        let c = cfg();
        let z = |z: &str| format!(r#"{{"zone":"{z}","region":"x"}}"#);
        assert_eq!(ep(&c, "b", "10.0.0.1", &z("b-1")).priority, PRIORITY_ZONE);
        assert_eq!(ep(&c, "b", "10.0.0.1", &z("b-2")).priority, PRIORITY_REGION);
        assert_eq!(ep(&c, "b", "10.0.0.1", "{}").priority, PRIORITY_REGION);
        // The same zone name in another region is still foreign.
        assert_eq!(
            ep(&c, "a", "10.0.0.1", &z("b-1")).priority,
            PRIORITY_FOREIGN
        );
        // Without a viewer zone nothing is priority 0.
        let nz = ViewConfig::new("b");
        assert_eq!(ep(&nz, "b", "10.0.0.1", "{}").priority, PRIORITY_REGION);
        assert_eq!(
            ep(&nz, "b", "10.0.0.1", &z("b-1")).priority,
            PRIORITY_REGION
        );
    }

    #[test]
    fn values_that_are_not_json_are_kept() {
        let c = cfg();
        let e = ep(&c, "b", "10.0.0.1", "not json {");
        assert!(!e.value.is_json());
        assert_eq!(
            e.value,
            EndpointValue::NotJson(Bytes::from_static(b"not json {"))
        );
        assert_eq!(e.zone, None);
        let e = ep(&c, "b", "10.0.0.1", r#"{"zone":"b-1","weight":3}"#);
        assert_eq!(e.value.field("weight"), Some(&serde_json::json!(3)));
        assert_eq!(e.zone.as_deref(), Some("b-1"));
        // A zone that is not a string is no zone.
        assert_eq!(ep(&c, "b", "10.0.0.1", r#"{"zone":7}"#).zone, None);
    }

    #[test]
    fn lists_are_ordered_and_upserts_keep_the_order() {
        let c = cfg();
        let eps = vec![
            ep(&c, "a", "10.0.0.2", "{}"),
            ep(&c, "b", "10.0.0.10", "{}"),
            ep(&c, "b", "fd00::1", r#"{"zone":"b-1"}"#),
            ep(&c, "b", "10.0.0.9", r#"{"zone":"b-1"}"#),
            ep(&c, "b", "fe80::1%eth0", "{}"),
            ep(&c, "b", "10.0.0.2", "{}"),
        ];
        let mut reg = Registry::build(5, eps);
        let order = |r: &Registry| -> Vec<String> {
            r.endpoints("svc", "http")
                .iter()
                .map(|e| format!("{}:{}:{}", e.priority, e.key.region, e.key.ip))
                .collect()
        };
        assert_eq!(
            order(&reg),
            [
                "0:b:10.0.0.9",
                "0:b:fd00::1",
                "1:b:10.0.0.2",
                "1:b:10.0.0.10",
                "1:b:fe80::1%eth0",
                "2:a:10.0.0.2"
            ]
        );
        assert_eq!(reg.len(), 6);
        // Moving zones moves the endpoint; an equal value changes nothing.
        let moved = ep(&c, "b", "10.0.0.9", r#"{"zone":"b-2"}"#);
        assert!(matches!(reg.upsert(moved), Upsert::Updated(..)));
        assert!(matches!(
            reg.upsert(ep(&c, "b", "10.0.0.9", r#"{"zone":"b-2"}"#)),
            Upsert::Unchanged
        ));
        assert!(matches!(
            reg.upsert(ep(&c, "a", "10.0.0.1", "{}")),
            Upsert::Added(_)
        ));
        assert_eq!(
            order(&reg),
            [
                "0:b:fd00::1",
                "1:b:10.0.0.2",
                "1:b:10.0.0.9",
                "1:b:10.0.0.10",
                "1:b:fe80::1%eth0",
                "2:a:10.0.0.1",
                "2:a:10.0.0.2"
            ]
        );
        assert_eq!(reg.len(), 7);
        let key = EndpointKey::new("b", "c1", "svc", "http", "fe80::1%eth0").unwrap();
        assert!(reg.get(&key).is_some());
        assert!(reg.remove(&key).is_some());
        assert!(reg.remove(&key).is_none());
        assert!(reg.get(&key).is_none());
        assert_eq!(reg.len(), 6);
        for ip in ["fd00::1", "10.0.0.2", "10.0.0.9", "10.0.0.10"] {
            let key = EndpointKey::new("b", "c1", "svc", "http", ip).unwrap();
            assert!(reg.remove(&key).is_some(), "{ip}");
        }
        for ip in ["10.0.0.1", "10.0.0.2"] {
            let key = EndpointKey::new("a", "c1", "svc", "http", ip).unwrap();
            assert!(reg.remove(&key).is_some(), "{ip}");
        }
        assert!(reg.is_empty());
        assert_eq!(reg.services().count(), 0, "empty services are dropped");
    }

    #[test]
    fn snapshots_are_not_affected_by_later_changes() {
        let c = cfg();
        let mut current = Arc::new(Registry::build(1, vec![ep(&c, "b", "10.0.0.1", "{}")]));
        let before = current.clone();
        Arc::make_mut(&mut current).upsert(ep(&c, "b", "10.0.0.2", "{}"));
        assert_eq!(before.len(), 1);
        assert_eq!(current.len(), 2);
    }

    #[test]
    fn diff_lists_additions_updates_and_removals() {
        let c = cfg();
        let old = Registry::build(
            1,
            vec![
                ep(&c, "b", "10.0.0.1", "{}"),
                ep(&c, "b", "10.0.0.2", r#"{"v":1}"#),
                ep(&c, "a", "10.0.0.3", "{}"),
            ],
        );
        let new = Registry::build(
            9,
            vec![
                ep(&c, "b", "10.0.0.1", "{}"),
                ep(&c, "b", "10.0.0.2", r#"{"v":2}"#),
                ep(&c, "b", "10.0.0.4", "{}"),
            ],
        );
        let got: Vec<String> = old
            .diff(&new)
            .iter()
            .map(|c| match c {
                Change::Origin { region, status, .. } => {
                    format!("origin {region} {:?} {}", status, c.revision())
                }
                _ => {
                    let e = c.endpoint().unwrap();
                    format!("{} {} {}", c.kind(), e.key.ip, c.revision())
                }
            })
            .collect();
        assert_eq!(
            got,
            [
                "updated 10.0.0.2 9",
                "added 10.0.0.4 9",
                "removed 10.0.0.3 9",
                "origin a None 9"
            ]
        );
        assert!(new.diff(&new).is_empty());
    }

    fn state(synced: bool, heartbeat_unix_ms: i64) -> State {
        State {
            revision: 40,
            lease: 7,
            holder: 1,
            source_cluster: 2,
            heartbeat_unix_ms,
            synced,
        }
    }

    #[test]
    fn origins_follow_state_keys_and_endpoint_counts() {
        let c = cfg();
        let mut reg = Registry::build_with(
            3,
            vec![ep(&c, "a", "10.0.0.1", "{}"), ep(&c, "x", "10.0.0.2", "{}")],
            Some("b"),
            vec![("a".into(), Some(state(false, 0)), 2)],
        );
        let listed: Vec<(&str, bool, bool, usize)> = reg
            .origins()
            .map(|(r, o)| (r, o.synced, o.state_present, o.endpoints))
            .collect();
        assert_eq!(
            listed,
            [
                ("a", false, true, 1),
                ("b", true, false, 0),
                ("x", false, false, 1)
            ]
        );
        // The viewer's own region is current; a state key without a
        // heartbeat, or no state key, is unknown.
        let now = 1_000_000;
        assert_eq!(
            reg.origin("b").unwrap().staleness_at(now),
            Some(Duration::ZERO)
        );
        assert_eq!(reg.origin("a").unwrap().staleness_at(now), None);
        assert_eq!(reg.origin("x").unwrap().staleness_at(now), None);
        assert!(reg.is_synced("b") && !reg.is_synced("a") && !reg.is_synced("x"));
        assert!(!reg.is_synced("nowhere"));
        assert_eq!(reg.synced_endpoints("svc").len(), 0);

        // A heartbeat alone is no change; the synced marker is.
        let set = |r: &mut Registry, st: Option<State>, rev| {
            r.update_origin("a", rev, |o| o.set_state(Some((st, rev))))
        };
        assert!(set(&mut reg, Some(state(false, now - 500)), 4).is_none());
        assert_eq!(
            reg.origin("a").unwrap().staleness_at(now),
            Some(Duration::from_millis(500))
        );
        // A heartbeat ahead of the viewer's clock is not negative.
        assert!(set(&mut reg, Some(state(false, now + 500)), 5).is_none());
        assert_eq!(
            reg.origin("a").unwrap().staleness_at(now),
            Some(Duration::ZERO)
        );
        match set(&mut reg, Some(state(true, now)), 6) {
            Some(Change::Origin {
                region,
                status: Some(s),
                revision: 6,
            }) => {
                assert_eq!(region, "a");
                assert!(s.synced && s.state_present);
                assert_eq!((s.endpoints, s.source_revision, s.lease), (1, 40, 7));
            }
            other => panic!("expected an origin change, got {other:?}"),
        }
        assert_eq!(reg.synced_endpoints("svc").len(), 1);
        // A value that does not decode: present, not synced.
        assert!(set(&mut reg, None, 7).is_some());
        let a = reg.origin("a").unwrap();
        assert!(a.state_present && !a.synced && a.heartbeat_unix_ms == 0);
        // The key gone: still listed while it has endpoints, then not.
        assert!(reg.update_origin("a", 8, |o| o.set_state(None)).is_some());
        assert!(!reg.origin("a").unwrap().state_present);
        match reg.count("a", false, 9) {
            Some(Change::Origin { status: None, .. }) => {}
            other => panic!("expected the origin to go, got {other:?}"),
        }
        assert!(reg.origin("a").is_none());
        // The viewer's own region ignores a stray state key, and stays
        // listed without endpoints.
        assert!(reg.update_origin("b", 10, |o| o.set_state(None)).is_none());
        assert!(reg.origin("b").unwrap().synced);
        // A new origin with endpoints only is listed, not synced.
        assert!(matches!(
            reg.count("z", true, 11),
            Some(Change::Origin { status: Some(ref s), .. }) if !s.synced
        ));
    }

    #[test]
    fn state_keys_are_recognized() {
        let c = cfg();
        assert_eq!(c.state_origin(b"/aether/v1/replication/a/state"), Some("a"));
        assert_eq!(c.state_origin(b"/aether/v1/replication/a/other"), None);
        assert_eq!(c.state_origin(b"/aether/v1/replication/a/b/state"), None);
        assert_eq!(c.state_origin(b"/aether/v1/replication//state"), None);
        assert_eq!(c.state_origin(b"/aether/v1/regions/a/state"), None);
        let t = cfg().with_state_root("/t/state/");
        assert_eq!(t.state_origin(b"/t/state/eu/state"), Some("eu"));
    }

    #[test]
    fn config_is_validated() {
        assert!(
            ViewConfig::new("a")
                .with_state_root("/aether/v1/")
                .validate()
                .is_err()
        );
        assert!(
            ViewConfig::new("a")
                .with_state_root("x/")
                .validate()
                .is_err()
        );
        assert!(
            ViewConfig::new("a")
                .with_state_root("/s/")
                .validate()
                .is_ok()
        );
        assert!(ViewConfig::new("a/b").validate().is_err());
        assert!(ViewConfig::new("a").zone("").validate().is_err());
        let mut c = ViewConfig::new("a");
        c.channel_capacity = 0;
        assert!(c.validate().is_err());
        assert!(ViewConfig::new("a").zone("z").validate().is_ok());
    }
}
