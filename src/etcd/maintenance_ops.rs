//! Maintenance beyond status: alarms, defragmentation and the KV hash.
//!
//! These act on the member the client is talking to (the current
//! endpoint). To defragment or hash every member, connect one client per
//! member URL (from [`Client::member_list`]).

use super::client::Client;
use super::error::Result;
use super::kv::Header;
use super::pb::{
    PbAlarmAction, PbAlarmRequest, PbAlarmType, PbDefragmentRequest, PbHashKvRequest,
    PbMaintenanceClient,
};

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

/// The hash of a member's KV history; see [`Client::hash_kv`].
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

impl Client {
    async fn alarm(&self, req: PbAlarmRequest) -> Result<Vec<Alarm>> {
        let resp = self
            .unary(req, |svc, r| {
                let mut c = PbMaintenanceClient::new(svc);
                async move { c.alarm(r).await }
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

    /// The alarms raised anywhere in the cluster.
    ///
    /// ```no_run
    /// # async fn demo(client: aether_replicator::etcd::Client)
    /// # -> aether_replicator::etcd::Result<()> {
    /// use aether_replicator::etcd::AlarmKind;
    /// for alarm in client.alarm_list().await? {
    ///     if alarm.kind == AlarmKind::NoSpace {
    ///         // Free space first, or the alarm is raised again at once.
    ///         let rev = client.status().await?.revision;
    ///         client.compact(rev, true).await?;
    ///         client.defragment().await?;
    ///         client.alarm_disarm(alarm).await?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn alarm_list(&self) -> Result<Vec<Alarm>> {
        self.alarm(PbAlarmRequest {
            action: PbAlarmAction::Get as i32,
            member_id: 0,
            alarm: PbAlarmType::None as i32,
        })
        .await
    }

    /// Disarms `alarm` (a `member_id` of 0 disarms it on every member) and
    /// returns the alarms that were disarmed. A NOSPACE alarm disarmed
    /// while the backend is still over quota is raised again by the next
    /// write.
    pub async fn alarm_disarm(&self, alarm: Alarm) -> Result<Vec<Alarm>> {
        self.alarm(PbAlarmRequest {
            action: PbAlarmAction::Deactivate as i32,
            member_id: alarm.member_id,
            alarm: alarm.kind.pb() as i32,
        })
        .await
    }

    /// Defragments the backend of the member this client talks to,
    /// returning the space freed by compaction to the file system. The
    /// member blocks reads and writes meanwhile, and a large backend can
    /// take longer than the default request timeout: raise
    /// [`ClientConfig::request_timeout`](super::ClientConfig::request_timeout)
    /// for it.
    pub async fn defragment(&self) -> Result<Header> {
        let resp = self
            .unary(PbDefragmentRequest {}, |svc, r| {
                let mut c = PbMaintenanceClient::new(svc);
                async move { c.defragment(r).await }
            })
            .await?;
        Ok(resp.header.into())
    }

    /// The hash of the member's KV history up to `revision` (0: the
    /// latest). Two members that agree on the history give the same hash
    /// for the same revision and compact revision; it is etcd's own
    /// corruption check.
    pub async fn hash_kv(&self, revision: i64) -> Result<HashKv> {
        let resp = self
            .unary(PbHashKvRequest { revision }, |svc, r| {
                let mut c = PbMaintenanceClient::new(svc);
                async move { c.hash_kv(r).await }
            })
            .await?;
        Ok(HashKv {
            hash: resp.hash,
            compact_revision: resp.compact_revision,
            header: resp.header.into(),
        })
    }
}
