//! What a watcher receives: events and responses.

use bytes::Bytes;

use crate::header::Header;
use crate::kv::KeyValue;
use crate::pb::{PbEvent, PbEventType};

/// What happened to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The key was written.
    Put,
    /// The key was deleted.
    Delete,
}

/// One change to one key.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Event {
    /// Put or delete.
    pub kind: EventKind,
    /// The key-value after the change. For a delete only the key and the
    /// mod revision (the delete's revision) are set.
    pub kv: KeyValue,
    /// The key-value before the change, when the watcher asked for it.
    pub prev_kv: Option<KeyValue>,
}

impl Event {
    pub(crate) fn from_pb(e: PbEvent) -> Event {
        Event {
            kind: if e.r#type == PbEventType::Delete as i32 {
                EventKind::Delete
            } else {
                EventKind::Put
            },
            kv: KeyValue(e.kv.unwrap_or_default()),
            prev_kv: e.prev_kv.map(KeyValue),
        }
    }
    /// An event built by hand, for tests and benches of code that consumes
    /// events.
    #[doc(hidden)]
    pub fn synthetic(kind: EventKind, key: Bytes, value: Bytes, mod_revision: i64) -> Event {
        let kv = crate::pb::PbKeyValue {
            key,
            value,
            mod_revision,
            ..Default::default()
        };
        Event {
            kind,
            kv: KeyValue(kv),
            prev_kv: None,
        }
    }

    /// The revision of the change.
    pub fn revision(&self) -> i64 {
        self.kv.mod_revision()
    }
}

/// One watch response: a batch of events, a progress notice, or the
/// answer to a create or a cancel.
///
/// Only what the consumer can use is delivered: the create's answer only
/// when asked for ([`WatchOptions::created_notify`](crate::WatchOptions::created_notify)),
/// the cancel's only after [`Watcher::cancel`](crate::Watcher::cancel). A
/// watch the *server* cancels ends with an error instead
/// ([`Error::Compacted`](crate::Error::Compacted), which carries the
/// compact revision, or [`Error::WatchCanceled`](crate::Error::WatchCanceled)),
/// so a consumer cannot take it for more events.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WatchResponse {
    /// The response header: the store revision when the server sent the
    /// response, and the member that sent it. A watch stream that fails
    /// over resumes on another member, so the member can change between
    /// responses of one watcher; a caller comparing it with a unary read's
    /// [`Header::member_id`] knows whether both saw the same member's
    /// store.
    pub header: Header,
    /// The events, in revision order. All events of one revision are in the
    /// same response.
    pub events: Vec<Event>,
    /// The oldest revision the server still has, when it canceled the
    /// watch because its start had been compacted; 0 otherwise. (Such a
    /// cancel reaches the consumer as [`Error::Compacted`](crate::Error::Compacted),
    /// so a delivered response has 0 here.)
    pub compact_revision: i64,
    /// The answer to the watch's create (delivered once, only with
    /// [`WatchOptions::created_notify`](crate::WatchOptions::created_notify)).
    pub created: bool,
    /// The answer to [`Watcher::cancel`](crate::Watcher::cancel): the last
    /// response of the watch.
    pub canceled: bool,
}

impl WatchResponse {
    /// A response of events (or a progress notice) from `header`.
    pub(crate) fn events(header: Header, events: Vec<Event>) -> WatchResponse {
        WatchResponse {
            header,
            events,
            compact_revision: 0,
            created: false,
            canceled: false,
        }
    }

    /// Whether this is a progress notice, by etcd's own rule
    /// (`IsProgressNotify` in Go's clientv3): no events, and neither the
    /// answer to a create nor to a cancel. Its header revision says the
    /// watcher has seen every change up to it.
    pub fn is_progress_notify(&self) -> bool {
        self.events.is_empty() && !self.created && !self.canceled && self.compact_revision == 0
    }
}
