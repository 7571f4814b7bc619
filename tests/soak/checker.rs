//! The history checker: every source region's history from a watch, and
//! samples of every (origin, peer) copy judged against it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aether_replicator::etcd::{Error, EventKind, OpResponse, Range, Txn, WatchOptions};

use crate::common::replicator::{http_get, metric};
use crate::load::{BIG, BIG_SERVICES, big_prefix, big_service};
use crate::mesh::{Mesh, REGIONS, prefix, state_key};
use crate::nemesis::{Log, Oob};

/// The checker's own slack (its watch's delay, scheduling); also how long
/// after an out-of-band change finished a claim of currency may still
/// predate the engine's noticing it.
pub(crate) const SLACK_MS: i64 = 1000;
/// A copy holding fewer than half the keys the source held throughout is
/// "emptied" (only judged when the source held at least this many).
const EMPTIED_MIN: usize = 20;
/// Keys missing from a copy that are listed one by one; more are one
/// problem.
const MISSING_LISTED: usize = 20;
/// Services of the large cluster each sample of its copy reads.
const PAGE_SERVICES: u64 = 8;
/// Keys of the large cluster changed out of band that every sample of its
/// copy reads (the latest).
const TOUCHED_READ: usize = 64;

/// How the keys a copy lacks are judged, of the `held` keys the source
/// held throughout the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Missing {
    /// None lacking.
    None,
    /// Each lacking key is a problem of its own (*missing*).
    Each,
    /// More than [`MISSING_LISTED`]: one problem (*missing-keys*).
    Many,
    /// Fewer than half the keys left: one problem (*emptied*).
    Emptied,
}

