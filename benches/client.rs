//! This client against a local etcd: serial put, 128-put txn, a paginated
//! range of 100k keys and watch catch-up, each beside the `etcd-client`
//! crate on the same server when built with `--features bench-etcd-client`
//! (which needs `protoc` for etcd-client's own build).

#[path = "../tests/common/mod.rs"]
mod common;

use aether_replicator::etcd::LeaseId;
use aether_replicator::etcd::{
    Client, ClientConfig, Put, Range, Txn, TxnBatcher, TxnLimits, WatchOptions,
};
use common::Etcd;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const RANGE_KEYS: usize = 100_000;
// Small enough that one catch-up response fits etcd-client's fixed 4 MiB
// decode limit (it has no setting for it; with 50k events it fails).
const WATCH_EVENTS: usize = 15_000;

fn key(i: usize) -> String {
    format!(
        "/bench/clusters/c1/services/svc-{:03}/protocols/http/endpoints/10.0.{}.{}",
        i % 500,
        i >> 8,
        i & 255
    )
}

/// The txn both clients send, built the same way on both sides: one put
/// per key with the plain builder (etcd-client has no [`TxnBatcher`]; what
/// the batcher adds is in `benches/batching.rs`).
fn txn_of_128_puts() -> Txn {
    Txn::new().and_then((0..128).map(|i| Put::new(key(i), vec![b'v'; 100])))
}

struct Setup {
    rt: tokio::runtime::Runtime,
    /// Owns the server for the whole run (killed on drop).
    #[cfg_attr(not(feature = "bench-etcd-client"), allow(dead_code))]
    etcd: Etcd,
    ours: Client,
    /// First and last revision of the watch history.
    history: (i64, i64),
}

/// Writes a 100-byte value of `fill` at each key, in batched txns; the
/// revision afterwards.
async fn put_batched(c: &Client, keys: impl Iterator<Item = String>, fill: u8) -> i64 {
    let mut b = TxnBatcher::new(TxnLimits::default());
    for k in keys {
        b.put(k, vec![fill; 100], LeaseId::NONE);
    }
    for t in b.finish() {
        c.txn(t).await.expect("txn");
    }
    c.range(Range::key("x")).await.expect("rev").header.revision
}

fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let _in = rt.enter();
    let etcd = Etcd::start();
    let ours = Client::connect(ClientConfig::new(etcd.endpoints())).expect("client");
    let history = rt.block_on(async {
        let first = put_batched(&ours, (0..RANGE_KEYS).map(key), b'v').await + 1;
        let last = put_batched(
            &ours,
            (0..WATCH_EVENTS).map(|i| format!("/watch/{i}")),
            b'w',
        )
        .await;
        (first, last)
    });
    Setup {
        rt,
        etcd,
        ours,
        history,
    }
}

