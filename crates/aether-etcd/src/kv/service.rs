//! The KV service's calls.

use crate::error::Result;
use crate::header::Header;
use crate::pb::PbKvClient;
use crate::pb::{PbCompactionRequest, PbPutResponse, PbTxnResponse};
use crate::transport::{SharedRequest, Svc, Transport};

use super::types::{
    Delete, DeleteResponse, Put, PutResponse, Range, RangeResponse, Txn, TxnResponse,
};

/// The KV service on a transport.
#[derive(Clone)]
pub(crate) struct KvClient {
    transport: Transport,
}

impl KvClient {
    pub(crate) fn new(transport: Transport) -> KvClient {
        KvClient { transport }
    }

    /// The largest response the client accepts.
    pub(crate) fn max_decoding(&self) -> usize {
        self.transport.max_decoding()
    }

    /// The generated client, with the transport's message size limits: a
    /// range page or a txn can be far over tonic's defaults.
    fn grpc(&self, svc: Svc) -> PbKvClient<Svc> {
        PbKvClient::new(svc)
            .max_decoding_message_size(self.transport.max_decoding())
            .max_encoding_message_size(self.transport.max_encoding())
    }

    pub(crate) async fn range(&self, req: Range) -> Result<RangeResponse> {
        let resp = self
            .transport
            .unary(req.0, |svc, r| async move { self.grpc(svc).range(r).await })
            .await?;
        Ok(resp.into())
    }

    pub(crate) async fn put(&self, req: Put) -> Result<PutResponse> {
        let resp: PbPutResponse = self
            .transport
            .unary(SharedRequest::new(req.0), |svc, r| {
                self.transport.call(svc, "/etcdserverpb.KV/Put", r)
            })
            .await?;
        Ok(resp.into())
    }

    pub(crate) async fn delete(&self, req: Delete) -> Result<DeleteResponse> {
        let resp = self
            .transport
            .unary(req.0, |svc, r| async move {
                self.grpc(svc).delete_range(r).await
            })
            .await?;
        Ok(resp.into())
    }

    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let resp: PbTxnResponse = self
            .transport
            .unary(SharedRequest::new(txn.0), |svc, r| {
                self.transport.call(svc, "/etcdserverpb.KV/Txn", r)
            })
            .await?;
        Ok(resp.into())
    }

    pub(crate) async fn compact(&self, revision: i64, physical: bool) -> Result<Header> {
        let req = PbCompactionRequest { revision, physical };
        let resp = self
            .transport
            .unary(req, |svc, r| async move { self.grpc(svc).compact(r).await })
            .await?;
        Ok(resp.header.into())
    }
}
