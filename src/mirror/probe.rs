//! The freshness probe: every heartbeat the live loop reads both stores,
//! and this module judges what came back.
//!
//! - **Identity**: the source's cluster id and its own id (kept in the
//!   source etcd), its revision against the watermark (a source that went
//!   back), the peer's header against the revisions our txns committed at
//!   (a peer restored), and our claim on the state key.
//! - **The key count**: the copy's keys on the peer against the source's at
//!   the watermark, allowing for the ops in flight and the values too large
//!   for the peer. A copy emptied or grown out of band is not current.
//! - **Currency**: the peer is current as of the probe once everything the
//!   source held then is applied, or, for an idle subtree, once the watch
//!   has stayed quiet with nothing pending. Staleness and the heartbeat in
//!   the state key move only here.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use super::live::Live;
use super::state::{self, Stored};
use super::stats::unix_ms;
use crate::error::{Error, Result};
use crate::etcd::{self, Header, Range};

/// A freshness probe that came back: the source's revision at `at`.
#[derive(Clone, Copy)]
pub(super) struct Probe {
    source_revision: i64,
    pub(super) at: Instant,
    at_unix_ms: i64,
    /// Watch messages received when the probe was sent.
    received: u64,
    /// Ops of the txns not yet under the watermark when it was sent:
    /// what the peer may hold beyond the watermark, with what is sent
    /// until it comes back.
    unsettled_from: u64,
    /// The quiet period after it has passed without making it current:
    /// only the watermark can still resolve it, and the next probe may
    /// replace it.
    pub(super) quiet_done: bool,
}

/// What a probe read: the source's header, the peer's state key and header,
/// and the floor the peer's revision must not be below.
pub(super) struct ProbeRead {
    sent: Probe,
    source: Header,
    /// The source's own id as it reads now (`None`: the key is gone).
    source_id: Option<u64>,
    /// The source's key count at `applied` (`None`: compacted, or nothing
    /// applied yet).
    source_count: Option<i64>,
    stored: Stored,
    peer: Header,
    /// The copy's key count on the peer, read with the state key.
    peer_count: i64,
    floor: i64,
    /// The watermark when the probe was sent, before the source was read:
    /// a source revision below it means the source went back.
    applied: i64,
}

/// How long the watch must stay quiet, with nothing pending, after a probe
/// read the source's revision, before the engine takes it that no event in
/// the subtree lies between what it applied and that revision. etcd hands
/// a caught-up watcher its events as they commit, and a catching-up one
/// every ~100 ms, so ten of those cycles of silence are a wide margin.
pub(super) const QUIET: Duration = Duration::from_secs(1);

