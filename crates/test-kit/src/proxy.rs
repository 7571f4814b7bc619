//! Loopback TCP proxy for fault injection.
//!
//! ```ignore
//! let proxy = FaultProxy::start(etcd.client_addr()).await;
//! // point the client under test at proxy.endpoint()
//! proxy.cut();                      // drop live connections, black-hole new ones
//! proxy.heal();                     // back to normal
//! proxy.set_latency(Duration::from_millis(200));
//! proxy.set_bandwidth(Some(64 * 1024));
//! ```
//!
//! All work happens in tasks spawned on the runtime that called
//! [`FaultProxy::start`] (multi-thread or current-thread). On a current-thread
//! runtime, don't block the thread (e.g. with a synchronous `etcdctl` call
//! through the proxy): use `tokio::task::spawn_blocking` for that.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::round_trips::{RoundTrips, Tap};

const CHUNK: usize = 16 * 1024;
/// Chunks buffered per direction between reader and (delayed) writer. The
/// delay line holds what is "on the wire", so it must cover the
/// bandwidth-delay product of the fastest link a test models: at 64 chunks
/// a 125 ms one-way delay capped every connection at 64 × 16 KiB / 125 ms
/// = 8 MiB/s whatever its bandwidth setting; 1024 allows 128 MiB/s.
const PIPE_DEPTH: usize = 1024;

#[derive(Clone, Copy, Debug, Default)]
struct LinkState {
    cut: bool,
    /// Incremented by every `cut()`: live connections opened before it die.
    cuts: u64,
    /// Incremented by every `heal()`: black-holed connections are closed.
    heals: u64,
}

#[derive(Debug)]
struct Shared {
    state: watch::Sender<LinkState>,
    latency_us: AtomicU64,
    /// Bytes per second per direction per connection; 0 = unlimited.
    bandwidth: AtomicU64,
    accepted: AtomicU64,
    active: AtomicU64,
    /// Bytes forwarded from the upstream to clients.
    to_client: AtomicU64,
    /// Round-trip accounting for the connections accepted from now on.
    trips: Mutex<Option<Arc<RoundTrips>>>,
}

impl Shared {
    fn latency(&self) -> Duration {
        Duration::from_micros(self.latency_us.load(Ordering::Relaxed))
    }

    fn bandwidth(&self) -> Option<u64> {
        match self.bandwidth.load(Ordering::Relaxed) {
            0 => None,
            b => Some(b),
        }
    }
}

/// A TCP proxy on 127.0.0.1 in front of a loopback upstream. Stops all its
/// tasks (and closes every connection) when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

