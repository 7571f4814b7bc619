//! This client against a local etcd: serial put, 128-put txn (wall time and
//! client CPU), a windowed scan of 100k keys and watch catch-up, each
//! beside the `etcd-client` crate on the same server doing the same work
//! when built with `--features bench-etcd-client` (which needs `protoc`
//! for etcd-client's own build).

#[path = "../tests/common/mod.rs"]
mod common;

use aether_replicator::etcd::LeaseId;
use aether_replicator::etcd::{
    Client, ClientConfig, Put, Range, Txn, TxnBatcher, TxnLimits, WatchOptions,
};
#[cfg(feature = "bench-etcd-client")]
use aether_replicator::etcd::{Scan, extrapolate_scan_window, prefix_end};
use common::Etcd;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const RANGE_KEYS: usize = 100_000;
// Small enough that one catch-up response fits etcd-client's fixed 4 MiB
// decode limit (it has no setting for it; with 50k events it fails).
const WATCH_EVENTS: usize = 15_000;
/// The range row's page size, on both sides.
const PAGE: usize = 1000;

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

    // The same scan on both sides: 100k keys and their values at one
    // revision, pages of at most 1000 keys, each request bounded to a
    // window of the key space. etcd 3.4 walks its index over the whole
    // rest of a request's range, whatever its limit, so a plain paging loop
    // (`[last + 1, prefix end)`, limit 1000) spends its time in that walk
    // and times the server, not the client. This crate's scan bounds each
    // request to a window extrapolated from the keys seen; the etcd-client
    // side pages as an expert user of its API who knows that would: the
    // same windows, computed the same way from its own answers
    // (`ScanWindows` below, with `GetOptions::with_range`, `with_limit`
    // and `with_revision` on a plain `get`). `check_same_scan` makes sure,
    // before the timing, that both read the same keys, values and
    // revisions with the same number of requests; each timed iteration
    // checks the key count and, for etcd-client, the request count.
    #[cfg(feature = "bench-etcd-client")]
    let scan_requests = rt.block_on(check_same_scan(&s.ours, &theirs));
    #[cfg(feature = "bench-etcd-client")]
    println!("REPORT range keys={RANGE_KEYS} page={PAGE} requests_each_side={scan_requests}");
    let mut g = c.benchmark_group("range_100k_pages_of_1000");
    g.sample_size(10)
        .throughput(Throughput::Elements(RANGE_KEYS as u64));
    g.bench_function("aether", |b| {
        b.to_async(rt).iter(|| async {
            let mut scan = s.ours.scan_prefix("/bench/", PAGE, 0);
            let mut n = 0;
            while let Some(p) = scan.next_page().await.expect("page") {
                n += p.kvs.len();
            }
            assert_eq!(n, RANGE_KEYS);
        })
    });
    #[cfg(feature = "bench-etcd-client")]
    g.bench_function("etcd-client", |b| {
        b.to_async(rt).iter(|| {
            let mut c = theirs.clone();
            async move {
                let (n, requests) = their_scan(&mut c, |_| ()).await;
                assert_eq!((n, requests), (RANGE_KEYS, scan_requests));
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

/// The range row's etcd-client side: `/bench/` in pages of [`PAGE`], each
/// request bounded to the window [`ScanWindows`] plans, at the revision of
/// the first answer. Hands every page's key-values to `page`; returns the
/// keys read and the requests made.
#[cfg(feature = "bench-etcd-client")]
async fn their_scan(
    c: &mut etcd_client::Client,
    mut page: impl FnMut(&[etcd_client::KeyValue]),
) -> (usize, usize) {
    use etcd_client::GetOptions;
    let mut windows = ScanWindows::new(b"/bench/".to_vec(), b"/bench0".to_vec());
    let (mut rev, mut n, mut requests) = (0, 0, 0);
    while let Some((from, window_end)) = windows.next_request() {
        let opts = GetOptions::new()
            .with_range(window_end)
            .with_limit(PAGE as i64)
            .with_revision(rev);
        let r = c.get(from, Some(opts)).await.expect("get");
        requests += 1;
        if rev == 0 {
            rev = r.header().expect("header").revision();
        }
        let kvs = r.kvs();
        n += kvs.len();
        page(kvs);
        let (first, last) = match (kvs.first(), kvs.last()) {
            (Some(f), Some(l)) => (Some(f.key()), Some(l.key())),
            _ => (None, None),
        };
        windows.answered(kvs.len(), r.more(), first, last);
    }
    (n, requests)
}

/// Before the range row is timed: both sides read the same keys, values
/// and mod revisions, at one revision each, with the same number of
/// requests (this crate's counted through [`Scan::with_range`], which
/// plans its windows as `Client::scan` does). Returns that number.
#[cfg(feature = "bench-etcd-client")]
async fn check_same_scan(ours: &Client, theirs: &etcd_client::Client) -> usize {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let count = Arc::new(AtomicUsize::new(0));
    let (client, counter) = (ours.clone(), count.clone());
    let mut scan = Scan::with_range(
        move |r| {
            counter.fetch_add(1, Ordering::Relaxed);
            let client = client.clone();
            async move { client.range(r).await }
        },
        "/bench/",
        prefix_end(b"/bench/"),
        PAGE,
        0,
    );
    let mut mine = Vec::new();
    while let Some(p) = scan.next_page().await.expect("page") {
        assert!(p.kvs.len() <= PAGE);
        mine.extend(
            p.kvs
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision())),
        );
    }
    let mut theirs_kvs = Vec::new();
    let (_, requests) = their_scan(&mut theirs.clone(), |kvs| {
        assert!(kvs.len() <= PAGE);
        theirs_kvs.extend(
            kvs.iter()
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision())),
        );
    })
    .await;
    assert_eq!(mine.len(), RANGE_KEYS);
    assert!(mine == theirs_kvs, "the two scans read different data");
    assert_eq!(
        count.load(Ordering::Relaxed),
        requests,
        "request counts differ"
    );
    requests
}

/// The windows of this crate's scan (`crates/aether-etcd/src/kv/scan.rs`)
/// for a scan without a byte budget in play or a ramp, written over
/// plain byte vectors for a client that has no windowed scan: each
/// request is bounded to a window extrapolated from the last page's first
/// and last key, widened when a window comes back short, faster after
/// empty ones.
#[cfg(feature = "bench-etcd-client")]
struct ScanWindows {
    next: Option<Vec<u8>>,
    end: Vec<u8>,
    /// The last request's `(from, window end)`.
    asked: (Vec<u8>, Vec<u8>),
    hint: Option<(Vec<u8>, Vec<u8>, f64)>,
    empty_windows: i32,
}

#[cfg(feature = "bench-etcd-client")]
impl ScanWindows {
    fn new(from: Vec<u8>, end: Vec<u8>) -> ScanWindows {
        ScanWindows {
            next: Some(from),
            end,
            asked: (Vec::new(), Vec::new()),
            hint: None,
            empty_windows: 0,
        }
    }

    /// The next request's `(from, window end)`; `None` when done.
    fn next_request(&mut self) -> Option<(Vec<u8>, Vec<u8>)> {
        let from = self.next.take()?;
        let window_end = match &self.hint {
            Some((a, b, f)) => match extrapolate_scan_window(a, b, *f) {
                Some(w) if *w > *from && *w < *self.end => w.to_vec(),
                _ => self.end.clone(),
            },
            None => self.end.clone(),
        };
        self.asked = (from.clone(), window_end.clone());
        Some((from, window_end))
    }

    /// Takes in the answer to the last request.
    fn answered(&mut self, n: usize, more: bool, first: Option<&[u8]>, last: Option<&[u8]>) {
        let (from, window_end) = std::mem::take(&mut self.asked);
        if more {
            let (Some(first), Some(last)) = (first, last) else {
                return;
            };
            let mut next = last.to_vec();
            next.push(0);
            self.next = Some(next);
            self.empty_windows = 0;
            let f = (PAGE as f64 / n as f64).max(1.0);
            self.hint = (n >= 2).then(|| (first.to_vec(), last.to_vec(), f));
        } else if window_end != self.end {
            let grow = (PAGE as f64 / n.max(1) as f64).clamp(1.0, 8.0);
            self.empty_windows = if n == 0 { self.empty_windows + 1 } else { 0 };
            let grow = grow * 256f64.powi((self.empty_windows - 1).clamp(0, 16));
            self.hint = Some((from, window_end.clone(), grow));
            self.next = Some(window_end);
        }
    }
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
