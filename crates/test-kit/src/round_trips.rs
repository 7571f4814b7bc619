//! Counts serialized round trips through a [`crate::FaultProxy`]: how many
//! request/response turnarounds a client waited for, in a row, before it
//! sent a given request.
//!
//! ```ignore
//! let proxy = FaultProxy::start(etcd.client_addr()).await;
//! let trips = proxy.count_round_trips();       // before the client connects
//! trips.mark("final state write", b"synced=1"); // a request carrying these bytes
//! proxy.set_latency(Duration::from_millis(100));
//! // ... run the client ...
//! let seen = trips.first("final state write").unwrap();
//! println!("{}", trips.report());
//! ```
//!
//! **How.** The proxy parses the plaintext HTTP/2 frames in both
//! directions (gRPC over `http://`; TLS would hide them). Every request
//! gets a *level*: one more than the highest level of any response the
//! client had been delivered, on any connection through this proxy, when
//! the proxy read the request's first frame. A response (a HEADERS or DATA
//! frame from the server on a stream) has the level of the request it
//! answers. So a request sent after waiting for k answers in a row has
//! level k + 1, and requests sent together (concurrently) share a level,
//! whatever they are. Opening a TCP connection counts as an exchange too
//! (a SYN and its SYN-ACK; the proxy accepts at once, a real link does
//! not): a connection accepted at level k + 1 carries requests of level
//! k + 2 at the lowest, and the server's first SETTINGS frame answers the
//! connection, so a client that waits for it is charged for it.
//!
//! **Robust under load.** A level is a count of dependencies, not of time:
//! compute time between two independent sends changes nothing unless it
//! lasts longer than a round trip (a request sent after an unrelated answer
//! came back is charged one more level). With a one-way delay of 100 ms or
//! more, that takes a stall of 200 ms on one thread. Control frames (PING,
//! WINDOW_UPDATE, SETTINGS acks) are not responses: HTTP/2 sends them by
//! itself, and a client never waits on them before a request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0;
const HEADERS: u8 = 1;
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const WINDOW_UPDATE: u8 = 8;
const ACK: u8 = 1;
/// SETTINGS_INITIAL_WINDOW_SIZE.
const INITIAL_WINDOW: u16 = 4;

/// Round-trip accounting for one proxy (see the module docs). Shared by
/// every connection the proxy accepts after
/// [`crate::FaultProxy::count_round_trips`].
#[derive(Default)]
pub struct RoundTrips {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for RoundTrips {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("RoundTrips")
            .field("delivered", &inner.delivered)
            .field("requests", &inner.requests.len())
            .field("connections", &inner.conns.len())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Inner {
    /// The highest level of any response written to the client so far.
    delivered: u32,
    /// When `delivered` rose, and to what.
    rises: Vec<(Instant, u32)>,
    marks: Vec<Mark>,
    /// Every request (and connection) in order, for the report.
    requests: Vec<Request>,
    conns: Vec<Conn>,
    started: Option<Instant>,
    /// Flow-control events, for [`RoundTrips::flow_report`].
    flow: Vec<Flow>,
}

/// What one frame did to HTTP/2 flow control.
#[derive(Clone, Copy)]
struct Flow {
    at: Instant,
    conn: usize,
    what: FlowKind,
}

#[derive(Clone, Copy)]
enum FlowKind {
    /// Payload bytes of a client DATA frame (what the server's receive
    /// window and its BDP estimator count).
    ClientData(u32),
    /// A connection-level WINDOW_UPDATE from the server.
    ServerConnWindow(u32),
    /// A SETTINGS_INITIAL_WINDOW_SIZE from the server (the stream window).
    ServerStreamWindow(u32),
    /// A PING from the server (grpc-go's BDP probe, or a keep-alive).
    ServerPing,
}

struct Mark {
    name: String,
    needle: Vec<u8>,
    first: Option<Seen>,
    /// DATA frames that carried the needle.
    times: usize,
}

/// A mark's first request: its level and when the proxy read it.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    /// One more than the round trips the client had waited for in a row.
    pub level: u32,
    /// When the proxy read it from the client.
    pub at: Instant,
}

struct Request {
    level: u32,
    at: Instant,
    conn: usize,
    stream: u32,
    what: String,
}

struct Conn {
    /// The level of the connection's handshake.
    level: u32,
    streams: HashMap<u32, Stream>,
}

struct Stream {
    /// The level of the stream's latest request message.
    level: u32,
    /// The server has answered on it since that message.
    answered: bool,
    /// A request message was recorded for the report since the answer.
    recorded: bool,
}

impl RoundTrips {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remember the first request (lowest level) whose DATA frame
    /// contains `needle`, under `name`.
    pub fn mark(&self, name: &str, needle: &[u8]) {
        self.lock().marks.push(Mark {
            name: name.to_owned(),
            needle: needle.to_vec(),
            first: None,
            times: 0,
        });
    }

