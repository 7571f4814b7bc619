//! Watches: many watchers multiplexed on one bidirectional stream, resumed
//! without loss or duplication when the stream breaks.
//!
//! # Parts
//!
//! - `types`: what a watcher receives, [`Event`] and [`WatchResponse`].
//! - `options`: what to watch, [`WatchOptions`]: the create request that
//!   the actor re-sends, from the resume revision, on every reconnect.
//! - `watcher`: the consumer's side, [`Watcher`] (a `Stream`), with its
//!   queue bounded in bytes and the fragments being reassembled.
//! - `stream`: the handles, [`WatchStream`] (one gRPC stream, where
//!   watchers are added) and the crate's `WatchClient`.
//! - `actor`: the task behind a stream: opening, resuming, dispatching,
//!   refusals. The sections below describe how these parts behave
//!   together.
//!
//! # The watch-stream actor
//!
//! A [`WatchStream`] is a handle to one task that owns one gRPC `Watch`
//! stream. [`WatchStream::watch`] picks the next watch id itself and queues
//! the create request without waiting for the server's `created` answer, so
//! creating a thousand watchers costs one round trip, not a thousand
//! (etcd >= 3.4 accepts client-chosen ids).
//!
//! The task remembers, per watcher, the revision to resume from: one past the
//! last revision it delivered. etcd never splits one revision's events over
//! two responses (large ones are fragmented and reassembled here first), so
//! when the stream breaks every watcher is re-created from its resume
//! revision and sees each event exactly once. A resume revision that has
//! been compacted meanwhile ends that watcher with [`Error::Compacted`].
//!
//! Every create (the first and each resume) asks the server for one
//! revision *before* the start and drops that revision's events here. etcd
//! without the fix for etcd-io/etcd#18089 (Debian's 3.4.23 among them)
//! accepts a watch that starts exactly at the compaction revision but has
//! already dropped that revision's delete events; starting one earlier
//! turns that silent loss into [`Error::Compacted`]. The cost is one
//! revision's events sent twice per create.
//!
//! # Each watcher's buffer is bounded in bytes
//!
//! Responses wait for their consumer in a per-watcher queue bounded by
//! their encoded size ([`ClientConfig::watcher_buffer_bytes`], default
//! [`DEFAULT_WATCHER_BUFFER_BYTES`]), not by their number: one catch-up
//! response can be tens of MiB, so a count bound let a paused watcher hold
//! gigabytes. The task takes byte permits from the watcher's budget before
//! it queues a response, and the consumer gives them back when it takes
//! the response. A response larger than the whole budget still passes, on
//! its own (it takes the whole budget). Nothing is dropped: a consumer that
//! stops reading holds back the whole stream (HTTP/2 flow control then
//! holds back the server), so consumers that must not slow each other down
//! use separate streams: [`Client::watch_stream`] opens a new one each time.
//! Errors are queued without waiting for the budget.
//!
//! A response being reassembled from fragments ([`WatchOptions::fragment`])
//! counts against the same budget as its fragments arrive (and in
//! [`Watcher::buffered_bytes`]): the task waits for room before it takes in
//! the next fragment, so a watcher's queue plus its partial response stay
//! within the budget, except that one response larger than the whole
//! budget still passes on its own, as above. Before, a watcher whose queue
//! was full could hold a whole fragmented response beside it.
//!
//! # A refused create ends its watcher
//!
//! etcd refuses a watch on keys the user may not read. 3.5 cancels it by
//! its id; 3.4 (and any failed create there) answers with a cancel for
//! watch id -1, which used to be taken for a progress notice: every watcher
//! on the stream saw a bogus notice and the refused one waited for ever.
//! etcd answers creates in order, so the task keeps the creates not yet
//! answered and ends the oldest one. "permission denied" ends the watcher
//! with [`Error::PermissionDenied`], anything else with
//! [`Error::WatchCanceled`].
//!
//! A create refused for its token ("invalid auth token": etcd forgets its
//! simple tokens when it restarts, and they expire after
//! `--auth-token-ttl` of disuse, so a watch resumed on a new stream often
//! carries a dead one) is not the watcher's fault: the stream drops the
//! token, re-authenticates and re-creates every watcher where it was, once
//! per watcher until one of its creates succeeds. "permission denied" gets
//! the same one retry, because etcd 3.4 says that for a dead token too
//! (and 3.5.1 at times just after a restart); a watch the user really may
//! not read costs one reconnect of its stream before it ends. A second
//! refusal in a row ends the watcher ([`Error::Auth`] or
//! [`Error::PermissionDenied`]). It used to end with `WatchCanceled`, or,
//! on 3.4, hang, however valid the credentials.
//!
//! # Refused credentials end the watchers
//!
//! The stream authenticates before it opens (when there are credentials
//! and no token). If the server refuses (wrong password, auth not enabled),
//! every watcher on the stream gets that error (`Error::Auth` for refused
//! credentials) and ends: opening without a token instead made etcd accept
//! the stream and answer each create with a cancel, or nothing, so the
//! watcher hung or saw what looked like a progress notice. Watchers added
//! later try again, with whatever credentials are current then. An
//! authentication that could not reach any member is retried with backoff
//! like any stream failure, and counted in [`WatchStream::reconnects`].
//!
//! # A response over the decode limit ends the stream's watchers
//!
//! A response larger than [`ClientConfig::max_decoding_message_size`]
//! cannot be decoded, and resuming would only ask for the same response
//! again: that used to be a silent reconnect loop. Instead the task ends
//! **every watcher on the stream** with [`Error::ResponseTooLarge`] and does
//! not reconnect for them. It cannot do better: the undecodable message
//! carries the watch id, so nothing says which watcher it was for, and
//! guessing ("the ones still catching up") is wrong too, because a watcher
//! that has caught up receives one whole revision per response, so a single
//! large txn written now overflows it as well. Any watcher that is
//! re-created at its resume revision may hit the same response again; only
//! the caller can re-read that range in pieces (by range, with a higher
//! limit, or with [`WatchOptions::fragment`] when the server's own request
//! limit is below the client's decode limit). The stream itself stays
//! usable: watchers added later open a new gRPC stream. Consumers that
//! should not share this fate use separate streams. Note that a create asks
//! for the revision *before* its start (below), so a watcher started just
//! after an oversized revision on its keys hits that revision as well.
//!
//! [`Client::watch_stream`]: super::Client::watch_stream
//! [`ClientConfig::watcher_buffer_bytes`]: super::ClientConfig::watcher_buffer_bytes
//! [`ClientConfig::max_decoding_message_size`]: super::ClientConfig::max_decoding_message_size
//! [`DEFAULT_WATCHER_BUFFER_BYTES`]: super::DEFAULT_WATCHER_BUFFER_BYTES

mod actor;
mod options;
mod stream;
mod types;
mod watcher;

pub use options::WatchOptions;
pub(crate) use stream::WatchClient;
pub use stream::WatchStream;
pub use types::{Event, EventKind, WatchResponse};
pub use watcher::Watcher;
