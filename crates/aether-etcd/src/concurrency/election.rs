//! Leader election: campaign, proclaim, resign, leader, observe.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::{Stream, StreamExt};

use super::Session;
use super::wait::{WithdrawOnDrop, first_created, range_kvs, send_claim, wait_deletes};
use crate::{
    Client, Compare, CompareOp, Delete, Error, EventKind, Header, KeyValue, LeaseId, Put, Range,
    Result, Txn, WatchOptions, Watcher,
};

/// One candidate in an election on a key prefix.
///
/// Each candidate's key is `<prefix>/<lease hex>`, written under its
/// session's lease with the candidate's value. The leader is the candidate
/// whose key has the lowest create revision. A campaign waits until every
/// key created before its own is deleted (the predecessor resigned, or its
/// session ended), watching only the one just before it.
///
/// ```no_run
/// # async fn demo() -> aether_etcd::Result<()> {
/// use aether_etcd::{Client, ClientConfig};
/// use aether_etcd::concurrency::{Election, Session};
///
/// let client = Client::connect(ClientConfig::new(["http://127.0.0.1:2379"]))?;
/// let session = Session::new(&client).await?;
/// let mut election = Election::new(&session, "/my-service/leader");
/// election.campaign("node-1").await?; // blocks until this node leads
/// election.proclaim("node-1 at 10.0.0.1").await?;
/// // ... lead, until done or `session.lost()` resolves ...
/// election.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Election {
    session: Session,
    prefix: Bytes,
    candidacy: Option<Candidacy>,
    header: Option<Header>,
}

#[derive(Clone, Debug)]
struct Candidacy {
    key: Bytes,
    rev: i64,
    elected: bool,
}

/// `prefix` with one `/` appended, as Go's package does.
fn dir(prefix: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(prefix.len() + 1);
    b.put_slice(prefix);
    b.put_u8(b'/');
    b.freeze()
}

/// `<dir><lease hex>`: one session's key in an election or lock queue.
pub(super) fn session_key(dir: &Bytes, lease: LeaseId) -> Bytes {
    let mut b = BytesMut::with_capacity(dir.len() + 16);
    b.put_slice(dir);
    b.put_slice(format!("{lease:x}").as_bytes());
    b.freeze()
}

pub(super) fn queue_dir(prefix: &[u8]) -> Bytes {
    dir(prefix)
}

impl Election {
    /// An election on `prefix` (its keys are `<prefix>/<lease hex>`).
    pub fn new(session: &Session, prefix: impl AsRef<[u8]>) -> Election {
        Election {
            session: session.clone(),
            prefix: dir(prefix.as_ref()),
            candidacy: None,
            header: None,
        }
    }

    /// An election that already leads with `key` created at `rev` (from
    /// [`Election::key`] and [`Election::rev`] of an earlier instance on the
    /// same session), so it can proclaim and resign without campaigning.
    pub fn resume(session: &Session, prefix: impl AsRef<[u8]>, key: Bytes, rev: i64) -> Election {
        Election {
            candidacy: Some(Candidacy {
                key,
                rev,
                elected: true,
            }),
            ..Election::new(session, prefix)
        }
    }

    /// This candidate's key, once it has campaigned.
    pub fn key(&self) -> Option<&Bytes> {
        self.candidacy.as_ref().map(|c| &c.key)
    }

    /// The create revision of this candidate's key, once it has campaigned.
    pub fn rev(&self) -> Option<i64> {
        self.candidacy.as_ref().map(|c| c.rev)
    }

    /// The header of the request that made this candidate leader, or of
    /// its resignation.
    pub fn header(&self) -> Option<Header> {
        self.header
    }

    /// Whether this candidate won its campaign and has not resigned. It
    /// says what this process did, not what the server holds now: the
    /// session may since be lost, or the key deleted by someone else
    /// ([`Election::proclaim`] would then fail).
    pub fn is_leader(&self) -> bool {
        self.candidacy.as_ref().is_some_and(|c| c.elected)
    }

    /// The session campaigning.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The election's key prefix, with its trailing `/`.
    pub fn prefix(&self) -> &Bytes {
        &self.prefix
    }

