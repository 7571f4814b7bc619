//! Waiting for the system under test to get somewhere: the one way a test
//! polls, and the one failure message when it never gets there.
//!
//! ```no_run
//! # async fn demo(count: impl AsyncFn() -> i64) {
//! use std::time::Duration;
//! use aether_test_kit::eventually;
//!
//! // A probe answers `Ok(what it wanted)` or `Err(what it saw instead)`;
//! // a wait that gives up panics with the last thing seen:
//! // "the peer has 100 keys: not within 30s (312 probes); last saw: 99 keys".
//! eventually("the peer has 100 keys")
//!     .within(Duration::from_secs(30))
//!     .until(async || match count().await {
//!         100 => Ok(()),
//!         n => Err(format!("{n} keys")),
//!     })
//!     .await;
//!
//! // Or compare against a value and let the wait print the last one.
//! eventually("the peer has 100 keys").until_eq(100, async || count().await).await;
//! # }
//! ```
//!
//! A probe may also answer a `bool` (then the failure says only that it
//! stayed false: prefer a `Result` that says what it saw), an `Option`, or
//! a `Result` whose error is a `String` or the client's error: see
//! [`Outcome`] and [`Seen`]. Blocking code (no runtime, or a test that must not yield)
//! uses [`Eventually::blocking`], which sleeps the thread between probes.
//! [`Eventually::try_until`] and [`Eventually::try_blocking`] hand the
//! timeout back instead of panicking, for a test that asserts on it with
//! its own message; [`wait_until`] and [`wait_until_async`] are those for
//! a plain condition.

use std::fmt::{self, Debug};
use std::time::{Duration, Instant};

/// How long a wait lasts unless told otherwise ([`Eventually::within`]):
/// long enough for an etcd to elect a leader or a client to reconnect on a
/// loaded 2-core machine, short enough that a hung test fails on its own.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a wait probes unless told otherwise ([`Eventually::every`]).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(50);

/// Starts a wait for the condition `what` (a phrase saying what should
/// become true: it heads the failure message). Configure it with
/// [`Eventually::within`] and [`Eventually::every`], then run it with
/// [`Eventually::until`] (async) or [`Eventually::blocking`].
pub fn eventually(what: impl Into<String>) -> Eventually {
    Eventually {
        what: what.into(),
        timeout: DEFAULT_TIMEOUT,
        interval: DEFAULT_INTERVAL,
    }
}

/// A wait being set up; see [`eventually`].
#[derive(Clone, Debug)]
#[must_use = "a wait does nothing until it is run with `until` or `blocking`"]
pub struct Eventually {
    what: String,
    timeout: Duration,
    interval: Duration,
}

/// A wait that gave up: what it waited for, for how long, and the last
/// thing its probe saw. Its `Display` is the message a failed wait panics
/// with.
#[derive(Clone, Debug)]
pub struct TimedOut {
    /// The condition waited for (the phrase given to [`eventually`]).
    pub what: String,
    /// How long it waited.
    pub waited: Duration,
    /// How many times it probed.
    pub probes: u32,
    /// What the last probe saw instead.
    pub last_saw: String,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: not within {:?} ({} probes); last saw: {}",
            self.what, self.waited, self.probes, self.last_saw
        )
    }
}

impl std::error::Error for TimedOut {}

/// What a probe answers: done (with a value) or not yet (with what it saw
/// instead).
pub trait Outcome {
    /// What the wait hands back once the probe is satisfied.
    type Output;
    /// `Ok` when the probe is satisfied, else `Err` with what it saw.
    fn into_outcome(self) -> Result<Self::Output, String>;
}

impl Outcome for bool {
    type Output = ();
    fn into_outcome(self) -> Result<(), String> {
        if self { Ok(()) } else { Err("false".into()) }
    }
}

impl<T> Outcome for Option<T> {
    type Output = T;
    fn into_outcome(self) -> Result<T, String> {
        self.ok_or_else(|| "None".into())
    }
}

impl<T, E: Seen> Outcome for Result<T, E> {
    type Output = T;
    fn into_outcome(self) -> Result<T, String> {
        self.map_err(|e| e.seen())
    }
}

/// What a probe saw instead of what it wanted, as a failed wait prints it:
/// a `String` or `&str` as it is, an error by its `Debug` (which names the
/// variant). For another type, `map_err` it to a `String`.
pub trait Seen {
    /// The text the failure message shows.
    fn seen(&self) -> String;
}

impl Seen for String {
    fn seen(&self) -> String {
        self.clone()
    }
}

impl Seen for &str {
    fn seen(&self) -> String {
        (*self).to_string()
    }
}

impl Seen for aether_etcd::Error {
    fn seen(&self) -> String {
        format!("{self:?}")
    }
}

impl Seen for std::io::Error {
    fn seen(&self) -> String {
        format!("{self:?}")
    }
}

