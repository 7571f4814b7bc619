//! A watch that resumes exactly where it stopped.
//!
//! Within one process the client resumes a watch by itself across
//! reconnects and member failovers, without losing or repeating an event.
//! Across a restart of your program, keep the revision of the last event you
//! handled and start the next watch one past it: etcd replays every change
//! since, as long as that revision has not been compacted away (then the
//! watch ends with [`Error::Compacted`](aether_etcd::Error::Compacted) and you
//! re-read the state with a range instead).
//!
//! ```sh
//! cargo run -p aether-etcd --example watch -- http://127.0.0.1:2379
//! ```

use aether_etcd::{Client, ClientConfig, Delete, Event, EventKind, Put, WatchOptions, Watcher};

const PREFIX: &str = "/examples/watch/";

#[tokio::main]
async fn main() -> aether_etcd::Result<()> {
    let endpoint = std::env::args()
        .nth(1)
        .unwrap_or("http://127.0.0.1:2379".into());
    let client = Client::connect(ClientConfig::new([endpoint]))?;
    client.delete(Delete::prefix(PREFIX)).await?;

    // Start from a known revision: a watch "from now" is created
    // asynchronously and could start after the first put.
    let first = client.put(Put::new(format!("{PREFIX}a"), "1")).await?;
    client.put(Put::new(format!("{PREFIX}b"), "2")).await?;

    let (_stream, mut watcher) =
        client.watch(WatchOptions::prefix(PREFIX).start_revision(first.header.revision))?;
    let mut last_handled = 0;
    for event in next_events(&mut watcher, 2).await? {
        println!("first run: {}", show(&event));
        last_handled = event.revision();
    }
    // The program "stops" here, and meanwhile others write.
    drop(watcher);
    client.put(Put::new(format!("{PREFIX}c"), "3")).await?;
    client.delete(Delete::key(format!("{PREFIX}a"))).await?;

    // The next run resumes one past the last event it handled.
    let (_stream, mut watcher) =
        client.watch(WatchOptions::prefix(PREFIX).start_revision(last_handled + 1))?;
    for event in next_events(&mut watcher, 2).await? {
        println!("resumed: {}", show(&event));
    }

    client.delete(Delete::prefix(PREFIX)).await?;
    Ok(())
}

/// The next `n` events. A response carries one revision's events (or none,
/// as a progress notice), so responses are flattened.
async fn next_events(watcher: &mut Watcher, n: usize) -> aether_etcd::Result<Vec<Event>> {
    let mut events = Vec::new();
    while events.len() < n {
        match watcher.message().await? {
            Some(resp) => events.extend(resp.events),
            None => break, // the watch was cancelled; a real program re-creates it
        }
    }
    Ok(events)
}

fn show(event: &Event) -> String {
    let kind = match event.kind {
        EventKind::Put => "PUT",
        EventKind::Delete => "DELETE",
    };
    format!(
        "{kind} {}={} at revision {}",
        String::from_utf8_lossy(event.kv.key()),
        String::from_utf8_lossy(event.kv.value()),
        event.revision()
    )
}
