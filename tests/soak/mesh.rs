//! The three-region mesh: etcds, per-link fault proxies, two replicators
//! per region ([`Mesh::start`] starts the etcds and the proxies,
//! [`Mesh::spawn_all`] the replicators).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aether_replicator::etcd::{Client, ClientConfig};

use crate::common::peer_proxy::PeerProxy;
use crate::common::replicator::{Replicator, http_get, metric};
use crate::common::{Cluster, Etcd, FaultProxy};

pub(crate) const REGIONS: [&str; 3] = ["a", "b", "c"];
/// c's etcd refuses requests above this (`--max-request-bytes`).
pub(crate) const C_MAX_REQUEST: usize = 524288;
/// A value at least this long cannot be held by c (the oversized fault
/// writes ~600 KiB; churn values are at most 64 KiB).
pub(crate) const TOO_LARGE_FOR_C: usize = 256 * 1024;

/// How the replicators are run (`PROFILE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Profile {
    /// CI's (`PROFILE` unset or `ci`): `--lease-ttl 6s`,
    /// `--heartbeat-interval 1s`, `--lapse-after 30s`; the verification
    /// and recount intervals at their defaults. Short timers: many lease
    /// turns and claims in a 90 s run.
    Ci,
    /// `PROFILE=default`: no tuning flag at all, the engine's defaults
    /// (lease TTL 30 s, heartbeat 5 s, lapse after 5 min, verification
    /// every hour, recount every 10 min), as a deployment runs.
    Default,
}

impl Profile {
    pub(crate) fn from_env() -> Profile {
        match std::env::var("PROFILE").unwrap_or_default().as_str() {
            "" | "ci" => Profile::Ci,
            "default" => Profile::Default,
            other => panic!("PROFILE={other:?}: ci (the default) or default"),
        }
    }

    /// The lease TTL (s) the replicators start with.
    pub(crate) fn lease_ttl_secs(self) -> u64 {
        match self {
            Profile::Ci => 6,
            Profile::Default => aether_replicator::mirror::DEFAULT_LEASE_TTL.as_secs(),
        }
    }

    /// The freshness probe's interval.
    pub(crate) fn heartbeat(self) -> Duration {
        match self {
            Profile::Ci => Duration::from_secs(1),
            Profile::Default => aether_replicator::mirror::DEFAULT_HEARTBEAT_INTERVAL,
        }
    }

    /// S: how stale a copy may read and still be claimed fresh, in ms. 5 s
    /// in CI (five heartbeats); twice the heartbeat at the defaults, where
    /// a current copy's staleness reads up to a heartbeat.
    pub(crate) fn grace_ms(self) -> i64 {
        match self {
            Profile::Ci => 5000,
            Profile::Default => 2 * self.heartbeat().as_millis() as i64,
        }
    }

    /// The replicators' flags beyond the region, endpoints and id, with
    /// `ttl` the region's lease TTL now (`TtlRestart` changes it).
    fn flags(self, ttl: u64) -> Vec<String> {
        match self {
            // The verification pass keeps its default interval (1 h):
            // nothing here may lean on a pass coming round soon.
            Profile::Ci => vec![
                format!("--lease-ttl={ttl}s"),
                "--heartbeat-interval=1s".into(),
                "--lapse-after=30s".into(),
            ],
            Profile::Default if ttl == self.lease_ttl_secs() => Vec::new(),
            Profile::Default => vec![format!("--lease-ttl={ttl}s")],
        }
    }
}

pub(crate) fn prefix(region: &str) -> String {
    format!("/aether/v1/regions/{region}/")
}

pub(crate) fn state_key(origin: &str) -> String {
    format!("/aether/v1/replication/{origin}/state")
}

/// A client with short timeouts over `endpoints`.
pub(crate) fn client(endpoints: &[String]) -> Client {
    let mut cfg = ClientConfig::new(endpoints.iter().cloned());
    cfg.request_timeout = Duration::from_secs(3);
    cfg.connect_timeout = Duration::from_secs(1);
    Client::connect(cfg).expect("client")
}

/// One replicator slot: the process (None while killed), its base
/// arguments, and whether it is SIGSTOPped.
pub(crate) struct Replica {
    pub id: String,
    pub proc: Option<Replicator>,
    /// `sh` reading a pipe from this test process: if the process dies
    /// without running destructors, the pipe closes and the watchdog
    /// SIGKILLs the replicator (as the harness does for etcd).
    pub watchdog: Option<std::process::Child>,
    pub stopped: bool,
    pub spawns: u32,
}

