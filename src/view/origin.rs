//! What the view knows about each origin region's copy: [`OriginStatus`],
//! fed by the replicators' state keys and the endpoint counts, and its
//! staleness read against the clock.

use std::time::Duration;

use crate::etcd::LeaseId;
use crate::mirror::state::State;

/// What the view knows about one origin region's copy in this etcd; see
/// the [module docs](super). Read staleness with
/// [`OriginStatus::staleness`]: it moves with the clock, so it is not a
/// change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OriginStatus {
    /// The viewer's own region: the source itself, always synced and
    /// current (it has no state key in its own etcd).
    pub local: bool,
    /// The origin's state key is present (its mirror lease is live).
    pub state_present: bool,
    /// A complete copy was made under the origin's current lease. Always
    /// true for the viewer's own region; false without a state key, and
    /// for a state key whose value does not decode.
    pub synced: bool,
    /// When the copy was last known current, Unix ms; 0: never or unknown.
    pub heartbeat_unix_ms: i64,
    /// The origin's source revision the copy is applied through; 0:
    /// unknown or no complete sync yet.
    pub source_revision: i64,
    /// The origin's mirror lease; [`LeaseId::NONE`]: unknown.
    pub lease: LeaseId,
    /// The origin's source etcd cluster id; 0: unknown.
    pub source_cluster: u64,
    /// Revision (in this etcd) of the state key's last write; 0: none.
    pub state_mod_revision: i64,
    /// Endpoints of this origin in the view.
    pub endpoints: usize,
}

impl OriginStatus {
    /// How stale the copy is at `now_unix_ms`, by [`State::staleness_at`]'s
    /// rule (a heartbeat in the reader's future counts as that far in its
    /// past). Zero for the viewer's own region; `None` when unknown (no
    /// state key, or no heartbeat yet).
    pub fn staleness_at(&self, now_unix_ms: i64) -> Option<Duration> {
        if self.local {
            return Some(Duration::ZERO);
        }
        if !self.state_present {
            return None;
        }
        crate::mirror::state::staleness(self.heartbeat_unix_ms, now_unix_ms)
    }

    /// [`OriginStatus::staleness_at`] by the system clock.
    pub fn staleness(&self) -> Option<Duration> {
        self.staleness_at(unix_ms_now())
    }

    /// Whether the origin stays listed.
    pub(super) fn listed(&self) -> bool {
        self.local || self.state_present || self.endpoints > 0
    }

    /// What a [`Change::Origin`](super::Change::Origin) is emitted for.
    pub(super) fn signal(&self) -> (bool, bool) {
        (self.synced, self.state_present)
    }

    /// Takes a state key: its decoded value (`None` if it does not decode)
    /// and mod revision, or `None` once the key is gone. The viewer's own
    /// region is the source, whatever a stray state key says.
    pub(super) fn set_state(&mut self, state: Option<(Option<State>, i64)>) {
        if self.local {
            return;
        }
        let endpoints = self.endpoints;
        *self = match state {
            None => OriginStatus::default(),
            Some((decoded, state_mod_revision)) => {
                let mut s = OriginStatus {
                    state_present: true,
                    state_mod_revision,
                    ..OriginStatus::default()
                };
                if let Some(d) = decoded {
                    s.synced = d.synced;
                    s.heartbeat_unix_ms = d.heartbeat_unix_ms;
                    s.source_revision = d.revision;
                    s.lease = d.lease;
                    s.source_cluster = d.source_cluster;
                }
                s
            }
        };
        self.endpoints = endpoints;
    }

    pub(super) fn local(endpoints: usize) -> OriginStatus {
        OriginStatus {
            local: true,
            synced: true,
            endpoints,
            ..OriginStatus::default()
        }
    }
}

/// The system clock as Unix milliseconds.
pub fn unix_ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
