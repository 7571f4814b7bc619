//! The client's KV and watch options against real etcd: watch filters,
//! range and from-key watches (and their resume across restarts), nested
//! txns, mod-revision bounds, puts that keep their value or lease, and the
//! namespace variants of each.

use std::pin::Pin;
use std::time::Duration;

use aether_etcd::{
    Client, ClientConfig, Compare, CompareOp, Delete, Error, EventKind, LeaseId, Op, OpResponse,
    Put, Range, RangeResponse, Result, Txn, TxnResponse, WatchOptions, WatchResponse,
};
use aether_test_kit::{Etcd, wait_until_async};
use futures_util::{Stream, StreamExt};

fn client(etcd: &Etcd) -> Client {
    Client::connect(ClientConfig::new(etcd.endpoints())).expect("client")
}

/// Generous bound for anything that should happen "at once".
const T: Duration = Duration::from_secs(20);

/// One event as a test compares it: revision, key, kind.
type Seen = (i64, String, EventKind);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Reads `w` until `got` holds `n` events (progress notices skipped), or
/// panics with what it had after `T`.
async fn read_until<W>(w: &mut W, got: &mut Vec<Seen>, n: usize, what: &str)
where
    W: Stream<Item = Result<WatchResponse>> + Unpin,
{
    let done = tokio::time::timeout(T, async {
        while got.len() < n {
            match w.next().await {
                Some(Ok(r)) => got.extend(
                    r.events
                        .into_iter()
                        .map(|e| (e.revision(), text(e.kv.key()), e.kind)),
                ),
                Some(Err(e)) => return Err(format!("watch error {e}")),
                None => return Err("watch ended".to_string()),
            }
        }
        Ok(())
    })
    .await;
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{what}: {e} after {} of {n} events: {got:?}", got.len()),
        Err(_) => panic!("{what}: {} of {n} events within {T:?}: {got:?}", got.len()),
    }
}

fn keys(r: &RangeResponse) -> Vec<String> {
    r.kvs().iter().map(|kv| text(kv.key())).collect()
}

fn range_of(r: &OpResponse) -> &RangeResponse {
    match r {
        OpResponse::Range(r) => r,
        other => panic!("not a range result: {other:?}"),
    }
}

fn txn_of(r: &OpResponse) -> &TxnResponse {
    match r {
        OpResponse::Txn(t) => t,
        other => panic!("not a nested txn result: {other:?}"),
    }
}

/// A no-put watch sees the deletes and none of the puts, a no-delete watch
/// the reverse. Both end on one txn that puts and deletes at the same
/// revision, so an event that got through the filter would show up in
/// their lists, before or beside the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_filters_leave_out_puts_or_deletes() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let start = c.status().await.unwrap().revision + 1;
    let stream = c.watch_stream();
    let at = |o: WatchOptions| o.start_revision(start);
    let mut no_put = stream
        .watch(at(WatchOptions::prefix("/f/").no_put()))
        .unwrap();
    let mut no_delete = stream
        .watch(at(WatchOptions::prefix("/f/").no_delete()))
        .unwrap();
    let mut all = stream.watch(at(WatchOptions::prefix("/f/"))).unwrap();

    let mut writes: Vec<Seen> = Vec::new();
    for (key, put) in [
        ("/f/a", true),
        ("/f/b", true),
        ("/f/a", false),
        ("/f/a", true),
        ("/f/b", false),
        ("/f/c", true),
    ] {
        let rev = if put {
            c.put(Put::new(key, "v")).await.unwrap().header.revision
        } else {
            let d = c.delete(Delete::key(key)).await.unwrap();
            assert_eq!(d.deleted, 1, "{key} existed");
            d.header.revision
        };
        let kind = if put {
            EventKind::Put
        } else {
            EventKind::Delete
        };
        writes.push((rev, key.to_string(), kind));
    }
    let last = c
        .txn(Txn::new().and_then([
            Op::from(Put::new("/f/d", "v")),
            Op::from(Delete::key("/f/c")),
        ]))
        .await
        .unwrap()
        .header
        .revision;
    writes.push((last, "/f/d".into(), EventKind::Put));
    writes.push((last, "/f/c".into(), EventKind::Delete));
    let only =
        |kind: EventKind| -> Vec<Seen> { writes.iter().filter(|w| w.2 == kind).cloned().collect() };

    let (deletes, puts) = (only(EventKind::Delete), only(EventKind::Put));
    let mut got = Vec::new();
    read_until(&mut no_put, &mut got, deletes.len(), "no-put watch").await;
    assert_eq!(got, deletes);
    let mut got = Vec::new();
    read_until(&mut no_delete, &mut got, puts.len(), "no-delete watch").await;
    assert_eq!(got, puts);
    // The same writes unfiltered: every one is an event.
    let mut got = Vec::new();
    read_until(&mut all, &mut got, writes.len(), "unfiltered watch").await;
    assert_eq!(got, writes);
}

