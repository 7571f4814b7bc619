//! The client's one error type.
//!
//! etcd reports its conditions as gRPC statuses with fixed message strings
//! (`etcdserver: ...`). They are mapped to variants here, once, so callers
//! branch on `Error::Compacted` or `Error::LeaseNotFound` instead of matching
//! text.

use std::time::Duration;

/// What can go wrong talking to etcd.
///
/// No type of the gRPC stack appears in it: a status etcd sent that has no
/// variant of its own is [`Error::Server`], with the gRPC [`Code`] and the
/// message. New variants may come as etcd's API grows, hence
/// `#[non_exhaustive]`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration was refused before anything connected.
    #[error("invalid client config: {0}")]
    InvalidConfig(String),
    /// An argument the client refuses before sending anything (a lease
    /// TTL of zero), saying which and why.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A TLS file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file that could not be read.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// No member answered: connection refused, reset, or the stream broke.
    #[error("etcd unavailable: {0}")]
    Unavailable(String),
    /// The request did not complete within the per-request timeout.
    #[error("request timed out after {0:?}")]
    Timeout(Duration),
    /// etcd took the request but could not commit (or, for a
    /// linearizable read, confirm) it in time: the cluster has lost its
    /// quorum, is electing a leader, or is overloaded. etcd 3.4 says
    /// "etcdserver: request timed out" (with ", possibly due to previous
    /// leader failure" or "connection lost" after it), 3.4 and 3.5 then
    /// "context deadline exceeded"; with the quorum lost, after about 7 s,
    /// etcd's own limit. A write may still be applied once the cluster
    /// recovers ([`Error::maybe_applied`]); a read is tried again on
    /// another member, which may still have a quorum.
    #[error("etcd could not commit in time (no quorum, a leader election, or overload): {0}")]
    ServerTimeout(String),
    /// The TLS handshake with the member failed: its certificate is not
    /// trusted (another CA, another name, expired), or it refused the
    /// client's (missing or not trusted). A certificate or a CA needs
    /// fixing, so the call is not retried; the next call tries another
    /// member. [`std::error::Error::source`] walks the TLS stack's own
    /// errors.
    #[error("TLS handshake with {endpoint} failed: {message}")]
    Tls {
        /// The member's URL.
        endpoint: String,
        /// What the TLS stack said, e.g. "invalid peer certificate:
        /// UnknownIssuer" or "received fatal alert: BadCertificate".
        message: String,
        /// The errors under it, outermost first.
        #[source]
        source: Option<ErrorChain>,
    },
    /// The requested revision has been compacted. Watches carry the compact
    /// revision; a range at a compacted revision does not say it.
    #[error("required revision has been compacted (compact revision {compact_revision:?})")]
    Compacted {
        /// The oldest revision still available, when etcd said it.
        compact_revision: Option<i64>,
    },
    /// The requested revision is in the future.
    #[error("required revision is a future revision")]
    FutureRevision,
    /// A txn branch has more operations than `--max-txn-ops`.
    #[error("too many operations in txn request")]
    TooManyOps,
    /// The request exceeds `--max-request-bytes`.
    #[error("request is too large")]
    RequestTooLarge,
    /// The cluster is out of space: a NOSPACE alarm is raised and every
    /// write is refused until an operator compacts, defragments and
    /// disarms it. Retrying does not help.
    #[error("etcd is out of space (NOSPACE alarm): database space exceeded")]
    NoSpace,
    /// A response was larger than the client's decode limit
    /// (`ClientConfig::max_decoding_message_size`). Asking again gets the
    /// same response, so a watch that hits it ends with this error and the
    /// caller re-reads by range in smaller pieces.
    #[error("response larger than the client's limit of {limit} bytes")]
    ResponseTooLarge {
        /// The decode limit in force.
        limit: usize,
    },
    /// A put with [`Put::ignore_value`] or [`Put::ignore_lease`] on a key
    /// that does not exist: there is nothing to keep.
    ///
    /// [`Put::ignore_value`]: crate::Put::ignore_value
    /// [`Put::ignore_lease`]: crate::Put::ignore_lease
    #[error("key not found")]
    KeyNotFound,
    /// A put with [`Put::ignore_value`] that also gives a value.
    ///
    /// [`Put::ignore_value`]: crate::Put::ignore_value
    #[error("a value is provided with ignore_value")]
    ValueProvided,
    /// A put with [`Put::ignore_lease`] that also gives a lease.
    ///
    /// [`Put::ignore_lease`]: crate::Put::ignore_lease
    #[error("a lease is provided with ignore_lease")]
    LeaseProvided,
    /// A txn writes the same key twice.
    #[error("duplicate key given in txn request")]
    DuplicateKey,
    /// The lease does not exist (expired or revoked).
    #[error("requested lease not found")]
    LeaseNotFound,
    /// A lease granted with an id that exists already
    /// ([`Client::lease_grant_with_id`](crate::Client::lease_grant_with_id)).
    #[error("lease already exists")]
    LeaseExists,
    /// Authentication failed or the token was rejected: refused
    /// credentials, an invalid or expired token, a token older than the
    /// auth store's last change, or (auth enabled) a request without a user
    /// ("etcdserver: user name is empty", which used to be a bare
    /// status).
    #[error("authentication failed: {0}")]
    Auth(String),
    /// The user lacks permission for the request.
    #[error("permission denied")]
    PermissionDenied,
    /// Auth is not enabled on the cluster (a token was asked for, or a
    /// call needs auth on).
    #[error("authentication is not enabled")]
    AuthNotEnabled,
    /// A user of that name exists already.
    #[error("user name already exists")]
    UserAlreadyExists,
    /// No user of that name.
    #[error("user name not found")]
    UserNotFound,
    /// A role of that name exists already.
    #[error("role name already exists")]
    RoleAlreadyExists,
    /// No role of that name.
    #[error("role name not found")]
    RoleNotFound,
    /// The user does not have that role (revoking it).
    #[error("role is not granted to the user")]
    RoleNotGranted,
    /// The role has no permission on that key or range (revoking it).
    #[error("permission is not granted to the role")]
    PermissionNotGranted,
    /// A membership change was refused because of the member id: an
    /// add whose new id collides with an existing member's (ids are
    /// derived from the peer URLs and the time).
    #[error("member id already exists")]
    MemberExists,
    /// A member add or update names a peer URL another member already
    /// has.
    #[error("peer URLs already exist")]
    PeerUrlExists,
    /// A member add names no peer URL, or one that does not parse (etcd
    /// does not check the URLs of an update).
    #[error("given member URLs are invalid")]
    InvalidPeerUrls,
    /// No member has that id (remove, update, promote).
    #[error("member not found")]
    MemberNotFound,
    /// Promoting a member that is not a learner.
    #[error("can only promote a learner member")]
    MemberNotLearner,
    /// Promoting a learner that has not caught up with the leader's log
    /// yet (its log is under 90% of the leader's). Retry once it has: a
    /// learner that was just started catches up in moments, one that is
    /// not running never does.
    #[error("learner is not in sync with the leader yet")]
    LearnerNotReady,
    /// Adding a learner while the cluster has one already (etcd allows
    /// one at a time): promote or remove it first.
    #[error("too many learner members in cluster")]
    TooManyLearners,
    /// A membership change that would leave fewer started voting members
    /// than a quorum: adding a voter while an added one has not started,
    /// promoting or removing with too few members started.
    #[error("re-configuration failed due to not enough started members")]
    NotEnoughStartedMembers,
    /// A membership change refused to protect the quorum: the member that
    /// got it has not been connected to every voting member for the last
    /// 5 s (add), or would be left without an active quorum (remove). It
    /// may pass once the members have been connected for that long.
    #[error("etcd: unhealthy cluster")]
    UnhealthyCluster,
    /// The member that answered is not the raft leader, and the request
    /// must be sent to it ([`Client::move_leader`](super::Client::move_leader)).
    /// Not [`Error::NotLeader`], the election's.
    #[error("etcd member is not the raft leader")]
    NotRaftLeader,
    /// A leader transfer to a member that does not exist or is a learner.
    #[error("bad leader transferee")]
    BadLeaderTransferee,
    /// The server does not implement the call: an etcd older than the API
    /// (3.4 has no `AuthStatus`).
    #[error("not implemented by this etcd: {0}")]
    Unimplemented(String),
    /// A downgrade to a version that is not exactly one minor release
    /// below the cluster's, or not a version at all.
    #[error("invalid downgrade target version: {0}")]
    InvalidDowngradeTarget(String),
    /// A downgrade validate or enable while one is in progress.
    #[error("the cluster has a downgrade in progress")]
    DowngradeInProgress,
    /// A downgrade cancel with none in progress.
    #[error("no downgrade in progress")]
    NoDowngradeInProgress,
    /// The cluster has no leader.
    #[error("etcd has no leader")]
    NoLeader,
    /// The watch was canceled by the server for a reason other than compaction.
    #[error("watch canceled: {0}")]
    WatchCanceled(String),
    /// A proclaim from a candidate that does not (or no longer) lead the
    /// election.
    #[error("election: not leader")]
    NotLeader,
    /// `try_lock` found the lock held by another session.
    #[error("mutex: locked by another session")]
    Locked,
    /// The session's lease expired or was revoked while waiting; its keys
    /// are gone.
    #[error("session expired")]
    SessionExpired,
    /// The client's background task is gone (the client was dropped).
    #[error("client task closed")]
    Closed,
    /// Any other status from etcd (or from the gRPC layer on its behalf).
    #[error("etcd: {code:?}: {message}")]
    Server {
        /// The gRPC status code.
        code: Code,
        /// The status message, as etcd sent it.
        message: String,
    },
}