    /// Puts this candidate in the queue with `value` and waits until it
    /// leads.
    ///
    /// Campaigning again from the same session finds the same key and waits
    /// on from there (updating the value if it differs). Fails with
    /// [`Error::SessionExpired`] if the session is lost or the key removed
    /// while waiting. If the future is dropped while it waits, the
    /// candidacy is withdrawn (a task deletes the key, if it is still the
    /// one campaigned with), as Go's `Campaign` resigns when its context is
    /// cancelled: a key left queued would make every later candidate wait
    /// behind one that will never lead.
    pub async fn campaign(&mut self, value: impl Into<Bytes>) -> Result<()> {
        let value = value.into();
        let client = self.session.client().clone();
        let key = session_key(&self.prefix, self.session.lease());
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([Put::new(key.clone(), value.clone()).lease(self.session.lease())])
            .or_else([Range::key(key.clone())]);
        let resp = send_claim(&client, txn, key.clone()).await?;
        let rev = if resp.succeeded {
            resp.header.revision
        } else {
            // Our own key from an earlier campaign of this session.
            let Some(kv) = range_kvs(&resp, 0).first() else {
                return Err(Error::SessionExpired);
            };
            kv.create_revision()
        };
        self.candidacy = Some(Candidacy {
            key: key.clone(),
            rev,
            elected: false,
        });
        if !resp.succeeded
            && range_kvs(&resp, 0)
                .first()
                .is_some_and(|kv| kv.value() != &value)
            && let Err(e) = self.put_if_mine(value).await
        {
            self.candidacy = None;
            return Err(e);
        }
        let guard =
            WithdrawOnDrop::new(&mut self.candidacy, self.session.client(), key.clone(), rev);
        let waited = wait_deletes(&self.session, &self.prefix, &key, rev).await;
        guard.disarm();
        let header = waited?;
        if let Some(c) = &mut self.candidacy {
            c.elected = true;
        }
        self.header = Some(header);
        Ok(())
    }

    /// Replaces the leader's value, only if this candidate still leads
    /// (its key exists with the create revision it won with); otherwise
    /// [`Error::NotLeader`].
    pub async fn proclaim(&mut self, value: impl Into<Bytes>) -> Result<()> {
        if !self.is_leader() {
            return Err(Error::NotLeader);
        }
        self.put_if_mine(value.into()).await
    }

    async fn put_if_mine(&mut self, value: Bytes) -> Result<()> {
        let Some(c) = self.candidacy.clone() else {
            return Err(Error::NotLeader);
        };
        let txn = Txn::new()
            .when([Compare::create_revision(
                c.key.clone(),
                CompareOp::Equal,
                c.rev,
            )])
            .and_then([Put::new(c.key, value).lease(self.session.lease())]);
        let resp = self.session.client().txn(txn).await?;
        if !resp.succeeded {
            self.candidacy = None;
            return Err(Error::NotLeader);
        }
        Ok(())
    }

    /// Gives up leadership, or withdraws a pending candidacy: deletes this
    /// candidate's key if it is still the one campaigned with. The next
    /// candidate in line leads at once. A no-op without a candidacy.
    pub async fn resign(&mut self) -> Result<()> {
        let Some(c) = self.candidacy.clone() else {
            return Ok(());
        };
        let txn = Txn::new()
            .when([Compare::create_revision(
                c.key.clone(),
                CompareOp::Equal,
                c.rev,
            )])
            .and_then([Delete::key(c.key)]);
        let resp = self.session.client().txn(txn).await?;
        self.header = Some(resp.header);
        self.candidacy = None;
        Ok(())
    }

    /// The current leader's key and value, `None` when nobody campaigns.
    pub async fn leader(&self) -> Result<Option<KeyValue>> {
        let resp = self
            .session
            .client()
            .range(first_created(&self.prefix))
            .await?;
        Ok(resp.into_kvs().into_iter().next())
    }