/// A range watch sees the keys in `[from, to)` and nothing either side; a
/// from-key watch sees every key at or above its key, to the very end of
/// the keyspace, and nothing below. Both end on a write inside both, after
/// writes outside them, so a stray event would show in their lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_and_from_key_watches_see_only_their_keys() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let start = c.status().await.unwrap().revision + 1;
    let (_s1, mut between) = c
        .watch(WatchOptions::between("/w/b", "/w/d").start_revision(start))
        .unwrap();
    let (_s2, mut from) = c
        .watch(WatchOptions::from_key("/w/c").start_revision(start))
        .unwrap();
    // Raw keys beside each write: 0xff is not text, and the bounds are
    // compared as bytes.
    let mut writes: Vec<(Vec<u8>, Seen)> = Vec::new();
    let puts: [&[u8]; 8] = [
        b"/v",
        b"/w/a",
        b"/w/b",
        b"/w/bz",
        b"/w/c",
        b"/w/d",
        b"/w0",
        b"\xff\xff",
    ];
    for k in puts {
        let rev = c.put(Put::new(k, "1")).await.unwrap().header.revision;
        writes.push((k.to_vec(), (rev, text(k), EventKind::Put)));
    }
    let deletes: [&[u8]; 5] = [b"/w/bz", b"/w/a", b"\xff\xff", b"/w/d", b"/w/c"];
    for k in deletes {
        let d = c.delete(Delete::key(k)).await.unwrap();
        assert_eq!(d.deleted, 1);
        writes.push((k.to_vec(), (d.header.revision, text(k), EventKind::Delete)));
    }
    let inside = |lo: &[u8], hi: &[u8]| -> Vec<Seen> {
        writes
            .iter()
            .filter(|(k, _)| k.as_slice() >= lo && (hi.is_empty() || k.as_slice() < hi))
            .map(|(_, s)| s.clone())
            .collect()
    };

    let want = inside(b"/w/b", b"/w/d");
    let mut got = Vec::new();
    read_until(&mut between, &mut got, want.len(), "range watch").await;
    assert_eq!(got, want);
    let got_keys: Vec<&str> = got.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(got_keys, ["/w/b", "/w/bz", "/w/c", "/w/bz", "/w/c"]);

    let want = inside(b"/w/c", b"");
    let mut got = Vec::new();
    read_until(&mut from, &mut got, want.len(), "from-key watch").await;
    assert_eq!(got, want);
    assert_eq!(want.len(), 7, "c, d, /w0, ffff put; ffff, d, c deleted");
}

/// A watch under test in the restart test: what it is, what it is owed,
/// what it got.
struct Owed {
    name: &'static str,
    events: Pin<Box<dyn Stream<Item = Result<WatchResponse>> + Send>>,
    /// The key as this watch reports it, if it sees this event.
    sees: fn(&str, EventKind) -> Option<String>,
    want: Vec<Seen>,
    got: Vec<Seen>,
}

impl Owed {
    fn record(&mut self, rev: i64, key: &str, kind: EventKind) {
        if let Some(k) = (self.sees)(key, kind) {
            self.want.push((rev, k, kind));
        }
    }
}

