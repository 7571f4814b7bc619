//! The client's higher-level APIs against real etcd: sessions, election,
//! locks, cluster, maintenance and namespaces.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aether_etcd::concurrency::{Election, Mutex, Session, SessionOptions};
use aether_etcd::{
    Alarm, AlarmKind, Client, ClientConfig, Compare, CompareOp, Delete, DowngradeAction, Error, Op,
    OpResponse, Put, Range, Txn, WatchOptions,
};
use aether_test_kit::{Etcd, FaultProxy, etcdctl_command, eventually, wait_until_async};
use futures_util::StreamExt;

fn client(etcd: &Etcd) -> Client {
    Client::connect(ClientConfig::new(etcd.endpoints())).expect("client")
}

/// Generous bound for anything that should happen "at once".
const T: Duration = Duration::from_secs(20);

async fn session(c: &Client, ttl_secs: u64) -> Session {
    Session::with_options(
        c,
        SessionOptions::default().with_ttl(Duration::from_secs(ttl_secs)),
    )
    .await
    .expect("session")
}

async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
    tokio::time::timeout(T, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {T:?}"))
}

async fn leader_value(e: &Election) -> Option<String> {
    e.leader()
        .await
        .unwrap()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_lost_close_and_drop() {
    let etcd = Etcd::start();
    let c = client(&etcd);

    // Revoked behind its back: the keeper hears TTL -1 and the session says lost.
    let s = session(&c, 3).await;
    assert!(!s.is_lost());
    let mut signal = s.lost_signal();
    c.lease_revoke(s.lease()).await.unwrap();
    within("lost after revoke", s.lost()).await;
    assert!(*signal.borrow_and_update());

    // close() revokes: the session's keys go at once.
    let s = session(&c, 30).await;
    c.put(Put::new("/session/k", "v").lease(s.lease()))
        .await
        .unwrap();
    s.close().await.unwrap();
    assert!(s.is_lost());
    assert!(
        c.range(Range::key("/session/k"))
            .await
            .unwrap()
            .kvs()
            .is_empty()
    );

    // Dropping does not revoke: the lease is still there, to run out (or be
    // adopted by id).
    let s = session(&c, 30).await;
    let id = s.lease();
    drop(s);
    let ttl = c.lease_time_to_live(id, false).await.unwrap();
    assert!(ttl.ttl.is_some_and(|t| !t.is_zero()), "{ttl:?}");
    let adopted = Session::with_options(
        &c,
        SessionOptions::default()
            .with_ttl(Duration::from_secs(30))
            .with_lease(id),
    )
    .await
    .unwrap();
    assert_eq!(adopted.lease(), id);
    adopted.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_handoff_on_resign_revoke_and_expiry() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let (s1, s2) = (session(&c, 30).await, session(&c, 30).await);
    let mut e1 = Election::new(&s1, "/el");
    e1.campaign("one").await.unwrap();
    assert!(e1.is_leader());
    assert_eq!(e1.key().unwrap(), &format!("/el/{:x}", s1.lease()));
    assert_eq!(leader_value(&e1).await.as_deref(), Some("one"));

    // The second candidate queues behind the first.
    let mut e2 = Election::new(&s2, "/el");
    let second = tokio::spawn(async move { e2.campaign("two").await.map(|_| e2) });
    let candidates = async || c.range(Range::prefix("/el/")).await.unwrap().kvs().len();
    let queued = || {
        eventually("the second candidate queued")
            .within(T)
            .every(Duration::from_millis(20))
            .until_eq(2, candidates)
    };
    queued().await;
    assert!(
        !second.is_finished(),
        "the second won while the first leads"
    );
    assert_eq!(leader_value(&e1).await.as_deref(), Some("one"));

    // 1. Resign: the second leads at once.
    e1.resign().await.unwrap();
    assert!(!e1.is_leader());
    let mut e2 = within("the second wins after a resign", second)
        .await
        .unwrap()
        .unwrap();
    assert!(e2.is_leader());
    assert_eq!(leader_value(&e2).await.as_deref(), Some("two"));

    // 2. The leader's lease is revoked: the waiting first candidate leads.
    let first = tokio::spawn(async move { e1.campaign("one again").await.map(|_| e1) });
    queued().await;
    s2.close().await.unwrap();
    let e1 = within("the first wins after a revoke", first)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leader_value(&e1).await.as_deref(), Some("one again"));
    // The old leader finds out when it proclaims.
    assert!(matches!(
        e2.proclaim("still me?").await,
        Err(Error::NotLeader)
    ));
    assert!(!e2.is_leader());

    // 3. The leader's session just stops (the process died): its key expires
    // with the lease and the next candidate leads.
    let mut e1 = e1;
    e1.resign().await.unwrap();
    let short = session(&c, 2).await;
    let mut dying = Election::new(&short, "/el");
    dying.campaign("dying").await.unwrap();
    let s3 = session(&c, 30).await;
    let mut e3 = Election::new(&s3, "/el");
    let third = tokio::spawn(async move { e3.campaign("three").await.map(|_| e3) });
    drop(dying);
    drop(short);
    let e3 = within("the third wins after the leader's lease expires", third)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leader_value(&e3).await.as_deref(), Some("three"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaim_only_while_leading() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let (s1, s2) = (session(&c, 30).await, session(&c, 30).await);
    let mut e1 = Election::new(&s1, "/pr");
    // Not campaigned yet.
    assert!(matches!(e1.proclaim("x").await, Err(Error::NotLeader)));
    e1.campaign("a").await.unwrap();
    e1.proclaim("b").await.unwrap();
    assert_eq!(leader_value(&e1).await.as_deref(), Some("b"));

    // A candidate that has not won cannot proclaim, even from the same
    // prefix: its key is not the leader's.
    let mut e2 = Election::new(&s2, "/pr");
    assert!(matches!(e2.proclaim("mine").await, Err(Error::NotLeader)));
    assert_eq!(leader_value(&e1).await.as_deref(), Some("b"));

    // Campaigning again from the same session is re-entrant: it finds its
    // key, keeps its place and updates the value.
    let mut again = Election::new(&s1, "/pr");
    within("re-entrant campaign", again.campaign("c"))
        .await
        .unwrap();
    assert_eq!(again.rev(), e1.rev());
    assert_eq!(leader_value(&e1).await.as_deref(), Some("c"));

    // A leader whose key was removed from outside is no longer leader.
    c.delete(Delete::key(e1.key().unwrap().clone()))
        .await
        .unwrap();
    assert!(matches!(e1.proclaim("d").await, Err(Error::NotLeader)));
    assert!(e1.leader().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_sees_leader_changes_in_order() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let (s1, s2) = (session(&c, 30).await, session(&c, 30).await);
    let mut e1 = Election::new(&s1, "/obs");
    let mut leaders = e1.observe();
    // Nobody campaigns yet: the stream waits.
    let first = tokio::spawn(async move {
        let kv = leaders.next().await;
        (kv, leaders)
    });
    e1.campaign("a").await.unwrap();
    let (kv, mut leaders) = within("first leader observed", first).await.unwrap();
    assert_eq!(kv.unwrap().unwrap().value(), "a");
    e1.proclaim("a2").await.unwrap();
    let mut e2 = Election::new(&s2, "/obs");
    let second = tokio::spawn(async move { e2.campaign("b").await.map(|_| e2) });
    e1.proclaim("a3").await.unwrap();
    e1.resign().await.unwrap();
    let e2 = within("second wins", second).await.unwrap().unwrap();
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let kv = within("leader change observed", leaders.next())
            .await
            .expect("stream open")
            .unwrap();
        seen.push(String::from_utf8_lossy(kv.value()).into_owned());
    }
    assert_eq!(seen, ["a2", "a3", "b"]);
    assert_eq!(e2.leader().await.unwrap().unwrap().key(), e2.key().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_excludes_concurrent_tasks() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    const TASKS: usize = 4;
    const ROUNDS: usize = 5;
    c.put(Put::new("/counter", "0")).await.unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let c = c.clone();
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            let s = session(&c, 30).await;
            let mut m = Mutex::new(&s, "/locks/counter");
            for _ in 0..ROUNDS {
                m.lock().await.unwrap();
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                // A read-modify-write that loses increments unless excluded.
                let r = c.range(Range::key("/counter")).await.unwrap();
                let n: usize = std::str::from_utf8(r.kvs()[0].value())
                    .unwrap()
                    .parse()
                    .unwrap();
                tokio::task::yield_now().await;
                c.put(Put::new("/counter", (n + 1).to_string()))
                    .await
                    .unwrap();
                inside.fetch_sub(1, Ordering::SeqCst);
                m.unlock().await.unwrap();
            }
            s.close().await.unwrap();
        }));
    }
    for t in tasks {
        within("a locking task", t).await.unwrap();
    }
    let r = c.range(Range::key("/counter")).await.unwrap();
    assert_eq!(r.kvs()[0].value(), (TASKS * ROUNDS).to_string().as_str());
    assert!(
        c.range(Range::prefix("/locks/"))
            .await
            .unwrap()
            .kvs()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_on_a_held_lock_and_waiting_lock_session_loss() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let (s1, s2) = (session(&c, 30).await, session(&c, 30).await);
    let mut m1 = Mutex::new(&s1, "/tl");
    m1.lock().await.unwrap();
    let mut m2 = Mutex::new(&s2, "/tl");
    assert!(matches!(m2.try_lock().await, Err(Error::Locked)));
    // Its claim was withdrawn: only the holder's key is there.
    let keys = c.range(Range::prefix("/tl/")).await.unwrap();
    assert_eq!(keys.kvs().len(), 1);
    assert_eq!(keys.kvs()[0].key(), m1.key().unwrap());
    // The same session holds it already (Go's re-entrancy).
    let mut same = Mutex::new(&s1, "/tl");
    same.try_lock().await.unwrap();
    assert_eq!(same.key(), m1.key());
    m1.unlock().await.unwrap();
    m2.try_lock().await.unwrap();
    m2.unlock().await.unwrap();

    // A waiter whose session is revoked stops waiting with SessionExpired.
    m1.lock().await.unwrap();
    let waiter = tokio::spawn(async move { m2.lock().await });
    eventually("the waiter queued")
        .within(T)
        .every(Duration::from_millis(20))
        .until_eq(2, async || {
            c.range(Range::prefix("/tl/")).await.unwrap().kvs().len()
        })
        .await;
    c.lease_revoke(s2.lease()).await.unwrap();
    let r = within("the waiter gives up", waiter).await.unwrap();
    assert!(matches!(r, Err(Error::SessionExpired)), "{r:?}");
    m1.unlock().await.unwrap();
}

