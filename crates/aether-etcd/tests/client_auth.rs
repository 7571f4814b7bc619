//! The client's auth management API against real etcd: users, roles,
//! permissions, enabling, disabling and status, and what etcd then lets
//! each user do.

use aether_etcd::{
    Client, ClientConfig, Error, Permission, PermissionKind, Put, Range, UserAddOptions,
};
use aether_test_kit::Etcd;

fn plain(etcd: &Etcd) -> Client {
    Client::connect(ClientConfig::new(etcd.endpoints())).expect("client")
}

fn as_user(etcd: &Etcd, user: &str, password: &str) -> Client {
    Client::connect(etcd.client_config_as(user, password)).expect("client")
}

/// Whether the etcd under test is 3.4 (no `AuthStatus`).
async fn is_3_4(c: &Client) -> bool {
    c.status().await.unwrap().version.starts_with("3.4.")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_and_permissions_are_managed_and_read_back() {
    let etcd = Etcd::start();
    let c = plain(&etcd);

    c.role_add("reader").await.unwrap();
    let again = c.role_add("reader").await;
    assert!(matches!(again, Err(Error::RoleAlreadyExists)), "{again:?}");
    let granted = [
        Permission::read("/app/").with_prefix(),
        Permission::read_write("/app/own"),
        Permission::write("/w/a").with_range_end("/w/c"),
        Permission::read("/z").with_from_key(),
    ];
    for p in &granted {
        c.role_grant_permission("reader", p).await.unwrap();
    }
    let got = c.role_get("reader").await.unwrap().permissions;
    let mut want = granted.to_vec();
    want.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(got, want);
    assert!(got[0].is_prefix());

    // Granting on the same key and range replaces the kind.
    c.role_grant_permission("reader", &Permission::read("/app/own"))
        .await
        .unwrap();
    let own = c.role_get("reader").await.unwrap().permissions;
    let own = own.iter().find(|p| p.key == "/app/own").unwrap();
    assert_eq!(own.kind, PermissionKind::Read);

    c.role_revoke_permission("reader", "/app/own", "")
        .await
        .unwrap();
    let again = c.role_revoke_permission("reader", "/app/own", "").await;
    assert!(
        matches!(again, Err(Error::PermissionNotGranted)),
        "{again:?}"
    );
    // A prefix is revoked by its exact range.
    let prefix = Permission::read("/app/").with_prefix();
    c.role_revoke_permission("reader", prefix.key.clone(), prefix.range_end.clone())
        .await
        .unwrap();
    let keys: Vec<_> = c
        .role_get("reader")
        .await
        .unwrap()
        .permissions
        .into_iter()
        .map(|p| p.key)
        .collect();
    assert_eq!(keys, ["/w/a", "/z"]);

    c.role_add("writer").await.unwrap();
    let roles = c.role_list().await.unwrap().names;
    assert_eq!(roles, ["reader", "writer"]);
    c.role_delete("writer").await.unwrap();
    let gone = c.role_get("writer").await;
    assert!(matches!(gone, Err(Error::RoleNotFound)), "{gone:?}");
    let gone = c.role_delete("writer").await;
    assert!(matches!(gone, Err(Error::RoleNotFound)), "{gone:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_are_managed_and_read_back() {
    let etcd = Etcd::start();
    let c = plain(&etcd);

    c.user_add("alice", "pw1").await.unwrap();
    let again = c.user_add("alice", "other").await;
    assert!(matches!(again, Err(Error::UserAlreadyExists)), "{again:?}");
    c.user_add_with_options("cn-only", "", UserAddOptions::default().no_password())
        .await
        .unwrap();
    assert_eq!(c.user_list().await.unwrap().names, ["alice", "cn-only"]);
    assert!(c.user_get("cn-only").await.unwrap().roles.is_empty());

    c.role_add("reader").await.unwrap();
    c.role_add("writer").await.unwrap();
    c.user_grant_role("alice", "writer").await.unwrap();
    c.user_grant_role("alice", "reader").await.unwrap();
    // Granting again is no error.
    c.user_grant_role("alice", "reader").await.unwrap();
    assert_eq!(
        c.user_get("alice").await.unwrap().roles,
        ["reader", "writer"]
    );
    let missing = c.user_grant_role("alice", "nope").await;
    assert!(matches!(missing, Err(Error::RoleNotFound)), "{missing:?}");

    c.user_revoke_role("alice", "writer").await.unwrap();
    let again = c.user_revoke_role("alice", "writer").await;
    assert!(matches!(again, Err(Error::RoleNotGranted)), "{again:?}");
    assert_eq!(c.user_get("alice").await.unwrap().roles, ["reader"]);
    // Deleting a role takes it from its users.
    c.role_delete("reader").await.unwrap();
    assert!(c.user_get("alice").await.unwrap().roles.is_empty());

    c.user_change_password("alice", "pw2").await.unwrap();
    c.user_delete("cn-only").await.unwrap();
    for r in [
        c.user_get("cn-only").await.map(|_| ()),
        c.user_delete("cn-only").await.map(|_| ()),
        c.user_change_password("nobody", "x").await.map(|_| ()),
    ] {
        assert!(matches!(r, Err(Error::UserNotFound)), "{r:?}");
    }
    assert_eq!(c.user_list().await.unwrap().names, ["alice"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enabled_auth_lets_each_user_do_what_its_roles_allow() {
    let etcd = Etcd::start();
    let c = plain(&etcd);
    let v34 = is_3_4(&c).await;

    // Status before: off (3.5), or the clear "not implemented" of 3.4.
    match c.auth_status().await {
        Ok(s) => {
            assert!(!v34, "3.4 answered AuthStatus: {s:?}");
            assert!(!s.enabled);
        }
        Err(Error::Unimplemented(m)) => assert!(v34, "{m}"),
        Err(e) => panic!("auth_status: {e:?}"),
    }
    // No token to be had while auth is off.
    let early = as_user(&etcd, "root", "rootpw").authenticate().await;
    assert!(matches!(early, Err(Error::AuthNotEnabled)), "{early:?}");

    // etcd refuses to enable auth without a root user with the root role.
    assert!(c.auth_enable().await.is_err());
    c.user_add("root", "rootpw").await.unwrap();
    c.role_add("root").await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.role_add("app").await.unwrap();
    c.role_grant_permission("app", &Permission::read("/app/").with_prefix())
        .await
        .unwrap();
    c.role_grant_permission("app", &Permission::read_write("/app/mine/").with_prefix())
        .await
        .unwrap();
    c.user_add("alice", "pw1").await.unwrap();
    c.user_grant_role("alice", "app").await.unwrap();
    c.put(Put::new("/app/theirs", "x")).await.unwrap();
    c.auth_enable().await.unwrap();

    // Without credentials, nothing more.
    assert!(c.put(Put::new("/app/x", "1")).await.is_err());
    let root = as_user(&etcd, "root", "rootpw");
    if !v34 {
        let s = root.auth_status().await.unwrap();
        assert!(s.enabled);
        assert!(s.auth_revision > 0);
    }

    let alice = as_user(&etcd, "alice", "pw1");
    alice.put(Put::new("/app/mine/k", "1")).await.unwrap();
    let read = alice.range(Range::prefix("/app/")).await.unwrap();
    assert_eq!(read.kvs().len(), 2);
    for key in ["/app/theirs", "/other"] {
        let r = alice.put(Put::new(key, "2")).await;
        assert!(matches!(r, Err(Error::PermissionDenied)), "{key}: {r:?}");
    }
    let r = alice.range(Range::prefix("/other")).await;
    assert!(matches!(r, Err(Error::PermissionDenied)), "{r:?}");
    // Managing users needs the root role.
    let r = alice.user_list().await;
    assert!(matches!(r, Err(Error::PermissionDenied)), "{r:?}");

    // A changed password: the old one is refused, the new one works.
    root.user_change_password("alice", "pw2").await.unwrap();
    let old = as_user(&etcd, "alice", "pw1").authenticate().await;
    assert!(matches!(old, Err(Error::Auth(_))), "{old:?}");
    let new = as_user(&etcd, "alice", "pw2");
    new.put(Put::new("/app/mine/k", "2")).await.unwrap();

    // A user without a password cannot log in with one.
    root.user_add_with_options(
        "cn-only",
        "ignored",
        UserAddOptions::default().no_password(),
    )
    .await
    .unwrap();
    for pw in ["ignored", ""] {
        let r = as_user(&etcd, "cn-only", pw).authenticate().await;
        assert!(r.is_err(), "{pw:?}: {r:?}");
    }

    // Revoking the role takes the permission away at once.
    root.user_revoke_role("alice", "app").await.unwrap();
    let r = new.put(Put::new("/app/mine/k", "3")).await;
    assert!(matches!(r, Err(Error::PermissionDenied)), "{r:?}");

    root.auth_disable().await.unwrap();
    c.put(Put::new("/app/x", "1")).await.unwrap();
    match c.auth_status().await {
        Ok(s) => assert!(!s.enabled),
        Err(Error::Unimplemented(_)) => assert!(v34),
        Err(e) => panic!("auth_status: {e:?}"),
    }
}

/// A POST of `body` to etcd's JSON gateway (`/v3/...`, served on the
/// client port by 3.4 and 3.5 alike) with `token` as its `Authorization`
/// header: what a program handed the token does with it.
fn gateway_post(etcd: &Etcd, path: &str, body: &str, token: Option<&str>) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(etcd.client_addr()).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// `authenticate` returns the token it fetched (and every call uses it);
/// `authenticate_as` fetches one for other credentials without touching
/// the client's. Each works where the caller takes it: etcd's gateway
/// serves a read with it, and refuses the same read without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticate_hands_the_token_to_the_caller() {
    let etcd = Etcd::start();
    let c = plain(&etcd);
    assert_eq!(
        c.authenticate().await.unwrap(),
        None,
        "no credentials, no token"
    );
    c.put(Put::new("/tok", "v")).await.unwrap();
    c.user_add("root", "rootpw").await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.auth_enable().await.unwrap();

    let root = as_user(&etcd, "root", "rootpw");
    let token = root.authenticate().await.unwrap().expect("a token");
    assert!(!token.as_str().is_empty());
    assert!(
        !format!("{token:?}").contains(token.as_str()),
        "Debug prints the token"
    );
    // "/tok" in base64.
    let range = r#"{"key":"L3Rvaw=="}"#;
    let with = gateway_post(&etcd, "/v3/kv/range", range, Some(token.as_str()));
    assert!(
        with.contains(r#""kvs""#),
        "the gateway refused the token: {with}"
    );
    let without = gateway_post(&etcd, "/v3/kv/range", range, None);
    assert!(
        !without.contains(r#""kvs""#),
        "the gateway read without a token: {without}"
    );
    // The client carries the token it returned.
    root.range(Range::key("/tok")).await.unwrap();

    let other = c.authenticate_as("root", "rootpw").await.unwrap();
    assert_ne!(other, token, "each authentication is a token of its own");
    let with = gateway_post(&etcd, "/v3/kv/range", range, Some(other.as_str()));
    assert!(with.contains(r#""kvs""#), "{with}");
    // `c` has no credentials still: it cannot read.
    assert!(c.range(Range::key("/tok")).await.is_err());
    let refused = c.authenticate_as("root", "wrong").await;
    assert!(matches!(refused, Err(Error::Auth(_))), "{refused:?}");
}
