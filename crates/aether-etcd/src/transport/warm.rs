//! Opening connections before a call needs them.
//!
//! Channels connect lazily, on their first call. Over a long link each new
//! connection's handshakes (TCP, then TLS) are paid by whichever call lands
//! on it first, and with several connections per endpoint, spread round
//! robin, the first calls of a session each land on a new one: a session
//! start of five calls in a row paid five handshakes in a row (BENCHMARKS
//! §7). [`Transport::open_connections`] opens them all at once instead.
//!
//! A lazy channel connects only when a request is waiting, so each gets
//! one: a call to a method no etcd serves. The server answers
//! `Unimplemented` before any interceptor, so it needs no token, is
//! checked against no permission and does no work; by then the
//! connection is up.
//!
//! **Warming the window.** etcd's server (grpc-go) opens each connection's
//! receive window at 64 KiB and grows it only by its BDP estimator: a PING
//! sent on the first DATA frame it receives after the previous sample, and
//! on the PING's ack, a window of twice the bytes received meanwhile if
//! they were at least two thirds of the current one. It counts every DATA
//! frame on the connection, whatever the stream (before it looks the
//! stream up), so a new connection carries ~64 KiB in its first round trip,
//! ~128 KiB in its second, and so on, whatever the sender has ready
//! (BENCHMARKS §7 shows the frames). [`Transport::warm_connections`] sends
//! the call above with a body of [`WARM_BYTES`] on each call connection, so
//! the first sample is taken during round trips a session start spends
//! anyway: its first data round trip then finds about 120 KiB per
//! connection. Not the whole 64 KiB: the connection window is shared, and
//! the small calls sent beside it (a session start's reads) must find room
//! rather than wait a round trip for a window update.

use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use super::Transport;

/// A method no server implements (see the module docs).
const NO_SUCH_METHOD: &str = "/aether.etcd.Connect/Open";

/// The body that warms a new connection's receive window (module docs):
/// above two thirds of grpc-go's initial 64 KiB, so that its first BDP
/// sample doubles the window (twice the bytes received), and 4 KiB below
/// it, so that the small calls sent beside it on the same connection find
/// room (the server gives the window back as soon as the pad arrives).
pub(crate) const WARM_BYTES: usize = 60 * 1024;

impl Transport {
    /// Opens every connection to the endpoint in use (its
    /// [`ClientConfig::connections`](super::ClientConfig::connections) and
    /// the keep-alive's own) at once; resolves when each is up or has
    /// failed, within the connect timeout plus the request timeout.
    pub(crate) async fn open_connections(&self) {
        self.open(0).await
    }

    /// [`Transport::open_connections`], each call connection's call
    /// carrying [`WARM_BYTES`] to start the server's window growth (module
    /// docs). The keep-alive's connection carries little and is not warmed.
    pub(crate) async fn warm_connections(&self) {
        self.open(WARM_BYTES).await
    }

    async fn open(&self, pad: usize) {
        let eps = self.endpoints();
        let i = self.current(&eps);
        let channels = eps.channels[i]
            .iter()
            .map(|c| (c, pad))
            .chain(std::iter::once((&eps.lease_channels[i], 0)))
            .map(|(c, pad)| (c.clone(), pad));
        let within = self.config().connect_timeout + self.config().request_timeout;
        futures_util::future::join_all(channels.map(|(c, pad)| open(c, pad, within))).await;
    }
}

/// Connects `channel` by sending it a call to [`NO_SUCH_METHOD`] with a
/// body of about `pad` bytes; whatever the answer, the next call finds the
/// connection up (or tries again).
async fn open(channel: Channel, pad: usize, within: std::time::Duration) {
    let mut grpc = tonic::client::Grpc::new(channel);
    let call = async {
        if grpc.ready().await.is_err() {
            return;
        }
        // A protobuf `bytes` message: its encoding is the pad plus a few
        // bytes of tag and length, what grpc-go's estimator counts.
        let codec = tonic_prost::ProstCodec::<Vec<u8>, ()>::default();
        let path = PathAndQuery::from_static(NO_SUCH_METHOD);
        let _ = grpc
            .unary(tonic::Request::new(vec![0u8; pad]), path, codec)
            .await;
    };
    let _ = tokio::time::timeout(within, call).await;
}
