//! Endpoint auto-sync: keep the client's endpoints equal to the cluster's
//! member client URLs, like Go's `AutoSyncInterval`.
//!
//! It sits on the cluster service and sets the transport's endpoints, so
//! the transport never depends on a service. The task holds the transport
//! (connections, config), never a `Client`, so it cannot keep alive the
//! handle whose drop stops it: the client keeps the task's drop guard, and
//! the last clone going cancels it.

use std::time::Duration;

use tokio_util::sync::{CancellationToken, DropGuard};

use super::cluster::{ClusterClient, MemberList};
use super::task::spawn_until_dropped;
use super::transport::Transport;

/// Starts the task; it stops when the guard is dropped.
pub(crate) fn spawn(transport: Transport, every: Duration) -> DropGuard {
    spawn_until_dropped(|cancel| run(transport, every, cancel))
}

async fn run(t: Transport, every: Duration, cancel: CancellationToken) {
    let cluster = ClusterClient::new(t.clone());
    loop {
        // First sync after one interval, as Go's client does: the
        // configured endpoints are the caller's choice until then.
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let list = tokio::select! {
            _ = cancel.cancelled() => return,
            r = cluster.member_list() => r,
        };
        match list {
            Ok(list) => {
                let urls = client_urls(&list);
                // A cluster that lists no started voter has nothing better
                // to offer than what the client has.
                if urls.is_empty() {
                    continue;
                }
                if let Err(e) = t.set_endpoints(urls) {
                    tracing::warn!(error = %e, "endpoint auto-sync: the member list has unusable URLs");
                }
            }
            Err(e) => tracing::debug!(error = %e, "endpoint auto-sync: member list failed"),
        }
    }
}

/// The client URLs of every started voting member, in member order, once
/// each. Learners refuse most requests, so they are left out.
fn client_urls(list: &MemberList) -> Vec<String> {
    let mut urls: Vec<String> = Vec::new();
    for m in list.members.iter().filter(|m| !m.is_learner) {
        for u in &m.client_urls {
            if !urls.contains(u) {
                urls.push(u.clone());
            }
        }
    }
    urls
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Header, Member};

    #[test]
    fn client_urls_skip_learners_and_duplicates() {
        let m = |id, urls: &[&str], is_learner| Member {
            id,
            name: format!("m{id}"),
            peer_urls: Vec::new(),
            client_urls: urls.iter().map(|u| u.to_string()).collect(),
            is_learner,
        };
        let list = MemberList {
            cluster_id: 1,
            header: Header::default(),
            members: vec![
                m(1, &["http://a:2379", "http://a2:2379"], false),
                m(2, &["http://b:2379"], true),
                m(3, &[], false),
                m(4, &["http://a:2379", "http://c:2379"], false),
            ],
        };
        assert_eq!(
            client_urls(&list),
            ["http://a:2379", "http://a2:2379", "http://c:2379"]
        );
    }
}
