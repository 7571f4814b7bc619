//! What to watch: the create request a watcher is made from, and re-made
//! from on every resume.

use bytes::Bytes;

use crate::kv::prefix_range;
use crate::pb::PbWatchCreateRequest;

/// What to watch.
#[derive(Clone, Debug)]
pub struct WatchOptions(pub(crate) PbWatchCreateRequest);

impl WatchOptions {
    /// Watch exactly `key`.
    pub fn key(key: impl Into<Bytes>) -> Self {
        Self::between(key.into(), Bytes::new())
    }
    /// Watch every key starting with `prefix`.
    pub fn prefix(prefix: impl Into<Bytes>) -> Self {
        let (key, range_end) = prefix_range(prefix);
        Self::between(key, range_end)
    }
    fn between(key: Bytes, range_end: Bytes) -> Self {
        WatchOptions(PbWatchCreateRequest {
            key,
            range_end,
            ..Default::default()
        })
    }
    /// Start at this revision (inclusive); 0 means "from now" (see
    /// [`WatchStream::watch`] for what "now" is).
    ///
    /// [`WatchStream::watch`]: super::WatchStream::watch
    pub fn start_revision(mut self, rev: i64) -> Self {
        self.0.start_revision = rev;
        self
    }
    /// Include the previous key-value in each event.
    pub fn prev_kv(mut self) -> Self {
        self.0.prev_kv = true;
        self
    }
    /// Let the server split responses larger than its request size limit;
    /// the stream reassembles them. Off by default: the client accepts
    /// large messages anyway, and etcd 3.4 builds fragments in time
    /// quadratic in the events per fragment (50k small events take 2.7 s
    /// fragmented, 0.2 s whole).
    pub fn fragment(mut self) -> Self {
        self.0.fragment = true;
        self
    }
    /// Ask the server for periodic progress notices.
    pub fn progress_notify(mut self) -> Self {
        self.0.progress_notify = true;
        self
    }
}
