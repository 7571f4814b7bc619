//! The client's transport against real etcd processes: TLS from memory and
//! from the system's roots, round-robin balancing, retries of unary calls
//! and per-call timeouts.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use aether_etcd::{
    Balance, Client, ClientConfig, Credentials, Error, Put, Range, RetryPolicy, TlsConfig,
};
use aether_test_kit::{Cluster, Etcd, FaultProxy, eventually, generate_mtls, generate_tls};

/// One-way delay of the proxy in the in-flight tests: a call's round trip
/// through it takes twice this, and the proxy is cut once the call has
/// reached etcd, while the answer is on its way back.
const LATENCY: Duration = Duration::from_millis(300);

/// How long a wait for etcd or the client lasts.
const T: Duration = Duration::from_secs(20);

fn config(endpoints: Vec<String>) -> ClientConfig {
    ClientConfig::new(endpoints).with_request_timeout(Duration::from_secs(5))
}

// ---- configuration ----------------------------------------------------------

/// A config made with the `with_*` builders alone reaches etcd, and each
/// setting that shows from outside takes effect: the endpoints are
/// replaced by the synced member list, the credentials authenticate, and a
/// watch with a one-byte buffer still delivers (one response at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_built_with_the_builders_alone() {
    let etcd = Etcd::start();
    let root = Client::connect(config(etcd.endpoints())).unwrap();
    root.user_add("root", "rootpw").await.unwrap();
    root.user_grant_role("root", "root").await.unwrap();
    root.auth_enable().await.unwrap();

    let built = ClientConfig::default()
        // Nothing listens on port 9: the sync must drop it.
        .with_endpoints([etcd.endpoint(), "http://127.0.0.1:9".to_string()])
        .with_credentials_of(Credentials {
            user: "root".into(),
            password: "rootpw".into(),
        })
        .with_connect_timeout(Duration::from_secs(1))
        .with_request_timeout(Duration::from_secs(5))
        .with_keepalive(Duration::from_secs(2), Duration::from_secs(1))
        .with_max_decoding_message_size(8 << 20)
        .with_max_encoding_message_size(8 << 20)
        .with_windows(1 << 20, 4 << 20)
        .with_watch_require_leader(false)
        .with_auto_sync_interval(Duration::from_millis(100))
        .with_watcher_buffer_bytes(1)
        .with_connections(2)
        .with_balance(Balance::RoundRobin)
        .with_retry(RetryPolicy::new(2));
    let c = Client::connect(built).unwrap();
    eventually("the endpoints are the synced member list")
        .within(T)
        .until_eq(vec![etcd.endpoint()], async || c.endpoints())
        .await;
    let (_, mut watcher) = c
        .watch(aether_etcd::WatchOptions::prefix("/built/").start_revision(1))
        .unwrap();
    for i in 0..3 {
        c.put(Put::new(format!("/built/{i}"), "v")).await.unwrap();
    }
    let mut seen = 0;
    while seen < 3 {
        let resp = tokio::time::timeout(T, watcher.message())
            .await
            .unwrap_or_else(|_| panic!("only {seen} of 3 events within {T:?}"))
            .unwrap()
            .expect("the watch ended");
        seen += resp.events.len();
    }
    assert_eq!(seen, 3);
    assert!(c.authentications() >= 1, "the credentials were never used");
}

