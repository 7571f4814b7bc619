//! Errors a caller can act on, provoked against real etcd (the suite runs
//! on 3.4.23 and on 3.5.1): a cluster without a quorum answers with
//! [`Error::ServerTimeout`] (etcd's own limit, about 7 s) or the client's
//! [`Error::Timeout`], both transient and maybe applied; a TLS failure is
//! [`Error::Tls`], returned at once instead of after every retry, with the
//! member it concerns and the TLS stack's chain under it.

use std::time::{Duration, Instant};

use aether_etcd::{Client, ClientConfig, Error, Put, Range, RetryPolicy, TlsConfig};
use aether_test_kit::{Cluster, Etcd, FaultProxy, generate_mtls, generate_tls};

/// Longer than etcd's own wait for a commit (5 s plus two election
/// timeouts), so that its answer arrives before the client gives up.
const PATIENT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_quorum_is_a_timeout_that_may_have_applied() {
    let mut cluster = Cluster::start(3);
    let one = vec![cluster.members[0].endpoint()];
    let c = Client::connect(ClientConfig::new(one.clone()).with_request_timeout(PATIENT)).unwrap();
    c.put(Put::new("/q", "1")).await.unwrap();
    cluster.members[1].stop();
    cluster.members[2].stop();
    // etcd's first answer and its later ones differ in shape ("request
    // timed out" as Unavailable, then "context deadline exceeded" as
    // Unknown): both are the one kind.
    for attempt in 0..2 {
        let started = Instant::now();
        let err = c.put(Put::new("/q", "2")).await.unwrap_err();
        assert!(
            matches!(err, Error::ServerTimeout(_)),
            "attempt {attempt}: want ServerTimeout, got {err:?} after {:?}",
            started.elapsed()
        );
        assert!(err.is_transient() && err.maybe_applied(), "{err:?}");
    }
    // A client that gives up first: its own deadline, or etcd's report of
    // that same deadline (sent as grpc-timeout), whichever lands first; a
    // caller acts on either the same way.
    let hasty =
        Client::connect(ClientConfig::new(one).with_request_timeout(Duration::from_secs(2)))
            .unwrap();
    let err = hasty.put(Put::new("/q", "3")).await.unwrap_err();
    assert!(
        matches!(err, Error::Timeout(d) if d == Duration::from_secs(2))
            || matches!(&err, Error::ServerTimeout(m) if m == "context deadline exceeded"),
        "{err:?}"
    );
    assert!(err.maybe_applied(), "{err:?}");
    let err = hasty.range(Range::key("/q")).await.unwrap_err();
    assert!(
        matches!(err, Error::Timeout(_) | Error::ServerTimeout(_)),
        "{err:?}"
    );
    assert!(err.is_transient(), "{err:?}");
}

/// A range with `tls` on `etcd`, through a proxy that counts the
/// connections the client opens, one per attempt (a handshake that failed
/// leaves nothing to reuse).
async fn refused(etcd: &Etcd, tls: TlsConfig) -> Refusal {
    let proxy = FaultProxy::start(etcd.client_addr()).await;
    // The default retry policy: a TLS failure must not use it.
    let cfg = ClientConfig::new(vec![proxy.tls_endpoint()])
        .with_tls(tls)
        .with_request_timeout(Duration::from_secs(10));
    let c = Client::connect(cfg).unwrap();
    let err = c.range(Range::key("/x")).await.unwrap_err();
    Refusal {
        err,
        connections: proxy.accepted_connections(),
        endpoint: proxy.tls_endpoint(),
    }
}

/// What [`refused`] saw.
struct Refusal {
    err: Error,
    /// The connections the client opened.
    connections: u64,
    /// The endpoint it dialled.
    endpoint: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_failure_is_its_own_kind_returned_at_once_with_its_chain() {
    let dir = tempfile::tempdir().unwrap();
    let pki = generate_mtls(dir.path());
    let etcd = Etcd::builder().tls(pki.clone()).start();
    // With the right material the etcd answers, and says its version.
    let tls = TlsConfig::new()
        .with_ca_pem(pki.ca_pem())
        .with_client_pem(pki.client_cert_pem(), pki.client_key_pem());
    let c = Client::connect(
        ClientConfig::new(etcd.endpoints())
            .with_tls(tls)
            .with_retry(RetryPolicy::none()),
    )
    .unwrap();
    c.put(Put::new("/x", "1")).await.unwrap();
    let version = c.status().await.unwrap().version;

    let other = tempfile::tempdir().unwrap();
    let stranger = generate_tls(other.path());
    let tls = TlsConfig::new()
        .with_ca_pem(stranger.ca_pem())
        .with_client_pem(pki.client_cert_pem(), pki.client_key_pem());
    assert_tls(&refused(&etcd, tls).await, "invalid peer certificate");

    // No client certificate: etcd 3.5 refuses it with a TLS alert, which
    // is Error::Tls at once. etcd 3.4 closes the connection after the
    // handshake, and its alert reaches the client in a minority of tries
    // (5 of 40 measured): a bare closed or broken connection is all the
    // client can know then, and it stays transient, as any broken
    // connection, so a read is tried again until an alert arrives or the
    // retries run out.
    let refusal = refused(&etcd, TlsConfig::new().with_ca_pem(pki.ca_pem())).await;
    if version.starts_with("3.4.") {
        let err = &refusal.err;
        assert!(
            matches!(err, Error::Tls { message, .. } if message.contains("received fatal alert"))
                || matches!(err, Error::Unavailable(m) if m.contains("connection closed") || m.contains("broken pipe")),
            "{version}: {err:?}"
        );
    } else {
        assert_tls(&refusal, "received fatal alert");
    }
}

/// The refusal is a TLS failure at the endpoint dialled whose message says
/// `want`, returned without retries and with its chain.
#[track_caller]
fn assert_tls(refusal: &Refusal, want: &str) {
    let err = &refusal.err;
    let Error::Tls {
        endpoint, message, ..
    } = err
    else {
        panic!("want Error::Tls saying {want:?}, got {err:?}");
    };
    assert_eq!(endpoint, &refusal.endpoint);
    assert!(message.contains(want), "{message}");
    assert!(!err.is_transient() && !err.maybe_applied(), "{err:?}");
    // Not retried: one handshake, where the retries made nine (3 s).
    assert_eq!(refusal.connections, 1, "{err:?}");
    // The chain under it is kept, not flattened into the message.
    let chain = std::iter::successors(std::error::Error::source(err), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>();
    assert!(!chain.is_empty(), "no source chain: {err:?}");
    assert!(err.to_string().contains(&refusal.endpoint), "{err}");
}
