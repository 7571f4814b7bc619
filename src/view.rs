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
use crate::etcd::{self, Backoff, Client, EventKind, KeyValue, WatchOptions, WatchResponse};
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
        }
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
        Ok(())
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
}

impl Change {
    /// The revision at which the view reflects this change.
    pub fn revision(&self) -> i64 {
        match self {
            Change::Added { revision, .. }
            | Change::Updated { revision, .. }
            | Change::Removed { revision, .. }
            | Change::Resynced { revision, .. } => *revision,
        }
    }

    /// The endpoint concerned (after the change for an update); `None` for
    /// a resync.
    pub fn endpoint(&self) -> Option<&Arc<Endpoint>> {
        match self {
            Change::Added { endpoint, .. } | Change::Removed { endpoint, .. } => Some(endpoint),
            Change::Updated { new, .. } => Some(new),
            Change::Resynced { .. } => None,
        }
    }

    /// `"added"`, `"updated"`, `"removed"` or `"resynced"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Change::Added { .. } => "added",
            Change::Updated { .. } => "updated",
            Change::Removed { .. } => "removed",
            Change::Resynced { .. } => "resynced",
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

    fn build(revision: i64, endpoints: Vec<Endpoint>) -> Registry {
        let mut services: BTreeMap<String, Service> = BTreeMap::new();
        let len = endpoints.len();
        for ep in endpoints {
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
        }
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
    pub fn endpoints(&self, service: &str) -> Vec<Arc<Endpoint>> {
        self.snapshot().service_endpoints(service)
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

/// Reads every key under the root at one revision: the registry and the
/// number of key-values skipped.
async fn load(client: &Client, config: &ViewConfig) -> etcd::Result<(Registry, u64)> {
    let mut scan = client.scan_prefix(config.schema.root().to_owned(), config.page_size, 0);
    let mut endpoints = Vec::new();
    let mut skipped = 0;
    let mut revision = 0;
    while let Some(page) = scan.next_page().await? {
        revision = page.revision;
        for kv in &page.kvs {
            match config.schema.parse(kv.key()) {
                Ok(key) => endpoints.push(Endpoint::new(key, kv, config)),
                Err(_) => skipped += 1,
            }
        }
    }
    Ok((Registry::build(revision, endpoints), skipped))
}

/// The view's task: owns the working copy of the registry.
struct Task {
    client: Client,
    config: ViewConfig,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    current: Arc<Registry>,
}

const MIN_BACKOFF: Duration = Duration::from_millis(100);

impl Task {
    async fn run(mut self) {
        let mut backoff = Backoff::new(MIN_BACKOFF, self.config.max_backoff.max(MIN_BACKOFF));
        loop {
            let opts = WatchOptions::prefix(self.config.schema.root().to_owned())
                .start_revision(self.current.revision + 1);
            let Ok((stream, mut watcher)) = self.client.watch(opts) else {
                return;
            };
            *self.shared.stream.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream);
            let compacted = loop {
                let msg = tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    msg = watcher.next() => msg,
                };
                match msg {
                    None => return,
                    Some(Ok(resp)) => {
                        backoff.reset();
                        self.apply(resp);
                    }
                    Some(Err(etcd::Error::Compacted { compact_revision })) => {
                        break Some(compact_revision);
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, revision = self.current.revision, "registry watch failed; retrying");
                        break None;
                    }
                }
            };
            drop(watcher);
            match compacted {
                Some(compact_revision) => {
                    tracing::info!(
                        revision = self.current.revision,
                        ?compact_revision,
                        "registry watch compacted; taking a new snapshot"
                    );
                    if !self.resync(compact_revision, &mut backoff).await {
                        return;
                    }
                }
                None => {
                    if !self.sleep(&mut backoff).await {
                        return;
                    }
                }
            }
        }
    }

    async fn sleep(&self, backoff: &mut Backoff) -> bool {
        let d = backoff.next_delay();
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = tokio::time::sleep(d) => true,
        }
    }

    /// Applies one watch response and publishes the result.
    fn apply(&mut self, resp: WatchResponse) {
        if resp.events.is_empty() {
            return;
        }
        let reg = Arc::make_mut(&mut self.current);
        let mut changes = Vec::new();
        for ev in resp.events {
            let revision = ev.revision();
            reg.revision = reg.revision.max(revision);
            let key = match self.config.schema.parse(ev.kv.key()) {
                Ok(key) => key,
                Err(e) => {
                    if ev.kind == EventKind::Put {
                        tracing::debug!(error = %e, "skipping a key that is not an endpoint key");
                        self.shared.skipped.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
            };
            match ev.kind {
                EventKind::Put => match reg.upsert(Endpoint::new(key, &ev.kv, &self.config)) {
                    Upsert::Added(endpoint) => changes.push(Change::Added { endpoint, revision }),
                    Upsert::Updated(old, new) => {
                        changes.push(Change::Updated { old, new, revision })
                    }
                    Upsert::Unchanged => {}
                },
                EventKind::Delete => {
                    if let Some(endpoint) = reg.remove(&key) {
                        changes.push(Change::Removed { endpoint, revision });
                    }
                }
            }
        }
        self.shared.publish(self.current.clone(), changes);
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
            .map(|c| {
                let e = c.endpoint().unwrap();
                format!("{} {} {}", c.kind(), e.key.ip, c.revision())
            })
            .collect();
        assert_eq!(
            got,
            [
                "updated 10.0.0.2 9",
                "added 10.0.0.4 9",
                "removed 10.0.0.3 9"
            ]
        );
        assert!(new.diff(&new).is_empty());
    }

    #[test]
    fn config_is_validated() {
        assert!(ViewConfig::new("a/b").validate().is_err());
        assert!(ViewConfig::new("a").zone("").validate().is_err());
        let mut c = ViewConfig::new("a");
        c.channel_capacity = 0;
        assert!(c.validate().is_err());
        assert!(ViewConfig::new("a").zone("z").validate().is_ok());
    }
}