/// Every kind of watch resumes across etcd restarts exactly once: filtered
/// ones, a range, a from-key, and a from-key inside a namespace, all on
/// streams that break while events are in flight. Each write is owed to
/// exactly the watches it matches, in order, and each list must match
/// event for event, up to a last txn that every watch sees part of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_watch_kind_resumes_exactly_once_across_etcd_restarts() {
    let mut etcd = Etcd::start();
    let c = client(&etcd);
    let start = c.status().await.unwrap().revision + 1;
    let stream = c.watch_stream();
    let on_stream = |opts: WatchOptions| -> Pin<Box<dyn Stream<Item = _> + Send>> {
        Box::pin(stream.watch(opts.start_revision(start)).unwrap())
    };
    let mut owed = vec![
        Owed {
            name: "no-put",
            events: on_stream(WatchOptions::prefix("/r/").no_put()),
            sees: |k, e| (k.starts_with("/r/") && e == EventKind::Delete).then(|| k.into()),
            want: Vec::new(),
            got: Vec::new(),
        },
        Owed {
            name: "no-delete",
            events: on_stream(WatchOptions::prefix("/r/").no_delete()),
            sees: |k, e| (k.starts_with("/r/") && e == EventKind::Put).then(|| k.into()),
            want: Vec::new(),
            got: Vec::new(),
        },
        Owed {
            name: "range",
            events: on_stream(WatchOptions::between("/r/2", "/r/5")),
            sees: |k, _| ("/r/2".."/r/5").contains(&k).then(|| k.into()),
            want: Vec::new(),
            got: Vec::new(),
        },
        Owed {
            name: "from-key",
            events: on_stream(WatchOptions::from_key("/r/4")),
            sees: |k, _| (k >= "/r/4").then(|| k.into()),
            want: Vec::new(),
            got: Vec::new(),
        },
        // Inside /r/, from "4" to the namespace's end: never /r0 or /s/x.
        // On a stream of its own.
        Owed {
            name: "namespace from-key",
            events: Box::pin(
                c.with_namespace("/r/")
                    .watch(WatchOptions::from_key("4").start_revision(start))
                    .unwrap(),
            ),
            sees: |k, _| k.strip_prefix("/r/").filter(|k| *k >= "4").map(Into::into),
            want: Vec::new(),
            got: Vec::new(),
        },
    ];

    let keys = [
        "/a", "/r/0", "/r/1", "/r/2", "/r/3", "/r/4", "/r/5", "/r/6", "/r0", "/s/x",
    ];
    for round in 0..3 {
        for i in 0..60usize {
            let key = keys[(i * 7 + round) % keys.len()];
            if i % 3 == 2 {
                let d = c.delete(Delete::key(key)).await.unwrap();
                // Deleting an absent key makes no revision and no event.
                if d.deleted > 0 {
                    owed.iter_mut()
                        .for_each(|o| o.record(d.header.revision, key, EventKind::Delete));
                }
            } else {
                let p = c.put(Put::new(key, format!("{round}-{i}"))).await.unwrap();
                owed.iter_mut()
                    .for_each(|o| o.record(p.header.revision, key, EventKind::Put));
            }
        }
        // Read half of what each watch is still owed, then kill etcd with
        // the rest in flight or not yet sent.
        for o in &mut owed {
            let half = o.got.len() + (o.want.len() - o.got.len()) / 2;
            read_until(&mut o.events, &mut o.got, half, o.name).await;
        }
        assert!(stream.is_connected());
        tokio::task::block_in_place(|| etcd.kill());
        assert!(
            wait_until_async(T, || !stream.is_connected()).await,
            "the stream noticed the loss"
        );
        tokio::task::block_in_place(|| etcd.restart());
    }
    // A last txn that each watch sees part of: a duplicate, or an event
    // it should not see, would push its list out of place.
    let p = c.put(Put::new("/r/3", "x")).await.unwrap();
    owed.iter_mut()
        .for_each(|o| o.record(p.header.revision, "/r/3", EventKind::Put));
    let last = c
        .txn(Txn::new().and_then([
            Op::from(Put::new("/r/4", "last")),
            Op::from(Delete::key("/r/3")),
        ]))
        .await
        .unwrap()
        .header
        .revision;
    for o in &mut owed {
        o.record(last, "/r/4", EventKind::Put);
        o.record(last, "/r/3", EventKind::Delete);
    }
    for o in &mut owed {
        read_until(&mut o.events, &mut o.got, o.want.len(), o.name).await;
        assert_eq!(o.got, o.want, "{}", o.name);
        assert!(
            o.want.len() > 20,
            "{} was owed too little to prove much",
            o.name
        );
    }
    assert!(stream.reconnects() >= 3, "{}", stream.reconnects());
}