/// How many keys are queued under `prefix`, and which, for a wait that
/// says what it saw.
async fn queue(c: &Client, prefix: &str) -> Vec<String> {
    c.range(Range::prefix(prefix.to_string()))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect()
}

/// Drives `pending` (a `lock()` or `campaign()` that must wait) until
/// `prefix` holds `n` keys, then drops it, the way a timeout or a `select!`
/// does.
async fn drop_once_queued<F: std::future::Future>(c: &Client, prefix: &str, n: usize, pending: F)
where
    F::Output: std::fmt::Debug,
{
    let pending = std::pin::pin!(pending);
    tokio::select! {
        r = pending => panic!("the waiter finished while it should wait: {r:?}"),
        _ = eventually(format!("{n} keys queued under {prefix}"))
            .within(T)
            .every(Duration::from_millis(20))
            .until(async || match queue(c, prefix).await {
                keys if keys.len() == n => Ok(()),
                keys => Err(format!("{keys:?}")),
            }) => {}
    }
}

/// A `lock()` dropped while it waits withdraws its claim (Go's `Lock`
/// deletes its key when the context is cancelled): the key is gone, and a
/// later locker gets the lock as soon as the holder unlocks, instead of
/// queueing behind a claim nobody will release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_pending_lock_withdraws_its_claim() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let (s1, s2, s3) = (
        session(&c, 30).await,
        session(&c, 30).await,
        session(&c, 30).await,
    );
    let mut holder = Mutex::new(&s1, "/dl");
    holder.lock().await.unwrap();
    let mut waiter = Mutex::new(&s2, "/dl");
    let waiter_key = format!("/dl/{:x}", s2.lease());
    drop_once_queued(&c, "/dl/", 2, waiter.lock()).await;
    eventually("the dropped waiter's key is deleted")
        .within(T)
        .every(Duration::from_millis(20))
        .until(async || {
            let r = c.range(Range::key(waiter_key.clone())).await.unwrap();
            match r.kvs().first() {
                None => Ok(()),
                Some(kv) => Err(format!(
                    "{waiter_key} still there, created at {}; queue {:?}",
                    kv.create_revision(),
                    queue(&c, "/dl/").await
                )),
            }
        })
        .await;
    assert_eq!(waiter.key(), None, "the dropped wait still records a claim");

    let mut third = Mutex::new(&s3, "/dl");
    let third = tokio::spawn(async move { third.lock().await.map(|()| third) });
    eventually("the third locker queued")
        .within(T)
        .every(Duration::from_millis(20))
        .until(async || match queue(&c, "/dl/").await {
            keys if keys.len() == 2 => Ok(()),
            keys => Err(format!("{keys:?}")),
        })
        .await;
    holder.unlock().await.unwrap();
    let mut third = within("the third locker gets the lock after the unlock", third)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(third.key().unwrap(), &format!("/dl/{:x}", s3.lease()));
    third.unlock().await.unwrap();
    // The dropped waiter can still lock afterwards.
    waiter.lock().await.unwrap();
    waiter.unlock().await.unwrap();
}

