//! A deterministic simulation of the mirror engine.
//!
//! The real engine (`aether_replicator::mirror`) runs against in-memory
//! etcds (`aether_etcd::model`, checked against real etcd by
//! `tests/model_conformance.rs`) through the engine's store interface
//! (`aether_replicator::store`), on tokio's paused clock and one thread,
//! with every choice (load, faults, the links' weather, the engines' ids
//! and back-off) drawn from one seed. A run is a mesh of three regions
//! with faults for a minute of simulated time and then healing; the
//! checker judges every copy every 200 ms: a copy its state key calls
//! fresh must hold what its source held within the freshness bound, and
//! after healing every copy must be exact.
//!
//! Why tokio's paused clock and not `turmoil` or `madsim`: the engine
//! talks to etcd only through `store::Backend`, so there is no network to
//! simulate, and tokio alone needs no other runtime or build flag. Tokio
//! draws at random in two places, and neither may decide an order here:
//! the fairness draw of an unbiased `select!` (the engine and the model
//! use `biased;`), and the list a `watch` receiver waits on, one of eight,
//! which decides the order its waiters wake in (the model wakes requests
//! on a held member with a `Notify`; a `watch` with several waiting tasks
//! made two runs of one seed part).
//!
//! - `cargo test --test sim`: a fixed set of seeds, and a seed run twice
//!   must leave the same trace.
//! - `SIM_SEEDS=N [SIM_FROM=S] cargo test --release --test sim -- --ignored --nocapture explore`:
//!   N more seeds from S, on every core (`SIM_THREADS` to choose); the
//!   lowest failing seed prints its violation and the trace's last lines.
//!   `SIM_SEED=S` replays one (`SIM_TAIL=N`: the trace's last N lines, 400 by default). `SIM_COPY_WATCH=0` runs the engines without
//!   their copy watches, as the reverted-fix checks of the gaps the copy
//!   watch closed do (docs/reliability.md); `SIM_CHURN=1` changes every
//!   region's leader every few seconds, faster than the verification
//!   interval.

mod link;
mod rng;
mod scene;
mod trace;

use scene::{Knobs, Outcome};

/// The seeds every run of the suite checks.
const FIXED_SEEDS: std::ops::Range<u64> = 1..9;

fn run(seed: u64, knobs: Knobs) -> Outcome {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
        .block_on(scene::run(seed, knobs))
}

fn report(seed: u64, out: &Outcome) -> String {
    format!(
        "seed {seed}: {} violations, {} samples, {} fresh claims judged, faults {:?}\n{}\n--- the trace's last lines:\n{}",
        out.violations.len(),
        out.samples,
        out.claims,
        out.faults,
        out.violations.first().cloned().unwrap_or_default(),
        out.tail.join("\n")
    )
}

/// Runs `seeds`, each on its own runtime; on several threads when asked
/// (a seed's run does not depend on which thread runs it, or beside what).
/// Fails with the lowest failing seed's report.
fn check(seeds: std::ops::Range<u64>, threads: usize, knobs: Knobs) {
    let next = std::sync::atomic::AtomicU64::new(seeds.start);
    let failed = std::sync::Mutex::new(None::<(u64, String)>);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let lower_failed = failed.lock().unwrap().as_ref().is_some_and(|f| f.0 < seed);
                    if seed >= seeds.end || lower_failed {
                        return;
                    }
                    let started = std::time::Instant::now();
                    let out = run(seed, knobs);
                    eprintln!(
                        "seed {seed}: {} claims, {} trace lines, {:?} faults, {:.2} s",
                        out.claims,
                        out.lines,
                        out.faults.values().sum::<u64>(),
                        started.elapsed().as_secs_f64()
                    );
                    // A run that judged little proves little, nor one
                    // whose nemesis drew a few kinds of fault only: five
                    // of the eight at least (two seeds of the first 150
                    // with SIM_CHURN=1 drew five). At least half the
                    // samples must be fresh claims (59 % was the lowest
                    // of seeds 1-1,000 in every mode): when engines
                    // started later read a wall clock behind the
                    // checker's, 7-40 % were, and reverted fix 4 went
                    // unfound for it.
                    if !out.violations.is_empty()
                        || out.claims * 2 < out.samples
                        || out.faults.len() < 5
                    {
                        let mut f = failed.lock().unwrap();
                        if f.as_ref().is_none_or(|f| f.0 > seed) {
                            *f = Some((seed, report(seed, &out)));
                        }
                    }
                }
            });
        }
    });
    if let Some((_, report)) = failed.into_inner().unwrap() {
        panic!("{report}");
    }
}

#[test]
fn fixed_seeds_hold_every_promise() {
    check(FIXED_SEEDS, 1, Knobs::default());
}

/// Seeds that found an engine hole once (docs/reliability.md has the
/// story of each), run on every build.
#[test]
fn seeds_that_found_holes_pass() {
    for seed in [16, 71, 246, 672, 947] {
        check(seed..seed + 1, 1, Knobs::default());
    }
}

/// Leadership handed over every few seconds (`SIM_CHURN=1`), with the copy
/// watch and without it.
#[test]
fn churn_holds_every_promise() {
    for copy_watch in [true, false] {
        let knobs = Knobs {
            churn: true,
            copy_watch,
            ..Knobs::default()
        };
        check(1..3, 1, knobs);
    }
}

#[test]
fn a_seed_replays_exactly() {
    let a = run(3, Knobs::default());
    let b = run(3, Knobs::default());
    // The kept tails (400 lines, `SIM_TAIL` more) say where they part.
    let parted = a
        .tail
        .iter()
        .zip(&b.tail)
        .position(|(x, y)| x != y)
        .map(|i| {
            let from = i.saturating_sub(5);
            format!(
                "first difference in the kept tail, line {i}:\n{}\n---\n{}",
                a.tail[from..(i + 5).min(a.tail.len())].join("\n"),
                b.tail[from..(i + 5).min(b.tail.len())].join("\n")
            )
        });
    assert_eq!(
        (a.hash, a.lines),
        (b.hash, b.lines),
        "two runs of one seed differ: {}",
        parted.unwrap_or_else(|| "not in the kept tail (SIM_TAIL=100000 keeps it all)".into())
    );
}

#[test]
#[ignore = "exploration: SIM_SEEDS=N [SIM_FROM=S] or SIM_SEED=S"]
fn explore() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let knobs = Knobs {
        copy_watch: env("SIM_COPY_WATCH") != Some(0),
        churn: env("SIM_CHURN") == Some(1),
        ..Knobs::default()
    };
    if let Some(seed) = env("SIM_SEED") {
        // A replayed seed tells its story whether or not it fails.
        eprintln!("{}", report(seed, &run(seed, knobs)));
        return check(seed..seed + 1, 1, knobs);
    }
    let from = env("SIM_FROM").unwrap_or(1000);
    let threads = env("SIM_THREADS").map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |n| n as usize,
    );
    check(from..from + env("SIM_SEEDS").unwrap_or(100), threads, knobs);
}
