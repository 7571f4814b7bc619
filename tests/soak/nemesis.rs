//! The nemesis: seeded faults, several at a time, each healed after a
//! random duration.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aether_replicator::etcd::{Put, Range};

use crate::checker::{now_ms, parse_state};
use crate::common::mirror::{Lcg, key_in};
use crate::common::replicator::http_get;
use crate::load::{BIG, BIG_KEYS, big_key, churn_prefix, value};
use crate::mesh::{Mesh, REGIONS, prefix, signal, state_key};

const MAX_ACTIVE: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    KillLeader,
    StopLeader,
    KillEtcd,
    Partition,
    LinkCut,
    LinkLatency,
    RestoreSnapshot,
    Compact,
    OobPut,
    OobDelete,
    OobDelPrefix,
    OobEdit,
    RevokeLease,
    TtlRestart,
    Oversized,
}

const KINDS: [(Kind, u64); 15] = [
    (Kind::KillLeader, 10),
    (Kind::StopLeader, 8),
    (Kind::KillEtcd, 8),
    (Kind::Partition, 6),
    (Kind::LinkCut, 10),
    (Kind::LinkLatency, 8),
    (Kind::RestoreSnapshot, 5),
    (Kind::Compact, 6),
    (Kind::OobPut, 6),
    (Kind::OobDelete, 5),
    (Kind::OobDelPrefix, 4),
    (Kind::OobEdit, 5),
    (Kind::RevokeLease, 5),
    (Kind::TtlRestart, 4),
    (Kind::Oversized, 4),
];

#[derive(Debug)]
enum Heal {
    Respawn(usize, usize),
    Cont(usize, usize),
    RestartEtcd(usize, usize),
    Reconnect(usize, usize),
    Unpartition,
    NoLatency(usize, usize),
}

struct Active {
    record: usize,
    heal_at: tokio::time::Instant,
    heal: Heal,
    resources: Vec<String>,
}

#[derive(Clone, Debug)]
pub(crate) struct FaultRecord {
    pub kind: Kind,
    pub desc: String,
    pub start_ms: i64,
    pub heal_ms: Option<i64>,
    pub outcome: String,
    /// It changed the large copy (see `load::BIG`).
    pub large: bool,
}

/// An out-of-band change to a peer's copy (or to the whole peer store),
/// which the engine can only notice after the fact: the checker excuses
/// what it causes until the engine claims currency past it.
#[derive(Clone, Debug)]
pub(crate) struct Oob {
    pub peer: usize,
    /// The origin whose copy was touched; None: every copy on the peer.
    pub origin: Option<usize>,
    /// The one key touched; None: the whole copy.
    pub key: Option<Vec<u8>>,
    pub t_start: i64,
    /// None while in progress.
    pub t_done: Option<i64>,
}

#[derive(Default)]
pub(crate) struct Log {
    pub faults: Mutex<Vec<FaultRecord>>,
    pub oob: Mutex<Vec<Oob>>,
}

impl Log {
    fn oob_start(&self, peer: usize, origin: Option<usize>, key: Option<Vec<u8>>) -> usize {
        let mut o = self.oob.lock().unwrap_or_else(PoisonError::into_inner);
        o.push(Oob {
            peer,
            origin,
            key,
            t_start: now_ms(),
            t_done: None,
        });
        o.len() - 1
    }

    fn oob_done(&self, i: usize) {
        self.oob.lock().unwrap_or_else(PoisonError::into_inner)[i].t_done = Some(now_ms());
    }

    pub(crate) fn by_kind(&self) -> BTreeMap<String, usize> {
        self.count_kinds(|_| true)
    }

    /// The faults that changed the large copy, by kind.
    pub(crate) fn large_by_kind(&self) -> BTreeMap<String, usize> {
        self.count_kinds(|f| f.large)
    }

