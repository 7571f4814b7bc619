//! Generated protobuf and gRPC code for etcd's v3 API.
//!
//! Everything here is private to the crate: the public API is the hand-written
//! wrappers in the sibling modules, and the `Pb*` aliases keep the generated
//! names out of the rest of the code.

#![allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    dead_code,
    unreachable_pub
)]

pub(crate) mod mvccpb {
    tonic::include_proto!("mvccpb");
}
pub(crate) mod authpb {
    tonic::include_proto!("authpb");
}
pub(crate) mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

pub(crate) use etcdserverpb::{
    AuthenticateRequest as PbAuthenticateRequest, CompactionRequest as PbCompactionRequest,
    Compare as PbCompare, DeleteRangeRequest as PbDeleteRangeRequest,
    DeleteRangeResponse as PbDeleteRangeResponse, LeaseGrantRequest as PbLeaseGrantRequest,
    LeaseKeepAliveRequest as PbLeaseKeepAliveRequest,
    LeaseKeepAliveResponse as PbLeaseKeepAliveResponse, LeaseRevokeRequest as PbLeaseRevokeRequest,
    LeaseTimeToLiveRequest as PbLeaseTimeToLiveRequest, PutRequest as PbPutRequest,
    PutResponse as PbPutResponse, RangeRequest as PbRangeRequest, RangeResponse as PbRangeResponse,
    RequestOp as PbRequestOp, ResponseHeader as PbResponseHeader, StatusRequest as PbStatusRequest,
    TxnRequest as PbTxnRequest, TxnResponse as PbTxnResponse,
    WatchCancelRequest as PbWatchCancelRequest, WatchCreateRequest as PbWatchCreateRequest,
    WatchProgressRequest as PbWatchProgressRequest, WatchRequest as PbWatchRequest,
    WatchResponse as PbWatchResponse, auth_client::AuthClient as PbAuthClient,
    compare as pb_compare, kv_client::KvClient as PbKvClient,
    lease_client::LeaseClient as PbLeaseClient,
    maintenance_client::MaintenanceClient as PbMaintenanceClient, request_op::Request as PbOp,
    response_op::Response as PbOpResponse, watch_client::WatchClient as PbWatchClient,
    watch_request::RequestUnion as PbWatchRequestUnion,
};
// Cluster, maintenance and sorted-range types used by the client APIs in
// `cluster.rs`, `maintenance.rs` and `kv/range_opts.rs`.
pub(crate) use etcdserverpb::{
    AlarmRequest as PbAlarmRequest, AlarmType as PbAlarmType,
    DefragmentRequest as PbDefragmentRequest, HashKvRequest as PbHashKvRequest,
    MemberListRequest as PbMemberListRequest, alarm_request::AlarmAction as PbAlarmAction,
    cluster_client::ClusterClient as PbClusterClient, range_request::SortOrder as PbSortOrder,
    range_request::SortTarget as PbSortTarget,
};
// Watch filters, in `watch/options.rs`.
pub(crate) use etcdserverpb::watch_create_request::FilterType as PbWatchFilter;
// The auth service's management calls, in `auth.rs`.
pub(crate) use authpb::{
    Permission as PbPermission, UserAddOptions as PbUserAddOptions,
    permission::Type as PbPermissionType,
};
pub(crate) use etcdserverpb::{
    AuthDisableRequest as PbAuthDisableRequest, AuthEnableRequest as PbAuthEnableRequest,
    AuthRoleAddRequest as PbAuthRoleAddRequest, AuthRoleDeleteRequest as PbAuthRoleDeleteRequest,
    AuthRoleGetRequest as PbAuthRoleGetRequest,
    AuthRoleGrantPermissionRequest as PbAuthRoleGrantPermissionRequest,
    AuthRoleListRequest as PbAuthRoleListRequest,
    AuthRoleRevokePermissionRequest as PbAuthRoleRevokePermissionRequest,
    AuthStatusRequest as PbAuthStatusRequest, AuthUserAddRequest as PbAuthUserAddRequest,
    AuthUserChangePasswordRequest as PbAuthUserChangePasswordRequest,
    AuthUserDeleteRequest as PbAuthUserDeleteRequest, AuthUserGetRequest as PbAuthUserGetRequest,
    AuthUserGrantRoleRequest as PbAuthUserGrantRoleRequest,
    AuthUserListRequest as PbAuthUserListRequest,
    AuthUserRevokeRoleRequest as PbAuthUserRevokeRoleRequest,
};
pub(crate) use mvccpb::{
    Event as PbEvent, KeyValue as PbKeyValue, event::EventType as PbEventType,
};
// Membership changes, the snapshot stream, leader transfer, the backend
// hash (`cluster.rs`, `maintenance.rs`) and the lease list (`lease.rs`).
pub(crate) use etcdserverpb::{
    HashRequest as PbHashRequest, LeaseLeasesRequest as PbLeaseLeasesRequest, Member as PbMember,
    MemberAddRequest as PbMemberAddRequest, MemberPromoteRequest as PbMemberPromoteRequest,
    MemberRemoveRequest as PbMemberRemoveRequest, MemberUpdateRequest as PbMemberUpdateRequest,
    MoveLeaderRequest as PbMoveLeaderRequest, SnapshotRequest as PbSnapshotRequest,
    SnapshotResponse as PbSnapshotResponse,
};
// Downgrade (`maintenance.rs`), etcd 3.5's.
pub(crate) use etcdserverpb::{
    DowngradeRequest as PbDowngradeRequest, downgrade_request::DowngradeAction as PbDowngradeAction,
};
