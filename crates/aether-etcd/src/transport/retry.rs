//! Which unary calls may be sent again, and after which failures: Go's
//! clientv3 rules (`retry.go`: repeatable and non-repeatable calls), kept
//! by request type so that no service has to say it at each call site.

use crate::error::Error;
use crate::pb::etcdserverpb as pb;

/// How a request may be repeated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// Reads nothing but state: sending it twice is the same as once.
    Read,
    /// Changes state, or answers differently the second time (a revoke
    /// that applied makes the next one "lease not found"): sent again only
    /// when the first never left.
    Write,
}

/// A request type's [`Class`]. Every unary request of etcd's API has one,
/// so a new call needs no change here; a txn is classed by what it holds.
pub(crate) trait Repeat {
    fn class(&self) -> Class;
}

/// Whether a call of `class` that failed with `err` may be sent again.
pub(crate) fn may_retry(class: Class, err: &Error) -> bool {
    if err.not_sent() {
        return true;
    }
    match class {
        Class::Read => err.is_transient(),
        Class::Write => false,
    }
}

macro_rules! class {
    ($class:ident: $($ty:ident),+ $(,)?) => {
        $(impl Repeat for pb::$ty {
            fn class(&self) -> Class {
                Class::$class
            }
        })+
    };
}

class!(Read:
    RangeRequest,
    LeaseTimeToLiveRequest,
    LeaseLeasesRequest,
    MemberListRequest,
    StatusRequest,
    HashRequest,
    HashKvRequest,
    SnapshotRequest,
    AuthStatusRequest,
    AuthenticateRequest,
    AuthUserGetRequest,
    AuthUserListRequest,
    AuthRoleGetRequest,
    AuthRoleListRequest,
);

// Go repeats a lease grant and revoke; not here: a grant with its own id
// that applied makes the second one "lease already exists", a revoke "lease
// not found", and a grant with a server-chosen id would leave a second
// lease behind. Compaction and defragment answer or block differently the
// second time too.
class!(Write:
    PutRequest,
    DeleteRangeRequest,
    CompactionRequest,
    LeaseGrantRequest,
    LeaseRevokeRequest,
    MemberAddRequest,
    MemberRemoveRequest,
    MemberUpdateRequest,
    MemberPromoteRequest,
    DefragmentRequest,
    MoveLeaderRequest,
    DowngradeRequest,
    AuthEnableRequest,
    AuthDisableRequest,
    AuthUserAddRequest,
    AuthUserDeleteRequest,
    AuthUserChangePasswordRequest,
    AuthUserGrantRoleRequest,
    AuthUserRevokeRoleRequest,
    AuthRoleAddRequest,
    AuthRoleDeleteRequest,
    AuthRoleGrantPermissionRequest,
    AuthRoleRevokePermissionRequest,
);

impl Repeat for pb::TxnRequest {
    /// A txn of ranges only (compares and reads in both branches) is a
    /// read; any put or delete, nested too, makes it a write.
    fn class(&self) -> Class {
        if self.success.iter().chain(&self.failure).all(op_reads) {
            Class::Read
        } else {
            Class::Write
        }
    }
}

fn op_reads(op: &pb::RequestOp) -> bool {
    use pb::request_op::Request;
    match &op.request {
        Some(Request::RequestRange(_)) | None => true,
        Some(Request::RequestTxn(txn)) => txn.class() == Class::Read,
        Some(Request::RequestPut(_) | Request::RequestDeleteRange(_)) => false,
    }
}