/// A gRPC status code, as carried by [`Error::Server`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)] // The names are gRPC's own (grpc/doc/statuscodes.md).
pub enum Code {
    Ok,
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

// Not a public `From`: no tonic type is part of this crate's API.
impl Code {
    pub(crate) fn of(code: tonic::Code) -> Code {
        use tonic::Code as T;
        match code {
            T::Ok => Code::Ok,
            T::Cancelled => Code::Cancelled,
            T::Unknown => Code::Unknown,
            T::InvalidArgument => Code::InvalidArgument,
            T::DeadlineExceeded => Code::DeadlineExceeded,
            T::NotFound => Code::NotFound,
            T::AlreadyExists => Code::AlreadyExists,
            T::PermissionDenied => Code::PermissionDenied,
            T::ResourceExhausted => Code::ResourceExhausted,
            T::FailedPrecondition => Code::FailedPrecondition,
            T::Aborted => Code::Aborted,
            T::OutOfRange => Code::OutOfRange,
            T::Unimplemented => Code::Unimplemented,
            T::Internal => Code::Internal,
            T::Unavailable => Code::Unavailable,
            T::DataLoss => Code::DataLoss,
            T::Unauthenticated => Code::Unauthenticated,
        }
    }
}

/// One link of an error's source chain, kept as text: the transport's own
/// error types are not part of this crate's API.
#[derive(Debug, Clone)]
pub struct ErrorChain {
    text: String,
    source: Option<Box<ErrorChain>>,
}

impl ErrorChain {
    /// The chain of `texts`, outermost first; `None` when empty.
    fn of(mut texts: impl Iterator<Item = String>) -> Option<ErrorChain> {
        let text = texts.next()?;
        Some(ErrorChain {
            text,
            source: ErrorChain::of(texts).map(Box::new),
        })
    }
}

impl std::fmt::Display for ErrorChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for ErrorChain {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|s| s as _)
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether retrying on another connection may succeed: the member was
    /// unreachable, timed out, had no leader, or could not commit in time.
    /// Not a TLS failure: another attempt meets the same certificates.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Unavailable(_) | Error::Timeout(_) | Error::ServerTimeout(_) | Error::NoLeader
        ) || matches!(
            self,
            Error::Server {
                code: Code::Unavailable,
                ..
            }
        )
    }

    /// The token is no longer valid; re-authenticating may help. Exactly
    /// the refusals Go's clientv3 refreshes its token on
    /// (`shouldRefreshToken`): an invalid or expired token, a token older
    /// than the auth store's last change, and a request that reached the
    /// server without a user (a token cleared or not yet known to the
    /// member). Not any message that mentions a token: refused
    /// credentials or a malformed token are not cured by asking again.
    pub(crate) fn is_invalid_token(&self) -> bool {
        matches!(self, Error::Auth(m) if is_token_refusal(m))
    }

    /// The request never reached a server (the connection could not be
    /// made), so it is safe to send it again elsewhere.
    pub(crate) fn not_sent(&self) -> bool {
        matches!(self, Error::Unavailable(m) if NOT_SENT.iter().any(|s| m.contains(s)))
    }

    /// The call failed in a way that leaves its outcome unknown: it may
    /// have reached etcd and been applied (the connection broke or the
    /// call timed out after it was sent, or the member lost its leader
    /// meanwhile). The client never sends such a write again by itself
    /// (see [`RetryPolicy`](crate::RetryPolicy)); the caller decides, for
    /// example by reading the key back or by making the write a txn that
    /// can tell it already happened.
    ///
    /// ```no_run
    /// # async fn demo(client: aether_etcd::Client) -> aether_etcd::Result<()> {
    /// use aether_etcd::Put;
    /// match client.put(Put::new("/job/42", "done")).await {
    ///     Ok(_) => {}
    ///     Err(e) if e.maybe_applied() => { /* read /job/42 back before repeating */ }
    ///     Err(e) => return Err(e), // refused: certainly not applied
    /// }
    /// # Ok(()) }
    /// ```
    pub fn maybe_applied(&self) -> bool {
        self.is_transient() && !self.not_sent()
    }
}

