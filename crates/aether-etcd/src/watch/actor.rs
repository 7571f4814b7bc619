//! The stream task: it opens the gRPC stream, (re-)creates every watcher
//! from its resume revision, hands responses to their watchers, and turns
//! cancels and refusals into errors (see the module docs for each case).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::types::{Event, WatchResponse};
use super::watcher::{Cmd, Fragments, Sink, events_bytes};
use crate::backoff::Backoff;
use crate::error::{Error, is_token_refusal};
use crate::header::Header;
use crate::pb::{
    PbWatchCancelRequest, PbWatchClient, PbWatchCreateRequest, PbWatchProgressRequest,
    PbWatchRequest, PbWatchRequestUnion, PbWatchResponse,
};
use crate::transport::Transport;

/// Longest wait between attempts to reopen a broken watch stream.
pub(crate) const MAX_WATCH_BACKOFF: Duration = Duration::from_secs(2);

pub(super) struct State {
    req: PbWatchCreateRequest,
    /// First revision not yet delivered; 0 until known ("from now").
    resume: i64,
    sink: Sink,
    /// The response being reassembled, with its share of the budget.
    fragments: Fragments,
    /// Its create was refused for its token and the stream re-authenticated
    /// for it; a second refusal before a create succeeds ends it.
    reauthed: bool,
    /// The create's answer is still to be delivered
    /// (`WatchOptions::created_notify`, until the first one).
    created_notify: bool,
    /// `Watcher::cancel` was called: the cancel is sent, and the server's
    /// answer ends the watcher.
    closing: bool,
}

impl State {
    fn new(req: PbWatchCreateRequest, created_notify: bool, sink: Sink) -> State {
        State {
            resume: req.start_revision,
            req,
            sink,
            fragments: Fragments::default(),
            reauthed: false,
            created_notify,
            closing: false,
        }
    }
}

fn create_msg(id: i64, st: &State) -> PbWatchRequest {
    let mut req = st.req.clone();
    req.watch_id = id;
    if st.resume > 0 {
        // One revision early, so that a start at the compaction revision
        // is refused instead of silently missing its deletes; `dispatch`
        // drops the replayed revision.
        req.start_revision = (st.resume - 1).max(1);
    }
    PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::CreateRequest(req)),
    }
}

fn cancel_msg(id: i64) -> PbWatchRequest {
    PbWatchRequest {
        request_union: Some(PbWatchRequestUnion::CancelRequest(PbWatchCancelRequest {
            watch_id: id,
        })),
    }
}

