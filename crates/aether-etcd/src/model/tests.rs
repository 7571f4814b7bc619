//! One test per rule; each on a fresh cluster, on paused time where time
//! matters.

use std::time::Duration;

use futures_util::StreamExt;

use super::*;
use crate::{Compare, CompareOp, EventKind, Op, OpResponse};

fn cluster() -> (Cluster, Client) {
    let c = Cluster::new(ModelConfig::default());
    let client = c.client(0);
    (c, client)
}

#[tokio::test(start_paused = true)]
async fn a_write_that_changes_nothing_makes_no_revision() {
    let (c, k) = cluster();
    assert_eq!(c.revision(), 1);
    assert_eq!(k.put(Put::new("/a", "1")).await.unwrap().header.revision, 2);
    assert_eq!(
        k.delete(Delete::key("/x")).await.unwrap().header.revision,
        2
    );
    let ro = Txn::new().and_then([Range::key("/a")]);
    assert_eq!(k.txn(ro).await.unwrap().header.revision, 2);
    let two = Txn::new().and_then([Put::new("/b", "1"), Put::new("/c", "1")]);
    assert_eq!(k.txn(two).await.unwrap().header.revision, 3);
    // A delete ends the key; a put makes a new generation.
    k.delete(Delete::key("/a")).await.unwrap();
    k.put(Put::new("/a", "2")).await.unwrap();
    let got = k.range(Range::key("/a")).await.unwrap();
    let kv = &got.kvs()[0];
    assert_eq!(
        (kv.version(), kv.create_revision(), kv.mod_revision()),
        (1, 5, 5)
    );
}

