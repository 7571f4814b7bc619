//! One simulated run: a mesh of regions on model etcds, an engine per
//! region, load, a seeded nemesis and the checker.
//!
//! Everything runs on one thread on tokio's paused clock: a sleep returns
//! as soon as nothing else can run, so minutes of the mesh take a fraction
//! of a second, and every choice comes from the run's [`Rng`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aether_etcd::model::{Cluster, ModelConfig};
use aether_replicator::etcd::{Compare, CompareOp, Delete, Put, Txn, WatchOptions};
use aether_replicator::mirror::clock::Clock;
use aether_replicator::mirror::state::State;
use aether_replicator::mirror::{Engine, MirrorConfig, SteppedDown};
use aether_replicator::store::Store;
use bytes::Bytes;
use futures_util::StreamExt;

use crate::link::{Link, Weather};
use crate::rng::Rng;
use crate::trace::Trace;

/// The regions of the mesh.
pub(crate) const REGIONS: [&str; 3] = ["a", "b", "c"];
/// How long faults are injected, then how long the healed mesh has to
/// converge.
const FAULTS_FOR: Duration = Duration::from_secs(60);
const HEAL_FOR: Duration = Duration::from_secs(40);
/// A copy whose state key's heartbeat is within this of the reader's clock
/// (and says synced) is claimed fresh, and may lag the source by this.
const S_MS: i64 = 5_000;
/// An out-of-band change may go unnoticed for this long (the copy watch's
/// promise is a second; the rest is the next heartbeat's write).
const OOB_GRACE_MS: i64 = 2_500;
/// Without the copy watch, only counts and verification passes see a
/// change: a pass every [`VERIFY_EVERY`], and a few seconds for it to run.
/// A `del --prefix` that emptied a copy moves its key count, which every
/// probe (one a heartbeat, below the count cadence's 20,000 keys) checks:
/// it has [`OOB_GRACE_MS`] either way.
const OOB_GRACE_UNWATCHED_MS: i64 = VERIFY_EVERY.as_millis() as i64 + 5_000;
const VERIFY_EVERY: Duration = Duration::from_secs(20);
/// The wall clock every engine starts on: Unix ms.
const WALL_BASE_MS: i64 = 1_800_000_000_000;

/// What the run found and did.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) violations: Vec<String>,
    pub(crate) faults: BTreeMap<&'static str, u64>,
    pub(crate) samples: u64,
    pub(crate) claims: u64,
    pub(crate) hash: u64,
    pub(crate) lines: u64,
    pub(crate) tail: Vec<String>,
}

/// The knobs of a run that the reverted-fix checks and the exploration
/// turn.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Knobs {
    pub(crate) faults_for: Duration,
    /// The engines watch their copies (`MirrorConfig::copy_watch`, on by
    /// default); off, the counts and verification passes are all that
    /// see a change made on a copy.
    pub(crate) copy_watch: bool,
    /// Leadership churn: besides the nemesis, every region's leadership
    /// is handed over every few seconds, faster than the
    /// verification interval, so that a pass scheduled a whole interval
    /// after a session's start would never run; and each region holds
    /// [`STABLE_KEYS`] keys that the load never rewrites, the target of
    /// half the hand edits: a changed value no count sees.
    pub(crate) churn: bool,
}

impl Default for Knobs {
    fn default() -> Knobs {
        Knobs {
            faults_for: FAULTS_FOR,
            copy_watch: true,
            churn: false,
        }
    }
}

/// Keys per region that [`Knobs::churn`] writes once, before the engines
/// start, and the load never touches.
const STABLE_KEYS: u32 = 12;

/// How often [`Knobs::churn`] hands a region's leadership over: every 5
/// to 15 s, less than the verification interval.
const CHURN_MS: (u64, u64) = (5_000, 10_000);

/// The region whose etcd takes smaller requests than the others, and how
/// small: a value of [`BIG`] bytes, which the load sometimes writes, fits
/// the others but never it, so its copies hold such keys absent, by
/// design.
const SMALL_PEER: usize = 2;
const SMALL_REQUEST_BYTES: usize = 2_048;
const BIG: usize = 3_000;

/// What a copy on `peer` should hold for a source value: a value too large
/// for the peer is absent there.
fn on_peer(peer: usize, v: Option<Bytes>) -> Option<Bytes> {
    v.filter(|v| peer != SMALL_PEER || v.len() < BIG)
}