/// A txn nested in either branch runs with the branch, answers with its
/// own branch's results, and nests further. Its compares see the store as
/// it was before the outer txn, not the writes of ops before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_txns_run_in_either_branch_with_their_responses() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    c.put(Put::new("/n/k", "0")).await.unwrap();
    let inner = |tag: &str| {
        Txn::new()
            .when([Compare::value("/n/k", CompareOp::Equal, "0")])
            .and_then([
                Op::from(Put::new(format!("/n/{tag}-yes"), "1").prev_kv()),
                Op::from(Range::prefix("/n/")),
            ])
            .or_else([Put::new(format!("/n/{tag}-no"), "1")])
    };
    // Outer success: the nested txn's compare holds even though the put
    // before it changed /n/k (compares are evaluated first, all of them).
    let r = c
        .txn(
            Txn::new()
                .when([Compare::version("/n/k", CompareOp::Greater, 0)])
                .and_then([Op::from(Put::new("/n/k", "1")), Op::from(inner("s"))])
                .or_else([Put::new("/n/never", "1")]),
        )
        .await
        .unwrap();
    assert!(r.succeeded);
    assert_eq!(r.responses.len(), 2);
    let nested = txn_of(&r.responses[1]);
    assert!(nested.succeeded, "{nested:?}");
    assert_eq!(nested.responses.len(), 2);
    // The nested range reads through the outer txn's writes.
    let seen = range_of(&nested.responses[1]);
    assert_eq!(keys(seen), ["/n/k", "/n/s-yes"]);
    assert_eq!(seen.kvs()[0].value(), "1");

    // Outer failure, nested in the failure branch; /n/k is "1" now, so the
    // nested compare fails as well, and a second level runs in its failure
    // branch.
    let deeper = Txn::new()
        .when([Compare::value("/n/k", CompareOp::Equal, "1")])
        .and_then([Range::key("/n/k")]);
    let r = c
        .txn(
            Txn::new()
                .when([Compare::version("/n/k", CompareOp::Equal, 0)])
                .and_then([Put::new("/n/never", "1")])
                .or_else([Op::from(
                    inner("f").or_else([Op::from(deeper), Op::from(Delete::key("/n/s-yes"))]),
                )]),
        )
        .await
        .unwrap();
    assert!(!r.succeeded);
    let nested = txn_of(&r.responses[0]);
    assert!(!nested.succeeded);
    assert_eq!(nested.responses.len(), 3, "{nested:?}");
    assert!(matches!(nested.responses[0], OpResponse::Put(_)));
    let deepest = txn_of(&nested.responses[1]);
    assert!(deepest.succeeded);
    assert_eq!(range_of(&deepest.responses[0]).kvs()[0].value(), "1");
    match &nested.responses[2] {
        OpResponse::Delete(d) => assert_eq!(d.deleted, 1),
        other => panic!("{other:?}"),
    }
    let now = c.range(Range::prefix("/n/")).await.unwrap();
    assert_eq!(keys(&now), ["/n/f-no", "/n/k"]);
    assert_eq!(r.header.revision, now.header.revision, "one revision");

    // A key written in both the outer branch and a nested one is refused;
    // in both branches of one nested txn it is not (only one runs).
    let twice = Txn::new().and_then([
        Op::from(Put::new("/n/d", "1")),
        Op::from(Txn::new().and_then([Put::new("/n/d", "2")])),
    ]);
    let e = c.txn(twice).await.err();
    assert!(matches!(e, Some(Error::DuplicateKey)), "{e:?}");
    let either = Txn::new().and_then([Txn::new()
        .when([Compare::version("/n/d", CompareOp::Equal, 0)])
        .and_then([Put::new("/n/d", "new")])
        .or_else([Put::new("/n/d", "again")])]);
    let r = c.txn(either).await.unwrap();
    assert!(txn_of(&r.responses[0]).succeeded);
}

