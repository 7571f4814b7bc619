//! The run's one source of choices: SplitMix64 behind a shared cell. On a
//! single-threaded runtime the draws happen in the same order each run,
//! so a seed replays exactly.

use std::sync::{Arc, Mutex};

#[derive(Clone, Debug)]
pub(crate) struct Rng(Arc<Mutex<u64>>);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(Arc::new(Mutex::new(seed ^ 0x5851_f42d_4c95_7f2d)))
    }

    pub(crate) fn next(&self) -> u64 {
        let mut s = self.0.lock().unwrap();
        *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// True with probability `p`/1000.
    pub(crate) fn per_mille(&self, p: usize) -> bool {
        p > 0 && self.below(1000) < p as u64
    }

    /// One of `items`.
    pub(crate) fn pick<'a, T>(&self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}
