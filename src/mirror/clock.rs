//! What the engine reads from the world besides etcd: the wall clock, and
//! fresh random ids (an engine's incarnation, a source's id).
//!
//! Both are the system's unless a test supplies its own
//! ([`MirrorConfig::with_clock`](super::MirrorConfig::with_clock)): a
//! simulation on a paused tokio clock steps each engine's wall clock on
//! its own (an NTP step) and draws ids from its seed, so that a run is
//! replayed exactly. The monotonic clock is tokio's
//! ([`tokio::time::Instant`]), which a paused runtime drives already.

use std::fmt;
use std::sync::Arc;

type WallFn = Arc<dyn Fn() -> i64 + Send + Sync>;
type IdFn = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The engine's wall clock and id source; see the module doc.
#[derive(Clone, Default)]
pub struct Clock {
    wall: Option<WallFn>,
    ids: Option<IdFn>,
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.wall, &self.ids) {
            (None, None) => f.write_str("Clock(system)"),
            _ => f.write_str("Clock(supplied)"),
        }
    }
}

/// Two clocks are equal when they are the system's, or the same supplied
/// functions: a config reloaded with the same clock has not changed.
impl PartialEq for Clock {
    fn eq(&self, other: &Clock) -> bool {
        fn same<T: ?Sized>(a: &Option<Arc<T>>, b: &Option<Arc<T>>) -> bool {
            match (a, b) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
        }
        same(&self.wall, &other.wall) && same(&self.ids, &other.ids)
    }
}

impl Eq for Clock {}

impl Clock {
    /// The system's wall clock and random ids.
    pub fn system() -> Clock {
        Clock::default()
    }

    /// A clock whose wall time (Unix milliseconds) is `wall` and whose
    /// fresh ids are `ids`.
    pub fn supplied(
        wall: impl Fn() -> i64 + Send + Sync + 'static,
        ids: impl Fn() -> u64 + Send + Sync + 'static,
    ) -> Clock {
        Clock {
            wall: Some(Arc::new(wall)),
            ids: Some(Arc::new(ids)),
        }
    }

    /// Now, in Unix milliseconds.
    pub fn unix_ms(&self) -> i64 {
        match &self.wall {
            Some(wall) => wall(),
            None => super::stats::unix_ms(),
        }
    }

    /// A fresh id, never 0.
    pub fn fresh_id(&self) -> u64 {
        match &self.ids {
            Some(ids) => ids() | 1,
            None => super::state::new_holder(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

    #[test]
    fn a_supplied_clock_is_read_and_its_ids_are_never_zero() {
        let next = Arc::new(AtomicU64::new(0));
        let ids = next.clone();
        let clock = Clock::supplied(|| 1_000, move || ids.fetch_add(2, Relaxed));
        assert_eq!(clock.unix_ms(), 1_000);
        assert_eq!(clock.fresh_id(), 1, "0 is never an id");
        assert_eq!(clock.fresh_id(), 3);
        assert_eq!(clock, clock.clone());
        assert_ne!(clock, Clock::system());
        assert!(Clock::system().unix_ms() > 1_600_000_000_000);
    }
}
