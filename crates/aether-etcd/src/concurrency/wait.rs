//! Waiting for one's turn in a create-revision queue.

use bytes::Bytes;
use futures_util::StreamExt;

use super::Session;
use crate::{
    Client, Compare, CompareOp, Delete, Error, EventKind, Header, OpResponse, Range, Result,
    SortOrder, SortTarget, Txn, TxnResponse, WatchOptions,
};

/// Withdraws a queued claim (a lock's or a candidate's key) when the wait
/// for its turn is dropped before it ends, as Go's package deletes its key
/// when the context of `Lock` or `Campaign` is cancelled. Without it a
/// dropped `lock()` left its key in the queue until the session ended, and
/// every later waiter queued behind a claim nobody would ever release.
///
/// A `Drop` cannot await, so the delete is a task of its own on the current
/// runtime (best effort: without a runtime, or if the request fails, the
/// key goes with the session's lease). The delete only matches the claim's
/// own create revision, so it never removes a claim made again since.
/// Dropping clears `slot`, the caller's record of the claim.
pub(super) struct WithdrawOnDrop<'a, T> {
    slot: &'a mut Option<T>,
    client: Client,
    key: Bytes,
    rev: i64,
    armed: bool,
}

impl<'a, T> WithdrawOnDrop<'a, T> {
    /// Arms the guard for the claim `key` created at `rev`.
    pub(super) fn new(slot: &'a mut Option<T>, client: &Client, key: Bytes, rev: i64) -> Self {
        WithdrawOnDrop {
            slot,
            client: client.clone(),
            key,
            rev,
            armed: true,
        }
    }

    /// The wait ended (won or failed): the claim stays the caller's.
    pub(super) fn disarm(mut self) {
        self.armed = false;
    }
}

impl<T> Drop for WithdrawOnDrop<'_, T> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        *self.slot = None;
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, key, rev) = (self.client.clone(), self.key.clone(), self.rev);
        rt.spawn(async move { withdraw(&client, key, rev).await });
    }
}

/// Deletes the claim `key` if it still has create revision `rev`.
async fn withdraw(client: &Client, key: Bytes, rev: i64) {
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, rev)])
        .and_then([Delete::key(key.clone())]);
    if let Err(err) = client.txn(txn).await {
        tracing::debug!(error = %err, key = ?key, "withdrawing a dropped waiter's claim failed; it goes with its lease");
    }
}

/// Sends `txn`, which puts the claim `key` when it succeeds, from a task
/// of its own: a caller dropped while the txn is on its way (the claim may
/// be in the queue already, and other clients see it) never takes the
/// answer, and then what the txn created is withdrawn. Without it, a
/// `lock()` dropped at that moment left its key queued, the gap
/// [`WithdrawOnDrop`] closes for the wait that follows. Either the caller
/// takes the answer (and arms its guard before it next yields), or the
/// answer is withdrawn: by the task when it could not hand it over, by
/// [`ClaimAnswer`]'s drop when it was handed over and never taken.
pub(super) async fn send_claim(client: &Client, txn: Txn, key: Bytes) -> Result<TxnResponse> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let c = client.clone();
    let k = key.clone();
    tokio::spawn(async move {
        if let Err(Ok(resp)) = tx.send(c.txn(txn).await)
            && resp.succeeded
        {
            withdraw(&c, k, resp.header.revision).await;
        }
    });
    let mut answer = ClaimAnswer {
        rx,
        client: client.clone(),
        key,
        taken: false,
    };
    let resp = (&mut answer.rx).await;
    answer.taken = true;
    resp.map_err(|_| Error::Closed)?
}

/// The caller's end of [`send_claim`]'s channel.
struct ClaimAnswer {
    rx: tokio::sync::oneshot::Receiver<Result<TxnResponse>>,
    client: Client,
    key: Bytes,
    taken: bool,
}

impl Drop for ClaimAnswer {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        // After `close` the task's send fails (and it withdraws); an answer
        // sent before it is here, and withdrawn here.
        self.rx.close();
        let Ok(Ok(resp)) = self.rx.try_recv() else {
            return;
        };
        if !resp.succeeded {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (client, key) = (self.client.clone(), self.key.clone());
            rt.spawn(async move { withdraw(&client, key, resp.header.revision).await });
        }
    }
}

/// The keys returned by op `i` of a txn.
pub(super) fn range_kvs(resp: &TxnResponse, i: usize) -> &[crate::KeyValue] {
    match resp.responses.get(i) {
        Some(OpResponse::Range(r)) => r.kvs(),
        _ => &[],
    }
}

/// The oldest key under `prefix`: the leader, or the lock holder.
pub(super) fn first_created(prefix: &Bytes) -> Range {
    Range::prefix(prefix.clone())
        .sort(SortTarget::CreateRevision, SortOrder::Ascend)
        .limit(1)
}

/// Waits until no key under `prefix` was created before `my_rev`, watching
/// only the immediate predecessor each time, and fails with
/// [`Error::SessionExpired`] as soon as the session is lost or `my_key` (at
/// `my_rev`) is gone: a waiter whose key vanished would otherwise "win" a
/// turn it no longer holds.
pub(super) async fn wait_deletes(
    session: &Session,
    prefix: &Bytes,
    my_key: &Bytes,
    my_rev: i64,
) -> Result<Header> {
    let client = session.client();
    loop {
        let before_me = Range::prefix(prefix.clone())
            .sort(SortTarget::CreateRevision, SortOrder::Descend)
            .max_create_revision(my_rev - 1)
            .limit(1);
        let resp = client
            .txn(Txn::new().and_then([before_me, Range::key(my_key.clone())]))
            .await?;
        if range_kvs(&resp, 1)
            .first()
            .is_none_or(|kv| kv.create_revision() != my_rev)
        {
            return Err(Error::SessionExpired);
        }
        let Some(pred) = range_kvs(&resp, 0).first() else {
            return Ok(resp.header);
        };
        let from = resp.header.revision + 1;
        match wait_delete(session, pred.key().clone(), my_key.clone(), from).await {
            // Gone (or history compacted under the watch): look again.
            Ok(()) | Err(Error::Compacted { .. }) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Resolves when `pred` is deleted at or after revision `from`; fails with
/// [`Error::SessionExpired`] when `mine` is deleted first or the session is
/// lost. Watching the own key too ends the wait at once when the lease is
/// revoked, rather than at the next keep-alive answer.
async fn wait_delete(session: &Session, pred: Bytes, mine: Bytes, from: i64) -> Result<()> {
    let stream = session.client().watch_stream();
    let mut pred = stream.watch(WatchOptions::key(pred).start_revision(from))?;
    let mut mine = stream.watch(WatchOptions::key(mine).start_revision(from))?;
    let deleted = |msg: Option<Result<crate::WatchResponse>>| match msg {
        Some(Ok(r)) => Ok(r.events.iter().any(|e| e.kind == EventKind::Delete)),
        Some(Err(e)) => Err(e),
        None => Err(Error::Closed),
    };
    loop {
        tokio::select! {
            msg = pred.next() => if deleted(msg)? { return Ok(()) },
            msg = mine.next() => if deleted(msg)? { return Err(Error::SessionExpired) },
            // The watch reconnects quietly; a lost session ends the wait.
            _ = session.lost() => return Err(Error::SessionExpired),
        }
    }
}
