//! `migrate` against a real etcd: 10k legacy keys with conflicts and
//! malformed ones, through the library and through the binary.

mod common;

use common::mirror::{count, put_many};

use std::process::Command;
use std::time::Duration;

use aether_replicator::app::migrate::{
    self, Deletion, MigrateOptions, MigrateReport, Status, apply, delete_legacy, plan,
};
use aether_replicator::etcd::{Client, ClientConfig, Delete, Put, Range, TxnLimits};
use aether_replicator::schema::{EndpointKey, Schema};
use common::Etcd;
use common::replicator::binary;

const LEGACY: &str = "/aether/services/";
const N: usize = 10_000;

fn client(e: &Etcd) -> Client {
    let mut cfg = ClientConfig::new(e.endpoints());
    cfg.request_timeout = Duration::from_secs(10);
    Client::connect(cfg).unwrap()
}

fn legacy_key(i: usize) -> String {
    format!(
        "{LEGACY}svc{}/protocols/http/endpoints/10.{}.{}",
        i % 17,
        i / 256,
        i % 256
    )
}

fn v1_key(region: &str, cluster: &str, i: usize) -> String {
    let ip = format!("10.{}.{}", i / 256, i % 256);
    let k = EndpointKey::new(region, cluster, format!("svc{}", i % 17), "http", ip).unwrap();
    Schema::default().endpoint_key(&k)
}

