//! The freshness probe's reads, and what the live loop checks in them.
//!
//! Every heartbeat (on the engine's ticks, `live/tick.rs`) a probe reads
//! the source's revision, shared with the engine's other probes of the
//! tick, and, when nothing else has vouched for it since the last probe,
//! the peer's state key; at a session's start and as the backstop, both
//! stores' key counts (`count.rs`). What it read goes to
//! [`Freshness`](super::fresh::Freshness), which alone decides whether
//! the copy is current.

use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::{Live, fresh, source};
use crate::error::{Error, Result};
use crate::etcd::{self, Header};
use crate::mirror::count;
use crate::mirror::state::{self, Stored};

/// What a probe read: the source's header, the peer's state key and header,
/// and the floor the peer's revision must not be below.
pub(super) struct ProbeRead {
    sent: fresh::Sent,
    /// The boundaries the counts were split at, and the source's count of
    /// each piece (`None` with `source_count`).
    bounds: Vec<Bytes>,
    source_pieces: Option<Vec<i64>>,
    source: Header,
    /// The source's own id as it reads now (`None`: the key is gone).
    source_id: Option<u64>,
    /// The source's key count at `applied` (`None`: compacted, or nothing
    /// applied yet).
    source_count: Option<i64>,
    /// The peer's state key and the header it was read with (`None`: not
    /// read, see [`Live::probe_read`]).
    peer: Option<(Stored, Header)>,
    /// The copy's key count on the peer, read with the state key (`None`:
    /// this probe did not count, see [`count::Cadence`]).
    peer_count: Option<i64>,
    floor: i64,
    /// The watermark when the probe was sent, before the source was read:
    /// a source revision below it means the source went back.
    applied: i64,
    /// The watch's last put before it reconnected, read again.
    anchor: source::AnchorRead,
}

impl<'a> Live<'a> {
    /// Reads the source's revision and the peer's state key, for identity
    /// and freshness.
    ///
    /// The peer is read only when the probe counts the copy, or when no
    /// txn of ours was answered since the last probe went out. Otherwise
    /// that answer already checked what the read would: the fence held
    /// (the claim is ours), the peer is the same cluster, and its revision
    /// had not gone below one a txn of ours committed at (the pipeline
    /// checks each answer against the mark when it was sent). At rest a
    /// copy's heartbeat is such a txn every heartbeat, so a settled mesh
    /// reads its peers only to count them: per copy and heartbeat one txn
    /// instead of a txn and a read, on etcds where each costs about the
    /// same (`live/tick.rs`). Rule 4 of `live/fresh.rs` then has no peer
    /// revision after the probe to bound the unjudged events by, and
    /// takes any as holding the probe.
    pub(super) fn probe_read(&mut self) -> BoxFuture<'a, etcd::Result<ProbeRead>> {
        self.fresh.watched(self.positions());
        let sent = self.fresh.send(
            Instant::now(),
            self.health.reconnects(),
            self.ops_before
                .front()
                .map_or(self.launched_ops, |l| l.before),
            self.settled_ahead.above(self.inflight.watermark()),
        );
        // A txn answered since the last probe vouched for the peer.
        let vouched = std::mem::take(&mut self.answered_since_probe);
        let floor = self.writer.peer_revision();
        // Read before the source is: the source's revision can be no lower.
        // The watermark as it is when the read completes is no bound at
        // all: the stream goes on applying while the peer is read.
        let applied = self.inflight.watermark();
        let local = self.local;
        let prefix = self.prefix.clone();
        let ticks = self.ticks;
        let anchor = self.continuity.read(local, self.health.reconnects());
        let writer = self.writer;
        // Counted in pieces, never in one walk of the whole subtree: etcd
        // holds every write behind a count's index walk (src/mirror/count.rs).
        let bounds = self.splits.snapshot();
        let max_ops = self.pipeline.limits().max_ops;
        let counting = sent.counting;
        // At rest the source's subtree is as the last count found it.
        let reused = self
            .source_count
            .as_ref()
            .filter(|_| counting)
            .and_then(|c| c.reuse(&bounds, applied, self.last_change));
        Box::pin(async move {
            // The source's id and revision, and its key count at the
            // watermark, side by side; then the peer's state key and key
            // count at one revision.
            let counted = async {
                if applied <= 0 || !counting {
                    return Ok(None);
                }
                if let Some(each) = reused {
                    return Ok(Some(each));
                }
                match count::count_at(local, &prefix, &bounds, applied, max_ops).await {
                    Ok(each) => Ok(Some(each)),
                    Err(etcd::Error::Compacted { .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            };
            let (id, source_pieces, anchor) = tokio::join!(ticks.read(), counted, anchor);
            let id = id?;
            let source_pieces = source_pieces?;
            let source_count = source_pieces.as_ref().map(|each| each.iter().sum());
            let source_id = id.kvs().first().and_then(|kv| state::parse_id(kv.value()));
            let source = id.header;
            let (peer, peer_count) = if counting {
                let (stored, peer, n, _) = count::read_state_with_count(
                    &writer.client,
                    &writer.state_key,
                    &prefix,
                    &bounds,
                    max_ops,
                )
                .await?;
                (Some((stored, peer)), Some(n))
            } else if !vouched {
                let read = count::read_state(&writer.client, &writer.state_key).await?;
                (Some(read), None)
            } else {
                (None, None)
            };
            Ok(ProbeRead {
                bounds,
                source_pieces,
                sent,
                source,
                source_id,
                source_count,
                peer,
                peer_count,
                floor,
                applied,
                anchor,
            })
        })
    }

    /// Checks what a probe read: both stores are still the ones the copy
    /// belongs to, and this engine still holds the peer.
    pub(super) fn probed(&mut self, read: ProbeRead) -> Result<()> {
        let w = self.writer;
        let (now, id) = (&read.source, read.source_id);
        (self.continuity).judge(w, now, read.applied, id, read.anchor)?;
        if let Some((stored, peer)) = &read.peer {
            w.check_peer_read(peer, read.floor)?;
            if stored.create_revision != w.fence {
                return Err(w.lost_claim(stored));
            }
        }
        if let Some(each) = &read.source_pieces {
            w.stats.count_pieces.store(each.len() as u64, Relaxed);
            self.splits.counted(&read.bounds, each);
            self.source_count =
                count::SourceCount::new(read.applied, read.bounds.clone(), each.clone());
        }
        if read.peer_count.is_some() {
            w.stats.copy_counts.fetch_add(1, Relaxed);
        }
        let fresh = fresh::Read {
            source_revision: read.source.revision,
            source_member: read.source.member_id,
            peer_revision: read.peer.as_ref().map_or(i64::MAX, |(_, h)| h.revision),
            applied: read.applied,
            counts: read.source_count.zip(read.peer_count),
            oversized: w.oversized_count() as i64,
            launched_ops: self.launched_ops,
        };
        self.fresh
            .probed(read.sent, fresh)
            .map_err(|why| Error::CopyChanged {
                peer: w.region.clone(),
                why,
            })
    }
}
