//! A txn's answer decoded straight into [`TxnResponse`].
//!
//! Decoding into the generated `TxnResponse` and then typing it built every
//! answer twice: a vector of generated `ResponseOp`s, grown op by op, then
//! a vector of [`OpResponse`]s, grown again, with the first freed in
//! between. [`TxnAnswer`] is what the txn call decodes instead: each op's
//! answer is typed as it is read and pushed once, into a vector sized from
//! the first op's encoded length. The wire format and the resulting
//! `TxnResponse` are the same.

use bytes::{Buf, BufMut};
use prost::Message;
use prost::encoding::{DecodeContext, WireType};

use crate::pb::PbResponseHeader;
use crate::pb::etcdserverpb::ResponseOp as PbResponseOpMessage;

use super::types::{OpResponse, TxnResponse};

/// At most this many op answers are reserved from the first op's size
/// (etcd's default `--max-txn-ops`): a small first answer before a large
/// one (a put, then a range of megabytes) must not reserve for thousands.
const RESERVE_OPS: usize = 128;

/// The response message of the txn call; see the module doc.
#[derive(Debug, Default)]
pub(crate) struct TxnAnswer {
    header: Option<PbResponseHeader>,
    succeeded: bool,
    responses: Vec<OpResponse>,
}

impl TxnAnswer {
    pub(crate) fn into_response(self) -> TxnResponse {
        TxnResponse {
            header: self.header.into(),
            succeeded: self.succeeded,
            responses: self.responses,
        }
    }
}

impl Message for TxnAnswer {
    /// Answers are only decoded; a client never sends one. The type is
    /// private to the txn call, so this is never reached.
    fn encode_raw(&self, _buf: &mut impl BufMut) {
        unreachable!("a txn answer is only decoded")
    }

    fn encoded_len(&self) -> usize {
        unreachable!("a txn answer is only decoded")
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Field numbers of etcd's `TxnResponse`.
        match tag {
            1 => prost::encoding::message::merge(
                wire_type,
                self.header.get_or_insert_with(Default::default),
                buf,
                ctx,
            ),
            2 => prost::encoding::bool::merge(wire_type, &mut self.succeeded, buf, ctx),
            3 => {
                let before = buf.remaining();
                let mut op = PbResponseOpMessage::default();
                prost::encoding::message::merge(wire_type, &mut op, buf, ctx)?;
                if self.responses.capacity() == 0 {
                    // The rest of the answer is likely more of the same.
                    let each = (before - buf.remaining()).max(1);
                    self.responses
                        .reserve((1 + buf.remaining() / each).min(RESERVE_OPS));
                }
                // An op answer with none of its fields set is none the
                // generated conversion would keep either.
                if let Some(r) = op.response {
                    self.responses.push(OpResponse::from(r));
                }
                Ok(())
            }
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn clear(&mut self) {
        *self = TxnAnswer::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{
        PbKeyValue, PbOpResponse, PbPutResponse, PbRangeResponse, PbTxnResponse,
        etcdserverpb::ResponseOp,
    };

    fn header(revision: i64) -> Option<PbResponseHeader> {
        Some(PbResponseHeader {
            cluster_id: 1,
            member_id: 2,
            revision,
            raft_term: 3,
        })
    }

    fn op(response: Option<PbOpResponse>) -> ResponseOp {
        ResponseOp { response }
    }

    /// The same bytes decode to the same answer both ways, nested txns,
    /// ranges and an empty op included.
    #[test]
    fn decodes_as_the_generated_answer_typed() {
        let kv = PbKeyValue {
            key: "/k".into(),
            value: "v".into(),
            create_revision: 4,
            mod_revision: 5,
            version: 2,
            lease: 7,
        };
        let nested = PbTxnResponse {
            header: header(9),
            succeeded: false,
            responses: vec![op(Some(PbOpResponse::ResponseRange(PbRangeResponse {
                header: header(9),
                kvs: vec![kv.clone()],
                more: true,
                count: 3,
            })))],
        };
        let mut responses: Vec<ResponseOp> = (0..200)
            .map(|i| {
                op(Some(PbOpResponse::ResponsePut(PbPutResponse {
                    header: header(i),
                    prev_kv: (i % 2 == 0).then(|| kv.clone()),
                })))
            })
            .collect();
        responses.push(op(None));
        responses.push(op(Some(PbOpResponse::ResponseTxn(nested))));
        let pb = PbTxnResponse {
            header: header(9),
            succeeded: true,
            responses,
        };
        let bytes = pb.encode_to_vec();
        let ours = TxnAnswer::decode(&bytes[..])
            .expect("decode")
            .into_response();
        let theirs = TxnResponse::from(pb);
        // `OpResponse` has no `PartialEq`; its debug form shows every field.
        assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
        assert_eq!(ours.responses.len(), 201);
    }

    #[test]
    fn an_empty_answer_has_no_ops() {
        let pb = PbTxnResponse {
            header: header(3),
            succeeded: true,
            responses: vec![],
        };
        let ours = TxnAnswer::decode(&pb.encode_to_vec()[..])
            .expect("decode")
            .into_response();
        assert_eq!(ours.header.revision, 3);
        assert!(ours.succeeded && ours.responses.is_empty());
    }
}