/// Mod-revision bounds select keys by when they last changed, unlike
/// create-revision bounds; they apply before the limit, and `count` still
/// counts the whole range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_bounded_by_mod_revision() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let mut revs = Vec::new();
    for i in 0..6 {
        let r = c.put(Put::new(format!("/m/{i}"), "v")).await.unwrap();
        revs.push(r.header.revision);
    }
    // /m/0 changes last: old create revision, newest mod revision.
    let touched = c.put(Put::new("/m/0", "w")).await.unwrap().header.revision;
    let r = c
        .range(Range::prefix("/m/").min_mod_revision(revs[4]))
        .await
        .unwrap();
    assert_eq!(keys(&r), ["/m/0", "/m/4", "/m/5"]);
    assert_eq!(r.count, 6, "count ignores the bounds");
    let r = c
        .range(Range::prefix("/m/").max_mod_revision(revs[2]))
        .await
        .unwrap();
    assert_eq!(keys(&r), ["/m/1", "/m/2"]);
    let r = c
        .range(
            Range::prefix("/m/")
                .min_mod_revision(revs[2])
                .max_mod_revision(revs[4]),
        )
        .await
        .unwrap();
    assert_eq!(keys(&r), ["/m/2", "/m/3", "/m/4"]);
    let r = c
        .range(Range::prefix("/m/").min_create_revision(revs[4]))
        .await
        .unwrap();
    assert_eq!(keys(&r), ["/m/4", "/m/5"], "create bounds skip /m/0");
    let r = c
        .range(Range::prefix("/m/").min_mod_revision(touched))
        .await
        .unwrap();
    assert_eq!(keys(&r), ["/m/0"]);
    // Bounds before the limit: the first two keys in range that pass,
    // and more of them left.
    let r = c
        .range(Range::prefix("/m/").min_mod_revision(revs[3]).limit(2))
        .await
        .unwrap();
    assert_eq!(keys(&r), ["/m/0", "/m/3"]);
    assert!(r.more);
    // From-key ranges, and a from-key delete, on the same keys.
    let r = c.range(Range::from_key("/m/4")).await.unwrap();
    assert_eq!(keys(&r), ["/m/4", "/m/5"]);
    // An empty key or prefix is every key (etcd refuses an empty key).
    let all = c.range(Range::from_key("")).await.unwrap();
    assert_eq!(all.count, 6);
    assert_eq!(c.range(Range::prefix("")).await.unwrap().count, 6);
    let d = c.delete(Delete::from_key("/m/3").prev_kv()).await.unwrap();
    assert_eq!(d.deleted, 3);
    assert_eq!(
        d.prev_kvs
            .iter()
            .map(|kv| text(kv.key()))
            .collect::<Vec<_>>(),
        ["/m/3", "/m/4", "/m/5"]
    );
    assert_eq!(c.delete(Delete::prefix("")).await.unwrap().deleted, 3);
}

/// `ignore_value` keeps the value and moves the key to another lease;
/// `ignore_lease` keeps the lease and changes the value. The server's
/// refusals of either come back as their own errors, alone or in a txn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_that_keep_the_value_or_the_lease() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let l1 = c.lease_grant(Duration::from_secs(300)).await.unwrap().id;
    let l2 = c.lease_grant(Duration::from_secs(300)).await.unwrap().id;
    c.put(Put::new("/i/k", "v1").lease(l1)).await.unwrap();
    let get = || async { c.range(Range::key("/i/k")).await.unwrap().into_kvs() };

    let p = c
        .put(Put::new("/i/k", "").ignore_value().lease(l2).prev_kv())
        .await
        .unwrap();
    assert_eq!(p.prev_kv.as_ref().map(|kv| kv.lease()), Some(l1));
    let kv = &get().await[0];
    assert_eq!(
        (kv.value().as_ref(), kv.lease(), kv.version()),
        (&b"v1"[..], l2, 2)
    );
    assert_eq!(kv.mod_revision(), p.header.revision, "still a write");

    c.put(Put::new("/i/k", "v2").ignore_lease()).await.unwrap();
    let kv = &get().await[0];
    assert_eq!((kv.value().as_ref(), kv.lease()), (&b"v2"[..], l2));
    // The lease is really attached: revoking it deletes the key.
    c.lease_revoke(l2).await.unwrap();
    assert!(get().await.is_empty(), "the key went with lease {l2}");

    let e = c.put(Put::new("/i/k", "").ignore_value()).await.err();
    assert!(matches!(e, Some(Error::KeyNotFound)), "{e:?}");
    let e = c.put(Put::new("/i/k", "v").ignore_lease()).await.err();
    assert!(matches!(e, Some(Error::KeyNotFound)), "{e:?}");
    c.put(Put::new("/i/k", "v3")).await.unwrap();
    let e = c.put(Put::new("/i/k", "x").ignore_value()).await.err();
    assert!(matches!(e, Some(Error::ValueProvided)), "{e:?}");
    let e = c
        .put(Put::new("/i/k", "x").ignore_lease().lease(l1))
        .await
        .err();
    assert!(matches!(e, Some(Error::LeaseProvided)), "{e:?}");
    // In a txn the missing key fails the whole txn, its other ops too.
    let e = c
        .txn(Txn::new().and_then([
            Put::new("/i/other", "1"),
            Put::new("/i/missing", "").ignore_value(),
        ]))
        .await
        .err();
    assert!(matches!(e, Some(Error::KeyNotFound)), "{e:?}");
    assert_eq!(c.range(Range::key("/i/other")).await.unwrap().count, 0);
    let kv = &get().await[0];
    assert_eq!(
        (kv.value().as_ref(), kv.lease()),
        (&b"v3"[..], LeaseId::NONE)
    );
}