fn prefix(region: &str) -> String {
    format!("/aether/v1/regions/{region}/")
}

/// A source key's history: (ms, revision, value or absent), in order.
type History = BTreeMap<Bytes, Vec<(i64, i64, Option<Bytes>)>>;

struct Region {
    name: &'static str,
    cluster: Cluster,
    history: Arc<Mutex<History>>,
    /// The engine's wall clock offset from the simulated clock, ms.
    skew: Arc<AtomicI64>,
    engine: Option<Engine>,
    /// A leader deposed by a handover that has not noticed yet: it runs on
    /// until its step-down, which the nemesis schedules.
    deposed: Option<Engine>,
    /// What a step-down leaves: the peer leases kept alive for a TTL so
    /// that the successor can adopt them (`Engine::step_down`).
    stepped_down: Vec<SteppedDown>,
    links: Vec<Link>,
    /// Out-of-band changes on this region's etcd: (ms, key or prefix,
    /// whether it emptied a copy, which a count sees); `i64::MAX` while
    /// it waits on a held member.
    oob: Vec<(i64, Bytes, bool)>,
    knobs: Knobs,
}

pub(crate) async fn run(seed: u64, knobs: Knobs) -> Outcome {
    let rng = Rng::new(seed);
    let trace = Trace::new();
    let _log = trace.engine_log();
    let mut out = Outcome::default();
    let mut regions: Vec<Region> = REGIONS
        .iter()
        .enumerate()
        .map(|(i, name)| Region {
            name,
            cluster: Cluster::new({
                let c = ModelConfig::default()
                    .with_members(2)
                    .with_cluster_id(0x5100 + i as u64);
                if i == SMALL_PEER {
                    c.with_max_request_bytes(SMALL_REQUEST_BYTES)
                } else {
                    c
                }
            }),
            history: Arc::default(),
            skew: Arc::default(),
            engine: None,
            deposed: None,
            stepped_down: Vec::new(),
            links: Vec::new(),
            oob: Vec::new(),
            knobs,
        })
        .collect();
    // The checker's own record of each source, from a watch that no fault
    // touches (on member 1, which the nemesis never holds).
    for r in &regions {
        let mut w = r
            .cluster
            .client(1)
            .watch(WatchOptions::prefix(prefix(r.name)).start_revision(1))
            .expect("history watch");
        let history = r.history.clone();
        let trace = trace.clone();
        tokio::spawn(async move {
            while let Some(Ok(resp)) = w.next().await {
                let t = trace.now_ms();
                let mut h = history.lock().unwrap();
                for e in resp.events {
                    let v = match e.kind {
                        aether_replicator::etcd::EventKind::Put => Some(e.kv.value().clone()),
                        aether_replicator::etcd::EventKind::Delete => None,
                    };
                    h.entry(e.kv.key().clone())
                        .or_default()
                        .push((t, e.kv.mod_revision(), v));
                }
            }
        });
    }
    if knobs.churn {
        // Endpoints the load never touches, as most of a real registry:
        // a hand edit of one is repaired by nothing but the engine.
        for r in &regions {
            let c = r.cluster.client(0);
            for ip in 0..STABLE_KEYS {
                let key = format!(
                    "{}clusters/c1/services/stable/protocols/http/endpoints/10.9.0.{ip}",
                    prefix(r.name)
                );
                c.put(Put::new(key, "stable")).await.expect("stable key");
            }
        }
    }
    for i in 0..regions.len() {
        start_engine(&mut regions, i, &rng, &trace);
    }
    let load = spawn_load(&regions, &rng);
    let until = tokio::time::Instant::now() + knobs.faults_for;
    let mut next_fault = tokio::time::Instant::now() + Duration::from_secs(3);
    let churn_at =
        || tokio::time::Instant::now() + Duration::from_millis(CHURN_MS.0 + rng.below(CHURN_MS.1));
    let mut next_churn: Vec<_> = regions.iter().map(|_| churn_at()).collect();
    let mut heals: Vec<(tokio::time::Instant, Heal)> = Vec::new();
    loop {
        let now = tokio::time::Instant::now();
        if now >= until {
            break;
        }
        if now >= next_fault {
            let (kind, heal) = inject(&mut regions, &rng, &trace);
            *out.faults.entry(kind).or_default() += 1;
            heals.extend(heal);
            next_fault = now + Duration::from_millis(500 + rng.below(2500));
        }
        for (i, next) in next_churn.iter_mut().enumerate() {
            if knobs.churn && now >= *next {
                // Handovers: the successor starts at once and adopts the
                // copies, so that they are claimed fresh again at once.
                let (kind, heal) = handover(&mut regions, i, &rng, &trace);
                *out.faults.entry(kind).or_default() += 1;
                heals.extend(heal);
                *next = churn_at();
            }
        }
        heals.extend(fences(&mut regions, &rng, &trace));
        apply_due(&mut heals, &mut regions, &rng, &trace);
        sample(&regions, &trace, &mut out);
        if !out.violations.is_empty() {
            // The trace's tail is the story of the first violation.
            return finish(regions, trace, out);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Heal everything and let the mesh converge.
    for (_, h) in heals.drain(..) {
        h.apply(&mut regions, &rng, &trace);
    }
    for i in 0..regions.len() {
        for l in &regions[i].links {
            quiet(&l.weather);
        }
        if regions[i].engine.is_none() {
            start_engine(&mut regions, i, &rng, &trace);
        }
    }
    load.abort();
    trace.note("healed".into());
    let deadline = tokio::time::Instant::now() + HEAL_FOR;
    while tokio::time::Instant::now() < deadline {
        // An engine fenced by a deposed one in the last instants of the
        // faults restarts as the replicator would, healed or not.
        heals.extend(fences(&mut regions, &rng, &trace));
        apply_due(&mut heals, &mut regions, &rng, &trace);
        sample(&regions, &trace, &mut out);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Converged: every copy exact now, and claimed fresh.
    final_check(&regions, &trace, &mut out);
    finish(regions, trace, out)
}

/// Applies the heals that are due now. Stable: heals due at one instant
/// apply in the order scheduled.
fn apply_due(
    heals: &mut Vec<(tokio::time::Instant, Heal)>,
    regions: &mut [Region],
    rng: &Rng,
    trace: &Trace,
) {
    heals.sort_by_key(|h| h.0);
    let now = tokio::time::Instant::now();
    while heals.first().is_some_and(|h| h.0 <= now) {
        let (_, h) = heals.remove(0);
        h.apply(regions, rng, trace);
    }
}

/// What the replicator does when another engine fences its own (see
/// `app::replicator`): the leader shuts its engine down and campaigns
/// again after a back-off; a deposed engine that is fenced before its
/// step-down just stops.
fn fences(regions: &mut [Region], rng: &Rng, trace: &Trace) -> Vec<(tokio::time::Instant, Heal)> {
    use futures_util::FutureExt;
    let mut heals = Vec::new();
    for (i, r) in regions.iter_mut().enumerate() {
        if let Some(e) = r.deposed.as_mut()
            && let Some(peer) = e.fenced().now_or_never()
        {
            trace.note(format!("{} deposed engine fenced on {peer:?}", r.name));
            tokio::spawn(r.deposed.take().unwrap().shutdown());
        }
        if let Some(e) = r.engine.as_mut()
            && let Some(peer) = e.fenced().now_or_never()
        {
            trace.note(format!("{} engine fenced on {peer:?}: shut down", r.name));
            tokio::spawn(r.engine.take().unwrap().shutdown());
            let back = tokio::time::Instant::now() + Duration::from_millis(500 + rng.below(2000));
            heals.push((back, Heal::Restart(i)));
        }
    }
    heals
}

fn finish(mut regions: Vec<Region>, trace: Trace, mut out: Outcome) -> Outcome {
    for r in &mut regions {
        for e in [r.engine.take(), r.deposed.take()].into_iter().flatten() {
            e.abort();
        }
        r.stepped_down.clear();
    }
    let (hash, lines) = trace.hash();
    out.hash = hash;
    out.lines = lines;
    // Kept for a violation's report, and for a replay's comparison.
    out.tail = trace.tail(usize::MAX);
    out
}

fn quiet(w: &Weather) {
    w.refuse.store(0, Relaxed);
    w.lose.store(0, Relaxed);
    w.delay.store(0, Relaxed);
    w.cut.store(false, Relaxed);
}

fn config(
    region: &'static str,
    skew: Arc<AtomicI64>,
    rng: &Rng,
    trace: &Trace,
    knobs: Knobs,
) -> MirrorConfig {
    let ids = rng.clone();
    // The run's clock, not the engine's: an engine started later must read
    // the same wall time as the checker, or its heartbeats would read as
    // old as its start and none of its copies would ever be claimed fresh.
    let run = trace.clone();
    let mut cfg = MirrorConfig::new(region)
        .with_heartbeat_interval(Duration::from_secs(1))
        .with_verify_interval(Some(VERIFY_EVERY))
        .with_clock(Clock::supplied(
            move || WALL_BASE_MS + run.now_ms() + skew.load(Relaxed),
            move || ids.next(),
        ));
    cfg.lease_ttl = Duration::from_secs(10);
    cfg.max_backoff = Duration::from_secs(1);
    cfg.page_size = 20;
    cfg.copy_watch = knobs.copy_watch;
    cfg
}

fn start_engine(regions: &mut [Region], i: usize, rng: &Rng, trace: &Trace) {
    let name = regions[i].name;
    let link = |to: usize, regions: &[Region]| Link {
        name: format!("{name}->{}", regions[to].name),
        cluster: regions[to].cluster.clone(),
        member: Arc::new(AtomicUsize::new(0)),
        weather: Arc::default(),
        rng: rng.clone(),
        trace: trace.clone(),
    };
    let local = link(i, regions);
    let peers: Vec<(String, Link)> = (0..regions.len())
        .filter(|&p| p != i)
        .map(|p| (regions[p].name.to_string(), link(p, regions)))
        .collect();
    let mut links = vec![local.clone()];
    links.extend(peers.iter().map(|(_, l)| l.clone()));
    let cfg = config(name, regions[i].skew.clone(), rng, trace, regions[i].knobs);
    let engine = Engine::start(
        Store::new(local),
        peers.into_iter().map(|(r, l)| (r, Store::new(l))).collect(),
        cfg,
    )
    .expect("engine");
    trace.note(format!("{name} engine started"));
    regions[i].engine = Some(engine);
    regions[i].links = links;
}

/// Each region's registry changing: puts and deletes over a small key set,
/// so keys come and go and are written again.
fn spawn_load(regions: &[Region], rng: &Rng) -> tokio::task::JoinHandle<()> {
    let clients: Vec<_> = regions
        .iter()
        .map(|r| (r.name, r.cluster.client(0)))
        .collect();
    let rng = rng.clone();
    tokio::spawn(async move {
        loop {
            let (name, c) = rng.pick(&clients);
            let key = format!(
                "{}clusters/c1/services/s{}/protocols/http/endpoints/10.0.0.{}",
                prefix(name),
                rng.below(6),
                rng.below(12)
            );
            if rng.below(4) == 0 {
                let _ = c.delete(Delete::key(key)).await;
            } else if rng.below(40) == 0 {
                // Too large for the small peer (refused by it as a source).
                let v = format!("{:0>width$}", rng.below(1000), width = BIG);
                let _ = c.put(Put::new(key, v)).await;
            } else {
                let _ = c.put(Put::new(key, format!("v{}", rng.below(1000)))).await;
            }
            tokio::time::sleep(Duration::from_millis(20 + rng.below(150))).await;
        }
    })
}

/// What undoes a fault, later.
enum Heal {
    Weather(Arc<Weather>),
    Restart(usize),
    Release(usize),
    Failback(usize),
    Skew(usize),
    /// The deposed leader notices and steps down.
    StepDown(usize),
    /// Its step-down's grace (one lease TTL) is over.
    GraceOver(usize),
}

impl Heal {
    fn apply(self, regions: &mut [Region], rng: &Rng, trace: &Trace) {
        match self {
            Heal::Weather(w) => quiet(&w),
            Heal::Restart(i) => {
                if regions[i].engine.is_none() {
                    start_engine(regions, i, rng, trace);
                }
            }
            Heal::Release(i) => {
                trace.note(format!("{} member 0 released", regions[i].name));
                regions[i].cluster.release(0);
                // Out-of-band changes sent to the held member land now.
                let now = trace.now_ms();
                for oob in &mut regions[i].oob {
                    if oob.0 == i64::MAX {
                        oob.0 = now;
                    }
                }
            }
            Heal::Failback(i) => {
                for r in regions.iter() {
                    for l in &r.links {
                        if l.cluster.member_id(0) == regions[i].cluster.member_id(0) {
                            l.member.store(0, Relaxed);
                        }
                    }
                }
            }
            Heal::Skew(i) => {
                trace.note(format!("{} wall clock back", regions[i].name));
                regions[i].skew.store(0, Relaxed);
            }
            Heal::StepDown(i) => {
                if let Some(e) = regions[i].deposed.take() {
                    trace.note(format!("{} deposed engine steps down", regions[i].name));
                    regions[i].stepped_down.push(e.step_down());
                }
            }
            Heal::GraceOver(i) => {
                if !regions[i].stepped_down.is_empty() {
                    regions[i].stepped_down.remove(0);
                }
            }
        }
    }
}

/// One fault, drawn from the seed; what undoes it and when.
fn inject(
    regions: &mut [Region],
    rng: &Rng,
    trace: &Trace,
) -> (&'static str, Vec<(tokio::time::Instant, Heal)>) {
    let now = tokio::time::Instant::now();
    let later =
        |min_ms: u64, spread_ms: u64| now + Duration::from_millis(min_ms + rng.below(spread_ms));
    let i = rng.below(regions.len() as u64) as usize;
    let name = regions[i].name;
    match rng.below(8) {
        0 => {
            // A link that loses answers, refuses or delays calls.
            let l = rng.pick(&regions[i].links).clone();
            l.weather.refuse.store(rng.below(300) as usize, Relaxed);
            l.weather.lose.store(rng.below(200) as usize, Relaxed);
            l.weather.delay.store(rng.below(500) as usize, Relaxed);
            trace.note(format!("fault: weather on {}", l.name));
            (
                "weather",
                vec![(later(1000, 5000), Heal::Weather(l.weather.clone()))],
            )
        }
        1 => {
            let l = rng.pick(&regions[i].links).clone();
            l.weather.cut.store(true, Relaxed);
            trace.note(format!("fault: {} cut", l.name));
            (
                "cut",
                vec![(later(500, 8000), Heal::Weather(l.weather.clone()))],
            )
        }
        2 => kill(regions, i, rng, trace),
        3 => {
            let c = regions[i].cluster.client(0);
            let rev = regions[i].cluster.revision() - rng.below(5) as i64;
            trace.note(format!("fault: {name} compacted at {rev}"));
            let _ = futures_util::FutureExt::now_or_never(c.compact(rev.max(1), false));
            ("compact", vec![])
        }
        4 => {
            // A change on a copy, by someone else.
            let origin = REGIONS[rng.below(REGIONS.len() as u64) as usize];
            if origin == name {
                return ("out-of-band", vec![]);
            }
            let mut key = Bytes::from(format!(
                "{}clusters/c1/services/s{}/protocols/http/endpoints/10.0.0.{}",
                prefix(origin),
                rng.below(6),
                rng.below(14)
            ));
            if regions[i].knobs.churn {
                // A hand edit of a stable value the copy holds: no count
                // sees it, only a pass or the copy watch, and no write at
                // the source repairs it by accident. (Only with churn, so
                // that the other seeds keep their draws.)
                let held: Vec<_> = regions[i]
                    .cluster
                    .dump(format!("{}clusters/c1/services/stable/", prefix(origin)))
                    .into_iter()
                    .map(|kv| kv.key().clone())
                    .collect();
                if !held.is_empty() && rng.below(2) == 0 {
                    key = held[rng.below(held.len() as u64) as usize].clone();
                }
            }
            let c = regions[i].cluster.client(0);
            let t = trace.now_ms();
            let txn = if rng.below(6) == 0 {
                // `del --prefix` of the whole copy.
                trace.note(format!("fault: del --prefix on {name} of {origin}'s copy"));
                regions[i].oob.push((t, Bytes::from(prefix(origin)), true));
                Txn::new().and_then([Delete::prefix(prefix(origin))])
            } else if rng.below(2) == 0 {
                regions[i].oob.push((t, key.clone(), false));
                Txn::new().and_then([Delete::key(key.clone())])
            } else {
                regions[i].oob.push((t, key.clone(), false));
                Txn::new()
                    .when([Compare::version(key.clone(), CompareOp::Greater, -1)])
                    .and_then([Put::new(key.clone(), "out-of-band")])
            };
            let done = futures_util::FutureExt::now_or_never(c.txn(txn));
            if done.is_none() {
                // Member 0 is held: the change lands when it is released,
                // and only then can anything see it (`Heal::Release`).
                regions[i].oob.last_mut().expect("pushed above").0 = i64::MAX;
            }
            trace.note(format!(
                "fault: out-of-band change on {name} ({key:?} unless del --prefix) at revision {:?}",
                done.and_then(Result::ok).map(|r| r.header.revision)
            ));
            ("out-of-band", vec![])
        }
        5 => {
            // Member 0 stops applying; unary calls fail over to member 1,
            // the watches stay on member 0.
            trace.note(format!(
                "fault: {name} member 0 held, unary calls fail over"
            ));
            regions[i].cluster.hold(0);
            for r in regions.iter() {
                for l in &r.links {
                    if l.cluster.member_id(0) == regions[i].cluster.member_id(0) {
                        l.member.store(1, Relaxed);
                    }
                }
            }
            // Released first, failed back later.
            let release = later(300, 3000);
            let failback = release + Duration::from_millis(rng.below(2000));
            (
                "lag",
                vec![(release, Heal::Release(i)), (failback, Heal::Failback(i))],
            )
        }
        6 => {
            let step = if rng.below(2) == 0 {
                3_600_000
            } else {
                -3_600_000
            };
            regions[i].skew.store(step, Relaxed);
            trace.note(format!("fault: {name} wall clock stepped {step} ms"));
            ("clock-step", vec![(later(1000, 8000), Heal::Skew(i))])
        }
        _ => handover(regions, i, rng, trace),
    }
}

type Fault = (&'static str, Vec<(tokio::time::Instant, Heal)>);

/// A crash: no drain, no revoke; a replica takes over later.
fn kill(regions: &mut [Region], i: usize, rng: &Rng, trace: &Trace) -> Fault {
    if let Some(e) = regions[i].engine.take() {
        trace.note(format!("fault: {} engine killed", regions[i].name));
        e.abort();
    }
    let back = tokio::time::Instant::now() + Duration::from_millis(200 + rng.below(6000));
    ("kill", vec![(back, Heal::Restart(i))])
}

/// A leadership change the leader has not noticed yet (its election
/// session lapsed while it was cut from its etcd): the successor starts
/// while the deposed engine writes on for up to two seconds, then steps
/// down; its leases live a TTL more.
fn handover(regions: &mut [Region], i: usize, rng: &Rng, trace: &Trace) -> Fault {
    let Some(old) = regions[i].engine.take() else {
        return ("handover", vec![]);
    };
    if let Some(e) = regions[i].deposed.replace(old) {
        e.abort();
    }
    trace.note(format!("fault: {} leadership handed over", regions[i].name));
    start_engine(regions, i, rng, trace);
    let step_down = tokio::time::Instant::now() + Duration::from_millis(rng.below(2000));
    (
        "handover",
        vec![
            (step_down, Heal::StepDown(i)),
            (step_down + Duration::from_secs(10), Heal::GraceOver(i)),
        ],
    )
}

/// Judges every copy now: a copy claimed fresh must hold, for every key,
/// a value its source held in the last `S_MS` (absent counts as a value),
/// every key on the lease the state key names.
fn sample(regions: &[Region], trace: &Trace, out: &mut Outcome) {
    let now = trace.now_ms();
    if let Some(ms) = trace.spun() {
        out.violations.push(format!(
            "t={now}ms a task spun at {ms} ms without waiting (a livelock; its panic above has the trace)"
        ));
        return;
    }
    for (p, peer) in regions.iter().enumerate() {
        for (o, origin) in regions.iter().enumerate() {
            if o == p {
                continue;
            }
            let state_key = MirrorConfig::new(origin.name).state_key();
            let state = peer
                .cluster
                .dump(state_key.clone())
                .into_iter()
                .find(|kv| kv.key().as_ref() == state_key.as_bytes())
                .and_then(|kv| State::decode(kv.value()));
            out.samples += 1;
            let Some(state) = state else { continue };
            let consumer_now = WALL_BASE_MS + now;
            let staleness_ms = match state.staleness_at(consumer_now) {
                Some(s) if state.synced && (s.as_millis() as i64) < S_MS => s.as_millis() as i64,
                _ => continue,
            };
            out.claims += 1;
            let copy: BTreeMap<Bytes, (Bytes, aether_replicator::etcd::LeaseId)> = peer
                .cluster
                .dump(prefix(origin.name))
                .into_iter()
                .map(|kv| (kv.key().clone(), (kv.value().clone(), kv.lease())))
                .collect();
            let h = origin.history.lock().unwrap();
            let lo = now - S_MS;
            let mut keys: Vec<&Bytes> = copy.keys().collect();
            keys.extend(h.keys().filter(|k| !copy.contains_key(*k)));
            // The instant the claim vouches for: its heartbeat.
            let as_of = now - staleness_ms;
            let grace_ms = |emptied: bool| {
                if origin.knobs.copy_watch || emptied {
                    OOB_GRACE_MS
                } else {
                    OOB_GRACE_UNWATCHED_MS
                }
            };
            for key in keys {
                // A change made out of band must be seen within the grace:
                // a claim vouching for an instant that long after it must
                // not hold it. One made later (an engine dead or cut from
                // the peer sees nothing; its last heartbeat ages) is not
                // the claim's to know.
                let excused = peer
                    .oob
                    .iter()
                    .any(|(t, k, emptied)| key.starts_with(k) && *t > as_of - grace_ms(*emptied));
                if excused {
                    continue;
                }
                let have = copy.get(key).map(|(v, _)| v.clone());
                let entries: Vec<(i64, i64, Option<Bytes>)> = h
                    .get(key)
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
                    .iter()
                    .map(|(t, r, v)| (*t, *r, on_peer(p, v.clone())))
                    .collect();
                if !admitted(&entries, lo, now, &have) {
                    out.violations.push(format!(
                        "t={now}ms {} copy on {} claimed fresh (revision {}, heartbeat {} ms old; source at {}) holds {:?} = {:?}; source (ms, revision, value) in [{lo}, {now}] ms: {:?}",
                        origin.name,
                        peer.name,
                        state.revision,
                        consumer_now - state.heartbeat_unix_ms,
                        origin.cluster.revision(),
                        key,
                        have,
                        entries.iter().rev().take(4).collect::<Vec<_>>()
                    ));
                    trace.note(format!("VIOLATION {}", out.violations.last().unwrap()));
                    return;
                }
                if let Some((_, lease)) = copy.get(key)
                    && *lease != state.lease
                {
                    out.violations.push(format!(
                        "t={now}ms {} copy on {} claimed fresh holds {key:?} on lease {lease:?}, state names {:?}",
                        origin.name, peer.name, state.lease
                    ));
                    return;
                }
            }
        }
    }
}

/// Whether the source held `have` at some time in `[lo, hi]`.
fn admitted(entries: &[(i64, i64, Option<Bytes>)], lo: i64, hi: i64, have: &Option<Bytes>) -> bool {
    // The value at `lo`: the last entry at or before it (absent if none).
    let at_lo = entries
        .iter()
        .rev()
        .find(|(t, _, _)| *t <= lo)
        .and_then(|(_, _, v)| v.clone());
    if &at_lo == have {
        return true;
    }
    entries
        .iter()
        .any(|(t, _, v)| *t > lo && *t <= hi && v == have)
}

fn final_check(regions: &[Region], trace: &Trace, out: &mut Outcome) {
    let now = trace.now_ms();
    for (p, peer) in regions.iter().enumerate() {
        for (o, origin) in regions.iter().enumerate() {
            if o == p {
                continue;
            }
            let source: BTreeMap<Bytes, Bytes> = origin
                .cluster
                .dump(prefix(origin.name))
                .into_iter()
                .filter_map(|kv| Some((kv.key().clone(), on_peer(p, Some(kv.value().clone()))?)))
                .collect();
            let copy: BTreeMap<Bytes, Bytes> = peer
                .cluster
                .dump(prefix(origin.name))
                .into_iter()
                .map(|kv| (kv.key().clone(), kv.value().clone()))
                .collect();
            if source != copy {
                let missing: Vec<_> = source
                    .keys()
                    .filter(|k| !copy.contains_key(*k))
                    .take(3)
                    .collect();
                let stray: Vec<_> = copy
                    .keys()
                    .filter(|k| !source.contains_key(*k))
                    .take(3)
                    .collect();
                let differ: Vec<_> = source
                    .iter()
                    .filter(|(k, v)| copy.get(*k).is_some_and(|c| c != *v))
                    .take(3)
                    .collect();
                out.violations.push(format!(
                    "t={now}ms after healing, {}'s copy on {} is not exact: missing {missing:?} stray {stray:?} differ {differ:?}",
                    origin.name, peer.name
                ));
            }
        }
    }
}
