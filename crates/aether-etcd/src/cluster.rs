//! The cluster service: member listing.

use super::error::Result;
use super::header::Header;
use super::pb::{PbClusterClient, PbMemberListRequest};
use super::transport::Transport;

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The member id.
    pub id: u64,
    /// Its name; empty while the member has not started.
    pub name: String,
    /// The URLs it uses to talk to its peers.
    pub peer_urls: Vec<String>,
    /// The URLs it serves clients on; empty while it has not started.
    pub client_urls: Vec<String>,
    /// Whether it is a raft learner (not voting, and refusing most client
    /// requests).
    pub is_learner: bool,
}

/// The answer to [`Client::member_list`](super::Client::member_list).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberList {
    /// The cluster id.
    pub cluster_id: u64,
    /// The response header.
    pub header: Header,
    /// Every member, learners included.
    pub members: Vec<Member>,
}

/// The cluster service on a transport.
#[derive(Clone)]
pub(crate) struct ClusterClient {
    transport: Transport,
}

impl ClusterClient {
    pub(crate) fn new(transport: Transport) -> ClusterClient {
        ClusterClient { transport }
    }

    pub(crate) async fn member_list(&self) -> Result<MemberList> {
        let req = PbMemberListRequest {
            linearizable: false,
        };
        let resp = self
            .transport
            .unary(req, |svc, r| async move {
                PbClusterClient::new(svc).member_list(r).await
            })
            .await?;
        let cluster_id = resp.header.as_ref().map_or(0, |h| h.cluster_id);
        Ok(MemberList {
            cluster_id,
            header: resp.header.into(),
            members: resp
                .members
                .into_iter()
                .map(|m| Member {
                    id: m.id,
                    name: m.name,
                    peer_urls: m.peer_ur_ls,
                    client_urls: m.client_ur_ls,
                    is_learner: m.is_learner,
                })
                .collect(),
        })
    }
}