/// Inside a namespace, nested txns are prefixed at every level (compares
/// and ops) and their results stripped; range and from-key watches see
/// the namespace's keys in their range, stripped, and a from-key watch
/// stops at the namespace's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_nested_txns_and_range_watches() {
    let etcd = Etcd::start();
    let c = client(&etcd);
    let ns = c.with_namespace("/ns/");
    let start = c.status().await.unwrap().revision + 1;
    let mut between = ns
        .watch(WatchOptions::between("b", "d").start_revision(start))
        .unwrap();
    let mut from = ns
        .watch(
            WatchOptions::from_key("c")
                .no_delete()
                .start_revision(start),
        )
        .unwrap();

    // Neighbours on both sides of the namespace, never to be seen.
    c.put(Put::new("/nr", "before")).await.unwrap();
    c.put(Put::new("/ns0", "after")).await.unwrap();
    let mut writes: Vec<Seen> = Vec::new();
    for k in ["a", "b", "c", "d", "zz"] {
        let rev = ns.put(Put::new(k, k)).await.unwrap().header.revision;
        writes.push((rev, k.to_string(), EventKind::Put));
    }
    // A nested txn two levels deep, in the namespace.
    let inner = Txn::new()
        .when([Compare::value("a", CompareOp::Equal, "a")])
        .and_then([
            Op::from(Put::new("b", "nested").prev_kv()),
            Op::from(Range::from_key("c")),
            Op::from(
                Txn::new()
                    .when([Compare::version("nope", CompareOp::Greater, 0)])
                    .or_else([Delete::key("d").prev_kv()]),
            ),
        ]);
    let r = ns
        .txn(
            Txn::new()
                .when([Compare::create_revision("a", CompareOp::Greater, 0)])
                .and_then([Op::from(inner)]),
        )
        .await
        .unwrap();
    assert!(r.succeeded);
    let nested = txn_of(&r.responses[0]);
    assert!(nested.succeeded, "the nested compare read /ns/a");
    match &nested.responses[0] {
        OpResponse::Put(p) => assert_eq!(p.prev_kv.as_ref().unwrap().key(), "b"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        keys(range_of(&nested.responses[1])),
        ["c", "d", "zz"],
        "stripped, and not past the namespace"
    );
    let deepest = txn_of(&nested.responses[2]);
    assert!(!deepest.succeeded);
    match &deepest.responses[0] {
        OpResponse::Delete(d) => {
            assert_eq!(d.deleted, 1);
            assert_eq!(d.prev_kvs[0].key(), "d");
        }
        other => panic!("{other:?}"),
    }
    writes.push((r.header.revision, "b".into(), EventKind::Put));
    writes.push((r.header.revision, "d".into(), EventKind::Delete));
    let raw = c.range(Range::prefix("/n")).await.unwrap();
    assert_eq!(
        keys(&raw),
        ["/nr", "/ns/a", "/ns/b", "/ns/c", "/ns/zz", "/ns0"]
    );
    assert_eq!(raw.kvs()[2].value(), "nested");
    // A from-key delete in the namespace ends at its end too.
    let d = ns.delete(Delete::from_key("c")).await.unwrap();
    assert_eq!(d.deleted, 2);
    writes.push((d.header.revision, "c".into(), EventKind::Delete));
    writes.push((d.header.revision, "zz".into(), EventKind::Delete));
    // Past the namespace's end, then a last put that both watches see.
    c.put(Put::new("/ns0", "again")).await.unwrap();
    c.put(Put::new("/nt", "beyond")).await.unwrap();
    let rev = ns.put(Put::new("c", "last")).await.unwrap().header.revision;
    writes.push((rev, "c".into(), EventKind::Put));

    let want: Vec<Seen> = writes
        .iter()
        .filter(|(_, k, _)| ("b".."d").contains(&k.as_str()))
        .cloned()
        .collect();
    let mut got = Vec::new();
    read_until(&mut between, &mut got, want.len(), "namespace range watch").await;
    assert_eq!(got, want);
    let want: Vec<Seen> = writes
        .iter()
        .filter(|(_, k, e)| k.as_str() >= "c" && *e == EventKind::Put)
        .cloned()
        .collect();
    let mut got = Vec::new();
    read_until(&mut from, &mut got, want.len(), "namespace from-key watch").await;
    assert_eq!(got, want);
    assert_eq!(c.range(Range::prefix("/n")).await.unwrap().count, 6);
}
