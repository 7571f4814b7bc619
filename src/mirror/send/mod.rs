//! The send pipeline: the one path every data txn to a peer takes, for the
//! range-diff sync ([`super::sync`]) and the live loop ([`super::live`]).
//!
//! It owns the txns in flight and their bytes, asks the adaptive window
//! ([`self::pacer`]) for room, sends each txn fenced ([`self::writer`]),
//! and books what comes back: the peer's identity, the pacer's round trip
//! and rate samples, the stats, and refusals for size, which are re-sent in
//! pieces while the discovered limits ([`self::limits`]) come down to the
//! peer's. Callers only decide *what* goes: they pack with
//! [`Pipeline::limits`], send when [`Pipeline::has_room`], and get back the
//! tag they sent each txn with, in completion order.
//!
//! What was learnt about the link, the window and the limits, lives in a
//! [`Link`] that outlives sessions; the txns in flight belong to one phase.

pub(crate) mod limits;
pub(crate) mod own;
pub(crate) mod pacer;
pub(crate) mod writer;

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use tokio::time::Instant;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};

use self::limits::{Limits, Prober, Refusal};
use self::pacer::Pacer;
use self::writer::FencedWriter;
use super::stats::ErrorKind;
use crate::error::{Error, Result};
use crate::etcd::{self, Delete, Op, TxnBatcher, TxnLimits, TxnResponse};

/// What one peer's pipelines learn about its link, kept across sessions:
/// the adaptive window and the discovered txn limits.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) pacer: Pacer,
    pub(crate) limits: Limits,
}

/// One txn in flight, and then its outcome.
pub(crate) struct Done<T> {
    tag: T,
    ops: Vec<Op>,
    /// Encoded bytes of `ops`: what the window counts.
    bytes: usize,
    /// The txn's largest branch and its encoded size: what the limits count.
    branch: usize,
    size: usize,
    sent: Instant,
    /// The highest revision a txn of ours had committed at when this one
    /// was sent: its answer can be no lower.
    floor: i64,
    result: etcd::Result<TxnResponse>,
}

/// The txns in flight to one peer in one phase of a session, each carrying
/// a caller's tag of type `T`.
pub(crate) struct Pipeline<'a, T> {
    writer: &'a FencedWriter,
    link: &'a mut Link,
    txns: FuturesUnordered<BoxFuture<'static, Done<T>>>,
    bytes: usize,
}

