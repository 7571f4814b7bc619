//! A distributed lock: lock, try_lock, unlock.

use bytes::Bytes;

use super::Session;
use super::election::{queue_dir, session_key};
use super::wait::{WithdrawOnDrop, first_created, range_kvs, send_claim, wait_deletes};
use crate::{Compare, CompareOp, Delete, Error, Header, Op, Put, Range, Result, Txn, TxnResponse};

/// A lock on a key prefix, held by at most one session at a time.
///
/// Each session's claim is the key `<prefix>/<lease hex>` under its lease;
/// the claim with the lowest create revision holds the lock, and the others
/// wait, each for the claim just before its own. A session that dies
/// releases the lock when its lease runs out.
///
/// As in Go's package, the lock belongs to the *session*, not to this
/// value: two `Mutex`es on one prefix and one session share one claim, so
/// both "hold" it, and either's `unlock` releases it.
///
/// ```no_run
/// # async fn demo() -> aether_etcd::Result<()> {
/// use aether_etcd::{Client, ClientConfig};
/// use aether_etcd::concurrency::{Mutex, Session};
///
/// let client = Client::connect(ClientConfig::new(["http://127.0.0.1:2379"]))?;
/// let session = Session::new(&client).await?;
/// let mut lock = Mutex::new(&session, "/locks/schema-migration");
/// lock.lock().await?;
/// // ... the critical section; if `session.lost()` resolves, the lock is gone ...
/// lock.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Mutex {
    session: Session,
    prefix: Bytes,
    /// This session's claim and its create revision, while queued or held.
    claim: Option<(Bytes, i64)>,
    header: Option<Header>,
}

impl Mutex {
    /// A lock on `prefix` (claims are `<prefix>/<lease hex>`).
    pub fn new(session: &Session, prefix: impl AsRef<[u8]>) -> Mutex {
        Mutex {
            session: session.clone(),
            prefix: queue_dir(prefix.as_ref()),
            claim: None,
            header: None,
        }
    }

    /// This session's claim key, while it is queued or holds the lock.
    pub fn key(&self) -> Option<&Bytes> {
        self.claim.as_ref().map(|(k, _)| k)
    }

    /// The header of the request that acquired the lock.
    pub fn header(&self) -> Option<Header> {
        self.header
    }

    /// Acquires the lock, waiting for every earlier claim to go.
    ///
    /// Fails with [`Error::SessionExpired`] if the session is lost or the
    /// claim removed while waiting; on any error the claim is withdrawn
    /// (best effort). If the future is dropped while it waits (a timeout, a
    /// `select!` that took another branch), the claim is withdrawn too, as
    /// Go's `Lock` does when its context is cancelled: a task deletes the
    /// key, so the next waiter is not held up by a claim nobody will
    /// release. As in Go, the claim belongs to the session, so that also
    /// withdraws the claim another `Mutex` of the same session queued.
    pub async fn lock(&mut self) -> Result<()> {
        let (resp, held) = self.try_acquire().await?;
        if held {
            self.header = Some(resp.header);
            return Ok(());
        }
        let Some((key, rev)) = self.claim.clone() else {
            return Err(Error::SessionExpired);
        };
        let guard = WithdrawOnDrop::new(&mut self.claim, self.session.client(), key.clone(), rev);
        let waited = wait_deletes(&self.session, &self.prefix, &key, rev).await;
        guard.disarm();
        match waited {
            Ok(header) => {
                self.header = Some(header);
                Ok(())
            }
            Err(e) => {
                let _ = self.unlock().await;
                Err(e)
            }
        }
    }

    /// Acquires the lock if nobody else holds it, or fails at once with
    /// [`Error::Locked`] (withdrawing the claim).
    pub async fn try_lock(&mut self) -> Result<()> {
        let (resp, held) = self.try_acquire().await?;
        if held {
            self.header = Some(resp.header);
            return Ok(());
        }
        self.unlock().await?;
        Err(Error::Locked)
    }

    /// Releases the lock, or withdraws a queued claim. A no-op without one.
    pub async fn unlock(&mut self) -> Result<()> {
        if let Some((key, _)) = self.claim.take() {
            self.session.client().delete(Delete::key(key)).await?;
        }
        Ok(())
    }

    /// Queues this session's claim (or finds it queued already) and says
    /// whether it holds the lock now.
    async fn try_acquire(&mut self) -> Result<(TxnResponse, bool)> {
        let key = session_key(&self.prefix, self.session.lease());
        let put = Put::new(key.clone(), Bytes::new()).lease(self.session.lease());
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([Op::from(put), Op::from(first_created(&self.prefix))])
            .or_else([Range::key(key.clone()), first_created(&self.prefix)]);
        let resp = send_claim(self.session.client(), txn, key.clone()).await?;
        let rev = if resp.succeeded {
            resp.header.revision
        } else {
            // This session's claim, from another `Mutex` or an earlier call.
            match range_kvs(&resp, 0).first() {
                Some(kv) => kv.create_revision(),
                None => return Err(Error::SessionExpired),
            }
        };
        self.claim = Some((key, rev));
        let held = range_kvs(&resp, 1)
            .first()
            .is_none_or(|owner| owner.create_revision() == rev);
        Ok((resp, held))
    }
}
