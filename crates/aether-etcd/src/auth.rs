//! The auth service: the token, and the management of users, roles and
//! their permissions.
//!
//! Fetching a token stays the transport's job (every call needs it, and an
//! expired one is renewed in the middle of a call); this service hands it
//! on. Everything else here is etcd's `Auth` RPCs as plain values:
//!
//! - users: add (with a password, or without one for certificate-CN
//!   authentication), delete, get (its roles), list, change password,
//!   grant and revoke a role;
//! - roles: add, delete, get (its [`Permission`]s), list, grant and revoke
//!   a permission on a key, a range or a prefix;
//! - auth itself: enable, disable and status.
//!
//! Every call but `authenticate` needs the `root` role once auth is on.
//! etcd's refusals map to [`Error`] variants: [`Error::UserAlreadyExists`],
//! [`Error::UserNotFound`], [`Error::RoleAlreadyExists`],
//! [`Error::RoleNotFound`], [`Error::RoleNotGranted`],
//! [`Error::PermissionNotGranted`], [`Error::AuthNotEnabled`], and
//! [`Error::Unimplemented`] for [`Client::auth_status`](super::Client::auth_status)
//! on etcd 3.4, which has no `AuthStatus` RPC.
//!
//! The prefix helper uses `kv`'s [`prefix_end`], a pure function on bytes:
//! the one thing this service takes from another.

use bytes::Bytes;

use super::error::{Error, Result};
use super::header::Header;
use super::kv::prefix_end;
use super::pb::{
    PbAuthClient, PbAuthDisableRequest, PbAuthEnableRequest, PbAuthRoleAddRequest,
    PbAuthRoleDeleteRequest, PbAuthRoleGetRequest, PbAuthRoleGrantPermissionRequest,
    PbAuthRoleListRequest, PbAuthRoleRevokePermissionRequest, PbAuthStatusRequest,
    PbAuthUserAddRequest, PbAuthUserChangePasswordRequest, PbAuthUserDeleteRequest,
    PbAuthUserGetRequest, PbAuthUserGrantRoleRequest, PbAuthUserListRequest,
    PbAuthUserRevokeRoleRequest, PbPermission, PbPermissionType, PbUserAddOptions,
};
use super::transport::Transport;

/// An auth token etcd handed out: what every request of an authenticated
/// client carries (as the `token` metadata). Its `Debug` does not print
/// it: it is as good as the password until it expires.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken(String);

impl AuthToken {
    /// The token, as sent in the `token` metadata.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The token as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuthToken(<{} bytes>)", self.0.len())
    }
}

/// What a [`Permission`] allows on its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PermissionKind {
    /// Range, watch, and compares in a txn.
    Read,
    /// Put and delete.
    Write,
    /// Both.
    ReadWrite,
}

impl PermissionKind {
    /// etcdctl's name for it: `read`, `write` or `readwrite`.
    pub fn as_str(self) -> &'static str {
        match self {
            PermissionKind::Read => "read",
            PermissionKind::Write => "write",
            PermissionKind::ReadWrite => "readwrite",
        }
    }

    fn pb(self) -> PbPermissionType {
        match self {
            PermissionKind::Read => PbPermissionType::Read,
            PermissionKind::Write => PbPermissionType::Write,
            PermissionKind::ReadWrite => PbPermissionType::Readwrite,
        }
    }

    fn from_pb(t: i32) -> PermissionKind {
        match PbPermissionType::try_from(t) {
            Ok(PbPermissionType::Write) => PermissionKind::Write,
            Ok(PbPermissionType::Readwrite) => PermissionKind::ReadWrite,
            _ => PermissionKind::Read,
        }
    }
}

