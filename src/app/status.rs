//! `aether-replicator status`: one region's replication at a glance, for a
//! person, a probe or a cron check.
//!
//! It reads the region's election keys in the local etcd (the oldest
//! candidate leads, see [`super::election`]), and on
//! every peer's etcd the state key this region's replicator keeps there
//! (see [`crate::mirror::state`]) with the lease the copy hangs on. One row
//! per peer: leader, lease time left, applied revision, the local etcd's
//! current revision and the difference, staleness, synced.
//!
//! It exits 1 when something is wrong, with the reason on the row:
//! - no leader: no replica holds the election key;
//! - a peer unreachable, or its state key missing (the copy has lapsed or
//!   was never made);
//! - the copy's lease missing, or below a third of its granted TTL (the
//!   keep-alives are not getting through: the copy is about to lapse);
//! - staleness over `--max-staleness` (the state key's heartbeat is older).
//!
//! The lag is shown, not judged: the local etcd's revision also moves with
//! writes outside this region's subtree (the other regions' copies), so a
//! lag in revisions is not a lag in data.
//!
//! "synced" is the state key's marker of a complete copy under its lease,
//! and the staleness is now minus its heartbeat (see [`State`]), clock skew
//! between the regions included.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::{Value, json};

use super::config::Config;
use super::election::DEFAULT_ELECTION_ROOT;
use crate::error::Result;
use crate::etcd::{Client, Range};
use crate::mirror::state::State;
use crate::mirror::stats::unix_ms;

/// Longest wait for one etcd (local or peer) before reporting it
/// unreachable: a probe must answer in bounded time.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How `status` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusOutput {
    /// An aligned table, one row per peer.
    #[default]
    Table,
    /// One JSON document.
    Json,
}

/// What counts as healthy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusOptions {
    /// Largest acceptable staleness of a copy.
    pub max_staleness: Duration,
    /// Longest wait for one etcd.
    pub probe_timeout: Duration,
}

impl Default for StatusOptions {
    fn default() -> Self {
        StatusOptions {
            max_staleness: Duration::from_secs(60),
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
        }
    }
}

impl StatusOptions {
    /// With another staleness limit.
    #[must_use]
    pub fn with_max_staleness(mut self, d: Duration) -> Self {
        self.max_staleness = d;
        self
    }
    /// With another probe timeout.
    #[must_use]
    pub fn with_probe_timeout(mut self, d: Duration) -> Self {
        self.probe_timeout = d;
        self
    }
}

/// One region's status.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The region.
    pub region: String,
    /// The leading replica's id, if any.
    pub leader: Option<String>,
    /// Seconds left on the leader's election session.
    pub leader_lease_left: Option<i64>,
    /// The local etcd's revision when read.
    pub source_revision: i64,
    /// One row per peer.
    pub peers: Vec<PeerRow>,
}

/// This region's copy on one peer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeerRow {
    /// The peer region.
    pub peer: String,
    /// Why the peer could not be read, if it could not.
    pub error: Option<String>,
    /// The state key, if present and readable.
    pub state: Option<State>,
    /// The state key exists (it may still be unreadable).
    pub present: bool,
    /// Seconds left on the copy's lease; -1 when the lease does not exist.
    pub lease_left: Option<i64>,
    /// The TTL the lease was granted with.
    pub lease_granted: Option<i64>,
    /// Seconds since the copy's heartbeat; `None` while the state key
    /// carries none.
    pub staleness: Option<f64>,
    /// What is wrong with it; empty when healthy.
    pub problems: Vec<String>,
}

impl PeerRow {
    /// The applied revision.
    pub fn applied(&self) -> Option<i64> {
        self.state.map(|s| s.revision)
    }
    /// Whether a complete copy is recorded under the current lease.
    pub fn synced(&self) -> Option<bool> {
        self.state.map(|s| s.synced)
    }
}

impl Report {
    /// Healthy: a leader, and no row with a problem.
    pub fn healthy(&self) -> bool {
        self.leader.is_some() && self.peers.iter().all(|p| p.problems.is_empty())
    }

    /// The problems of `row`, the region's ones included, for printing.
    fn row_problems(&self, row: &PeerRow) -> Vec<String> {
        let mut all = Vec::new();
        if self.leader.is_none() {
            all.push(format!("no leader in region {}", self.region));
        }
        all.extend(row.problems.iter().cloned());
        all
    }

