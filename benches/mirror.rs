//! Mirror throughput and latency against real etcd processes started by the
//! test harness: base sync against the peer's write ceiling, live bursts,
//! and a handoff between engines. Besides criterion's timings, each bench
//! prints `REPORT` lines with the derived figures (keys/s, percentiles,
//! ratios) that BENCHMARKS.md quotes.

#[path = "../tests/common/mod.rs"]
mod common;

use aether_replicator::etcd::LeaseId;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aether_replicator::etcd::{
    Client, ClientConfig, Delete, Put, Range, TxnBatcher, TxnLimits, WatchOptions,
};
use aether_replicator::mirror::{DEFAULT_PEER_CONNECTIONS, Engine, MirrorConfig, PeerStats};
use common::{Etcd, FaultProxy};
use criterion::measurement::WallTime;
use criterion::{
    Bencher, BenchmarkGroup, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};

const PREFIX: &str = "/aether/v1/regions/a/";

fn key(i: usize) -> String {
    common::keys::load_key(PREFIX, i)
}

fn value(i: usize) -> Vec<u8> {
    let mut v = format!("{{\"clusterName\":\"c1\",\"region\":\"a\",\"zone\":\"a-1\",\"n\":{i}}}")
        .into_bytes();
    v.resize(100, b' ');
    v
}

fn client(e: &Etcd) -> Client {
    Client::connect(ClientConfig::new(e.endpoints())).expect("client")
}

/// A source and a peer etcd (running while held), a client of each, and an
/// engine mirroring the source to the peer, region b, once it has synced.
///
/// `AETHER_BENCH_ETCD_ARGS` (flags separated by spaces) is passed to both
/// etcds, to measure a configuration of theirs.
fn synced_pair(rt: &tokio::runtime::Runtime) -> ([Etcd; 2], Client, Client, Engine) {
    let args = std::env::var("AETHER_BENCH_ETCD_ARGS").unwrap_or_default();
    let args: Vec<&str> = args.split_whitespace().collect();
    let src = Etcd::builder().extra_args(&args).start();
    let dst = Etcd::builder().extra_args(&args).start();
    let (s, d) = (client(&src), client(&dst));
    let engine = Engine::start(s.clone(), vec![("b".into(), d.clone())], cfg()).expect("engine");
    rt.block_on(engine.wait_synced());
    ([src, dst], s, d, engine)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Writes keys `0..n` with 128-op txns, `inflight` at a time.
async fn write_batched(c: &Client, range: std::ops::Range<usize>, inflight: usize) {
    write_batched_under(c, range, inflight, LeaseId::NONE).await
}

/// [`write_batched`], every key attached to `lease`.
async fn write_batched_under(
    c: &Client,
    range: std::ops::Range<usize>,
    inflight: usize,
    lease: LeaseId,
) {
    let mut b = TxnBatcher::new(TxnLimits::default());
    for i in range {
        b.put(key(i), value(i), lease);
    }
    let mut pending: tokio::task::JoinSet<aether_replicator::etcd::Result<_>> =
        tokio::task::JoinSet::new();
    for t in b.finish() {
        if pending.len() >= inflight {
            pending
                .join_next()
                .await
                .expect("pending")
                .expect("join")
                .expect("txn");
        }
        let c = c.clone();
        pending.spawn(async move { c.txn(t).await });
    }
    while let Some(r) = pending.join_next().await {
        r.expect("join").expect("txn");
    }
}

fn cfg() -> MirrorConfig {
    let mut c = MirrorConfig::new("a");
    c.lease_ttl = Duration::from_secs(30);
    c
}

/// `AETHER_BENCH_BASE_SYNC_KEYS` (comma separated, default 10000,100000)
/// picks the sizes; `AETHER_BENCH_TRACE=<filter>` (e.g.
/// `aether_replicator=debug`) logs the engine's events with their time
/// since start, to see where a sync's time goes.
fn base_sync(c: &mut Criterion) {
    if !selected("base_sync/") {
        return;
    }
    let rt = runtime();
    let _in = rt.enter();
    if let Ok(filter) = std::env::var("AETHER_BENCH_TRACE") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let sizes: Vec<usize> = std::env::var("AETHER_BENCH_BASE_SYNC_KEYS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 100_000]);
    for n in sizes {
        let src = Etcd::start();
        let mut dst = Etcd::start();
        let s = client(&src);
        rt.block_on(write_batched(&s, 0..n, 16));
        let mut g = group(c, format!("base_sync/{}k", n / 1000));
        g.throughput(Throughput::Elements(n as u64));
        let mut mirror_rates = Vec::new();
        g.bench_function("mirror", |b| {
            iter_runs(b, || {
                dst.restart_empty();
                let d = client(&dst);
                let start = Instant::now();
                let engine =
                    Engine::start(s.clone(), vec![("b".into(), d.clone())], cfg()).expect("engine");
                rt.block_on(engine.wait_synced());
                let took = start.elapsed();
                mirror_rates.push(n as f64 / took.as_secs_f64());
                rt.block_on(engine.shutdown());
                let got = rt
                    .block_on(d.range(Range::prefix(PREFIX).count_only()))
                    .expect("count")
                    .count;
                assert_eq!(got as usize, n, "peer incomplete after sync");
                took
            })
        });
        g.finish();
        // 64 in flight unless told otherwise: the fastest in the sweep of
        // BENCHMARKS.md §1 (8, 16, 32, 64).
        let inflight: usize = env_or("AETHER_BENCH_CEILING_INFLIGHT", 64);
        // Plain, and with every key under a lease granted first, as the
        // mirror writes them: etcd attaches each key to its lease, work
        // the plain ceiling does not ask of it.
        let [mut ceiling_rates, mut leased_rates] = [Vec::new(), Vec::new()];
        for (name, leased, rates) in [
            ("write_ceiling", false, &mut ceiling_rates),
            ("write_ceiling_leased", true, &mut leased_rates),
        ] {
            let mut g = group(c, format!("base_sync/{}k", n / 1000));
            g.throughput(Throughput::Elements(n as u64));
            bench_runs(g, name, || {
                dst.restart_empty();
                let d = client(&dst);
                let start = Instant::now();
                rt.block_on(async {
                    let lease = match leased {
                        true => {
                            d.lease_grant(Duration::from_secs(30))
                                .await
                                .expect("grant")
                                .id
                        }
                        false => LeaseId::NONE,
                    };
                    write_batched_under(&d, 0..n, inflight, lease).await
                });
                let took = start.elapsed();
                rates.push(n as f64 / took.as_secs_f64());
                took
            });
        }
        if mirror_rates.is_empty() || ceiling_rates.is_empty() {
            continue;
        }
        let (m, w) = (median(&mut mirror_rates), median(&mut ceiling_rates));
        let l = if leased_rates.is_empty() {
            f64::NAN
        } else {
            median(&mut leased_rates)
        };
        println!(
            "REPORT base_sync n={n} mirror_keys_per_s={m:.0} ceiling_keys_per_s={w:.0} ratio={:.2} leased_ceiling_keys_per_s={l:.0} ratio_to_leased={:.2}",
            m / w,
            m / l
        );
    }
}

/// A base sync of 20k keys to a peer run with limits below etcd's
/// defaults, with the engine told them (`explicit`) and left to find them
/// (`discovered`): `--max-txn-ops 16`, and `--max-request-bytes 262144`
/// with 3 KiB values. The discovered run should be within 0.8× of the
/// explicit one, and report the peer's limit.
fn lower_limits(c: &mut Criterion) {
    if !selected("lower_limits/") {
        return;
    }
    let rt = runtime();
    let _in = rt.enter();
    let n: usize = env_or("AETHER_BENCH_LIMITS_KEYS", 20_000);
    let cases: [(&str, String, usize, TxnLimits); 2] = [
        (
            "ops16",
            "--max-txn-ops=16".into(),
            100,
            TxnLimits {
                max_ops: 16,
                ..TxnLimits::default()
            },
        ),
        (
            "bytes256k",
            "--max-request-bytes=262144".into(),
            3 * 1024,
            TxnLimits {
                max_bytes: 262_144,
                ..TxnLimits::default()
            },
        ),
    ];
    for (name, flag, value_len, explicit) in cases {
        let src = Etcd::start();
        let s = client(&src);
        let mut b = TxnBatcher::new(TxnLimits::default());
        let v = vec![b'v'; value_len];
        for i in 0..n {
            b.put(key(i), v.clone(), LeaseId::NONE);
        }
        for t in b.finish() {
            rt.block_on(s.txn(t)).expect("txn");
        }
        let mut dst = Etcd::builder().extra_args(&[&flag]).start();
        let g = group(c, format!("lower_limits/{name}"));
        let mut rates = [Vec::new(), Vec::new()];
        let mut found = Vec::new();
        let mut sync = |limits: TxnLimits, rates: &mut Vec<f64>| {
            dst.restart_empty();
            let d = client(&dst);
            let mut cfg = cfg();
            cfg.limits = limits;
            let start = Instant::now();
            let engine = Engine::start(s.clone(), vec![("b".into(), d)], cfg).expect("engine");
            rt.block_on(engine.wait_synced());
            let took = start.elapsed();
            rates.push(n as f64 / took.as_secs_f64());
            let st = &engine.stats()[0];
            let limit = (
                st.txn_ops_limit.load(Ordering::Relaxed),
                st.request_bytes_limit.load(Ordering::Relaxed),
            );
            rt.block_on(engine.shutdown());
            (took, limit)
        };
        let mut g = g;
        g.bench_function("explicit", |b| {
            iter_runs(b, || sync(explicit, &mut rates[0]).0)
        });
        bench_runs(g, "discovered", || {
            let (took, limit) = sync(TxnLimits::default(), &mut rates[1]);
            found.push(limit);
            took
        });
        if rates.iter().any(Vec::is_empty) {
            continue;
        }
        let (e, d) = (median(&mut rates[0]), median(&mut rates[1]));
        let (ops, bytes) = found.last().copied().unwrap_or_default();
        println!(
            "REPORT lower_limits case={name} n={n} explicit_keys_per_s={e:.0} discovered_keys_per_s={d:.0} ratio={:.2} discovered_txn_ops={ops} discovered_request_bytes={bytes}",
            d / e
        );
    }
}

/// A benchmark group as every bench here runs it: each iteration is a
/// whole run against real etcd, so flat sampling, ten samples, and the
/// shortest warm-up and measurement times (criterion's defaults would
/// repeat each run many times over).
fn group<'a>(c: &'a mut Criterion, name: impl Into<String>) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
    g
}

