//! The client's cluster and maintenance calls against real etcd: membership
//! changes (a learner added, started, promoted, moved and removed), leader
//! transfer, the backend hash, the snapshot stream (restored by etcd's own
//! tools, and held back by the HTTP/2 window), and the lease list. Every
//! refusal etcd sends for these is provoked for real, so a message that
//! differs between 3.4 and 3.5 shows.

use std::fmt::Debug;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use aether_etcd::{
    Client, ClientConfig, Delete, Error, LeaseId, MemberList, Put, Range, Snapshot, SnapshotChunk,
};
use aether_test_kit::{Cluster, Etcd, FaultProxy, etcdctl_command, eventually};
use futures_util::StreamExt;
use tokio::time::Instant;

/// Generous bound for anything that should happen "at once".
const T: Duration = Duration::from_secs(30);
/// A member id no cluster here has.
const UNKNOWN_ID: u64 = 0x0dd_1ea5e;

fn client(endpoints: Vec<String>) -> Client {
    Client::connect(ClientConfig::new(endpoints)).expect("client")
}

/// Calls `f` while it fails with an error `again` accepts, every 200 ms
/// for at most `T`, and returns what it answered then with the number of
/// refusals before it; panics with the last refusal when it never
/// stopped.
async fn retry_while<R: Debug>(
    what: &str,
    again: impl Fn(&Error) -> bool,
    mut f: impl AsyncFnMut() -> Result<R, Error>,
) -> (Result<R, Error>, u32) {
    let mut refused = 0;
    let answer = eventually(format!("{what}: no longer refused"))
        .within(T)
        .every(Duration::from_millis(200))
        .until(async || match f().await {
            Err(e) if again(&e) => {
                refused += 1;
                Err(format!("refusal {refused}: {e:?}"))
            }
            other => Ok(other),
        })
        .await;
    (answer, refused)
}

/// Polls `f` every 100 ms until it gives `Ok`, for at most `T`; panics
/// with the last thing `f` saw.
async fn wait_for<R>(what: &str, f: impl AsyncFnMut() -> Result<R, String>) -> R {
    eventually(what)
        .within(T)
        .every(Duration::from_millis(100))
        .until(f)
        .await
}

/// Hands back `r`, the answer to a membership change, once a write made
/// after it has completed. etcd's raft drops a membership change proposed
/// before it has marked the previous one applied, which can be after that
/// one was answered (etcd-io/etcd#15528); a write made after the answer
/// is committed only after that mark, so the next change is taken. See
/// `Client::member_add`.
async fn settled<R>(c: &Client, r: Result<R, Error>) -> Result<R, Error> {
    c.put(Put::new("/membership-barrier", "")).await.unwrap();
    r
}

/// A loopback port held open (nobody answers on it) for the life of the
/// listener: a peer URL of a member that never starts, which no other
/// process can take meanwhile.
fn held_port() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://127.0.0.1:{}", l.local_addr().unwrap().port());
    (l, url)
}

