//! A loopback proxy for etcd member-to-member (raft) traffic that can cut
//! one member from its quorum.
//!
//! Every member of a [`crate::Cluster`] started with
//! [`crate::Cluster::start_advertising`] advertises its own `PeerProxy` as
//! its peer URL, so every connection *to* a member goes through that
//! member's proxy. A connection's first request names its sender in the
//! `X-Server-From` header (etcd's rafthttp sets it on stream dials,
//! pipeline posts and snapshots), so a proxy can refuse the traffic of a
//! given sender. Cutting member `m` off: [`PeerProxy::isolate`] on m's own
//! proxy (nothing reaches m) and [`PeerProxy::block_sender`] with m's id
//! on every other member's proxy (nothing from m reaches them, including
//! the streams m dials to receive their messages). Live connections that
//! a new rule covers are closed at once.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Default)]
struct Rules {
    isolated: bool,
    blocked: HashSet<u64>,
}

impl Rules {
    fn refuses(&self, sender: Option<u64>) -> bool {
        self.isolated || sender.is_some_and(|s| self.blocked.contains(&s))
    }
}

#[derive(Debug)]
struct Shared {
    rules: Mutex<Rules>,
    /// Bumped on every rule change: live connections re-check.
    changes: watch::Sender<u64>,
    upstream_port: AtomicU16,
}

/// See the module docs. Stops (closing every connection) on drop.
#[derive(Debug)]
pub struct PeerProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
}

impl PeerProxy {
    /// Binds 127.0.0.1:0; forwards to `127.0.0.1:<upstream port>`, which is
    /// set later with [`PeerProxy::set_upstream_port`] (the member's peer
    /// port is only known once the cluster picks it).
    pub async fn start() -> PeerProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind peer proxy on 127.0.0.1:0");
        let addr = listener.local_addr().expect("peer proxy addr");
        let (changes, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            rules: Mutex::new(Rules::default()),
            changes,
            upstream_port: AtomicU16::new(0),
        });
        let cancel = CancellationToken::new();
        tokio::spawn(accept_loop(listener, shared.clone(), cancel.clone()));
        PeerProxy {
            addr,
            shared,
            cancel,
        }
    }

    /// `http://127.0.0.1:<port>`: the URL the member advertises.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Forwards to 127.0.0.1:`port` from now on: the member's own peer port.
    pub fn set_upstream_port(&self, port: u16) {
        self.shared.upstream_port.store(port, Ordering::SeqCst);
    }

    /// Refuse (or stop refusing) every connection to the member.
    pub fn isolate(&self, on: bool) {
        self.change(|r| r.isolated = on);
    }

    /// Refuse connections whose sender is member `id`.
    pub fn block_sender(&self, id: u64) {
        self.change(|r| {
            r.blocked.insert(id);
        });
    }

    /// Back to forwarding everything.
    pub fn heal(&self) {
        self.change(|r| *r = Rules::default());
    }

    fn change(&self, f: impl FnOnce(&mut Rules)) {
        f(&mut self
            .shared
            .rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner));
        self.shared.changes.send_modify(|n| *n += 1);
    }
}

impl Drop for PeerProxy {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            acc = listener.accept() => {
                let Ok((conn, _)) = acc else { continue };
                tokio::spawn(handle(conn, shared.clone(), cancel.clone()));
            }
        }
    }
}

/// `X-Server-From: <hex id>` in a request head.
fn sender(head: &[u8]) -> Option<u64> {
    let text = String::from_utf8_lossy(head);
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("x-server-from")
            .then(|| u64::from_str_radix(v.trim(), 16).ok())
            .flatten()
    })
}

async fn handle(mut conn: TcpStream, shared: Arc<Shared>, cancel: CancellationToken) {
    // Read the first request head (bounded in size and time).
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        true
    };
    if !matches!(
        tokio::time::timeout(Duration::from_secs(5), read_head).await,
        Ok(true)
    ) {
        return;
    }
    let from = sender(&head);
    let mut changes = shared.changes.subscribe();
    let refused = || {
        shared
            .rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .refuses(from)
    };
    if refused() {
        return;
    }
    let port = shared.upstream_port.load(Ordering::SeqCst);
    if port == 0 {
        return;
    }
    let Ok(mut up) = TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    if up.write_all(&head).await.is_err() {
        return;
    }
    let copy = async {
        let _ = tokio::io::copy_bidirectional(&mut conn, &mut up).await;
    };
    tokio::pin!(copy);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = &mut copy => return,
            ch = changes.changed() => {
                if ch.is_err() || refused() {
                    return;
                }
            }
        }
    }
}