/// What tonic (hyper-util, rustls) says when a connection could not be
/// made, so no request went out: the TCP connect failed (refused, timed
/// out), the name did not resolve, or the client refused the server's
/// certificate before sending anything. Not "connection": a connection
/// that broke under a request ("connection error: stream closed because of
/// a broken pipe", "connection closed") may have delivered it.
const NOT_SENT: [&str; 3] = ["tcp connect error", "Connection refused", "dns error"];

/// What rustls says, somewhere in a connection error's chain, when the
/// handshake failed: the client refused the server's certificate, or the
/// server refused the client's (its alert). Provoked against 3.4.23 and
/// 3.5.1 in `tests/client_errors.rs`.
const TLS_FAILURES: [&str; 3] = [
    "invalid peer certificate",
    "received fatal alert",
    "peer is incompatible",
];

/// etcd's messages for a request it took but could not commit or confirm
/// in time ([`Error::ServerTimeout`]), provoked against 3.4.23 and 3.5.1
/// with the quorum lost in `tests/client_errors.rs`. The 3.4 ones share
/// their start ("etcdserver: request timed out, possibly due to ...").
const SERVER_TIMEOUTS: [&str; 2] = ["etcdserver: request timed out", "context deadline exceeded"];

/// etcd's messages (`rpctypes`) for a request whose token it would not
/// use, provoked against 3.4.23 and 3.5.1 in `tests/client.rs`. 3.5.1
/// sends a token older than the auth store with the auth package's own
/// text ("auth: revision in header is old", code Unknown) instead of the
/// `rpctypes` one 3.4 sends.
const TOKEN_REFUSALS: [&str; 4] = [
    "etcdserver: invalid auth token",
    "etcdserver: revision of auth store is old",
    "auth: revision in header is old",
    "etcdserver: user name is empty",
];

