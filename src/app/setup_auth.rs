//! `setup-auth`: the etcd users, roles and permissions one region's
//! replicator needs, and nothing more, printed as etcdctl commands or
//! applied.
//!
//! Two kinds of user, each with a role of the same name:
//!
//! - on the region's own (local) etcd, the replicator's user (default
//!   `aether-replicator`): it reads the region's subtree, runs the leader
//!   election, reads the state keys the other regions keep here (the
//!   incoming copies' metrics) and keeps the region's source id;
//! - on each peer's etcd, the region's user there (default
//!   `aether-replicator-<region>`): it writes the region's copy and its
//!   state key, and nothing else.
//!
//! [`plan`] says which permission each needs and why; [`render`] prints
//! the plan as commands an operator runs with etcdctl; [`apply`] makes an
//! etcd match the plan. Applying is idempotent: the role ends with exactly
//! the planned permissions (others on it are revoked: the role is the
//! replicator's), the user exists with the given password and has the
//! role. Other roles the user has are left, and reported.

use std::fmt::Write as _;

use crate::etcd::{Client, Error as EtcdError, Permission};

/// Default user (and role) of the replicator on its own etcd.
pub const DEFAULT_LOCAL_USER: &str = "aether-replicator";

/// Default user (and role) of region `region`'s replicator on a peer's etcd.
pub fn default_peer_user(region: &str) -> String {
    format!("{DEFAULT_LOCAL_USER}-{region}")
}

/// One permission of a plan, and why the replicator needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    /// The permission.
    pub permission: Permission,
    /// What the replicator does with it.
    pub why: &'static str,
}

/// What one etcd needs: a user, its role, the role's permissions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdPlan {
    /// `local` or the peer's region.
    pub name: String,
    /// The etcd's member URLs (for the printed commands).
    pub endpoints: Vec<String>,
    /// The replicator's user there.
    pub user: String,
    /// Its role (named like the user).
    pub role: String,
    /// The role's permissions.
    pub needs: Vec<Need>,
    /// The file holding the user's password, if known (for the printed
    /// commands).
    pub password_file: Option<String>,
}

/// The prefixes the plan is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The region whose replicator this is.
    pub region: String,
    /// The registry root, `/aether/v1/regions/`.
    pub root: String,
    /// The state root, `/aether/v1/replication/`.
    pub state_root: String,
    /// The election root, `/aether/v1/replicator/`.
    pub election_root: String,
}

/// One etcd's connection and user, as [`plan`] takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `local` or the peer's region.
    pub name: String,
    /// Member URLs.
    pub endpoints: Vec<String>,
    /// The replicator's user there.
    pub user: String,
    /// Its password file, if known.
    pub password_file: Option<String>,
}

/// The permissions region `layout.region`'s replicator needs on its own
/// etcd (`local`) and on each peer's.
pub fn plan(layout: &Layout, local: Target, peers: Vec<Target>) -> Vec<EtcdPlan> {
    let r = &layout.region;
    let subtree = format!("{}{r}/", layout.root);
    let own_state = format!("{}{r}/", layout.state_root);
    let local_needs = vec![
        Need {
            permission: Permission::read(subtree.clone()).with_prefix(),
            why: "the region's subtree, the source: watched, scanned and counted, never written",
        },
        Need {
            permission: Permission::read_write(format!("{}{r}/", layout.election_root))
                .with_prefix(),
            why: "the leader election: campaign keys under the session lease, deleted on resign or when stale",
        },
        Need {
            permission: Permission::read(layout.state_root.clone()).with_prefix(),
            why: "the state keys the other regions keep here: their copies' presence and staleness (metrics), read and watched",
        },
        Need {
            permission: Permission::read_write(format!("{own_state}source-id")),
            why: "the region's source id, created once by the first leader and read by every one after",
        },
    ];
    let mut plans = vec![EtcdPlan {
        name: local.name,
        endpoints: local.endpoints,
        role: local.user.clone(),
        user: local.user,
        needs: local_needs,
        password_file: local.password_file,
    }];
    for peer in peers {
        plans.push(EtcdPlan {
            name: peer.name,
            endpoints: peer.endpoints,
            role: peer.user.clone(),
            user: peer.user,
            needs: vec![
                Need {
                    permission: Permission::read_write(subtree.clone()).with_prefix(),
                    why: "the copy: puts and deletes under the mirror lease, range-diff scans, key counts",
                },
                Need {
                    permission: Permission::read_write(own_state.clone()).with_prefix(),
                    why: "the state key: claim (delete, create), the fence every txn compares, progress and heartbeat",
                },
            ],
            password_file: peer.password_file,
        });
    }
    plans
}