    /// A stream of the leader's key-value: the current leader first (once
    /// there is one), then each value it proclaims, then each next leader,
    /// in order. It ends after yielding an error. It holds its own watch
    /// and no task: dropping it stops everything.
    ///
    /// ```no_run
    /// # async fn demo(election: aether_etcd::concurrency::Election)
    /// # -> aether_etcd::Result<()> {
    /// use futures_util::StreamExt;
    /// let mut leaders = election.observe();
    /// while let Some(kv) = leaders.next().await {
    ///     println!("leader is now {:?}", kv?.value());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn observe(&self) -> Observe {
        let state = ObserveState {
            client: self.session.client().clone(),
            prefix: self.prefix.clone(),
            phase: Phase::Find,
        };
        Observe(Box::pin(futures_util::stream::unfold(
            state,
            |mut st| async move { st.next().await.map(|item| (item, st)) },
        )))
    }
}

/// The leader changes of an election; see [`Election::observe`].
pub struct Observe(Pin<Box<dyn Stream<Item = Result<KeyValue>> + Send>>);

impl Stream for Observe {
    type Item = Result<KeyValue>;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.as_mut().poll_next(cx)
    }
}

impl std::fmt::Debug for Observe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observe")
    }
}

struct ObserveState {
    client: Client,
    prefix: Bytes,
    phase: Phase,
}

enum Phase {
    /// Look up the leader (and wait for one if there is none).
    Find,
    /// Follow the leader's key until it is deleted.
    Follow {
        create_rev: i64,
        /// Proclaims received and not yet yielded.
        pending: VecDeque<KeyValue>,
        /// The key was deleted: after `pending`, look up the next leader.
        ended: bool,
        watcher: Watcher,
    },
    Done,
}

impl ObserveState {
    async fn next(&mut self) -> Option<Result<KeyValue>> {
        loop {
            let Phase::Follow {
                create_rev,
                pending,
                ended,
                watcher,
                ..
            } = &mut self.phase
            else {
                if matches!(self.phase, Phase::Done) {
                    return None;
                }
                match self.find().await {
                    Ok(Some(kv)) => return Some(Ok(kv)),
                    Ok(None) => continue,
                    Err(e) => {
                        self.phase = Phase::Done;
                        return Some(Err(e));
                    }
                }
            };
            if let Some(kv) = pending.pop_front() {
                return Some(Ok(kv));
            }
            if *ended {
                self.phase = Phase::Find;
                continue;
            }
            match watcher.next().await {
                Some(Ok(r)) => {
                    for ev in r.events {
                        // A delete, or a put on a re-created key (a new
                        // candidacy): this leadership is over.
                        if ev.kind == EventKind::Delete || ev.kv.create_revision() != *create_rev {
                            *ended = true;
                            break;
                        }
                        pending.push_back(ev.kv);
                    }
                }
                // History compacted under the watch: look again.
                Some(Err(Error::Compacted { .. })) => self.phase = Phase::Find,
                Some(Err(e)) => {
                    self.phase = Phase::Done;
                    return Some(Err(e));
                }
                None => {
                    self.phase = Phase::Done;
                    return Some(Err(Error::Closed));
                }
            }
        }
    }

    /// The leader now, following it from here; `None` after waiting for a
    /// first candidate to appear (the caller looks again).
    async fn find(&mut self) -> Result<Option<KeyValue>> {
        let resp = self.client.range(first_created(&self.prefix)).await?;
        let from = resp.header.revision + 1;
        if let Some(kv) = resp.into_kvs().into_iter().next() {
            let (_, watcher) = self
                .client
                .watch(WatchOptions::key(kv.key().clone()).start_revision(from))?;
            self.phase = Phase::Follow {
                create_rev: kv.create_revision(),
                pending: VecDeque::new(),
                ended: false,
                watcher,
            };
            return Ok(Some(kv));
        }
        // Nobody campaigns: wait for the first put under the prefix.
        let (_, mut watcher) = self
            .client
            .watch(WatchOptions::prefix(self.prefix.clone()).start_revision(from))?;
        loop {
            match watcher.next().await {
                Some(Ok(r)) if r.events.iter().any(|e| e.kind == EventKind::Put) => {
                    return Ok(None);
                }
                Some(Ok(_)) => {}
                // Compacted: something happened; the range will tell.
                Some(Err(Error::Compacted { .. })) => return Ok(None),
                Some(Err(e)) => return Err(e),
                None => return Err(Error::Closed),
            }
        }
    }
}
