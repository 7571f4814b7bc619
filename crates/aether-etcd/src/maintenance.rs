//! The maintenance service: status, alarms, defragmentation, the KV and
//! backend hashes, snapshots and leader transfer.
//!
//! These act on the member the client is talking to (the current
//! endpoint). To defragment or hash every member, connect one client per
//! member URL (from [`Client::member_list`](super::Client::member_list)).
//!
//! The snapshot is read as its consumer polls it, so that memory is
//! bounded by the HTTP/2 window: see [`Snapshot`].

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use tonic::codec::Streaming;

use super::error::{Error, Result};
use super::header::Header;
use super::pb::{
    PbAlarmAction, PbAlarmRequest, PbAlarmType, PbDefragmentRequest, PbDowngradeAction,
    PbDowngradeRequest, PbHashKvRequest, PbHashRequest, PbMaintenanceClient, PbMoveLeaderRequest,
    PbSnapshotRequest, PbSnapshotResponse, PbStatusRequest,
};
use super::transport::Transport;

/// A member's status.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// The server version, e.g. "3.4.23".
    pub version: String,
    /// The store revision.
    pub revision: i64,
    /// The member that answered.
    pub member_id: u64,
    /// The current leader's member id.
    pub leader: u64,
    /// The raft index.
    pub raft_index: u64,
    /// The raft term.
    pub raft_term: u64,
    /// Size of the backend database in bytes.
    pub db_size: i64,
    /// Bytes of the backend logically in use; what a defragment would
    /// shrink `db_size` to. (etcd 3.4 and 3.5 both send it; an older
    /// server leaves it 0.)
    pub db_size_in_use: i64,
    /// The raft index the member has applied (3.4 and later; 0 from an
    /// older server).
    pub raft_applied_index: u64,
    /// Whether the member is a raft learner (3.4 and later; false from an
    /// older server).
    pub is_learner: bool,
    /// What the member reports wrong: one entry per raised alarm (etcd's
    /// text, e.g. `memberID:… alarm:NOSPACE `) and "etcdserver: no leader"
    /// without a leader. Empty when all is well, and always from a server
    /// older than 3.4.
    pub errors: Vec<String>,
}

/// The kinds of alarm etcd raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AlarmKind {
    /// The backend is over `--quota-backend-bytes`: writes are refused with
    /// [`Error::NoSpace`](super::Error::NoSpace) until space is freed
    /// (compact, then defragment) and the alarm disarmed.
    NoSpace,
    /// A member's data was found corrupt (`--experimental-corrupt-check-time`).
    Corrupt,
}

/// What a [`Client::downgrade`](super::Client::downgrade) call asks of
/// the cluster (etcd 3.5 and later).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DowngradeAction {
    /// Checks that the cluster could be downgraded to the version, and
    /// changes nothing.
    Validate,
    /// Starts the downgrade: members may then be replaced by the older
    /// release one by one.
    Enable,
    /// Cancels a downgrade in progress (the version is not needed).
    Cancel,
}

/// The answer to [`Client::downgrade`](super::Client::downgrade).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DowngradeResponse {
    /// The response header.
    pub header: Header,
    /// The cluster version before the call (major.minor.0, e.g. "3.5.0").
    pub cluster_version: String,
}

impl AlarmKind {
    fn pb(self) -> PbAlarmType {
        match self {
            AlarmKind::NoSpace => PbAlarmType::Nospace,
            AlarmKind::Corrupt => PbAlarmType::Corrupt,
        }
    }
}

/// A raised alarm.
// Not `non_exhaustive`: callers build one to disarm it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Alarm {
    /// The member that raised it.
    pub member_id: u64,
    /// What it is.
    pub kind: AlarmKind,
}

/// The hash of a member's KV history; see
/// [`Client::hash_kv`](super::Client::hash_kv).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HashKv {
    /// The hash of the keys and values from the compact revision up to the
    /// revision asked for.
    pub hash: u32,
    /// The compact revision the hash starts at.
    pub compact_revision: i64,
    /// The response header (its revision is the store's current one).
    pub header: Header,
}

/// The hash of a member's whole backend; see
/// [`Client::hash`](super::Client::hash).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hash {
    /// CRC-32C over every bucket of the backend: every revision of every
    /// key still kept, the leases, the membership, the auth store, the
    /// alarms, the compaction marks. Only the raft index the backend
    /// records (and on 3.5 the raft term) is left out, as it may differ
    /// between members.
    pub hash: u32,
    /// The response header; its revision is the store's revision read
    /// after the hash was computed (etcd takes no lock between the two).
    pub header: Header,
}