/// Times each iteration as one call of `run`, which returns the time that
/// counts: what it does before and after is set-up and bookkeeping.
fn iter_runs(b: &mut Bencher<'_, WallTime>, mut run: impl FnMut() -> Duration) {
    b.iter_custom(|iters| (0..iters).map(|_| run()).sum());
}

/// Benchmarks `name`, the group's one function, with [`iter_runs`], and
/// finishes the group.
fn bench_runs(mut g: BenchmarkGroup<'_, WallTime>, name: &str, mut run: impl FnMut() -> Duration) {
    g.bench_function(name, |b| iter_runs(b, &mut run));
    g.finish();
}

/// The median and the largest of `tails`, times from the last write to the
/// peer holding everything (s), in ms.
fn tail_ms(tails: &[f64]) -> (f64, f64) {
    (
        median(&mut tails.to_vec()) * 1e3,
        tails.iter().copied().fold(0.0, f64::max) * 1e3,
    )
}

/// A percentile of `sorted` latencies, in ms.
fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    percentile(sorted, p).as_secs_f64() * 1e3
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// One burst of `revisions` single-put revisions from `writers` tasks, at
/// most `rate` revisions/s in total (None: as fast as the source takes
/// them). Returns (per-key latencies, time from the last write to the peer
/// holding everything, achieved source rate).
async fn burst(
    src: &Client,
    dst: &Client,
    base: usize,
    revisions: usize,
    writers: usize,
    rate: Option<f64>,
) -> (Vec<Duration>, Duration, f64) {
    let b = burst_traced(src, dst, base, revisions, writers, rate, None).await;
    (b.lat, b.tail, b.rate)
}

/// What [`burst_traced`] measured.
struct Burst {
    /// Per-key latencies from the source put's start to the peer's watch
    /// event, sorted.
    lat: Vec<Duration>,
    /// From the last write to the peer holding everything.
    tail: Duration,
    /// Achieved source rate, revisions/s.
    rate: f64,
    /// Gaps of more than [`STALL_GAP`] between consecutive arrivals at the
    /// measuring watch while the source was still writing.
    stalls: usize,
    /// Latencies above [`STALL_LATENCY`].
    slow: usize,
    /// Where each key's latency went, when the engine's stats were given.
    stages: Option<Stages>,
}

/// A stall as the bench counts it: no event at the measuring watch for
/// this long while the source is still being written.
const STALL_GAP: Duration = Duration::from_millis(250);
/// A latency counted as stalled.
const STALL_LATENCY: Duration = Duration::from_millis(500);

/// A key's latency split at the engine's two counters, sampled every
/// millisecond by a thread of its own (outside tokio, so a stalled runtime
/// would show as such): the put (start to the source's reply), the source
/// watch (reply to the engine having seen the revision), the engine's
/// txns (seen to acknowledged by the peer), and the measuring watch
/// (acknowledged to its event). The largest of each, in ms, and the
/// number of keys whose stage took more than [`STALL_GAP`].
#[derive(Default, Debug)]
struct Stages {
    max_ms: [f64; 4],
    over: [usize; 4],
    /// The longest gap of the measuring watch: its start, relative to the
    /// burst's start, and its length, in ms.
    worst_gap: (f64, f64),
    /// The longest time without a put completing at the source, in ms.
    worst_put_gap_ms: f64,
}

const STAGE_NAMES: [&str; 4] = ["put", "source_watch", "engine_txns", "measuring_watch"];

/// Each key's put as the writers saw it: its start, the source's reply,
/// and the revision it made.
type Sent = Arc<Mutex<Vec<Option<(Instant, Instant, i64)>>>>;

