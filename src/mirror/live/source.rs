//! Whether the source is still the store, and the history, the copy came
//! from: the first thing each freshness probe judges.
//!
//! - **The same store**: the source's cluster id is the one the copy came
//!   from, and so is the source id kept in it (a store wiped or rebuilt
//!   has another, or none).
//! - **Not gone back**: its revision is no lower than what the copy is
//!   applied through (a restore from an older snapshot).
//! - **The same history**, checked after the source watch reconnects. A
//!   store restored from a snapshot keeps its cluster id, its member ids
//!   and the source id key, and if the snapshot is of a timeline that an
//!   earlier restore abandoned, even its revision can be ahead of the
//!   copy's. The watch then resumes from the copy's revision into the
//!   other timeline's events, and nothing above tells the two apart: keys
//!   written in the abandoned timeline kept their values on the peer
//!   under fresh claims (the soak's find 12, docs/reliability.md).
//!
//!   A restart of etcd breaks the watch, so the check waits for that: the
//!   last put the watch delivered before the stream reconnected is the
//!   anchor, and the first probe after the reconnect reads that key at
//!   that revision. The same history answers with the same value,
//!   modified at that revision; any other answer (another value, another
//!   revision, the key absent, a revision the store has not reached) means
//!   another history. The key is read as it is now first, and only a key
//!   changed since is read at the anchor's revision: so an idle subtree,
//!   whose newest put may be compacted away, is still checked. A key
//!   changed since whose revision was compacted cannot be checked, and
//!   passes: a resume past the compaction fails on its own (and
//!   re-syncs), and the verification pass is the backstop. The anchor
//!   starts as the newest put a sync read.
//!
//! Any of these failing ends the session with `SourceChanged`, and the
//! next one re-syncs the copy in full.
//!
//! The source watch itself is opened here too ([`Opened`]).

use std::hash::{DefaultHasher, Hash, Hasher};

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use futures_util::future::BoxFuture;

use crate::error::Result;
use crate::etcd::{self, Event, EventKind, Header, KeyValue, Range, RangeResponse, WatchOptions};
use crate::mirror::send::writer::{FencedWriter, Marks};
use crate::store::{Store, WatchEvents, WatchHealth};

/// The anchor read again, and the stream's reconnects when it was (`None`:
/// nothing to check).
pub(super) type AnchorRead = Option<(etcd::Result<RangeResponse>, u64)>;

/// The last put the watch delivered: its key, revision and value's hash.
#[derive(Clone, Debug, PartialEq)]
struct Put {
    key: Bytes,
    revision: i64,
    value: u64,
}

impl Put {
    /// Whether `kv` is this put: the same value, modified at its revision.
    fn is(&self, kv: &KeyValue) -> bool {
        kv.mod_revision() == self.revision && hash(kv.value()) == self.value
    }
}