impl<'a, T: Send + 'static> Pipeline<'a, T> {
    pub(crate) fn new(writer: &'a FencedWriter, link: &'a mut Link) -> Self {
        Pipeline {
            writer,
            link,
            txns: FuturesUnordered::new(),
            bytes: 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.txns.is_empty()
    }

    /// The peer's txn limits as known now: pack for these.
    pub(crate) fn limits(&self) -> TxnLimits {
        self.link.limits.current()
    }

    /// The window's size in txns now.
    pub(crate) fn window_txns(&self) -> usize {
        self.link.pacer.window_txns()
    }

    /// What was learnt about the link, for the live loop's re-probe.
    pub(crate) fn link(&mut self) -> &mut Link {
        self.link
    }

    /// A prober of the peer's limits, on the state key.
    pub(crate) fn prober(&self) -> Prober {
        Prober::new(self.writer.client.clone(), self.writer.state_key.clone())
    }

    /// Whether the window has room for a txn of `bytes` more now (one txn
    /// may always go, however large).
    pub(crate) fn has_room(&mut self, bytes: usize) -> bool {
        self.link.pacer.allows(self.txns.len(), self.bytes, bytes)
    }

    /// Puts a fenced txn of `ops` on its way (with the state put recording
    /// `state_revision`, if any); its outcome comes back, with `tag`, from
    /// [`Pipeline::next`] or [`Pipeline::ready`].
    pub(crate) fn send(&mut self, ops: Vec<Op>, state_revision: Option<i64>, tag: T) {
        let bytes: usize = ops.iter().map(Op::encoded_len).sum();
        self.link.pacer.on_send(Instant::now(), self.txns.len());
        // Its keys are no longer known too large for the peer from the
        // moment it leaves, not when it is answered: an answer lost (a
        // timeout, a session ended mid-call) may hide a commit of a value
        // that fits, and a key left marked would then be skipped by every
        // repair and pass as "absent by design" while the peer lacks it
        // (the simulation found a copy claimed fresh that way). A txn
        // refused for its size marks its keys again (`Pipeline::resend`).
        self.writer.took(&ops);
        let txn = self.writer.txn(ops.clone(), state_revision);
        let (branch, size) = (txn.success_len().max(txn.compare_len()), txn.encoded_len());
        let (client, own) = (self.writer.client.clone(), self.writer.own.clone());
        self.bytes += bytes;
        let sent = Instant::now();
        let floor = self.writer.peer_revision();
        self.txns.push(Box::pin(async move {
            let result = own.send(&client, txn).await;
            Done {
                tag,
                ops,
                bytes,
                branch,
                size,
                sent,
                floor,
                result,
            }
        }));
    }

    /// The next txn to finish, in any order; `None` when none is in flight.
    pub(crate) async fn next(&mut self) -> Option<Done<T>> {
        self.txns.next().await
    }

    /// A txn that has already finished, if any. Polling the set also puts
    /// the txns just sent on the wire: a future in a `FuturesUnordered` is
    /// first polled when the set is, so a caller that packs many txns
    /// before it waits calls this after each send.
    pub(crate) fn ready(&mut self) -> Option<Done<T>> {
        self.txns.next().now_or_never().flatten()
    }

    /// Books a finished txn: a failed fence or a lost lease is an error; a
    /// txn the peer refused for its size is re-sent in pieces within the
    /// limits found by the search it starts (a single value too large for
    /// the peer is deleted there instead, never left at an older value,
    /// and counted); anything else ends the session. Returns the tag.
    pub(crate) async fn settle(&mut self, done: Done<T>) -> Result<T> {
        self.bytes = self.bytes.saturating_sub(done.bytes);
        let now = Instant::now();
        match done.result {
            Ok(resp) => {
                self.accepted(&resp, done.floor, done.branch, done.size)?;
                self.writer.took(&done.ops);
                let (ops, bytes) = (done.ops.len() as u64, done.bytes as u64);
                if self.link.pacer.on_ack(now, now - done.sent, ops, bytes) {
                    self.link.pacer.publish(&self.writer.stats);
                }
            }
            Err(e) => {
                // A refusal for size says nothing about the link; any other
                // failure does.
                if let Err(e) = self.resend(done.ops, e, done.branch, done.size).await {
                    self.link.pacer.on_error(now);
                    self.link.pacer.publish(&self.writer.stats);
                    return Err(e);
                }
            }
        }
        let stats = &self.writer.stats;
        stats.up.store(true, Relaxed);
        stats.txns.fetch_add(1, Relaxed);
        Ok(done.tag)
    }

    /// Books a txn the peer answered: its compares held (else why not),
    /// and the peer is the store it was: a write commits above every
    /// revision answered before it was sent (`floor`), and a txn that
    /// changed nothing no lower, so an answer short of that is a peer
    /// restored from an older snapshot. The live loop's probe
    /// relies on this check instead of reading the peer itself
    /// (`live/probe.rs`, `Live::probe_read`).
    fn accepted(
        &mut self,
        resp: &TxnResponse,
        floor: i64,
        branch: usize,
        size: usize,
    ) -> Result<()> {
        if !resp.succeeded {
            return Err(self.writer.fence_failure(resp));
        }
        if own::committed(resp).is_some() {
            // A write commits at a revision of its own, above every one
            // answered before it was sent. A peer restored to just below
            // the floor answers our next write *at* it: under load, with
            // a burst mirrored in one txn, that was all a restore moved,
            // and the copy read current while it held the snapshot.
            self.writer.check_peer_write(&resp.header, floor)?;
        } else {
            // A txn that changed nothing answers with the store's
            // revision, which may be the floor itself.
            self.writer.check_peer_read(&resp.header, floor)?;
        }
        self.link.limits.accepted(branch, size);
        Ok(())
    }

    /// Handles a failed txn of `ops` (largest branch `branch`, `size`
    /// bytes): re-sends it in pieces while the peer refuses it for its
    /// size, one piece at a time (refusals are rare: a peer with lower
    /// limits than configured, found once; a value too large for it).
    async fn resend(
        &mut self,
        ops: Vec<Op>,
        err: etcd::Error,
        branch: usize,
        size: usize,
    ) -> Result<()> {
        let w = self.writer;
        // Pieces to send, each with the key it stands in for when it is
        // the delete that replaces a value too large for the peer.
        let mut queue: VecDeque<(Vec<Op>, Option<Bytes>)> = VecDeque::new();
        let mut failed = Some((ops, err, branch, size));
        loop {
            let (ops, err, branch, size) = match failed.take() {
                Some(f) => f,
                None => {
                    let Some((ops, replaces)) = queue.pop_front() else {
                        return Ok(());
                    };
                    let txn = w.txn(ops.clone(), None);
                    let (branch, size) = (txn.success_len(), txn.encoded_len());
                    let floor = w.peer_revision();
                    match w.own.send(&w.client, txn).await {
                        Ok(resp) => {
                            self.accepted(&resp, floor, branch, size)?;
                            w.took(&ops);
                            if let Some(key) = replaces {
                                w.mark_oversized(key);
                            }
                            continue;
                        }
                        Err(e) => (ops, e, branch, size),
                    }
                }
            };
            let refusal = match err {
                etcd::Error::TooManyOps if ops.len() > 1 => {
                    w.stats.error(ErrorKind::TooManyOps);
                    Refusal::Ops(branch)
                }
                etcd::Error::RequestTooLarge if ops.len() > 1 => Refusal::Bytes(size),
                etcd::Error::RequestTooLarge => {
                    w.stats.error(ErrorKind::TooLarge);
                    match ops[0].key().cloned() {
                        Some(key) => {
                            tracing::error!(
                                peer = %w.region,
                                key = %String::from_utf8_lossy(&key),
                                "value exceeds the peer's request size limit; deleted on the peer instead of leaving an older value"
                            );
                            queue.push_front((vec![Delete::key(key.clone()).into()], Some(key)));
                        }
                        None => {
                            // A repair's guarded write (a nested txn) of a
                            // value not yet known to be too large: leaving
                            // the key as it is would keep what the repair
                            // was for, so the session ends and a re-sync,
                            // which knows what to do with such values,
                            // compares the copy.
                            return Err(Error::CopyChanged {
                                peer: w.region.clone(),
                                why: "a repair's write exceeds the peer's request size limit"
                                    .into(),
                            });
                        }
                    }
                    continue;
                }
                etcd::Error::NoSpace => {
                    w.stats.error(ErrorKind::NoSpace);
                    return Err(Error::Etcd(etcd::Error::NoSpace));
                }
                e => return Err(w.txn_error(e)),
            };
            let prober = self.prober();
            if self.link.limits.refused(refusal, &prober).await? {
                let limits = self.link.limits.current();
                self.link.limits.publish(&w.stats);
                tracing::warn!(peer = %w.region, ?refusal, max_txn_ops = limits.max_ops, max_request_bytes = limits.max_bytes, "the peer refused a txn for its size; found its limits");
            }
            for piece in split(ops, self.link.limits.current()).into_iter().rev() {
                queue.push_front((piece, None));
            }
        }
    }
}