    /// The aligned table.
    pub fn render_table(&self) -> String {
        let header = [
            "REGION",
            "PEER",
            "LEADER",
            "LEASE_LEFT",
            "APPLIED",
            "SOURCE",
            "LAG",
            "STALENESS",
            "SYNCED",
            "STATUS",
        ];
        let dash = || "-".to_string();
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
        for p in &self.peers {
            let problems = self.row_problems(p);
            rows.push(vec![
                self.region.clone(),
                p.peer.clone(),
                self.leader.clone().unwrap_or_else(dash),
                match (p.lease_left, p.lease_granted) {
                    (Some(l), Some(g)) if l >= 0 => format!("{l}s/{g}s"),
                    (Some(_), _) => "expired".into(),
                    _ => dash(),
                },
                p.applied().map_or_else(dash, |r| r.to_string()),
                self.source_revision.to_string(),
                p.applied()
                    .map_or_else(dash, |r| (self.source_revision - r).max(0).to_string()),
                p.staleness.map_or_else(dash, |s| format!("{s:.1}s")),
                p.synced()
                    .map_or_else(dash, |s| if s { "yes" } else { "no" }.into()),
                if problems.is_empty() {
                    "ok".into()
                } else {
                    problems.join("; ")
                },
            ]);
        }
        if self.peers.is_empty() {
            let mut row = vec![dash(); header.len()];
            row[0] = self.region.clone();
            row[2] = self.leader.clone().unwrap_or_else(dash);
            row[5] = self.source_revision.to_string();
            row[9] = if self.leader.is_some() {
                "ok (no peers)".into()
            } else {
                format!("no leader in region {}", self.region)
            };
            rows.push(row);
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for r in &rows {
            let line: Vec<String> = r
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (cell, w))| {
                    if i + 1 == r.len() {
                        cell.clone()
                    } else {
                        format!("{cell:<w$}")
                    }
                })
                .collect();
            let _ = writeln!(out, "{}", line.join("  ").trim_end());
        }
        out
    }

    /// The JSON document.
    pub fn to_json(&self) -> Value {
        json!({
            "region": self.region,
            "healthy": self.healthy(),
            "leader": self.leader,
            "leader_lease_left_seconds": self.leader_lease_left,
            "source_revision": self.source_revision,
            "peers": self.peers.iter().map(|p| json!({
                "peer": p.peer,
                "present": p.present,
                "error": p.error,
                "lease_id": p.state.map(|s| s.lease.get()),
                "lease_left_seconds": p.lease_left,
                "lease_granted_seconds": p.lease_granted,
                "applied_revision": p.applied(),
                "source_revision": self.source_revision,
                "lag_revisions": p.applied().map(|r| (self.source_revision - r).max(0)),
                "staleness_seconds": p.staleness,
                "synced": p.synced(),
                "problems": self.row_problems(p),
            })).collect::<Vec<_>>(),
        })
    }
}

/// Judges one row: fills in its problems.
pub fn judge(row: &mut PeerRow, opts: &StatusOptions) {
    let mut problems = Vec::new();
    if let Some(e) = &row.error {
        problems.push(format!("peer {} unreachable: {e}", row.peer));
    } else if !row.present {
        problems.push(format!(
            "state key missing on {}: no live copy there",
            row.peer
        ));
    } else {
        if row.state.is_none() {
            problems.push("state key unreadable".into());
        }
        match (row.lease_left, row.lease_granted) {
            (Some(left), _) if left < 0 => problems.push("lease missing".into()),
            // etcd reports whole seconds: "below a third" with the same
            // rounding as the TTL it was granted with.
            (Some(left), Some(granted)) if granted > 0 && left * 3 < granted => problems.push(
                format!("lease {left}s left of {granted}s, below a third: keep-alives failing"),
            ),
            (None, _) => problems.push("lease missing".into()),
            _ => {}
        }
    }
    if let Some(s) = row.staleness
        && s > opts.max_staleness.as_secs_f64()
    {
        problems.push(format!(
            "stale {s:.0}s, over --max-staleness {}s",
            opts.max_staleness.as_secs()
        ));
    }
    row.problems = problems;
}