fn hash(value: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// The newest put a sync read (the highest modification revision).
#[derive(Debug, Default)]
pub(crate) struct Newest(Option<Put>);

impl Newest {
    pub(crate) fn offer(&mut self, kv: &KeyValue) {
        if self
            .0
            .as_ref()
            .is_none_or(|p| kv.mod_revision() > p.revision)
        {
            self.0 = Some(Put {
                key: kv.key().clone(),
                revision: kv.mod_revision(),
                value: hash(kv.value()),
            });
        }
    }
}

/// The anchor, and the watch stream's reconnects it was last checked at
/// (`None`: not on this stream). A peer's task keeps it across sessions:
/// a session that ends when the source's etcd restarts, and a next one
/// that resumes the copy, check the history the same way as a stream
/// that reconnected.
#[derive(Debug, Default)]
pub(crate) struct Continuity {
    anchor: Option<Put>,
    checked_at: Option<u64>,
    /// The newest put delivered while a check was owed, and the stream's
    /// reconnects then: the anchor once the check passes on that stream.
    /// Without it, puts that arrived before the check never anchored, and
    /// a restore onto a history that shares the older anchor passed.
    candidate: Option<(Put, u64)>,
}

impl Continuity {
    /// A sync made the copy from the source as it is now, whose newest
    /// put it read is `newest`: that anchors the history from here (a
    /// phase that delivers no put must still notice a restore).
    pub(crate) fn synced(&mut self, newest: Newest) {
        *self = Continuity {
            anchor: newest.0,
            checked_at: None,
            candidate: None,
        };
    }

    /// A live phase starts on a new stream that has reconnected
    /// `reconnects` times: an anchor left by an earlier phase is checked
    /// by the first probe.
    pub(super) fn start(&mut self, reconnects: u64) {
        self.checked_at = self.anchor.is_none().then_some(reconnects);
        self.candidate = None;
    }

    /// Events the watch delivered, the stream having reconnected
    /// `reconnects` times: the newest put becomes the anchor, unless the
    /// stream reconnected since the anchor was checked (these events may
    /// be another history's; the anchor stays until the check).
    pub(super) fn saw(&mut self, events: &[Event], reconnects: u64) {
        let newest = events
            .iter()
            .rev()
            .find(|e| e.kind == EventKind::Put)
            .map(|e| Put {
                key: e.kv.key().clone(),
                revision: e.revision(),
                value: hash(e.kv.value()),
            });
        if self.checked_at != Some(reconnects) && self.anchor.is_some() {
            if let Some(put) = newest {
                self.candidate = Some((put, reconnects));
            }
            return;
        }
        self.checked_at = Some(reconnects);
        if newest.is_some() {
            self.anchor = newest;
        }
    }

    /// The read a probe makes beside its own, the stream being at
    /// `reconnects`: the anchor at its revision, when the stream
    /// reconnected since it was checked.
    ///
    /// The key is read as it is now first: unchanged since the anchor's
    /// revision, it answers for that revision without reading history,
    /// which compaction may have removed (an idle subtree's newest put can
    /// be hours old). Only a key changed or deleted since is read at the
    /// anchor's revision.
    pub(super) fn read(&self, local: &Store, reconnects: u64) -> BoxFuture<'static, AnchorRead> {
        let read = self.pending(reconnects);
        let anchor = self.anchor.clone();
        let local = local.clone();
        Box::pin(async move {
            let (read, a) = (read?, anchor?);
            let now = local.range(Range::key(a.key.clone())).await;
            if let Ok(resp) = &now
                && resp.kvs().first().is_some_and(|kv| a.is(kv))
            {
                return Some((now, reconnects));
            }
            Some((local.range(read).await, reconnects))
        })
    }

    fn pending(&self, reconnects: u64) -> Option<Range> {
        let a = self
            .anchor
            .as_ref()
            .filter(|_| self.checked_at != Some(reconnects))?;
        Some(Range::key(a.key.clone()).revision(a.revision))
    }

    /// Judges what a probe read of the source (module docs): its header
    /// `now`, its source id `id` (`None`: the key is gone) and the anchor
    /// read again, the copy applied through `applied` when the probe was
    /// sent. `SourceChanged` when the source is not the store or the
    /// history the copy came from, as `w` knows it.
    pub(super) fn judge(
        &mut self,
        w: &FencedWriter,
        now: &Header,
        applied: i64,
        id: Option<u64>,
        anchor: AnchorRead,
    ) -> crate::error::Result<()> {
        self.judged(&w.marks, now, applied, id, anchor)
            .map_err(|why| crate::error::Error::SourceChanged {
                peer: w.region.clone(),
                why,
            })
    }

    fn judged(
        &mut self,
        marks: &Marks,
        now: &Header,
        applied: i64,
        seen_id: Option<u64>,
        anchor: AnchorRead,
    ) -> Result<(), String> {
        let known = marks.source_cluster.load(Relaxed);
        if (known != 0 && now.cluster_id != known) || now.revision < applied {
            return Err(format!(
                "cluster {:016x} at revision {}, the copy came from {known:016x} and is applied through {applied}",
                now.cluster_id, now.revision
            ));
        }
        if let Some((got, reconnects)) = anchor {
            self.history(got, reconnects)?;
        }
        let id = marks.source_id.load(Relaxed);
        match seen_id {
            _ if id == 0 => Ok(()),
            Some(now) if now == id => Ok(()),
            Some(now) => Err(format!(
                "source id is {now:016x}, the copy came from {id:016x}"
            )),
            None => Err(format!(
                "the source id key is gone (the copy came from {id:016x}): the store was wiped or restored"
            )),
        }
    }

    /// Judges the anchor as read again (the stream then at `reconnects`):
    /// `Err` with why, when the history is another.
    fn history(&mut self, got: etcd::Result<RangeResponse>, reconnects: u64) -> Result<(), String> {
        let Some(a) = self.anchor.as_ref() else {
            return Ok(());
        };
        let at = format!(
            "{} at revision {}",
            String::from_utf8_lossy(&a.key),
            a.revision
        );
        let resp = match got {
            Ok(resp) => resp,
            Err(etcd::Error::Compacted { .. }) => {
                // Changed since, and its revision compacted: this history
                // cannot be checked here. Passed, not re-synced: a resume
                // past the compaction fails on its own, and the
                // verification pass is the backstop.
                tracing::info!(anchor = %at, "the source's history could not be checked (compacted); the verification pass is the backstop");
                self.passed(reconnects);
                return Ok(());
            }
            Err(etcd::Error::FutureRevision) => {
                return Err(format!(
                    "the source watch reconnected to a store that has not reached {at}, the last put it delivered: it was restored from a snapshot"
                ));
            }
            Err(e) => return Err(format!("the source's history could not be read: {e}")),
        };
        let same = resp.kvs().first().is_some_and(|kv| a.is(kv));
        if !same {
            return Err(format!(
                "the source watch reconnected to a store whose {at} is not the put it delivered: it was restored from a snapshot of another history"
            ));
        }
        self.passed(reconnects);
        Ok(())
    }

    /// The check on the stream at `reconnects` is done: a put that stream
    /// delivered meanwhile is the anchor from now on.
    fn passed(&mut self, reconnects: u64) {
        self.checked_at = Some(reconnects);
        if let Some((put, at)) = self.candidate.take()
            && at == reconnects
        {
            self.anchor = Some(put);
        }
    }
}