#[tokio::test(start_paused = true)]
async fn ranges_limit_count_history_and_their_errors() {
    let (_c, k) = cluster();
    for key in ["/r/a", "/r/b", "/r/c"] {
        k.put(Put::new(key, "v")).await.unwrap();
    }
    let r = k.range(Range::prefix("/r/").limit(2)).await.unwrap();
    assert_eq!((r.kvs().len(), r.more, r.count), (2, true, 3));
    let r = k.range(Range::prefix("/r/").count_only()).await.unwrap();
    assert_eq!((r.kvs().len(), r.count), (0, 3));
    let r = k.range(Range::from_key("/r/b").keys_only()).await.unwrap();
    assert!(r.kvs().iter().all(|kv| kv.value().is_empty()) && r.count == 2);
    let r = k.range(Range::prefix("/r/").revision(3)).await.unwrap();
    assert_eq!((r.count, r.header.revision), (2, 4));
    assert!(matches!(
        k.range(Range::key("/r/a").revision(5)).await,
        Err(Error::FutureRevision)
    ));
    k.compact(3, true).await.unwrap();
    assert!(matches!(
        k.range(Range::key("/r/a").revision(2)).await,
        Err(Error::Compacted {
            compact_revision: None
        })
    ));
    assert_eq!(
        k.range(Range::prefix("/r/").revision(3))
            .await
            .unwrap()
            .count,
        2
    );
    assert!(matches!(
        k.compact(3, false).await,
        Err(Error::Compacted { .. })
    ));
    assert!(matches!(
        k.compact(9, false).await,
        Err(Error::FutureRevision)
    ));
    assert!(matches!(
        k.range(Range::key("")).await,
        Err(Error::Server { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn compares_cover_every_key_of_a_range() {
    let (_c, k) = cluster();
    k.put(Put::new("/t/a", "1")).await.unwrap();
    k.put(Put::new("/t/b", "2")).await.unwrap();
    let all_above = |v: &str| {
        Txn::new()
            .when([Compare::value("/t/", CompareOp::Greater, v.to_string()).with_range_end("/t0")])
    };
    assert!(k.txn(all_above("0")).await.unwrap().succeeded);
    assert!(!k.txn(all_above("1")).await.unwrap().succeeded);
    // Over no key: a value compare fails, the others compare with zero.
    let none = Compare::value("/none", CompareOp::NotEqual, "x");
    assert!(!k.txn(Txn::new().when([none])).await.unwrap().succeeded);
    let none = Compare::version("/none", CompareOp::Equal, 0);
    assert!(k.txn(Txn::new().when([none])).await.unwrap().succeeded);
    let lease = Compare::lease("/t/a", CompareOp::Equal, LeaseId::NONE);
    assert!(k.txn(Txn::new().when([lease])).await.unwrap().succeeded);
}

#[tokio::test(start_paused = true)]
async fn nested_compares_see_the_store_before_the_txn_and_reads_see_its_writes() {
    let (_c, k) = cluster();
    let t = Txn::new().and_then([
        Op::from(Put::new("/n/c", "3")),
        Op::from(
            Txn::new()
                .when([Compare::version("/n/c", CompareOp::Equal, 0)])
                .and_then([Put::new("/n/d", "4")]),
        ),
        Op::from(Range::prefix("/n/")),
    ]);
    let r = k.txn(t).await.unwrap();
    let OpResponse::Txn(inner) = &r.responses[1] else {
        panic!("{r:?}")
    };
    assert!(inner.succeeded);
    let OpResponse::Range(read) = &r.responses[2] else {
        panic!("{r:?}")
    };
    assert_eq!((read.count, read.header.revision), (2, 2));
}

#[tokio::test(start_paused = true)]
async fn refusals_change_nothing() {
    let (c, k) = cluster();
    let dup = Txn::new().and_then([Put::new("/x", "1"), Put::new("/x", "2")]);
    assert!(matches!(k.txn(dup).await, Err(Error::DuplicateKey)));
    let covered =
        Txn::new().and_then([Op::from(Delete::prefix("/")), Op::from(Put::new("/x", "1"))]);
    assert!(matches!(k.txn(covered).await, Err(Error::DuplicateKey)));
    let branches = Txn::new().and_then([Txn::new()
        .and_then([Put::new("/x", "1")])
        .or_else([Put::new("/x", "2")])]);
    assert!(k.txn(branches).await.is_ok());
    let many = |n: usize| Txn::new().and_then((0..n).map(|i| Put::new(format!("/m/{i}"), "v")));
    assert!(matches!(k.txn(many(129)).await, Err(Error::TooManyOps)));
    // A nested txn gets what its parent's longest list left.
    let nested = Txn::new()
        .when((0..100).map(|i| Compare::version(format!("/m/{i}"), CompareOp::Equal, 0)))
        .and_then([Op::from(many(29))]);
    assert!(matches!(k.txn(nested).await, Err(Error::TooManyOps)));
    let big = "x".repeat(crate::DEFAULT_MAX_REQUEST_BYTES);
    assert!(matches!(
        k.put(Put::new("/b", big)).await,
        Err(Error::RequestTooLarge)
    ));
    let unknown = Put::new("/l", "v").lease(LeaseId::new(5));
    assert!(matches!(k.put(unknown).await, Err(Error::LeaseNotFound)));
    assert!(matches!(
        k.put(Put::new("/none", "").ignore_value()).await,
        Err(Error::KeyNotFound)
    ));
    assert_eq!(c.revision(), 2, "only the nested txn wrote");
}

#[tokio::test(start_paused = true)]
async fn leases_revoke_their_keys_in_one_revision() {
    let (c, k) = cluster();
    let g = k
        .lease_grant_with_id(LeaseId::new(7), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(g.ttl, DEFAULT_MIN_LEASE_TTL);
    assert!(matches!(
        k.lease_grant_with_id(LeaseId::new(7), Duration::from_secs(10))
            .await,
        Err(Error::LeaseExists)
    ));
    k.put(Put::new("/l/a", "1").lease(g.id)).await.unwrap();
    k.put(Put::new("/l/b", "1").lease(g.id)).await.unwrap();
    k.put(Put::new("/l/c", "1").lease(g.id)).await.unwrap();
    k.put(Put::new("/l/c", "2")).await.unwrap(); // no longer the lease's
    let ttl = k.lease_time_to_live(g.id, true).await.unwrap();
    assert_eq!(ttl.keys, [Bytes::from("/l/a"), Bytes::from("/l/b")]);
    let rev = c.revision();
    k.lease_revoke(g.id).await.unwrap();
    assert_eq!(c.revision(), rev + 1);
    assert_eq!(c.dump("/l/").len(), 1);
    assert_eq!(k.lease_time_to_live(g.id, false).await.unwrap().ttl, None);
    assert!(matches!(
        k.lease_revoke(g.id).await,
        Err(Error::LeaseNotFound)
    ));
    // An empty lease revoked makes no revision.
    let e = k.lease_grant(Duration::from_secs(10)).await.unwrap();
    k.lease_revoke(e.id).await.unwrap();
    assert_eq!(c.revision(), rev + 1);
}

#[tokio::test(start_paused = true)]
async fn a_lease_expires_on_the_clock_unless_kept_alive() {
    let (c, k) = cluster();
    let g = k.lease_grant(Duration::from_secs(10)).await.unwrap();
    k.put(Put::new("/e/a", "1").lease(g.id)).await.unwrap();
    k.put(Put::new("/e/b", "1").lease(g.id)).await.unwrap();
    let mut w = k.watch(WatchOptions::prefix("/e/")).unwrap();
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(
        k.lease_keep_alive_once(g.id).await.unwrap(),
        Duration::from_secs(10)
    );
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(c.dump("/e/").len(), 2, "kept alive at 9 s");
    assert_eq!(
        k.lease_time_to_live(g.id, false).await.unwrap().ttl,
        Some(Duration::from_secs(1))
    );
    // Nobody calls the model: the expiry task revokes at the deadline.
    let resp = tokio::time::timeout(Duration::from_secs(5), w.next())
        .await
        .expect("no expiry within 5 s of the deadline")
        .unwrap()
        .unwrap();
    let kinds: Vec<_> = resp.events.iter().map(|e| (e.kind, e.revision())).collect();
    assert_eq!(kinds, [(EventKind::Delete, 4), (EventKind::Delete, 4)]);
    assert!(matches!(
        k.lease_keep_alive_once(g.id).await,
        Err(Error::LeaseNotFound)
    ));
}

#[tokio::test(start_paused = true)]
async fn the_expiry_task_ends_with_the_last_handle() {
    let (c, k) = cluster();
    k.lease_grant(Duration::from_secs(100)).await.unwrap();
    let weak = Arc::downgrade(&c.shared);
    drop((c, k));
    tokio::task::yield_now().await;
    assert!(
        weak.upgrade().is_none(),
        "the task must not keep the cluster"
    );
}

#[tokio::test(start_paused = true)]
async fn watches_replay_history_and_refuse_the_compacted() {
    let (c, k) = cluster();
    k.put(Put::new("/w/a", "1")).await.unwrap(); // 2
    let both = Txn::new().and_then([Put::new("/w/a", "2"), Put::new("/w/b", "1")]);
    k.txn(both).await.unwrap(); // 3
    k.delete(Delete::key("/w/a")).await.unwrap(); // 4
    let mut w = k
        .watch(WatchOptions::prefix("/w/").start_revision(2).prev_kv())
        .unwrap();
    let r = w.next().await.unwrap().unwrap();
    assert_eq!((r.header.revision, r.header.member_id), (4, c.member_id(0)));
    let revs: Vec<_> = r.events.iter().map(|e| e.revision()).collect();
    assert_eq!(revs, [2, 3, 3, 4]);
    assert!(r.events[3].prev_kv.is_some() && r.events[0].prev_kv.is_none());
    // Caught up: one response per revision.
    k.put(Put::new("/w/c", "1")).await.unwrap();
    assert_eq!(w.next().await.unwrap().unwrap().header.revision, 5);
    k.compact(3, false).await.unwrap();
    let mut old = k
        .watch(WatchOptions::prefix("/w/").start_revision(3))
        .unwrap();
    assert!(matches!(
        old.next().await,
        Some(Err(Error::Compacted {
            compact_revision: Some(3)
        }))
    ));
    assert!(old.next().await.is_none());
    let mut ok = k
        .watch(WatchOptions::prefix("/w/").start_revision(4).no_put())
        .unwrap();
    assert_eq!(ok.next().await.unwrap().unwrap().events.len(), 1);
    ok.request_progress().unwrap();
    let p = ok.next().await.unwrap().unwrap();
    assert!(p.events.is_empty() && p.header.revision == 5);
}

#[tokio::test(start_paused = true)]
async fn a_held_member_lags_and_catches_up() {
    let c = Cluster::new(ModelConfig::default().with_members(2));
    let (a, b) = (c.client(0), c.client(1));
    assert_ne!(a.member_id(), b.member_id());
    a.put(Put::new("/h", "1")).await.unwrap();
    c.hold(1);
    let mut w = b.watch(WatchOptions::key("/h")).unwrap();
    a.put(Put::new("/h", "2")).await.unwrap();
    let stale = b.range(Range::key("/h").serializable()).await.unwrap();
    assert_eq!(
        (stale.header.revision, stale.header.member_id),
        (2, b.member_id())
    );
    assert!(w.next_buffered().is_none());
    // A linearizable read on the held member waits for it.
    let read = tokio::spawn({
        let b = b.clone();
        async move { b.range(Range::key("/h")).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!read.is_finished());
    c.release(1);
    assert_eq!(read.await.unwrap().unwrap().header.revision, 3);
    assert_eq!(w.next().await.unwrap().unwrap().header.revision, 3);
}

#[tokio::test(start_paused = true)]
async fn a_restore_takes_the_revision_back_and_ends_watches() {
    let (c, k) = cluster();
    k.put(Put::new("/s", "1")).await.unwrap();
    let snap = c.snapshot();
    k.put(Put::new("/s", "2")).await.unwrap();
    let mut w = k.watch(WatchOptions::key("/s")).unwrap();
    c.restore(&snap);
    assert_eq!((c.revision(), snap.revision()), (2, 2));
    assert_eq!(c.dump("").len(), 1);
    assert!(matches!(w.next().await, Some(Err(Error::WatchCanceled(_)))));
    let st = k.status().await.unwrap();
    assert_eq!((st.revision, st.version.as_str()), (2, "3.5.1"));
}