    fn count_kinds(&self, keep: impl Fn(&&FaultRecord) -> bool) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        let faults = self.faults.lock().unwrap_or_else(PoisonError::into_inner);
        for f in faults.iter().filter(keep) {
            *m.entry(format!("{:?}", f.kind)).or_default() += 1;
        }
        m
    }
}

pub(crate) struct Nemesis {
    mesh: Arc<Mesh>,
    rng: Lcg,
    log: Arc<Log>,
    active: Vec<Active>,
    seq: u64,
    snapshot_dir: std::path::PathBuf,
    /// Every kind, in the seeded order they are first injected.
    cover: Vec<Kind>,
    cursor: usize,
}

/// Every kind of fault.
pub(crate) fn kinds() -> impl Iterator<Item = Kind> {
    KINDS.iter().map(|k| k.0)
}

/// What went wrong in the nemesis's own work (a kill, a restart, a
/// restore that panicked): any of it fails the run, which could otherwise
/// pass with faults it never injected or never healed.
static ERRORS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The nemesis's errors so far.
pub(crate) fn errors() -> Vec<String> {
    ERRORS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Runs `f` on a blocking thread; a panic there is a nemesis error.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, String> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        let what = format!("blocking task failed: {e}");
        eprintln!("[nemesis {}] ERROR {what}", now_ms());
        ERRORS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(what.clone());
        what
    })
}

