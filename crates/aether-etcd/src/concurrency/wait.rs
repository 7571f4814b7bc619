//! Waiting for one's turn in a create-revision queue.

use bytes::Bytes;

use super::Session;
use crate::{
    Error, EventKind, Header, OpResponse, Range, Result, SortOrder, SortTarget, Txn, TxnResponse,
    WatchOptions,
};

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
