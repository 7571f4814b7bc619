//! Comparing a peer's copy with the source: the `check` command.
//!
//! Both sides are scanned in pages and merge-joined by the same code as the
//! sync (`mirror/diff.rs`), so a check of a large subtree holds a few
//! pages. The source is read at its latest revision; while it changes, a check can report differences
//! that the engine is about to apply, so callers poll until it comes back
//! clean. The tests' convergence oracle is not this: sharing the sync's
//! merge, a bug there would hide itself, so the tests read both sides
//! whole and compare them as maps (`tests/common/mirror.rs`), and test the
//! merge itself against such an oracle through [`join`] (`tests/merge.rs`).

use bytes::Bytes;

use super::config::MirrorConfig;
use super::diff::{Diff, Merge};
use super::state::{self, State};
use crate::error::Result;
use crate::etcd::{KeyValue, LeaseId};
use crate::store::Store;

/// Most keys listed per category in a [`Report`]; the counts are exact.
pub const MAX_LISTED: usize = 10;

/// How a peer's copy differs from the source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Keys in the source subtree.
    pub source_keys: u64,
    /// Keys under the prefix on the peer.
    pub peer_keys: u64,
    /// Keys at the source that the peer lacks.
    pub missing: u64,
    /// Keys on the peer that the source lacks.
    pub extra: u64,
    /// Keys whose value differs.
    pub value_differs: u64,
    /// Keys on the peer not attached to the state key's lease.
    pub wrong_lease: u64,
    /// The peer's state key, if readable.
    pub state: Option<State>,
    /// The lease's remaining TTL in seconds (-1: gone, None: no state).
    pub lease_ttl: Option<i64>,
    /// Up to [`MAX_LISTED`] example keys per category.
    pub examples: Vec<(&'static str, Bytes)>,
}

impl Report {
    /// Whether the copy matches: same keys, same values, all on a live
    /// lease named by the state key.
    pub fn matches(&self) -> bool {
        self.missing == 0
            && self.extra == 0
            && self.value_differs == 0
            && self.wrong_lease == 0
            && self.state.is_some()
            && self.lease_ttl.is_some_and(|t| t > 0)
    }

    fn note(&mut self, what: &'static str, key: &Bytes) {
        if self.examples.iter().filter(|(w, _)| *w == what).count() < MAX_LISTED {
            self.examples.push((what, key.clone()));
        }
    }
}

/// Compares this region's subtree at `local` with its copy on `peer`
/// (each an [`etcd::Client`](crate::etcd::Client) or a [`Store`]).
pub async fn compare(
    local: impl Into<Store>,
    peer: impl Into<Store>,
    cfg: &MirrorConfig,
) -> Result<Report> {
    let (local, peer) = (&local.into(), &peer.into());
    let prefix = Bytes::from(cfg.prefix());
    let mut report = Report::default();
    let (stored, _) = state::read(peer, &Bytes::from(cfg.state_key())).await?;
    report.state = stored.state;
    if let Some(st) = stored.state {
        // Whole seconds in the report, -1 for a lease that is gone.
        let ttl = peer.lease_time_to_live(st.lease, false).await?.ttl;
        report.lease_ttl = Some(ttl.map_or(-1, |d| d.as_secs() as i64));
    }
    let lease = stored.state.map_or(LeaseId::NONE, |s| s.lease);
    let mut merge = Merge::start(local, peer, prefix, cfg.page_size);
    while let Some(diff) = merge.next().await? {
        match diff {
            Diff::Missing(src) => {
                report.source_keys += 1;
                report.missing += 1;
                report.note("missing", src.key());
            }
            Diff::Extra(dst) => {
                report.peer_keys += 1;
                report.extra += 1;
                report.note("extra", dst.key());
            }
            Diff::Both(src, dst) => {
                report.source_keys += 1;
                report.peer_keys += 1;
                if src.value() != dst.value() {
                    report.value_differs += 1;
                    report.note("value differs", src.key());
                }
                if dst.lease() != lease || lease.is_none() {
                    report.wrong_lease += 1;
                    report.note("wrong lease", src.key());
                }
            }
        }
    }
    Ok(report)
}

/// The round trip from which [`join`] reads the peer by several scans at
/// once.
#[doc(hidden)]
pub const JOIN_LONG_LINK: std::time::Duration = super::diff::LONG_LINK;

/// The merge-join under [`compare`], the sync and the verification pass,
/// run to its end: each key of `prefix` in order, as (source, peer), one
/// of them `None` where that side lacks it. `page_size` and `rtt` are the
/// join's (a round trip from [`JOIN_LONG_LINK`] on reads the peer by
/// several scans at once, over intervals a second scan of the source marks
/// out). For the tests' property test of the join against a plain-map
/// oracle; not part of the API.
#[doc(hidden)]
pub async fn join(
    local: impl Into<Store>,
    peer: impl Into<Store>,
    prefix: Bytes,
    page_size: usize,
    rtt: Option<std::time::Duration>,
) -> Result<Vec<(Option<KeyValue>, Option<KeyValue>)>> {
    let (local, peer) = (&local.into(), &peer.into());
    let mut merge = Merge::start_over(local, peer, prefix, page_size, 0, rtt, None);
    let mut out = Vec::new();
    while let Some(diff) = merge.next().await? {
        out.push(match diff {
            Diff::Missing(s) => (Some(s), None),
            Diff::Extra(d) => (None, Some(d)),
            Diff::Both(s, d) => (Some(s), Some(d)),
        });
    }
    Ok(out)
}