/// One message of a snapshot stream; see [`Client::snapshot`](super::Client::snapshot).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotChunk {
    /// The next bytes of the database file, or, for the checksum, the
    /// SHA-256 of all the database bytes before it.
    pub blob: Bytes,
    /// How many database bytes are still to come after this chunk: 0 on
    /// the last chunk of the database, and on the checksum.
    pub remaining_bytes: u64,
    /// Whether this is the checksum etcd sends after the database (3.4
    /// and 3.5 both do). Writing every chunk in order, the checksum too,
    /// gives the file `etcdctl snapshot save` writes, which `etcdctl
    /// snapshot restore` (3.4) and `etcdutl snapshot restore` (3.5)
    /// check against the checksum; without it they need
    /// `--skip-hash-check`.
    pub is_checksum: bool,
}

/// A member's backend as a stream of [`SnapshotChunk`]s; see
/// [`Client::snapshot`](super::Client::snapshot).
///
/// It reads the gRPC stream as it is polled: no task reads ahead and
/// nothing is collected. A consumer that writes each chunk out holds one
/// chunk (etcd sends 32 KiB) plus what HTTP/2 has received and not yet
/// handed on, at most the stream window
/// ([`ClientConfig::stream_window`](super::ClientConfig::stream_window)).
/// A consumer that stops reading stops etcd, which waits for the window
/// to open again (`tests/client_cluster.rs` measures it through a proxy:
/// one window sent, then nothing, of a 30 MB snapshot).
///
/// It ends after the checksum; a stream that ends before etcd has sent
/// every database byte yields an [`Error::Unavailable`] first, so a
/// consumer that saw the end of the stream without an error has it all.
/// Waiting longer than the client's request timeout for a chunk yields
/// [`Error::Timeout`] and ends the stream; the time a consumer spends
/// between polls does not count.
pub struct Snapshot {
    inner: Streaming<PbSnapshotResponse>,
    /// Bounds each wait for the server, armed while a poll is pending.
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    armed: bool,
    /// Database bytes received, and the total once the first chunk said.
    received: u64,
    size: Option<u64>,
    /// The last database chunk has come: what follows is the checksum.
    data_done: bool,
    done: bool,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("received", &self.received)
            .field("size", &self.size)
            .field("data_done", &self.data_done)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl Snapshot {
    fn new(inner: Streaming<PbSnapshotResponse>, idle: Duration) -> Snapshot {
        Snapshot {
            inner,
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            armed: false,
            received: 0,
            size: None,
            data_done: false,
            done: false,
        }
    }

    /// The size of the database in bytes (without the checksum), known
    /// once the first chunk has been read.
    pub fn size(&self) -> Option<u64> {
        self.size
    }

    /// Database bytes read so far (without the checksum).
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Takes one message from etcd and says what it is.
    fn chunk(&mut self, msg: PbSnapshotResponse) -> Result<SnapshotChunk> {
        if self.data_done {
            return Ok(SnapshotChunk {
                blob: msg.blob,
                remaining_bytes: msg.remaining_bytes,
                is_checksum: true,
            });
        }
        let len = msg.blob.len() as u64;
        self.received += len;
        let size = *self.size.get_or_insert(len + msg.remaining_bytes);
        if self.received + msg.remaining_bytes != size {
            return Err(Error::Unavailable(format!(
                "snapshot stream out of step: {} bytes received and {} to come, of {size}",
                self.received, msg.remaining_bytes
            )));
        }
        self.data_done = msg.remaining_bytes == 0;
        Ok(SnapshotChunk {
            blob: msg.blob,
            remaining_bytes: msg.remaining_bytes,
            is_checksum: false,
        })
    }
}

impl Stream for Snapshot {
    type Item = Result<SnapshotChunk>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut this.inner).poll_next(cx);
        let item = match polled {
            Poll::Ready(item) => item,
            Poll::Pending => {
                if !this.armed {
                    this.armed = true;
                    let at = tokio::time::Instant::now() + this.idle;
                    this.timer.as_mut().reset(at);
                }
                if this.timer.as_mut().poll(cx).is_ready() {
                    this.done = true;
                    return Poll::Ready(Some(Err(Error::Timeout(this.idle))));
                }
                return Poll::Pending;
            }
        };
        this.armed = false;
        let out = match item {
            Some(Ok(msg)) => this.chunk(msg),
            Some(Err(status)) => Err(Error::from_status(status)),
            None if this.data_done => {
                this.done = true;
                return Poll::Ready(None);
            }
            None => Err(Error::Unavailable(format!(
                "snapshot stream ended after {} of {} bytes",
                this.received,
                this.size.map_or_else(|| "?".to_string(), |s| s.to_string())
            ))),
        };
        if out.is_err() {
            this.done = true;
        }
        Poll::Ready(Some(out))
    }
}

/// The maintenance service on a transport.
#[derive(Clone)]
pub(crate) struct MaintenanceClient {
    transport: Transport,
}

impl MaintenanceClient {
    pub(crate) fn new(transport: Transport) -> MaintenanceClient {
        MaintenanceClient { transport }
    }