impl Replica {
    pub(crate) fn metrics(&self) -> Option<SocketAddr> {
        if self.stopped {
            // A stopped process claims nothing (and would stall the scrape).
            return None;
        }
        self.proc.as_ref().and_then(|p| p.metrics())
    }
    pub(crate) fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.pid())
    }
}

pub(crate) struct Region {
    pub name: &'static str,
    pub members: Vec<Arc<Mutex<Etcd>>>,
    pub endpoints: Vec<String>,
    pub client: Client,
    pub replicas: Vec<Arc<Mutex<Replica>>>,
    /// Lease TTL in seconds the replicators are (re)started with.
    pub ttl: AtomicU64,
    /// Largest value (exclusive) this region's etcd can hold as a peer.
    pub max_value: usize,
    /// Set while the nemesis restores this etcd from a snapshot.
    pub restoring: AtomicBool,
    /// Bumped after every restore.
    pub restores: AtomicU64,
    pub snapshots: Mutex<Vec<PathBuf>>,
}

impl Region {
    pub(crate) fn is_restoring(&self) -> bool {
        self.restoring.load(Ordering::SeqCst)
    }
}

pub(crate) struct Mesh {
    pub profile: Profile,
    pub regions: Vec<Region>,
    /// links[origin][peer]: one proxy per member of the peer.
    pub links: Vec<Vec<Vec<FaultProxy>>>,
    /// The proxy in front of each of a's members' peer port.
    pub peer_proxies: Vec<Arc<PeerProxy>>,
    /// a's member ids, by member index.
    pub member_ids: Vec<u64>,
    pub dir: PathBuf,
    /// Where replicator logs are kept.
    pub log_dir: PathBuf,
}

impl Mesh {
    pub(crate) async fn start(profile: Profile, dir: PathBuf, log_dir: PathBuf) -> Mesh {
        // a's members reach each other through proxies that can cut one
        // of them from the quorum.
        let mut peer_proxies = Vec::new();
        for _ in 0..3 {
            peer_proxies.push(Arc::new(PeerProxy::start().await));
        }
        let pp = peer_proxies.clone();
        let (a, b, c) = tokio::task::spawn_blocking(move || {
            let Cluster { members } = Cluster::start_advertising(3, |i, port| {
                pp[i].set_upstream_port(port);
                pp[i].url()
            });
            let b = Etcd::start();
            let c = Etcd::builder()
                .extra_args(&[&format!("--max-request-bytes={C_MAX_REQUEST}")])
                .start();
            (members, b, c)
        })
        .await
        .expect("start etcds");
        let all: Vec<Vec<Etcd>> = vec![a, vec![b], vec![c]];
        let mut regions = Vec::new();
        let mut addrs: Vec<Vec<SocketAddr>> = Vec::new();
        for (idx, members) in all.into_iter().enumerate() {
            let endpoints: Vec<String> = members.iter().map(|m| m.endpoint()).collect();
            addrs.push(members.iter().map(|m| m.client_addr()).collect());
            let name = REGIONS[idx];
            regions.push(Region {
                name,
                client: client(&endpoints),
                endpoints,
                members: members
                    .into_iter()
                    .map(|m| Arc::new(Mutex::new(m)))
                    .collect(),
                replicas: (0..2)
                    .map(|i| {
                        Arc::new(Mutex::new(Replica {
                            id: format!("{name}-{i}"),
                            proc: None,
                            watchdog: None,
                            stopped: false,
                            spawns: 0,
                        }))
                    })
                    .collect(),
                ttl: AtomicU64::new(profile.lease_ttl_secs()),
                max_value: if name == "c" {
                    TOO_LARGE_FOR_C
                } else {
                    usize::MAX
                },
                restoring: AtomicBool::new(false),
                restores: AtomicU64::new(0),
                snapshots: Mutex::new(Vec::new()),
            });
        }
        let mut links = Vec::new();
        for o in 0..3 {
            let mut row = Vec::new();
            for p in 0..3 {
                let mut proxies = Vec::new();
                if o != p {
                    for &addr in &addrs[p] {
                        proxies.push(FaultProxy::start(addr).await);
                    }
                }
                row.push(proxies);
            }
            links.push(row);
        }
        let names: Vec<String> = regions[0]
            .members
            .iter()
            .map(|m| {
                m.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .name()
                    .to_string()
            })
            .collect();
        let list = regions[0].client.member_list().await.expect("member list");
        let member_ids = names
            .iter()
            .map(|n| {
                list.members
                    .iter()
                    .find(|m| &m.name == n)
                    .expect("member id")
                    .id
            })
            .collect();
        Mesh {
            profile,
            regions,
            links,
            peer_proxies,
            member_ids,
            dir,
            log_dir,
        }
    }

