//! The cluster service: listing members and changing the membership (add
//! a voter or a learner, remove, update peer URLs, promote a learner).
//!
//! Every change answers with the membership after it, as etcd sends it. A
//! change etcd refuses is one of the membership variants of
//! [`Error`](super::Error): [`LearnerNotReady`](super::Error::LearnerNotReady),
//! [`MemberNotFound`](super::Error::MemberNotFound),
//! [`TooManyLearners`](super::Error::TooManyLearners),
//! [`UnhealthyCluster`](super::Error::UnhealthyCluster) and the others next
//! to them.
//!
//! etcd drops a membership change proposed too soon after the previous
//! one: [`Client::member_add`](super::Client::member_add) says what the
//! caller sees and does about it.

use super::error::{Error, Result};
use super::header::Header;
use super::pb::{
    PbClusterClient, PbMember, PbMemberAddRequest, PbMemberListRequest, PbMemberPromoteRequest,
    PbMemberRemoveRequest, PbMemberUpdateRequest, PbResponseHeader,
};
use super::transport::Transport;

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
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

impl From<PbMember> for Member {
    fn from(m: PbMember) -> Member {
        Member {
            id: m.id,
            name: m.name,
            peer_urls: m.peer_ur_ls,
            client_urls: m.client_ur_ls,
            is_learner: m.is_learner,
        }
    }
}

/// The membership as etcd sent it: the answer to
/// [`Client::member_list`](super::Client::member_list), and to
/// [`member_remove`](super::Client::member_remove),
/// [`member_update`](super::Client::member_update) and
/// [`member_promote`](super::Client::member_promote) (the membership
/// after the change).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberList {
    /// The cluster id.
    pub cluster_id: u64,
    /// The response header.
    pub header: Header,
    /// Every member, learners included.
    pub members: Vec<Member>,
}

impl MemberList {
    fn new(header: Option<PbResponseHeader>, members: Vec<PbMember>) -> MemberList {
        MemberList {
            cluster_id: header.as_ref().map_or(0, |h| h.cluster_id),
            header: header.into(),
            members: members.into_iter().map(Member::from).collect(),
        }
    }

    /// The member with id `id`, if it is in the list.
    pub fn get(&self, id: u64) -> Option<&Member> {
        self.members.iter().find(|m| m.id == id)
    }
}

/// The answer to [`Client::member_add`](super::Client::member_add) and
/// [`Client::member_add_as_learner`](super::Client::member_add_as_learner).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberAdded {
    /// The new member: its id, peer URLs and whether it is a learner. Its
    /// name and client URLs stay empty until it starts.
    pub member: Member,
    /// The membership after the add, the new member included.
    pub list: MemberList,
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
        Ok(MemberList::new(resp.header, resp.members))
    }

    pub(crate) async fn member_add(
        &self,
        peer_urls: Vec<String>,
        is_learner: bool,
    ) -> Result<MemberAdded> {
        let req = PbMemberAddRequest {
            peer_ur_ls: peer_urls,
            is_learner,
        };
        let resp = self
            .transport
            .unary(req, |svc, r| async move {
                PbClusterClient::new(svc).member_add(r).await
            })
            .await?;
        let list = MemberList::new(resp.header, resp.members);
        // etcd 3.4 and 3.5 always send the new member: without it the
        // caller could not tell which entry of the list is the new one.
        let member = resp.member.map(Member::from).ok_or_else(|| {
            Error::server(
                crate::error::Code::Internal,
                "etcd answered member add without the new member",
            )
        })?;
        Ok(MemberAdded { member, list })
    }

    pub(crate) async fn member_remove(&self, id: u64) -> Result<MemberList> {
        let resp = self
            .transport
            .unary(PbMemberRemoveRequest { id }, |svc, r| async move {
                PbClusterClient::new(svc).member_remove(r).await
            })
            .await?;
        Ok(MemberList::new(resp.header, resp.members))
    }

    pub(crate) async fn member_update(
        &self,
        id: u64,
        peer_urls: Vec<String>,
    ) -> Result<MemberList> {
        let req = PbMemberUpdateRequest {
            id,
            peer_ur_ls: peer_urls,
        };
        let resp = self
            .transport
            .unary(req, |svc, r| async move {
                PbClusterClient::new(svc).member_update(r).await
            })
            .await?;
        Ok(MemberList::new(resp.header, resp.members))
    }

    pub(crate) async fn member_promote(&self, id: u64) -> Result<MemberList> {
        let resp = self
            .transport
            .unary(PbMemberPromoteRequest { id }, |svc, r| async move {
                PbClusterClient::new(svc).member_promote(r).await
            })
            .await?;
        Ok(MemberList::new(resp.header, resp.members))
    }
}
