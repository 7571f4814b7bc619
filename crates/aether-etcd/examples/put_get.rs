//! Put, get, a compare-and-swap txn, and a delete.
//!
//! ```sh
//! etcd --data-dir /tmp/e &                       # any etcd >= 3.4
//! cargo run -p aether-etcd --example put_get -- http://127.0.0.1:2379
//! ```

use aether_etcd::{Client, ClientConfig, Compare, CompareOp, Delete, Put, Range, Txn};

#[tokio::main]
async fn main() -> aether_etcd::Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or("http://127.0.0.1:2379".into());
    // Nothing connects until the first call.
    let client = Client::connect(ClientConfig::new([endpoint]))?;
    let key = "/examples/put_get/greeting";

    let put = client.put(Put::new(key, "hello")).await?;
    println!("put {key} at revision {}", put.header.revision);

    let got = client.range(Range::key(key)).await?;
    let kv = &got.kvs()[0];
    println!(
        "get {key} = {} (version {})",
        String::from_utf8_lossy(kv.value()),
        kv.version()
    );

    // Compare-and-swap: replace the value only if nobody wrote it since we
    // read it. The second attempt uses the now-stale revision and fails.
    for attempt in 1..=2 {
        let cas = Txn::new()
            .when([Compare::mod_revision(
                key,
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([Put::new(key, format!("hello #{attempt}"))]);
        let resp = client.txn(cas).await?;
        println!("cas attempt {attempt} succeeded: {}", resp.succeeded);
    }

    let deleted = client.delete(Delete::key(key)).await?;
    println!("deleted {} key(s)", deleted.deleted);
    Ok(())
}