impl<'a> Live<'a> {
    /// Reads the source's revision and the peer's state key, for identity
    /// and freshness.
    pub(super) fn probe_read(&self) -> BoxFuture<'a, etcd::Result<ProbeRead>> {
        let sent = Probe {
            source_revision: 0,
            at: Instant::now(),
            at_unix_ms: unix_ms(),
            received: self.received,
            unsettled_from: self
                .ops_before
                .front()
                .map_or(self.launched_ops, |&(_, before)| before),
            quiet_done: false,
        };
        let floor = self.writer.peer_revision();
        // Read before the source is: the source's revision can be no lower.
        // The watermark as it is when the read completes is no bound at
        // all: the stream goes on applying while the peer is read.
        let applied = self.window.watermark();
        let local = self.local;
        let prefix = self.prefix.clone();
        let id_key = self.source_id_key.clone();
        let writer = self.writer;
        Box::pin(async move {
            // The source's id and revision, and its key count at the
            // watermark, side by side; then the peer's state key and key
            // count in one txn.
            let counted = async {
                if applied <= 0 {
                    return Ok(None);
                }
                match local
                    .range(Range::prefix(prefix.clone()).count_only().revision(applied))
                    .await
                {
                    Ok(r) => Ok(Some(r.count)),
                    Err(etcd::Error::Compacted { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            };
            let (id, source_count) = tokio::join!(local.range(Range::key(id_key)), counted);
            let id = id?;
            let source_count = source_count?;
            let source_id = id.kvs().first().and_then(|kv| state::parse_id(kv.value()));
            let source = id.header;
            let (stored, peer, peer_count) =
                state::read_with_count(&writer.client, &writer.state_key, &prefix).await?;
            Ok(ProbeRead {
                sent: Probe {
                    source_revision: source.revision,
                    ..sent
                },
                source,
                source_id,
                source_count,
                stored,
                peer,
                peer_count,
                floor,
                applied,
            })
        })
    }

    /// Checks what a probe read: both stores are still the ones the copy
    /// belongs to, and this engine still holds the peer.
    pub(super) fn probed(&mut self, read: ProbeRead) -> Result<()> {
        let w = self.writer;
        let known = w.marks.source_cluster.load(Relaxed);
        let went_back = read.source.revision < read.applied;
        if (known != 0 && read.source.cluster_id != known) || went_back {
            return Err(Error::SourceChanged {
                peer: w.region.clone(),
                why: format!(
                    "cluster {:016x} at revision {}, the copy came from {known:016x} and is applied through {}",
                    read.source.cluster_id, read.source.revision, read.applied
                ),
            });
        }
        let id = w.marks.source_id.load(Relaxed);
        if id != 0 && read.source_id != Some(id) {
            return Err(Error::SourceChanged {
                peer: w.region.clone(),
                why: match read.source_id {
                    Some(now) => format!("source id is {now:016x}, the copy came from {id:016x}"),
                    None => format!(
                        "the source id key is gone (the copy came from {id:016x}): the store was wiped or restored"
                    ),
                },
            });
        }
        w.check_peer_read(&read.peer, read.floor)?;
        if read.stored.create_revision != w.fence {
            return Err(w.lost_claim(&read.stored));
        }
        self.check_count(&read)?;
        // A pending probe keeps its place until its quiet period is over,
        // or a busy stream would never have one.
        if self.probe.is_none_or(|p| p.quiet_done) {
            self.probe = Some(read.sent);
        }
        Ok(())
    }

    /// Compares the copy's key count on the peer with the source's at the
    /// watermark: a copy emptied or grown out of band (`del --prefix`, a
    /// revoked lease, keys written by hand) must not read as current. The
    /// txns in flight, and those sent while the probe was out, may have
    /// moved the peer by at most their ops; keys too large for the peer are
    /// absent there by design.
    pub(super) fn check_count(&self, read: &ProbeRead) -> Result<()> {
        let Some(source) = read
            .source_count
            .filter(|_| read.applied >= self.replay_horizon)
        else {
            return Ok(());
        };
        let oversized = self.writer.oversized_count() as i64;
        let expected = source - oversized;
        let mut slack = self.launched_ops.saturating_sub(read.sent.unsettled_from) as i64;
        if self.batcher.split_revisions > 0 {
            // A revision split over several txns: pieces under the
            // watermark may hold part of the next one.
            slack += self.pipeline.limits().max_ops as i64;
        }
        if (read.peer_count - expected).abs() <= slack {
            return Ok(());
        }
        Err(Error::CopyChanged {
            peer: self.writer.region.clone(),
            why: format!(
                "it holds {} keys, the source held {source} at revision {} ({oversized} of them too large for the peer, {slack} ops in flight)",
                read.peer_count, read.applied
            ),
        })
    }

    /// Marks the peer current as of the pending probe when everything the
    /// source held then is applied, or the watch has been quiet since with
    /// nothing pending (an idle subtree: nothing to apply).
    pub(super) fn check_current(&mut self) {
        let Some(p) = self.probe else { return };
        let applied = self.window.watermark() >= p.source_revision;
        let idle = self.batcher.is_idle()
            && self.window.is_empty()
            && self.received == p.received
            && self.ws.is_connected()
            && p.at.elapsed() >= QUIET;
        if !applied && !idle {
            return;
        }
        if !applied {
            // Nothing in the subtree changed through that revision: resume
            // from there (this moves an idle subtree's state revision on
            // etcd 3.4, which sends no progress notices by default).
            // Known gap: the probe's revision may come from another member
            // than the watch's; a watch on a member that lags by over the
            // quiet period could still deliver events below it.
            self.window.advance_idle(p.source_revision);
        }
        self.probe = None;
        let w = self.writer;
        w.stats.mark_current(p.at, p.at_unix_ms);
        w.marks.heartbeat_unix_ms.fetch_max(p.at_unix_ms, Relaxed);
        self.heartbeat_dirty = true;
    }
}
