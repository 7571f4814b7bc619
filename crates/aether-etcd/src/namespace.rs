//! A key-prefix view of a client, like Go's `namespace` package.
//!
//! Every key sent is prefixed and every key received has the prefix
//! stripped, so code written against a whole keyspace can be confined to
//! one subtree. Range ends follow etcd's conventions inside the namespace:
//! an empty end means "this key", and `[0]` ("to the end of the keyspace",
//! what the `from_key` constructors and [`Range::prefix`] of an empty or
//! all-`0xff` prefix yield) maps to the end of the namespace, never past it,
//! in ranges, deletes, compares and watches alike.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::Stream;

use super::client::Client;
use super::error::Result;
use super::kv::{
    Delete, DeleteResponse, KeyValue, OpResponse, Put, PutResponse, Range, RangeResponse, Txn,
    TxnResponse, prefix_end,
};
use super::pb::{PbOp, PbRequestOp};
use super::watch::{WatchOptions, WatchResponse};

/// A client confined to the keys under one prefix; see
/// [`Client::with_namespace`]. Cheap to clone.
#[derive(Clone)]
pub struct Namespace {
    client: Client,
    prefix: Bytes,
}

impl std::fmt::Debug for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespace")
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Client {
    /// A view of this client in which every key is under `prefix`:
    /// `put("/a")` writes `<prefix>/a`, a range over everything reads only
    /// the namespace, and keys come back without the prefix.
    ///
    /// ```no_run
    /// # async fn demo(client: aether_etcd::Client)
    /// # -> aether_etcd::Result<()> {
    /// use aether_etcd::{Put, Range};
    /// let tenant = client.with_namespace("/tenants/acme");
    /// tenant.put(Put::new("/config", "v1")).await?; // writes /tenants/acme/config
    /// let all = tenant.range(Range::prefix("")).await?; // only acme's keys
    /// assert_eq!(all.kvs()[0].key(), "/config");
    /// # Ok(()) }
    /// ```
    pub fn with_namespace(&self, prefix: impl Into<Bytes>) -> Namespace {
        Namespace {
            client: self.clone(),
            prefix: prefix.into(),
        }
    }
}

impl Namespace {
    /// The prefix.
    pub fn prefix(&self) -> &Bytes {
        &self.prefix
    }

    /// The client underneath, which sees whole keys.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// [`Client::range`] inside the namespace.
    pub async fn range(&self, mut req: Range) -> Result<RangeResponse> {
        self.range_in(&mut req.0.key, &mut req.0.range_end);
        let mut resp = self.client.range(req).await?;
        self.strip_range(&mut resp);
        Ok(resp)
    }

    /// [`Client::put`] inside the namespace.
    pub async fn put(&self, mut req: Put) -> Result<PutResponse> {
        req.0.key = self.key_in(&req.0.key);
        let mut resp = self.client.put(req).await?;
        self.strip_opt(&mut resp.prev_kv);
        Ok(resp)
    }

    /// [`Client::delete`] inside the namespace.
    pub async fn delete(&self, mut req: Delete) -> Result<DeleteResponse> {
        self.range_in(&mut req.0.key, &mut req.0.range_end);
        let mut resp = self.client.delete(req).await?;
        self.strip_all(&mut resp.prev_kvs);
        Ok(resp)
    }

    /// [`Client::txn`] inside the namespace: compares and ops of both
    /// branches are prefixed, nested txns at every level included, and the
    /// results stripped.
    pub async fn txn(&self, mut txn: Txn) -> Result<TxnResponse> {
        for c in &mut txn.0.compare {
            self.range_in(&mut c.key, &mut c.range_end);
        }
        for op in txn.0.success.iter_mut().chain(txn.0.failure.iter_mut()) {
            self.op_in(op);
        }
        let mut resp = self.client.txn(txn).await?;
        self.strip_txn(&mut resp);
        Ok(resp)
    }

    /// [`Client::watch`] inside the namespace, on a watch stream of its
    /// own.
    pub fn watch(&self, mut opts: WatchOptions) -> Result<NamespaceWatcher> {
        self.range_in(&mut opts.0.key, &mut opts.0.range_end);
        // The watcher keeps its watch stream alive.
        let (_, watcher) = self.client.watch(opts)?;
        let ns = self.clone();
        let events = futures_util::StreamExt::map(watcher, move |mut msg| {
            if let Ok(r) = &mut msg {
                for ev in &mut r.events {
                    ns.strip(&mut ev.kv);
                    ns.strip_opt(&mut ev.prev_kv);
                }
            }
            msg
        });
        Ok(NamespaceWatcher(Box::pin(events)))
    }

    fn key_in(&self, key: &[u8]) -> Bytes {
        let mut b = BytesMut::with_capacity(self.prefix.len() + key.len());
        b.put_slice(&self.prefix);
        b.put_slice(key);
        b.freeze()
    }

    fn range_in(&self, key: &mut Bytes, end: &mut Bytes) {
        *key = self.key_in(key);
        if end.as_ref() == [0] {
            *end = prefix_end(&self.prefix);
        } else if !end.is_empty() {
            *end = self.key_in(end);
        }
    }

    fn op_in(&self, op: &mut PbRequestOp) {
        match &mut op.request {
            Some(PbOp::RequestRange(r)) => self.range_in(&mut r.key, &mut r.range_end),
            Some(PbOp::RequestPut(p)) => p.key = self.key_in(&p.key),
            Some(PbOp::RequestDeleteRange(d)) => self.range_in(&mut d.key, &mut d.range_end),
            Some(PbOp::RequestTxn(t)) => {
                for c in &mut t.compare {
                    self.range_in(&mut c.key, &mut c.range_end);
                }
                for op in t.success.iter_mut().chain(t.failure.iter_mut()) {
                    self.op_in(op);
                }
            }
            None => {}
        }
    }

    fn strip(&self, kv: &mut KeyValue) {
        if kv.0.key.starts_with(&self.prefix) {
            kv.0.key = kv.0.key.slice(self.prefix.len()..);
        }
    }

    fn strip_opt(&self, kv: &mut Option<KeyValue>) {
        if let Some(kv) = kv {
            self.strip(kv);
        }
    }

    fn strip_all(&self, kvs: &mut [KeyValue]) {
        for kv in kvs {
            self.strip(kv);
        }
    }

    fn strip_range(&self, r: &mut RangeResponse) {
        self.strip_all(&mut r.kvs);
    }

    fn strip_txn(&self, t: &mut TxnResponse) {
        for r in &mut t.responses {
            match r {
                OpResponse::Range(r) => self.strip_range(r),
                OpResponse::Put(p) => self.strip_opt(&mut p.prev_kv),
                OpResponse::Delete(d) => self.strip_all(&mut d.prev_kvs),
                OpResponse::Txn(t) => self.strip_txn(t),
            }
        }
    }
}

/// A watch inside a [`Namespace`]: keys in its events have the prefix
/// stripped. Dropping it cancels the watch.
pub struct NamespaceWatcher(Pin<Box<dyn Stream<Item = Result<WatchResponse>> + Send>>);

impl NamespaceWatcher {
    /// The next response, waiting for it: `Ok(None)` once the watch has
    /// ended; as [`Watcher::message`](crate::Watcher::message). After an
    /// error the watcher is finished.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>> {
        futures_util::StreamExt::next(self).await.transpose()
    }
}

impl Stream for NamespaceWatcher {
    type Item = Result<WatchResponse>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for NamespaceWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NamespaceWatcher")
    }
}
