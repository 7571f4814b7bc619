//! The registry view and the `endpoints` command against real etcd, with
//! the mirror engine bringing another region's endpoints in.

mod common;

use aether_replicator::etcd::LeaseId;
use common::mirror::{count, put_many};

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use aether_replicator::app::endpoints::{self, EndpointsOptions, Output};
use aether_replicator::etcd::{Client, ClientConfig, Delete, Put, Range};
use aether_replicator::mirror::state::State;
use aether_replicator::mirror::{DEFAULT_STATE_ROOT, Engine, MirrorConfig};
use aether_replicator::schema::{EndpointKey, Schema};
use aether_replicator::view::{
    Change, OriginStatus, PRIORITY_FOREIGN, PRIORITY_REGION, PRIORITY_ZONE, RegistryView,
    ViewConfig, unix_ms_now,
};
use common::replicator::binary;
use common::{Etcd, FaultProxy};
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;

const T: Duration = Duration::from_secs(30);

fn client(endpoint: &str) -> Client {
    let mut cfg = ClientConfig::new([endpoint]);
    cfg.request_timeout = Duration::from_secs(3);
    cfg.connect_timeout = Duration::from_secs(1);
    Client::connect(cfg).expect("client")
}

fn key(region: &str, service: &str, ip: &str) -> String {
    let k = EndpointKey::new(region, "c1", service, "http", ip).unwrap();
    Schema::default().endpoint_key(&k)
}

