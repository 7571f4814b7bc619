//! What to watch: the create request a watcher is made from, and re-made
//! from on every resume (so filters and ranges carry over by themselves).

use bytes::Bytes;

use crate::kv::prefix_range;
use crate::pb::{PbWatchCreateRequest, PbWatchFilter};

/// What to watch: one key, a prefix, a range `[from, to)`, or every key
/// from one on; with optional filters and extras.
///
/// ```
/// use aether_etcd::WatchOptions;
/// // Deletes under /jobs/ only, from revision 42 on.
/// let deletes = WatchOptions::prefix("/jobs/").no_put().start_revision(42);
/// // Keys in [/b, /d), and every key from /m on.
/// let middle = WatchOptions::between("/b", "/d");
/// let tail = WatchOptions::from_key("/m");
/// # let _ = (deletes, middle, tail);
/// ```
#[derive(Clone, Debug)]
pub struct WatchOptions(
    pub(crate) PbWatchCreateRequest,
    /// Deliver the create's answer ([`WatchOptions::created_notify`]); the
    /// client's own, not sent to the server.
    pub(crate) bool,
);

impl WatchOptions {
    /// Watch exactly `key`.
    #[must_use]
    pub fn key(key: impl Into<Bytes>) -> Self {
        Self::between(key, Bytes::new())
    }
    /// Watch every key starting with `prefix`.
    #[must_use]
    pub fn prefix(prefix: impl Into<Bytes>) -> Self {
        let (key, range_end) = prefix_range(prefix);
        Self::between(key, range_end)
    }
    /// Watch every key in `[from, to)`. In etcd's convention an empty `to`
    /// is exactly `from`, and `to` = `[0]` is every key from `from` on
    /// ([`WatchOptions::from_key`]).
    #[must_use]
    pub fn between(from: impl Into<Bytes>, to: impl Into<Bytes>) -> Self {
        WatchOptions(
            PbWatchCreateRequest {
                key: from.into(),
                range_end: to.into(),
                ..Default::default()
            },
            false,
        )
    }
    /// Watch every key at or after `key` (byte order), to the end of the
    /// keyspace; inside a [`Namespace`], to the end of the namespace.
    /// An empty `key` watches everything.
    ///
    /// [`Namespace`]: crate::Namespace
    #[must_use]
    pub fn from_key(key: impl Into<Bytes>) -> Self {
        Self::between(key, Bytes::from_static(&[0]))
    }
    /// Start at this revision (inclusive); 0 means "from now" (see
    /// [`WatchStream::watch`] for what "now" is).
    ///
    /// [`WatchStream::watch`]: super::WatchStream::watch
    #[must_use]
    pub fn start_revision(mut self, rev: i64) -> Self {
        self.0.start_revision = rev;
        self
    }
    /// Include the previous key-value in each event.
    #[must_use]
    pub fn prev_kv(mut self) -> Self {
        self.0.prev_kv = true;
        self
    }
    /// Let the server split responses larger than its request size limit;
    /// the stream reassembles them. Off by default: the client accepts
    /// large messages anyway, and etcd 3.4 builds fragments in time
    /// quadratic in the events per fragment (50k small events take 2.7 s
    /// fragmented, 0.2 s whole).
    #[must_use]
    pub fn fragment(mut self) -> Self {
        self.0.fragment = true;
        self
    }
    /// Deliver the server's answer to the create as the watcher's first
    /// response ([`WatchResponse::created`](crate::WatchResponse::created),
    /// no events; its header revision is where a watch "from now" starts),
    /// as Go's `WithCreatedNotify` does. Once: a create repeated to resume
    /// after a reconnect is not delivered again.
    #[must_use]
    pub fn created_notify(mut self) -> Self {
        self.1 = true;
        self
    }
    /// Ask the server for periodic progress notices.
    #[must_use]
    pub fn progress_notify(mut self) -> Self {
        self.0.progress_notify = true;
        self
    }
    /// Leave out put events: the server filters them, so they are never
    /// sent (etcd's `NOPUT` filter).
    ///
    /// A revision whose events are all filtered out sends nothing, so it
    /// does not move the watcher's resume revision: after a reconnect the
    /// server replays (and filters) from the last event delivered, and a
    /// compaction past that point ends the watcher with
    /// [`Error::Compacted`](crate::Error::Compacted) even if nothing it
    /// would have seen was lost. [`WatchOptions::progress_notify`] keeps the
    /// resume revision moving on a quiet filtered watch.
    #[must_use]
    pub fn no_put(self) -> Self {
        self.filter(PbWatchFilter::Noput)
    }
    /// Leave out delete events (etcd's `NODELETE` filter); as
    /// [`WatchOptions::no_put`] for puts.
    #[must_use]
    pub fn no_delete(self) -> Self {
        self.filter(PbWatchFilter::Nodelete)
    }
    fn filter(mut self, f: PbWatchFilter) -> Self {
        let f = f as i32;
        if !self.0.filters.contains(&f) {
            self.0.filters.push(f);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_follow_etcds_conventions() {
        let one = WatchOptions::key("k");
        assert_eq!(
            (&one.0.key[..], &one.0.range_end[..]),
            (&b"k"[..], &b""[..])
        );
        let pre = WatchOptions::prefix("/a/");
        assert_eq!(&pre.0.range_end[..], b"/a0");
        let mid = WatchOptions::between("/b", "/d");
        assert_eq!(
            (&mid.0.key[..], &mid.0.range_end[..]),
            (&b"/b"[..], &b"/d"[..])
        );
        let tail = WatchOptions::from_key("/m");
        assert_eq!(
            (&tail.0.key[..], &tail.0.range_end[..]),
            (&b"/m"[..], &[0u8][..])
        );
    }

    #[test]
    fn filters_are_set_once_each() {
        let w = WatchOptions::prefix("/").no_put().no_delete().no_put();
        assert_eq!(
            w.0.filters,
            [PbWatchFilter::Noput as i32, PbWatchFilter::Nodelete as i32]
        );
        assert!(WatchOptions::key("k").0.filters.is_empty());
    }
}