/// Whether `msg` is one of etcd's token refusals ([`TOKEN_REFUSALS`]), as
/// a status message or as the end of a watch's cancel reason (3.5 and
/// 3.4.23 send "rpc error: code = Unauthenticated desc = etcdserver:
/// invalid auth token").
pub(crate) fn is_token_refusal(msg: &str) -> bool {
    TOKEN_REFUSALS.iter().any(|r| msg.ends_with(r))
}

impl Error {
    /// An error etcd (or the gRPC layer) did not give a variant of its own.
    pub(crate) fn server(code: Code, message: impl Into<String>) -> Error {
        Error::Server {
            code,
            message: message.into(),
        }
    }
}

// The one place a gRPC status becomes an `Error`. Not a public `From`: no
// tonic type is part of this crate's API.
impl Error {
    pub(crate) fn from_status(status: tonic::Status) -> Self {
        use tonic::Code;
        let msg = status.message();
        let has = |s: &str| msg.contains(s);
        match status.code() {
            _ if has("required revision has been compacted") => Error::Compacted {
                compact_revision: None,
            },
            _ if has("required revision is a future revision") => Error::FutureRevision,
            _ if has("too many operations in txn request") => Error::TooManyOps,
            _ if has("request is too large") => Error::RequestTooLarge,
            Code::ResourceExhausted if has("larger than max") => Error::RequestTooLarge,
            _ if has("duplicate key given in txn request") => Error::DuplicateKey,
            // The full texts: "not found" alone is in several other messages.
            Code::InvalidArgument if has("etcdserver: key not found") => Error::KeyNotFound,
            Code::InvalidArgument if has("etcdserver: value is provided") => Error::ValueProvided,
            Code::InvalidArgument if has("etcdserver: lease is provided") => Error::LeaseProvided,
            _ if has("database space exceeded") => Error::NoSpace,
            Code::OutOfRange | Code::ResourceExhausted | Code::Internal
                if has("decoded message length too large") =>
            {
                let limit = msg
                    .split("the limit is: ")
                    .nth(1)
                    .and_then(|t| t.split(' ').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                Error::ResponseTooLarge { limit }
            }
            _ if has("requested lease not found") => Error::LeaseNotFound,
            _ if has("lease already exists") => Error::LeaseExists,
            _ if has("no leader") => Error::NoLeader,
            _ if has("authentication is not enabled") => Error::AuthNotEnabled,
            _ if has("user name already exists") => Error::UserAlreadyExists,
            _ if has("user name not found") => Error::UserNotFound,
            _ if has("role name already exists") => Error::RoleAlreadyExists,
            _ if has("role name not found") => Error::RoleNotFound,
            _ if has("role is not granted to the user") => Error::RoleNotGranted,
            _ if has("permission is not granted to the role") => Error::PermissionNotGranted,
            // Membership changes (`rpctypes`), the same text on 3.4 and 3.5.
            // The promote refusals share a prefix: the longer one first.
            _ if has("can only promote a learner member which is in sync with leader") => {
                Error::LearnerNotReady
            }
            _ if has("can only promote a learner member") => Error::MemberNotLearner,
            _ if has("etcdserver: member ID already exist") => Error::MemberExists,
            _ if has("etcdserver: Peer URLs already exists") => Error::PeerUrlExists,
            _ if has("etcdserver: given member URLs are invalid") => Error::InvalidPeerUrls,
            _ if has("etcdserver: member not found") => Error::MemberNotFound,
            _ if has("etcdserver: too many learner members in cluster") => Error::TooManyLearners,
            _ if has("not enough started members") => Error::NotEnoughStartedMembers,
            // Code Unavailable, but not a connection failure: another
            // member would refuse the same, so it is no reason to fail over.
            _ if has("etcdserver: unhealthy cluster") => Error::UnhealthyCluster,
            _ if has("etcdserver: not leader") => Error::NotRaftLeader,
            _ if has("etcdserver: bad leader transferee") => Error::BadLeaderTransferee,
            // Downgrade (3.5's `rpctypes`).
            _ if has("etcdserver: invalid downgrade target version")
                || has("etcdserver: wrong downgrade target version format") =>
            {
                Error::InvalidDowngradeTarget(msg.to_string())
            }
            _ if has("etcdserver: cluster has a downgrade job in progress") => {
                Error::DowngradeInProgress
            }
            _ if has("etcdserver: no inflight downgrade job") => Error::NoDowngradeInProgress,
            Code::Unimplemented => Error::Unimplemented(msg.to_string()),
            Code::Unauthenticated => Error::Auth(msg.to_string()),
            _ if has("authentication failed") || TOKEN_REFUSALS.iter().any(|r| has(r)) => {
                Error::Auth(msg.to_string())
            }
            Code::PermissionDenied => Error::PermissionDenied,
            _ if status_is_transport(&status) && chain_has(&status, &TLS_FAILURES) => {
                tls_error(&status)
            }
            // The server's own timeouts: not the client's deadline (tonic
            // reports that as DeadlineExceeded, with the client's text).
            Code::Unavailable | Code::Unknown
                if !status_is_transport_error(&status)
                    && SERVER_TIMEOUTS.iter().any(|t| msg.starts_with(t)) =>
            {
                Error::ServerTimeout(msg.to_string())
            }
            Code::Unavailable | Code::Unknown | Code::Cancelled if status_is_transport(&status) => {
                Error::Unavailable(transport_message(&status))
            }
            Code::Unavailable => Error::Unavailable(msg.to_string()),
            Code::DeadlineExceeded => Error::Timeout(Duration::ZERO),
            code => Error::Server {
                code: self::Code::of(code),
                message: msg.to_string(),
            },
        }
    }
}

/// A status that tonic synthesised from a connection failure rather than one
/// the server sent.
fn status_is_transport(status: &tonic::Status) -> bool {
    status_is_transport_error(status) || status.code() == tonic::Code::Unavailable
}

/// Whether tonic made `status` from a transport error (it has a source),
/// rather than etcd sending it.
fn status_is_transport_error(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some()
}

/// The texts of `status` and its sources, outermost first.
fn chain_texts(status: &tonic::Status) -> Vec<String> {
    let mut texts = vec![status.message().to_string()];
    let mut src = std::error::Error::source(status);
    while let Some(e) = src {
        texts.push(e.to_string());
        src = e.source();
    }
    texts
}

/// Whether any link of `status`'s chain says one of `markers`.
fn chain_has(status: &tonic::Status, markers: &[&str]) -> bool {
    chain_texts(status)
        .iter()
        .any(|t| markers.iter().any(|m| t.contains(m)))
}

/// [`Error::Tls`] of a transport status: its message is the most specific
/// link that names the TLS failure. The endpoint is filled in by the
/// transport, which knows which member it dialled.
fn tls_error(status: &tonic::Status) -> Error {
    let texts = chain_texts(status);
    let message = texts
        .iter()
        .rev()
        .find(|t| TLS_FAILURES.iter().any(|m| t.contains(m)))
        .cloned()
        .unwrap_or_else(|| status.message().to_string());
    Error::Tls {
        endpoint: String::new(),
        message,
        source: ErrorChain::of(texts.into_iter().skip(1)),
    }
}

/// The status message with its source chain, so "connection refused" is visible.
fn transport_message(status: &tonic::Status) -> String {
    // Each layer tends to repeat its source's text; keep only what adds.
    let mut texts = chain_texts(status).into_iter();
    let mut out = texts.next().unwrap_or_default();
    for text in texts {
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::{Code, Status};

    #[test]
    fn etcds_timeouts_are_one_kind_that_may_have_applied() {
        for (code, msg) in [
            (Code::Unavailable, "etcdserver: request timed out"),
            (
                Code::Unavailable,
                "etcdserver: request timed out, possibly due to previous leader failure",
            ),
            (
                Code::Unavailable,
                "etcdserver: request timed out, possibly due to connection lost",
            ),
            (Code::Unknown, "context deadline exceeded"),
        ] {
            let err = Error::from_status(Status::new(code, msg));
            assert!(
                matches!(&err, Error::ServerTimeout(m) if m == msg),
                "{msg}: {err:?}"
            );
            assert!(err.is_transient() && err.maybe_applied(), "{msg}");
        }
        // The client's own deadline stays the client's.
        let err = Error::from_status(Status::new(Code::DeadlineExceeded, "Timeout expired"));
        assert!(matches!(err, Error::Timeout(_)), "{err:?}");
    }

    #[test]
    fn maps_etcd_conditions() {
        let cases = [
            (
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
            ),
            (
                Code::InvalidArgument,
                "etcdserver: too many operations in txn request",
            ),
            (Code::InvalidArgument, "etcdserver: request is too large"),
            (
                Code::InvalidArgument,
                "etcdserver: duplicate key given in txn request",
            ),
            (Code::NotFound, "etcdserver: requested lease not found"),
            (Code::Unavailable, "etcdserver: no leader"),
            (Code::Unauthenticated, "etcdserver: invalid auth token"),
            (Code::PermissionDenied, "etcdserver: permission denied"),
            (
                Code::FailedPrecondition,
                "etcdserver: user name already exists",
            ),
            (Code::FailedPrecondition, "etcdserver: role name not found"),
            (
                Code::FailedPrecondition,
                "etcdserver: authentication is not enabled",
            ),
            (
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
            ),
            (
                Code::FailedPrecondition,
                "etcdserver: member ID already exist",
            ),
            (
                Code::FailedPrecondition,
                "etcdserver: Peer URLs already exists",
            ),
            (
                Code::InvalidArgument,
                "etcdserver: given member URLs are invalid",
            ),
            (Code::NotFound, "etcdserver: member not found"),
            (
                Code::FailedPrecondition,
                "etcdserver: can only promote a learner member",
            ),
            (
                Code::FailedPrecondition,
                "etcdserver: can only promote a learner member which is in sync with leader",
            ),
            (
                Code::FailedPrecondition,
                "etcdserver: too many learner members in cluster",
            ),
            // etcd maps this one to a plain error, which gRPC sends as Unknown.
            (
                Code::Unknown,
                "etcdserver: re-configuration failed due to not enough started members",
            ),
            (Code::Unavailable, "etcdserver: unhealthy cluster"),
            (Code::FailedPrecondition, "etcdserver: not leader"),
            (
                Code::FailedPrecondition,
                "etcdserver: bad leader transferee",
            ),
        ];
        let got: Vec<String> = cases
            .iter()
            .map(|(c, m)| format!("{:?}", Error::from_status(Status::new(*c, *m))))
            .collect();
        let want = [
            "Compacted { compact_revision: None }",
            "TooManyOps",
            "RequestTooLarge",
            "DuplicateKey",
            "LeaseNotFound",
            "NoLeader",
            "Auth(\"etcdserver: invalid auth token\")",
            "PermissionDenied",
            "UserAlreadyExists",
            "RoleNotFound",
            "AuthNotEnabled",
            "NoSpace",
            "MemberExists",
            "PeerUrlExists",
            "InvalidPeerUrls",
            "MemberNotFound",
            "MemberNotLearner",
            "LearnerNotReady",
            "TooManyLearners",
            "NotEnoughStartedMembers",
            "UnhealthyCluster",
            "NotRaftLeader",
            "BadLeaderTransferee",
        ];
        assert_eq!(got, want);
        assert!(
            Error::from_status(Status::new(
                Code::Unauthenticated,
                "etcdserver: invalid auth token"
            ))
            .is_invalid_token()
        );
        assert!(matches!(
            Error::from_status(Status::out_of_range(
                "Error, decoded message length too large: found 9000 bytes, the limit is: 4096 bytes"
            )),
            Error::ResponseTooLarge { limit: 4096 }
        ));
        // Exactly etcd's token refusals ask for a new token.
        for m in TOKEN_REFUSALS {
            for c in [Code::Unauthenticated, Code::InvalidArgument] {
                let e = Error::from_status(Status::new(c, m));
                assert!(e.is_invalid_token(), "{m} {c:?}: {e:?}");
            }
        }
        for e in [
            Error::from_status(Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password",
            )),
            Error::from_status(Status::unauthenticated("proxy: missing bearer token")),
            Error::Auth("server sent a token that is not ASCII".into()),
            Error::from_status(Status::permission_denied("etcdserver: permission denied")),
        ] {
            assert!(!e.is_invalid_token(), "{e:?}");
        }
        // A quorum refusal is no reason to fail over to another member.
        assert!(
            !Error::from_status(Status::unavailable("etcdserver: unhealthy cluster"))
                .is_transient()
        );
        assert!(Error::from_status(Status::unavailable("x")).is_transient());
        assert!(!Error::TooManyOps.is_transient());
    }

    /// The refusals of a put that keeps its value or lease, and not the
    /// other "not found" messages.
    #[test]
    fn maps_put_ignore_refusals() {
        let e = |m: &str| Error::from_status(Status::invalid_argument(m));
        assert!(matches!(e("etcdserver: key not found"), Error::KeyNotFound));
        assert!(matches!(
            e("etcdserver: value is provided"),
            Error::ValueProvided
        ));
        assert!(matches!(
            e("etcdserver: lease is provided"),
            Error::LeaseProvided
        ));
        assert!(matches!(
            e("etcdserver: user name not found"),
            Error::UserNotFound
        ));
        assert!(matches!(
            Error::from_status(Status::not_found("etcdserver: requested lease not found")),
            Error::LeaseNotFound
        ));
        assert!(matches!(
            Error::from_status(Status::failed_precondition(
                "etcdserver: lease already exists"
            )),
            Error::LeaseExists
        ));
    }
}