impl std::fmt::Display for PermissionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role's permission on one key or one range `[key, range_end)`.
///
/// ```
/// use aether_etcd::{Permission, PermissionKind};
///
/// // Like Go's `clientv3.WithPrefix()`: every key starting with the prefix.
/// let p = Permission::read_write("/aether/v1/regions/a/").with_prefix();
/// assert_eq!(p.kind, PermissionKind::ReadWrite);
/// assert_eq!(&p.range_end[..], b"/aether/v1/regions/a0");
/// assert!(p.is_prefix());
/// // One key: no range end.
/// assert!(Permission::read("/k").range_end.is_empty());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Permission {
    /// What it allows.
    pub kind: PermissionKind,
    /// The key, or the start of the range.
    pub key: Bytes,
    /// The end of the range, exclusive; empty for the one key, `[0]` for
    /// every key from `key` on.
    pub range_end: Bytes,
}

impl Permission {
    /// `kind` on the one key `key`.
    pub fn new(kind: PermissionKind, key: impl Into<Bytes>) -> Permission {
        Permission {
            kind,
            key: key.into(),
            range_end: Bytes::new(),
        }
    }

    /// Read on the one key `key` (see [`Permission::with_prefix`]).
    pub fn read(key: impl Into<Bytes>) -> Permission {
        Permission::new(PermissionKind::Read, key)
    }

    /// Write on the one key `key`.
    pub fn write(key: impl Into<Bytes>) -> Permission {
        Permission::new(PermissionKind::Write, key)
    }

    /// Read and write on the one key `key`.
    pub fn read_write(key: impl Into<Bytes>) -> Permission {
        Permission::new(PermissionKind::ReadWrite, key)
    }

    /// The same permission on every key that starts with `key` (Go's
    /// `clientv3.WithPrefix()`, etcdctl's `--prefix`). An empty key means
    /// every key.
    #[must_use]
    pub fn with_prefix(mut self) -> Permission {
        self.range_end = prefix_end(&self.key);
        self
    }

    /// The same permission on `[key, end)`.
    #[must_use]
    pub fn with_range_end(mut self, end: impl Into<Bytes>) -> Permission {
        self.range_end = end.into();
        self
    }

    /// The same permission on every key from `key` on (Go's
    /// `clientv3.WithFromKey()`, etcdctl's `--from-key`).
    #[must_use]
    pub fn with_from_key(mut self) -> Permission {
        self.range_end = Bytes::from_static(&[0]);
        self
    }

    /// Whether it covers exactly the keys starting with `key`.
    pub fn is_prefix(&self) -> bool {
        !self.range_end.is_empty() && self.range_end == prefix_end(&self.key)
    }

    fn pb(&self) -> PbPermission {
        PbPermission {
            perm_type: self.kind.pb() as i32,
            key: self.key.clone(),
            range_end: self.range_end.clone(),
        }
    }

    fn from_pb(p: PbPermission) -> Permission {
        Permission {
            kind: PermissionKind::from_pb(p.perm_type),
            key: p.key,
            range_end: p.range_end,
        }
    }
}

impl std::fmt::Debug for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Permission");
        d.field("kind", &self.kind)
            .field("key", &String::from_utf8_lossy(&self.key));
        if self.is_prefix() {
            d.field("prefix", &true);
        } else if !self.range_end.is_empty() {
            d.field("range_end", &String::from_utf8_lossy(&self.range_end));
        }
        d.finish()
    }
}

/// Options of [`Client::user_add_with_options`](super::Client::user_add_with_options).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserAddOptions {
    /// A user without a password, who can only authenticate with a TLS
    /// client certificate whose common name is the user name (etcd
    /// `--client-cert-auth`). The password given is ignored.
    pub no_password: bool,
}

impl UserAddOptions {
    /// The same options, the user without a password.
    #[must_use]
    pub fn no_password(mut self) -> UserAddOptions {
        self.no_password = true;
        self
    }
}

/// The answer to [`Client::user_get`](super::Client::user_get).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserInfo {
    /// The roles granted to the user.
    pub roles: Vec<String>,
    /// The response header.
    pub header: Header,
}

