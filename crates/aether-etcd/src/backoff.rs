//! The one retry policy: capped exponential backoff with jitter.
//!
//! Every reconnect loop in the crate (lease keep-alive, watch streams, the
//! mirror's peers, the replicator's election, the registry view) waits with
//! a [`Backoff`]. Without jitter, every replica and every view that lost the
//! same etcd retries in lockstep after the outage and hits it together; with
//! "equal jitter" each wait is drawn uniformly from the upper half of the
//! exponential step, so retries spread out while a wait never drops below
//! half the step (a fixed floor keeps a flapping server from being hammered).

use std::time::Duration;

/// Default first wait.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(100);
/// Default longest wait.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(5);

/// A capped exponential backoff with equal jitter.
///
/// ```
/// use std::time::Duration;
/// use aether_etcd::Backoff;
///
/// let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
/// let first = b.next_delay();
/// assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
/// for _ in 0..10 {
///     assert!(b.next_delay() <= Duration::from_secs(1));
/// }
/// b.reset(); // after a success
/// assert!(b.next_delay() <= Duration::from_millis(100));
/// ```
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
    rng: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(DEFAULT_BACKOFF_BASE, DEFAULT_BACKOFF_CAP)
    }
}

impl Backoff {
    /// Waits start at `base` and double up to `cap`.
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base: base.max(Duration::from_millis(1)),
            cap: cap.max(base),
            attempt: 0,
            rng: seed(),
        }
    }

    /// The same policy with another first wait.
    #[must_use]
    pub fn with_base(self, base: Duration) -> Backoff {
        Backoff::new(base, self.cap)
    }

    /// The same policy with another longest wait.
    #[must_use]
    pub fn with_cap(self, cap: Duration) -> Backoff {
        Backoff::new(self.base, cap)
    }

    /// The same policy with its jitter drawn from `seed` instead of a
    /// random seed: a test or a simulation that replays a run needs the
    /// same waits each time.
    #[must_use]
    pub fn with_seed(mut self, seed: u64) -> Backoff {
        self.rng = seed | 1;
        self
    }

    /// The un-jittered step of the next attempt: `base * 2^attempt`, capped.
    pub fn step(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(20)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The next wait, in `[step/2, step]`, and moves to the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step();
        self.attempt = self.attempt.saturating_add(1);
        let half = step / 2;
        let span = (step - half).as_nanos() as u64;
        let jitter = if span == 0 {
            0
        } else {
            self.next_u64() % (span + 1)
        };
        half + Duration::from_nanos(jitter)
    }

    /// Back to the first step, after a success.
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// Attempts since the last reset.
    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    /// Sleeps for [`Backoff::next_delay`].
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_delay()).await;
    }

    /// Sleeps for [`Backoff::next_delay`] unless `stop` resolves first;
    /// returns whether the whole wait passed (`false`: stopped). The one
    /// "cancel or back off" of every retry loop, e.g.
    /// `backoff.wait_unless(cancel.cancelled())` or
    /// `backoff.wait_unless(&mut shutdown)`.
    pub async fn wait_unless(&mut self, stop: impl Future) -> bool {
        let delay = self.next_delay();
        Backoff::sleep_unless(delay, stop).await
    }

    /// Sleeps for `delay` unless `stop` resolves first; returns whether the
    /// whole wait passed. For a wait chosen by the caller (a fixed pause,
    /// or a delay already drawn and logged).
    pub async fn sleep_unless(delay: Duration, stop: impl Future) -> bool {
        tokio::select! {
            biased;
            _ = stop => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    fn next_u64(&mut self) -> u64 {
        // xorshift64*: plenty for spreading retries, and no dependency.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A per-instance seed: std's hasher keys are random per process, and the
/// address and time make two instances in one process differ too.
fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    h.write_u64(nanos);
    let local = 0u8;
    h.write_usize(&local as *const u8 as usize);
    h.finish() | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_backoff_waits_the_same_each_time() {
        let waits = |seed| {
            let mut b =
                Backoff::new(Duration::from_millis(100), Duration::from_secs(5)).with_seed(seed);
            (0..8).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(waits(42), waits(42));
        assert_ne!(waits(42), waits(100));
    }

    #[test]
    fn grows_doubling_to_the_cap_within_the_upper_half() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
        let steps = [100, 200, 400, 800, 800, 800];
        for step in steps {
            let step = Duration::from_millis(step);
            assert_eq!(b.step(), step);
            let d = b.next_delay();
            assert!(
                d >= step / 2 && d <= step,
                "{d:?} outside [{:?}, {step:?}]",
                step / 2
            );
        }
    }

    #[test]
    fn reset_starts_over() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_secs(10));
        for _ in 0..8 {
            b.next_delay();
        }
        assert_eq!(b.attempts(), 8);
        b.reset();
        assert_eq!(b.step(), Duration::from_millis(10));
    }

    #[test]
    fn two_policies_do_not_retry_in_lockstep() {
        // The point of the jitter: replicas that failed together spread out.
        let mut a = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        let da: Vec<Duration> = (0..6).map(|_| a.next_delay()).collect();
        let db: Vec<Duration> = (0..6).map(|_| b.next_delay()).collect();
        assert_ne!(da, db);
    }

    #[test]
    fn jitter_covers_the_range() {
        let mut seen_low = false;
        let mut seen_high = false;
        for _ in 0..200 {
            let mut b = Backoff::new(Duration::from_millis(1000), Duration::from_secs(1));
            let d = b.next_delay();
            seen_low |= d < Duration::from_millis(600);
            seen_high |= d > Duration::from_millis(900);
        }
        assert!(seen_low && seen_high);
    }

    #[test]
    fn huge_attempt_counts_stay_capped() {
        let mut b = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
        for _ in 0..100 {
            assert!(b.next_delay() <= Duration::from_secs(2));
        }
    }
}