pub(super) async fn run(
    client: Transport,
    mut cmds: mpsc::UnboundedReceiver<Cmd>,
    cancel: CancellationToken,
    connected: Arc<AtomicBool>,
    reconnects: Arc<AtomicU64>,
    member: Arc<AtomicU64>,
) {
    let mut watchers: HashMap<i64, State> = HashMap::new();
    let mut backoff = Backoff::new(Duration::from_millis(50), MAX_WATCH_BACKOFF);
    let mut commands_open = true;
    loop {
        while watchers.is_empty() {
            if !commands_open {
                return;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                cmd = cmds.recv() => match cmd {
                    Some(Cmd::Create { id, req, created_notify, sink }) => {
                        watchers.insert(id, State::new(req, created_notify, sink));
                    }
                    Some(_) => {}
                    None => commands_open = false,
                },
            }
        }
        if let Err(err) = client.ensure_token().await {
            reconnects.fetch_add(1, Ordering::Relaxed);
            if err.is_transient() {
                // `authenticate` has already moved past unreachable members.
                tracing::debug!(error = %err, "watch stream: authentication failed; retrying");
                if !backoff.wait_unless(cancel.cancelled()).await {
                    return;
                }
                continue;
            }
            // Refused: end the watchers rather than open without a token
            // (module docs).
            tracing::warn!(error = %err, watchers = watchers.len(), "watch stream: authentication refused; ending every watcher on the stream");
            for (_, st) in watchers.drain() {
                st.sink.send_err(auth_error(&err));
            }
            continue;
        }
        // A watcher being canceled when the stream broke is done: the
        // server's watch went with the stream, so there is nothing to
        // re-create or to wait for (its consumer sees the end).
        watchers.retain(|_, st| !st.closing);
        if watchers.is_empty() {
            continue;
        }
        // Queue every create before opening: etcd sends the response
        // headers only with its first message.
        let (out_tx, out_rx) = mpsc::unbounded_channel::<PbWatchRequest>();
        // The creates the server has not answered yet, in the order sent:
        // etcd 3.4 refuses one with a cancel for watch id -1 (see
        // `dispatch`), so only the order says which it was.
        let mut pending: VecDeque<i64> = VecDeque::new();
        for (id, st) in &watchers {
            pending.push_back(*id);
            let _ = out_tx.send(create_msg(*id, st));
        }
        let (idx, svc) = client.svc();
        let mut wc = PbWatchClient::new(svc)
            .max_decoding_message_size(client.max_decoding())
            .max_encoding_message_size(client.max_encoding());
        let outbound = tokio_stream::wrappers::UnboundedReceiverStream::new(out_rx);
        let mut request = tonic::Request::new(outbound);
        if client.config().watch_require_leader {
            // Without it, a member cut off from its quorum keeps the stream
            // open and silent; with it, etcd refuses or cancels the stream
            // and the task moves to the next endpoint.
            request.metadata_mut().insert(
                "hasleader",
                tonic::metadata::AsciiMetadataValue::from_static("true"),
            );
        }
        let open = wc.watch(request);
        let opened = tokio::select! {
            _ = cancel.cancelled() => return,
            r = tokio::time::timeout(client.config().request_timeout, open) => r,
        };
        let mut inbound = match opened {
            Ok(Ok(resp)) => {
                connected.store(true, Ordering::Relaxed);
                resp.into_inner()
            }
            failed => {
                let err = match failed {
                    Ok(Err(s)) => Error::from_status(s),
                    _ => Error::Timeout(client.config().request_timeout),
                };
                tracing::debug!(error = %err, "watch stream failed to open");
                if err.is_invalid_token() {
                    client.clear_token();
                }
                client.rotate(idx);
                reconnects.fetch_add(1, Ordering::Relaxed);
                if !backoff.wait_unless(cancel.cancelled()).await {
                    return;
                }
                continue;
            }
        };
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                cmd = cmds.recv(), if commands_open => match cmd {
                    Some(Cmd::Create { id, req, created_notify, sink }) => {
                        let st = State::new(req, created_notify, sink);
                        pending.push_back(id);
                        let _ = out_tx.send(create_msg(id, &st));
                        watchers.insert(id, st);
                    }
                    Some(Cmd::Cancel(id)) => {
                        if watchers.remove(&id).is_some() {
                            let _ = out_tx.send(cancel_msg(id));
                        }
                    }
                    Some(Cmd::Close(id)) => {
                        if let Some(st) = watchers.get_mut(&id).filter(|st| !st.closing) {
                            st.closing = true;
                            let _ = out_tx.send(cancel_msg(id));
                        }
                    }
                    Some(Cmd::Progress) => {
                        let _ = out_tx.send(PbWatchRequest {
                            request_union: Some(PbWatchRequestUnion::ProgressRequest(PbWatchProgressRequest {})),
                        });
                    }
                    None => commands_open = false,
                },
                msg = inbound.message() => match msg {
                    Ok(Some(resp)) => {
                        backoff.reset();
                        if let Some(h) = &resp.header {
                            member.store(h.member_id, Ordering::Relaxed);
                        }
                        let reauth = dispatch(&mut watchers, &mut pending, resp, &out_tx).await;
                        if watchers.is_empty() && !commands_open {
                            return;
                        }
                        if reauth {
                            // A create refused for its token (module docs):
                            // a new token and a new stream, from where every
                            // watcher is.
                            tracing::debug!("watch create refused for its token; re-authenticating");
                            client.clear_token();
                            connected.store(false, Ordering::Relaxed);
                            member.store(0, Ordering::Relaxed);
                            reconnects.fetch_add(1, Ordering::Relaxed);
                            for st in watchers.values_mut() {
                                st.sink.release(std::mem::take(&mut st.fragments));
                            }
                            break;
                        }
                    }
                    other => {
                        let err = match other {
                            Err(s) => Error::from_status(s),
                            _ => Error::Unavailable("watch stream ended".into()),
                        };
                        connected.store(false, Ordering::Relaxed);
                            member.store(0, Ordering::Relaxed);
                        if let Error::ResponseTooLarge { limit } = err {
                            // Every member would send the same response, so
                            // neither a resume nor another endpoint helps:
                            // end the watchers (see the module docs).
                            let limit = if limit == 0 { client.max_decoding() } else { limit };
                            tracing::warn!(limit, watchers = watchers.len(), "a watch response is over the decode limit; ending every watcher on the stream");
                            for (_, st) in watchers.drain() {
                                st.sink.send_err(Error::ResponseTooLarge { limit });
                            }
                            if !commands_open {
                                return;
                            }
                            break;
                        }
                        tracing::debug!(error = %err, watchers = watchers.len(), "watch stream broke; resuming");
                        if err.is_invalid_token() {
                            client.clear_token();
                        }
                        client.rotate(idx);
                        reconnects.fetch_add(1, Ordering::Relaxed);
                        for st in watchers.values_mut() {
                            st.sink.release(std::mem::take(&mut st.fragments));
                        }
                        if !backoff.wait_unless(cancel.cancelled()).await {
                            return;
                        }
                        break;
                    }
                },
            }
        }
    }
}