/// The legacy data set, by index:
/// - `0..100`: key not in the legacy layout (malformed);
/// - `100..200`: region with '/' (malformed); `200..250`: region not a
///   string (malformed);
/// - `250..550`: value not JSON (origin from the flags, a/c0);
/// - `550..1000`: JSON without region and cluster (from the flags);
/// - `1000..1100`: region b; `1100..N`: region a, cluster c1.
fn legacy(i: usize) -> (String, String) {
    let key = if i < 100 {
        format!("{LEGACY}svc{i}/protocols/http/endpoint/10.0.0.{i}")
    } else {
        legacy_key(i)
    };
    let value = match i {
        0..100 => r#"{"region":"a","clusterName":"c1"}"#.to_string(),
        100..200 => r#"{"region":"x/y","clusterName":"c1"}"#.to_string(),
        200..250 => r#"{"region":5}"#.to_string(),
        250..550 => format!("not json {i}"),
        550..1000 => format!(r#"{{"zone":"a-1","n":{i}}}"#),
        1000..1100 => format!(r#"{{"region":"b","clusterName":"c1","zone":"b-1","n":{i}}}"#),
        _ => format!(r#"{{"region":"a","clusterName":"c1","zone":"a-1","n":{i}}}"#),
    };
    (key, value)
}

/// Where legacy key `i` goes.
fn target(i: usize) -> String {
    match i {
        250..1000 => v1_key("a", "c0", i),
        1000..1100 => v1_key("b", "c1", i),
        _ => v1_key("a", "c1", i),
    }
}

async fn get(c: &Client, key: &str) -> Option<String> {
    let r = c.range(Range::key(key.to_string())).await.unwrap();
    r.kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
}

/// 10k legacy keys; 200 already migrated (2000..2200), 100 conflicts
/// (2200..2300).
async fn seed(c: &Client) {
    put_many(c, (0..N).map(legacy)).await;
    put_many(c, (2000..2200).map(|i| (target(i), legacy(i).1))).await;
    put_many(
        c,
        (2200..2300).map(|i| (target(i), "someone else's".to_string())),
    )
    .await;
}

fn options() -> MigrateOptions {
    let mut o = MigrateOptions::new(Some("a".into()), Some("c0".into()));
    o.page_size = 900;
    o
}

fn counts(r: &MigrateReport) -> (usize, usize, usize, usize, usize) {
    (
        r.legacy_keys,
        r.to_write,
        r.already_migrated,
        r.conflicts.len(),
        r.malformed.len(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrates_10k_keys_idempotently_and_deletes_legacy_only_when_complete() {
    let e = Etcd::start();
    let c = client(&e);
    seed(&c).await;
    let before = c.range(Range::key("x")).await.unwrap().header.revision;

    // Dry run: counts, conflicts and reasons; nothing written.
    let dry = migrate::migrate(&c, &options()).await.unwrap();
    assert_eq!(counts(&dry), (N, 9450, 200, 100, 250));
    assert_eq!(dry.regions.get("a"), Some(&9650));
    assert_eq!(dry.regions.get("b"), Some(&100));
    assert!(dry.applied.is_none() && dry.deletion.is_none() && dry.ok());
    assert_eq!(
        c.range(Range::key("x")).await.unwrap().header.revision,
        before,
        "a dry run writes nothing"
    );
    assert!(dry.conflicts.contains(&(legacy_key(2200), target(2200))));
    let reason = |i: usize| {
        let key = legacy(i).0;
        dry.malformed
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, why)| why.clone())
            .unwrap_or_else(|| panic!("{key} not reported"))
    };
    assert!(reason(5).contains("does not match"), "{}", reason(5));
    assert!(reason(150).contains("'/'"), "{}", reason(150));
    assert!(reason(220).contains("not a string"), "{}", reason(220));
    let text = dry.render();
    assert!(
        text.starts_with(
            "migrate: dry-run legacy_keys=10000 to_write=9450 already_migrated=200 conflicts=100 malformed=250\nregions: a=9650 b=100\n"
        ),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("conflict: ")).count(),
        100
    );
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("malformed: "))
            .count(),
        250
    );

    // Apply: every absent key written, verbatim, nothing overwritten.
    let mut opts = options();
    opts.apply = true;
    let applied = migrate::migrate(&c, &opts).await.unwrap();
    let a = applied.applied.clone().unwrap();
    assert_eq!(a.written, 9450);
    assert!(a.txns >= 9450 / 64 && a.txns <= 9450 / 64 + 2, "{a:?}");
    assert_eq!((a.raced_equal, a.raced_conflict), (0, 0));
    assert_eq!(get(&c, &target(300)).await.as_deref(), Some("not json 300"));
    assert_eq!(get(&c, &target(600)).await, Some(legacy(600).1));
    assert_eq!(get(&c, &target(1050)).await, Some(legacy(1050).1));
    assert_eq!(get(&c, &target(5000)).await, Some(legacy(5000).1));
    assert_eq!(
        get(&c, &target(2250)).await.as_deref(),
        Some("someone else's"),
        "a conflict is never overwritten"
    );
    assert_eq!(count(&c, "/aether/v1/regions/a/").await, 9650);
    assert_eq!(count(&c, "/aether/v1/regions/b/").await, 100);

    // Again: nothing to write.
    let again = migrate::migrate(&c, &opts).await.unwrap();
    assert_eq!(counts(&again), (N, 0, 9650, 100, 250));
    assert_eq!(again.applied.unwrap().written, 0);

    // Deleting the legacy keys is refused while conflicts and malformed
    // keys remain, and lists them.
    let mut del = options();
    del.delete_legacy = true;
    let refused = migrate::migrate(&c, &del).await.unwrap();
    assert!(!refused.ok());
    match &refused.deletion {
        Some(Deletion::Refused { missing, examples }) => {
            assert_eq!(*missing, 350);
            assert_eq!(examples.len(), migrate::MISSING_LISTED);
        }
        other => panic!("not refused: {other:?}"),
    }
    assert!(
        refused.render().contains(
            "delete-legacy: refused: 350 of 10000 legacy keys have no v1 key with an equal value\n"
        ),
        "{}",
        refused.render()
    );
    assert!(refused.render().contains("  ... and 330 more\n"));
    assert_eq!(count(&c, LEGACY).await, N as i64);

    // Resolve: the v1 side of the conflicts is dropped (the legacy value
    // wins), the malformed legacy keys are removed by hand. Then apply and
    // delete in one run.
    for i in 2200..2300 {
        c.delete(Delete::key(target(i))).await.unwrap();
    }
    for i in 0..250 {
        c.delete(Delete::key(legacy(i).0)).await.unwrap();
    }
    let mut all = options();
    all.apply = true;
    all.delete_legacy = true;
    let done = migrate::migrate(&c, &all).await.unwrap();
    assert!(done.ok(), "{}", done.render());
    assert_eq!(done.applied.as_ref().unwrap().written, 100);
    assert_eq!(done.deletion, Some(Deletion::Deleted(9750)));
    assert!(
        done.render()
            .contains("delete-legacy: deleted 9750 keys under /aether/services/\n")
    );
    assert_eq!(count(&c, LEGACY).await, 0);
    assert_eq!(count(&c, "/aether/v1/regions/").await, 9750);
    assert_eq!(get(&c, &target(2250)).await, Some(legacy(2250).1));
    // And once more: nothing left to do.
    let empty = migrate::migrate(&c, &all).await.unwrap();
    assert_eq!(counts(&empty), (0, 0, 0, 0, 0));
    assert_eq!(empty.deletion, Some(Deletion::Deleted(0)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_racing_the_migration_are_never_overwritten() {
    let e = Etcd::start();
    let c = client(&e);
    put_many(&c, (1000..1300).map(legacy)).await;
    let opts = options();
    let p = plan(&c, &opts).await.unwrap();
    assert_eq!(p.count(&Status::ToWrite), 300);
    // Between the read and the write, someone writes two of the targets:
    // one with the same value, one with another.
    c.put(Put::new(target(1100), legacy(1100).1)).await.unwrap();
    c.put(Put::new(target(1101), "newer")).await.unwrap();
    let (applied, raced) = apply(&c, opts.limits, &p).await.unwrap();
    assert_eq!(applied.written, 298);
    assert_eq!((applied.raced_equal, applied.raced_conflict), (1, 1));
    assert_eq!(raced, [(legacy_key(1101), target(1101))]);
    assert_eq!(get(&c, &target(1101)).await.as_deref(), Some("newer"));
    // The batch that failed its guard went one key per txn.
    assert!(applied.txns > 300 / 64 + 1, "{applied:?}");

    // A legacy key written after the check blocks the delete.
    c.delete(Delete::key(target(1101))).await.unwrap();
    let (_, raced) = apply(&c, opts.limits, &plan(&c, &opts).await.unwrap())
        .await
        .unwrap();
    assert!(raced.is_empty());
    let check = plan(&c, &opts).await.unwrap();
    assert_eq!(check.count(&Status::Migrated), 300);
    c.put(Put::new(legacy_key(1400), legacy(1400).1))
        .await
        .unwrap();
    assert_eq!(
        delete_legacy(&c, &opts, &check).await.unwrap(),
        Deletion::Changed
    );
    assert_eq!(count(&c, LEGACY).await, 301);
    // Small txn limits: fewer keys per txn, same result.
    let mut small = options();
    small.limits = TxnLimits {
        max_ops: 8,
        max_bytes: 4096,
    };
    let (applied, _) = apply(&c, small.limits, &plan(&c, &small).await.unwrap())
        .await
        .unwrap();
    assert_eq!((applied.written, applied.txns), (1, 1));
}

#[test]
fn binary_exit_codes() {
    let e = Etcd::start();
    for i in 1000..1010 {
        let (k, v) = legacy(i);
        e.etcdctl_ok(&["put", &k, &v]);
    }
    e.etcdctl_ok(&["put", &target(1005), "conflict"]);
    let run = |args: &[&str]| {
        let out = Command::new(binary())
            .arg("migrate")
            .arg(format!("--local-etcd={}", e.endpoint()))
            .args(args)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };

    let (code, stdout, _) = run(&[]);
    assert_eq!(code, Some(0));
    assert_eq!(
        stdout,
        format!(
            "migrate: dry-run legacy_keys=10 to_write=9 already_migrated=0 conflicts=1 malformed=0\n\
             regions: b=10\n\
             conflict: {} -> {}\n",
            legacy_key(1005),
            target(1005)
        )
    );

    let (code, stdout, _) = run(&["--apply"]);
    assert_eq!(code, Some(0));
    assert!(
        stdout.starts_with(
            "migrate: apply legacy_keys=10 to_write=9 already_migrated=0 conflicts=1 malformed=0\n\
             regions: b=10\n\
             applied: written=9 txns=1 raced_equal=0 raced_conflict=0\n"
        ),
        "{stdout}"
    );

    let (code, stdout, _) = run(&["--delete-legacy"]);
    assert_eq!(code, Some(1), "refused: {stdout}");
    assert!(
        stdout.contains(&format!(
            "delete-legacy: refused: 1 of 10 legacy keys have no v1 key with an equal value\n  missing (conflict): {}\n",
            legacy_key(1005)
        )),
        "{stdout}"
    );

    for (args, flag) in [
        (&["--legacy-prefix=/aether/v1/"][..], "--legacy-prefix"),
        (&["--cluster=a/b"][..], "--cluster"),
        (&["--max-txn-ops=1"][..], "--max-txn-ops"),
    ] {
        let (code, _, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with(&format!("error: {flag}")), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }

    // Resolved: the conflicting v1 key is removed; then apply and delete.
    e.etcdctl_ok(&["del", &target(1005)]);
    let (code, stdout, _) = run(&["--apply", "--delete-legacy"]);
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.ends_with("delete-legacy: deleted 10 keys under /aether/services/\n"),
        "{stdout}"
    );
    let left = e.etcdctl_ok(&["get", "--prefix", "--keys-only", LEGACY]);
    assert_eq!(left.trim(), "", "legacy keys left: {left}");
}
