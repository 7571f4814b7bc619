//! [`RegistryView`], the handle a consumer holds: it starts the task and
//! reads what the task publishes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::etcd::{self, Client};

use super::change::Change;
use super::config::ViewConfig;
use super::endpoint::Endpoint;
use super::origin::OriginStatus;
use super::registry::Registry;
use super::watch::{self, Shared};

/// A live view of the registry in one etcd; see the [module docs](super).
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
        let cancel = CancellationToken::new();
        let (shared, task) = watch::spawn(client, config, cancel.clone()).await?;
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

// By hand: what the view reflects, not the registry it holds.
impl std::fmt::Debug for RegistryView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryView")
            .field("revision", &self.revision())
            .field("connected", &self.is_connected())
            .field("skipped", &self.skipped())
            .field("resyncs", &self.resyncs())
            .field("stopped", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl Drop for RegistryView {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