/// Hands one response to its watcher(s). True when a create was refused
/// for its token and the stream should re-authenticate and reopen.
async fn dispatch(
    watchers: &mut HashMap<i64, State>,
    pending: &mut VecDeque<i64>,
    mut resp: PbWatchResponse,
    out: &mpsc::UnboundedSender<PbWatchRequest>,
) -> bool {
    let header = Header::from(resp.header.take());
    let revision = header.revision;
    if resp.created
        && resp.watch_id != -1
        && let Some(at) = pending.iter().position(|p| *p == resp.watch_id)
    {
        pending.remove(at);
    }
    if resp.watch_id == -1 && resp.canceled {
        // etcd 3.4 refuses a create (a user without read permission on
        // the range, an invalid token) with `created` and `canceled` for
        // watch id -1, not the watcher's: it is the oldest create not yet
        // answered, since the server answers creates in order. Taken for a
        // progress notice, it used to leave that watcher waiting for ever.
        let Some(id) = pending.pop_front() else {
            return false;
        };
        return refused(watchers, id, &resp.cancel_reason);
    }
    if resp.watch_id == -1 {
        // A broadcast progress notice (etcd 3.4's answer to a progress
        // request). It does not move resume revisions: in 3.4 it is sent
        // even to watchers that have not caught up yet.
        let ids: Vec<i64> = watchers.keys().copied().collect();
        for id in ids {
            deliver(
                watchers,
                id,
                WatchResponse::events(header, Vec::new()),
                Fragments::default(),
                out,
            )
            .await;
        }
        return false;
    }
    let id = resp.watch_id;
    let Some(st) = watchers.get_mut(&id) else {
        return false;
    };
    if resp.canceled && st.closing && resp.compact_revision == 0 {
        // The answer to `Watcher::cancel`: the watcher's last response.
        st.sink.release(std::mem::take(&mut st.fragments));
        let last = WatchResponse {
            canceled: true,
            ..WatchResponse::events(header, Vec::new())
        };
        deliver(watchers, id, last, Fragments::default(), out).await;
        // Its queue closes here; the server has no watch left to cancel.
        watchers.remove(&id);
        return false;
    }
    if resp.canceled {
        if resp.compact_revision == 0 {
            return refused(watchers, id, &resp.cancel_reason);
        }
        st.sink.release(std::mem::take(&mut st.fragments));
        st.sink.send_err(Error::Compacted {
            compact_revision: Some(resp.compact_revision),
        });
        watchers.remove(&id);
        return false;
    }
    if resp.created {
        st.reauthed = false;
        // A watch "from now" starts after the revision it was created at.
        if st.resume == 0 {
            st.resume = revision + 1;
        }
        if std::mem::take(&mut st.created_notify) {
            let created = WatchResponse {
                created: true,
                ..WatchResponse::events(header, Vec::new())
            };
            deliver(watchers, id, created, Fragments::default(), out).await;
        }
        if resp.events.is_empty() {
            return false;
        }
    }
    let Some(st) = watchers.get_mut(&id) else {
        return false;
    };
    let new: Vec<Event> = resp.events.into_iter().map(Event::from_pb).collect();
    if resp.fragment {
        // Counted against the budget before it is kept (module docs).
        if !st.sink.hold(&mut st.fragments, events_bytes(&new)).await {
            watchers.remove(&id);
            let _ = out.send(cancel_msg(id));
            return false;
        }
        st.fragments.events.extend(new);
        return false;
    }
    let mut held = std::mem::take(&mut st.fragments);
    let mut events = std::mem::take(&mut held.events);
    events.extend(new);
    if events.first().is_some_and(|e| e.revision() < st.resume) {
        // The revision before the start, asked for by `create_msg`. Events
        // come in revision order, so they are a prefix.
        let keep = events.partition_point(|e| e.revision() < st.resume);
        events.drain(..keep);
        if events.is_empty() {
            // Not a progress notice: say nothing rather than look like one.
            st.sink.release(held);
            return false;
        }
    }
    if let Some(last) = events.last() {
        st.resume = last.revision() + 1;
    } else if revision >= st.resume && st.resume > 0 {
        // A per-watcher progress notice: the server only sends these to
        // watchers that have caught up, so nothing below it is pending.
        st.resume = revision + 1;
    }
    deliver(
        watchers,
        id,
        WatchResponse::events(header, events),
        held,
        out,
    )
    .await;
    false
}

