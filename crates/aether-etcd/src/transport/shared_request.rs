//! A request sent without a copy per attempt.
//!
//! A unary call keeps its request so that a retry can send it again, and
//! the generated clients take each request by value: every attempt used to
//! start with a deep copy (one allocation per op of a txn, and one more
//! per key and value not already shared). [`SharedRequest`] puts the message behind
//! an `Arc`, so an attempt costs a reference count, and [`Transport::call`]
//! sends it on a method's path with the same codec the generated clients
//! use. The bytes on the wire are the message's own: `SharedRequest` encodes as
//! what it holds.

use std::sync::Arc;

use bytes::{Buf, BufMut};
use prost::Message;
use prost::encoding::{DecodeContext, WireType};

use super::Transport;
use super::retry::{Class, Repeat};
use super::token::Svc;

/// A message shared by every attempt of one call.
#[derive(Debug, Default)]
pub(crate) struct SharedRequest<T>(Arc<T>);

impl<T> SharedRequest<T> {
    pub(crate) fn new(msg: T) -> Self {
        SharedRequest(Arc::new(msg))
    }
}

impl<T> Clone for SharedRequest<T> {
    fn clone(&self) -> Self {
        SharedRequest(Arc::clone(&self.0))
    }
}

impl<T: Repeat> Repeat for SharedRequest<T> {
    fn class(&self) -> Class {
        self.0.class()
    }
}

// Encoding is the wrapped message's; decoding (never used: only requests
// are wrapped) is too, on a copy if the message is shared.
impl<T: Message + Default + Clone> Message for SharedRequest<T> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.0.encode_raw(buf)
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        Arc::make_mut(&mut self.0).merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.encoded_len()
    }

    fn clear(&mut self) {
        self.0 = Arc::default();
    }
}

impl Transport {
    /// Sends `req` to the unary method at `path` (`/etcdserverpb.KV/Txn`)
    /// on `svc`, within the transport's message size limits: what a
    /// generated client's method does, for a [`SharedRequest`] request.
    pub(crate) async fn call<Req, Resp>(
        &self,
        svc: Svc,
        path: &'static str,
        req: tonic::Request<SharedRequest<Req>>,
    ) -> Result<tonic::Response<Resp>, tonic::Status>
    where
        Req: Message + Default + Clone + Send + Sync + 'static,
        Resp: Message + Default + Send + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(svc)
            .max_decoding_message_size(self.max_decoding())
            .max_encoding_message_size(self.max_encoding());
        // As the generated clients do, so both paths fail alike.
        grpc.ready().await.map_err(|e| {
            let e: tonic::codegen::StdError = e.into();
            tonic::Status::unknown(format!("Service was not ready: {e}"))
        })?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
        grpc.unary(req, path, tonic_prost::ProstCodec::default())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{PbOp, PbPutRequest, PbRequestOp, PbTxnRequest};

    #[test]
    fn encodes_as_the_message_it_holds() {
        let put = PbPutRequest {
            key: "k".into(),
            value: "v".into(),
            lease: 7,
            ..Default::default()
        };
        let txn = PbTxnRequest {
            success: vec![PbRequestOp {
                request: Some(PbOp::RequestPut(put)),
            }],
            ..Default::default()
        };
        let shared = SharedRequest::new(txn.clone());
        assert_eq!(shared.encode_to_vec(), txn.encode_to_vec());
        assert_eq!(shared.encoded_len(), txn.encoded_len());
        let decoded =
            SharedRequest::<PbTxnRequest>::decode(&txn.encode_to_vec()[..]).expect("decode");
        assert_eq!(*decoded.0, txn);
    }
}