/// [`burst`], also counting stalls and, given the engine's stats for this
/// peer, splitting each key's latency into [`Stages`].
async fn burst_traced(
    src: &Client,
    dst: &Client,
    base: usize,
    revisions: usize,
    writers: usize,
    rate: Option<f64>,
    stats: Option<Arc<PeerStats>>,
) -> Burst {
    // (start of the put, its reply, the source revision it made)
    let sent: Sent = Arc::new(Mutex::new(vec![None; revisions]));
    let (_stream, mut watcher) = dst.watch(WatchOptions::prefix(PREFIX)).expect("watch");
    // Make sure the peer watch is live before writing: the create request
    // is pipelined, so a single probe could land before the watch exists.
    'live: for attempt in 0..100 {
        dst.put(Put::new(
            format!("{PREFIX}probe/{base}"),
            format!("{attempt}"),
        ))
        .await
        .expect("probe");
        let deadline = tokio::time::Instant::now() + Duration::from_millis(200);
        while let Ok(r) = tokio::time::timeout_at(deadline, watcher.message()).await {
            if !r.expect("watch").expect("watch open").events.is_empty() {
                break 'live;
            }
        }
    }
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let sampler = stats.map(|st| Sampler::start(st, start));
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let (src, sent, next) = (src.clone(), sent.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= revisions {
                    return;
                }
                if let Some(rate) = rate {
                    let due = start + Duration::from_secs_f64(i as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
                let t0 = Instant::now();
                let r = src
                    .put(Put::new(key(base + i), value(i)))
                    .await
                    .expect("put");
                sent.lock().expect("lock")[i] = Some((t0, Instant::now(), r.header.revision));
            }
        }));
    }
    let mut arrived: Vec<Option<Instant>> = vec![None; revisions];
    let mut remaining = revisions;
    let mut last_write_done = None;
    // Arrival times of the watch responses that carried burst keys.
    let mut arrivals = Vec::new();
    let give_up = Instant::now() + Duration::from_secs(120);
    while remaining > 0 {
        assert!(
            Instant::now() < give_up,
            "burst: {remaining} of {revisions} keys never reached the peer"
        );
        tokio::select! {
            r = watcher.message() => {
                let r = r.expect("watch").expect("watch");
                let now = Instant::now();
                let before = remaining;
                for e in r.events {
                    let k = String::from_utf8_lossy(e.kv.key()).to_string();
                    if let Some(i) = index_of(&k, base, revisions)
                        && arrived[i].is_none()
                    {
                        arrived[i] = Some(now);
                        remaining -= 1;
                    }
                }
                if remaining < before {
                    arrivals.push(now);
                }
            }
            _ = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        if last_write_done.is_none() && tasks.iter().all(|t| t.is_finished()) {
            last_write_done = Some(Instant::now());
        }
    }
    for t in tasks {
        t.await.expect("writer");
    }
    let done = Instant::now();
    let samples = sampler.map(Sampler::stop);
    let source_end = last_write_done.unwrap_or(done);
    let sent = sent.lock().expect("lock");
    let mut lat: Vec<Duration> = sent
        .iter()
        .zip(&arrived)
        .filter_map(|(s, a)| Some(a.as_ref()?.saturating_duration_since((*s)?.0)))
        .collect();
    lat.sort();
    // Gaps from the first write (the first arrival can't precede it)
    // while the source is still being written.
    let mut stalls = 0;
    let mut worst_gap = (0.0, 0.0);
    let mut prev = start;
    for &a in arrivals.iter().filter(|&&a| a <= source_end) {
        let gap = a - prev;
        if gap > STALL_GAP {
            stalls += 1;
        }
        if gap.as_secs_f64() * 1e3 > worst_gap.1 {
            worst_gap = ((prev - start).as_secs_f64() * 1e3, gap.as_secs_f64() * 1e3);
        }
        prev = a;
    }
    let stages = samples.map(|samples| {
        let mut st = Stages {
            worst_gap,
            ..Stages::default()
        };
        let mut replies: Vec<Instant> = sent.iter().flatten().map(|s| s.1).collect();
        replies.sort();
        st.worst_put_gap_ms = replies
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
            .fold(
                replies
                    .first()
                    .map_or(0.0, |f| (*f - start).as_secs_f64() * 1e3),
                f64::max,
            );
        for (s, a) in sent.iter().zip(&arrived) {
            let (Some((t0, t1, rev)), Some(tw)) = (*s, *a) else {
                continue;
            };
            // The first sample at which each counter held the revision;
            // the reply when the engine saw it before the put returned.
            let seen = first_at(&samples, |s| s.1 >= rev).unwrap_or(tw).max(t1);
            let acked = first_at(&samples, |s| s.2 >= rev).unwrap_or(tw).max(seen);
            let marks = [t0, t1, seen, acked, tw.max(acked)];
            for (k, w) in marks.windows(2).enumerate() {
                let d = w[1] - w[0];
                st.max_ms[k] = st.max_ms[k].max(d.as_secs_f64() * 1e3);
                if d > STALL_GAP {
                    st.over[k] += 1;
                }
            }
        }
        st
    });
    let elapsed = source_end.duration_since(start).as_secs_f64();
    Burst {
        slow: lat.iter().filter(|&&l| l > STALL_LATENCY).count(),
        lat,
        tail: done.saturating_duration_since(source_end),
        rate: revisions as f64 / elapsed,
        stalls,
        stages,
    }
}

/// The time of the first sample for which `pred` holds.
fn first_at(
    samples: &[(Instant, i64, i64)],
    pred: impl Fn(&(Instant, i64, i64)) -> bool,
) -> Option<Instant> {
    // The counters only grow, so the samples are sorted for `pred`.
    let i = samples.partition_point(|s| !pred(s));
    samples.get(i).map(|s| s.0)
}

/// A thread sampling a peer's `source_revision` (seen on the source watch)
/// and `applied_revision` (acknowledged by the peer) every millisecond.
struct Sampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(Instant, i64, i64)>>,
}

impl Sampler {
    fn start(st: Arc<PeerStats>, _from: Instant) -> Sampler {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut v = Vec::with_capacity(8192);
            while !flag.load(Ordering::Relaxed) {
                let s = (
                    Instant::now(),
                    st.source_revision.load(Ordering::Relaxed),
                    st.applied_revision.load(Ordering::Relaxed),
                );
                if v.last()
                    .is_none_or(|l: &(Instant, i64, i64)| (l.1, l.2) != (s.1, s.2))
                {
                    v.push(s);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            v
        });
        Sampler { stop, thread }
    }

    fn stop(self) -> Vec<(Instant, i64, i64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("sampler")
    }
}

/// The etcd metrics that could explain a stall, summed over their label
/// sets (histograms by `_sum` and `_count`).
const WATCHED_METRICS: &[&str] = &[
    "etcd_debugging_mvcc_slow_watcher_total",
    "etcd_debugging_mvcc_pending_events_total",
    "etcd_debugging_mvcc_watcher_total",
    "etcd_debugging_mvcc_watch_stream_total",
    "etcd_debugging_mvcc_events_total",
    "etcd_disk_backend_commit_duration_seconds_sum",
    "etcd_disk_backend_commit_duration_seconds_count",
    "etcd_disk_wal_fsync_duration_seconds_sum",
    "etcd_disk_wal_fsync_duration_seconds_count",
    "etcd_server_slow_apply_total",
    "etcd_server_slow_read_indexes_total",
    "etcd_server_heartbeat_send_failures_total",
    "etcd_debugging_snap_save_total_duration_seconds_count",
    "etcd_disk_backend_snapshot_duration_seconds_count",
    "etcd_mvcc_db_total_size_in_bytes",
    "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count",
    "etcd_server_apply_duration_seconds_sum",
    "etcd_server_apply_duration_seconds_count",
    "go_gc_duration_seconds_count",
    "go_gc_duration_seconds_sum",
    "grpc_server_msg_sent_total",
];

/// [`WATCHED_METRICS`] from an etcd's `/metrics`, summed per name.
fn etcd_metrics(e: &Etcd) -> std::collections::BTreeMap<&'static str, f64> {
    let text = e.metrics().unwrap_or_default();
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name_labels, v)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = name_labels.split('{').next().unwrap_or("");
        if let (Some(m), Ok(v)) = (
            WATCHED_METRICS.iter().find(|&&m| m == name),
            v.parse::<f64>(),
        ) {
            *out.entry(*m).or_insert(0.0) += v;
        }
    }
    out
}