/// A watch the server canceled (not for compaction) or refused to create.
/// Refused for its token or for permission, and not yet since a
/// re-authentication: kept, and true (the stream re-authenticates and
/// re-creates it). Otherwise it ends with the reason's error.
fn refused(watchers: &mut HashMap<i64, State>, id: i64, reason: &str) -> bool {
    let Some(st) = watchers.get_mut(&id) else {
        return false;
    };
    // 3.4 says "permission denied" for a dead token too, and so does 3.5
    // at times just after a restart: worth one new token as well.
    let maybe_token = is_token_refusal(reason) || reason.contains("etcdserver: permission denied");
    if maybe_token && !st.reauthed {
        st.reauthed = true;
        return true;
    }
    if let Some(mut st) = watchers.remove(&id) {
        st.sink.release(std::mem::take(&mut st.fragments));
        st.sink.send_err(cancel_error(reason));
    }
    false
}

/// The error for a watch the server canceled, from its reason: etcd
/// refuses a watch on keys the user may not read with "permission denied"
/// (3.5 wraps it in the gRPC status text).
fn cancel_error(reason: &str) -> Error {
    if reason.contains("etcdserver: permission denied") {
        Error::PermissionDenied
    } else if is_token_refusal(reason) {
        Error::Auth(reason.to_string())
    } else if reason.is_empty() {
        Error::WatchCanceled("the server refused the watch".into())
    } else {
        Error::WatchCanceled(reason.to_string())
    }
}

/// The error each watcher gets when the stream's authentication was
/// refused: `err` itself where it can be copied.
fn auth_error(err: &Error) -> Error {
    match err {
        Error::Auth(m) => Error::Auth(m.clone()),
        Error::PermissionDenied => Error::PermissionDenied,
        Error::Server { code, message } => Error::Server {
            code: *code,
            message: message.clone(),
        },
        other => Error::Auth(other.to_string()),
    }
}

async fn deliver(
    watchers: &mut HashMap<i64, State>,
    id: i64,
    resp: WatchResponse,
    held: Fragments,
    out: &mpsc::UnboundedSender<PbWatchRequest>,
) {
    let Some(st) = watchers.get(&id) else { return };
    if !st.sink.send(resp, held).await {
        watchers.remove(&id);
        let _ = out.send(cancel_msg(id));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use tokio::sync::{Semaphore, mpsc};

    use super::*;
    use crate::pb::PbWatchFilter;
    use crate::watch::WatchOptions;

    fn state(opts: WatchOptions, resume: i64) -> State {
        let (tx, _rx) = mpsc::unbounded_channel();
        let mut st = State::new(
            opts.0,
            false,
            Sink {
                tx,
                budget: Arc::new(Semaphore::new(1)),
                capacity: 1,
                buffered: Arc::new(AtomicUsize::new(0)),
            },
        );
        st.resume = resume;
        st
    }

    fn create(msg: PbWatchRequest) -> PbWatchCreateRequest {
        match msg.request_union {
            Some(PbWatchRequestUnion::CreateRequest(c)) => c,
            other => panic!("not a create: {other:?}"),
        }
    }

    /// A resume re-sends the watcher's own request: range, filters and
    /// extras carry over, only the start moves (to one before the resume
    /// revision, see `create_msg`).
    #[test]
    fn a_resumed_create_keeps_the_range_and_filters() {
        let opts = WatchOptions::between("/b", "/d")
            .no_put()
            .prev_kv()
            .start_revision(5);
        let req = create(create_msg(9, &state(opts, 40)));
        assert_eq!((&req.key[..], &req.range_end[..]), (&b"/b"[..], &b"/d"[..]));
        assert_eq!(req.filters, [PbWatchFilter::Noput as i32]);
        assert!(req.prev_kv);
        assert_eq!((req.watch_id, req.start_revision), (9, 39));

        let opts = WatchOptions::from_key("/m").no_delete();
        let first = create(create_msg(3, &state(opts.clone(), 0)));
        assert_eq!(
            first.start_revision, 0,
            "from now until a revision is known"
        );
        let resumed = create(create_msg(3, &state(opts, 12)));
        assert_eq!(&resumed.range_end[..], [0]);
        assert_eq!(resumed.filters, [PbWatchFilter::Nodelete as i32]);
        assert_eq!(resumed.start_revision, 11);
    }
}
