//! `aether-replicator setup-auth` against real etcds with auth on: the
//! printed etcdctl commands and `--apply` build the same roles, `--apply`
//! is idempotent, and a mesh of regions whose replicators run as the users
//! it creates converges while every write outside a user's prefixes is
//! refused.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use aether_replicator::etcd::{Client, Delete, Error, Put, Range};
use common::replicator::{Replicator, binary, metric};
use common::{Etcd, wait_until_async, write_file};

const ROOT_PW: &str = "rootpw";

/// Runs the binary to completion: (exit code, stdout, stderr).
fn run(args: &[String]) -> (Option<i32>, String, String) {
    let out = Command::new(binary()).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn root(etcd: &Etcd) -> Client {
    Client::connect(etcd.client_config_as("root", ROOT_PW)).unwrap()
}

fn user(etcd: &Etcd, name: &str, password: &str) -> Client {
    Client::connect(etcd.client_config_as(name, password)).unwrap()
}

/// Region `region`'s config file in `dir`: its own etcd as user
/// `aether-replicator`, each peer's as `aether-replicator-<region>`, every
/// password in a file of its own. Returns the file's path.
fn region_file(dir: &Path, region: &str, local: &Etcd, peers: &[(&str, &Etcd)]) -> String {
    let pw = write_file(
        dir,
        &format!("{region}-local.pw"),
        &format!("{region}-local\n"),
    );
    let mut text = format!(
        "region = \"{region}\"\nlease_ttl = \"6s\"\n[local]\nendpoints = [\"{}\"]\n\
         username = \"aether-replicator\"\npassword_file = \"{pw}\"\n",
        local.endpoint()
    );
    for (peer, etcd) in peers {
        let pw = write_file(
            dir,
            &format!("{region}-on-{peer}.pw"),
            &format!("{region}-on-{peer}\n"),
        );
        text.push_str(&format!(
            "[peers.{peer}]\nendpoints = [\"{}\"]\nusername = \"aether-replicator-{region}\"\n\
             password_file = \"{pw}\"\n",
            etcd.endpoint()
        ));
    }
    write_file(dir, &format!("{region}.toml"), &text)
}

/// Every role's permissions on `etcd`, as `kind key range_end` lines.
async fn roles(etcd: &Etcd) -> BTreeMap<String, Vec<String>> {
    let c = root(etcd);
    let mut out = BTreeMap::new();
    for name in c.role_list().await.unwrap().names {
        let perms = c.role_get(&name).await.unwrap().permissions;
        out.insert(
            name,
            perms
                .iter()
                .map(|p| {
                    format!(
                        "{} {} {}",
                        p.kind,
                        String::from_utf8_lossy(&p.key),
                        String::from_utf8_lossy(&p.range_end)
                    )
                })
                .collect(),
        );
    }
    out
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    // Passwords come from files only: PWFILE stands for this one.
    let pwfile = write_file(dir.path(), "replicator.pw", "x\n");
    let cases: &[(&[&str], &str)] = &[
        (&["setup-auth"], "--region"),
        (
            &[
                "setup-auth",
                "--region=a",
                "--peer-etcd=b=http://127.0.0.1:2",
                "--apply",
            ],
            "error: --apply: no admin password for the local etcd: give --admin-password-file",
        ),
        (
            &[
                "setup-auth",
                "--region=a",
                "--peer-etcd=b=http://127.0.0.1:2",
                "--peer-admin-password-file=x=/pw",
            ],
            "error: --peer-admin-password-file \"x=/pw\": \"x\" is not a peer",
        ),
        (
            &[
                "setup-auth",
                "--region=a",
                "--admin-password-file=/nonexistent/pw",
            ],
            "error: --admin-password-file \"/nonexistent/pw\": ",
        ),
        (
            &[
                "setup-auth",
                "--region=a",
                "--local-user=root",
                "--local-password-file=PWFILE",
            ],
            "error: setup-auth: the replicator's user on the local etcd is \"root\", an admin: give it a user of its own",
        ),
    ];
    for (args, want) in cases {
        let args: Vec<String> = args.iter().map(|s| s.replace("PWFILE", &pwfile)).collect();
        let (code, out, err) = run(&args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert_eq!(out, "", "{args:?}");
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {err}");
        assert!(
            lines[0].contains(want),
            "{args:?}: got {err:?}, want {want:?}"
        );
    }
    // --apply with an etcd the replicator has no user for.
    let pw = write_file(dir.path(), "admin.pw", "x\n");
    let (code, _, err) = run(&[
        "setup-auth".into(),
        "--region=a".into(),
        "--peer-etcd=b=http://127.0.0.1:2".into(),
        "--apply".into(),
        format!("--admin-password-file={pw}"),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with("error: --apply: the local etcd has no username and password_file"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printed_commands_and_apply_build_the_same_roles_and_apply_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    // Region a's own etcd and its peer b's: two etcds each way.
    let (by_etcdctl_a, by_etcdctl_b) = (Etcd::start(), Etcd::start());
    let (by_apply_a, by_apply_b) = (Etcd::start(), Etcd::start());
    for e in [&by_etcdctl_a, &by_etcdctl_b, &by_apply_a, &by_apply_b] {
        e.enable_root_auth(ROOT_PW);
    }
    let admin_pw = write_file(dir.path(), "admin.pw", &format!("{ROOT_PW}\n"));

    // The printed commands, run as printed (etcdctl from ETCDCTL_BIN, as
    // root through etcdctl's own ETCDCTL_USER).
    let file = region_file(dir.path(), "a", &by_etcdctl_a, &[("b", &by_etcdctl_b)]);
    let (code, script, err) = run(&["setup-auth".into(), format!("--config={file}")]);
    assert_eq!(code, Some(0), "{err}");
    assert!(script.contains(&format!("< {}/a-on-b.pw\n", dir.path().display())));
    let etcdctl = common::etcdctl_command().get_program().to_owned();
    let bin_dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&etcdctl, bin_dir.path().join("etcdctl")).unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("sh")
        .args(["-ec", &script])
        .env("PATH", path)
        .env("ETCDCTL_API", "3")
        .env("ETCDCTL_USER", format!("root:{ROOT_PW}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // --apply on the other pair.
    let file2 = region_file(dir.path(), "a", &by_apply_a, &[("b", &by_apply_b)]);
    let apply = |file: &str| {
        run(&[
            "setup-auth".into(),
            format!("--config={file}"),
            "--apply".into(),
            format!("--admin-password-file={admin_pw}"),
        ])
    };
    let (code, out, err) = apply(&file2);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("peer b's etcd: added user aether-replicator-a"),
        "{out}"
    );

    assert_eq!(roles(&by_etcdctl_a).await, roles(&by_apply_a).await);
    assert_eq!(roles(&by_etcdctl_b).await, roles(&by_apply_b).await);
    let b_roles = roles(&by_apply_b).await;
    assert_eq!(
        b_roles["aether-replicator-a"],
        [
            "readwrite /aether/v1/regions/a/ /aether/v1/regions/a0",
            "readwrite /aether/v1/replication/a/ /aether/v1/replication/a0",
        ]
    );

    // Applying over what etcdctl made changes nothing, and so does
    // applying again.
    for f in [&file, &file2] {
        let (code, out, err) = apply(f);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(
            out,
            "region a's own etcd: user aether-replicator up to date\n\
             peer b's etcd: user aether-replicator-a up to date\n"
        );
    }

    // A stray permission on the role is revoked, a narrowed one restored,
    // and an extra role on the user reported but left.
    let c = root(&by_apply_b);
    use aether_replicator::etcd::Permission;
    c.role_grant_permission(
        "aether-replicator-a",
        &Permission::read_write("/aether/v1/").with_prefix(),
    )
    .await
    .unwrap();
    c.role_grant_permission(
        "aether-replicator-a",
        &Permission::read("/aether/v1/regions/a/").with_prefix(),
    )
    .await
    .unwrap();
    c.role_add("extra").await.unwrap();
    c.user_grant_role("aether-replicator-a", "extra")
        .await
        .unwrap();
    let (code, out, err) = apply(&file2);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "peer b's etcd: revoked readwrite prefix /aether/v1/ from role aether-replicator-a\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("peer b's etcd: granted readwrite prefix /aether/v1/regions/a/ to role aether-replicator-a\n"),
        "{out}"
    );
    assert!(
        out.contains(
            "peer b's etcd: note: user aether-replicator-a also has role extra, left as it is\n"
        ),
        "{out}"
    );
    assert_eq!(
        roles(&by_apply_b).await["aether-replicator-a"],
        b_roles["aether-replicator-a"]
    );

    // A wrong admin password: the etcd's refusal, exit 1.
    let bad = write_file(dir.path(), "bad.pw", "nope\n");
    let (code, _, err) = run(&[
        "setup-auth".into(),
        format!("--config={file2}"),
        "--apply".into(),
        format!("--admin-password-file={bad}"),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.starts_with("error: region a's own etcd: authentication failed"),
        "{err}"
    );
}

const REGIONS: [&str; 3] = ["a", "b", "c"];

fn endpoint_key(region: &str, i: usize) -> String {
    format!("/aether/v1/regions/{region}/clusters/k/services/s/protocols/http/endpoints/10.0.0.{i}")
}

/// `prefix` on `c` as key=value pairs; the error's text if it fails.
async fn dump(c: &Client, prefix: &str) -> Result<Vec<(String, String)>, String> {
    let resp = c
        .range(Range::prefix(prefix.to_string()))
        .await
        .map_err(|e| e.to_string())?;
    Ok(resp
        .kvs()
        .iter()
        .map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                String::from_utf8_lossy(kv.value()).into_owned(),
            )
        })
        .collect())
}

/// How many keys `key` is on each of `clients` (-1 where the read fails),
/// from the sync condition of `wait_until_async`.
fn copies_of(clients: &[Client], key: &str) -> Vec<i64> {
    let rt = tokio::runtime::Handle::current();
    clients
        .iter()
        .map(|c| {
            tokio::task::block_in_place(|| rt.block_on(c.range(Range::key(key.to_string()))))
                .map_or(-1, |r| r.kvs().len() as i64)
        })
        .collect()
}

fn assert_denied<T: std::fmt::Debug>(what: &str, r: Result<T, Error>) {
    assert!(matches!(r, Err(Error::PermissionDenied)), "{what}: {r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesh_on_least_privilege_users_converges_and_nothing_else_is_writable() {
    let dir = tempfile::tempdir().unwrap();
    let etcds: Vec<Etcd> = REGIONS.iter().map(|_| Etcd::start()).collect();
    // Each region's etcd has a root password of its own.
    let mut admin_files = Vec::new();
    for (r, e) in REGIONS.iter().zip(&etcds) {
        e.enable_root_auth(&format!("root-{r}"));
        admin_files.push(write_file(
            dir.path(),
            &format!("root-{r}.pw"),
            &format!("root-{r}\n"),
        ));
    }
    let roots: Vec<Client> = REGIONS
        .iter()
        .zip(&etcds)
        .map(|(r, e)| Client::connect(e.client_config_as("root", &format!("root-{r}"))).unwrap())
        .collect();

    let mut replicators = Vec::new();
    let mut files = Vec::new();
    for (i, region) in REGIONS.iter().enumerate() {
        let peers: Vec<(&str, &Etcd)> = REGIONS
            .iter()
            .zip(&etcds)
            .filter(|(r, _)| *r != region)
            .map(|(r, e)| (*r, e))
            .collect();
        let file = region_file(dir.path(), region, &etcds[i], &peers);
        files.push(file.clone());
        let mut args = vec![
            "setup-auth".to_string(),
            format!("--config={file}"),
            "--apply".into(),
            format!("--admin-password-file={}", admin_files[i]),
        ];
        for (j, r) in REGIONS.iter().enumerate() {
            if j != i {
                args.push(format!("--peer-admin-password-file={r}={}", admin_files[j]));
            }
        }
        let (code, out, err) = run(&args);
        assert_eq!(code, Some(0), "setup-auth {region}: {err}");
        assert!(
            out.contains(&format!(
                "region {region}'s own etcd: added user aether-replicator\n"
            )),
            "{out}"
        );
        // Two replicas per region, as a deployment runs them.
        for replica in 0..2 {
            replicators.push(Replicator::spawn(&[
                format!("--config={file}"),
                format!("--replica-id={region}-{replica}"),
            ]));
        }
        // Endpoints of this region, written by root (the registrar's job).
        for k in 0..5 {
            roots[i]
                .put(Put::new(endpoint_key(region, k), format!("{{\"n\":{k}}}")))
                .await
                .unwrap();
        }
    }

    // Every region's subtree arrives, exact, in every other region's etcd.
    let mut seen = String::new();
    let converged = wait_until_async(Duration::from_secs(60), || {
        seen.clear();
        let mut all = true;
        let rt = tokio::runtime::Handle::current();
        for (i, origin) in REGIONS.iter().enumerate() {
            let prefix = format!("/aether/v1/regions/{origin}/");
            let want = tokio::task::block_in_place(|| rt.block_on(dump(&roots[i], &prefix)));
            for (j, peer) in REGIONS.iter().enumerate() {
                if i == j {
                    continue;
                }
                let got = tokio::task::block_in_place(|| rt.block_on(dump(&roots[j], &prefix)));
                if got != want {
                    all = false;
                    seen.push_str(&format!(
                        "{origin} on {peer}: {} keys, want {}; ",
                        got.as_ref().map_or(0, |g| g.len()),
                        want.as_ref().map_or(0, |w| w.len())
                    ));
                }
            }
        }
        all
    })
    .await;
    let logs: String = replicators.iter().map(|r| r.log_text()).collect();
    assert!(
        converged,
        "copies not exact after 60s: {seen}\nlogs:\n{logs}"
    );

    // A change converges too (the live path, not only the first sync).
    roots[0]
        .delete(Delete::key(endpoint_key("a", 0)))
        .await
        .unwrap();
    let gone = wait_until_async(Duration::from_secs(30), || {
        copies_of(&roots[1..], &endpoint_key("a", 0)) == [0, 0]
    })
    .await;
    assert!(gone, "the delete did not reach b and c");

    // Every replica follows the other regions' copies in its own etcd
    // (read and watch of the state keys, and their leases' TTLs).
    let mut last = String::new();
    let incoming = wait_until_async(Duration::from_secs(30), || {
        replicators.iter().enumerate().all(|(n, r)| {
            let page = r.scrape().unwrap_or_default();
            // Two replicas per region, in REGIONS order; each reports the
            // other regions.
            let here = REGIONS[n / 2];
            let ok = REGIONS.iter().filter(|o| **o != here).all(|o| {
                let present = metric(
                    &page,
                    &format!("aether_replicator_origin_copy_present{{origin=\"{o}\"}}"),
                );
                let ttl = metric(
                    &page,
                    &format!("aether_replicator_origin_lease_remaining_seconds{{origin=\"{o}\"}}"),
                );
                present == Some(1.0) && ttl.is_some_and(|t| t > 0.0)
            });
            if !ok {
                last = page
                    .lines()
                    .filter(|l| l.starts_with("aether_replicator_origin_"))
                    .collect::<Vec<_>>()
                    .join("\n");
            }
            ok
        })
    })
    .await;
    assert!(incoming, "incoming copies not reported: {last}");

    // A handoff: region a's leader stops, the standby takes over (adopting
    // the peer leases, re-claiming the state keys) and mirrors on.
    let leader = (0..2)
        .find(|n| replicators[*n].is_leader())
        .expect("one of region a's replicas leads");
    let status = replicators[leader].terminate(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let standby = 1 - leader;
    let led = wait_until_async(Duration::from_secs(30), || replicators[standby].is_leader()).await;
    assert!(
        led,
        "a's standby did not take over: {}",
        replicators[standby].log_text()
    );
    roots[0]
        .put(Put::new(endpoint_key("a", 50), "after handoff"))
        .await
        .unwrap();
    let arrived = wait_until_async(Duration::from_secs(30), || {
        copies_of(&roots[1..], &endpoint_key("a", 50)) == [1, 1]
    })
    .await;
    assert!(
        arrived,
        "a write after the handoff did not reach b and c: {}",
        replicators[standby].log_text()
    );

    // The one-shot commands run on the same users: `check` compares b's
    // subtree with its copies, `status` reads the election and the state
    // keys and their leases.
    for command in ["check", "status"] {
        let (code, out, err) = run(&[command.to_string(), format!("--config={}", files[1])]);
        assert_eq!(code, Some(0), "{command}: {out}{err}");
    }

    // Nothing was refused on the way: the plan is enough.
    for r in &replicators {
        let log = r.log_text().to_lowercase();
        assert!(!log.contains("permission denied"), "{log}");
    }

    // Region a's user on peer b: its own prefixes only.
    let a_on_b = user(&etcds[1], "aether-replicator-a", "a-on-b");
    a_on_b
        .put(Put::new(endpoint_key("a", 99), "x"))
        .await
        .unwrap();
    a_on_b
        .delete(Delete::key(endpoint_key("a", 99)))
        .await
        .unwrap();
    for key in [
        endpoint_key("b", 99),          // b's own subtree
        endpoint_key("c", 99),          // c's copy in b
        "/aether/v1/other".to_string(), // the registry root
        "/aether/v1/regions/x".to_string(),
        "/aether/v1/replication/b/state".to_string(),
        "/aether/v1/replication/c/state".to_string(),
        "/aether/v1/replicator/b/leader/1".to_string(),
    ] {
        assert_denied(
            &format!("a's peer user writing {key} on b"),
            a_on_b.put(Put::new(key.clone(), "x")).await,
        );
        assert_denied(
            &format!("a's peer user deleting {key} on b"),
            a_on_b.delete(Delete::key(key.clone())).await,
        );
    }
    assert_denied(
        "a's peer user deleting everything on b",
        a_on_b.delete(Delete::prefix("/aether/")).await,
    );
    assert_denied(
        "a's peer user reading b's subtree",
        a_on_b.range(Range::prefix("/aether/v1/regions/b/")).await,
    );

    // Region a's own user in a's etcd: reads its subtree, writes none of
    // the registry (not its own subtree, not the copies of b and c).
    let a_local = user(&etcds[0], "aether-replicator", "a-local");
    assert!(
        !a_local
            .range(Range::prefix("/aether/v1/regions/a/"))
            .await
            .unwrap()
            .kvs()
            .is_empty()
    );
    for key in [
        endpoint_key("a", 99),
        endpoint_key("b", 1),
        endpoint_key("c", 1),
        "/aether/v1/other".to_string(),
        "/aether/v1/replication/b/state".to_string(),
        "/aether/v1/replicator/b/leader/1".to_string(),
    ] {
        assert_denied(
            &format!("a's local user writing {key} in a"),
            a_local.put(Put::new(key.clone(), "x")).await,
        );
    }
    assert_denied(
        "a's local user reading b's copy",
        a_local.range(Range::prefix("/aether/v1/regions/b/")).await,
    );
    // Region b's user in a (b's copy there) cannot touch a's subtree.
    let b_on_a = user(&etcds[0], "aether-replicator-b", "b-on-a");
    assert_denied(
        "b's peer user writing a's subtree in a",
        b_on_a.put(Put::new(endpoint_key("a", 1), "x")).await,
    );
    drop(replicators);
}