    /// Starts both replicators of every region.
    pub(crate) fn spawn_all(&self) {
        for r in 0..3 {
            for i in 0..2 {
                self.spawn_replica(r, i);
            }
        }
    }

    pub(crate) fn replicator_args(&self, r: usize, id: &str) -> Vec<String> {
        let reg = &self.regions[r];
        let mut args = vec![
            format!("--region={}", reg.name),
            format!("--local-etcd={}", reg.endpoints.join(",")),
        ];
        for p in 0..3 {
            if p == r {
                continue;
            }
            let urls: Vec<String> = self.links[r][p].iter().map(|x| x.endpoint()).collect();
            args.push(format!("--peer-etcd={}={}", REGIONS[p], urls.join(",")));
        }
        args.extend(self.profile.flags(reg.ttl.load(Ordering::SeqCst)));
        args.push(format!("--replica-id={id}"));
        args
    }

    /// (Re)starts replica `i` of region `r` (killing a running one first).
    /// Blocking (a kill and a spawn).
    pub(crate) fn spawn_replica(&self, r: usize, i: usize) {
        let mut rep = self.regions[r].replicas[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.retire(&mut rep);
        let args = self.replicator_args(r, &rep.id);
        let proc = Replicator::spawn(&args);
        rep.watchdog = std::process::Command::new("sh")
            .arg("-c")
            .arg(r#"read -r _ignored; kill -CONT "$1" 2>/dev/null; kill -9 "$1" 2>/dev/null"#)
            .arg("replicator-watchdog")
            .arg(proc.pid().to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok();
        rep.proc = Some(proc);
        rep.spawns += 1;
    }

    /// Kills replica `i` of region `r` (its log is kept).
    pub(crate) fn kill_replica(&self, r: usize, i: usize) {
        let mut rep = self.regions[r].replicas[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.retire(&mut rep);
    }

    fn retire(&self, rep: &mut Replica) {
        if let Some(mut w) = rep.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        if let Some(mut p) = rep.proc.take() {
            if rep.stopped {
                signal(p.pid(), "CONT");
            }
            p.kill();
            let _ = std::fs::copy(
                &p.log,
                self.log_dir
                    .join(format!("replica-{}.{}.log", rep.id, rep.spawns)),
            );
        }
        rep.stopped = false;
    }

    /// Which replica of `r` says it leads (blocking scrapes).
    pub(crate) fn leader_of(&self, r: usize) -> Option<usize> {
        (0..2).find(|&i| {
            let addr = self.regions[r].replicas[i]
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .metrics();
            addr.and_then(|a| http_get(a, "/metrics"))
                .and_then(|(_, page)| metric(&page, "aether_replicator_is_leader"))
                == Some(1.0)
        })
    }

    /// Copies every live replica's log to the log dir (at the end).
    pub(crate) fn save_logs(&self) {
        for reg in &self.regions {
            for rep in &reg.replicas {
                let rep = rep.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(p) = &rep.proc {
                    let _ = std::fs::copy(
                        &p.log,
                        self.log_dir
                            .join(format!("replica-{}.{}.log", rep.id, rep.spawns)),
                    );
                }
            }
        }
    }
}

pub(crate) fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Peak resident set (VmHWM) of `pid` in KiB.
pub(crate) fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

impl Mesh {
    /// Cuts a's member `m` from its quorum: nothing reaches it, nothing
    /// it sends reaches the others.
    pub(crate) fn partition(&self, m: usize) {
        for (j, p) in self.peer_proxies.iter().enumerate() {
            if j == m {
                p.isolate(true);
            } else {
                p.block_sender(self.member_ids[m]);
            }
        }
    }

    pub(crate) fn heal_partition(&self) {
        for p in &self.peer_proxies {
            p.heal();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        if let Some(p) = &self.proc
            && self.stopped
        {
            signal(p.pid(), "CONT");
        }
        // The Replicator's own Drop SIGKILLs and reaps it.
    }
}