/// The metrics that moved between `a` and `b`, as `name=+delta` pairs.
fn metrics_delta(
    a: &std::collections::BTreeMap<&'static str, f64>,
    b: &std::collections::BTreeMap<&'static str, f64>,
) -> String {
    b.iter()
        .filter_map(|(k, v)| {
            let d = v - a.get(k).copied().unwrap_or(0.0);
            (d != 0.0).then(|| format!("{k}={d:+.4}"))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The lines of an etcd's log from byte `from` on that say a request or
/// apply was slow, and how many there were.
fn slow_log_lines(e: &Etcd, from: usize) -> (usize, Option<String>) {
    let text = std::fs::read_to_string(e.log_path()).unwrap_or_default();
    let new = text.get(from..).unwrap_or("");
    let slow: Vec<&str> = new
        .lines()
        .filter(|l| l.contains("took too long") || l.contains("slow"))
        .collect();
    (
        slow.len(),
        slow.first().map(|l| l.chars().take(300).collect()),
    )
}

/// The length of an etcd's log so far, in bytes.
fn log_len(e: &Etcd) -> usize {
    std::fs::metadata(e.log_path()).map_or(0, |m| m.len() as usize)
}

/// Keys are generated by `key(i)`; recover `i - base` from the key.
fn index_of(k: &str, base: usize, n: usize) -> Option<usize> {
    let ip = k.rsplit('/').next()?;
    let mut parts = ip.split('.').skip(1).map(|p| p.parse::<usize>().ok());
    let (a, b, c) = (parts.next()??, parts.next()??, parts.next()??);
    let i = (a << 16) | (b << 8) | c;
    (i >= base && i < base + n).then(|| i - base)
}

fn live(c: &mut Criterion) {
    if !selected("live/") {
        return;
    }
    common::init_logging();
    let rt = runtime();
    let _in = rt.enter();
    let (etcds, s, d, engine) = synced_pair(&rt);
    let mut base = 0;
    for (name, revisions, rate) in [
        ("saturated", 20_000usize, None),
        ("quarter", 5_000, Some(1_500.0)),
    ] {
        let mut g = group(c, format!("live/{name}"));
        g.throughput(Throughput::Elements(revisions as u64));
        let mut all_lat = Vec::new();
        let mut tails = Vec::new();
        let mut rates = Vec::new();
        let mut applied = Vec::new();
        let mut run = 0;
        let mut runs_stalled = 0;
        bench_runs(g, "burst_to_convergence", || {
            let before = [etcd_metrics(&etcds[0]), etcd_metrics(&etcds[1])];
            let logs = [log_len(&etcds[0]), log_len(&etcds[1])];
            let st = engine.stats()[0].clone();
            let start = Instant::now();
            let b = rt.block_on(burst_traced(&s, &d, base, revisions, 64, rate, Some(st)));
            let took = start.elapsed();
            let (lat, tail, rate) = (b.lat, b.tail, b.rate);
            // Each run on its own: a stall is one run's, and the p99 over
            // all runs hides which (and how many) had one.
            run += 1;
            runs_stalled += usize::from(b.stalls > 0);
            let stages = b.stages.map_or(String::new(), |st| {
                let mut out = String::new();
                for (k, name) in STAGE_NAMES.iter().enumerate() {
                    out.push_str(&format!(
                        " {name}_max_ms={:.0} {name}_over_250ms={}",
                        st.max_ms[k], st.over[k]
                    ));
                }
                out.push_str(&format!(
                    " worst_gap_at_ms={:.0} worst_gap_ms={:.0} worst_put_gap_ms={:.0}",
                    st.worst_gap.0, st.worst_gap.1, st.worst_put_gap_ms
                ));
                out
            });
            println!(
                "REPORT live_run={name} run={run} source_rev_per_s={rate:.0} p50_ms={:.1} p99_ms={:.1} max_ms={:.1} stalls={} over_500ms={} converge_after_last_write_ms={:.0}{stages}",
                percentile_ms(&lat, 0.5),
                percentile_ms(&lat, 0.99),
                lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
                b.stalls,
                b.slow,
                tail.as_secs_f64() * 1e3,
            );
            for (k, who) in ["source", "peer"].iter().enumerate() {
                let after = etcd_metrics(&etcds[k]);
                let (slow, first) = slow_log_lines(&etcds[k], logs[k]);
                println!(
                    "REPORT live_run={name} run={run} etcd={who} slow_log_lines={slow} {} first_slow={first:?}",
                    metrics_delta(&before[k], &after),
                );
            }
            base += revisions;
            all_lat.extend(lat);
            tails.push(tail.as_secs_f64());
            rates.push(rate);
            // The peer's apply rate: every revision, from the first
            // write until the peer holds the last one.
            let n = revisions as f64;
            applied.push(n / (n / rate + tail.as_secs_f64()));
            took
        });
        if tails.is_empty() {
            continue;
        }
        all_lat.sort();
        let (tail_median, tail_max) = tail_ms(&tails);
        let applied_median = median(&mut applied);
        let st = &engine.stats()[0];
        println!(
            "REPORT live={name} revisions={revisions} source_rev_per_s={:.0} peer_apply_rev_per_s={:.0} peer_apply_keys_per_s={:.0} latency_p50_ms={:.1} p99_ms={:.1} max_ms={:.1} converge_after_last_write_ms_median={:.0} max={:.0} peer_txns={} events={} runs={run} runs_with_a_stall={runs_stalled}",
            median(&mut rates),
            applied_median,
            // Every revision here puts one key.
            applied_median,
            percentile_ms(&all_lat, 0.5),
            percentile_ms(&all_lat, 0.99),
            all_lat.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
            tail_median,
            tail_max,
            st.txns.load(Ordering::Relaxed),
            st.events.load(Ordering::Relaxed),
        );
    }
    rt.block_on(engine.shutdown());
}

fn handoff(c: &mut Criterion) {
    if !selected("handoff/") {
        return;
    }
    let rt = runtime();
    let _in = rt.enter();
    let n = 100_000;
    let src = Etcd::start();
    let dst = Etcd::start();
    let (s, d) = (client(&src), client(&dst));
    rt.block_on(write_batched(&s, 0..n, 16));
    let mut engine =
        Some(Engine::start(s.clone(), vec![("b".into(), d.clone())], cfg()).expect("engine"));
    rt.block_on(engine.as_ref().expect("engine").wait_synced());
    let g = group(c, "handoff/100k");
    let mut rewritten = Vec::new();
    let mut i = n;
    bench_runs(g, "stop_then_successor_applies", || {
        rt.block_on(engine.take().expect("engine").shutdown());
        // A change made while nobody mirrors.
        rt.block_on(s.put(Put::new(key(i), value(i)))).expect("put");
        let start = Instant::now();
        let e = Engine::start(s.clone(), vec![("b".into(), d.clone())], cfg()).expect("engine");
        rt.block_on(async {
            loop {
                let r = d.range(Range::key(key(i))).await.expect("range");
                if !r.kvs().is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        let took = start.elapsed();
        rewritten.push(e.stats()[0].sync_puts.load(Ordering::Relaxed));
        engine = Some(e);
        i += 1;
        took
    });
    if rewritten.is_empty() {
        return;
    }
    println!(
        "REPORT handoff n={n} handoffs={} keys_rewritten_total={}",
        rewritten.len(),
        rewritten.iter().sum::<u64>()
    );
    rt.block_on(engine.take().expect("engine").shutdown());
}

/// The scale model's check: one replicator mirroring to 1 and to 3 peers,
/// base sync and a saturated live burst, every etcd on the same cores.
fn fanout(c: &mut Criterion) {
    if !selected("fanout/") {
        return;
    }
    let rt = runtime();
    let _in = rt.enter();
    let n = 50_000;
    let src = Etcd::start();
    let s = client(&src);
    rt.block_on(write_batched(&s, 0..n, 16));
    for peers in [1usize, 3] {
        let mut dsts: Vec<Etcd> = (0..peers).map(|_| Etcd::start()).collect();
        let mut g = group(c, format!("fanout/{peers}_peers"));
        g.throughput(Throughput::Elements((n * peers) as u64));
        let mut rates = Vec::new();
        let mut live = Vec::new();
        let mut base = n;
        bench_runs(g, "base_sync_50k", || {
            for d in dsts.iter_mut() {
                d.restart_empty();
            }
            let clients: Vec<(String, Client)> = dsts
                .iter()
                .enumerate()
                .map(|(i, d)| (format!("p{i}"), client(d)))
                .collect();
            let start = Instant::now();
            let engine = Engine::start(s.clone(), clients.clone(), cfg()).expect("engine");
            rt.block_on(engine.wait_synced());
            let took = start.elapsed();
            rates.push((n * peers) as f64 / took.as_secs_f64());
            // A saturated burst through the same engine: 10k
            // single-put revisions, until every peer has them. `burst`
            // follows the last peer; the others are followed by
            // `all_arrived`, each from its revision before the burst, and
            // the burst counts as done when the slowest peer holds it all.
            let burst_keys = 10_000;
            let (tail, rate) = rt.block_on(async {
                let mut others = Vec::new();
                for (_, d) in &clients[..peers - 1] {
                    // Read before the first write, so the watch misses
                    // nothing however late its create lands.
                    let rev = d.range(Range::key("x")).await.expect("rev").header.revision;
                    others.push(tokio::spawn(all_arrived(d.clone(), rev, base, burst_keys)));
                }
                let (_, tail, rate) =
                    burst(&s, &clients[peers - 1].1, base, burst_keys, 64, None).await;
                // `burst` returns as the last peer completes, `tail` after
                // the last write.
                let last_write = Instant::now() - tail;
                let mut slowest = tail;
                for o in others {
                    let done = o.await.expect("peer watch");
                    slowest = slowest.max(done.saturating_duration_since(last_write));
                }
                (slowest, rate)
            });
            base += burst_keys;
            live.push((rate, tail.as_secs_f64()));
            rt.block_on(engine.shutdown());
            took
        });
        if rates.is_empty() {
            continue;
        }
        let mut src_rates: Vec<f64> = live.iter().map(|l| l.0).collect();
        let mut tails: Vec<f64> = live.iter().map(|l| l.1).collect();
        println!(
            "REPORT fanout peers={peers} base_sync_aggregate_keys_per_s={:.0} per_peer={:.0} live_source_rev_per_s={:.0} converge_after_last_write_ms_median={:.0}",
            median(&mut rates),
            median(&mut rates) / peers as f64,
            median(&mut src_rates),
            median(&mut tails) * 1e3
        );
    }
}

/// When `peer` holds keys `base..base + n`, watched from after revision
/// `rev` (read before the burst's first write): the arrival of the last.
async fn all_arrived(peer: Client, rev: i64, base: usize, n: usize) -> Instant {
    let (_stream, mut w) = peer
        .watch(WatchOptions::prefix(PREFIX).start_revision(rev + 1))
        .expect("watch");
    let mut seen = vec![false; n];
    let mut remaining = n;
    let give_up = tokio::time::Instant::now() + Duration::from_secs(120);
    while remaining > 0 {
        let r = tokio::time::timeout_at(give_up, w.message())
            .await
            .unwrap_or_else(|_| panic!("fanout: {remaining} of {n} keys never reached a peer"))
            .expect("watch")
            .expect("watch open");
        for e in r.events {
            let k = String::from_utf8_lossy(e.kv.key());
            if let Some(i) = index_of(&k, base, n)
                && !seen[i]
            {
                seen[i] = true;
                remaining -= 1;
            }
        }
    }
    Instant::now()
}

/// End-to-end latency against offered load, as p50/p99 per rate, drawn as
/// an SVG (`target/criterion/latency-vs-load.svg`) for BENCHMARKS.md.
fn load_curve(c: &mut Criterion) {
    if !selected("load_curve") {
        return;
    }
    let rt = runtime();
    let _in = rt.enter();
    let (_etcds, s, d, engine) = synced_pair(&rt);
    let mut g = group(c, "load_curve");
    let mut points = Vec::new();
    let mut base = 0;
    g.bench_function("sweep", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                points.clear();
                for rate in [
                    250.0,
                    500.0,
                    1000.0,
                    2000.0,
                    3000.0,
                    4000.0,
                    6000.0,
                    f64::INFINITY,
                ] {
                    let n = if rate.is_finite() {
                        (rate * 1.5) as usize
                    } else {
                        10_000
                    };
                    let limit = rate.is_finite().then_some(rate);
                    let (lat, _, achieved) = rt.block_on(burst(&s, &d, base, n, 64, limit));
                    base += n;
                    points.push((achieved, percentile(&lat, 0.5), percentile(&lat, 0.99)));
                }
            }
            start.elapsed()
        })
    });
    g.finish();
    if points.is_empty() {
        return;
    }
    for (rate, p50, p99) in &points {
        println!(
            "REPORT load_curve offered_rev_per_s={rate:.0} p50_ms={:.2} p99_ms={:.2}",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
    let svg = svg_plot(&points);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/criterion");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("latency-vs-load.svg");
    if std::fs::write(&path, svg).is_ok() {
        println!("REPORT load_curve plot={}", path.display());
    }
    rt.block_on(engine.shutdown());
}

/// A small line chart: source rate (x) against p50 and p99 latency (y, log).
fn svg_plot(points: &[(f64, Duration, Duration)]) -> String {
    use std::fmt::Write as _;
    let (w, h, left, bottom, top, right) = (640.0, 400.0, 70.0, 50.0, 30.0, 20.0);
    let max_x = points.iter().map(|p| p.0).fold(1.0, f64::max) * 1.05;
    let ms = |d: &Duration| (d.as_secs_f64() * 1e3).max(0.1);
    let (lo, hi) = (
        0.1f64.log10(),
        points
            .iter()
            .map(|p| ms(&p.2))
            .fold(1.0, f64::max)
            .log10()
            .ceil()
            .max(1.0),
    );
    let x = |v: f64| left + (w - left - right) * v / max_x;
    let y = |v: f64| h - bottom - (h - bottom - top) * (v.log10() - lo) / (hi - lo);
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\
         <rect width='100%' height='100%' fill='white'/>\
         <text x='{}' y='18' text-anchor='middle' font-size='14'>aether-replicator: write-to-peer latency against source rate</text>",
        w / 2.0
    );
    let mut decade = lo;
    while decade <= hi + 1e-9 {
        let v = 10f64.powf(decade);
        let _ = write!(
            out,
            "<line x1='{left}' x2='{}' y1='{y0}' y2='{y0}' stroke='#ddd'/><text x='{}' y='{}' text-anchor='end'>{v} ms</text>",
            w - right,
            left - 6.0,
            y(v) + 4.0,
            y0 = y(v)
        );
        decade += 1.0;
    }
    for i in 0..=5 {
        let v = max_x * f64::from(i) / 5.0;
        let _ = write!(
            out,
            "<text x='{}' y='{}' text-anchor='middle'>{:.0}</text>",
            x(v),
            h - bottom + 18.0,
            v
        );
    }
    let _ = write!(
        out,
        "<text x='{}' y='{}' text-anchor='middle'>source writes (single-put revisions/s, 64 writers)</text>\
         <line x1='{left}' x2='{left}' y1='{top}' y2='{}' stroke='black'/><line x1='{left}' x2='{}' y1='{}' y2='{}' stroke='black'/>",
        (left + w - right) / 2.0,
        h - 12.0,
        h - bottom,
        w - right,
        h - bottom,
        h - bottom
    );
    for (name, color, pick) in [("p50", "#1f77b4", 1usize), ("p99", "#d62728", 2)] {
        let pts: Vec<String> = points
            .iter()
            .map(|p| {
                let d = if pick == 1 { &p.1 } else { &p.2 };
                format!("{:.1},{:.1}", x(p.0), y(ms(d)))
            })
            .collect();
        let _ = write!(
            out,
            "<polyline fill='none' stroke='{color}' stroke-width='2' points='{}'/>",
            pts.join(" ")
        );
        for pt in &pts {
            let (px, py) = pt.split_once(',').unwrap_or(("0", "0"));
            let _ = write!(out, "<circle cx='{px}' cy='{py}' r='3' fill='{color}'/>");
        }
        let ly = if pick == 1 { 45.0 } else { 62.0 };
        let _ = write!(
            out,
            "<line x1='{}' x2='{}' y1='{ly}' y2='{ly}' stroke='{color}' stroke-width='2'/><text x='{}' y='{}'>{name}</text>",
            left + 10.0,
            left + 30.0,
            left + 35.0,
            ly + 4.0
        );
    }
    out.push_str("</svg>\n");
    out
}

/// Across a WAN: the fault proxy between the engine and its peer with a
/// round trip of 0, 20, 100, 250 and 400 ms (`AETHER_BENCH_WAN_RTTS`, comma
/// separated, overrides). Each sample, on an empty peer: the base sync of
/// 50k keys (keys/s, and its ratio to the 0 ms run), a 20k-revision burst
/// from 64 writers (convergence after the last write), then 3k revisions at
/// 1.5k rev/s, about a quarter of the local maximum (p50/p99 from the
/// source put to the peer's watch event, the peer watched directly). The
/// sync's cost of distance is also given in round trips: how much longer
/// its median took than the 0 ms run's, over the RTT (a fresh session
/// onto an empty peer pays one before the data, its claim, and one after
/// it, and the last data txn's answer one more). The round trips take
/// turns, one sample of each per round ([`bench_in_turn`]), so each ratio
/// compares syncs run minutes apart at most; the REPORT line also gives
/// the median of each round's own ratio. The figures feed BENCHMARKS.md's
/// WAN section and `docs/throughput-vs-rtt.svg`.
fn wan(c: &mut Criterion) {
    if !selected("wan/") {
        return;
    }
    let rt = runtime();
    let _in = rt.enter();
    let n = 50_000;
    let (_src, s, mut dst) = wan_stores(&rt, n);
    let mut rows = WanRow::each(&rt, &dst, &[0, 20, 100, 250, 400]);
    let mut base = n;
    bench_in_turn(c, "wan/interleaved", "base_sync_50k", n, &mut rows, |row| {
        dst.restart_empty();
        let d = client(&dst);
        let (engine, took) = wan_sync(&rt, &s, &row.proxy);
        row.times.push(took.as_secs_f64());
        let st = engine.stats()[0].clone();
        row.windows
            .push(st.window_txns.load(Ordering::Relaxed) as f64);
        row.rtt_seen.push(st.rtt_seconds());
        let (_, tail, rate) = rt.block_on(burst(&s, &d, base, 20_000, 64, None));
        row.tails.push(tail.as_secs_f64());
        row.burst_rates.push(rate);
        let (l, _, _) = rt.block_on(burst(&s, &d, base + 20_000, 3_000, 64, Some(1_500.0)));
        row.lat.extend(l);
        rt.block_on(engine.shutdown());
        // Back to the same n keys at the source for the next
        // sync, and the deletes compacted away: etcd keeps a
        // deleted key in its index until a compaction and a range
        // walks it, so without this each sync would scan a source
        // holding more dead keys than the last one.
        rt.block_on(delete_keys(&s, base..base + 23_000));
        let at = rt
            .block_on(s.range(Range::prefix(PREFIX).count_only()))
            .expect("count")
            .header
            .revision;
        rt.block_on(s.compact(at, true)).expect("compact");
        base += 23_000;
        took
    });
    let zero = rows.iter().find(|r| r.rtt == 0).map(|r| r.times.clone());
    for row in &mut rows {
        if row.times.is_empty() {
            continue;
        }
        row.lat.sort();
        let (tail_median, tail_max) = tail_ms(&row.tails);
        let (took, rate, ratio, extra, paired) = row.sync_figures(n, zero.as_deref());
        println!(
            "REPORT wan rtt_ms={} base_sync_keys_per_s={rate:.0} ratio_to_0ms={ratio:.2} sync_s={took:.3} extra_round_trips={extra:.1} burst_source_rev_per_s={:.0} converge_after_last_write_ms_median={:.0} max={:.0} quarter_p50_ms={:.1} p99_ms={:.1} window_txns_median={:.0} rtt_measured_ms={:.1} {paired}",
            row.rtt,
            median(&mut row.burst_rates),
            tail_median,
            tail_max,
            percentile_ms(&row.lat, 0.5),
            percentile_ms(&row.lat, 0.99),
            median(&mut row.windows),
            median(&mut row.rtt_seen) * 1e3,
        );
    }
}

/// One round trip's syncs in `wan/` and `wan_large/`, and the proxy that
/// puts it between the engine and the peer.
struct WanRow {
    rtt: u64,
    proxy: FaultProxy,
    /// Each sync's time (s), one per round, in round order.
    times: Vec<f64>,
    tails: Vec<f64>,
    burst_rates: Vec<f64>,
    lat: Vec<Duration>,
    windows: Vec<f64>,
    rtt_seen: Vec<f64>,
}

impl WanRow {
    /// A row for each round trip of `AETHER_BENCH_WAN_RTTS`, else of
    /// `default`, each with its own proxy in front of `dst`.
    fn each(rt: &tokio::runtime::Runtime, dst: &Etcd, default: &[u64]) -> Vec<WanRow> {
        wan_rtts(default)
            .into_iter()
            .map(|rtt| WanRow::new(rt, dst, rtt))
            .collect()
    }

    fn new(rt: &tokio::runtime::Runtime, dst: &Etcd, rtt: u64) -> WanRow {
        let proxy = rt.block_on(FaultProxy::start(dst.client_addr()));
        proxy.set_latency(Duration::from_millis(rtt) / 2);
        WanRow {
            rtt,
            proxy,
            times: Vec::new(),
            tails: Vec::new(),
            burst_rates: Vec::new(),
            lat: Vec::new(),
            windows: Vec::new(),
            rtt_seen: Vec::new(),
        }
    }

    /// The median sync time (s) and rate of `n` keys, the rate's ratio to
    /// the 0 ms row's median and the extra round trips of the medians
    /// (both 1.0 and 0 without a 0 ms row), and the same two from each
    /// round's pair of syncs (this row's and the 0 ms row's, run minutes
    /// apart at most), as REPORT fields.
    fn sync_figures(&self, n: usize, zero: Option<&[f64]>) -> (f64, f64, f64, f64, String) {
        let took = median(&mut self.times.clone());
        let took_0 = zero.map(|z| median(&mut z.to_vec()));
        let rate = n as f64 / took;
        let ratio = took_0.map_or(1.0, |t0| t0 / took);
        let extra = extra_round_trips(took, took_0, self.rtt);
        let (mut ratios, mut extras) = (Vec::new(), Vec::new());
        for (k, &t) in self.times.iter().enumerate() {
            if let Some(&t0) = zero.and_then(|z| z.get(k)) {
                ratios.push(t0 / t);
                extras.push(extra_round_trips(t, Some(t0), self.rtt));
            }
        }
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(0.0, f64::max);
        let paired = format!(
            "paired_ratio_median={:.2} paired_ratio_min={lo:.2} paired_ratio_max={hi:.2} paired_extra_round_trips_median={:.1} rounds={}",
            median(&mut ratios),
            median(&mut extras),
            self.times.len(),
        );
        (took, rate, ratio, extra, paired)
    }
}

/// Benchmarks `name` in the group `group_name`, each run one round of
/// `sync` over `rows` (each syncing `n` keys), each round starting one row
/// later than the last: the round trips are measured in turn, not one
/// after another, so a machine that gets busier or quieter during the run
/// moves every row alike, and no row is always the first after the others.
fn bench_in_turn(
    c: &mut Criterion,
    group_name: &str,
    name: &str,
    n: usize,
    rows: &mut [WanRow],
    mut sync: impl FnMut(&mut WanRow) -> Duration,
) {
    let mut g = group(c, group_name);
    g.throughput(Throughput::Elements((n * rows.len()) as u64));
    let mut round = 0;
    bench_runs(g, name, || {
        let k = round % rows.len().max(1);
        round += 1;
        let (head, tail) = rows.split_at_mut(k);
        tail.iter_mut().chain(head.iter_mut()).map(&mut sync).sum()
    });
}

/// The WAN base sync of a subtree that takes many round trips to copy:
/// 500k keys (`AETHER_BENCH_WAN_LARGE_KEYS` overrides) on an empty peer
/// behind the fault proxy, at the round trips of `AETHER_BENCH_WAN_RTTS`
/// (default 0, 100, 250 and 400 ms). A session start costs a fixed number of
/// round trips and a new connection's flow-control window ramps up over
/// the first ones; `wan`'s 50k keys are mostly that at 250 ms, this is
/// mostly the copy, which is what the window governs.
fn wan_large(c: &mut Criterion) {
    if !selected("wan_large/") {
        return;
    }
    let rt = runtime();
    let _in = rt.enter();
    let n: usize = env_or("AETHER_BENCH_WAN_LARGE_KEYS", 500_000);
    let (_src, s, mut dst) = wan_stores(&rt, n);
    let mut rows = WanRow::each(&rt, &dst, &[0, 100, 250, 400]);
    bench_in_turn(
        c,
        "wan_large/interleaved",
        "base_sync",
        n,
        &mut rows,
        |row| {
            dst.restart_empty();
            let (engine, took) = wan_sync(&rt, &s, &row.proxy);
            row.times.push(took.as_secs_f64());
            rt.block_on(engine.shutdown());
            took
        },
    );
    let zero = rows.iter().find(|r| r.rtt == 0).map(|r| r.times.clone());
    for row in &rows {
        if row.times.is_empty() {
            continue;
        }
        let (took, rate, ratio, extra, paired) = row.sync_figures(n, zero.as_deref());
        println!(
            "REPORT wan_large rtt_ms={} keys={n} base_sync_keys_per_s={rate:.0} ratio_to_0ms={ratio:.2} sync_s={took:.3} extra_round_trips={extra:.1} {paired}",
            row.rtt
        );
    }
}

/// Many regions under load: N regions (`AETHER_BENCH_REGIONS`,
/// default 5), every one's etcd on the same host and every engine mirroring
/// to all the others (N × (N − 1) streams), each region starting with 20k
/// keys. Measured once: the time until every engine has base-synced every
/// peer. Each sample: 16 writers in *every* region write 5,000 single-put
/// revisions at once; the sample's time is from the start of the bursts
/// until every peer holds every region's burst, and the REPORT line gives
/// the convergence after the last write, events per mirror txn and the
/// process's RSS after the sync and after the bursts (all engines, clients
/// and the bench share it, so it is the growth that matters).
/// `e2e/mesh.sh burst` (the `aether-e2e` harness) runs the same scene with the binaries, one
/// process per replica.
fn regions(c: &mut Criterion) {
    if !selected("regions/") {
        return;
    }
    let rt = runtime();
    let _in = rt.enter();
    let n: usize = env_or("AETHER_BENCH_REGIONS", 5);
    let (base, burst) = (20_000usize, 5_000usize);
    let names: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    let stores: Vec<Etcd> = (0..n).map(|_| Etcd::start()).collect();
    let clients: Vec<Client> = stores.iter().map(client).collect();
    for (c, r) in clients.iter().zip(&names) {
        rt.block_on(common::mirror::put_many(
            c,
            (0..base).map(|k| (common::mirror::key_in(r, k), format!("v{k}"))),
        ));
    }
    let start = Instant::now();
    let engines: Vec<Engine> = (0..n)
        .map(|i| {
            let peers = (0..n)
                .filter(|&j| j != i)
                .map(|j| (names[j].clone(), clients[j].clone()))
                .collect();
            let mut cfg = MirrorConfig::new(names[i].as_str());
            cfg.lease_ttl = Duration::from_secs(30);
            Engine::start(clients[i].clone(), peers, cfg).expect("engine")
        })
        .collect();
    for e in &engines {
        rt.block_on(e.wait_synced());
    }
    let base_sync = start.elapsed();
    let rss_synced = rss_kib();
    let mut rss_max = rss_synced;
    let stats: Vec<_> = engines.iter().flat_map(|e| e.stats()).collect();
    let totals = || {
        stats.iter().fold((0u64, 0u64), |(t, ev), s| {
            (
                t + s.txns.load(Ordering::Relaxed),
                ev + s.events.load(Ordering::Relaxed),
            )
        })
    };
    let mut g = group(c, format!("regions/{n}"));
    g.throughput(Throughput::Elements((n * burst) as u64));
    let (mut tails, mut per_txn) = (Vec::new(), Vec::new());
    let mut round = 0;
    bench_runs(g, "bursts_to_convergence", || {
        let (txns0, events0) = totals();
        let from = base + round * burst;
        round += 1;
        let start = Instant::now();
        let last_write = rt.block_on(async {
            let mut writers = tokio::task::JoinSet::new();
            for (c, r) in clients.iter().zip(&names) {
                let next = Arc::new(AtomicUsize::new(0));
                for _ in 0..16 {
                    let (c, r, next) = (c.clone(), r.clone(), next.clone());
                    writers.spawn(async move {
                        loop {
                            let k = next.fetch_add(1, Ordering::Relaxed);
                            if k >= burst {
                                return;
                            }
                            let key = common::mirror::key_in(&r, from + k);
                            c.put(Put::new(key, "b")).await.expect("burst put");
                        }
                    });
                }
            }
            while let Some(w) = writers.join_next().await {
                w.expect("writer");
            }
            Instant::now()
        });
        let want = (from + burst) as i64;
        let all_there = || async {
            for c in &clients {
                for r in &names {
                    let prefix = format!("/aether/v1/regions/{r}/");
                    let held = c.range(Range::prefix(prefix).count_only()).await;
                    if held.expect("count").count < want {
                        return false;
                    }
                }
            }
            true
        };
        let converged = rt.block_on(async {
            // Bounded: a peer that never converges fails the bench.
            for _ in 0..60_000 {
                if all_there().await {
                    return Instant::now();
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            panic!("the regions did not converge within a minute of the bursts");
        });
        tails.push((converged - last_write).as_secs_f64());
        let (txns1, events1) = totals();
        per_txn.push((events1 - events0) as f64 / (txns1 - txns0).max(1) as f64);
        rss_max = rss_max.max(rss_kib());
        converged - start
    });
    for e in engines {
        rt.block_on(e.shutdown());
    }
    if tails.is_empty() {
        // Filtered out: the scene was set up, but nothing was measured.
        return;
    }
    let (tail_median, tail_max) = tail_ms(&tails);
    println!(
        "REPORT regions n={n} streams={} base_keys={base} base_sync_all_ms={} burst={burst} converge_after_last_write_ms_median={tail_median:.0} max={tail_max:.0} events_per_txn_median={:.1} rss_kib_after_sync={rss_synced} rss_kib_max_after_bursts={rss_max}",
        n * (n - 1),
        base_sync.as_millis(),
        median(&mut per_txn),
    );
}

/// The saturated live stall's mechanism on its own, engine-free: one etcd holding
/// `AETHER_BENCH_COUNT_KEYS` keys (default 200k) under the prefix, 16
/// writers overwriting them as fast as it takes, and every 300 ms a count
/// of the whole prefix, alternately as one `count_only` range (what the
/// freshness probe sent before), as `count_only` ranges of ~4k keys each
/// all in one txn, and the same 8 to a txn (what it sends now). Reports, per way of counting, the
/// count's duration and the slowest put that started while it ran, against
/// the slowest put of the same length of time with no count running.
fn count_stall(c: &mut Criterion) {
    if !selected("count_stall") {
        return;
    }
    let rt = runtime();
    let _in = rt.enter();
    let n: usize = env_or("AETHER_BENCH_COUNT_KEYS", 200_000);
    let e = Etcd::start();
    let s = client(&e);
    rt.block_on(write_batched(&s, 0..n, 16));
    // Boundaries at every 4096th key in key order, as the engine learns
    // them from the keys it writes.
    let mut keys: Vec<String> = (0..n).map(key).collect();
    keys.sort();
    let bounds: Vec<String> = keys.iter().skip(4096).step_by(4096).cloned().collect();
    drop(keys);
    let end = String::from_utf8(aether_replicator::etcd::prefix_end(PREFIX.as_bytes()).to_vec())
        .expect("utf8");
    let pieces: Vec<Range> = std::iter::once(PREFIX.to_string())
        .chain(bounds.iter().cloned())
        .zip(bounds.iter().cloned().chain(std::iter::once(end)))
        .map(|(a, b)| Range::between(a, b).count_only())
        .collect();
    let g = group(c, "count_stall");
    // (way, count duration, slowest put during it, slowest put in a
    // quiet window as long)
    let mut seen: Vec<(usize, f64, f64, f64)> = Vec::new();
    bench_runs(g, "whole_then_pieces", || {
        let started = Instant::now();
        rt.block_on(async {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let puts: Arc<Mutex<Vec<(Instant, Duration)>>> = Arc::default();
            let mut writers = tokio::task::JoinSet::new();
            for w in 0..16usize {
                let (s, stop, puts) = (s.clone(), stop.clone(), puts.clone());
                writers.spawn(async move {
                    let mut i = w;
                    while !stop.load(Ordering::Relaxed) {
                        let t0 = Instant::now();
                        s.put(Put::new(key(i % n), value(i))).await.expect("put");
                        puts.lock().expect("lock").push((t0, t0.elapsed()));
                        i += 16;
                    }
                });
            }
            let mut windows = Vec::new();
            for round in 0..12usize {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let way = round % 3;
                let t0 = Instant::now();
                let total: i64 = if way == 0 {
                    s.range(Range::prefix(PREFIX).count_only())
                        .await
                        .expect("count")
                        .count
                } else {
                    let ops: Vec<aether_replicator::etcd::Op> =
                        pieces.iter().cloned().map(Into::into).collect();
                    let mut sum = 0;
                    // All in one txn (etcd's default limit is 128
                    // ops), or 8 to a txn, as the engine sends them.
                    let per = if way == 1 { 127 } else { 8 };
                    for chunk in ops.chunks(per) {
                        let r = s
                            .txn(aether_replicator::etcd::Txn::new().and_then(chunk.to_vec()))
                            .await
                            .expect("count txn");
                        for r in r.responses {
                            if let aether_replicator::etcd::OpResponse::Range(r) = r {
                                sum += r.count;
                            }
                        }
                    }
                    sum
                };
                assert_eq!(total as usize, n, "the two ways must count the same");
                windows.push((way, t0, t0.elapsed()));
            }
            stop.store(true, Ordering::Relaxed);
            while let Some(w) = writers.join_next().await {
                w.expect("writer");
            }
            let puts = puts.lock().expect("lock");
            let slowest = |from: Instant, to: Instant| {
                puts.iter()
                    .filter(|(t, _)| *t >= from && *t <= to)
                    .map(|(_, d)| d.as_secs_f64() * 1e3)
                    .fold(0.0, f64::max)
            };
            for (way, t0, took) in windows {
                // The quiet window: as long, ending 100 ms before the
                // count started (the last one ended 300 ms before that).
                let quiet_to = t0 - Duration::from_millis(100);
                seen.push((
                    way,
                    took.as_secs_f64() * 1e3,
                    slowest(t0, t0 + took),
                    slowest(quiet_to - took, quiet_to),
                ));
            }
        });
        started.elapsed()
    });
    for (way, name) in [(0, "whole"), (1, "pieces_one_txn"), (2, "pieces_8_per_txn")] {
        let mut took: Vec<f64> = seen.iter().filter(|s| s.0 == way).map(|s| s.1).collect();
        let mut during: Vec<f64> = seen.iter().filter(|s| s.0 == way).map(|s| s.2).collect();
        let mut quiet: Vec<f64> = seen.iter().filter(|s| s.0 == way).map(|s| s.3).collect();
        if took.is_empty() {
            continue;
        }
        let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        println!(
            "REPORT count_stall keys={n} way={name} pieces={} counts={} count_ms_median={:.1} max={:.1} slowest_put_during_ms_median={:.1} max={:.1} slowest_put_quiet_ms_median={:.1} max={:.1}",
            if way == 0 { 1 } else { pieces.len() },
            took.len(),
            median(&mut took),
            max(&took),
            median(&mut during),
            max(&during),
            median(&mut quiet),
            max(&quiet),
        );
    }
}

/// This process's resident set now (VmRSS), in KiB; 0 if unknown.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Whether criterion's filter (the command line's positional argument, as
/// in `cargo bench --bench mirror -- wan/`) can select a group named
/// `prefix`…: a bench's set-up (etcds, hundreds of thousands of keys) runs
/// before criterion filters, so a bench not selected returns first.
fn selected(prefix: &str) -> bool {
    const TAKES_VALUE: &[&str] = &[
        "--save-baseline",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--profile-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--color",
        "--output-format",
        "--plotting-backend",
        "--format",
    ];
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter = args.iter().enumerate().find_map(|(i, a)| {
        let after_flag = i > 0 && TAKES_VALUE.contains(&args[i - 1].as_str());
        (!a.starts_with('-') && !after_flag).then_some(a.as_str())
    });
    filter.is_none_or(|f| prefix.contains(f) || f.contains(prefix))
}

/// The environment variable `name` parsed, or `default` when it is unset
/// or does not parse.
fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A probe of the 50k-key (`AETHER_BENCH_WAN_PROBE_KEYS`) WAN base sync's
/// phases, run only with
/// `AETHER_BENCH_WAN_PROBE=<samples>` (`cargo bench --bench mirror --
/// wan_probe`): per sample, the RTTs of `AETHER_BENCH_WAN_RTTS` (default
/// 0, 100, 250) interleaved, each on an empty peer behind a fresh proxy
/// that reads the HTTP/2 frames. It prints, per sync, the time to the first
/// data txn, to the last client DATA frame and to the final state write,
/// and the client bytes per round trip summed over the connections (the
/// flow-control ramp); `AETHER_BENCH_WAN_PROBE_FLOW=1` adds each
/// connection's bytes, WINDOW_UPDATEs and PINGs per round trip.
fn wan_probe(_c: &mut Criterion) {
    let Some(samples) = std::env::var("AETHER_BENCH_WAN_PROBE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    else {
        return;
    };
    let flow = std::env::var("AETHER_BENCH_WAN_PROBE_FLOW").is_ok_and(|v| v == "1");
    let rt = runtime();
    let _in = rt.enter();
    let n: usize = env_or("AETHER_BENCH_WAN_PROBE_KEYS", 50_000);
    let rtts = wan_rtts(&[0, 100, 250]);
    let (_src, s, mut dst) = wan_stores(&rt, n);
    for sample in 0..samples {
        for &rtt in &rtts {
            dst.restart_empty();
            let proxy = rt.block_on(FaultProxy::start(dst.client_addr()));
            let trips = proxy.count_round_trips();
            trips.mark("data", b"clusterName");
            trips.mark("last", b"synced=1");
            proxy.set_latency(Duration::from_millis(rtt) / 2);
            let t0 = Instant::now();
            let (engine, took) = wan_sync(&rt, &s, &proxy);
            let at = |m: &str| {
                trips
                    .first(m)
                    .map_or(f64::NAN, |x| x.at.duration_since(t0).as_secs_f64())
            };
            let bucket = Duration::from_millis(rtt.max(20));
            let per_conn = trips.client_bytes(bucket);
            let width = per_conn.iter().map(Vec::len).max().unwrap_or(0);
            let sums: Vec<String> = (0..width)
                .map(|i| {
                    let b: u64 = per_conn.iter().filter_map(|r| r.get(i)).sum();
                    format!("{}", b / 1024)
                })
                .collect();
            println!(
                "PROBE sample={sample} rtt_ms={rtt} sync_s={:.3} first_data_s={:.3} final_state_s={:.3} conns={} client_kib_per_{}ms=[{}]",
                took.as_secs_f64(),
                at("data"),
                at("last"),
                trips.connections(),
                bucket.as_millis(),
                sums.join(" ")
            );
            if flow {
                print!("{}", trips.flow_report(bucket));
            }
            rt.block_on(engine.shutdown());
        }
    }
}

/// How many round trips of `rtt_ms` longer a sync of `took` seconds took
/// than one of `took_0` at 0 ms (0 without either).
fn extra_round_trips(took: f64, took_0: Option<f64>, rtt_ms: u64) -> f64 {
    match took_0 {
        Some(t0) if rtt_ms > 0 => (took - t0) / (rtt_ms as f64 / 1e3),
        _ => 0.0,
    }
}

/// The round trips to measure: `AETHER_BENCH_WAN_RTTS` (ms, comma
/// separated), or `default`.
fn wan_rtts(default: &[u64]) -> Vec<u64> {
    std::env::var("AETHER_BENCH_WAN_RTTS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// A source holding `n` keys, its client, and an empty peer.
fn wan_stores(rt: &tokio::runtime::Runtime, n: usize) -> (Etcd, Client, Etcd) {
    let src = Etcd::start();
    let s = client(&src);
    rt.block_on(write_batched(&s, 0..n, 16));
    (src, s, Etcd::start())
}

/// Starts an engine mirroring `s` to the peer behind `proxy`, its client
/// built as the binary builds its peer clients, and waits for the base
/// sync: the engine and how long it took from the start.
fn wan_sync(rt: &tokio::runtime::Runtime, s: &Client, proxy: &FaultProxy) -> (Engine, Duration) {
    // `AETHER_BENCH_PEER_CONNECTIONS` overrides the binary's default, to
    // compare connection counts in one run.
    let conns = std::env::var("AETHER_BENCH_PEER_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_PEER_CONNECTIONS);
    let far = Client::connect(ClientConfig::new([proxy.endpoint()]).with_connections(conns))
        .expect("client");
    let start = Instant::now();
    let engine = Engine::start(s.clone(), vec![("b".into(), far)], cfg()).expect("engine");
    rt.block_on(engine.wait_synced());
    (engine, start.elapsed())
}

/// Deletes the keys `key(i)` for `i` in `range`, in batched txns.
async fn delete_keys(c: &Client, range: std::ops::Range<usize>) {
    let mut b = TxnBatcher::new(TxnLimits::default());
    for i in range {
        b.push(Delete::key(key(i)));
    }
    b.flush();
    while let Some(t) = b.pop_txn() {
        c.txn(t).await.expect("delete");
    }
}

criterion_group!(
    benches,
    base_sync,
    live,
    handoff,
    fanout,
    load_curve,
    wan,
    wan_large,
    wan_probe,
    regions,
    lower_limits,
    count_stall
);
criterion_main!(benches);
