//! The header etcd puts on every response, whichever service answered: the
//! one type every service shares, so it sits below them all.

use super::pb::PbResponseHeader;

/// The header etcd puts on every response.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Header {
    /// The cluster that served it. A store restored from a snapshot, or
    /// wiped and restarted with the same name, peer URLs and token, keeps
    /// its cluster id: only its revision goes back.
    pub cluster_id: u64,
    /// The store revision when the request was served.
    pub revision: i64,
    /// The member that served it.
    pub member_id: u64,
    /// The raft term.
    pub raft_term: u64,
}

impl From<Option<PbResponseHeader>> for Header {
    fn from(h: Option<PbResponseHeader>) -> Self {
        let h = h.unwrap_or_default();
        Header {
            cluster_id: h.cluster_id,
            revision: h.revision,
            member_id: h.member_id,
            raft_term: h.raft_term,
        }
    }
}