fn bench(c: &mut Criterion) {
    let s = setup();
    let rt = &s.rt;
    let _in = rt.enter();
    #[cfg(feature = "bench-etcd-client")]
    let theirs = rt
        .block_on(etcd_client::Client::connect(s.etcd.endpoints(), None))
        .expect("etcd-client");

    let mut g = c.benchmark_group("serial_put");
    g.throughput(Throughput::Elements(1));
    g.bench_function("aether", |b| {
        b.to_async(rt)
            .iter(|| async { s.ours.put(Put::new("/serial", "value")).await.expect("put") })
    });
    #[cfg(feature = "bench-etcd-client")]
    g.bench_function("etcd-client", |b| {
        b.to_async(rt).iter(|| {
            let mut c = theirs.clone();
            async move { c.put("/serial", "value", None).await.expect("put") }
        })
    });
    g.finish();

    let mut g = c.benchmark_group("txn_128_puts");
    g.throughput(Throughput::Elements(128));
    g.bench_function("aether", |b| {
        b.to_async(rt)
            .iter(|| async { s.ours.txn(txn_of_128_puts()).await.expect("txn") })
    });
    #[cfg(feature = "bench-etcd-client")]
    g.bench_function("etcd-client", |b| {
        use etcd_client::{Txn, TxnOp};
        b.to_async(rt).iter(|| {
            let mut c = theirs.clone();
            async move {
                let ops: Vec<TxnOp> = (0..128)
                    .map(|i| TxnOp::put(key(i), vec![b'v'; 100], None))
                    .collect();
                c.txn(Txn::new().and_then(ops)).await.expect("txn")
            }
        })
    });
    g.finish();

    // The same txn, timed in this process's CPU time rather than wall
    // time: what the client itself spends per txn (building, encoding,
    // decoding, its tasks and syscalls), which a shared machine does not
    // blur the way it blurs a round trip. etcd's own work is not counted.
    let mut g = c.benchmark_group("txn_128_puts_client_cpu");
    g.throughput(Throughput::Elements(128));
    g.bench_function("aether", |b| {
        b.iter_custom(|iters| {
            let cpu = cpu_time();
            rt.block_on(async {
                for _ in 0..iters {
                    s.ours.txn(txn_of_128_puts()).await.expect("txn");
                }
            });
            cpu_time() - cpu
        })
    });
    #[cfg(feature = "bench-etcd-client")]
    g.bench_function("etcd-client", |b| {
        use etcd_client::{Txn, TxnOp};
        b.iter_custom(|iters| {
            let mut c = theirs.clone();
            let cpu = cpu_time();
            rt.block_on(async {
                for _ in 0..iters {
                    let ops: Vec<TxnOp> = (0..128)
                        .map(|i| TxnOp::put(key(i), vec![b'v'; 100], None))
                        .collect();
                    c.txn(Txn::new().and_then(ops)).await.expect("txn");
                }
            });
            cpu_time() - cpu
        })
    });
    g.finish();

    let mut g = c.benchmark_group("range_100k_pages_of_1000");
    g.sample_size(10)
        .throughput(Throughput::Elements(RANGE_KEYS as u64));
    g.bench_function("aether", |b| {
        b.to_async(rt).iter(|| async {
            let mut scan = s.ours.scan_prefix("/bench/", 1000, 0);
            let mut n = 0;
            while let Some(p) = scan.next_page().await.expect("page") {
                n += p.kvs.len();
            }
            assert_eq!(n, RANGE_KEYS);
        })
    });
    #[cfg(feature = "bench-etcd-client")]
    g.bench_function("etcd-client", |b| {
        use etcd_client::GetOptions;
        b.to_async(rt).iter(|| {
            let mut c = theirs.clone();
            async move {
                let mut from = b"/bench/".to_vec();
                let end = b"/bench0".to_vec();
                let mut rev = 0;
                let mut n = 0;
                loop {
                    let opts = GetOptions::new()
                        .with_range(end.clone())
                        .with_limit(1000)
                        .with_revision(rev);
                    let r = c.get(from.clone(), Some(opts)).await.expect("get");
                    rev = r.header().expect("header").revision();
                    n += r.kvs().len();
                    if !r.more() {
                        break;
                    }
                    from = r.kvs().last().expect("kv").key().to_vec();
                    from.push(0);
                }
                assert_eq!(n, RANGE_KEYS);
            }
        })
    });
    g.finish();

    let (first, last) = s.history;
    let mut g = c.benchmark_group("watch_catch_up_events");
    g.sample_size(10)
        .throughput(Throughput::Elements(WATCH_EVENTS as u64));
    g.bench_function("aether", |b| {
        b.to_async(rt).iter(|| async {
            let (_stream, mut w) = s
                .ours
                .watch(WatchOptions::prefix("/watch/").start_revision(first))
                .expect("watch");
            let mut n = 0;
            while n < WATCH_EVENTS {
                n += w
                    .message()
                    .await
                    .expect("watch")
                    .expect("open")
                    .events
                    .len();
            }
        })
    });
    #[cfg(feature = "bench-etcd-client")]
    g.bench_function("etcd-client", |b| {
        use etcd_client::WatchOptions;
        b.to_async(rt).iter(|| {
            let mut c = theirs.clone();
            async move {
                let opts = WatchOptions::new().with_prefix().with_start_revision(first);
                let mut stream = c.watch("/watch/", Some(opts)).await.expect("watch");
                let mut n = 0;
                while n < WATCH_EVENTS {
                    n += stream
                        .message()
                        .await
                        .expect("msg")
                        .expect("open")
                        .events()
                        .len();
                }
            }
        })
    });
    g.finish();
    let _ = last;
}

/// CPU time used so far by this whole process (every thread).
fn cpu_time() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

criterion_group!(benches, bench);
criterion_main!(benches);