// ---- TLS ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_from_in_memory_pem() {
    let dir = tempfile::tempdir().unwrap();
    let pki = generate_mtls(dir.path());
    let etcd = Etcd::builder().tls(pki.clone()).start();
    let tls = TlsConfig::new()
        .with_ca_pem(pki.ca_pem())
        .with_client_pem(pki.client_cert_pem(), pki.client_key_pem());
    let c = Client::connect(config(etcd.endpoints()).with_tls(tls.clone())).unwrap();
    c.put(Put::new("/pem", "ok")).await.unwrap();
    assert_eq!(
        c.range(Range::key("/pem")).await.unwrap().kvs()[0].value(),
        "ok"
    );
    // Nothing to reload: in-memory PEM never changes.
    assert!(!c.reload_tls().unwrap());

    // The same CA without the client identity: the server refuses.
    let no_identity = TlsConfig::new().with_ca_pem(pki.ca_pem());
    let cfg = config(etcd.endpoints())
        .with_tls(no_identity)
        .with_retry(RetryPolicy::none());
    let err = Client::connect(cfg)
        .unwrap()
        .range(Range::key("/pem"))
        .await
        .unwrap_err();
    // A TLS failure, or from etcd 3.4 often a bare broken connection
    // (tests/client_errors.rs judges each version's shape).
    assert!(
        matches!(&err, Error::Tls { .. } | Error::Unavailable(_)),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_material_in_two_places_or_not_pem_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let pki = generate_tls(dir.path());
    let url = vec!["https://127.0.0.1:2379".to_string()];
    let both = TlsConfig::new()
        .with_ca_file(pki.ca.display().to_string())
        .with_ca_pem(pki.ca_pem());
    let not_pem = TlsConfig::new().with_ca_pem(b"not a certificate".to_vec());
    let mut half = TlsConfig::new();
    half.cert_pem = Some(pki.client_cert_pem());
    for (tls, want) in [
        (both, "give a file or PEM, not both"),
        (not_pem, "no PEM certificate in it"),
        (half, "needs both cert and key"),
    ] {
        let err = Client::connect(config(url.clone()).with_tls(tls)).err();
        let text = err.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(
            matches!(err, Some(Error::InvalidConfig(_))) && text.contains(want),
            "want an InvalidConfig saying {want:?}, got {err:?}"
        );
        assert!(!text.contains('\n'), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_without_a_ca_does_not_trust_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = generate_tls(dir.path());
    let etcd = Etcd::builder().tls(pki).start();
    // No TLS config at all: the system's roots, which do not hold the
    // test CA, verify the server.
    let cfg = config(etcd.endpoints()).with_retry(RetryPolicy::none());
    match Client::connect(cfg) {
        Ok(c) => {
            let err = c.range(Range::key("/x")).await.unwrap_err();
            assert!(
                err.to_string().contains("UnknownIssuer"),
                "want the handshake refused for an unknown issuer, got {err}"
            );
        }
        // A machine without any system root cannot verify anything either.
        Err(e) => assert!(e.to_string().contains("native"), "{e}"),
    }
}

/// With `SSL_CERT_FILE` naming the test CA and no CA configured, the client
/// trusts the server: the system's roots are used, and rustls-native-certs
/// reads them from there. In a child process, so no other test sees the
/// variable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_without_a_ca_uses_the_system_roots() {
    let dir = tempfile::tempdir().unwrap();
    let pki = generate_tls(dir.path());
    let etcd = Etcd::builder().tls(pki.clone()).start();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "system_roots_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SSL_CERT_FILE", &pki.ca)
        .env_remove("SSL_CERT_DIR")
        .env("SYSTEM_ROOTS_CHILD_URL", etcd.endpoint())
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The marker, not just the exit code: a filter that matched no test
    // would exit 0 too.
    assert!(
        out.status.success() && all.contains("SYSTEM_ROOTS_CHILD ok"),
        "child: {all}"
    );
}

/// Run by [`https_without_a_ca_uses_the_system_roots`] in a child process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run in a child process by https_without_a_ca_uses_the_system_roots"]
async fn system_roots_child() {
    let url = std::env::var("SYSTEM_ROOTS_CHILD_URL").expect("run by its parent test");
    let c = Client::connect(config(vec![url]).with_retry(RetryPolicy::none())).unwrap();
    c.put(Put::new("/roots", "ok")).await.unwrap();
    let got = c.range(Range::key("/roots")).await.unwrap();
    assert_eq!(got.kvs()[0].value(), "ok");
    println!("SYSTEM_ROOTS_CHILD ok");
}

// ---- balancing ------------------------------------------------------------