/// The answer to [`Client::role_get`](super::Client::role_get).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleInfo {
    /// The role's permissions, as etcd stores them (sorted by key).
    pub permissions: Vec<Permission>,
    /// The response header.
    pub header: Header,
}

/// The answer to [`Client::user_list`](super::Client::user_list) and
/// [`Client::role_list`](super::Client::role_list).
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameList {
    /// The names, sorted.
    pub names: Vec<String>,
    /// The response header.
    pub header: Header,
}

/// The answer to [`Client::auth_status`](super::Client::auth_status).
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthStatus {
    /// Whether auth is on.
    pub enabled: bool,
    /// The auth store's revision: it moves with every change to users,
    /// roles or permissions.
    pub auth_revision: u64,
    /// The response header.
    pub header: Header,
}

/// The auth service on a transport.
#[derive(Clone)]
pub(crate) struct AuthClient {
    transport: Transport,
}

/// One unary call of the auth service: `$method` with `$req`.
macro_rules! call {
    ($self:ident, $method:ident, $req:expr) => {
        $self
            .transport
            .unary($req, |svc, r| async move {
                PbAuthClient::new(svc).$method(r).await
            })
            .await
    };
}

impl AuthClient {
    pub(crate) fn new(transport: Transport) -> AuthClient {
        AuthClient { transport }
    }

    pub(crate) async fn authenticate(&self) -> Result<Option<AuthToken>> {
        Ok(self.transport.authenticate().await?.map(AuthToken))
    }

    pub(crate) async fn authenticate_as(&self, user: &str, password: &str) -> Result<AuthToken> {
        let creds = crate::transport::Credentials {
            user: user.to_string(),
            password: password.to_string(),
        };
        self.transport.fetch_token(&creds).await.map(AuthToken)
    }

    pub(crate) async fn auth_enable(&self) -> Result<Header> {
        Ok(call!(self, auth_enable, PbAuthEnableRequest {})?
            .header
            .into())
    }

    pub(crate) async fn auth_disable(&self) -> Result<Header> {
        Ok(call!(self, auth_disable, PbAuthDisableRequest {})?
            .header
            .into())
    }

    pub(crate) async fn auth_status(&self) -> Result<AuthStatus> {
        let resp = call!(self, auth_status, PbAuthStatusRequest {}).map_err(|e| match e {
            Error::Unimplemented(_) => {
                Error::Unimplemented("AuthStatus (etcd 3.4 has none; it came with 3.5)".into())
            }
            e => e,
        })?;
        Ok(AuthStatus {
            enabled: resp.enabled,
            auth_revision: resp.auth_revision,
            header: resp.header.into(),
        })
    }

    pub(crate) async fn user_add(
        &self,
        name: &str,
        password: &str,
        options: UserAddOptions,
    ) -> Result<Header> {
        let req = PbAuthUserAddRequest {
            name: name.to_owned(),
            password: if options.no_password {
                String::new()
            } else {
                password.to_owned()
            },
            options: Some(PbUserAddOptions {
                no_password: options.no_password,
            }),
            hashed_password: String::new(),
        };
        Ok(call!(self, user_add, req)?.header.into())
    }

    pub(crate) async fn user_delete(&self, name: &str) -> Result<Header> {
        let req = PbAuthUserDeleteRequest {
            name: name.to_owned(),
        };
        Ok(call!(self, user_delete, req)?.header.into())
    }

    pub(crate) async fn user_get(&self, name: &str) -> Result<UserInfo> {
        let req = PbAuthUserGetRequest {
            name: name.to_owned(),
        };
        let resp = call!(self, user_get, req)?;
        Ok(UserInfo {
            roles: resp.roles,
            header: resp.header.into(),
        })
    }

    pub(crate) async fn user_list(&self) -> Result<NameList> {
        let resp = call!(self, user_list, PbAuthUserListRequest {})?;
        Ok(NameList {
            names: resp.users,
            header: resp.header.into(),
        })
    }

