//! A lease kept alive, a key attached to it, and what ending it does.
//!
//! Every lease the client keeps alive shares one keep-alive stream, sent
//! every TTL/3. Dropping the [`LeaseHandle`](aether_etcd::LeaseHandle) stops
//! the keep-alive and never revokes: the lease, and every key attached to
//! it, runs out on its own one TTL later (or a restarted process adopts it
//! by id with `keep_alive`). Revoking deletes the keys at once.
//!
//! ```sh
//! cargo run -p aether-etcd --example lease -- http://127.0.0.1:2379
//! ```

use std::time::Duration;

use aether_etcd::{Client, ClientConfig, Put, Range};

const KEY: &str = "/examples/lease/alive";

#[tokio::main]
async fn main() -> aether_etcd::Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or("http://127.0.0.1:2379".into());
    let client = Client::connect(ClientConfig::new([endpoint]))?;

    // Id 0: the server picks one.
    let grant = client.lease_grant(Duration::from_secs(3)).await?;
    let mut handle = client.lease_keeper().keep_alive(&grant).await?;
    client.put(Put::new(KEY, "yes").lease(handle.id())).await?;
    println!(
        "granted lease {:x} for {} s and attached {KEY}",
        grant.id,
        grant.ttl.as_secs()
    );

    // Outlive the TTL twice over: the keep-alive holds the key.
    tokio::time::sleep(2 * grant.ttl).await;
    let status = handle.status();
    let alive = client.range(Range::key(KEY)).await?.count;
    println!(
        "after {} s: key present = {}, keep-alives answered = {}, lost = {}",
        (2 * grant.ttl).as_secs(),
        alive == 1,
        status.successes > 0,
        status.lost
    );

    // `lost()` resolves when the lease is gone, whoever ended it: here the
    // revoke; in production an outage longer than the TTL.
    client.lease_revoke(grant.id).await?;
    handle.lost().await;
    let alive = client.range(Range::key(KEY)).await?.count;
    println!("after revoke: lease lost, key present = {}", alive == 1);
    Ok(())
}