/// The members that served `n` serializable reads.
async fn readers(c: &Client, n: usize) -> BTreeSet<u64> {
    let mut seen = BTreeSet::new();
    for _ in 0..n {
        let resp = c.range(Range::key("/rr").serializable()).await.unwrap();
        seen.insert(resp.header.member_id);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_spreads_reads_over_every_member_and_pinned_does_not() {
    let cluster = Cluster::start(3);
    let pinned = Client::connect(config(cluster.endpoints())).unwrap();
    let spread =
        Client::connect(config(cluster.endpoints()).with_balance(Balance::RoundRobin)).unwrap();
    let members: BTreeSet<u64> = pinned
        .member_list()
        .await
        .unwrap()
        .members
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(members.len(), 3);
    assert_eq!(readers(&spread, 12).await, members);
    // The default keeps every call on one member.
    assert_eq!(readers(&pinned, 12).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_keeps_serving_with_a_member_killed() {
    let mut cluster = Cluster::start(3);
    let cfg = config(cluster.endpoints()).with_balance(Balance::RoundRobin);
    let warm = Client::connect(cfg.clone()).unwrap();
    assert_eq!(readers(&warm, 6).await.len(), 3);
    // A follower: killing the leader would test etcd's election (writes
    // proposed to a dying leader wait out etcd's own timeout), not the
    // client.
    let leader = warm.status().await.unwrap().leader;
    let members = warm.member_list().await.unwrap().members;
    let follower = members.iter().find(|m| m.id != leader).unwrap();
    let killed = follower.client_urls[0].clone();
    let i = cluster.endpoints().iter().position(|u| *u == killed);
    cluster.members[i.expect("a member's URL")].kill();

    // Reads on connections that were open to the killed member.
    let alive = readers(&warm, 12).await;
    assert_eq!(alive.len(), 2, "{alive:?}");

    // Writes from a client that has never seen the member fail: its turn
    // comes, the connection is refused, the write goes to the next one.
    let fresh = Client::connect(cfg).unwrap();
    let mut writers = BTreeSet::new();
    for i in 0..12 {
        let resp = fresh
            .put(Put::new(format!("/rr/{i}"), "v"))
            .await
            .unwrap_or_else(|e| panic!("put {i} with {killed} down: {e}"));
        writers.insert(resp.header.member_id);
    }
    assert_eq!(writers, alive);
}

// ---- retries --------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_rides_out_a_restart_of_its_member() {
    let mut etcd = Etcd::start();
    let patient =
        RetryPolicy::new(40).with_backoff(Duration::from_millis(50), Duration::from_millis(500));
    let cfg = ClientConfig::new(etcd.endpoints())
        .with_request_timeout(Duration::from_secs(30))
        .with_retry(patient);
    let c = Client::connect(cfg.clone()).unwrap();
    let once = Client::connect(cfg.with_retry(RetryPolicy::none())).unwrap();
    c.put(Put::new("/restart", "v")).await.unwrap();

    etcd.kill();
    let restart = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_millis(300));
        etcd.restart();
        etcd
    });
    let started = Instant::now();
    // Without retries the read fails at once ...
    let err = once.range(Range::key("/restart")).await.unwrap_err();
    assert!(err.is_transient() && !err.maybe_applied(), "{err:?}");
    // ... with them it waits out the restart.
    let got = c.range(Range::key("/restart")).await.unwrap();
    assert_eq!(got.kvs()[0].value(), "v");
    let _etcd = restart.await.unwrap();
    println!("read through a restart took {:?}", started.elapsed());
}