    /// The lowest-level request that carried the mark's bytes so far.
    pub fn first(&self, name: &str) -> Option<Seen> {
        self.lock()
            .marks
            .iter()
            .find(|m| m.name == name)
            .and_then(|m| m.first)
    }

    /// How many requests carried the mark's bytes so far (DATA frames, so
    /// a request whose message spans several counts once per frame that
    /// holds the bytes whole).
    pub fn times(&self, name: &str) -> usize {
        self.lock()
            .marks
            .iter()
            .find(|m| m.name == name)
            .map_or(0, |m| m.times)
    }

    /// The highest response level the client had received at `at`: the
    /// round trips through this proxy completed, in a row, by then.
    pub fn completed_by(&self, at: Instant) -> u32 {
        self.lock()
            .rises
            .iter()
            .take_while(|(t, _)| *t <= at)
            .map(|(_, l)| *l)
            .max()
            .unwrap_or(0)
    }

    /// The connection (numbered as in [`RoundTrips::report`]) of every
    /// request that carried a message, in the order the proxy read them.
    pub fn request_conns(&self) -> Vec<usize> {
        self.lock().requests.iter().map(|r| r.conn).collect()
    }

    /// Connections opened through the proxy since counting began.
    pub fn connections(&self) -> usize {
        self.lock().conns.len()
    }

    /// Every request up to `max_level`, one line each: level, time since
    /// the first, connection, stream and the printable text of its first
    /// DATA frame (keys, values), so a person can tell what it was.
    pub fn report(&self, max_level: u32) -> String {
        let inner = self.lock();
        let t0 = inner.started;
        let mut out = String::new();
        for r in inner.requests.iter().filter(|r| r.level <= max_level) {
            let ms = t0.map_or(0, |t0| r.at.duration_since(t0).as_millis());
            out.push_str(&format!(
                "  level {:>2} at {:>5} ms  conn {} stream {:>3}  {}\n",
                r.level, ms, r.conn, r.stream, r.what
            ));
        }
        out
    }

    /// HTTP/2 flow control as the proxy saw it, one line per connection
    /// and `bucket` of time since the first connection: the client's DATA
    /// bytes (what the server's windows admit), the server's
    /// connection-level WINDOW_UPDATE increments, its PINGs (grpc-go's
    /// BDP probes: one per sample) and any new stream window it set. A
    /// connection whose client bytes double bucket by bucket while the
    /// sender has more to send is in the window's ramp.
    pub fn flow_report(&self, bucket: std::time::Duration) -> String {
        let inner = self.lock();
        let Some(t0) = inner.started else {
            return String::new();
        };
        let b = bucket.as_secs_f64();
        // (conn, bucket) -> (client bytes, window increments, pings, stream window)
        let mut rows: std::collections::BTreeMap<(usize, u64), (u64, u64, u32, u32)> =
            Default::default();
        for f in &inner.flow {
            let k = (f.conn, (f.at.duration_since(t0).as_secs_f64() / b) as u64);
            let r = rows.entry(k).or_default();
            match f.what {
                FlowKind::ClientData(n) => r.0 += u64::from(n),
                FlowKind::ServerConnWindow(n) => r.1 += u64::from(n),
                FlowKind::ServerPing => r.2 += 1,
                FlowKind::ServerStreamWindow(n) => r.3 = n,
            }
        }
        let mut out = String::new();
        for ((conn, i), (data, win, pings, sw)) in rows {
            out.push_str(&format!(
                "  conn {conn} t {:>5} ms: client data {:>8} B, window +{:>8} B, {pings} pings{}\n",
                (i as f64 * b * 1e3) as u64,
                data,
                win,
                if sw > 0 {
                    format!(", stream window {sw}")
                } else {
                    String::new()
                }
            ));
        }
        out
    }

