//! A namespace: a view of the client in which every key is under a prefix,
//! as Go's `namespace` package does. Tenants, tests and environments can
//! share one cluster without seeing each other's keys.
//!
//! ```sh
//! cargo run -p aether-etcd --example namespace -- http://127.0.0.1:2379
//! ```

use aether_etcd::{Client, ClientConfig, Delete, Put, Range};

#[tokio::main]
async fn main() -> aether_etcd::Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or("http://127.0.0.1:2379".into());
    let client = Client::connect(ClientConfig::new([endpoint]))?;

    let tenant_a = client.with_namespace("/examples/namespace/tenant-a/");
    let tenant_b = client.with_namespace("/examples/namespace/tenant-b/");
    tenant_a.put(Put::new("config", "a's")).await?;
    tenant_b.put(Put::new("config", "b's")).await?;

    // Each tenant sees its own key under the same name...
    for (name, ns) in [("a", &tenant_a), ("b", &tenant_b)] {
        let got = ns.range(Range::key("config")).await?;
        println!(
            "tenant {name} reads config = {}",
            String::from_utf8_lossy(got.kvs()[0].value())
        );
    }
    // ...and the plain client sees where they really live.
    let raw = client
        .range(Range::prefix("/examples/namespace/").keys_only())
        .await?;
    for kv in raw.kvs() {
        println!("stored as {}", String::from_utf8_lossy(kv.key()));
    }

    client
        .delete(Delete::prefix("/examples/namespace/"))
        .await?;
    Ok(())
}