impl Repeat for pb::AlarmRequest {
    /// Listing alarms is a read; raising or disarming one a write.
    fn class(&self) -> Class {
        if self.action == pb::alarm_request::AlarmAction::Get as i32 {
            Class::Read
        } else {
            Class::Write
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use tonic::{Code, Status};

    fn range() -> pb::RequestOp {
        pb::RequestOp {
            request: Some(pb::request_op::Request::RequestRange(
                pb::RangeRequest::default(),
            )),
        }
    }

    fn put() -> pb::RequestOp {
        pb::RequestOp {
            request: Some(pb::request_op::Request::RequestPut(
                pb::PutRequest::default(),
            )),
        }
    }

    fn txn(success: Vec<pb::RequestOp>, failure: Vec<pb::RequestOp>) -> pb::TxnRequest {
        pb::TxnRequest {
            compare: Vec::new(),
            success,
            failure,
        }
    }

    #[test]
    fn requests_are_classed_as_go_does_or_stricter() {
        assert_eq!(pb::RangeRequest::default().class(), Class::Read);
        assert_eq!(pb::PutRequest::default().class(), Class::Write);
        assert_eq!(pb::DeleteRangeRequest::default().class(), Class::Write);
        assert_eq!(pb::LeaseGrantRequest::default().class(), Class::Write);
        assert_eq!(pb::LeaseTimeToLiveRequest::default().class(), Class::Read);
        assert_eq!(pb::MemberListRequest::default().class(), Class::Read);
        assert_eq!(pb::DefragmentRequest::default().class(), Class::Write);
        assert_eq!(pb::AuthUserGetRequest::default().class(), Class::Read);
        assert_eq!(pb::AuthUserAddRequest::default().class(), Class::Write);

        let get = pb::AlarmRequest::default();
        assert_eq!(get.class(), Class::Read);
        let disarm = pb::AlarmRequest {
            action: pb::alarm_request::AlarmAction::Deactivate as i32,
            ..get
        };
        assert_eq!(disarm.class(), Class::Write);
    }

    #[test]
    fn a_txn_is_a_read_only_without_writes_at_any_depth() {
        assert_eq!(txn(vec![], vec![]).class(), Class::Read);
        assert_eq!(txn(vec![range()], vec![range()]).class(), Class::Read);
        assert_eq!(txn(vec![range()], vec![put()]).class(), Class::Write);
        assert_eq!(txn(vec![put()], vec![]).class(), Class::Write);
        let nested = |inner: pb::TxnRequest| pb::RequestOp {
            request: Some(pb::request_op::Request::RequestTxn(inner)),
        };
        assert_eq!(
            txn(vec![nested(txn(vec![range()], vec![]))], vec![]).class(),
            Class::Read
        );
        assert_eq!(
            txn(vec![range()], vec![nested(txn(vec![], vec![put()]))]).class(),
            Class::Write
        );
    }

    /// What tonic 0.14 reports for a connection that could not be made,
    /// seen against a closed port.
    fn refused() -> Error {
        Error::Unavailable(
            "tcp connect error: transport error: Connection refused (os error 111)".into(),
        )
    }

    /// ... and for a connection that broke under a call, seen with etcd
    /// killed and with a proxy cut while a put was in flight.
    fn broke() -> Error {
        Error::Unavailable(
            "transport error: connection error: stream closed because of a broken pipe".into(),
        )
    }

    #[test]
    fn a_call_that_never_left_is_retried_whatever_it_is() {
        let err = refused();
        assert!(may_retry(Class::Read, &err), "{err:?}");
        assert!(may_retry(Class::Write, &err), "{err:?}");
        assert!(!err.maybe_applied(), "{err:?}");
    }

    #[test]
    fn a_tls_failure_is_never_retried() {
        // Another attempt meets the same certificates.
        let err = Error::Tls {
            endpoint: "https://127.0.0.1:2379".into(),
            message: "invalid peer certificate: UnknownIssuer".into(),
            source: None,
        };
        assert!(!may_retry(Class::Read, &err) && !may_retry(Class::Write, &err));
        assert!(!err.maybe_applied(), "{err:?}");
    }

    #[test]
    fn a_read_is_retried_after_any_transient_failure_and_nothing_else() {
        for err in [
            broke(),
            Error::Unavailable("h2 protocol error: stream closed".into()),
            Error::Timeout(Duration::from_secs(1)),
            Error::NoLeader,
            Error::from_status(Status::unavailable("etcdserver: leader changed")),
            // etcd could not commit or confirm in time: another member may
            // still have its quorum.
            Error::from_status(Status::unavailable("etcdserver: request timed out")),
            Error::from_status(Status::unknown("context deadline exceeded")),
        ] {
            assert!(may_retry(Class::Read, &err), "{err:?}");
            assert!(err.maybe_applied(), "{err:?}");
        }
        for err in [
            Error::PermissionDenied,
            Error::Compacted {
                compact_revision: None,
            },
            Error::RequestTooLarge,
            Error::from_status(Status::new(Code::InvalidArgument, "bad")),
            Error::Auth("etcdserver: invalid auth token".into()),
        ] {
            assert!(!may_retry(Class::Read, &err), "{err:?}");
            assert!(!err.maybe_applied(), "{err:?}");
        }
    }

    #[test]
    fn a_write_that_may_have_arrived_is_never_retried() {
        for err in [
            broke(),
            Error::Unavailable("operation was canceled: transport error: connection closed".into()),
            Error::Timeout(Duration::from_secs(1)),
            Error::NoLeader,
            Error::from_status(Status::unavailable("etcdserver: leader changed")),
        ] {
            assert!(!may_retry(Class::Write, &err), "{err:?}");
            // ... and says so, for the caller to decide.
            assert!(err.maybe_applied(), "{err:?}");
        }
        assert!(!refused().maybe_applied());
        assert!(!may_retry(Class::Write, &Error::TooManyOps));
    }
}
