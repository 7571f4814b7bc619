//! A snapshot of the whole keyspace streamed to a file: the same file
//! `etcdctl snapshot save` writes, which `etcdctl snapshot restore` (3.4)
//! and `etcdutl snapshot restore` (3.5) restore. The stream is held to the
//! file's pace, so a slow disk does not buffer the database in memory.
//!
//! ```sh
//! cargo run -p aether-etcd --example snapshot -- http://127.0.0.1:2379 etcd.db
//! ```

use std::io::Write;

use aether_etcd::{Client, ClientConfig};
use futures_util::StreamExt;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let endpoint = args.next().unwrap_or("http://127.0.0.1:2379".into());
    let path = args.next().unwrap_or("etcd-snapshot.db".into());
    let client = Client::connect(ClientConfig::new([endpoint]))?;

    let mut file = std::fs::File::create(&path)?;
    let mut snapshot = client.snapshot().await?;
    let mut written = 0usize;
    while let Some(chunk) = snapshot.next().await {
        let chunk = chunk?;
        file.write_all(&chunk.blob)?;
        written += chunk.blob.len();
    }
    // On disk before it is called a backup.
    file.sync_all()?;
    println!(
        "wrote {written} bytes to {path}: {} database bytes and their checksum",
        snapshot.received()
    );
    Ok(())
}