/// Reads the region's status. Fails only when the local etcd cannot be
/// read; an unreachable peer is a problem on its row.
pub async fn run(config: &Config, opts: &StatusOptions) -> Result<Report> {
    let local = Client::connect(config.local.clone())?;
    let election_key = format!("{DEFAULT_ELECTION_ROOT}{}/leader", config.region);
    let resp = bounded(opts, local.range(Range::prefix(election_key))).await??;
    // etcd's election layout: one key per candidate under the prefix, the
    // oldest leads. The prefix without a trailing '/' also finds the single
    // key of earlier builds.
    let held = resp
        .kvs()
        .iter()
        .min_by_key(|kv| kv.create_revision())
        .cloned();
    let leader_lease_left = match &held {
        // Whole seconds in the report, -1 for a lease that is gone.
        Some(kv) if !kv.lease().is_none() => Some(
            bounded(opts, local.lease_time_to_live(kv.lease(), false))
                .await??
                .ttl
                .map_or(-1, |d| d.as_secs() as i64),
        ),
        _ => None,
    };
    let state_key = config.mirror.state_key();
    let mut peers = Vec::new();
    for peer in &config.peers {
        let mut row = PeerRow {
            peer: peer.region.clone(),
            ..Default::default()
        };
        let probe = async {
            let client = Client::connect(peer.client.clone())?;
            let resp = client.range(Range::key(state_key.clone())).await?;
            let Some(kv) = resp.kvs().first().cloned() else {
                return Ok::<_, crate::Error>((false, None, None));
            };
            let ttl = match kv.lease() {
                id if id.is_none() => None,
                id => Some(client.lease_time_to_live(id, false).await?),
            };
            Ok((true, State::decode(kv.value()), ttl))
        };
        match bounded(opts, probe).await {
            Ok(Ok((present, state, ttl))) => {
                row.present = present;
                row.state = state;
                row.staleness = state
                    .and_then(|s| s.staleness_at(unix_ms()))
                    .map(|d| d.as_secs_f64());
                // Whole seconds in the report, -1 for a lease that is gone.
                row.lease_left = ttl
                    .as_ref()
                    .map(|t| t.ttl.map_or(-1, |d| d.as_secs() as i64));
                row.lease_granted = ttl.as_ref().map(|t| t.granted_ttl.as_secs() as i64);
            }
            Ok(Err(e)) => row.error = Some(e.to_string()),
            Err(e) => row.error = Some(e.to_string()),
        }
        judge(&mut row, opts);
        peers.push(row);
    }
    Ok(Report {
        region: config.region.clone(),
        leader: held.map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
        leader_lease_left,
        source_revision: resp.header.revision,
        peers,
    })
}

/// `fut` within the probe timeout.
async fn bounded<T>(opts: &StatusOptions, fut: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(opts.probe_timeout, fut)
        .await
        .map_err(|_| crate::etcd::Error::Timeout(opts.probe_timeout).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::LeaseId;

    fn row(present: bool, left: Option<i64>, granted: Option<i64>) -> PeerRow {
        PeerRow {
            peer: "b".into(),
            present,
            state: present.then_some(State {
                revision: 10,
                lease: LeaseId::new(7),
                holder: 1,
                source_cluster: 0,
                source_id: 0,
                heartbeat_unix_ms: 0,
                synced: true,
                lease_ttl: 0,
            }),
            lease_left: left,
            lease_granted: granted,
            ..Default::default()
        }
    }

    fn judged(mut r: PeerRow) -> Vec<String> {
        judge(&mut r, &StatusOptions::default());
        r.problems
    }

    #[test]
    fn judgement() {
        assert!(judged(row(true, Some(25), Some(30))).is_empty());
        assert!(judged(row(true, Some(10), Some(30))).is_empty());
        assert!(judged(row(true, Some(9), Some(30)))[0].contains("below a third"));
        assert_eq!(judged(row(true, Some(-1), Some(0))), ["lease missing"]);
        assert_eq!(judged(row(true, None, None)), ["lease missing"]);
        assert!(judged(row(false, None, None))[0].contains("state key missing"));
        let mut unreachable = row(false, None, None);
        unreachable.error = Some("timed out".into());
        assert!(judged(unreachable)[0].contains("unreachable"));
        let mut stale = row(true, Some(25), Some(30));
        stale.staleness = Some(61.0);
        assert!(judged(stale.clone())[0].contains("stale 61s"));
        stale.staleness = Some(59.0);
        assert!(judged(stale).is_empty());
    }

    #[test]
    fn no_leader_is_unhealthy_and_on_every_row() {
        let mut b = row(true, Some(25), Some(30));
        judge(&mut b, &StatusOptions::default());
        let mut r = Report {
            region: "a".into(),
            leader: Some("pod-1".into()),
            leader_lease_left: Some(3),
            source_revision: 15,
            peers: vec![b],
        };
        assert!(r.healthy());
        let table = r.render_table();
        assert!(table.lines().nth(1).unwrap().contains("pod-1"), "{table}");
        assert!(table.lines().nth(1).unwrap().ends_with("ok"), "{table}");
        assert_eq!(r.to_json()["peers"][0]["lag_revisions"], 5);
        r.leader = None;
        assert!(!r.healthy());
        assert!(r.render_table().contains("no leader in region a"));
        assert_eq!(r.to_json()["healthy"], false);
    }
}
