//! The maintenance service: status, alarms, defragmentation and the KV
//! hash.
//!
//! These act on the member the client is talking to (the current
//! endpoint). To defragment or hash every member, connect one client per
//! member URL (from [`Client::member_list`](super::Client::member_list)).

use super::error::Result;
use super::header::Header;
use super::pb::{
    PbAlarmAction, PbAlarmRequest, PbAlarmType, PbDefragmentRequest, PbHashKvRequest,
    PbMaintenanceClient, PbStatusRequest,
};
use super::transport::Transport;

/// A member's status.
#[derive(Clone, Debug, PartialEq, Eq)]
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
}

/// The kinds of alarm etcd raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AlarmKind {
    /// The backend is over `--quota-backend-bytes`: writes are refused with
    /// [`Error::NoSpace`](super::Error::NoSpace) until space is freed
    /// (compact, then defragment) and the alarm disarmed.
    NoSpace,
    /// A member's data was found corrupt (`--experimental-corrupt-check-time`).
    Corrupt,
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
pub struct HashKv {
    /// The hash of the keys and values from the compact revision up to the
    /// revision asked for.
    pub hash: u32,
    /// The compact revision the hash starts at.
    pub compact_revision: i64,
    /// The response header (its revision is the store's current one).
    pub header: Header,
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
}