impl FaultProxy {
    /// Binds 127.0.0.1:0 and starts forwarding to `upstream`, which must be a
    /// loopback address.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy on 127.0.0.1:0");
        FaultProxy::with_listener(listener, upstream)
    }

    /// Like [`FaultProxy::start`] on a listener bound beforehand, so the
    /// proxy's address can be handed to the upstream (say, as etcd's
    /// advertised client URL) before the upstream exists.
    pub fn with_listener(listener: TcpListener, upstream: SocketAddr) -> FaultProxy {
        assert!(
            upstream.ip().is_loopback(),
            "FaultProxy only proxies to loopback upstreams, got {upstream}"
        );
        let addr = listener.local_addr().expect("proxy local_addr");
        let (state, _) = watch::channel(LinkState::default());
        let shared = Arc::new(Shared {
            state,
            latency_us: AtomicU64::new(0),
            bandwidth: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            active: AtomicU64::new(0),
            to_client: AtomicU64::new(0),
            trips: Mutex::new(None),
        });
        let cancel = CancellationToken::new();
        tokio::spawn(accept_loop(
            listener,
            upstream,
            shared.clone(),
            cancel.clone(),
        ));
        FaultProxy {
            addr,
            upstream,
            shared,
            cancel,
        }
    }

    /// The address it listens on (127.0.0.1, a free port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address it forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `https://127.0.0.1:<port>` (TLS passes through the proxy untouched).
    pub fn tls_endpoint(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Closes every live connection now and black-holes new ones: they are
    /// accepted but nothing is read or forwarded, and they stay open until
    /// [`FaultProxy::heal`] (which then closes them). Nothing the upstream
    /// sends after `cut` returns reaches a client, and nothing still on
    /// the delay line does either.
    pub fn cut(&self) {
        self.shared.state.send_modify(|s| {
            s.cut = true;
            s.cuts += 1;
        });
    }

    /// Ends a [`FaultProxy::cut`]: black-holed connections are closed, new
    /// connections are forwarded again.
    pub fn heal(&self) {
        self.shared.state.send_modify(|s| {
            s.cut = false;
            s.heals += 1;
        });
    }

    /// Whether it is cut ([`FaultProxy::cut`], not yet healed).
    pub fn is_cut(&self) -> bool {
        self.shared.state.borrow().cut
    }

    /// One-way delay added to every chunk in each direction (so a round trip
    /// gains 2x `latency`). Applies to live connections too. Zero disables.
    pub fn set_latency(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.shared.latency_us.store(us, Ordering::Relaxed);
    }

    /// Throttles each direction of each connection to `bytes_per_sec`
    /// (`None` = unlimited). Applies to live connections too.
    pub fn set_bandwidth(&self, bytes_per_sec: Option<u64>) {
        let b = bytes_per_sec.map(|b| b.max(1)).unwrap_or(0);
        self.shared.bandwidth.store(b, Ordering::Relaxed);
    }

    /// Connections accepted so far (including black-holed ones).
    pub fn accepted_connections(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Connections currently open on the client side (forwarded or black-holed).
    pub fn active_connections(&self) -> u64 {
        self.shared.active.load(Ordering::Relaxed)
    }

    /// Bytes forwarded from the upstream to clients so far: what the client
    /// side has been sent, so a test can bound what a client took in.
    pub fn bytes_to_client(&self) -> u64 {
        self.shared.to_client.load(Ordering::Relaxed)
    }

    /// Counts the serialized round trips of the (plaintext HTTP/2)
    /// connections accepted from now on: see [`RoundTrips`]. Call it before
    /// the client under test connects.
    pub fn count_round_trips(&self) -> Arc<RoundTrips> {
        let trips = Arc::new(RoundTrips::default());
        *self
            .shared
            .trips
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(trips.clone());
        trips
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((sock, _)) => {
                shared.accepted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(connection(sock, upstream, shared.clone(), cancel.clone()));
            }
            // e.g. EMFILE: back off briefly instead of spinning.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

struct ActiveGuard(Arc<Shared>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
) {
    shared.active.fetch_add(1, Ordering::Relaxed);
    let _guard = ActiveGuard(shared.clone());
    let mut rx = shared.state.subscribe();
    let st = *rx.borrow_and_update();

    if st.cut {
        // Black hole: hold the socket without reading until healed.
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = rx.wait_for(|s| !s.cut || s.heals != st.heals) => {}
        }
        drop(client);
        return;
    }

    let _ = client.set_nodelay(true);
    let taps = shared
        .trips
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .map(RoundTrips::connection);
    let (up_tap, down_tap) = match taps {
        Some((up, down)) => (Some(up), Some(down)),
        None => (None, None),
    };
    let forward = async {
        let server = tokio::select! {
            r = TcpStream::connect(upstream) => match r {
                Ok(s) => s,
                Err(_) => return,
            },
            _ = tokio::time::sleep(Duration::from_secs(5)) => return,
        };
        let _ = server.set_nodelay(true);
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        // Any error (reset, broken pipe) tears down both directions; a clean
        // EOF is propagated as a half-close.
        let _ = tokio::try_join!(
            pipe(cr, sw, &shared, st.cuts, None, up_tap),
            pipe(sr, cw, &shared, st.cuts, Some(&shared.to_client), down_tap)
        );
    };
    // Dropping `forward` (cut / proxy dropped) closes both sockets. Biased,
    // the cut first: unbiased, a poll after a cut could still relay a chunk
    // that arrived after it, and a test that cuts and then writes on the
    // far side would see that write leak through.
    tokio::select! {
        biased;
        _ = cancel.cancelled() => {}
        _ = rx.wait_for(|s| s.cut || s.cuts != st.cuts) => {}
        _ = forward => {}
    }
}

/// Copies `r` to `w`, delaying each chunk by the current latency and pacing
/// writes to the current bandwidth. Reading and writing run concurrently, so
/// latency does not reduce throughput. Stops before writing a chunk once a
/// cut came after `born` (the connection's `cuts` when it opened): a chunk
/// still on the delay line when the link is cut is lost, as on a wire.
async fn pipe(
    mut r: OwnedReadHalf,
    mut w: OwnedWriteHalf,
    shared: &Shared,
    born: u64,
    count: Option<&AtomicU64>,
    tap: Option<Tap>,
) -> std::io::Result<()> {
    // Each chunk carries the highest response level that ends in it (see
    // `RoundTrips`), recorded as delivered once it is written on.
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>, u32)>(PIPE_DEPTH);
    let reads = Arc::new(tap.map(Mutex::new));
    let delivered = reads.clone();
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = r.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(()); // dropping tx = EOF to the writer
            }
            let level = match &*reads {
                Some(t) => t
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .read(&buf[..n]),
                None => 0,
            };
            if tx
                .send((Instant::now(), buf[..n].to_vec(), level))
                .await
                .is_err()
            {
                return Ok(());
            }
        }
    };
    let writer = async move {
        let mut next_free = Instant::now();
        while let Some((read_at, data, level)) = rx.recv().await {
            let latency = shared.latency();
            if !latency.is_zero() {
                sleep_until(read_at + latency).await;
            }
            if shared.state.borrow().cuts != born {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "the link was cut",
                ));
            }
            if let Some(c) = count {
                c.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
            match shared.bandwidth() {
                None => w.write_all(&data).await?,
                Some(bw) => {
                    // ~20ms worth of bytes per write for smooth pacing.
                    let piece = ((bw / 50) as usize).clamp(1, CHUNK);
                    for part in data.chunks(piece) {
                        let now = Instant::now();
                        if next_free < now {
                            next_free = now; // no credit for idle time
                        }
                        sleep_until(next_free).await;
                        w.write_all(part).await?;
                        next_free += Duration::from_secs_f64(part.len() as f64 / bw as f64);
                    }
                }
            }
            if let Some(t) = &*delivered {
                t.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .delivered(level);
            }
        }
        w.shutdown().await
    };
    tokio::try_join!(reader, writer).map(|_| ())
}
