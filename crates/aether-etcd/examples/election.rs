//! Leader election among candidates, compatible with Go's
//! `go.etcd.io/etcd/client/v3/concurrency` (a Go program and this one can
//! campaign in one election).
//!
//! Two candidates, each with its own session (lease). The first leads; the
//! second's campaign waits until the first resigns. A leader that dies
//! without resigning is replaced once its session's lease runs out.
//!
//! ```sh
//! cargo run -p aether-etcd --example election -- http://127.0.0.1:2379
//! ```

use std::time::Duration;

use aether_etcd::concurrency::{Election, Session, SessionOptions};
use aether_etcd::{Client, ClientConfig};

const ELECTION: &str = "/examples/election/leader";

#[tokio::main]
async fn main() -> aether_etcd::Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or("http://127.0.0.1:2379".into());
    let client = Client::connect(ClientConfig::new([endpoint]))?;
    // A short TTL: if this process dies, the others take over within 5 s.
    let opts = SessionOptions::default().with_ttl(Duration::from_secs(5));

    let first = Session::with_options(&client, opts.clone()).await?;
    let mut one = Election::new(&first, ELECTION);
    one.campaign("candidate-1").await?;
    print_leader(&one).await?;

    // The second campaigns in the background; it cannot win yet.
    let second = Session::with_options(&client, opts).await?;
    let mut two = Election::new(&second, ELECTION);
    let campaign = tokio::spawn(async move { two.campaign("candidate-2").await.map(|()| two) });

    one.resign().await?;
    let two = campaign.await.expect("the campaign task panicked")?;
    print_leader(&two).await?;

    // Closing a session revokes its lease, and with it any candidacy.
    first.close().await?;
    second.close().await?;
    Ok(())
}

async fn print_leader(election: &Election) -> aether_etcd::Result<()> {
    if let Some(kv) = election.leader().await? {
        println!("leader: {}", String::from_utf8_lossy(kv.value()));
    }
    Ok(())
}