/// A client of `[proxy, etcd]`, pinned to the proxy, with its connection
/// through it open; the proxy then delays each way by [`LATENCY`].
async fn through_a_slow_proxy(proxy: &FaultProxy, etcd: &Etcd) -> Client {
    let before = proxy.accepted_connections();
    let c = Client::connect(config(vec![proxy.endpoint(), etcd.endpoint()])).unwrap();
    c.range(Range::key("/warm")).await.unwrap();
    let opened = proxy.accepted_connections() - before;
    assert_eq!(opened, 1, "connections opened through the proxy");
    proxy.set_latency(LATENCY);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_may_have_been_applied_is_not_retried() {
    let etcd = Etcd::start();
    let proxy = FaultProxy::start(etcd.client_addr()).await;
    let c = through_a_slow_proxy(&proxy, &etcd).await;
    let put = tokio::spawn({
        let c = c.clone();
        async move { c.put(Put::new("/maybe", "1")).await }
    });
    // Past the request's arrival, before the answer's: once etcd has
    // applied the put, its answer is still on its way back through the
    // proxy's delay line, and the connection dies under it.
    let direct = Client::connect(config(etcd.endpoints())).unwrap();
    let version = async || {
        let r = direct.range(Range::key("/maybe")).await.unwrap();
        r.kvs().first().map_or(0, |kv| kv.version())
    };
    eventually("the put applied")
        .within(T)
        .every(Duration::from_millis(10))
        .until(async || match version().await {
            0 => Err("no /maybe yet".to_string()),
            v => Ok(v),
        })
        .await;
    proxy.cut();
    let err = put.await.unwrap().unwrap_err();
    // The second endpoint (etcd itself) was there: a retry would have
    // succeeded, and written it again.
    assert!(err.maybe_applied(), "{err:?}");
    let version = version().await;
    assert_eq!(version, 1, "written {version} times");
    let kvs = direct.range(Range::key("/maybe")).await.unwrap().into_kvs();

    // A read in the same spot is sent again, to the next endpoint.
    proxy.heal();
    proxy.set_latency(Duration::ZERO);
    let c = through_a_slow_proxy(&proxy, &etcd).await;
    // etcd's count of the ranges it has begun to serve.
    const RANGES: &str = r#"grpc_server_started_total{grpc_method="Range"}"#;
    let ranges = etcd.metric(RANGES).expect(RANGES);
    let read = tokio::spawn({
        let c = c.clone();
        async move { c.range(Range::key("/maybe")).await }
    });
    // The read has reached etcd, its answer not the client.
    eventually("the read reached etcd")
        .within(T)
        .every(Duration::from_millis(10))
        .until(async || match etcd.metric(RANGES) {
            Some(n) if n > ranges => Ok(()),
            n => Err(format!("{RANGES} {n:?}, {ranges} before the read")),
        })
        .await;
    proxy.cut();
    let got = read.await.unwrap().unwrap();
    assert_eq!(got.kvs().len(), kvs.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_call_timeout_fires_on_a_stalled_proxy_before_the_default() {
    let etcd = Etcd::start();
    let proxy = FaultProxy::start(etcd.client_addr()).await;
    let c = Client::connect(ClientConfig::new([proxy.endpoint()])).unwrap();
    c.put(Put::new("/stall", "v")).await.unwrap();
    let short = Duration::from_millis(300);
    let quick = c.with_timeout(short);
    assert_eq!(
        (c.timeout(), quick.timeout()),
        (Duration::from_secs(10), short)
    );

    proxy.cut();
    let slow = tokio::spawn({
        let c = c.clone();
        async move { c.range(Range::key("/stall")).await }
    });
    let started = Instant::now();
    let err = quick.range(Range::key("/stall")).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, Error::Timeout(d) if d == short), "{err:?}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(!slow.is_finished(), "the default-timeout call ended first");
    slow.abort();

    // The view shares the connections: healed, it works again.
    proxy.heal();
    let got = c
        .with_timeout(Duration::from_secs(5))
        .range(Range::key("/stall"))
        .await;
    assert_eq!(got.unwrap().kvs()[0].value(), "v");
}

/// A client spreads its calls over its connections; its `in_order` view
/// keeps them on one, so that a request cannot overtake the one sent
/// before it on another connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_order_view_sends_every_call_on_one_connection() {
    let etcd = Etcd::start();
    let proxy = FaultProxy::start(etcd.client_addr()).await;
    let trips = proxy.count_round_trips();
    let client = Client::connect(config(vec![proxy.endpoint()]).with_connections(4)).unwrap();
    let conns_of = |from: usize| {
        let conns = trips.request_conns();
        conns[from..].iter().copied().collect::<BTreeSet<usize>>()
    };
    for i in 0..8 {
        client
            .put(Put::new(format!("/spread/{i}"), "v"))
            .await
            .unwrap();
    }
    let spread = conns_of(0);
    assert_eq!(
        spread.len(),
        4,
        "calls of the client itself, by connection: {spread:?}"
    );
    let before = trips.request_conns().len();
    let ordered = client.in_order();
    for i in 0..8 {
        ordered
            .put(Put::new(format!("/ordered/{i}"), "v"))
            .await
            .unwrap();
    }
    let one = conns_of(before);
    assert_eq!(
        (one.len(), trips.request_conns().len() - before),
        (1, 8),
        "calls of the in-order view, by connection: {one:?}\n{}",
        trips.report(u32::MAX)
    );
}
