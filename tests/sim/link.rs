//! The engine's view of one model etcd: a [`Backend`] over a member of a
//! model cluster, with the link's faults drawn from the run's seed.
//!
//! Each call may be refused before it reaches the store (an error, nothing
//! applied), delayed, or lose its answer after it applied (a timeout: the
//! engine cannot know whether it applied, as with a real link that broke
//! mid-call). Every call is written to the run's trace.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aether_etcd::model::{self, Cluster};
use aether_replicator::etcd::{
    self, Error, LeaseGrant, LeaseId, LeaseStatus, LeaseTtl, Range, RangeResponse, Scan, Txn,
    TxnResponse, WatchOptions, WatchResponse,
};
use aether_replicator::store::{Backend, Lease, WatchEvents, WatchHealth};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::sync::watch;

use crate::rng::Rng;
use crate::trace::Trace;

/// How often a link's calls fail, per mille; set by the nemesis.
#[derive(Debug, Default)]
pub(crate) struct Weather {
    /// Refused before the store (nothing applied).
    pub(crate) refuse: AtomicUsize,
    /// Applied, and the answer lost.
    pub(crate) lose: AtomicUsize,
    /// Delayed by up to 200 ms.
    pub(crate) delay: AtomicUsize,
    /// Cut: every call is refused.
    pub(crate) cut: AtomicBool,
}

/// One process's link to one region's etcd.
#[derive(Clone)]
pub(crate) struct Link {
    pub(crate) name: String,
    pub(crate) cluster: Cluster,
    /// The member unary calls go to (a failover moves it; watches stay).
    pub(crate) member: Arc<AtomicUsize>,
    pub(crate) weather: Arc<Weather>,
    pub(crate) rng: Rng,
    pub(crate) trace: Trace,
}

const TIMEOUT: Duration = Duration::from_secs(2);

impl Link {
    fn client(&self) -> model::Client {
        self.cluster.client(self.member.load(Relaxed))
    }

    /// The fault before a call: refused or delayed.
    async fn before(&self, what: &str) -> etcd::Result<()> {
        let w = &self.weather;
        if w.cut.load(Relaxed) || self.rng.per_mille(w.refuse.load(Relaxed)) {
            self.trace.note(format!("{} {what} refused", self.name));
            return Err(Error::Unavailable(format!("{}: refused", self.name)));
        }
        if self.rng.per_mille(w.delay.load(Relaxed)) {
            tokio::time::sleep(Duration::from_millis(self.rng.below(200))).await;
        }
        Ok(())
    }

    /// The fault after a call applied: its answer lost.
    fn after<T>(&self, what: &str, r: etcd::Result<T>) -> etcd::Result<T> {
        if r.is_ok() && self.rng.per_mille(self.weather.lose.load(Relaxed)) {
            self.trace.note(format!("{} {what} answer lost", self.name));
            return Err(Error::Timeout(TIMEOUT));
        }
        r
    }
}

