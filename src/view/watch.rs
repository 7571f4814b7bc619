//! The view's task: the snapshot (`load`), then one watch stream for the
//! registry and the state keys, applied to a copy-on-write registry and
//! published; a compaction resyncs by a new snapshot and its diff.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::etcd::{self, Backoff, Client, EventKind, Range, WatchOptions, WatchResponse, Watcher};
use crate::mirror::state::State;

use super::change::Change;
use super::config::ViewConfig;
use super::endpoint::Endpoint;
use super::registry::{Registry, Upsert};

/// State shared between the view's handle and its task.
pub(super) struct Shared {
    snapshot: RwLock<Arc<Registry>>,
    pub(super) changes: broadcast::Sender<Change>,
    pub(super) skipped: AtomicU64,
    pub(super) resyncs: AtomicU64,
    /// The watch stream in use, for its connection state.
    pub(super) stream: std::sync::Mutex<Option<etcd::WatchStream>>,
}

impl Shared {
    /// Publishes a new snapshot and the changes that led to it, atomically
    /// with respect to
    /// [`RegistryView::snapshot_and_subscribe`](super::RegistryView::snapshot_and_subscribe).
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

    /// The registry as last published.
    pub(super) fn snapshot(&self) -> std::sync::RwLockReadGuard<'_, Arc<Registry>> {
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

/// Loads the snapshot, then spawns the task that applies the watch from
/// it, until `cancel`: the state the handle reads, and the task.
pub(super) async fn spawn(
    client: Client,
    config: ViewConfig,
    cancel: CancellationToken,
) -> Result<(Arc<Shared>, JoinHandle<()>)> {
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
    let task = Task {
        current: shared.snapshot().clone(),
        registry_revision: revision,
        state_revision: revision,
        client,
        config,
        shared: shared.clone(),
        cancel,
    };
    Ok((shared, tokio::spawn(task.run())))
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
            // watchers' responses in commit order (see the view's module docs).
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
                    msg = futures_util::StreamExt::next(&mut registry) => self.on_registry(msg),
                    msg = futures_util::StreamExt::next(&mut states) => self.on_state(msg, &mut registry),
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
        while let Some(earlier) = registry.next_buffered() {
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