fn value(region: &str, zone: &str, extra: &str) -> String {
    format!(r#"{{"clusterName":"c1","region":"{region}","zone":"{zone}"{extra}}}"#)
}

/// Writes the endpoint `ip` of `service` in `region` (zone `zone`).
async fn put_endpoint(c: &Client, region: &str, service: &str, ip: &str, zone: &str) {
    c.put(Put::new(key(region, service, ip), value(region, zone, "")))
        .await
        .unwrap();
}

/// Deletes the endpoint `ip` of `service` in `region`.
async fn delete_endpoint(c: &Client, region: &str, service: &str, ip: &str) {
    c.delete(Delete::key(key(region, service, ip)))
        .await
        .unwrap();
}

/// The next change, within a bounded wait.
async fn next(rx: &mut Receiver<Change>) -> Change {
    tokio::time::timeout(T, rx.recv())
        .await
        .expect("a change in time")
        .expect("the change channel is open")
}

/// A change as `kind region/service/ip priority`.
fn describe(c: &Change) -> String {
    match c.endpoint() {
        Some(e) => format!(
            "{} {}/{}/{} {}",
            c.kind(),
            e.key.region,
            e.key.service,
            e.key.ip,
            e.priority
        ),
        None => c.kind().to_string(),
    }
}

/// Origin `region`'s state key under the default state root.
fn state_key(region: &str) -> String {
    format!("{DEFAULT_STATE_ROOT}{region}/state")
}

/// A state value: `synced`, heartbeat at `heartbeat_unix_ms`.
fn state(synced: bool, heartbeat_unix_ms: i64) -> State {
    State {
        revision: 1,
        lease: LeaseId::NONE,
        holder: 1,
        source_cluster: 1,
        source_id: 0,
        heartbeat_unix_ms,
        synced,
        lease_ttl: 0,
    }
}

fn mirror_config(ttl_secs: u64) -> MirrorConfig {
    let mut cfg = MirrorConfig::new("a");
    cfg.lease_ttl = Duration::from_secs(ttl_secs);
    cfg.max_backoff = Duration::from_millis(500);
    cfg
}

fn view_config() -> ViewConfig {
    let mut cfg = ViewConfig::new("b").zone("b-1");
    // Small pages: the snapshot takes several, all at one revision.
    cfg.page_size = 7;
    cfg.max_backoff = Duration::from_millis(500);
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn view_merges_local_and_mirrored_endpoints_and_follows_them() {
    let (a_etcd, b_etcd) = (Etcd::start(), Etcd::start());
    let (a, b) = (client(&a_etcd.endpoint()), client(&b_etcd.endpoint()));
    // Region a: 30 endpoints in three services.
    put_many(
        &a,
        (0..30).map(|i| {
            (
                key("a", &format!("s{}", i % 3), &format!("10.1.0.{i}")),
                value("a", "a-1", ""),
            )
        }),
    )
    .await;
    // Region b's own: 10 in zone b-1, 10 in b-2, one value that is not
    // JSON, one key under the root that is not an endpoint key.
    put_many(
        &b,
        (0..20).map(|i| {
            let zone = if i < 10 { "b-1" } else { "b-2" };
            (
                key("b", &format!("s{}", i % 3), &format!("10.2.0.{i}")),
                value("b", zone, r#","port":8080"#),
            )
        }),
    )
    .await;
    b.put(Put::new(key("b", "s0", "10.2.9.9"), "not json"))
        .await
        .unwrap();
    b.put(Put::new("/aether/v1/regions/b/clusters/c1/meta", "x"))
        .await
        .unwrap();

    let engine = Engine::start(a.clone(), vec![("b".into(), b.clone())], mirror_config(2)).unwrap();
    tokio::time::timeout(T, engine.wait_synced()).await.unwrap();
    let synced = tokio::time::timeout(T, async {
        while count(&b, "/aether/v1/regions/a/").await < 30 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(synced.is_ok(), "a's endpoints never reached b");

    let revision_before = count_revision(&b).await;
    let view = RegistryView::start(b.clone(), view_config()).await.unwrap();
    let mut rx = view.subscribe();
    let snap = view.snapshot();
    assert_eq!(snap.len(), 51);
    assert_eq!(view.skipped(), 1, "the meta key is skipped, once");
    let by_priority = |p: u8| snap.iter().filter(|e| e.priority == p).count();
    assert_eq!(by_priority(PRIORITY_ZONE), 10);
    assert_eq!(
        by_priority(PRIORITY_REGION),
        11,
        "b-2 and the one without a zone"
    );
    assert_eq!(by_priority(PRIORITY_FOREIGN), 30);
    for e in snap.iter() {
        let want = match (e.key.region.as_str(), e.zone.as_deref()) {
            ("a", _) => PRIORITY_FOREIGN,
            ("b", Some("b-1")) => PRIORITY_ZONE,
            _ => PRIORITY_REGION,
        };
        assert_eq!(e.priority, want, "{e:?}");
        assert_eq!(
            e.key.region == "a",
            !e.lease.is_none(),
            "only mirrored keys are leased"
        );
    }
    let raw = snap
        .get(&EndpointKey::new("b", "c1", "s0", "http", "10.2.9.9").unwrap())
        .unwrap();
    assert!(!raw.value.is_json());
    let one = snap
        .get(&EndpointKey::new("b", "c1", "s0", "http", "10.2.0.0").unwrap())
        .unwrap();
    assert_eq!(one.value.field("port"), Some(&serde_json::json!(8080)));
    // Each list is closest first; a service has all three priorities.
    let s0 = view.endpoints("s0");
    assert_eq!(s0.len(), 10 + 7 + 1);
    let prios: Vec<u8> = s0.iter().map(|e| e.priority).collect();
    let mut sorted = prios.clone();
    sorted.sort();
    assert_eq!(prios, sorted);
    assert!(view.revision() >= revision_before);

    // Live changes in b's own subtree.
    put_endpoint(&b, "b", "s1", "10.2.1.1", "b-1").await;
    assert_eq!(describe(&next(&mut rx).await), "added b/s1/10.2.1.1 0");
    // A rewrite of an equal value is not a change; the move to another
    // zone is, and changes the priority.
    put_endpoint(&b, "b", "s1", "10.2.1.1", "b-1").await;
    put_endpoint(&b, "b", "s1", "10.2.1.1", "b-2").await;
    match next(&mut rx).await {
        Change::Updated { old, new, .. } => {
            assert_eq!(
                (old.priority, new.priority),
                (PRIORITY_ZONE, PRIORITY_REGION)
            );
            assert_eq!(new.zone.as_deref(), Some("b-2"));
        }
        other => panic!("expected an update, got {other:?}"),
    }
    delete_endpoint(&b, "b", "s1", "10.2.1.1").await;
    let removed = next(&mut rx).await;
    assert_eq!(describe(&removed), "removed b/s1/10.2.1.1 1");

    // Live changes in a's subtree arrive through the mirror.
    put_endpoint(&a, "a", "s2", "10.1.9.1", "a-1").await;
    let added = next(&mut rx).await;
    assert_eq!(describe(&added), "added a/s2/10.1.9.1 2");
    assert!(!added.endpoint().unwrap().lease.is_none());
    a.put(Put::new(
        key("a", "s2", "10.1.9.1"),
        value("a", "a-2", r#","weight":5"#),
    ))
    .await
    .unwrap();
    assert_eq!(describe(&next(&mut rx).await), "updated a/s2/10.1.9.1 2");
    delete_endpoint(&a, "a", "s2", "10.1.9.1").await;
    assert_eq!(describe(&next(&mut rx).await), "removed a/s2/10.1.9.1 2");

    // A key that is not an endpoint key is counted and skipped.
    b.put(Put::new(
        "/aether/v1/regions/b/clusters/c1/services/s0/x",
        "y",
    ))
    .await
    .unwrap();
    put_endpoint(&b, "b", "s0", "10.2.7.7", "b-1").await;
    assert_eq!(describe(&next(&mut rx).await), "added b/s0/10.2.7.7 0");
    assert_eq!(view.skipped(), 2);

    // Region a dies: its lease lapses on b and its endpoints leave the
    // view, one removal each; b's own stay.
    engine.abort();
    let mut removed_a = 0;
    let mut origin_gone = false;
    while removed_a < 30 || !origin_gone {
        let c = next(&mut rx).await;
        match &c {
            Change::Removed { endpoint, .. } if endpoint.key.region == "a" => removed_a += 1,
            // Its state key goes with the lease (and, once its endpoints
            // are gone too, the origin is no longer listed).
            Change::Origin { region, status, .. } if region == "a" => {
                origin_gone = status
                    .as_ref()
                    .is_none_or(|s| !s.state_present && !s.synced);
            }
            other => panic!("expected removals of a's endpoints, got {other:?}"),
        }
    }
    let snap = view.snapshot();
    assert_eq!(snap.iter().filter(|e| e.key.region == "a").count(), 0);
    assert!(snap.origin("a").is_none(), "{:?}", snap.origin("a"));
    assert_eq!(snap.len(), 22);
    assert_eq!(view.resyncs(), 0);

    // Dropping the view stops its task: the channel closes.
    drop(view);
    let closed = tokio::time::timeout(T, async {
        loop {
            match rx.recv().await {
                Err(RecvError::Closed) => return,
                Err(RecvError::Lagged(_)) | Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the view's task outlived it");
}

async fn count_revision(c: &Client) -> i64 {
    c.range(Range::key("x")).await.unwrap().header.revision
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_while_cut_off_forces_a_resync_with_the_diff() {
    let b_etcd = Etcd::start();
    let b = client(&b_etcd.endpoint());
    let proxy = FaultProxy::start(b_etcd.client_addr()).await;
    put_many(
        &b,
        (0..5).map(|i| (key("b", "s", &format!("10.0.0.{i}")), value("b", "b-1", ""))),
    )
    .await;
    let view = RegistryView::start(client(&proxy.endpoint()), view_config())
        .await
        .unwrap();
    let (snap, mut rx) = view.snapshot_and_subscribe();
    assert_eq!(snap.len(), 5);
    // The watch is live.
    put_endpoint(&b, "b", "s", "10.0.0.5", "b-2").await;
    assert_eq!(describe(&next(&mut rx).await), "added b/s/10.0.0.5 1");
    assert!(view.is_connected());

    let accepted = proxy.accepted_connections();
    proxy.cut();
    // The view's watch reconnecting (into the black hole) shows that its
    // stream is gone: nothing written from here on reaches it live.
    assert!(common::wait_until_async(T, || proxy.accepted_connections() > accepted).await);
    assert!(
        common::wait_until_async(T, || !view.is_connected()).await,
        "the view reports its watch as down"
    );
    put_endpoint(&b, "b", "s", "10.0.0.6", "b-1").await;
    put_endpoint(&b, "b", "s", "10.0.0.1", "b-2").await;
    delete_endpoint(&b, "b", "s", "10.0.0.2").await;
    // Here and gone again during the cut: never seen.
    put_endpoint(&b, "b", "s", "10.0.0.7", "b-1").await;
    delete_endpoint(&b, "b", "s", "10.0.0.7").await;
    // Another region's state key appears: the resync brings it too.
    b.put(Put::new(state_key("c"), state(true, 1).encode()))
        .await
        .unwrap();
    let rev = count_revision(&b).await;
    b.compact(rev, true).await.unwrap();
    proxy.heal();

    let mut got = Vec::new();
    loop {
        let c = next(&mut rx).await;
        if let Change::Resynced {
            revision,
            compact_revision,
            added,
            updated,
            removed,
        } = &c
        {
            assert_eq!((*added, *updated, *removed), (1, 1, 1));
            assert_eq!(*compact_revision, Some(rev));
            assert!(*revision >= rev);
            break;
        }
        got.push(describe(&c));
    }
    got.sort();
    assert_eq!(
        got,
        [
            "added b/s/10.0.0.6 0",
            "origin",
            "removed b/s/10.0.0.2 0",
            "updated b/s/10.0.0.1 1"
        ]
    );
    assert_eq!(view.resyncs(), 1);
    assert!(view.origins()["c"].synced);
    // And the state watch resumed after the resync.
    b.delete(Delete::key(state_key("c"))).await.unwrap();
    match next(&mut rx).await {
        Change::Origin { region, status, .. } => {
            assert_eq!((region.as_str(), status), ("c", None));
        }
        other => panic!("expected origin c to go, got {other:?}"),
    }
    // The view equals a fresh one, and keeps following the watch.
    let fresh = RegistryView::start(b.clone(), view_config()).await.unwrap();
    let pairs = |v: &RegistryView| -> Vec<(EndpointKey, Option<String>)> {
        v.snapshot()
            .iter()
            .map(|e| (e.key.clone(), e.zone.clone()))
            .collect()
    };
    assert_eq!(pairs(&view), pairs(&fresh));
    put_endpoint(&b, "b", "s", "10.0.0.8", "b-1").await;
    assert_eq!(describe(&next(&mut rx).await), "added b/s/10.0.0.8 0");
    view.shutdown().await;
}

/// A writer tests can read while the command runs.
#[derive(Clone, Default)]
struct Shared(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn options(output: Output, watch: bool, service: Option<&str>) -> EndpointsOptions {
    EndpointsOptions {
        view: view_config(),
        service: service.map(str::to_owned),
        watch,
        output,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_command_prints_tables_and_json() {
    let e = Etcd::start();
    let c = client(&e.endpoint());
    c.put(Put::new(
        key("b", "web", "10.0.0.10"),
        value("b", "b-2", ""),
    ))
    .await
    .unwrap();
    put_endpoint(&c, "b", "web", "10.0.0.9", "b-1").await;
    c.put(Put::new(key("a", "web", "10.0.0.1"), "raw bytes"))
        .await
        .unwrap();
    put_endpoint(&c, "b", "db", "fd00::1", "b-1").await;

    assert_eq!(
        tables(&c).await,
        "\
ORIGIN  KIND      SYNCED  STALENESS  ENDPOINTS
a       no-state  no      unknown    1
b       local     yes     0.0s       3

SERVICE  PROTOCOL  IP         REGION  CLUSTER  ZONE  PRIORITY
db       http      fd00::1    b       c1       b-1   0
web      http      10.0.0.9   b       c1       b-1   0
web      http      10.0.0.10  b       c1       b-2   1
web      http      10.0.0.1   a       c1       -     2
"
    );

    let mut out = Vec::new();
    endpoints::run(
        c.clone(),
        &options(Output::Json, false, Some("web")),
        &mut out,
        async {},
    )
    .await
    .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let eps = doc["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 3);
    assert!(doc["revision"].as_i64().unwrap() > 0);
    assert_eq!(doc["skipped"], 0);
    assert_eq!(eps[0]["ip"], "10.0.0.9");
    assert_eq!(eps[0]["priority"], 0);
    assert_eq!(eps[0]["value"]["zone"], "b-1");
    assert_eq!(eps[0]["value_is_json"], true);
    assert_eq!(eps[2]["region"], "a");
    assert_eq!(eps[2]["zone"], serde_json::Value::Null);
    assert_eq!(eps[2]["value"], "raw bytes");
    assert_eq!(eps[2]["value_is_json"], false);
    assert_eq!(eps[2]["origin_synced"], false, "a has no state key");
    assert_eq!(
        eps[0]["origin_synced"], true,
        "b is the viewer's own region"
    );
    let origins = doc["origins"].as_array().unwrap();
    assert_eq!(origins.len(), 2);
    assert_eq!(origins[0]["region"], "a");
    assert_eq!(origins[0]["synced"], false);
    assert_eq!(origins[0]["staleness_seconds"], serde_json::Value::Null);
    assert_eq!(origins[1]["region"], "b");
    assert_eq!(origins[1]["kind"], "local");
    assert_eq!(origins[1]["synced"], true);
    assert_eq!(origins[1]["staleness_seconds"], 0.0);

    // Watching, as JSON lines, one service only.
    let buf = Shared::default();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = {
        let (c, mut w) = (c.clone(), buf.clone());
        tokio::spawn(async move {
            endpoints::run(
                c,
                &options(Output::Json, true, Some("web")),
                &mut w,
                async {
                    let _ = stopped.await;
                },
            )
            .await
        })
    };
    let lines = |n: usize| {
        let buf = buf.clone();
        async move {
            tokio::time::timeout(T, async {
                loop {
                    // Count complete lines only: the writer may be mid-line.
                    let text = buf.text();
                    if text.matches('\n').count() >= n {
                        return text;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .expect("output in time")
        }
    };
    let first = lines(1).await;
    let snapshot: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    assert_eq!(snapshot["event"], "snapshot");
    assert_eq!(snapshot["endpoints"].as_array().unwrap().len(), 3);
    put_endpoint(&c, "b", "db", "fd00::2", "b-1").await;
    put_endpoint(&c, "b", "web", "10.0.0.9", "b-2").await;
    delete_endpoint(&c, "a", "web", "10.0.0.1").await;
    let text = lines(4).await;
    let events: Vec<serde_json::Value> = text
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 3, "the db change is filtered out: {text}");
    assert_eq!(events[0]["event"], "updated");
    assert_eq!(events[0]["endpoint"]["priority"], 1);
    assert_eq!(events[0]["previous"]["priority"], 0);
    assert_eq!(events[1]["event"], "removed");
    assert_eq!(events[1]["endpoint"]["ip"], "10.0.0.1");
    // Its last endpoint gone, origin a is no longer listed.
    assert_eq!(events[2]["event"], "origin");
    assert_eq!(events[2]["origin"]["region"], "a");
    assert_eq!(events[2]["origin"]["endpoints"], 0);
    assert_eq!(events[2]["origin"]["synced"], false);
    stop.send(()).unwrap();
    tokio::time::timeout(T, task)
        .await
        .expect("stops on shutdown")
        .unwrap()
        .unwrap();
}

#[test]
fn endpoints_binary_watches_until_sigterm_and_refuses_bad_flags() {
    for (args, flag) in [
        (&["endpoints"][..], "--region"),
        (&["endpoints", "--region=a/b"][..], "--region"),
        (&["endpoints", "--region=b", "--zone="][..], "--zone"),
        (&["endpoints", "--region=b", "--output=xml"][..], "--output"),
        (&["endpoints", "--region=b", "--root=x/"][..], "--root"),
    ] {
        let out = Command::new(binary()).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error"), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
    // Unreachable etcd: exit 1 with an error.
    let out = Command::new(binary())
        .args(["endpoints", "--region=b", "--local-etcd=http://127.0.0.1:1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));

    let e = Etcd::start();
    let mut child = Command::new(binary())
        .args([
            "endpoints",
            "--region=b",
            "--zone=b-1",
            "--watch",
            &format!("--local-etcd={}", e.endpoint()),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Lines arrive through a thread, so that every wait is bounded.
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in stdout.lines() {
            if tx.send(line.unwrap_or_default()).is_err() {
                return;
            }
        }
    });
    let mut head = Vec::new();
    while head.len() < 4 {
        head.push(
            rx.recv_timeout(T)
                .expect("the origins and the table header"),
        );
    }
    assert!(head[0].starts_with("ORIGIN  KIND"), "{head:?}");
    assert_eq!(head[1], "b       local  yes     0.0s       0", "{head:?}");
    assert_eq!(head[2], "", "{head:?}");
    assert!(head[3].starts_with("SERVICE  PROTOCOL  IP"), "{head:?}");
    e.etcdctl_ok(&["put", &key("b", "web", "10.0.0.3"), &value("b", "b-1", "")]);
    let line = rx.recv_timeout(T).expect("a change line");
    assert!(
        line.starts_with(
            "added service=web protocol=http ip=10.0.0.3 region=b cluster=c1 zone=b-1 priority=0 revision="
        ),
        "{line}"
    );
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let status = common::wait_until(T, || matches!(child.try_wait(), Ok(Some(_))));
    assert!(status, "did not exit on SIGTERM");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// The `endpoints` command's tables, once.
async fn tables(c: &Client) -> String {
    let mut out = Vec::new();
    endpoints::run(
        c.clone(),
        &options(Output::Table, false, None),
        &mut out,
        async {},
    )
    .await
    .unwrap();
    String::from_utf8(out).unwrap()
}

/// The origins table of the `endpoints` command, once.
async fn origins_table(c: &Client) -> String {
    let text = tables(c).await;
    text.split("\n\n").next().unwrap().to_owned()
}

/// The next origin change for `region`, counting the endpoints of `region`
/// added before it.
async fn next_origin(rx: &mut Receiver<Change>, region: &str) -> (Option<OriginStatus>, usize) {
    let mut added = 0;
    loop {
        match next(rx).await {
            Change::Origin {
                region: r, status, ..
            } if r == region => return (status, added),
            Change::Added { endpoint, .. } if endpoint.key.region == region => added += 1,
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origins_show_synced_and_staleness_and_go_with_the_lease() {
    common::init_logging();
    let (a_etcd, b_etcd) = (Etcd::start(), Etcd::start());
    let (a, b) = (client(&a_etcd.endpoint()), client(&b_etcd.endpoint()));
    const N: usize = 300;
    put_many(
        &a,
        (0..N).map(|i| {
            (
                key(
                    "a",
                    &format!("s{}", i % 3),
                    &format!("10.1.{}.{}", i / 256, i % 256),
                ),
                value("a", "a-1", ""),
            )
        }),
    )
    .await;
    put_endpoint(&b, "b", "s0", "10.2.0.1", "b-1").await;

    let view = RegistryView::start(b.clone(), view_config()).await.unwrap();
    let mut rx = view.subscribe();
    let origins = view.origins();
    assert_eq!(
        origins.keys().collect::<Vec<_>>(),
        ["b"],
        "only the viewer's own"
    );
    assert!(origins["b"].local && origins["b"].synced);
    assert_eq!(origins["b"].staleness(), Some(Duration::ZERO));

    // A first copy under way: the state key says not synced. Its endpoints
    // are in the view, and marked so.
    b.put(Put::new(state_key("a"), state(false, 0).encode()))
        .await
        .unwrap();
    let (status, _) = next_origin(&mut rx, "a").await;
    let status = status.expect("a is listed");
    assert!(status.state_present && !status.synced);
    assert_eq!(status.staleness(), None, "no heartbeat yet");
    put_endpoint(&b, "a", "s0", "10.1.9.9", "a-1").await;
    assert_eq!(describe(&next(&mut rx).await), "added a/s0/10.1.9.9 2");
    assert_eq!(view.endpoints("s0").len(), 2);
    let synced_only = view.endpoints_synced_only("s0");
    assert_eq!(synced_only.len(), 1);
    assert_eq!(synced_only[0].key.region, "b");
    assert!(!view.snapshot().is_synced("a"));
    let table = origins_table(&b).await;
    assert!(
        table.contains("\na       mirrored  no      unknown    1\n"),
        "{table}"
    );
    // A heartbeat alone changes nothing on the stream; the view has it.
    let beat = unix_ms_now() - 3_000;
    b.put(Put::new(state_key("a"), state(false, beat).encode()))
        .await
        .unwrap();
    assert!(common::wait_until_async(T, || view.origins()["a"].heartbeat_unix_ms == beat).await);
    let stale = view.origins()["a"].staleness().unwrap();
    assert!(stale >= Duration::from_secs(3) && stale < T, "{stale:?}");
    // The hand-written key and endpoint go; the engine takes over.
    delete_endpoint(&b, "a", "s0", "10.1.9.9").await;
    b.delete(Delete::key(state_key("a"))).await.unwrap();
    loop {
        if let (None, _) = next_origin(&mut rx, "a").await {
            break;
        }
    }
    assert!(!view.origins().contains_key("a"));

    let engine = Engine::start(a.clone(), vec![("b".into(), b.clone())], mirror_config(2)).unwrap();
    // The engine claims b unsynced, copies, then marks it synced: by then
    // every endpoint of the first copy has reached the view.
    let (first, mut added) = next_origin(&mut rx, "a").await;
    let first = first.expect("listed");
    assert!(first.state_present);
    let last = if first.synced {
        first
    } else {
        loop {
            let (status, more) = next_origin(&mut rx, "a").await;
            added += more;
            let status = status.expect("listed");
            if status.synced {
                break status;
            }
        }
    };
    assert_eq!(
        added, N,
        "the synced marker came after the whole first copy"
    );
    assert!(last.state_present && last.heartbeat_unix_ms > 0);
    assert_eq!(view.snapshot().synced_endpoints("s0").len(), N / 3 + 1);
    tokio::time::timeout(T, engine.wait_synced()).await.unwrap();
    // The engine heartbeats: the copy is current.
    let stale = view.origins()["a"].staleness().expect("a heartbeat");
    assert!(stale < Duration::from_secs(10), "{stale:?}");
    let table = origins_table(&b).await;
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("a "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(row[..3], ["a", "mirrored", "yes"], "{table}");
    assert!(row[3].ends_with('s') && row[3] != "unknown", "{table}");
    assert_eq!(row[4], N.to_string(), "{table}");
    // A view started now reads a synced from its snapshot.
    let fresh = RegistryView::start(b.clone(), view_config()).await.unwrap();
    assert!(fresh.origins()["a"].synced);
    fresh.shutdown().await;

    // The engine stops; the lease lapses: the state key and the endpoints
    // go, and so does the origin.
    engine.abort();
    let gone = common::wait_until_async(T, || {
        let snap = view.snapshot();
        snap.origin("a").is_none() && snap.iter().all(|e| e.key.region != "a")
    })
    .await;
    assert!(gone, "{:?}", view.origins().get("a"));
    assert_eq!(count(&b, DEFAULT_STATE_ROOT).await, 0);
    assert_eq!(view.snapshot().len(), 1);
    let table = origins_table(&b).await;
    assert_eq!(
        table,
        "ORIGIN  KIND   SYNCED  STALENESS  ENDPOINTS\nb       local  yes     0.0s       1"
    );
    view.shutdown().await;
}