/// A `campaign()` dropped while it waits withdraws its candidacy (Go's
/// `Campaign` resigns when the context is cancelled): the next candidate
/// leads as soon as the leader resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_pending_campaign_withdraws_its_key() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let (s1, s2, s3) = (
        session(&c, 30).await,
        session(&c, 30).await,
        session(&c, 30).await,
    );
    let mut leader = Election::new(&s1, "/de");
    leader.campaign("one").await.unwrap();
    let mut dropped = Election::new(&s2, "/de");
    drop_once_queued(&c, "/de/", 2, dropped.campaign("two")).await;
    let dropped_key = format!("/de/{:x}", s2.lease());
    eventually("the dropped candidate's key is deleted")
        .within(T)
        .every(Duration::from_millis(20))
        .until(async || match queue(&c, "/de/").await {
            keys if !keys.contains(&dropped_key) => Ok(()),
            keys => Err(format!("{dropped_key} still queued: {keys:?}")),
        })
        .await;
    assert_eq!(dropped.key(), None);
    assert!(!dropped.is_leader());

    let mut third = Election::new(&s3, "/de");
    let third = tokio::spawn(async move { third.campaign("three").await.map(|()| third) });
    eventually("the third candidate queued")
        .within(T)
        .every(Duration::from_millis(20))
        .until(async || match queue(&c, "/de/").await {
            keys if keys.len() == 2 => Ok(()),
            keys => Err(format!("{keys:?}")),
        })
        .await;
    leader.resign().await.unwrap();
    let third = within("the third candidate leads after the resign", third)
        .await
        .unwrap()
        .unwrap();
    assert!(third.is_leader());
    assert_eq!(leader_value(&third).await.as_deref(), Some("three"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_list_of_one_member() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let list = c.member_list().await.unwrap();
    let status = c.status().await.unwrap();
    assert_ne!(list.cluster_id, 0);
    assert_eq!(list.members.len(), 1, "{list:?}");
    let m = &list.members[0];
    assert_eq!(m.id, status.member_id);
    assert_eq!(m.name, etcd.name());
    assert!(!m.is_learner);
    assert_eq!(m.client_urls, etcd.endpoints(), "{m:?}");
    assert!(
        m.peer_urls
            .iter()
            .any(|u| u.ends_with(&format!(":{}", etcd.peer_port()))),
        "{m:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_alarm_compact_defragment_disarm() {
    // A 1 MiB quota is reached after a handful of 100 KiB values.
    let etcd = Etcd::builder()
        .extra_args(&["--quota-backend-bytes=1048576"])
        .start();
    let c = client(&etcd);
    let big = bytes::Bytes::from(vec![b'x'; 100 * 1024]);
    let mut refused = None;
    for i in 0..200 {
        match c.put(Put::new(format!("/big/{i}"), big.clone())).await {
            Ok(_) => {}
            Err(e) => {
                refused = Some((i, e));
                break;
            }
        }
    }
    let (puts, err) = refused.expect("the quota was never reached");
    let version = c.status().await.unwrap().version;
    eprintln!("etcd {version}: NOSPACE after {puts} puts of 100 KiB");
    assert!(matches!(err, Error::NoSpace), "after {puts} puts: {err:?}");
    let member = c.status().await.unwrap().member_id;
    let alarms = c.alarm_list().await.unwrap();
    assert_eq!(
        alarms,
        [Alarm {
            member_id: member,
            kind: AlarmKind::NoSpace
        }]
    );
    // Every write is refused now, even a small one; deletes are allowed.
    assert!(matches!(
        c.put(Put::new("/small", "1")).await,
        Err(Error::NoSpace)
    ));
    let before = c.status().await.unwrap().db_size;
    c.delete(Delete::prefix("/big/")).await.unwrap();
    let rev = c.status().await.unwrap().revision;
    c.compact(rev, true).await.unwrap();
    c.defragment().await.unwrap();
    let after = c.status().await.unwrap().db_size;
    assert!(
        after < before,
        "defragment freed nothing: {before} -> {after}"
    );
    let disarmed = c.alarm_disarm(alarms[0]).await.unwrap();
    assert_eq!(disarmed, alarms);
    assert!(c.alarm_list().await.unwrap().is_empty());
    c.put(Put::new("/small", "1")).await.unwrap();
}

/// The status fields beyond the basics, and an alarm raised by a client:
/// etcd then refuses writes as it does for a real NOSPACE, says so in the
/// status' errors, and takes writes again once the alarm is disarmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alarm_raised_by_a_client_refuses_writes_and_shows_in_the_status() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    c.put(Put::new("/al", "1")).await.unwrap();
    let st = c.status().await.unwrap();
    assert!(
        st.db_size_in_use > 0 && st.db_size_in_use <= st.db_size,
        "{st:?}"
    );
    assert!(!st.is_learner);
    assert!(st.raft_applied_index > 0, "{st:?}");
    assert!(st.errors.is_empty(), "{st:?}");

    let alarm = Alarm {
        member_id: st.member_id,
        kind: AlarmKind::NoSpace,
    };
    assert_eq!(c.alarm_activate(alarm).await.unwrap(), [alarm]);
    assert_eq!(c.alarm_list().await.unwrap(), [alarm]);
    let r = c.put(Put::new("/al", "2")).await;
    assert!(matches!(r, Err(Error::NoSpace)), "{r:?}");
    let errors = c.status().await.unwrap().errors;
    assert!(
        errors.len() == 1 && errors[0].contains("NOSPACE"),
        "{errors:?}"
    );

    assert_eq!(c.alarm_disarm(alarm).await.unwrap(), [alarm]);
    c.put(Put::new("/al", "3")).await.unwrap();
    assert!(c.status().await.unwrap().errors.is_empty());
}

/// Downgrade is etcd 3.5's: there a validate reports the cluster version,
/// a target two minors down or not a version is refused, and a cancel
/// without a downgrade says so; 3.4 has no such call, and says so as a
/// typed error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_on_3_5_and_unimplemented_on_3_4() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let version = c.status().await.unwrap().version;
    if version.starts_with("3.4.") {
        let r = c.downgrade(DowngradeAction::Validate, "3.3").await;
        match r {
            Err(Error::Unimplemented(m)) => assert!(m.contains("3.5"), "{m}"),
            other => panic!("3.4 answered a downgrade: {other:?}"),
        }
        return;
    }
    let ok = c.downgrade(DowngradeAction::Validate, "3.4").await.unwrap();
    assert_eq!(ok.cluster_version, "3.5.0");
    let r = c.downgrade(DowngradeAction::Validate, "3.3").await;
    assert!(matches!(r, Err(Error::InvalidDowngradeTarget(_))), "{r:?}");
    let r = c.downgrade(DowngradeAction::Validate, "three.four").await;
    assert!(matches!(r, Err(Error::InvalidDowngradeTarget(_))), "{r:?}");
    let r = c.downgrade(DowngradeAction::Cancel, "").await;
    assert!(matches!(r, Err(Error::NoDowngradeInProgress)), "{r:?}");
    // Not an enable: etcd 3.5.1 never answers one (it ends in etcd's own
    // "request timed out" after about 7 s), so there is nothing here to
    // cancel either.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_kv_is_stable_at_a_revision() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    for i in 0..20 {
        c.put(Put::new(format!("/h/{i}"), format!("{i}")))
            .await
            .unwrap();
    }
    let rev = c.status().await.unwrap().revision;
    let first = c.hash_kv(rev).await.unwrap();
    for i in 20..30 {
        c.put(Put::new(format!("/h/{i}"), "later")).await.unwrap();
    }
    let again = c.hash_kv(rev).await.unwrap();
    assert_eq!(
        (again.hash, again.compact_revision),
        (first.hash, first.compact_revision)
    );
    assert!(again.header.revision > rev);
    let latest = c.hash_kv(0).await.unwrap();
    assert_ne!(latest.hash, first.hash);
    // A compaction moves the start of the hashed history.
    c.compact(rev, true).await.unwrap();
    let compacted = c.hash_kv(0).await.unwrap();
    assert_eq!(compacted.compact_revision, rev);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_prefixes_and_strips_keys() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let ns = c.with_namespace("/ns/");
    // Neighbours on both sides of the namespace, which it must never see.
    c.put(Put::new("/nr", "before")).await.unwrap();
    c.put(Put::new("/ns0", "after")).await.unwrap();
    let start = c.status().await.unwrap().revision + 1;
    let mut watcher = ns
        .watch(WatchOptions::prefix("").start_revision(start).prev_kv())
        .unwrap();

    ns.put(Put::new("a", "1")).await.unwrap();
    ns.put(Put::new("b", "2")).await.unwrap();
    ns.put(Put::new(vec![0xff, 0xff], "3")).await.unwrap();
    let raw = c.range(Range::key("/ns/a")).await.unwrap();
    assert_eq!(raw.kvs()[0].value(), "1");

    let keys = |r: &aether_etcd::RangeResponse| -> Vec<Vec<u8>> {
        r.kvs().iter().map(|kv| kv.key().to_vec()).collect()
    };
    let all = ns.range(Range::prefix("")).await.unwrap();
    assert_eq!(keys(&all), [b"a".to_vec(), b"b".to_vec(), vec![0xff, 0xff]]);
    // [0] as a range end is the end of the namespace, not of the keyspace.
    let from_b = ns.range(Range::between("b", vec![0u8])).await.unwrap();
    assert_eq!(keys(&from_b), [b"b".to_vec(), vec![0xff, 0xff]]);
    let ff = ns.range(Range::prefix(vec![0xffu8])).await.unwrap();
    assert_eq!(keys(&ff), [vec![0xff, 0xff]]);
    let one = ns.range(Range::between("a", "b")).await.unwrap();
    assert_eq!(keys(&one), [b"a".to_vec()]);

    let prev = ns.put(Put::new("a", "1b").prev_kv()).await.unwrap();
    assert_eq!(prev.prev_kv.unwrap().key(), "a");

    // A txn: compares and ops of both branches inside, results stripped.
    let txn = Txn::new()
        .when([Compare::value("a", CompareOp::Equal, "1b")])
        .and_then([
            Op::from(Put::new("c", "4").prev_kv()),
            Op::from(Range::prefix("")),
        ])
        .or_else([Range::key("a")]);
    let r = ns.txn(txn).await.unwrap();
    assert!(r.succeeded);
    match &r.responses[1] {
        OpResponse::Range(r) => assert_eq!(r.kvs().len(), 4),
        other => panic!("{other:?}"),
    }
    let r = ns
        .txn(
            Txn::new()
                .when([Compare::value("a", CompareOp::Equal, "nope")])
                .or_else([Range::key("a")]),
        )
        .await
        .unwrap();
    assert!(!r.succeeded);
    match &r.responses[0] {
        OpResponse::Range(r) => assert_eq!(r.kvs()[0].key(), "a"),
        other => panic!("{other:?}"),
    }

    let del = ns.delete(Delete::key("b").prev_kv()).await.unwrap();
    assert_eq!(del.prev_kvs[0].key(), "b");
    let rest = ns.delete(Delete::prefix("").prev_kv()).await.unwrap();
    assert_eq!(rest.deleted, 3);
    // The neighbours are untouched.
    assert_eq!(c.range(Range::prefix("/n")).await.unwrap().count, 2);

    // The watch saw exactly the namespace's changes, stripped, in order.
    let mut seen = Vec::new();
    while seen.len() < 9 {
        let r = within("namespace watch", watcher.next())
            .await
            .expect("watch open")
            .unwrap();
        for ev in r.events {
            if let Some(prev) = &ev.prev_kv {
                assert_eq!(prev.key(), ev.kv.key());
            }
            seen.push((ev.kind, String::from_utf8_lossy(ev.kv.key()).into_owned()));
        }
    }
    use aether_etcd::EventKind::{Delete as D, Put as P};
    let ffff = String::from_utf8_lossy(&[0xff, 0xff]).into_owned();
    assert_eq!(
        seen,
        [
            (P, "a".to_string()),
            (P, "b".into()),
            (P, ffff.clone()),
            (P, "a".into()),
            (P, "c".into()),
            (D, "b".into()),
            (D, "a".into()),
            (D, "c".into()),
            (D, ffff),
        ]
    );
}