impl Backend for Link {
    fn range(&self, req: Range) -> BoxFuture<'_, etcd::Result<RangeResponse>> {
        Box::pin(async move {
            self.before("range").await?;
            let r = self.client().range(req).await;
            self.trace.note(format!(
                "{} range -> {}",
                self.name,
                r.as_ref()
                    .map_or_else(|e| e.to_string(), |r| r.header.revision.to_string())
            ));
            self.after("range", r)
        })
    }

    fn txn(&self, txn: Txn) -> BoxFuture<'_, etcd::Result<TxnResponse>> {
        Box::pin(async move {
            self.before("txn").await?;
            let r = self.client().txn(txn).await;
            self.trace.note(format!(
                "{} txn -> {}",
                self.name,
                r.as_ref().map_or_else(
                    |e| e.to_string(),
                    |r| format!(
                        "{} {} {}",
                        r.succeeded,
                        r.header.revision,
                        shape(&r.responses)
                    )
                )
            ));
            self.after("txn", r)
        })
    }

    fn scan(&self, from: Bytes, end: Bytes, page_size: usize, revision: i64) -> Scan {
        let link = self.clone();
        Scan::with_range(
            move |req| {
                let link = link.clone();
                async move { Backend::range(&link, req).await }
            },
            from,
            end,
            page_size,
            revision,
        )
    }

    fn watch(
        &self,
        opts: WatchOptions,
    ) -> etcd::Result<(Box<dyn WatchHealth>, Box<dyn WatchEvents>)> {
        // Opened even on a cut link: a real client's watch opens and
        // connects later, and the model's has nothing to wait for.
        let w = self.client().watch(opts)?;
        let health = Health {
            member: w.member_id(),
        };
        Ok((Box::new(health), Box::new(Events(w))))
    }

    fn lease_grant(&self, id: LeaseId, ttl: Duration) -> BoxFuture<'_, etcd::Result<LeaseGrant>> {
        Box::pin(async move {
            self.before("grant").await?;
            let r = self.client().lease_grant_with_id(id, ttl).await;
            self.after("grant", r)
        })
    }

    fn lease_revoke(&self, id: LeaseId) -> BoxFuture<'_, etcd::Result<()>> {
        Box::pin(async move {
            self.before("revoke").await?;
            self.trace.note(format!("{} revoke {id:?}", self.name));
            let r = self.client().lease_revoke(id).await;
            self.after("revoke", r)
        })
    }

    fn lease_time_to_live(&self, id: LeaseId, keys: bool) -> BoxFuture<'_, etcd::Result<LeaseTtl>> {
        Box::pin(async move {
            self.before("ttl").await?;
            let r = self.client().lease_time_to_live(id, keys).await;
            self.after("ttl", r)
        })
    }

    fn keep_alive(
        &self,
        id: LeaseId,
        ttl: Duration,
    ) -> BoxFuture<'_, etcd::Result<Box<dyn Lease>>> {
        Box::pin(async move {
            let mut status = LeaseStatus::default();
            status.last_ok = Some(tokio::time::Instant::now());
            status.ttl = ttl;
            let (tx, rx) = watch::channel(status);
            let link = self.clone();
            let task = tokio::spawn(keep(link, id, ttl, tx));
            Ok(Box::new(Kept {
                id,
                rx,
                task: Mutex::new(Some(task)),
            }) as Box<dyn Lease>)
        })
    }

    fn endpoints(&self) -> Vec<String> {
        vec![self.name.clone()]
    }

    fn timeout(&self) -> Duration {
        TIMEOUT
    }
}

/// The keep-alive of one lease: every third of its TTL, as the client's
/// keeper does, through the link's faults.
async fn keep(link: Link, id: LeaseId, ttl: Duration, tx: watch::Sender<LeaseStatus>) {
    let every = Duration::from_millis(ttl.max(Duration::from_secs(1)).as_millis() as u64 / 3);
    loop {
        tokio::time::sleep(every).await;
        let answer = match link.before("keep-alive").await {
            Ok(()) => link.client().lease_keep_alive_once(id).await,
            Err(e) => Err(e),
        };
        let mut s = *tx.borrow();
        match answer {
            Ok(ttl) if !ttl.is_zero() => {
                s.last_ok = Some(tokio::time::Instant::now());
                s.ttl = ttl;
                s.successes += 1;
            }
            Ok(_) | Err(Error::LeaseNotFound) => {
                s.lost = true;
                link.trace.note(format!("{} lease {id:?} lost", link.name));
                tx.send_replace(s);
                return;
            }
            Err(_) => s.failures += 1,
        }
        if tx.send(s).is_err() {
            return;
        }
    }
}

/// A lease kept alive by [`keep`]; dropping it stops the keep-alive.
struct Kept {
    id: LeaseId,
    rx: watch::Receiver<LeaseStatus>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap().take() {
            t.abort();
        }
    }
}

impl Lease for Kept {
    fn id(&self) -> LeaseId {
        self.id
    }

    fn subscribe(&self) -> watch::Receiver<LeaseStatus> {
        self.rx.clone()
    }
}

struct Health {
    member: u64,
}

impl WatchHealth for Health {
    fn member_id(&self) -> Option<u64> {
        Some(self.member)
    }

    fn reconnects(&self) -> u64 {
        0
    }

    fn is_connected(&self) -> bool {
        true
    }
}

struct Events(model::Watcher);

impl WatchEvents for Events {
    fn next_response(&mut self) -> BoxFuture<'_, Option<etcd::Result<WatchResponse>>> {
        Box::pin(futures_util::StreamExt::next(&mut self.0))
    }

    fn next_buffered(&mut self) -> Option<etcd::Result<WatchResponse>> {
        self.0.next_buffered()
    }
}

/// What a txn's branch did, for the trace: `P` a put, `D<n>` a delete of n
/// keys, `R` a read, a nested txn's in brackets.
fn shape(responses: &[etcd::OpResponse]) -> String {
    responses
        .iter()
        .map(|r| match r {
            etcd::OpResponse::Put(_) => "P".to_string(),
            etcd::OpResponse::Delete(d) => format!("D{}", d.deleted),
            etcd::OpResponse::Txn(t) => format!("[{}]", shape(&t.responses)),
            _ => "R".to_string(),
        })
        .collect()
}
