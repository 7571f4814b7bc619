//! CPU cost of turning watch events into mirror txns, without I/O:
//! events in, sealed batches out, in ns per event.

use aether_replicator::etcd::LeaseId;
use std::hint::black_box;
use tokio::time::Instant;

use aether_replicator::etcd::{Event, EventKind, Put, Txn, TxnBatcher, TxnLimits};
use aether_replicator::mirror::batch::Batcher;
use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

const EVENTS: usize = 10_000;

fn key(i: usize) -> Bytes {
    Bytes::from(format!(
        "/aether/v1/regions/a/clusters/c1/services/svc-{:03}/protocols/http/endpoints/10.{}.{}.{}",
        i % 500,
        (i >> 16) & 255,
        (i >> 8) & 255,
        i & 255
    ))
}

/// `EVENTS` events: `per_rev` events per source revision, over `distinct`
/// keys (fewer keys than events means repeated writes to hot keys).
fn events(per_rev: usize, distinct: usize) -> Vec<Event> {
    let value = Bytes::from(vec![b'v'; 100]);
    let keys: Vec<Bytes> = (0..distinct).map(key).collect();
    (0..EVENTS)
        .map(|i| {
            let kind = if i % 10 == 9 {
                EventKind::Delete
            } else {
                EventKind::Put
            };
            Event::synthetic(
                kind,
                keys[i % distinct].clone(),
                value.clone(),
                1 + (i / per_rev) as i64,
            )
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("batcher");
    g.throughput(Throughput::Elements(EVENTS as u64));
    let cases = [
        ("single-put revisions, distinct keys", 1, EVENTS),
        ("single-put revisions, 100 hot keys (dedup)", 1, 100),
        ("300-op revisions (split)", 300, EVENTS),
        ("20-op txns, distinct keys", 20, EVENTS),
    ];
    for (name, per_rev, distinct) in cases {
        let input = events(per_rev, distinct);
        g.bench_with_input(BenchmarkId::from_parameter(name), &input, |b, input| {
            b.iter_batched(
                || input.clone(),
                |evs| {
                    let mut batcher = Batcher::new(TxnLimits::default(), LeaseId::new(7));
                    let now = Instant::now();
                    // Watch responses carry up to ~100 events each.
                    let mut it = evs.into_iter().peekable();
                    let mut batches = 0;
                    while it.peek().is_some() {
                        batcher.push(it.by_ref().take(100), now);
                        while let Some(b) = batcher.pop() {
                            batches += black_box(b).len();
                        }
                    }
                    batcher.flush();
                    while let Some(b) = batcher.pop() {
                        batches += black_box(b).len();
                    }
                    batches
                },
                criterion::BatchSize::LargeInput,
            )
        });
    }
    g.finish();

    // What packing costs on the client side: 128 puts built into a txn
    // through `TxnBatcher` (de-duplication and byte accounting) against the
    // plain builder, both from fresh keys and values (BENCHMARKS §5).
    let mut g = c.benchmark_group("txn_of_128_puts");
    g.throughput(Throughput::Elements(128));
    let key = |i: usize| {
        format!(
            "/aether/v1/regions/a/clusters/c1/services/svc-{:03}/protocols/http/endpoints/10.0.{}.{}",
            i % 500,
            i >> 8,
            i & 255
        )
    };
    g.bench_function("TxnBatcher", |b| {
        b.iter(|| {
            let mut batch = TxnBatcher::new(TxnLimits::default());
            for i in 0..128 {
                batch.put(key(i), vec![b'v'; 100], LeaseId::NONE);
            }
            black_box(batch.finish())
        })
    });
    g.bench_function("Txn::and_then", |b| {
        b.iter(|| {
            black_box(Txn::new().and_then((0..128).map(|i| Put::new(key(i), vec![b'v'; 100]))))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