    /// Per connection, the largest stream window the server has set
    /// (SETTINGS_INITIAL_WINDOW_SIZE; grpc-go raises it with the
    /// connection's window as its BDP estimate grows), 0 if none.
    pub fn stream_windows(&self) -> Vec<u32> {
        let inner = self.lock();
        let mut out = vec![0; inner.conns.len()];
        for f in &inner.flow {
            if let FlowKind::ServerStreamWindow(n) = f.what {
                out[f.conn] = out[f.conn].max(n);
            }
        }
        out
    }

    /// Client DATA bytes per connection, in `bucket`s of time since the
    /// first connection: `[conn][bucket]`.
    pub fn client_bytes(&self, bucket: std::time::Duration) -> Vec<Vec<u64>> {
        let inner = self.lock();
        let Some(t0) = inner.started else {
            return Vec::new();
        };
        let mut out = vec![Vec::new(); inner.conns.len()];
        for f in &inner.flow {
            if let FlowKind::ClientData(n) = f.what {
                let i = (f.at.duration_since(t0).as_secs_f64() / bucket.as_secs_f64()) as usize;
                let row: &mut Vec<u64> = &mut out[f.conn];
                if row.len() <= i {
                    row.resize(i + 1, 0);
                }
                row[i] += u64::from(n);
            }
        }
        out
    }

    /// A connection was accepted: its handshake is one exchange.
    pub(super) fn connection(self: &Arc<Self>) -> (Tap, Tap) {
        let mut inner = self.lock();
        let now = Instant::now();
        inner.started.get_or_insert(now);
        let level = inner.delivered + 1;
        let conn = inner.conns.len();
        inner.conns.push(Conn {
            level,
            streams: HashMap::new(),
        });
        inner.requests.push(Request {
            level,
            at: now,
            conn,
            stream: 0,
            what: "(TCP connect)".into(),
        });
        let tap = |from_client| Tap {
            trips: self.clone(),
            conn,
            from_client,
            frames: FrameReader::new(if from_client { PREFACE.len() } else { 0 }),
        };
        (tap(true), tap(false))
    }
}

/// One direction of one connection.
pub(super) struct Tap {
    trips: Arc<RoundTrips>,
    conn: usize,
    from_client: bool,
    frames: FrameReader,
}

impl Tap {
    /// Bytes read from this direction's sender, now. Returns the highest
    /// level of any response that ends in them (0: none), for
    /// [`Tap::delivered`] once they are written on.
    pub(super) fn read(&mut self, bytes: &[u8]) -> u32 {
        let mut frames = Vec::new();
        self.frames.feed(bytes, &mut frames);
        let mut inner = self.trips.lock();
        let now = Instant::now();
        let mut level = 0;
        for f in &frames {
            if let Some(what) = flow_of(self.from_client, f) {
                inner.flow.push(Flow {
                    at: now,
                    conn: self.conn,
                    what,
                });
            }
        }
        for f in frames {
            if self.from_client {
                inner.client_frame(self.conn, &f, now);
            } else {
                level = level.max(inner.server_frame(self.conn, &f));
            }
        }
        level
    }

