//! The maintenance service: member status.

use super::client::Client;
use super::error::Result;
use super::pb::{PbMaintenanceClient, PbStatusRequest};

/// A member's status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The server version, e.g. "3.4.23".
    pub version: String,
    /// The store revision.
    pub revision: i64,
    /// The member that answered.
    pub member_id: u64,
    /// The current leader's member id.
    pub leader: u64,
    /// The raft index.
    pub raft_index: u64,
    /// The raft term.
    pub raft_term: u64,
    /// Size of the backend database in bytes.
    pub db_size: i64,
}

impl Client {
    /// The status of the member this client is talking to.
    pub async fn status(&self) -> Result<Status> {
        let r = self
            .unary(PbStatusRequest {}, |svc, req| {
                let mut c = PbMaintenanceClient::new(svc);
                async move { c.status(req).await }
            })
            .await?;
        let header = r.header.unwrap_or_default();
        Ok(Status {
            version: r.version,
            revision: header.revision,
            member_id: header.member_id,
            leader: r.leader,
            raft_index: r.raft_index,
            raft_term: r.raft_term,
            db_size: r.db_size,
        })
    }
}