/// The source watch a live phase reads, from revision `from`: opened
/// already (before a sync), or to be opened when the phase starts.
pub(crate) struct Opened {
    pub(crate) from: i64,
    pub(super) watch: Option<(Box<dyn WatchHealth>, Box<dyn WatchEvents>)>,
}

impl Opened {
    pub(crate) fn later(from: i64) -> Opened {
        Opened { from, watch: None }
    }

    pub(crate) fn now(local: &Store, prefix: &Bytes, from: i64) -> Result<Opened> {
        Ok(Opened {
            from,
            watch: Some(open_watch(local, prefix, from)?),
        })
    }
}

/// A watch stream of the session's own (a slow peer holds back only its
/// own watch), watching the subtree from `from`. progress_notify: an idle
/// subtree still advances the state revision when the local etcd sends
/// per-watcher notices.
pub(super) fn open_watch(
    local: &Store,
    prefix: &Bytes,
    from: i64,
) -> Result<(Box<dyn WatchHealth>, Box<dyn WatchEvents>)> {
    Ok(local.watch(
        WatchOptions::prefix(prefix.clone())
            .start_revision(from)
            .progress_notify(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use aether_etcd::model::{Cluster, ModelConfig};

    use crate::etcd::{Put as PutReq, WatchOptions};

    /// The events of one store's history, as the watch delivers them.
    async fn events(c: &aether_etcd::model::Client, from: i64) -> Vec<Event> {
        let mut w = c
            .watch(WatchOptions::prefix("k").start_revision(from))
            .unwrap();
        let resp = futures_util::StreamExt::next(&mut w)
            .await
            .unwrap()
            .unwrap();
        resp.events
    }

    #[tokio::test]
    async fn the_same_history_passes_and_another_fails() {
        let same = Cluster::new(ModelConfig::default()).client(0);
        for v in ["a", "b", "c"] {
            same.put(PutReq::new("k1", v)).await.unwrap();
        }
        let mut c = Continuity::default();
        c.start(0);
        c.saw(&events(&same, 1).await, 0);
        assert!(
            c.pending(0).is_none(),
            "nothing to check before a reconnect"
        );
        // Reconnected: events from the new stream do not move the anchor
        // until it is checked on that stream; then the newest does.
        let read = c.pending(1).expect("a check after a reconnect");
        same.put(PutReq::new("k1", "d")).await.unwrap();
        c.saw(&events(&same, 4).await, 1);
        assert!(c.pending(1).is_some(), "the anchor waits for its check");
        c.history(same.range(read).await, 1).unwrap();
        assert!(c.pending(1).is_none(), "checked");
        assert_eq!(
            c.anchor.as_ref().map(|a| a.revision),
            Some(5),
            "the put seen meanwhile"
        );

        // Another history at the same revisions: same key, other values.
        let other = Cluster::new(ModelConfig::default()).client(0);
        for v in ["a", "b", "c", "x"] {
            other.put(PutReq::new("k1", v)).await.unwrap();
        }
        let read = c.pending(2).unwrap();
        let why = c.history(other.range(read).await, 2).unwrap_err();
        assert!(why.contains("another history"), "{why}");
        // A store that has not reached the anchor's revision.
        let short = Cluster::new(ModelConfig::default()).client(0);
        short.put(PutReq::new("k1", "a")).await.unwrap();
        let read = c.pending(2).unwrap();
        let why = c.history(short.range(read).await, 2).unwrap_err();
        assert!(why.contains("has not reached"), "{why}");

        // A next phase, on a new stream, checks the anchor first; after a
        // sync there is nothing to check.
        c.start(0);
        assert!(c.pending(0).is_some(), "a resumed phase checks first");
        c.synced(Newest::default());
        c.start(0);
        assert!(
            c.pending(0).is_none(),
            "nothing to check after an empty sync"
        );
        let mut newest = Newest::default();
        for kv in same.range(Range::prefix("k")).await.unwrap().kvs() {
            newest.offer(kv);
        }
        c.synced(newest);
        c.start(0);
        let read = c.pending(0).expect("after a sync, its newest put");
        c.history(same.range(read).await, 0).unwrap();
    }

    /// An idle subtree's newest put, compacted away: the key as it is now
    /// answers for it. Changed since and compacted, it cannot be checked,
    /// and passes (module docs).
    #[tokio::test]
    async fn a_compacted_anchor_is_checked_by_the_key_as_it_is_now() {
        let m = Cluster::new(ModelConfig::default()).client(0);
        m.put(PutReq::new("k1", "a")).await.unwrap();
        let mut c = Continuity::default();
        c.start(0);
        c.saw(&events(&m, 1).await, 0);
        let other = m.put(PutReq::new("other", "x")).await.unwrap();
        m.compact(other.header.revision, false).await.unwrap();
        let store = Store::new(m.clone());
        let (got, at) = c.read(&store, 1).await.expect("a check after a reconnect");
        c.history(got, at).unwrap();

        let changed = m.put(PutReq::new("k1", "b")).await.unwrap();
        m.compact(changed.header.revision, false).await.unwrap();
        let (got, at) = c.read(&store, 2).await.expect("a check after a reconnect");
        assert!(matches!(got, Err(etcd::Error::Compacted { .. })), "{got:?}");
        c.history(got, at).unwrap();
    }
}