    pub(crate) async fn user_change_password(&self, name: &str, password: &str) -> Result<Header> {
        let req = PbAuthUserChangePasswordRequest {
            name: name.to_owned(),
            password: password.to_owned(),
            hashed_password: String::new(),
        };
        Ok(call!(self, user_change_password, req)?.header.into())
    }

    pub(crate) async fn user_grant_role(&self, user: &str, role: &str) -> Result<Header> {
        let req = PbAuthUserGrantRoleRequest {
            user: user.to_owned(),
            role: role.to_owned(),
        };
        Ok(call!(self, user_grant_role, req)?.header.into())
    }

    pub(crate) async fn user_revoke_role(&self, user: &str, role: &str) -> Result<Header> {
        let req = PbAuthUserRevokeRoleRequest {
            name: user.to_owned(),
            role: role.to_owned(),
        };
        Ok(call!(self, user_revoke_role, req)?.header.into())
    }

    pub(crate) async fn role_add(&self, name: &str) -> Result<Header> {
        let req = PbAuthRoleAddRequest {
            name: name.to_owned(),
        };
        Ok(call!(self, role_add, req)?.header.into())
    }

    pub(crate) async fn role_delete(&self, name: &str) -> Result<Header> {
        let req = PbAuthRoleDeleteRequest {
            role: name.to_owned(),
        };
        Ok(call!(self, role_delete, req)?.header.into())
    }

    pub(crate) async fn role_get(&self, name: &str) -> Result<RoleInfo> {
        let req = PbAuthRoleGetRequest {
            role: name.to_owned(),
        };
        let resp = call!(self, role_get, req)?;
        Ok(RoleInfo {
            permissions: resp.perm.into_iter().map(Permission::from_pb).collect(),
            header: resp.header.into(),
        })
    }

    pub(crate) async fn role_list(&self) -> Result<NameList> {
        let resp = call!(self, role_list, PbAuthRoleListRequest {})?;
        Ok(NameList {
            names: resp.roles,
            header: resp.header.into(),
        })
    }

    pub(crate) async fn role_grant_permission(
        &self,
        role: &str,
        permission: &Permission,
    ) -> Result<Header> {
        let req = PbAuthRoleGrantPermissionRequest {
            name: role.to_owned(),
            perm: Some(permission.pb()),
        };
        Ok(call!(self, role_grant_permission, req)?.header.into())
    }

    pub(crate) async fn role_revoke_permission(
        &self,
        role: &str,
        key: Bytes,
        range_end: Bytes,
    ) -> Result<Header> {
        let req = PbAuthRoleRevokePermissionRequest {
            role: role.to_owned(),
            key,
            range_end,
        };
        Ok(call!(self, role_revoke_permission, req)?.header.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_and_ranges() {
        let p = Permission::read("/a/").with_prefix();
        assert_eq!(&p.range_end[..], b"/a0");
        assert!(p.is_prefix());
        assert_eq!(
            format!("{p:?}"),
            r#"Permission { kind: Read, key: "/a/", prefix: true }"#
        );
        let all = Permission::write("").with_prefix();
        assert_eq!(&all.range_end[..], &[0]);
        let r = Permission::read_write("/a").with_range_end("/c");
        assert!(!r.is_prefix());
        assert_eq!(
            format!("{r:?}"),
            r#"Permission { kind: ReadWrite, key: "/a", range_end: "/c" }"#
        );
        assert_eq!(Permission::read("/k").with_from_key().range_end, &[0][..]);
        for kind in [
            PermissionKind::Read,
            PermissionKind::Write,
            PermissionKind::ReadWrite,
        ] {
            assert_eq!(PermissionKind::from_pb(kind.pb() as i32), kind);
        }
        assert_eq!(PermissionKind::ReadWrite.to_string(), "readwrite");
    }
}