/// Auto-sync replaces the configured endpoints with the members' advertised
/// client URLs, and its task ends with the last `Client`: it holds the
/// connections, never the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_auto_sync_follows_the_member_list_and_ends_with_the_client() {
    // The member advertises a proxy in front of itself, so the synced
    // endpoint's connections can be counted.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let advertised = format!("http://{}", listener.local_addr().unwrap());
    let etcd = Etcd::builder()
        .extra_args(&[&format!("--advertise-client-urls={advertised}")])
        .start();
    let proxy = FaultProxy::with_listener(listener, etcd.client_addr());
    assert_eq!(proxy.endpoint(), advertised);
    // Configured: the member directly, and a port nothing listens on.
    let config = ClientConfig::new([etcd.endpoint(), "http://127.0.0.1:9".to_string()])
        .with_auto_sync_interval(Duration::from_millis(100));
    let c = Client::connect(config).unwrap();
    assert!(
        wait_until_async(T, || c.endpoints() == [advertised.clone()]).await,
        "endpoints never synced: {:?}",
        c.endpoints()
    );
    c.put(Put::new("/synced", "1")).await.unwrap();
    assert!(proxy.active_connections() >= 1);

    drop(c);
    assert!(
        wait_until_async(T, || proxy.active_connections() == 0).await,
        "{} connections still open: the auto-sync task outlived its client",
        proxy.active_connections()
    );
}

