//! A distributed lock, compatible with Go's `concurrency.Mutex`.
//!
//! Three workers, each with its own session, increment a counter stored in
//! etcd with a read-then-write. Without the lock they would lose updates;
//! with it, the counter ends at exactly workers × rounds.
//!
//! ```sh
//! cargo run -p aether-etcd --example lock -- http://127.0.0.1:2379
//! ```

use aether_etcd::concurrency::{Mutex, Session};
use aether_etcd::{Client, ClientConfig, Delete, Put, Range};

const LOCK: &str = "/examples/lock/counter-lock";
const COUNTER: &str = "/examples/lock/counter";
const WORKERS: usize = 3;
const ROUNDS: usize = 5;

#[tokio::main]
async fn main() -> aether_etcd::Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or("http://127.0.0.1:2379".into());
    let client = Client::connect(ClientConfig::new([endpoint]))?;
    client.put(Put::new(COUNTER, "0")).await?;

    let mut workers = Vec::new();
    for _ in 0..WORKERS {
        let client = client.clone();
        workers.push(tokio::spawn(async move {
            let session = Session::new(&client).await?;
            let mut lock = Mutex::new(&session, LOCK);
            for _ in 0..ROUNDS {
                lock.lock().await?;
                // The critical section: nobody else reads or writes here.
                let got = client.range(Range::key(COUNTER)).await?;
                let n: usize = String::from_utf8_lossy(got.kvs()[0].value())
                    .parse()
                    .unwrap_or(0);
                client.put(Put::new(COUNTER, (n + 1).to_string())).await?;
                lock.unlock().await?;
            }
            session.close().await
        }));
    }
    for worker in workers {
        worker.await.expect("a worker panicked")?;
    }

    let got = client.range(Range::key(COUNTER)).await?;
    println!(
        "counter = {} after {WORKERS} workers x {ROUNDS} rounds",
        String::from_utf8_lossy(got.kvs()[0].value())
    );
    client.delete(Delete::prefix("/examples/lock/")).await?;
    Ok(())
}
