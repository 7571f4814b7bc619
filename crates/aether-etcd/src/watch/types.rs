//! What a watcher receives: events and responses.

use bytes::Bytes;

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

/// A batch of events from one watch response, or a progress notice.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WatchResponse {
    /// The store revision when the server sent the response. With no events
    /// this is a progress notice.
    pub revision: i64,
    /// The member that sent it. A watch stream that fails over resumes on
    /// another member, so this can change between responses of one
    /// watcher; a caller comparing it with a unary read's
    /// [`Header::member_id`](crate::Header::member_id) knows whether both
    /// saw the same member's store.
    pub member_id: u64,
    /// The events, in revision order. All events of one revision are in the
    /// same response.
    pub events: Vec<Event>,
}