/// `ops` (distinct keys, in order) in pieces that fit `limits` as a txn of
/// their own (the fence compare only; no state put).
fn split(ops: Vec<Op>, limits: TxnLimits) -> Vec<Vec<Op>> {
    let mut packer = TxnBatcher::new(limits);
    let n = ops.len();
    for op in ops {
        packer.push(op);
    }
    packer.flush();
    let mut pieces: Vec<Vec<Op>> = std::iter::from_fn(|| packer.pop()).collect();
    if pieces.len() == 1 && n > 1 {
        // Within the limits as known, yet refused: halve, so the re-send
        // cannot repeat the refusal for ever.
        let mut whole = pieces.pop().unwrap_or_default();
        let rest = whole.split_off(n.div_ceil(2));
        pieces = vec![whole, rest];
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(pieces: &[Vec<Op>]) -> Vec<Vec<String>> {
        pieces
            .iter()
            .map(|c| {
                c.iter()
                    .map(|o| String::from_utf8_lossy(o.key().unwrap()).into_owned())
                    .collect()
            })
            .collect()
    }

    fn deletes(n: usize) -> Vec<Op> {
        (0..n)
            .map(|i| Delete::key(format!("k{i}")).into())
            .collect()
    }

    #[test]
    fn split_keeps_the_order_within_the_limits() {
        let limits = TxnLimits {
            max_ops: 3,
            ..TxnLimits::default()
        };
        assert_eq!(
            keys(&split(deletes(7), limits)),
            [vec!["k0", "k1", "k2"], vec!["k3", "k4", "k5"], vec!["k6"]]
        );
    }

    #[test]
    fn split_halves_what_already_fits() {
        assert_eq!(
            keys(&split(deletes(3), TxnLimits::default())),
            [vec!["k0", "k1"], vec!["k2"]]
        );
    }

    // The pipeline's error paths, on the in-memory model of etcd: each txn
    // the peer refuses, and what the session is told.

    use std::sync::Arc;
    use std::time::Duration;

    use aether_etcd::model::{self, Cluster, ModelConfig};

    use crate::etcd::{Put, Range, Txn};
    use crate::mirror::clock::Clock;
    use crate::mirror::state::State;
    use crate::mirror::stats::PeerStats;
    use crate::store::Store;

    const STATE_KEY: &str = "/state/a";

    /// A peer on the model, a writer to it (holder 9, fencing on a state
    /// key not created yet) and a link that knows nothing of its limits.
    fn peer(cfg: ModelConfig) -> (model::Client, FencedWriter, Link) {
        let model = Cluster::new(cfg).client(0);
        let writer = FencedWriter::new(
            "b".into(),
            Store::new(model.clone()),
            Bytes::from_static(STATE_KEY.as_bytes()),
            9,
            Arc::new(PeerStats::new("b")),
            Clock::system(),
        );
        let link = Link {
            pacer: Pacer::new(16, 1 << 20, Instant::now()),
            limits: Limits::new(TxnLimits::default(), Duration::from_secs(600)),
        };
        (model, writer, link)
    }

    /// Sends `ops` and settles the one txn.
    async fn send_one(writer: &FencedWriter, link: &mut Link, ops: Vec<Op>) -> Result<()> {
        let mut pipeline = Pipeline::new(writer, link);
        pipeline.send(ops, None, ());
        let done = pipeline.next().await.expect("one txn in flight");
        pipeline.settle(done).await
    }

    async fn value(model: &model::Client, key: &str) -> Option<Bytes> {
        let resp = model.range(Range::key(key.to_owned())).await.unwrap();
        resp.kvs().first().map(|kv| kv.value().clone())
    }

    fn puts(n: usize) -> Vec<Op> {
        (0..n)
            .map(|i| Put::new(format!("k{i}"), "v").into())
            .collect()
    }

    #[tokio::test]
    async fn a_txn_over_the_peers_op_limit_goes_in_pieces_and_the_limit_is_learnt() {
        let (model, writer, mut link) = peer(ModelConfig::default().with_max_txn_ops(4));
        send_one(&writer, &mut link, puts(10)).await.unwrap();
        for i in 0..10 {
            assert_eq!(
                value(&model, &format!("k{i}")).await.as_deref(),
                Some(&b"v"[..])
            );
        }
        assert!(
            link.limits.current().max_ops <= 4,
            "{:?}",
            link.limits.current()
        );
        assert_eq!(writer.stats.errors(ErrorKind::TooManyOps), 1);
    }

    #[tokio::test]
    async fn a_value_too_large_for_the_peer_is_deleted_there_never_left_old() {
        let (model, writer, mut link) = peer(ModelConfig::default().with_max_request_bytes(2_048));
        model.put(Put::new("k", "old")).await.unwrap();
        let big = Put::new("k", vec![b'x'; 3_000]).into();
        send_one(&writer, &mut link, vec![big]).await.unwrap();
        assert_eq!(value(&model, "k").await, None);
        assert!(writer.is_oversized(b"k"));
        assert_eq!(writer.stats.errors(ErrorKind::TooLarge), 1);
    }

    /// A key found too large for the peer, whose next value fits and
    /// commits with its answer lost (the session ended mid-call): the key
    /// must not stay known as too large, or every repair and pass would
    /// skip it as absent by design, should the peer lose that value (the
    /// simulation found a copy claimed fresh without it).
    #[tokio::test]
    async fn a_commit_whose_answer_was_lost_unmarks_a_key_found_too_large() {
        let (model, writer, mut link) = peer(ModelConfig::default().with_max_request_bytes(2_048));
        let big = Put::new("k", vec![b'x'; 3_000]).into();
        send_one(&writer, &mut link, vec![big]).await.unwrap();
        assert!(writer.is_oversized(b"k"));
        let mut pipeline = Pipeline::new(&writer, &mut link);
        pipeline.send(vec![Put::new("k", "fits").into()], None, ());
        // Committed, and dropped unanswered.
        let done = pipeline.next().await.expect("one txn in flight");
        assert!(done.result.is_ok());
        drop((done, pipeline));
        assert_eq!(value(&model, "k").await.as_deref(), Some(&b"fits"[..]));
        assert!(
            !writer.is_oversized(b"k"),
            "a key the peer may hold is still taken as too large for it"
        );
    }

    /// A txn of ours answered below a revision an earlier one committed
    /// at: the peer went back (restored from an older snapshot, with our
    /// claim in it, so the fence still holds). The answer alone says so:
    /// the live loop's probe relies on it instead of reading the peer.
    #[tokio::test]
    async fn an_answer_below_a_revision_of_ours_is_a_changed_peer() {
        let (model, writer, mut link) = peer(ModelConfig::default());
        let mut seen = model.range(Range::key("/")).await.unwrap().header;
        seen.revision += 1_000;
        writer.check_peer(&seen).unwrap();
        let err = send_one(&writer, &mut link, puts(1)).await.unwrap_err();
        assert!(matches!(err, Error::PeerChanged { .. }), "{err:?}");
    }

    /// A peer restored to just below a revision a txn of ours committed
    /// at answers our next write *at* that revision: not below it, yet a
    /// write can only commit above every revision answered before it.
    /// A txn that changed nothing may answer at it.
    #[tokio::test]
    async fn a_write_answered_at_a_revision_of_ours_is_a_changed_peer() {
        let (model, writer, mut link) = peer(ModelConfig::default());
        let mut seen = model.range(Range::key("/")).await.unwrap().header;
        let nothing = vec![Op::from(Delete::key("absent"))];
        writer.check_peer(&seen).unwrap();
        send_one(&writer, &mut link, nothing).await.unwrap();
        // The next write commits one revision on: say we had seen it.
        seen.revision += 1;
        writer.check_peer(&seen).unwrap();
        let err = send_one(&writer, &mut link, puts(1)).await.unwrap_err();
        assert!(matches!(err, Error::PeerChanged { .. }), "{err:?}");
    }

    /// A repair's guarded write is a nested txn: no key of its own to
    /// delete instead, so the session ends and a re-sync decides.
    #[tokio::test]
    async fn a_repairs_write_too_large_for_the_peer_ends_the_session_for_a_resync() {
        let (model, writer, mut link) = peer(ModelConfig::default().with_max_request_bytes(2_048));
        model.put(Put::new("k", "old")).await.unwrap();
        let guarded = Op::from(Txn::new().and_then([Put::new("k", vec![b'x'; 3_000])]));
        let err = send_one(&writer, &mut link, vec![guarded])
            .await
            .unwrap_err();
        assert!(matches!(err, Error::CopyChanged { .. }), "{err:?}");
        assert_eq!(value(&model, "k").await.as_deref(), Some(&b"old"[..]));
    }

    #[tokio::test]
    async fn a_state_key_another_engine_wrote_fences_this_one() {
        let (model, writer, mut link) = peer(ModelConfig::default());
        let theirs = State {
            revision: 1,
            lease: crate::etcd::LeaseId::NONE,
            holder: 7,
            source_cluster: 0,
            source_id: 0,
            heartbeat_unix_ms: 0,
            synced: true,
            lease_ttl: 0,
        };
        model
            .put(Put::new(STATE_KEY, theirs.encode()))
            .await
            .unwrap();
        let err = send_one(&writer, &mut link, puts(1)).await.unwrap_err();
        assert!(matches!(err, Error::Fenced { .. }), "{err:?}");
        assert_eq!(value(&model, "k0").await, None);
    }

    #[tokio::test]
    async fn a_state_key_deleted_under_the_writer_is_state_gone() {
        let (model, mut writer, mut link) = peer(ModelConfig::default());
        // The claim created the key at revision 5; it is gone now.
        writer.fence = 5;
        let err = send_one(&writer, &mut link, puts(1)).await.unwrap_err();
        assert!(matches!(err, Error::StateGone { .. }), "{err:?}");
        assert_eq!(value(&model, "k0").await, None);
    }
}