/// The layout is Go's: `etcdctl elect` (etcd's own election, run by the
/// server's v3election service) and this client campaign in one queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_interoperates_with_etcdctl_elect() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    /// Stops the etcdctl process by pid even when the test fails.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let go = Reap(
        etcdctl_command()
            .arg(format!("--endpoints={}", etcd.endpoint()))
            .args(["elect", "/interop", "from-go"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run etcdctl elect"),
    );
    let s = session(&c, 30).await;
    let mut e = Election::new(&s, "/interop");
    eventually("etcdctl leads")
        .within(T)
        .every(Duration::from_millis(20))
        .until_eq(Some("from-go".to_string()), async || leader_value(&e).await)
        .await;
    let ours = tokio::spawn(async move { e.campaign("from-rust").await.map(|_| e) });
    eventually("our candidate queued behind etcdctl")
        .within(T)
        .every(Duration::from_millis(20))
        .until(
            async || match c.range(Range::prefix("/interop/")).await.unwrap().count {
                n if n >= 2 => Ok(()),
                n => Err(format!("{n} candidates")),
            },
        )
        .await;
    assert!(!ours.is_finished(), "led while etcdctl leads");
    // etcdctl resigns on SIGINT.
    let pid = go.0.id().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let e = within("the Rust candidate leads after etcdctl resigns", ours)
        .await
        .unwrap()
        .unwrap();
    drop(go);
    assert_eq!(leader_value(&e).await.as_deref(), Some("from-rust"));
}