    /// Server bytes holding responses up to `level` were written to the
    /// client.
    pub(super) fn delivered(&self, level: u32) {
        if level == 0 {
            return;
        }
        let mut inner = self.trips.lock();
        if level > inner.delivered {
            inner.delivered = level;
            inner.rises.push((Instant::now(), level));
        }
    }
}

impl Inner {
    fn client_frame(&mut self, conn: usize, f: &Frame, now: Instant) {
        if f.stream == 0 || (f.kind != HEADERS && f.kind != DATA) {
            return;
        }
        let next = (self.delivered + 1).max(self.conns[conn].level + 1);
        let stream = self.conns[conn].streams.entry(f.stream).or_insert(Stream {
            level: next,
            answered: false,
            recorded: false,
        });
        // A new message on a stream the server has answered (a streaming
        // call) is a new request; the rest of a request's frames are not.
        if stream.answered {
            *stream = Stream {
                level: next,
                answered: false,
                recorded: false,
            };
        }
        let level = stream.level;
        if f.kind != DATA || f.payload.is_empty() {
            return;
        }
        if !stream.recorded {
            stream.recorded = true;
            self.requests.push(Request {
                level,
                at: now,
                conn,
                stream: f.stream,
                what: printable(&f.payload),
            });
        }
        for m in &mut self.marks {
            if contains(&f.payload, &m.needle) {
                m.times += 1;
                if m.first.is_none_or(|s| level < s.level) {
                    m.first = Some(Seen { level, at: now });
                }
            }
        }
    }

    /// The level a server frame answers at (0: not an answer).
    fn server_frame(&mut self, conn: usize, f: &Frame) -> u32 {
        let c = &mut self.conns[conn];
        if f.kind == SETTINGS && f.stream == 0 && f.flags & ACK == 0 {
            return c.level;
        }
        if f.stream == 0 || (f.kind != HEADERS && f.kind != DATA) {
            return 0;
        }
        match c.streams.get_mut(&f.stream) {
            Some(s) => {
                s.answered = true;
                s.level
            }
            None => 0,
        }
    }
}

/// The flow-control effect of a frame, if any.
fn flow_of(from_client: bool, f: &Frame) -> Option<FlowKind> {
    match (from_client, f.kind) {
        (true, DATA) => Some(FlowKind::ClientData(f.payload.len() as u32)),
        (false, WINDOW_UPDATE) if f.stream == 0 && f.payload.len() >= 4 => {
            let p = &f.payload;
            Some(FlowKind::ServerConnWindow(
                u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff,
            ))
        }
        (false, PING) if f.flags & ACK == 0 => Some(FlowKind::ServerPing),
        (false, SETTINGS) if f.flags & ACK == 0 => f.payload.chunks_exact(6).find_map(|c| {
            (u16::from_be_bytes([c[0], c[1]]) == INITIAL_WINDOW)
                .then(|| FlowKind::ServerStreamWindow(u32::from_be_bytes([c[2], c[3], c[4], c[5]])))
        }),
        _ => None,
    }
}

/// One whole HTTP/2 frame.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// Splits a byte stream into frames, after skipping the client's preface.
struct FrameReader {
    skip: usize,
    buf: Vec<u8>,
}

impl FrameReader {
    fn new(skip: usize) -> FrameReader {
        FrameReader {
            skip,
            buf: Vec::new(),
        }
    }

    fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<Frame>) {
        let skipped = self.skip.min(bytes.len());
        self.skip -= skipped;
        bytes = &bytes[skipped..];
        self.buf.extend_from_slice(bytes);
        let mut at = 0;
        while self.buf.len() - at >= 9 {
            let h = &self.buf[at..at + 9];
            let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            if self.buf.len() - at < 9 + len {
                break;
            }
            out.push(Frame {
                kind: h[3],
                flags: h[4],
                stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                payload: self.buf[at + 9..at + 9 + len].to_vec(),
            });
            at += 9 + len;
        }
        self.buf.drain(..at);
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

/// The printable runs of at least 4 bytes in the first 600 bytes, joined by
/// spaces, at most 100 characters.
fn printable(payload: &[u8]) -> String {
    let head = &payload[..payload.len().min(600)];
    let mut runs = Vec::new();
    for run in head.split(|b| !(b' '..=b'~').contains(b)) {
        if run.len() >= 4 {
            runs.push(String::from_utf8_lossy(run).into_owned());
        }
    }
    let mut s = runs.join(" ");
    if s.is_empty() {
        s = format!("({} bytes, nothing printable)", payload.len());
    }
    if s.len() > 100 {
        s.truncate(100);
        s.push('…');
    }
    s
}
