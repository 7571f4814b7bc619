//! The cluster service: member listing.

use super::client::Client;
use super::error::Result;
use super::kv::Header;
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

/// The answer to [`Client::member_list`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberList {
    /// The cluster id.
    pub cluster_id: u64,
    /// The response header.
    pub header: Header,
    /// Every member, learners included.
    pub members: Vec<Member>,
}

impl Client {
    /// Lists the cluster's members. With
    /// [`ClientConfig::auto_sync_interval`](super::ClientConfig::auto_sync_interval)
    /// set, a task does this periodically and makes the client's endpoints
    /// the started voting members' client URLs.
    ///
    /// ```no_run
    /// # async fn demo(client: aether_replicator::etcd::Client)
    /// # -> aether_replicator::etcd::Result<()> {
    /// let list = client.member_list().await?;
    /// for m in &list.members {
    ///     println!("{:x} {} {:?}", m.id, m.name, m.client_urls);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn member_list(&self) -> Result<MemberList> {
        member_list(self.transport()).await
    }
}

/// [`Client::member_list`] on the transport, for the auto-sync task.
pub(crate) async fn member_list(t: &Transport) -> Result<MemberList> {
    let resp = t
        .unary(
            PbMemberListRequest {
                linearizable: false,
            },
            |svc, r| {
                let mut c = PbClusterClient::new(svc);
                async move { c.member_list(r).await }
            },
        )
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