impl Nemesis {
    pub(crate) fn new(mesh: Arc<Mesh>, seed: u64, log: Arc<Log>) -> Nemesis {
        let snapshot_dir = mesh.dir.join("snapshots");
        std::fs::create_dir_all(&snapshot_dir).unwrap();
        Nemesis {
            mesh,
            rng: Lcg(seed ^ 0x6e656d65),
            cover: {
                let mut order: Vec<Kind> = kinds().collect();
                let mut rng = Lcg(seed ^ 0x636f7665);
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.below(i as u64 + 1) as usize);
                }
                order
            },
            cursor: 0,
            log,
            active: Vec::new(),
            seq: 0,
            snapshot_dir,
        }
    }

    fn busy(&self) -> HashSet<String> {
        self.active
            .iter()
            .flat_map(|a| a.resources.iter().cloned())
            .collect()
    }

    fn record(&self, kind: Kind, desc: String) -> usize {
        let mut f = self
            .log
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        eprintln!("[nemesis {}] start {kind:?}: {desc}", now_ms());
        f.push(FaultRecord {
            kind,
            desc,
            start_ms: now_ms(),
            heal_ms: None,
            outcome: String::new(),
            large: false,
        });
        f.len() - 1
    }

    fn outcome(&self, i: usize, what: String) {
        if !what.is_empty() {
            eprintln!("[nemesis {}] outcome #{i}: {what}", now_ms());
        }
        self.log
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)[i]
            .outcome = what;
    }

    /// Runs until `stop`, then heals everything.
    pub(crate) async fn run(mut self, stop: Arc<AtomicBool>) {
        let mut next_fault = tokio::time::Instant::now() + Duration::from_secs(3);
        let mut next_snapshot = tokio::time::Instant::now() + Duration::from_secs(2);
        while !stop.load(Ordering::SeqCst) {
            let now = tokio::time::Instant::now();
            // Heal what is due.
            let mut i = 0;
            while i < self.active.len() {
                if self.active[i].heal_at <= now {
                    let a = self.active.remove(i);
                    self.heal(a).await;
                } else {
                    i += 1;
                }
            }
            if now >= next_snapshot {
                self.snapshots().await;
                next_snapshot = now + Duration::from_secs(6 + self.rng.below(6));
            }
            if now >= next_fault {
                if self.active.len() < MAX_ACTIVE {
                    self.inject().await;
                }
                // Faster while some kind is still owed (see `pick_kind`),
                // so that a short run covers every kind.
                let owed = self.log.by_kind().len() < KINDS.len();
                let gap = if owed {
                    1000 + self.rng.below(1000)
                } else {
                    2000 + self.rng.below(3000)
                };
                next_fault = tokio::time::Instant::now() + Duration::from_millis(gap);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for a in std::mem::take(&mut self.active) {
            self.heal(a).await;
        }
        heal_all(&self.mesh).await;
    }

    async fn snapshots(&mut self) {
        for r in 1..3 {
            self.seq += 1;
            let path = self
                .snapshot_dir
                .join(format!("{}-{}.db", REGIONS[r], self.seq));
            let member = self.mesh.regions[r].members[0].clone();
            let p = path.clone();
            let ok = blocking(move || {
                let mut m = member.lock().unwrap_or_else(PoisonError::into_inner);
                // etcdctl snapshot save waits forever for a dead endpoint.
                m.is_running()
                    && etcdctl_bounded(
                        &m.endpoint(),
                        &["snapshot".into(), "save".into(), p.display().to_string()],
                    )
                    .0
            })
            .await
            .unwrap_or(false);
            if ok {
                let mut s = self.mesh.regions[r]
                    .snapshots
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                s.push(path);
                if s.len() > 6 {
                    let old = s.remove(0);
                    let _ = std::fs::remove_file(old);
                }
            }
        }
    }

    fn pick_kind(&mut self) -> Kind {
        // Every kind once first, in a seeded order: a run that never
        // injected some kind cannot pass (see `main.rs`'s minimums). A
        // kind whose injection was skipped (its resource busy, no snapshot
        // yet) stays owed; the next draw tries the next owed one.
        let done = self.log.by_kind();
        let owed: Vec<Kind> = self
            .cover
            .iter()
            .copied()
            .filter(|k| !done.contains_key(&format!("{k:?}")))
            .collect();
        if !owed.is_empty() {
            self.cursor += 1;
            return owed[self.cursor % owed.len()];
        }
        let total: u64 = KINDS.iter().map(|k| k.1).sum();
        let mut x = self.rng.below(total);
        for (k, w) in KINDS {
            if x < w {
                return k;
            }
            x -= w;
        }
        unreachable!()
    }

    fn pair(&mut self) -> (usize, usize) {
        let o = self.rng.below(3) as usize;
        let p = (o + 1 + self.rng.below(2) as usize) % 3;
        (o, p)
    }

    fn duration(&mut self) -> Duration {
        Duration::from_millis(2000 + self.rng.below(13000))
    }

    async fn inject(&mut self) {
        let kind = self.pick_kind();
        let busy = self.busy();
        let free = |rs: &[String]| rs.iter().all(|r| !busy.contains(r));
        let dur = self.duration();
        let heal_at = tokio::time::Instant::now() + dur;
        let mesh = self.mesh.clone();
        match kind {
            Kind::KillLeader | Kind::StopLeader => {
                let r = self.rng.below(3) as usize;
                let m = mesh.clone();
                let leader = blocking(move || m.leader_of(r)).await.ok().flatten();
                let i = leader.unwrap_or(self.rng.below(2) as usize);
                let res = vec![format!("rep:{r}:{i}")];
                if !free(&res) {
                    return;
                }
                let desc = format!(
                    "replicator {}-{i} ({}) for {dur:?}",
                    REGIONS[r],
                    if leader.is_some() {
                        "leader"
                    } else {
                        "no leader seen"
                    }
                );
                let rec = self.record(kind, desc);
                let heal = if kind == Kind::KillLeader {
                    let m = mesh.clone();
                    let _ = blocking(move || m.kill_replica(r, i)).await;
                    Heal::Respawn(r, i)
                } else {
                    let mut rep = mesh.regions[r].replicas[i]
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    if let Some(pid) = rep.pid() {
                        signal(pid, "STOP");
                        rep.stopped = true;
                    }
                    Heal::Cont(r, i)
                };
                self.active.push(Active {
                    record: rec,
                    heal_at,
                    heal,
                    resources: res,
                });
            }
            Kind::KillEtcd => {
                let r = self.rng.below(3) as usize;
                let n = mesh.regions[r].members.len();
                let m = self.rng.below(n as u64) as usize;
                let res = vec![format!("etcd:{r}")];
                if !free(&res) {
                    return;
                }
                let rec = self.record(kind, format!("etcd {} member {m} for {dur:?}", REGIONS[r]));
                let member = mesh.regions[r].members[m].clone();
                let _ =
                    blocking(move || member.lock().unwrap_or_else(PoisonError::into_inner).kill())
                        .await;
                self.active.push(Active {
                    record: rec,
                    heal_at,
                    heal: Heal::RestartEtcd(r, m),
                    resources: res,
                });
            }
            Kind::Partition => {
                let m = self.rng.below(3) as usize;
                let res = vec!["etcd:0".to_string()];
                if !free(&res) {
                    return;
                }
                let rec = self.record(
                    kind,
                    format!("etcd a member {m} cut from its quorum (peer proxies) for {dur:?}"),
                );
                mesh.partition(m);
                // Evidence that the cut holds: the member loses its leader
                // (election timeout 1s) while cut.
                let port = mesh.regions[0].members[m]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .metrics_port();
                let log = self.log.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(1800)).await;
                    let page = blocking(move || {
                        http_get(
                            std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                            "/metrics",
                        )
                    })
                    .await
                    .ok()
                    .flatten()
                    .map(|(_, p)| p)
                    .unwrap_or_default();
                    let has = page
                        .lines()
                        .find(|l| l.starts_with("etcd_server_has_leader "))
                        .unwrap_or("etcd_server_has_leader ?")
                        .to_string();
                    log.faults.lock().unwrap_or_else(PoisonError::into_inner)[rec].outcome =
                        format!("after 1.8s: {has}");
                });
                self.active.push(Active {
                    record: rec,
                    heal_at,
                    heal: Heal::Unpartition,
                    resources: res,
                });
            }
            Kind::LinkCut | Kind::LinkLatency => {
                let (o, p) = self.pair();
                let res = vec![format!("link:{o}:{p}")];
                if !free(&res) {
                    return;
                }
                let (heal, desc) = if kind == Kind::LinkCut {
                    for x in &mesh.links[o][p] {
                        x.cut();
                    }
                    (
                        Heal::Reconnect(o, p),
                        format!("cut {}->{} for {dur:?}", REGIONS[o], REGIONS[p]),
                    )
                } else {
                    let ms = 50 + self.rng.below(200);
                    for x in &mesh.links[o][p] {
                        x.set_latency(Duration::from_millis(ms));
                    }
                    (
                        Heal::NoLatency(o, p),
                        format!("{ms}ms latency {}->{} for {dur:?}", REGIONS[o], REGIONS[p]),
                    )
                };
                let rec = self.record(kind, desc);
                self.active.push(Active {
                    record: rec,
                    heal_at,
                    heal,
                    resources: res,
                });
            }
            Kind::RestoreSnapshot => {
                let r = 1 + self.rng.below(2) as usize;
                let res = vec![format!("etcd:{r}")];
                if !free(&res) {
                    return;
                }
                let snap = {
                    let s = mesh.regions[r]
                        .snapshots
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner);
                    if s.is_empty() {
                        return;
                    }
                    s[self.rng.below(s.len() as u64) as usize].clone()
                };
                let rec = self.record(kind, format!("etcd {} from {}", REGIONS[r], snap.display()));
                let oob = self.log.oob_start(r, None, None);
                let reg_restoring = &mesh.regions[r].restoring;
                reg_restoring.store(true, Ordering::SeqCst);
                let member = mesh.regions[r].members[0].clone();
                let res = blocking(move || {
                    let mut m = member.lock().unwrap_or_else(PoisonError::into_inner);
                    m.restore_snapshot(&snap);
                })
                .await;
                mesh.regions[r].restores.fetch_add(1, Ordering::SeqCst);
                reg_restoring.store(false, Ordering::SeqCst);
                self.log.oob_done(oob);
                if let Err(e) = res {
                    self.outcome(rec, e);
                }
                self.log
                    .faults
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)[rec]
                    .heal_ms = Some(now_ms());
            }
            Kind::Compact => {
                let r = self.rng.below(3) as usize;
                let Ok(resp) = mesh.regions[r]
                    .client
                    .range(Range::key("/").count_only())
                    .await
                else {
                    return;
                };
                let rev = resp.header.revision;
                let rec = self.record(kind, format!("etcd {} at revision {rev}", REGIONS[r]));
                let out = self
                    .etcdctl(r, vec!["compact".into(), rev.to_string()])
                    .await;
                self.outcome(rec, out);
            }
            Kind::OobPut | Kind::OobDelete | Kind::OobDelPrefix | Kind::OobEdit => {
                self.out_of_band(kind).await;
            }
            Kind::RevokeLease => {
                let (o, p) = self.pair();
                let Ok(resp) = mesh.regions[p]
                    .client
                    .range(Range::key(state_key(REGIONS[o])))
                    .await
                else {
                    return;
                };
                let Some(kv) = resp.kvs().first() else {
                    return;
                };
                let fields = parse_state(&String::from_utf8_lossy(kv.value()));
                let Some(lease) = fields.get("lease").and_then(|l| l.parse::<i64>().ok()) else {
                    return;
                };
                let rec = self.record(
                    kind,
                    format!("lease {lease:x} of {} on {}", REGIONS[o], REGIONS[p]),
                );
                let oob = self.log.oob_start(p, Some(o), None);
                let out = self
                    .etcdctl(
                        p,
                        vec!["lease".into(), "revoke".into(), format!("{lease:x}")],
                    )
                    .await;
                self.log.oob_done(oob);
                self.outcome(rec, out);
            }
            Kind::TtlRestart => {
                let r = self.rng.below(3) as usize;
                let res = vec![format!("rep:{r}:0"), format!("rep:{r}:1")];
                if !free(&res) {
                    return;
                }
                // The profile's TTL and a third more, in turn (6 s and
                // 8 s in the CI profile).
                let base = mesh.profile.lease_ttl_secs();
                let ttl = if mesh.regions[r].ttl.load(Ordering::SeqCst) == base {
                    base + base / 3
                } else {
                    base
                };
                mesh.regions[r].ttl.store(ttl, Ordering::SeqCst);
                let rec = self.record(
                    kind,
                    format!(
                        "replicators of {} with --lease-ttl={ttl}s, one at a time",
                        REGIONS[r]
                    ),
                );
                let m = mesh.clone();
                let _ = blocking(move || m.spawn_replica(r, 0)).await;
                self.active.push(Active {
                    record: rec,
                    heal_at,
                    heal: Heal::Respawn(r, 1),
                    resources: res,
                });
            }
            Kind::Oversized => {
                let r = self.rng.below(2) as usize;
                let key = key_in(REGIONS[r], self.rng.below(crate::load::KEYS) as usize);
                self.seq += 1;
                let v = value(&format!("{}-big", REGIONS[r]), self.seq, 600 * 1024);
                let rec = self.record(kind, format!("600 KiB value at {key}"));
                let res = mesh.regions[r].client.put(Put::new(key, v)).await;
                self.outcome(rec, format!("{:?}", res.map(|_| "ok")));
            }
        }
    }

    /// A change made by hand to a copy on a peer. Half of them go to the
    /// large copy (`load::BIG`'s, on either peer) and touch its large
    /// cluster; the rest to any copy's churn keys. `OobDelPrefix` of the
    /// large copy removes more keys than a repair takes (a re-sync's job);
    /// drawn for its churn keys only, it removes one cluster from it.
    async fn out_of_band(&mut self, kind: Kind) {
        let mesh = self.mesh.clone();
        let big_cluster = self.rng.below(2) == 0;
        let (o, p) = if big_cluster {
            (BIG, (BIG + 1 + self.rng.below(2) as usize) % 3)
        } else {
            self.pair()
        };
        let peer = &mesh.regions[p].client;
        self.seq += 1;
        let seq = self.seq;
        // The key a one-key change touches.
        let key = match kind {
            Kind::OobDelPrefix => None,
            _ if big_cluster => {
                // A few tries for a key the copy holds: a delete or an edit
                // needs one, a put takes any.
                let mut found = None;
                for _ in 0..4 {
                    let key = big_key(REGIONS[o], self.rng.below(BIG_KEYS));
                    if kind == Kind::OobPut || value_on(peer, &key).await.is_some() {
                        found = Some(key);
                        break;
                    }
                }
                let Some(key) = found else {
                    return;
                };
                Some(key)
            }
            _ => {
                let copy = peer
                    .range(Range::prefix(churn_prefix(REGIONS[o])).keys_only())
                    .await
                    .map(|r| {
                        r.kvs()
                            .iter()
                            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                if kind == Kind::OobPut && (copy.is_empty() || self.rng.below(2) == 1) {
                    Some(key_in(REGIONS[o], 1000 + self.rng.below(1000) as usize))
                } else if copy.is_empty() {
                    return;
                } else {
                    Some(copy[self.rng.below(copy.len() as u64) as usize].clone())
                }
            }
        };
        let on = REGIONS[p];
        let large = o == BIG;
        let copy_name = if large { "the large copy" } else { "the copy" };
        let rec = match (&key, kind) {
            (Some(key), Kind::OobPut) => format!("put {key}=GARBAGE-{seq} on {on}"),
            (Some(key), Kind::OobDelete) => format!("del {key} on {on}"),
            (Some(key), _) => {
                format!("edit {key} in place on {on} (same length, lease kept)")
            }
            (None, _) if large && !big_cluster => {
                format!("del --prefix {} on {on}", churn_prefix(REGIONS[o]))
            }
            (None, _) => format!("del --prefix {} on {on}", prefix(REGIONS[o])),
        };
        let rec = self.record(kind, format!("{rec} ({copy_name} of {})", REGIONS[o]));
        if large {
            self.log
                .faults
                .lock()
                .unwrap_or_else(PoisonError::into_inner)[rec]
                .large = true;
        }
        if kind == Kind::OobEdit {
            let key = key.expect("an edit has a key");
            // Read again just before: the edit keeps whatever the copy
            // holds now, less a few bytes.
            let Some(mut v) = value_on(peer, &key).await else {
                return self.outcome(rec, "gone before the edit".into());
            };
            let mark = format!("EDITED-{seq}-");
            let n = mark.len().min(v.len());
            v[..n].copy_from_slice(&mark.as_bytes()[..n]);
            let oob = self
                .log
                .oob_start(p, Some(o), Some(key.clone().into_bytes()));
            let res = peer.put(Put::new(key, v).ignore_lease()).await;
            self.log.oob_done(oob);
            return self.outcome(rec, format!("{:?}", res.map(|_| "ok")));
        }
        let args: Vec<String> = match (&key, kind) {
            (Some(key), Kind::OobPut) => {
                vec!["put".into(), key.clone(), format!("GARBAGE-{seq}")]
            }
            (Some(key), _) => vec!["del".into(), key.clone()],
            (None, _) if large && !big_cluster => {
                vec!["del".into(), "--prefix".into(), churn_prefix(REGIONS[o])]
            }
            (None, _) => vec!["del".into(), "--prefix".into(), prefix(REGIONS[o])],
        };
        let oob = self.log.oob_start(p, Some(o), key.map(String::into_bytes));
        let out = self.etcdctl(p, args).await;
        self.log.oob_done(oob);
        self.outcome(rec, out);
    }

    async fn etcdctl(&self, r: usize, args: Vec<String>) -> String {
        let reg = &self.mesh.regions[r];
        let member = reg.members[0].clone();
        let eps = reg.endpoints.join(",");
        blocking(move || {
            // Not while the nemesis restarts or restores that member.
            let _m = member.lock().unwrap_or_else(PoisonError::into_inner);
            etcdctl_bounded(&eps, &args).1
        })
        .await
        .unwrap_or_else(|e| e)
    }

    async fn heal(&self, a: Active) {
        heal_one(&self.mesh, &a.heal).await;
        let mut f = self
            .log
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f[a.record].heal_ms = Some(now_ms());
        eprintln!("[nemesis {}] healed #{} {:?}", now_ms(), a.record, a.heal);
    }
}

/// `key`'s value on `client`'s etcd now (None: absent, or unreadable).
async fn value_on(client: &aether_replicator::etcd::Client, key: &str) -> Option<Vec<u8>> {
    let resp = client.range(Range::key(key.to_string())).await.ok()?;
    resp.kvs().first().map(|kv| kv.value().to_vec())
}

async fn heal_one(mesh: &Arc<Mesh>, h: &Heal) {
    match *h {
        Heal::Respawn(r, i) => {
            let m = mesh.clone();
            let _ = blocking(move || m.spawn_replica(r, i)).await;
        }
        Heal::Cont(r, i) => {
            let mut rep = mesh.regions[r].replicas[i]
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(pid) = rep.pid() {
                signal(pid, "CONT");
            }
            rep.stopped = false;
        }
        Heal::RestartEtcd(r, m) => {
            let member = mesh.regions[r].members[m].clone();
            let _ = blocking(move || {
                let mut e = member.lock().unwrap_or_else(PoisonError::into_inner);
                if !e.is_running() {
                    e.restart();
                }
            })
            .await;
        }
        Heal::Reconnect(o, p) => {
            for x in &mesh.links[o][p] {
                x.heal();
            }
        }
        Heal::Unpartition => mesh.heal_partition(),
        Heal::NoLatency(o, p) => {
            for x in &mesh.links[o][p] {
                x.set_latency(Duration::ZERO);
            }
        }
    }
}

/// Everything back: every etcd running, every link healed without
/// latency, every replicator running and continued.
pub(crate) async fn heal_all(mesh: &Arc<Mesh>) {
    mesh.heal_partition();
    for o in 0..3 {
        for p in 0..3 {
            for x in &mesh.links[o][p] {
                x.heal();
                x.set_latency(Duration::ZERO);
            }
        }
    }
    for r in 0..3 {
        for m in 0..mesh.regions[r].members.len() {
            heal_one(mesh, &Heal::RestartEtcd(r, m)).await;
        }
        mesh.regions[r].restoring.store(false, Ordering::SeqCst);
    }
    for r in 0..3 {
        for i in 0..2 {
            heal_one(mesh, &Heal::Cont(r, i)).await;
            let running = mesh.regions[r].replicas[i]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .proc
                .is_some();
            if !running {
                heal_one(mesh, &Heal::Respawn(r, i)).await;
            }
        }
    }
}

/// Runs etcdctl against `endpoints` with `args`, killing it after 20 s
/// (some commands wait forever for an endpoint that is down). Returns
/// (success, "status stdout stderr").
fn etcdctl_bounded(endpoints: &str, args: &[String]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut cmd = crate::common::etcdctl_command();
    cmd.arg(format!("--endpoints={endpoints}"))
        .arg("--dial-timeout=2s")
        .arg("--command-timeout=10s")
        .args(args)
        .stdout(std::fs::File::create(&out).expect("out"))
        .stderr(std::fs::File::create(&err).expect("err"));
    let Ok(mut child) = cmd.spawn() else {
        return (false, "etcdctl did not start".into());
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let text = format!(
        "{} {}{}",
        status.map_or("killed after 20s".to_string(), |s| s.to_string()),
        std::fs::read_to_string(&out).unwrap_or_default().trim(),
        std::fs::read_to_string(&err).unwrap_or_default().trim()
    );
    (status.is_some_and(|s| s.success()), text)
}