    pub(crate) async fn status(&self) -> Result<Status> {
        let r = self
            .transport
            .unary(PbStatusRequest {}, |svc, req| async move {
                PbMaintenanceClient::new(svc).status(req).await
            })
            .await?;
        let header = r.header.unwrap_or_default();
        Ok(Status {
            version: r.version,
            revision: header.revision,
            member_id: header.member_id,
            leader: r.leader,
            raft_index: r.raft_index,
            raft_term: r.raft_term,
            db_size: r.db_size,
            db_size_in_use: r.db_size_in_use,
            raft_applied_index: r.raft_applied_index,
            is_learner: r.is_learner,
            errors: r.errors,
        })
    }

    async fn alarm(&self, req: PbAlarmRequest) -> Result<Vec<Alarm>> {
        let resp = self
            .transport
            .unary(req, |svc, r| async move {
                PbMaintenanceClient::new(svc).alarm(r).await
            })
            .await?;
        Ok(resp
            .alarms
            .into_iter()
            .filter_map(|a| {
                let kind = match PbAlarmType::try_from(a.alarm).ok()? {
                    PbAlarmType::Nospace => AlarmKind::NoSpace,
                    PbAlarmType::Corrupt => AlarmKind::Corrupt,
                    PbAlarmType::None => return None,
                };
                Some(Alarm {
                    member_id: a.member_id,
                    kind,
                })
            })
            .collect())
    }

    pub(crate) async fn alarm_list(&self) -> Result<Vec<Alarm>> {
        self.alarm(PbAlarmRequest {
            action: PbAlarmAction::Get as i32,
            member_id: 0,
            alarm: PbAlarmType::None as i32,
        })
        .await
    }

    pub(crate) async fn alarm_activate(&self, alarm: Alarm) -> Result<Vec<Alarm>> {
        self.alarm(PbAlarmRequest {
            action: PbAlarmAction::Activate as i32,
            member_id: alarm.member_id,
            alarm: alarm.kind.pb() as i32,
        })
        .await
    }

    pub(crate) async fn downgrade(
        &self,
        action: DowngradeAction,
        version: &str,
    ) -> Result<DowngradeResponse> {
        let action = match action {
            DowngradeAction::Validate => PbDowngradeAction::Validate,
            DowngradeAction::Enable => PbDowngradeAction::Enable,
            DowngradeAction::Cancel => PbDowngradeAction::Cancel,
        };
        let req = PbDowngradeRequest {
            action: action as i32,
            version: version.to_string(),
        };
        let resp = self
            .transport
            .unary(req, |svc, r| async move {
                PbMaintenanceClient::new(svc).downgrade(r).await
            })
            .await
            .map_err(|e| match e {
                // Say which release to look for, not just gRPC's text.
                Error::Unimplemented(m) => Error::Unimplemented(format!(
                    "Downgrade (etcd 3.4 has none; it came with 3.5): {m}"
                )),
                e => e,
            })?;
        Ok(DowngradeResponse {
            header: resp.header.into(),
            cluster_version: resp.version,
        })
    }

    pub(crate) async fn alarm_disarm(&self, alarm: Alarm) -> Result<Vec<Alarm>> {
        self.alarm(PbAlarmRequest {
            action: PbAlarmAction::Deactivate as i32,
            member_id: alarm.member_id,
            alarm: alarm.kind.pb() as i32,
        })
        .await
    }

    pub(crate) async fn defragment(&self) -> Result<Header> {
        let resp = self
            .transport
            .unary(PbDefragmentRequest {}, |svc, r| async move {
                PbMaintenanceClient::new(svc).defragment(r).await
            })
            .await?;
        Ok(resp.header.into())
    }

    pub(crate) async fn hash_kv(&self, revision: i64) -> Result<HashKv> {
        let resp = self
            .transport
            .unary(PbHashKvRequest { revision }, |svc, r| async move {
                PbMaintenanceClient::new(svc).hash_kv(r).await
            })
            .await?;
        Ok(HashKv {
            hash: resp.hash,
            compact_revision: resp.compact_revision,
            header: resp.header.into(),
        })
    }

    pub(crate) async fn hash(&self) -> Result<Hash> {
        let resp = self
            .transport
            .unary(PbHashRequest {}, |svc, r| async move {
                PbMaintenanceClient::new(svc).hash(r).await
            })
            .await?;
        Ok(Hash {
            hash: resp.hash,
            header: resp.header.into(),
        })
    }

    pub(crate) async fn snapshot(&self) -> Result<Snapshot> {
        let max = self.transport.max_decoding();
        let inner = self
            .transport
            .open_stream(PbSnapshotRequest {}, |svc, r| async move {
                PbMaintenanceClient::new(svc)
                    .max_decoding_message_size(max)
                    .snapshot(r)
                    .await
            })
            .await?;
        Ok(Snapshot::new(
            inner,
            self.transport.config().request_timeout,
        ))
    }

    pub(crate) async fn move_leader(&self, target: u64) -> Result<()> {
        self.transport
            .unary(
                PbMoveLeaderRequest { target_id: target },
                |svc, r| async move { PbMaintenanceClient::new(svc).move_leader(r).await },
            )
            .await?;
        Ok(())
    }
}
