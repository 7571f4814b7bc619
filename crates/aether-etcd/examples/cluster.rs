//! The cluster's members, and what the answering member says of itself:
//! its version, the leader, the revision, the raft term and the database
//! size, as `etcdctl member list` and `endpoint status` show them.
//!
//! A new member joins safely as a learner, which receives the log but does
//! not vote: `member_add_as_learner`, start it, then `member_promote` once
//! it has caught up (`Error::LearnerNotReady` until then). Start the
//! learner before anything else: etcd 3.5.1 timed out removing one that
//! never started in 2 of 8 tries on a single-member cluster.
//!
//! ```sh
//! cargo run -p aether-etcd --example cluster -- http://127.0.0.1:2379
//! ```

use aether_etcd::{Client, ClientConfig};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or("http://127.0.0.1:2379".into());
    let client = Client::connect(ClientConfig::new([endpoint]))?;

    let list = client.member_list().await?;
    println!("{} member(s)", list.members.len());
    for m in &list.members {
        println!(
            "member {:x} {:?}: peers {:?}, clients {:?}, learner {}",
            m.id, m.name, m.peer_urls, m.client_urls, m.is_learner
        );
    }
    let status = client.status().await?;
    println!(
        "answered by {:x}: etcd {}, leader {:x}, revision {}, raft term {}, db {} bytes",
        status.member_id,
        status.version,
        status.leader,
        status.revision,
        status.raft_term,
        status.db_size
    );
    Ok(())
}