/// `s` quoted for a POSIX shell when it needs it.
fn sh(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/-_.:,=@+%".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// How one permission reads in prose: `readwrite prefix /a/`.
fn describe(p: &Permission) -> String {
    let key = String::from_utf8_lossy(&p.key);
    if p.is_prefix() {
        format!("{} prefix {key}", p.kind)
    } else if p.range_end.is_empty() {
        format!("{} key {key}", p.kind)
    } else {
        format!(
            "{} range [{key}, {})",
            p.kind,
            String::from_utf8_lossy(&p.range_end)
        )
    }
}

/// The plans as etcdctl commands with comments: one block per etcd, to
/// run against that etcd as a user with the root role.
pub fn render(region: &str, plans: &[EtcdPlan]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# setup-auth for region {region}: the users, roles and permissions its replicator needs.\n\
         # Run each block against the etcd it names as a user with the root role (add --user root,\n\
         # and --cacert/--cert/--key for https). Re-running a block is harmless (\"already exists\")."
    );
    for plan in plans {
        let etcdctl = format!("etcdctl --endpoints={}", sh(&plan.endpoints.join(",")));
        let which = match plan.name.as_str() {
            "local" => format!("region {region}'s own etcd"),
            peer => format!("peer {peer}'s etcd"),
        };
        let _ = writeln!(
            out,
            "\n# == {which}: user {}, role {} ==",
            plan.user, plan.role
        );
        let _ = writeln!(out, "{etcdctl} role add {}", sh(&plan.role));
        for need in &plan.needs {
            let p = &need.permission;
            let _ = writeln!(out, "# {}: {}", describe(p), need.why);
            let range = if p.is_prefix() {
                "--prefix=true ".to_string()
            } else {
                String::new()
            };
            let end = if !p.is_prefix() && !p.range_end.is_empty() {
                format!(" {}", sh(&String::from_utf8_lossy(&p.range_end)))
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "{etcdctl} role grant-permission {range}{} {} {}{end}",
                sh(&plan.role),
                p.kind,
                sh(&String::from_utf8_lossy(&p.key))
            );
        }
        let file = plan
            .password_file
            .as_deref()
            .map_or_else(|| "PASSWORD_FILE".to_string(), sh);
        let _ = writeln!(
            out,
            "{etcdctl} user add {} --interactive=false < {file}",
            sh(&plan.user)
        );
        let _ = writeln!(
            out,
            "{etcdctl} user grant-role {} {}",
            sh(&plan.user),
            sh(&plan.role)
        );
    }
    out
}

/// What [`apply`] changed on one etcd, one line each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The changes made, in order; empty when the etcd matched already
    /// (the password is set every time and not counted).
    pub changes: Vec<String>,
    /// Things left as they were that the operator may want to look at.
    pub notes: Vec<String>,
}