impl Eventually {
    /// Gives up after `timeout` (default [`DEFAULT_TIMEOUT`]).
    pub fn within(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Probes every `interval` (default [`DEFAULT_INTERVAL`]).
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Probes until `probe` is satisfied and returns what it answered then;
    /// panics with the [`TimedOut`] message when it is not within the
    /// timeout. Sleeps on the tokio runtime between probes, so the
    /// runtime's other tasks (a [`crate::FaultProxy`], say) run meanwhile.
    /// The probe runs at least once, and once more at the deadline.
    #[track_caller]
    pub fn until<O: Outcome>(
        self,
        probe: impl AsyncFnMut() -> O,
    ) -> impl Future<Output = O::Output> {
        // `#[track_caller]` does not reach into an async body: take the
        // caller's location here, outside it.
        let at = std::panic::Location::caller();
        async move {
            match self.try_until(probe).await {
                Ok(v) => v,
                Err(e) => panic!("{e} (waited at {at})"),
            }
        }
    }

    /// [`Eventually::until`], handing the timeout back instead of panicking.
    pub async fn try_until<O: Outcome>(
        self,
        mut probe: impl AsyncFnMut() -> O,
    ) -> Result<O::Output, TimedOut> {
        let start = tokio::time::Instant::now();
        let deadline = start + self.timeout;
        let mut probes = 0;
        loop {
            probes += 1;
            let saw = match probe().await.into_outcome() {
                Ok(v) => return Ok(v),
                Err(saw) => saw,
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(self.timed_out(now - start, probes, saw));
            }
            tokio::time::sleep_until((now + self.interval).min(deadline)).await;
        }
    }

    /// Probes until `get` returns `want`; panics with the last value it
    /// returned when it does not within the timeout.
    #[track_caller]
    pub fn until_eq<T: PartialEq + Debug>(
        self,
        want: T,
        mut get: impl AsyncFnMut() -> T,
    ) -> impl Future<Output = ()> {
        let at = std::panic::Location::caller();
        async move {
            let probe = async || {
                let got = get().await;
                if got == want {
                    Ok(())
                } else {
                    Err(format!("{got:?} (want {want:?})"))
                }
            };
            if let Err(e) = self.try_until(probe).await {
                panic!("{e} (waited at {at})");
            }
        }
    }

    /// The blocking form of [`Eventually::until`]: sleeps the thread between
    /// probes. Not on a current-thread runtime whose tasks must run
    /// meanwhile (a [`crate::FaultProxy`] on it would stall): use
    /// [`Eventually::until`] there.
    #[track_caller]
    pub fn blocking<O: Outcome>(self, probe: impl FnMut() -> O) -> O::Output {
        match self.try_blocking(probe) {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`Eventually::blocking`], handing the timeout back instead of panicking.
    pub fn try_blocking<O: Outcome>(
        self,
        mut probe: impl FnMut() -> O,
    ) -> Result<O::Output, TimedOut> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut probes = 0;
        loop {
            probes += 1;
            let saw = match probe().into_outcome() {
                Ok(v) => return Ok(v),
                Err(saw) => saw,
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(self.timed_out(now - start, probes, saw));
            }
            std::thread::sleep(self.interval.min(deadline - now));
        }
    }

    fn timed_out(self, waited: Duration, probes: u32, last_saw: String) -> TimedOut {
        TimedOut {
            what: self.what,
            waited,
            probes,
            last_saw,
        }
    }
}

/// Polls `cond` every 20 ms until it returns true or `timeout` elapses, and
/// returns whether it became true: [`Eventually::try_blocking`] for a plain
/// condition, for a test that asserts on the answer with its own message
/// (which should say what it saw). Blocking: not on a current-thread
/// runtime whose tasks must run meanwhile; use [`wait_until_async`] there.
pub fn wait_until(timeout: Duration, cond: impl FnMut() -> bool) -> bool {
    eventually("the condition")
        .within(timeout)
        .every(Duration::from_millis(20))
        .try_blocking(cond)
        .is_ok()
}

/// The async form of [`wait_until`] ([`Eventually::try_until`] for a plain
/// condition): yields to the runtime between probes.
pub async fn wait_until_async(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    eventually("the condition")
        .within(timeout)
        .every(Duration::from_millis(20))
        .try_until(async || cond())
        .await
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_that_gives_up_says_what_it_last_saw() {
        let mut n = 0;
        let err = eventually("n reaches 100")
            .within(Duration::from_millis(50))
            .every(Duration::from_millis(5))
            .try_blocking(|| {
                n += 1;
                if n >= 100 {
                    Ok(())
                } else {
                    Err(format!("n = {n}"))
                }
            })
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("n reaches 100: not within "), "{msg}");
        assert!(
            msg.ends_with(&format!("probes); last saw: n = {n}")),
            "{msg}"
        );
        assert_eq!(err.probes, n);
    }

    #[test]
    fn a_wait_hands_back_what_satisfied_it() {
        let mut n = 0;
        let got = eventually("n reaches 3")
            .every(Duration::from_millis(1))
            .blocking(|| {
                n += 1;
                (n >= 3).then_some(n)
            });
        assert_eq!(got, 3);
    }

    #[test]
    #[should_panic(expected = "stays false: not within")]
    fn a_blocking_wait_panics_with_its_message() {
        eventually("stays false")
            .within(Duration::from_millis(10))
            .blocking(|| false);
    }

    #[tokio::test]
    async fn the_async_wait_probes_until_and_at_the_deadline() {
        let mut n = 0;
        let err = eventually("never")
            .within(Duration::from_millis(30))
            .every(Duration::from_millis(10))
            .try_until(async || {
                n += 1;
                Err::<(), _>("not yet")
            })
            .await
            .unwrap_err();
        assert_eq!(err.last_saw, "not yet");
        assert!(n >= 2, "probed {n} times");
        assert!(wait_until_async(Duration::from_secs(1), || true).await);
        assert!(!wait_until(Duration::from_millis(10), || false));
    }
}