/// Every lacking key is judged: a copy claimed fresh must hold every key
/// the source held throughout the window, whatever share is missing.
fn judge_missing(held: usize, missing: usize) -> Missing {
    if missing == 0 {
        Missing::None
    } else if held >= EMPTIED_MIN && (held - missing) * 2 < held {
        Missing::Emptied
    } else if missing > MISSING_LISTED {
        Missing::Many
    } else {
        Missing::Each
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub(crate) fn hash(v: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

pub(crate) fn preview(v: &[u8]) -> String {
    let s = String::from_utf8_lossy(&v[..v.len().min(40)]).into_owned();
    if v.len() > 40 {
        format!("{s}..({} bytes)", v.len())
    } else {
        s
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Val {
    pub hash: u64,
    pub len: usize,
    pub preview: String,
}

impl Val {
    fn of(v: &[u8]) -> Val {
        Val {
            hash: hash(v),
            len: v.len(),
            preview: preview(v),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub epoch: u64,
    pub rev: i64,
    pub t_ms: i64,
    pub val: Option<Val>,
}

/// One source region's history.
#[derive(Default)]
pub(crate) struct History {
    /// Sorted: a sample judges the key ranges it read.
    pub keys: BTreeMap<Vec<u8>, Vec<Entry>>,
    /// Bumped by every re-read (start, restore, broken watch).
    pub epoch: u64,
    /// The watch has delivered everything through this revision (of `epoch`).
    pub caught_up: i64,
    /// Samples whose window starts at or before this are not judged.
    pub gap_until: i64,
    /// The region's restore count the current epoch was read after.
    pub restores_seen: u64,
    pub resets: Vec<(i64, String)>,
    pub events: u64,
}

impl History {
    fn push(&mut self, key: &[u8], e: Entry) {
        self.keys.entry(key.to_vec()).or_default().push(e);
    }

    /// The values `key` held at some point in [lower, U]: the one current
    /// at `lower` (by observed time) and every later one through revision
    /// `u` of epoch `epoch_u`. `None` stands for "absent".
    fn allowed(&self, key: &[u8], lower: i64, epoch_u: u64, u: i64) -> Vec<Option<&Val>> {
        match self.keys.get(key) {
            Some(es) => admits_list(es, lower, epoch_u, u),
            None => vec![None],
        }
    }
}

/// [`History::allowed`], given the key's entries.
fn admits_list(es: &[Entry], lower: i64, epoch_u: u64, u: i64) -> Vec<Option<&Val>> {
    let mut out = Vec::new();
    admits(Some(es), lower, epoch_u, u, |a| {
        out.push(a);
        false
    });
    out
}

/// Whether any value of [`History::allowed`] passes `ok`, given the key's
/// entries; without building the list (a sample of the large copy judges
/// 25,000 keys, in a test built without optimisation).
fn admits<'a>(
    es: Option<&'a [Entry]>,
    lower: i64,
    epoch_u: u64,
    u: i64,
    mut ok: impl FnMut(Option<&'a Val>) -> bool,
) -> bool {
    let Some(es) = es else {
        return ok(None);
    };
    let base = es.iter().rposition(|e| e.t_ms <= lower);
    if ok(base.and_then(|i| es[i].val.as_ref())) {
        return true;
    }
    let from = base.map_or(0, |i| i + 1);
    es[from..]
        .iter()
        .filter(|e| e.epoch < epoch_u || (e.epoch == epoch_u && e.rev <= u))
        .any(|e| ok(e.val.as_ref()))
}

pub(crate) struct Region {
    pub history: Mutex<History>,
}

/// The part of a copy one sample reads and judges: key ranges
/// `[from, to)`, and single keys outside them.
///
/// Every copy is read whole, but for the large one's large cluster: a
/// sample of that reads everything else in it, [`PAGE_SERVICES`] of the
/// cluster's services in turn (all of it every few seconds), and every
/// key of the cluster changed out of band on that peer lately. Reading
/// 25,000 keys per sample took 1-2 s in this unoptimised test build (read
/// and judged), a sixth of the sampling rate of the other copies, and a
/// core's worth of CPU taken from the system under test.
struct Scope {
    ranges: Vec<(Vec<u8>, Vec<u8>)>,
    keys: Vec<Vec<u8>>,
}

/// The key just past every key starting with `p`.
fn prefix_end(p: &str) -> Vec<u8> {
    let mut end = p.as_bytes().to_vec();
    let last = end.last_mut().expect("non-empty prefix");
    *last += 1;
    end
}

impl Scope {
    /// The scope of sample `n` of origin `o`'s copy on peer `p`.
    fn of(o: usize, p: usize, n: u64, log: &Log) -> Scope {
        let region = REGIONS[o];
        let whole = (prefix(region).into_bytes(), prefix_end(&prefix(region)));
        if o != BIG {
            return Scope {
                ranges: vec![whole],
                keys: Vec::new(),
            };
        }
        let big = big_prefix(region);
        let mut ranges = vec![
            (whole.0, big.clone().into_bytes()),
            (prefix_end(&big), whole.1),
        ];
        for j in 0..PAGE_SERVICES {
            let svc = big_service(region, (n * PAGE_SERVICES + j) % BIG_SERVICES);
            ranges.push((svc.clone().into_bytes(), prefix_end(&svc)));
        }
        let oob = log.oob.lock().unwrap_or_else(PoisonError::into_inner);
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for k in oob
            .iter()
            .rev()
            .filter(|x| x.peer == p && x.origin == Some(o))
            .filter_map(|x| x.key.as_ref())
        {
            if keys.len() == TOUCHED_READ {
                break;
            }
            let covered = ranges
                .iter()
                .any(|(a, b)| a.as_slice() <= k.as_slice() && k.as_slice() < b.as_slice());
            if !covered && !keys.contains(k) {
                keys.push(k.clone());
            }
        }
        drop(oob);
        ranges.sort();
        Scope { ranges, keys }
    }

    /// Ranges to read, in one txn.
    fn reads(&self) -> Vec<Range> {
        self.ranges
            .iter()
            .map(|(a, b)| Range::between(a.clone(), b.clone()))
            .chain(self.keys.iter().map(|k| Range::key(k.clone())))
            .collect()
    }
}

/// The signals one scrape of a replica gave.
#[derive(Clone, Debug, Default)]
pub(crate) struct Signal {
    pub answered: bool,
    pub leader: bool,
    pub synced: bool,
    pub staleness: f64,
    pub lapsed: bool,
    pub ready: Option<bool>,
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.answered {
            return write!(f, "(no answer)");
        }
        write!(
            f,
            "leader={} synced={} staleness={:.3}s lapsed={}",
            u8::from(self.leader),
            u8::from(self.synced),
            self.staleness,
            u8::from(self.lapsed)
        )
    }
}

/// The series of a replicator's metrics page the checker reads, for the
/// copy of `origin` on `peer`: (name, selector). A renamed metric would
/// read as "no claim" and turn every violation into a signalled
/// discrepancy, so each must be seen on the page ([`verify_series`], and
/// [`Figures::series_seen`] for every scrape of a leader).
pub(crate) fn series(origin: &str, peer: &str) -> [(&'static str, String); 4] {
    let sel =
        |name: &str| format!("aether_replicator_{name}{{origin=\"{origin}\",peer=\"{peer}\"}}");
    [
        (
            "is_leader",
            format!("aether_replicator_is_leader{{region=\"{origin}\"}}"),
        ),
        ("peer_synced", sel("peer_synced")),
        ("peer_staleness_seconds", sel("peer_staleness_seconds")),
        ("peer_lapsed", sel("peer_lapsed")),
    ]
}

/// What one page says about the copy of `origin` on `peer`, and the
/// series it lacks.
fn read_page(page: &str, origin: &str, peer: &str) -> (Signal, Vec<&'static str>) {
    let [leader, synced, staleness, lapsed] = series(origin, peer);
    let mut absent = Vec::new();
    let mut get = |(name, sel): &(&'static str, String)| {
        let v = metric(page, sel);
        if v.is_none() {
            absent.push(*name);
        }
        v
    };
    let signal = Signal {
        answered: true,
        leader: get(&leader) == Some(1.0),
        synced: get(&synced) == Some(1.0),
        staleness: get(&staleness).unwrap_or(f64::INFINITY),
        lapsed: get(&lapsed) == Some(1.0),
        ready: None,
    };
    (signal, absent)
}

/// Fails unless, within 30 s, every region has a leader whose metrics
/// page carries every series the checker reads for each of its peers.
pub(crate) async fn verify_series(mesh: &Mesh) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    'origin: for o in 0..3 {
        loop {
            for rep in &mesh.regions[o].replicas {
                let addr = rep.lock().unwrap_or_else(PoisonError::into_inner).metrics();
                let Some(addr) = addr else { continue };
                let page = tokio::task::spawn_blocking(move || http_get(addr, "/metrics"))
                    .await
                    .ok()
                    .flatten()
                    .map(|(_, p)| p)
                    .unwrap_or_default();
                let mut absent = Vec::new();
                let mut leads = false;
                for p in (0..3).filter(|&p| p != o) {
                    let (sig, missing) = read_page(&page, REGIONS[o], REGIONS[p]);
                    leads = sig.leader;
                    absent.extend(
                        missing
                            .into_iter()
                            .map(|m| format!("{m} ({}->{})", REGIONS[o], REGIONS[p])),
                    );
                }
                if leads && absent.is_empty() {
                    continue 'origin;
                }
                let names: std::collections::BTreeSet<&str> = page
                    .lines()
                    .filter(|l| l.starts_with("aether_replicator_"))
                    .filter_map(|l| l.split(['{', ' ']).next())
                    .collect();
                last = format!(
                    "{}'s replica at {addr}: leads={leads}, absent {absent:?}; its series: {names:?}",
                    REGIONS[o]
                );
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "no leader of {} showed every series the checker reads within 30 s: {last}",
                    REGIONS[o]
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

fn scrape(addr: Option<std::net::SocketAddr>, origin: &str, peer: &str, f: &Figures) -> Signal {
    let Some(addr) = addr else {
        return Signal::default();
    };
    let Some((_, page)) = http_get(addr, "/metrics") else {
        return Signal::default();
    };
    let (signal, absent) = read_page(&page, origin, peer);
    // A standby has no per-peer series; a leader must have them all.
    if signal.leader || absent.contains(&"is_leader") {
        let mut seen = f.series_seen.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, _) in series(origin, peer) {
            let e = seen.entry(name).or_default();
            if absent.contains(&name) {
                e.1 += 1;
            } else {
                e.0 += 1;
            }
        }
    }
    signal
}

/// Both replicas of `origin`, scraped in parallel. (t before, signals)
async fn scrape_all(mesh: &Mesh, f: &Arc<Figures>, o: usize, p: usize) -> (i64, Vec<Signal>) {
    let t = now_ms();
    let mut hs = Vec::new();
    for rep in &mesh.regions[o].replicas {
        let addr = rep.lock().unwrap_or_else(PoisonError::into_inner).metrics();
        let f = f.clone();
        hs.push(tokio::task::spawn_blocking(move || {
            let mut s = scrape(addr, REGIONS[o], REGIONS[p], &f);
            if let Some(a) = addr.filter(|_| s.answered) {
                s.ready = http_get(a, "/readyz").map(|(st, _)| st == 200);
            }
            s
        }));
    }
    let mut out = Vec::new();
    for h in hs {
        out.push(h.await.unwrap_or_default());
    }
    (t, out)
}

/// The sender's claim in one signal read: Some(lower bound of currency).
fn sender_claim(t: i64, sigs: &[Signal], s_ms: i64) -> Option<i64> {
    sigs.iter()
        .filter(|s| s.answered && s.leader && s.synced && s.staleness * 1000.0 < s_ms as f64)
        .map(|s| t - (s.staleness * 1000.0).ceil() as i64)
        .min()
}

/// Fields of a state key value, by key.
pub(crate) fn parse_state(v: &str) -> HashMap<String, String> {
    v.split(' ')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[derive(Clone, Debug)]
pub(crate) struct Violation {
    pub t_ms: i64,
    pub origin: &'static str,
    pub peer: &'static str,
    pub key: String,
    pub kind: String,
    pub peer_value: String,
    pub allowed: Vec<String>,
    pub signals: String,
    pub count: u64,
    /// The last sample of the episode.
    pub last_t_ms: i64,
    pub last_peer_value: String,
    pub last_signals: String,
}

/// Judged samples of one copy under (any claim, the sender's in both
/// reads, the receiver's state key).
pub(crate) type Claims = (u64, u64, u64);

#[derive(Default)]
pub(crate) struct Figures {
    pub samples: AtomicU64,
    pub evaluated: AtomicU64,
    pub skipped: AtomicU64,
    pub not_caught_up: AtomicU64,
    pub discrepant_samples: AtomicU64,
    pub signalled_discrepancies: AtomicU64,
    pub violation_samples: AtomicU64,
    pub violations: AtomicU64,
    /// Problems excused because out-of-band damage postdates the claims.
    pub excused_oob: AtomicU64,
    /// Problems excused because the copy's lease lapsed after the claims.
    pub excused_lapse: AtomicU64,
    /// Samples evaluated per pair, and the time they took in all (ms): the
    /// large copy's are slower, and must not be too few.
    pub per_pair: Mutex<HashMap<(usize, usize), (u64, i64)>>,
    /// Evaluated samples per pair under a claim of freshness.
    pub claims: Mutex<HashMap<(usize, usize), Claims>>,
    /// Scrapes of a leader (or of a page without `is_leader`), by metric
    /// name the checker reads: (the series there, absent).
    pub series_seen: Mutex<std::collections::BTreeMap<&'static str, (u64, u64)>>,
    /// Longest signalled-stale period per pair (ms).
    pub longest_signalled: Mutex<HashMap<(usize, usize), i64>>,
    pub list: Mutex<Vec<Violation>>,
    pub ready_seen: Mutex<HashMap<String, (u64, u64)>>,
}

/// What the sampler of one pair carries from sample to sample.
#[derive(Default)]
struct PairState {
    /// Start of the current signalled-stale run.
    run_start: Option<i64>,
    /// Since when the state key has been seen absent.
    absent_since: Option<i64>,
    /// (key, kind, value hash) -> (index in the list, last seen).
    dedup: HashMap<(String, String, u64), (usize, i64)>,
    /// Samples taken (which page of the large cluster is next).
    samples: u64,
}

pub(crate) struct Checker {
    pub regions: Vec<Region>,
    pub figures: Arc<Figures>,
    pub stop: AtomicBool,
}

impl Checker {
    pub(crate) fn new() -> Checker {
        Checker {
            regions: (0..3)
                .map(|_| Region {
                    history: Mutex::new(History::default()),
                })
                .collect(),
            figures: Arc::default(),
            stop: AtomicBool::new(false),
        }
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Records region `r`'s history until stopped.
    pub(crate) async fn record(self: Arc<Self>, mesh: Arc<Mesh>, r: usize) {
        let reg = &mesh.regions[r];
        let pfx = prefix(REGIONS[r]);
        while !self.stopped() {
            if reg.is_restoring() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let restores = reg.restores.load(Ordering::SeqCst);
            let resp = match reg.client.range(Range::prefix(pfx.clone())).await {
                Ok(r) => r,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let head = resp.header.revision;
            let t = now_ms();
            {
                let mut h = self.regions[r]
                    .history
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                h.epoch += 1;
                let epoch = h.epoch;
                let present: HashSet<Vec<u8>> =
                    resp.kvs().iter().map(|kv| kv.key().to_vec()).collect();
                let gone: Vec<Vec<u8>> = h
                    .keys
                    .iter()
                    .filter(|(k, es)| {
                        !present.contains(*k) && es.last().is_some_and(|e| e.val.is_some())
                    })
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in gone {
                    h.push(
                        &k,
                        Entry {
                            epoch,
                            rev: head,
                            t_ms: t,
                            val: None,
                        },
                    );
                }
                for kv in resp.kvs() {
                    h.push(
                        kv.key(),
                        Entry {
                            epoch,
                            rev: kv.mod_revision(),
                            t_ms: t,
                            val: Some(Val::of(kv.value())),
                        },
                    );
                }
                h.caught_up = head;
                h.gap_until = t;
                h.restores_seen = restores;
                h.resets.push((t, format!("re-read at revision {head}")));
            }
            let Ok((ws, mut w)) = reg.client.watch(
                WatchOptions::prefix(pfx.clone())
                    .start_revision(head + 1)
                    .progress_notify(),
            ) else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            loop {
                if self.stopped()
                    || reg.is_restoring()
                    || reg.restores.load(Ordering::SeqCst) != restores
                {
                    break;
                }
                // Only events say how far the history is complete: etcd
                // 3.4 answers a progress request with a broadcast that
                // reaches watchers still catching up, and a catch-up
                // response carries the store's current revision, not the
                // last one it delivers. The region's own load writes
                // several times a second, so events keep coming.
                match tokio::time::timeout(
                    Duration::from_millis(300),
                    futures_util::StreamExt::next(&mut w),
                )
                .await
                {
                    Err(_) => {}
                    Ok(Some(Ok(resp))) => {
                        let t = now_ms();
                        let mut h = self.regions[r]
                            .history
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner);
                        let epoch = h.epoch;
                        for ev in &resp.events {
                            let val = match ev.kind {
                                EventKind::Put => Some(Val::of(ev.kv.value())),
                                EventKind::Delete => None,
                            };
                            h.events += 1;
                            h.push(
                                ev.kv.key(),
                                Entry {
                                    epoch,
                                    rev: ev.revision(),
                                    t_ms: t,
                                    val,
                                },
                            );
                            h.caught_up = h.caught_up.max(ev.revision());
                        }
                        drop(h);
                    }
                    Ok(Some(Err(Error::Compacted { .. }))) | Ok(Some(Err(_))) | Ok(None) => {
                        break;
                    }
                }
            }
            drop(w);
            drop(ws);
        }
    }

    /// Samples the copy of origin `o` on peer `p` until stopped.
    pub(crate) async fn sample(
        self: Arc<Self>,
        mesh: Arc<Mesh>,
        log: Arc<Log>,
        o: usize,
        p: usize,
    ) {
        let mut pair = PairState::default();
        while !self.stopped() {
            let started = tokio::time::Instant::now();
            let t = now_ms();
            if self.sample_once(&mesh, &log, o, p, &mut pair).await {
                let mut per = self
                    .figures
                    .per_pair
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let e = per.entry((o, p)).or_default();
                e.0 += 1;
                e.1 += now_ms() - t;
            }
            let next = started + Duration::from_millis(300);
            tokio::time::sleep_until(next).await;
        }
    }

    /// One sample; whether it was evaluated.
    async fn sample_once(
        &self,
        mesh: &Mesh,
        log: &Log,
        o: usize,
        p: usize,
        pair: &mut PairState,
    ) -> bool {
        let PairState {
            run_start,
            absent_since,
            dedup,
            samples: n,
        } = pair;
        let f = &self.figures;
        let s_ms = mesh.profile.grace_ms();
        let src = &mesh.regions[o];
        let peer = &mesh.regions[p];
        f.samples.fetch_add(1, Ordering::Relaxed);
        let skip = || {
            f.skipped.fetch_add(1, Ordering::Relaxed);
            false
        };
        if src.is_restoring() {
            return skip();
        }
        let n0 = src.restores.load(Ordering::SeqCst);
        let e0 = {
            let h = self.regions[o]
                .history
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if h.restores_seen != n0 {
                return skip();
            }
            h.epoch
        };
        let scope = Scope::of(o, p, *n, log);
        *n += 1;
        let (ts1, sig1) = scrape_all(mesh, &self.figures, o, p).await;
        let t_r0 = now_ms();
        let txn = Txn::new()
            .and_then(scope.reads())
            .and_then([Range::key(state_key(REGIONS[o]))]);
        let Ok(read) = peer.client.txn(txn).await else {
            return skip();
        };
        let t_r1 = now_ms();
        let (ts2, sig2) = scrape_all(mesh, &self.figures, o, p).await;
        let Ok(up) = src
            .client
            .range(Range::key(state_key(REGIONS[o])).count_only())
            .await
        else {
            return skip();
        };
        let u = up.header.revision;
        let mut copy = Vec::new();
        let mut state = None;
        let reads = read.responses.len();
        for (i, r) in read.responses.into_iter().enumerate() {
            if let OpResponse::Range(r) = r {
                if i + 1 < reads {
                    copy.extend(r.into_kvs());
                } else {
                    state = r
                        .into_kvs()
                        .into_iter()
                        .next()
                        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
                }
            }
        }
        {
            let mut rs = f.ready_seen.lock().unwrap_or_else(PoisonError::into_inner);
            for (i, s) in sig1.iter().chain(&sig2).enumerate() {
                if let Some(ready) = s.ready {
                    let e = rs.entry(format!("{}-{}", REGIONS[o], i % 2)).or_default();
                    if ready { e.0 += 1 } else { e.1 += 1 }
                }
            }
        }
        // The claims.
        // The state key shares the mirror lease: absent, the lease is gone
        // (lapsed, revoked) or being replaced. Since when, as seen here.
        if state.is_none() {
            absent_since.get_or_insert(t_r0);
        } else {
            *absent_since = None;
        }
        // Each fresh claim: the time the copy is claimed current as of.
        let mut claims = Vec::new();
        if let (Some(c1), Some(c2)) = (
            sender_claim(ts1, &sig1, s_ms),
            sender_claim(ts2, &sig2, s_ms),
        ) {
            claims.push(c1);
            claims.push(c2);
        }
        let fields = state.as_deref().map(parse_state).unwrap_or_default();
        let hb: Option<i64> = fields.get("heartbeat").and_then(|v| v.parse().ok());
        let receiver_fresh = fields.get("synced").map(String::as_str) == Some("1")
            && hb.is_some_and(|hb| t_r1 - hb < s_ms);
        if receiver_fresh {
            claims.push(hb.unwrap());
        }
        let signalling = claims.is_empty();
        let lower = claims.iter().copied().fold(t_r0 - s_ms, i64::min) - SLACK_MS;

        // Wait until the history has caught up to U.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            {
                let h = self.regions[o]
                    .history
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if h.epoch != e0 || h.restores_seen != n0 || src.is_restoring() {
                    return skip();
                }
                if lower <= h.gap_until {
                    return skip();
                }
                if h.caught_up >= u {
                    break;
                }
            }
            if tokio::time::Instant::now() >= deadline || self.stopped() {
                f.not_caught_up.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if src.restores.load(Ordering::SeqCst) != n0 {
            return skip();
        }
        f.evaluated.fetch_add(1, Ordering::Relaxed);
        if !signalling {
            let mut c = f.claims.lock().unwrap_or_else(PoisonError::into_inner);
            let e = c.entry((o, p)).or_default();
            e.0 += 1;
            e.1 += u64::from(claims.len() > usize::from(receiver_fresh));
            e.2 += u64::from(receiver_fresh);
        }

        // Judge the copy.
        let mut problems: Vec<(String, String, String, Vec<String>, u64)> = Vec::new();
        let h = self.regions[o]
            .history
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Sorted by key, for the look-ups below (a touched key may also
        // fall in a page).
        copy.sort_by(|a, b| a.key().cmp(b.key()));
        copy.dedup_by(|a, b| a.key() == b.key());
        for kv in &copy {
            let v = kv.value();
            let hv = hash(v);
            let es = h.keys.get(kv.key().as_ref()).map(Vec::as_slice);
            let ok = admits(es, lower, e0, u, |a| {
                a.is_some_and(|a| a.hash == hv && a.len < peer.max_value)
            });
            if ok && !kv.lease().is_none() {
                continue;
            }
            let allowed = h.allowed(kv.key(), lower, e0, u);
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let show = |allowed: &[Option<&Val>]| {
                allowed
                    .iter()
                    .map(|a| a.map_or("(absent)".to_string(), |a| a.preview.clone()))
                    .collect::<Vec<_>>()
            };
            if !ok {
                let ever = h.keys.get(kv.key().as_ref()).is_some_and(|es| {
                    es.iter()
                        .any(|e| e.val.as_ref().is_some_and(|x| x.hash == hv))
                });
                let kind = if allowed.iter().all(Option::is_none) {
                    if ever {
                        "deleted-at-source-still-on-peer"
                    } else {
                        "value-never-at-source (key absent at source)"
                    }
                } else if ever {
                    "stale-value"
                } else {
                    "value-never-at-source"
                };
                problems.push((key.clone(), kind.into(), preview(v), show(&allowed), hv));
            }
            if kv.lease().is_none() {
                problems.push((key, "no-lease".into(), preview(v), show(&allowed), hv));
            }
        }
        // Keys the source held throughout the window must be on the peer:
        // a key deleted out of band and never put back is as wrong as a
        // value never restored.
        let mut held = 0usize;
        let mut missing = Vec::new();
        let in_scope = scope
            .ranges
            .iter()
            .flat_map(|(a, b)| h.keys.range(a.clone()..b.clone()))
            .chain(
                scope
                    .keys
                    .iter()
                    .filter_map(|k| h.keys.get_key_value(k.as_slice())),
            );
        for (k, es) in in_scope {
            let absent_ok = admits(Some(es), lower, e0, u, |a| {
                a.is_none_or(|a| a.len >= peer.max_value)
            });
            if !absent_ok {
                held += 1;
                if copy
                    .binary_search_by(|kv| kv.key().as_ref().cmp(k.as_slice()))
                    .is_err()
                {
                    missing.push((k, es));
                }
            }
        }
        let verdict = judge_missing(held, missing.len());
        if verdict == Missing::Emptied {
            problems.push((
                prefix(REGIONS[o]),
                "emptied".into(),
                format!("{} of {held} keys", held - missing.len()),
                vec![format!("{held} keys held throughout the window")],
                0,
            ));
        } else if verdict == Missing::Many {
            problems.push((
                prefix(REGIONS[o]),
                "missing-keys".into(),
                format!(
                    "{} of {held} keys missing, the first {}",
                    missing.len(),
                    String::from_utf8_lossy(missing[0].0)
                ),
                vec![format!("{held} keys held throughout the window")],
                0,
            ));
        } else {
            for (k, es) in missing {
                let allowed = admits_list(es, lower, e0, u);
                problems.push((
                    String::from_utf8_lossy(k).into_owned(),
                    "missing".into(),
                    "(absent)".into(),
                    allowed
                        .iter()
                        .map(|a| a.map_or("(absent)".to_string(), |a| a.preview.clone()))
                        .collect(),
                    0,
                ));
            }
        }
        drop(h);
        // Out-of-band damage to this copy that the claims predate is
        // excused: the engine can only notice it after the fact. Every such
        // change, one key or the whole copy (a put, a delete, a value
        // edited in place, del --prefix, a lease revoked, the peer
        // restored), must be noticed by the next claim of currency, with
        // SLACK_MS for the watch that brings it: the engine watches its
        // copy on the peer and takes it out of currency at the first event
        // that is not its own, so no change waits for a verification pass
        // (whose interval is the default hour here, as in production).
        // One key gets no more time than a whole copy.
        let latest_claim = claims.iter().copied().max();
        if let Some(c) = latest_claim {
            let oob = log.oob.lock().unwrap_or_else(PoisonError::into_inner);
            let relevant: Vec<&Oob> = oob
                .iter()
                .filter(|x| x.peer == p && x.origin.is_none_or(|y| y == o) && x.t_start <= t_r1)
                .collect();
            let excused = |key: &str, x: &Oob| {
                let covers = x
                    .key
                    .as_ref()
                    .is_none_or(|k| k.as_slice() == key.as_bytes());
                covers && x.t_done.is_none_or(|d| c <= d + SLACK_MS)
            };
            let before = problems.len();
            problems.retain(|(key, ..)| !relevant.iter().any(|x| excused(key, x)));
            let n = (before - problems.len()) as u64;
            f.excused_oob.fetch_add(n, Ordering::Relaxed);
            // A copy that lapsed (its lease expired while R could not reach
            // P) is gone by design; the sender learns it only afterwards.
            // Excused unless a claim of currency postdates the first sample
            // that saw the lease gone.
            if let Some(since) = *absent_since
                && c <= since + SLACK_MS
                && !problems.is_empty()
            {
                f.excused_lapse
                    .fetch_add(problems.len() as u64, Ordering::Relaxed);
                problems.clear();
            }
        }
        if problems.is_empty() {
            *run_start = None;
            return true;
        }
        f.discrepant_samples.fetch_add(1, Ordering::Relaxed);
        if signalling {
            f.signalled_discrepancies.fetch_add(1, Ordering::Relaxed);
            let start = *run_start.get_or_insert(t_r0);
            let mut l = f
                .longest_signalled
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let e = l.entry((o, p)).or_default();
            *e = (*e).max(t_r0 - start);
            return true;
        }
        *run_start = None;
        f.violation_samples.fetch_add(1, Ordering::Relaxed);
        let signals = format!(
            "sender@{ts1}: [{}] sender@{ts2}: [{}] state={:?} t_r={t_r0} lower={lower} (t_r-{}ms) U={u}",
            sig1.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join("; "),
            sig2.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join("; "),
            state,
            t_r0 - lower,
        );
        let mut list = f.list.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, kind, pv, allowed, hv) in problems {
            f.violations.fetch_add(1, Ordering::Relaxed);
            let id = (key.clone(), kind.clone(), hv);
            // One entry per episode: the same problem in samples less
            // than 3 s apart.
            if let Some((i, last)) = dedup.get_mut(&id)
                && t_r0 - *last < 3000
            {
                let v = &mut list[*i];
                v.count += 1;
                v.last_t_ms = t_r0;
                v.last_peer_value = pv;
                v.last_signals = signals.clone();
                *last = t_r0;
                continue;
            }
            dedup.insert(id, (list.len(), t_r0));
            list.push(Violation {
                t_ms: t_r0,
                origin: REGIONS[o],
                peer: REGIONS[p],
                key,
                kind,
                peer_value: pv,
                allowed,
                signals: signals.clone(),
                count: 1,
                last_t_ms: t_r0,
                last_peer_value: String::new(),
                last_signals: String::new(),
            });
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any key missing is a problem, from one key to all of them: no share
    /// of a copy (under half, say) goes unjudged.
    #[test]
    fn every_missing_key_is_judged() {
        for held in 0..200 {
            for missing in 0..=held {
                let v = judge_missing(held, missing);
                assert_eq!(
                    v == Missing::None,
                    missing == 0,
                    "{missing} of {held} keys missing judged {v:?}"
                );
            }
        }
        assert_eq!(judge_missing(100, 1), Missing::Each);
        assert_eq!(judge_missing(100, 49), Missing::Many);
        assert_eq!(judge_missing(100, 51), Missing::Emptied);
    }
}