/// Makes the etcd behind `admin` (a client with the root role) match
/// `plan`, the user's password being `password`.
pub async fn apply(
    admin: &Client,
    plan: &EtcdPlan,
    password: &str,
) -> crate::etcd::Result<Applied> {
    let mut applied = Applied::default();
    match admin.role_add(&plan.role).await {
        Ok(_) => applied.changes.push(format!("added role {}", plan.role)),
        Err(EtcdError::RoleAlreadyExists) => {}
        Err(e) => return Err(e),
    }
    let have = admin.role_get(&plan.role).await?.permissions;
    let want: Vec<&Permission> = plan.needs.iter().map(|n| &n.permission).collect();
    for p in &have {
        // Same key and range with another kind is replaced by the grant.
        let planned = want
            .iter()
            .any(|w| w.key == p.key && w.range_end == p.range_end);
        if !planned {
            admin
                .role_revoke_permission(&plan.role, p.key.clone(), p.range_end.clone())
                .await?;
            applied
                .changes
                .push(format!("revoked {} from role {}", describe(p), plan.role));
        }
    }
    for p in want {
        if !have.contains(p) {
            admin.role_grant_permission(&plan.role, p).await?;
            applied
                .changes
                .push(format!("granted {} to role {}", describe(p), plan.role));
        }
    }
    match admin.user_add(&plan.user, password).await {
        Ok(_) => applied.changes.push(format!("added user {}", plan.user)),
        Err(EtcdError::UserAlreadyExists) => {
            admin.user_change_password(&plan.user, password).await?;
        }
        Err(e) => return Err(e),
    }
    let roles = admin.user_get(&plan.user).await?.roles;
    if !roles.contains(&plan.role) {
        admin.user_grant_role(&plan.user, &plan.role).await?;
        applied
            .changes
            .push(format!("granted role {} to user {}", plan.role, plan.user));
    }
    for other in roles.iter().filter(|r| **r != plan.role) {
        applied.notes.push(format!(
            "user {} also has role {other}, left as it is",
            plan.user
        ));
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            region: "a".into(),
            root: "/aether/v1/regions/".into(),
            state_root: "/aether/v1/replication/".into(),
            election_root: "/aether/v1/replicator/".into(),
        }
    }

    fn target(name: &str, user: &str) -> Target {
        Target {
            name: name.into(),
            endpoints: vec![format!("http://{name}:2379")],
            user: user.into(),
            password_file: None,
        }
    }

    #[test]
    fn the_plan_gives_peers_only_the_region_s_own_prefixes() {
        let plans = plan(
            &layout(),
            target("local", "aether-replicator"),
            vec![target("b", "aether-replicator-a")],
        );
        let local: Vec<String> = plans[0]
            .needs
            .iter()
            .map(|n| describe(&n.permission))
            .collect();
        assert_eq!(
            local,
            [
                "read prefix /aether/v1/regions/a/",
                "readwrite prefix /aether/v1/replicator/a/",
                "read prefix /aether/v1/replication/",
                "readwrite key /aether/v1/replication/a/source-id",
            ]
        );
        let peer: Vec<String> = plans[1]
            .needs
            .iter()
            .map(|n| describe(&n.permission))
            .collect();
        assert_eq!(
            peer,
            [
                "readwrite prefix /aether/v1/regions/a/",
                "readwrite prefix /aether/v1/replication/a/",
            ]
        );
        let text = render("a", &plans);
        assert!(text.contains(
            "etcdctl --endpoints=http://b:2379 role grant-permission --prefix=true aether-replicator-a readwrite /aether/v1/regions/a/\n"
        ), "{text}");
        assert!(text.contains(
            "etcdctl --endpoints=http://local:2379 role grant-permission aether-replicator readwrite /aether/v1/replication/a/source-id\n"
        ), "{text}");
        assert!(text.contains(
            "etcdctl --endpoints=http://b:2379 user add aether-replicator-a --interactive=false < PASSWORD_FILE\n"
        ), "{text}");
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(sh("/etc/a/pw"), "/etc/a/pw");
        assert_eq!(sh("/my dir/it's"), r"'/my dir/it'\''s'");
        assert_eq!(sh(""), "''");
    }
}
