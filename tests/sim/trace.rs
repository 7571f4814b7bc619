//! What a run did, in order, on the simulated clock: a running hash of
//! every line (two runs of one seed must end with the same hash) and the
//! last lines, printed with a violation.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

/// Lines kept for the report of a violation.
const KEPT: usize = 400;

#[derive(Clone, Debug)]
pub(crate) struct Trace(Arc<Mutex<Inner>>);

#[derive(Debug)]
struct Inner {
    start: tokio::time::Instant,
    hash: u64,
    lines: u64,
    last: VecDeque<String>,
    /// Lines noted at the current simulated millisecond.
    at_ms: (u128, u64),
    /// Set when one instant took `SPIN_LINES` lines: a livelock.
    spun: Option<u128>,
    /// How many of the last lines are kept for a report.
    kept: usize,
}

/// Lines at one simulated instant past which the run is called a livelock:
/// the clock only moves when every task waits, so a task that retries
/// without waiting would spin for ever.
const SPIN_LINES: u64 = 50_000;

impl Trace {
    pub(crate) fn new() -> Trace {
        Trace(Arc::new(Mutex::new(Inner {
            start: tokio::time::Instant::now(),
            hash: 0,
            lines: 0,
            last: VecDeque::new(),
            at_ms: (0, 0),
            spun: None,
            // `SIM_TAIL=N` keeps more of the story (a replay's whole trace).
            kept: std::env::var("SIM_TAIL")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(KEPT),
        })))
    }

    /// Milliseconds since the run started, on the simulated clock.
    pub(crate) fn now_ms(&self) -> i64 {
        self.0.lock().unwrap().start.elapsed().as_millis() as i64
    }

    pub(crate) fn note(&self, line: String) {
        let mut t = self.0.lock().unwrap();
        let ms = t.start.elapsed().as_millis();
        t.at_ms = if t.at_ms.0 == ms {
            (ms, t.at_ms.1 + 1)
        } else {
            (ms, 1)
        };
        if t.at_ms.1 == SPIN_LINES {
            t.spun = Some(ms);
            let tail: Vec<String> = t.last.iter().rev().take(40).rev().cloned().collect();
            drop(t);
            // Unwinds the spinning task (the runtime catches it), so the
            // run goes on and reports the livelock as a violation.
            panic!(
                "livelock: {SPIN_LINES} store calls at {ms} ms:\n{}",
                tail.join("\n")
            );
        }
        let line = format!("{ms:>8} {line}");
        // FNV-style chaining: order matters, and no per-process keys.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        t.hash.hash(&mut h);
        line.hash(&mut h);
        t.hash = h.finish();
        t.lines += 1;
        if t.last.len() >= t.kept {
            t.last.pop_front();
        }
        t.last.push_back(line);
    }

    /// The instant (ms) at which a task spun, if one did.
    pub(crate) fn spun(&self) -> Option<u128> {
        self.0.lock().unwrap().spun
    }

    pub(crate) fn hash(&self) -> (u64, u64) {
        let t = self.0.lock().unwrap();
        (t.hash, t.lines)
    }

    pub(crate) fn tail(&self, n: usize) -> Vec<String> {
        let t = self.0.lock().unwrap();
        t.last.iter().rev().take(n).rev().cloned().collect()
    }
}

impl Trace {
    /// With `SIM_LOG=<filter>` (e.g. `aether_replicator=debug`), the
    /// engine's own log lines join the trace, on the simulated clock, for
    /// as long as the guard lives (this thread only: a run is one thread).
    pub(crate) fn engine_log(&self) -> Option<tracing::subscriber::DefaultGuard> {
        let filter = std::env::var("SIM_LOG").ok()?;
        let trace = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .without_time()
            .with_ansi(false)
            .with_writer(move || LogLine(trace.clone()))
            .finish();
        Some(tracing::subscriber::set_default(subscriber))
    }
}

/// One engine log line on its way into the trace.
struct LogLine(Trace);

impl std::io::Write for LogLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = String::from_utf8_lossy(buf);
        self.0.note(format!("log {}", line.trim_end()));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