/// `name=url,...` for every member of `list` (`--initial-cluster` of a
/// member joining it), naming the one not started yet `joiner`.
fn initial_cluster(list: &MemberList, joiner: &str) -> String {
    list.members
        .iter()
        .flat_map(|m| {
            let name = if m.name.is_empty() { joiner } else { &m.name };
            m.peer_urls.iter().map(move |u| format!("{name}={u}"))
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learner_is_added_started_promoted_updated_and_removed() {
    let m0 = Etcd::start();
    let c = client(m0.endpoints());
    let first = c.member_list().await.unwrap();
    assert_eq!(first.members.len(), 1, "{first:?}");
    let m0_id = first.members[0].id;

    // Refusals that need no second member.
    let e = c.member_add_as_learner(["not a url"]).await.err();
    assert!(matches!(e, Some(Error::InvalidPeerUrls)), "{e:?}");
    let e = c.member_add(Vec::<String>::new()).await.err();
    assert!(matches!(e, Some(Error::InvalidPeerUrls)), "{e:?}");
    let e = settled(&c, c.member_add_as_learner([m0.peer_url()]).await)
        .await
        .err();
    assert!(matches!(e, Some(Error::PeerUrlExists)), "{e:?}");
    let e = settled(&c, c.member_promote(m0_id).await).await.err();
    assert!(matches!(e, Some(Error::MemberNotLearner)), "{e:?}");
    let e = settled(&c, c.member_remove(UNKNOWN_ID).await).await.err();
    assert!(matches!(e, Some(Error::MemberNotFound)), "{e:?}");
    let e = settled(
        &c,
        c.member_update(UNKNOWN_ID, ["http://127.0.0.1:9"]).await,
    )
    .await
    .err();
    assert!(matches!(e, Some(Error::MemberNotFound)), "{e:?}");
    let e = settled(&c, c.member_promote(UNKNOWN_ID).await).await.err();
    assert!(matches!(e, Some(Error::MemberNotFound)), "{e:?}");

    // The new member listens for its peers on two ports and is added with
    // the first; the update moves it to the second.
    let mut joiner = Etcd::builder().unstarted();
    let (second, second_url) = held_port();
    let listen = format!("--listen-peer-urls={},{second_url}", joiner.peer_url());
    joiner.set_extra_args(&[&listen]);

    let added = settled(&c, c.member_add_as_learner([joiner.peer_url()]).await)
        .await
        .unwrap();
    let id = added.member.id;
    assert!(added.member.is_learner, "{added:?}");
    assert!(added.member.name.is_empty(), "{added:?}");
    assert_eq!(added.member.peer_urls, [joiner.peer_url()], "{added:?}");
    assert_eq!(added.list.members.len(), 2, "{added:?}");
    assert_eq!(added.list.get(id), Some(&added.member), "{added:?}");
    assert_eq!(added.list.cluster_id, first.cluster_id);
    let list = c.member_list().await.unwrap();
    assert_eq!(list.get(id), Some(&added.member), "{list:?}");

    // One learner at a time, and not promoted before it has the log.
    let (_held, held_url) = held_port();
    let e = settled(&c, c.member_add_as_learner([held_url.as_str()]).await)
        .await
        .err();
    assert!(matches!(e, Some(Error::TooManyLearners)), "{e:?}");
    let e = c.member_promote(id).await.err();
    assert!(matches!(e, Some(Error::LearnerNotReady)), "{e:?}");

    // Started, it publishes its name and client URLs.
    drop(second); // its second peer port, free for it now
    joiner.join(&initial_cluster(&added.list, joiner.name()));
    let started = wait_for("the learner shows as started", async || {
        let list = c.member_list().await.map_err(|e| format!("{e:?}"))?;
        match list.get(id) {
            Some(m) if !m.name.is_empty() => Ok(m.clone()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(started.name, joiner.name());
    assert_eq!(started.client_urls, joiner.endpoints());
    assert!(started.is_learner, "{started:?}");

    // Promoted once it has caught up.
    let (promoted, not_ready) = retry_while(
        "promote the started learner",
        |e| matches!(e, Error::LearnerNotReady),
        async || settled(&c, c.member_promote(id).await).await,
    )
    .await;
    let promoted = promoted.unwrap();
    eprintln!("learner promoted after {not_ready} LearnerNotReady refusals");
    assert_eq!(promoted.members.len(), 2, "{promoted:?}");
    assert!(
        promoted.members.iter().all(|m| !m.is_learner),
        "{promoted:?}"
    );
    assert_eq!(c.member_list().await.unwrap().members, promoted.members);

    // Two voters, both started: a third voter may be added (once the member
    // asked has been connected to both for 5 s), but not a fourth while the
    // third has not started.
    let (_x, x_url) = held_port();
    let (with_x, unhealthy) = retry_while(
        "add a voter that will not start",
        |e| matches!(e, Error::UnhealthyCluster),
        async || settled(&c, c.member_add([x_url.as_str()]).await).await,
    )
    .await;
    let with_x = with_x.unwrap();
    eprintln!("voter added after {unhealthy} UnhealthyCluster refusals");
    assert!(!with_x.member.is_learner, "{with_x:?}");
    assert_eq!(with_x.list.members.len(), 3, "{with_x:?}");
    let (_y, y_url) = held_port();
    let e = c.member_add([y_url.as_str()]).await.err();
    assert!(matches!(e, Some(Error::NotEnoughStartedMembers)), "{e:?}");
    let without_x = settled(&c, c.member_remove(with_x.member.id).await)
        .await
        .unwrap();
    assert_eq!(without_x.members, promoted.members);

    // Its peer URLs updated: the list says so, and it still follows.
    let updated = settled(&c, c.member_update(id, [second_url.as_str()]).await)
        .await
        .unwrap();
    let m = updated.get(id).expect("updated member").clone();
    assert_eq!(m.peer_urls, [second_url.as_str()], "{updated:?}");
    assert_eq!(m.name, joiner.name());
    assert_eq!(c.member_list().await.unwrap().get(id), Some(&m));
    let rev = c
        .put(Put::new("/after-update", "x"))
        .await
        .unwrap()
        .header
        .revision;
    let cj = client(joiner.endpoints());
    wait_for("the moved member applies a new write", async || {
        let r = cj
            .range(Range::key("/after-update").serializable())
            .await
            .map_err(|e| format!("{e:?}"))?;
        match r.kvs().first() {
            Some(kv) if kv.mod_revision() == rev => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // Removed (once etcd counts it active for 5 s, so the one left has a
    // quorum): the list is the first member alone again.
    let (removed, unhealthy) = retry_while(
        "remove the promoted member",
        |e| matches!(e, Error::UnhealthyCluster),
        async || settled(&c, c.member_remove(id).await).await,
    )
    .await;
    let removed = removed.unwrap();
    eprintln!("member removed after {unhealthy} UnhealthyCluster refusals");
    assert_eq!(removed.members, first.members, "{removed:?}");
    assert_eq!(c.member_list().await.unwrap().members, first.members);
    let e = c.member_remove(id).await.err();
    assert!(matches!(e, Some(Error::MemberNotFound)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_moves_where_asked_and_remove_guards_the_quorum() {
    let mut cluster = Cluster::start(3);
    let clients: Vec<Client> = cluster
        .members
        .iter()
        .map(|m| client(m.endpoints()))
        .collect();
    let mut ids = Vec::new();
    for c in &clients {
        ids.push(c.status().await.unwrap().member_id);
    }
    let leader = wait_for("a leader every member agrees on", async || {
        let mut seen = Vec::new();
        for c in &clients {
            seen.push(c.status().await.map_err(|e| format!("{e:?}"))?.leader);
        }
        match ids.iter().position(|id| *id == seen[0]) {
            Some(i) if seen.iter().all(|l| *l == seen[0]) => Ok(i),
            _ => Err(format!("leaders {seen:x?} of members {ids:x?}")),
        }
    })
    .await;
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    let (to, other) = (followers[0], followers[1]);

    // Only the leader hands over, and only to a voting member.
    let e = clients[to].move_leader(ids[other]).await.err();
    assert!(matches!(e, Some(Error::NotRaftLeader)), "{e:?}");
    let e = clients[leader].move_leader(UNKNOWN_ID).await.err();
    assert!(matches!(e, Some(Error::BadLeaderTransferee)), "{e:?}");

    clients[leader].move_leader(ids[to]).await.unwrap();
    let s = clients[leader].status().await.unwrap();
    assert_eq!(s.leader, ids[to], "the old leader's status: {s:?}");
    wait_for("every member names the new leader", async || {
        let mut seen = Vec::new();
        for c in &clients {
            seen.push(c.status().await.map_err(|e| format!("{e:?}"))?.leader);
        }
        if seen.iter().all(|l| *l == ids[to]) {
            Ok(())
        } else {
            Err(format!("leaders {seen:x?}, asked for {:x}", ids[to]))
        }
    })
    .await;

    // With one member down, removing another would leave no active quorum:
    // refused, once the member asked has seen the first one go.
    cluster.members[other].kill();
    let gauge = format!(
        "etcd_network_active_peers{{Local=\"{:x}\",Remote=\"{:x}\"}}",
        ids[to], ids[other]
    );
    let asked = &cluster.members[to];
    wait_for(
        "the new leader sees the killed member inactive",
        async || {
            let metrics = asked.metrics().ok_or("no /metrics")?;
            match metrics.lines().find(|l| l.starts_with(&gauge)) {
                Some(l) if l.ends_with(" 0") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let before = clients[to].member_list().await.unwrap();
    let e = clients[to].member_remove(ids[leader]).await.err();
    assert!(matches!(e, Some(Error::UnhealthyCluster)), "{e:?}");
    let after = clients[to].member_list().await.unwrap();
    assert_eq!(after.members, before.members);
    assert_eq!(after.members.len(), 3, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_hash_follows_the_data_and_agrees_across_members() {
    let cluster = Cluster::start(2);
    let c0 = client(cluster.members[0].endpoints());
    let c1 = client(cluster.members[1].endpoints());

    // Both members at one revision with no write under way: the same hash,
    // and the same again when asked again.
    async fn settled(c0: &Client, c1: &Client, rev: i64) -> (u32, u32) {
        wait_for("both members hash the same revision", async || {
            let h0 = c0.hash().await.map_err(|e| format!("{e:?}"))?;
            let h1 = c1.hash().await.map_err(|e| format!("{e:?}"))?;
            if h0.header.revision == rev && h1.header.revision == rev {
                Ok((h0.hash, h1.hash))
            } else {
                Err(format!("{h0:?} {h1:?}, want revision {rev}"))
            }
        })
        .await
    }
    let mut rev = 0;
    for i in 0..50 {
        let put = Put::new(format!("/h/{i:03}"), format!("v{i}"));
        rev = c0.put(put).await.unwrap().header.revision;
    }
    let (a0, a1) = settled(&c0, &c1, rev).await;
    assert_eq!(a0, a1, "members with the same data at revision {rev}");
    assert_eq!(c0.hash().await.unwrap().hash, a0, "asked again");

    // One more write changes it, on both.
    let rev2 = c0
        .put(Put::new("/h/000", "changed"))
        .await
        .unwrap()
        .header
        .revision;
    let (b0, b1) = settled(&c0, &c1, rev2).await;
    assert_eq!(b0, b1, "members with the same data at revision {rev2}");
    assert_ne!(b0, a0, "a write at revision {rev2} left the hash as it was");

    // Compaction drops history: the hash changes again, the data does not.
    c0.compact(rev2, true).await.unwrap();
    let c = wait_for("the hash after compaction, on both", async || {
        let h0 = c0.hash().await.map_err(|e| format!("{e:?}"))?.hash;
        let h1 = c1.hash().await.map_err(|e| format!("{e:?}"))?.hash;
        if h0 == h1 && h0 != b0 {
            Ok(h0)
        } else {
            Err(format!("{h0:x} {h1:x}, before compaction {b0:x}"))
        }
    })
    .await;
    assert_ne!(c, b0);
}

/// etcd's restore tool for the server version in use: `etcdctl` on 3.4,
/// `etcdutl` on 3.5 (`ETCDUTL_BIN`, else next to `ETCDCTL_BIN` or
/// `ETCD_BIN`, else on PATH).
fn restore_command(version: &str) -> Command {
    if version.starts_with("3.4.") {
        return etcdctl_command();
    }
    let beside = |var: &str| {
        let p = PathBuf::from(std::env::var_os(var)?);
        Some(p.parent()?.join("etcdutl"))
    };
    let bin = std::env::var_os("ETCDUTL_BIN")
        .map(PathBuf::from)
        .or_else(|| beside("ETCDCTL_BIN").filter(|p| p.exists()))
        .or_else(|| beside("ETCD_BIN").filter(|p| p.exists()))
        .unwrap_or_else(|| PathBuf::from("etcdutl"));
    Command::new(bin)
}

/// `sha256sum` of a file, as raw bytes.
fn sha256(path: &Path) -> Vec<u8> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    assert!(out.status.success(), "sha256sum: {out:?}");
    let hex = String::from_utf8(out.stdout).unwrap();
    let hex = hex.split_whitespace().next().unwrap();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_streamed_to_a_file_restores_the_exact_data() {
    let etcd = Etcd::start();
    let c = client(etcd.endpoints());
    let version = c.status().await.unwrap().version;
    // A few hundred keys with some history: overwrites and deletes.
    for i in 0..300 {
        let value = format!("value-{i}-{}", "x".repeat(i % 97));
        c.put(Put::new(format!("/snap/{i:04}"), value))
            .await
            .unwrap();
    }
    for i in (0..300).step_by(7) {
        c.put(Put::new(format!("/snap/{i:04}"), format!("again-{i}")))
            .await
            .unwrap();
    }
    for i in (0..300).step_by(11) {
        c.delete(Delete::key(format!("/snap/{i:04}")))
            .await
            .unwrap();
    }
    let want = c.range(Range::prefix("/snap/")).await.unwrap();
    assert!(want.kvs().len() > 250, "{}", want.kvs().len());

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("etcd.db");
    let data_only = dir.path().join("data-only");
    let mut out = std::fs::File::create(&file).unwrap();
    let mut data = std::fs::File::create(&data_only).unwrap();
    let mut snapshot: Snapshot = c.snapshot().await.unwrap();
    let mut chunks: Vec<(usize, u64, bool)> = Vec::new();
    let mut checksum = None;
    while let Some(chunk) = snapshot.next().await {
        let SnapshotChunk {
            blob,
            remaining_bytes,
            is_checksum,
            ..
        } = chunk.unwrap();
        out.write_all(&blob).unwrap();
        if is_checksum {
            checksum = Some(blob.to_vec());
        } else {
            data.write_all(&blob).unwrap();
        }
        chunks.push((blob.len(), remaining_bytes, is_checksum));
    }
    out.sync_all().unwrap();
    drop((out, data));
    let size = snapshot.size().expect("size known");
    eprintln!(
        "etcd {version}: snapshot of {size} bytes in {} chunks",
        chunks.len()
    );
    assert_eq!(snapshot.received(), size);
    assert_eq!(std::fs::metadata(&data_only).unwrap().len(), size);
    // The database, counted down to 0, then exactly one checksum: the
    // SHA-256 of the database bytes.
    let (last, data_chunks) = chunks.split_last().unwrap();
    assert_eq!(*last, (32, 0, true), "{chunks:?}");
    assert!(data_chunks.iter().all(|c| !c.2), "{chunks:?}");
    assert_eq!(data_chunks.last().unwrap().1, 0, "{chunks:?}");
    assert!(
        data_chunks.windows(2).all(|w| w[0].1 > w[1].1),
        "remaining_bytes counts down: {chunks:?}"
    );
    assert_eq!(checksum.unwrap(), sha256(&data_only));

    // etcd's own tool takes the file (and checks the checksum), and an etcd
    // started on what it restored has exactly the data, at its revision.
    let name = "restored";
    let restored = dir.path().join("restored");
    // The restored membership's peer URL: nobody else's (a single member
    // never dials itself, so it need not be the one it listens on).
    let (_peer_port, peer) = held_port();
    let mut restore = restore_command(&version);
    restore.args([
        "snapshot".to_string(),
        "restore".into(),
        file.display().to_string(),
        format!("--data-dir={}", restored.display()),
        format!("--name={name}"),
        format!("--initial-cluster={name}={peer}"),
        "--initial-cluster-token=restored".into(),
        format!("--initial-advertise-peer-urls={peer}"),
    ]);
    eprintln!("restoring with {:?}", restore.get_program());
    let done = restore.output().expect("run the restore tool");
    assert!(
        done.status.success(),
        "{restore:?} failed: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    let back = Etcd::builder().name(name).data_dir(&restored).start();
    let cb = client(back.endpoints());
    let got = cb.range(Range::prefix("/snap/")).await.unwrap();
    assert_eq!(got.kvs(), want.kvs());
    assert_eq!(got.header.revision, want.header.revision);
    assert_eq!(cb.status().await.unwrap().version, version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_stream_is_held_to_the_window_and_times_out_when_stalled() {
    const WINDOW: u32 = 1 << 20;
    let etcd = Etcd::start();
    let direct = client(etcd.endpoints());
    // 24 MiB of values, 24 times the window.
    for i in 0..24u8 {
        let value = vec![i; 1 << 20];
        direct
            .put(Put::new(format!("/big/{i:02}"), value))
            .await
            .unwrap();
    }
    let proxy = FaultProxy::start(etcd.client_addr()).await;
    let mut cfg = ClientConfig::new([proxy.endpoint()]);
    cfg.stream_window = WINDOW;
    cfg.request_timeout = Duration::from_secs(2);
    let c = Client::connect(cfg).unwrap();

    // One chunk read, then no more: etcd sends what the window allows and
    // stops, however long the consumer pauses.
    let before = proxy.bytes_to_client();
    let mut snapshot = c.snapshot().await.unwrap();
    let first = snapshot.next().await.unwrap().unwrap();
    let size = snapshot.size().unwrap();
    assert!(size > 24 << 20, "{size}");
    let mut last = (proxy.bytes_to_client(), Instant::now());
    let held = wait_for("the stream stops at the window", async || {
        let now = proxy.bytes_to_client();
        if now != last.0 {
            last = (now, Instant::now());
        }
        if last.1.elapsed() >= Duration::from_secs(1) {
            Ok(now - before)
        } else {
            Err(format!("{} bytes and growing", now - before))
        }
    })
    .await;
    eprintln!(
        "paused after one chunk of {}: {held} bytes sent of a {size}-byte snapshot, window {WINDOW}",
        first.blob.len()
    );
    assert!(
        held <= u64::from(WINDOW) + (256 << 10),
        "{held} bytes sent with a {WINDOW}-byte window"
    );

    // Read on, it all comes.
    let mut received = first.blob.len() as u64;
    let mut checksums = 0;
    while let Some(chunk) = snapshot.next().await {
        let chunk = chunk.unwrap();
        if chunk.is_checksum {
            checksums += 1;
        } else {
            received += chunk.blob.len() as u64;
        }
    }
    assert_eq!((received, checksums), (size, 1));

    // A stream whose server stops sending ends with a timeout rather than
    // waiting for ever: what was in the window comes, then nothing.
    let mut snapshot = c.snapshot().await.unwrap();
    snapshot.next().await.unwrap().unwrap();
    proxy.set_bandwidth(Some(1));
    let started = Instant::now();
    let mut got = 0u64;
    let end = loop {
        match snapshot.next().await {
            Some(Ok(chunk)) => got += chunk.blob.len() as u64,
            other => break other,
        }
        assert!(
            started.elapsed() < T,
            "still reading after {T:?}: {got} bytes"
        );
    };
    assert!(matches!(end, Some(Err(Error::Timeout(_)))), "{end:?}");
    assert!(
        snapshot.next().await.is_none(),
        "the stream ends after the timeout"
    );
    assert!(got < size, "{got} of {size}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_list_shows_granted_leases_and_not_revoked_ones() {
    let etcd = Etcd::start();
    let c = client(etcd.endpoints());
    let empty = c.lease_list().await.unwrap();
    assert!(empty.ids.is_empty(), "{empty:?}");
    let mut granted = Vec::new();
    for _ in 0..3 {
        granted.push(c.lease_grant(Duration::from_secs(60)).await.unwrap().id);
    }
    let own = c
        .lease_grant_with_id(LeaseId::new(0x1234), Duration::from_secs(60))
        .await
        .unwrap()
        .id;
    assert_eq!(own, LeaseId::new(0x1234));
    let again = c.lease_grant_with_id(own, Duration::from_secs(60)).await;
    assert!(matches!(again, Err(Error::LeaseExists)), "{again:?}");
    let mut all = c.lease_list().await.unwrap();
    all.ids.sort();
    let mut want: Vec<LeaseId> = granted.iter().copied().chain([own]).collect();
    want.sort();
    assert_eq!(all.ids, want);
    assert!(all.header.revision > 0, "{all:?}");

    c.lease_revoke(granted[1]).await.unwrap();
    let mut after = c.lease_list().await.unwrap();
    after.ids.sort();
    want.retain(|id| *id != granted[1]);
    assert_eq!(after.ids, want);
}
