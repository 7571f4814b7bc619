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

use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use super::Transport;

/// A method no server implements (see the module docs).
const NO_SUCH_METHOD: &str = "/aether.etcd.Connect/Open";

impl Transport {
    /// Opens every connection to the endpoint in use (its
    /// [`ClientConfig::connections`](super::ClientConfig::connections) and
    /// the keep-alive's own) at once; resolves when each is up or has
    /// failed, within the connect timeout plus the request timeout.
    pub(crate) async fn open_connections(&self) {
        let eps = self.endpoints();
        let i = self.current(&eps);
        let channels = eps.channels[i]
            .iter()
            .chain(std::iter::once(&eps.lease_channels[i]))
            .cloned();
        let within = self.config().connect_timeout + self.config().request_timeout;
        futures_util::future::join_all(channels.map(|c| open(c, within))).await;
    }
}

/// Connects `channel` by sending it a call to [`NO_SUCH_METHOD`]; whatever
/// the answer, the next call finds the connection up (or tries again).
async fn open(channel: Channel, within: std::time::Duration) {
    let mut grpc = tonic::client::Grpc::new(channel);
    let call = async {
        if grpc.ready().await.is_err() {
            return;
        }
        let codec = tonic_prost::ProstCodec::<(), ()>::default();
        let path = PathAndQuery::from_static(NO_SUCH_METHOD);
        let _ = grpc.unary(tonic::Request::new(()), path, codec).await;
    };
    let _ = tokio::time::timeout(within, call).await;
}
