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
}

impl Trace {
    pub(crate) fn new() -> Trace {
        Trace(Arc::new(Mutex::new(Inner {
            start: tokio::time::Instant::now(),
            hash: 0,
            lines: 0,
            last: VecDeque::new(),
        })))
    }

    /// Milliseconds since the run started, on the simulated clock.
    pub(crate) fn now_ms(&self) -> i64 {
        self.0.lock().unwrap().start.elapsed().as_millis() as i64
    }

    pub(crate) fn note(&self, line: String) {
        let mut t = self.0.lock().unwrap();
        let line = format!("{:>8} {line}", t.start.elapsed().as_millis());
        // FNV-style chaining: order matters, and no per-process keys.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        t.hash.hash(&mut h);
        line.hash(&mut h);
        t.hash = h.finish();
        t.lines += 1;
        if t.last.len() == KEPT {
            t.last.pop_front();
        }
        t.last.push_back(line);
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
