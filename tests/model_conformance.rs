//! The in-memory etcd (`aether_etcd::model`) answers as a real etcd does.
//!
//! Each script is run step by step against a fresh real etcd and against a
//! model cluster following that etcd's release, and every answer is
//! rendered to a line with only what must differ left out (member and
//! cluster ids and the raft term: a header only says whether they are
//! set). The first differing line fails the test with its step.
//!
//! Hand-written scripts cover the edges; seeded random scripts (a fixed
//! seed list, so the test is deterministic) cover the combinations. Lease
//! expiry is not compared here: its timing is the model's unit tests' on
//! paused time; here leases are long and only grant, revoke and TTL
//! presence are compared.
//!
//! A watch step opens a watch, then writes a sentinel (a put and a delete
//! of the watch's first key) and reads until an event past the revision it
//! started from: so it knows it has seen everything up to there without
//! waiting for silence. Only the events up to that revision are compared;
//! how etcd groups them into responses depends on its timing.

mod common;

use std::time::Duration;

use aether_etcd::model::{self, EtcdVersion, ModelConfig};
use aether_etcd::{
    Client, ClientConfig, Compare, CompareOp, Delete, Event, EventKind, Header, KeyValue, LeaseId,
    Op, OpResponse, Put, Range, Result, SortOrder, SortTarget, Txn, TxnResponse, WatchOptions,
};
use bytes::Bytes;
use common::Etcd;
use futures_util::StreamExt;

/// One step of a script.
#[derive(Clone, Debug)]
enum Step {
    Put(Put),
    Delete(Delete),
    Range(Range),
    /// A range at the current revision minus this.
    RangeBack(Range, i64),
    Txn(Txn),
    /// Compact at the current revision minus this.
    Compact(i64),
    Grant(i64, i64),
    GrantAuto(i64),
    Revoke(i64),
    Ttl(i64),
    /// Watch `[key, end)` from the current revision minus `back` (None:
    /// from now), with prev_kv, and a filter (1: no put, 2: no delete).
    Watch {
        key: Bytes,
        end: Bytes,
        back: Option<i64>,
        prev_kv: bool,
        filter: u8,
    },
}

/// What both sides answer to.
trait Side {
    async fn step(&mut self, step: &Step) -> String;
}

/// The state a side keeps to resolve relative steps.
#[derive(Default)]
struct Book {
    compacted: i64,
    /// Server-chosen lease ids, in grant order: rendered by their index.
    auto_ids: Vec<i64>,
}

impl Book {
    fn lease(&self, id: i64) -> String {
        match self.auto_ids.iter().position(|a| *a == id) {
            Some(i) => format!("auto{i}"),
            None => id.to_string(),
        }
    }
    fn kv(&self, kv: &KeyValue) -> String {
        format!(
            "{}={}@c{}m{}v{}l{}",
            String::from_utf8_lossy(kv.key()),
            short(kv.value()),
            kv.create_revision(),
            kv.mod_revision(),
            kv.version(),
            self.lease(kv.lease().get())
        )
    }
    fn event(&self, e: &Event) -> String {
        let prev = e.prev_kv.as_ref().map(|p| self.kv(p)).unwrap_or_default();
        match e.kind {
            EventKind::Put => format!("P {} prev({prev})", self.kv(&e.kv)),
            EventKind::Delete => format!(
                "D {}@m{} {} prev({prev})",
                String::from_utf8_lossy(e.kv.key()),
                e.kv.mod_revision(),
                self.kv(&e.kv)
            ),
        }
    }
    fn txn(&self, t: &TxnResponse) -> String {
        let ops: Vec<String> = t
            .responses
            .iter()
            .map(|r| match r {
                OpResponse::Range(r) => format!(
                    "range[{} n{} more{} {}]",
                    header(&r.header),
                    r.count,
                    r.more,
                    r.kvs()
                        .iter()
                        .map(|k| self.kv(k))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                OpResponse::Put(p) => format!(
                    "put[{} prev({})]",
                    header(&p.header),
                    p.prev_kv.as_ref().map(|k| self.kv(k)).unwrap_or_default()
                ),
                OpResponse::Delete(d) => format!(
                    "del[{} n{} {}]",
                    header(&d.header),
                    d.deleted,
                    d.prev_kvs
                        .iter()
                        .map(|k| self.kv(k))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                OpResponse::Txn(t) => format!("txn[{}]", self.txn(t)),
                _ => "?".into(),
            })
            .collect();
        format!("{} ok{} {}", header(&t.header), t.succeeded, ops.join(" "))
    }
}

/// A value as its length when long, so a big one does not flood a report.
fn short(v: &Bytes) -> String {
    if v.len() > 32 {
        format!("<{} bytes>", v.len())
    } else {
        String::from_utf8_lossy(v).into_owned()
    }
}

/// The revision, and which of the ids and the term are set.
fn header(h: &Header) -> String {
    let set = |b: bool, c: char| if b { c } else { '-' };
    format!(
        "r{}{}{}{}",
        h.revision,
        set(h.member_id != 0, 'M'),
        set(h.cluster_id != 0, 'C'),
        set(h.raft_term != 0, 'T')
    )
}

fn err<T>(r: Result<T>, f: impl FnOnce(T) -> String) -> String {
    match r {
        Ok(v) => f(v),
        Err(e) => format!("error {e:?}"),
    }
}

/// The client methods both sides share, by name: the model's have the
/// real client's signatures.
macro_rules! common_steps {
    ($self:ident, $step:ident, $c:expr) => {{
        let c = $c;
        let b = &mut $self.book;
        match $step {
            Step::Put(p) => err(c.put(p.clone()).await, |r| {
                format!(
                    "{} prev({})",
                    header(&r.header),
                    r.prev_kv.as_ref().map(|k| b.kv(k)).unwrap_or_default()
                )
            }),
            Step::Delete(d) => err(c.delete(d.clone()).await, |r| {
                format!(
                    "{} n{} {}",
                    header(&r.header),
                    r.deleted,
                    r.prev_kvs
                        .iter()
                        .map(|k| b.kv(k))
                        .collect::<Vec<_>>()
                        .join(",")
                )
            }),
            Step::Range(r) => range_line(b, c.range(r.clone()).await),
            Step::RangeBack(r, back) => {
                let cur = c.range(Range::key("/rev")).await.unwrap().header.revision;
                range_line(b, c.range(r.clone().revision(cur - back)).await)
            }
            Step::Txn(t) => err(c.txn(t.clone()).await, |r| b.txn(&r)),
            Step::Compact(back) => {
                let cur = c.range(Range::key("/rev")).await.unwrap().header.revision;
                let at = cur - back;
                err(c.compact(at, false).await, |h| {
                    b.compacted = at;
                    header(&h)
                })
            }
            Step::Grant(id, ttl) => err(
                c.lease_grant_with_id(LeaseId::new(*id), secs(*ttl)).await,
                |g| format!("granted {} ttl{}", b.lease(g.id.get()), g.ttl.as_secs()),
            ),
            Step::GrantAuto(ttl) => err(c.lease_grant(secs(*ttl)).await, |g| {
                b.auto_ids.push(g.id.get());
                format!("granted {} ttl{}", b.lease(g.id.get()), g.ttl.as_secs())
            }),
            Step::Revoke(id) => err(c.lease_revoke(LeaseId::new(*id)).await, |()| {
                "revoked".to_string()
            }),
            Step::Ttl(id) => err(c.lease_time_to_live(LeaseId::new(*id), true).await, |t| {
                let mut keys: Vec<String> = t
                    .keys
                    .iter()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .collect();
                keys.sort();
                let live = if t.ttl.is_none() { "gone" } else { "live" };
                format!("{live} granted{} keys{keys:?}", t.granted_ttl.as_secs())
            }),
            Step::Watch { .. } => unreachable!("watches are each side's own"),
        }
    }};
}

/// A script's TTL (whole seconds) as the clients take it.
fn secs(ttl: i64) -> std::time::Duration {
    std::time::Duration::from_secs(ttl as u64)
}

fn range_line(b: &Book, r: Result<aether_etcd::RangeResponse>) -> String {
    err(r, |r| {
        format!(
            "{} n{} more{} {}",
            header(&r.header),
            r.count,
            r.more,
            r.kvs()
                .iter()
                .map(|k| b.kv(k))
                .collect::<Vec<_>>()
                .join(",")
        )
    })
}

fn watch_options(key: &Bytes, end: &Bytes, start: i64, prev_kv: bool, filter: u8) -> WatchOptions {
    let mut o = WatchOptions::between(key.clone(), end.clone()).start_revision(start);
    if prev_kv {
        o = o.prev_kv();
    }
    match filter {
        1 => o.no_put(),
        2 => o.no_delete(),
        _ => o,
    }
}

/// Reads a watcher until an event past `upto` (or an error, or its end),
/// rendering the events up to `upto`.
async fn collect<W>(b: &Book, mut w: W, upto: i64, expect_error: bool) -> String
where
    W: futures_util::Stream<Item = Result<aether_etcd::WatchResponse>> + Unpin,
{
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), w.next()).await;
        let Ok(next) = next else {
            panic!(
                "watch: nothing past revision {upto} within 10 s (error expected: {expect_error}); saw {seen:?}"
            );
        };
        match next {
            None => {
                seen.push("end".to_string());
                break;
            }
            Some(Err(e)) => {
                seen.push(format!("error {e:?}"));
                break;
            }
            Some(Ok(resp)) => {
                let past = resp.events.iter().any(|e| e.revision() > upto);
                seen.extend(
                    resp.events
                        .iter()
                        .filter(|e| e.revision() <= upto)
                        .map(|e| b.event(e)),
                );
                if past {
                    break;
                }
            }
        }
    }
    seen.join(" | ")
}

struct Real {
    client: Client,
    book: Book,
}

struct Model {
    client: model::Client,
    book: Book,
}

/// Where a watch step starts, the revision it reads up to, and whether
/// its start is compacted (then no sentinel is written).
fn watch_plan(cur: i64, back: Option<i64>, compacted: i64) -> (i64, bool) {
    let start = back.map_or(0, |b| (cur - b).max(1));
    (start, start > 0 && (start - 1).max(1) < compacted)
}

impl Side for Real {
    async fn step(&mut self, step: &Step) -> String {
        if let Step::Watch {
            key,
            end,
            back,
            prev_kv,
            filter,
        } = step
        {
            let c = &self.client;
            let cur = c.range(Range::key("/rev")).await.unwrap().header.revision;
            let (start, compacted) = watch_plan(cur, *back, self.book.compacted);
            // etcd's "now" is when the pipelined create arrives, which may
            // be after the sentinel: the revision after `cur` is the same
            // start without the race. The model is asked "from now".
            let start = if start == 0 { cur + 1 } else { start };
            let opts = watch_options(key, end, start, *prev_kv, *filter);
            let (_stream, watcher) = c.watch(opts).unwrap();
            if !compacted {
                c.put(Put::new(key.clone(), "sentinel")).await.unwrap();
                c.delete(Delete::key(key.clone())).await.unwrap();
            }
            return collect(&self.book, watcher, cur, compacted).await;
        }
        common_steps!(self, step, &self.client)
    }
}

impl Side for Model {
    async fn step(&mut self, step: &Step) -> String {
        if let Step::Watch {
            key,
            end,
            back,
            prev_kv,
            filter,
        } = step
        {
            let c = &self.client;
            let cur = c.range(Range::key("/rev")).await.unwrap().header.revision;
            let (start, compacted) = watch_plan(cur, *back, self.book.compacted);
            let opts = watch_options(key, end, start, *prev_kv, *filter);
            let watcher = c.watch(opts).unwrap();
            if !compacted {
                c.put(Put::new(key.clone(), "sentinel")).await.unwrap();
                c.delete(Delete::key(key.clone())).await.unwrap();
            }
            return collect(&self.book, watcher, cur, compacted).await;
        }
        common_steps!(self, step, &self.client)
    }
}

/// Runs `script` on a fresh etcd and on a model of its release, step by
/// step; returns how many steps were compared.
async fn conform(name: &str, script: &[Step]) -> usize {
    let etcd = Etcd::start();
    let client = Client::connect(ClientConfig::new(etcd.endpoints())).unwrap();
    let version = client.status().await.unwrap().version;
    let release = EtcdVersion::parse(&version).unwrap_or_else(|| panic!("etcd {version}"));
    let cluster = model::Cluster::new(ModelConfig::default().with_version(release));
    let mut real = Real {
        client,
        book: Book::default(),
    };
    let mut sim = Model {
        client: cluster.client(0),
        book: Book::default(),
    };
    for (i, step) in script.iter().enumerate() {
        let want = real.step(step).await;
        let got = sim.step(step).await;
        tally(step, &want);
        assert_eq!(
            got, want,
            "{name} on etcd {version}: step {i} differs: {step:?}\n  model: {got}\n  etcd:  {want}"
        );
    }
    // The whole store too, with every key's metadata.
    let all = real
        .client
        .range(Range::prefix(""))
        .await
        .unwrap()
        .into_kvs();
    let render = |b: &Book, kvs: &[KeyValue]| kvs.iter().map(|k| b.kv(k)).collect::<Vec<_>>();
    assert_eq!(
        render(&sim.book, &cluster.dump("")),
        render(&real.book, &all),
        "{name} on etcd {version}: the stores differ at the end"
    );
    script.len()
}

/// Outcomes by kind of step (`txn ok`, `put error LeaseNotFound`, ...),
/// printed by each test so a generator that only makes errors shows.
static TALLY: std::sync::Mutex<std::collections::BTreeMap<String, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn tally(step: &Step, line: &str) {
    let kind = format!("{step:?}");
    let kind = kind
        .split('(')
        .next()
        .unwrap_or_default()
        .split(' ')
        .next()
        .unwrap_or_default();
    let outcome = if let Some(e) = line.strip_prefix("error ") {
        e.split([' ', '(']).next().unwrap_or_default().to_string()
    } else if line.contains(" okfalse") && kind == "Txn" {
        "failure branch".to_string()
    } else {
        "ok".to_string()
    };
    *TALLY
        .lock()
        .unwrap()
        .entry(format!("{kind} {outcome}"))
        .or_default() += 1;
}

fn print_tally() {
    for (k, n) in TALLY.lock().unwrap().iter() {
        eprintln!("  {k}: {n}");
    }
}

fn k(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

/// The edges, one script each aspect.
#[tokio::test]
async fn hand_written_scripts_agree() {
    use Step as S;
    let big = "x".repeat(aether_etcd::DEFAULT_MAX_REQUEST_BYTES);
    let near = |d: i64| {
        // A put of a value so that the request is `d` bytes off the limit.
        let n = (aether_etcd::DEFAULT_MAX_REQUEST_BYTES as i64 - 40 + d) as usize;
        Put::new("/big", "y".repeat(n))
    };
    let many = |n: usize| Txn::new().and_then((0..n).map(|i| Put::new(format!("/m/{i}"), "v")));
    let scripts: Vec<(&str, Vec<Step>)> =
        vec![
            (
                "revisions",
                vec![
                    S::Put(Put::new("/a", "1")),
                    S::Put(Put::new("/a", "1").prev_kv()),
                    S::Delete(Delete::key("/nothing")),
                    S::Delete(Delete::key("/a").prev_kv()),
                    S::Put(Put::new("/a", "2")),
                    S::Range(Range::key("/a")),
                    S::Txn(Txn::new().and_then([Range::key("/a")])),
                    S::Txn(Txn::new().and_then([Delete::key("/none")])),
                    S::Txn(Txn::new()),
                    S::Range(Range::key("/a")),
                    S::Put(Put::new("", "v")),
                    S::Range(Range::key("")),
                ],
            ),
            (
                "ranges",
                vec![
                    S::Put(Put::new("/r/a", "3")),
                    S::Put(Put::new("/r/b", "1")),
                    S::Put(Put::new("/r/c", "2")),
                    S::Put(Put::new("/r/b", "4")),
                    S::Put(Put::new("/s", "x")),
                    S::Range(Range::prefix("/r/")),
                    S::Range(Range::prefix("/r/").limit(2)),
                    S::Range(Range::prefix("/r/").limit(3)),
                    S::Range(Range::prefix("/r/").count_only().limit(1)),
                    S::Range(Range::prefix("/r/").keys_only()),
                    S::Range(Range::from_key("/r/b")),
                    S::Range(Range::from_key("")),
                    S::Range(Range::between("/r/c", "/r/a")),
                    S::Range(Range::between("/r/a", "/r/c")),
                    S::Range(Range::prefix("/r/").sort(SortTarget::Value, SortOrder::Descend)),
                    S::Range(
                        Range::prefix("/r/")
                            .sort(SortTarget::Key, SortOrder::Descend)
                            .limit(2),
                    ),
                    S::Range(Range::prefix("/r/").sort(SortTarget::ModRevision, SortOrder::Ascend)),
                    S::Range(Range::prefix("/r/").sort(SortTarget::Version, SortOrder::Descend)),
                    S::Range(Range::prefix("/r/").min_mod_revision(3).limit(1)),
                    S::Range(Range::prefix("/r/").max_create_revision(3)),
                    S::RangeBack(Range::prefix("/r/"), 2),
                    S::RangeBack(Range::prefix("/r/"), -1),
                    S::Compact(2),
                    S::RangeBack(Range::prefix("/r/"), 2),
                    S::RangeBack(Range::prefix("/r/"), 3),
                    S::Compact(2),
                    S::Compact(-1),
                    S::Compact(0),
                ],
            ),
            (
                "compares",
                vec![
                    S::Put(Put::new("/t/a", "1")),
                    S::Put(Put::new("/t/b", "2")),
                    S::Txn(
                        Txn::new()
                            .when([Compare::value("/t/a", CompareOp::Equal, "1")])
                            .and_then([Put::new("/t/c", "3")])
                            .or_else([Range::key("/t/a")]),
                    ),
                    S::Txn(
                        Txn::new()
                            .when([Compare::value("/t/none", CompareOp::NotEqual, "1")])
                            .and_then([Put::new("/t/x", "3")])
                            .or_else([Range::prefix("/t/")]),
                    ),
                    S::Txn(
                        Txn::new()
                            .when([Compare::version("/t/none", CompareOp::Equal, 0)])
                            .and_then([Put::new("/t/d", "4")]),
                    ),
                    S::Txn(
                        Txn::new()
                            .when([Compare::mod_revision("/t/", CompareOp::Greater, 1)
                                .with_range_end("/t0")])
                            .and_then([Range::prefix("/t/")]),
                    ),
                    S::Txn(
                        Txn::new()
                            .when([Compare::create_revision("/t/", CompareOp::Less, 3)
                                .with_range_end("/t0")])
                            .and_then([Put::new("/t/e", "5")])
                            .or_else([Put::new("/t/f", "6")]),
                    ),
                    S::Txn(
                        Txn::new()
                            .when([Compare::lease("/t/a", CompareOp::Equal, LeaseId::NONE)])
                            .and_then([Put::new("/t/a", "7")]),
                    ),
                    S::Txn(
                        Txn::new()
                            .when([Compare::value("/t/", CompareOp::Greater, "0")
                                .with_range_end("/t0")])
                            .and_then([Put::new("/t/g", "8")]),
                    ),
                    S::Txn(
                        Txn::new()
                            .when([Compare::value("/u/", CompareOp::Greater, "0")
                                .with_range_end("/u0")])
                            .and_then([Put::new("/t/h", "8")]),
                    ),
                    S::Txn(
                        Txn::new()
                            .when([
                                Compare::version("/u/", CompareOp::Equal, 0).with_range_end("/u0")
                            ])
                            .and_then([Put::new("/t/i", "9")]),
                    ),
                ],
            ),
            (
                "txns",
                vec![
                    S::Put(Put::new("/n/a", "1")),
                    // Reads after writes in one txn, and the inner headers.
                    S::Txn(Txn::new().and_then([
                        Op::from(Range::prefix("/n/")),
                        Op::from(Put::new("/n/b", "2").prev_kv()),
                        Op::from(Range::prefix("/n/")),
                        Op::from(Delete::key("/n/a").prev_kv()),
                        Op::from(Delete::key("/n/zz")),
                    ])),
                    // Nested: compares evaluated before the writes.
                    S::Txn(
                        Txn::new().and_then([
                            Op::from(Put::new("/n/c", "3")),
                            Op::from(
                                Txn::new()
                                    .when([Compare::version("/n/c", CompareOp::Equal, 0)])
                                    .and_then([Put::new("/n/d", "4")])
                                    .or_else([Put::new("/n/e", "5")]),
                            ),
                        ]),
                    ),
                    S::Txn(Txn::new().and_then([Put::new("/n/x", "1"), Put::new("/n/x", "2")])),
                    S::Txn(Txn::new().and_then([
                        Op::from(Delete::prefix("/n/")),
                        Op::from(Put::new("/n/x", "1")),
                    ])),
                    S::Txn(Txn::new().and_then([
                        Op::from(Delete::from_key("/n/")),
                        Op::from(Put::new("/n/y", "1")),
                    ])),
                    S::Txn(
                        Txn::new().and_then([Op::from(
                            Txn::new()
                                .and_then([Put::new("/n/z", "1")])
                                .or_else([Put::new("/n/z", "2")]),
                        )]),
                    ),
                    S::Txn(Txn::new().and_then([
                        Op::from(Put::new("/n/z", "0")),
                        Op::from(Txn::new().and_then([Put::new("/n/z", "1")])),
                    ])),
                    S::Txn(Txn::new().and_then([
                        Op::from(Delete::key("/n/a")),
                        Op::from(Delete::prefix("/n/")),
                    ])),
                    S::Txn(many(128)),
                    S::Txn(many(129)),
                    S::Txn(Txn::new().and_then((0..129).map(|i| Range::key(format!("/m/{i}"))))),
                    S::Txn(
                        Txn::new()
                            .when(
                                (0..100).map(|i| {
                                    Compare::version(format!("/m/{i}"), CompareOp::Equal, 1)
                                }),
                            )
                            .and_then([Op::from(
                                Txn::new()
                                    .and_then((0..29).map(|i| Put::new(format!("/q/{i}"), "v"))),
                            )]),
                    ),
                    S::Txn(
                        Txn::new()
                            .when(
                                (0..100).map(|i| {
                                    Compare::version(format!("/m/{i}"), CompareOp::Equal, 1)
                                }),
                            )
                            .and_then([Op::from(
                                Txn::new()
                                    .and_then((0..28).map(|i| Put::new(format!("/q/{i}"), "v"))),
                            )]),
                    ),
                    S::Txn(Txn::new().and_then([Range::key("/n/a").revision(1000)])),
                    S::Txn(Txn::new().and_then([Put::new("/n/w", "1").lease(LeaseId::new(99))])),
                    S::Txn(
                        Txn::new()
                            .when([Compare::version("/n/none", CompareOp::Equal, 1)])
                            .and_then([Put::new("/n/w", "1").lease(LeaseId::new(99))])
                            .or_else([Put::new("/n/w", "2")]),
                    ),
                    S::Put(Put::new("/n/w", "").ignore_value()),
                    S::Put(Put::new("/n/none", "").ignore_value()),
                    S::Put(Put::new("/n/w", "v").ignore_value()),
                    S::Put(Put::new("/n/w", "v2").ignore_lease()),
                    S::Txn(Txn::new().and_then([Put::new("", "v")])),
                ],
            ),
            (
                "sizes",
                vec![
                    S::Put(near(-64)),
                    S::Put(near(64)),
                    S::Put(Put::new("/big2", big.clone())),
                    S::Txn(Txn::new().and_then([Put::new("/big3", big.clone())])),
                    S::Range(Range::key(big.clone())),
                    S::Txn(Txn::new().and_then([Range::key(big.clone())])),
                    S::Range(Range::prefix("/big").keys_only()),
                ],
            ),
            (
                "leases",
                vec![
                    S::Grant(0x70, 100),
                    S::Grant(0x70, 100),
                    S::Grant(0x71, 1),
                    S::GrantAuto(50),
                    S::Put(Put::new("/l/a", "1").lease(LeaseId::new(0x70))),
                    S::Put(Put::new("/l/b", "1").lease(LeaseId::new(0x70))),
                    S::Put(Put::new("/l/c", "1").lease(LeaseId::new(0x71))),
                    S::Put(Put::new("/l/d", "1").lease(LeaseId::new(0x99))),
                    S::Ttl(0x70),
                    S::Ttl(0x99),
                    S::Put(Put::new("/l/b", "2").lease(LeaseId::new(0x71))),
                    S::Put(Put::new("/l/a", "3").ignore_lease()),
                    S::Ttl(0x70),
                    S::Ttl(0x71),
                    S::Watch {
                        key: k("/l/"),
                        end: k("/l0"),
                        back: Some(0),
                        prev_kv: true,
                        filter: 0,
                    },
                    S::Revoke(0x70),
                    S::Range(Range::prefix("/l/")),
                    S::Revoke(0x70),
                    S::Revoke(0x71),
                    S::Revoke(0x72),
                    S::Ttl(0x71),
                    S::Watch {
                        key: k("/l/"),
                        end: k("/l0"),
                        back: Some(4),
                        prev_kv: true,
                        filter: 0,
                    },
                    S::Grant(0x72, 9_000_000_001),
                ],
            ),
            (
                "watches",
                vec![
                    S::Put(Put::new("/w/a", "1")),
                    S::Put(Put::new("/w/b", "1")),
                    S::Txn(Txn::new().and_then([Put::new("/w/a", "2"), Put::new("/w/c", "2")])),
                    S::Delete(Delete::prefix("/w/")),
                    S::Put(Put::new("/w/a", "3")),
                    S::Watch {
                        key: k("/w/"),
                        end: k("/w0"),
                        back: Some(10),
                        prev_kv: true,
                        filter: 0,
                    },
                    S::Watch {
                        key: k("/w/a"),
                        end: Bytes::new(),
                        back: Some(10),
                        prev_kv: false,
                        filter: 1,
                    },
                    S::Watch {
                        key: k("/w/a"),
                        end: k("\0"),
                        back: Some(5),
                        prev_kv: true,
                        filter: 2,
                    },
                    S::Watch {
                        key: k("/w/"),
                        end: k("/w0"),
                        back: None,
                        prev_kv: false,
                        filter: 0,
                    },
                    S::Compact(3),
                    S::Watch {
                        key: k("/w/"),
                        end: k("/w0"),
                        back: Some(4),
                        prev_kv: true,
                        filter: 0,
                    },
                    S::Watch {
                        key: k("/w/"),
                        end: k("/w0"),
                        back: Some(3),
                        prev_kv: true,
                        filter: 0,
                    },
                    S::Watch {
                        key: k("/w/"),
                        end: k("/w0"),
                        back: Some(2),
                        prev_kv: true,
                        filter: 0,
                    },
                ],
            ),
        ];
    let mut steps = 0;
    for (name, script) in &scripts {
        steps += conform(name, script).await;
    }
    eprintln!(
        "{} hand-written scripts, {steps} steps compared",
        scripts.len()
    );
}

/// splitmix64: a seeded generator with no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

/// At most 12 keys, so that etcd's sorts (by insertion up to 12) are
/// stable and comparable.
const KEYS: [&str; 10] = [
    "/c/a", "/c/a/1", "/c/a/2", "/c/b", "/c/b/1", "/c/c", "/c/d", "/c/e", "/c/f", "/c/g",
];
const LEASES: [i64; 3] = [0x501, 0x502, 0x503];

fn key(r: &mut Rng) -> Bytes {
    let s = *r.pick::<&str>(&KEYS);
    k(s)
}

/// A key range: one key, a prefix, a range or from a key.
fn bounds(r: &mut Rng) -> (Bytes, Bytes) {
    let a = key(r);
    match r.below(4) {
        0 => (a, Bytes::new()),
        1 => {
            let p = if r.chance(50) { k("/c/") } else { a };
            let end = aether_etcd::prefix_end(&p);
            (p, end)
        }
        2 => {
            // An empty range (`to` = `from`) would leave a watch nothing
            // to see: one key instead.
            let b = key(r);
            match a.cmp(&b) {
                std::cmp::Ordering::Less => (a, b),
                std::cmp::Ordering::Equal => (a, Bytes::new()),
                std::cmp::Ordering::Greater => (b, a),
            }
        }
        _ => (a, k("\0")),
    }
}

fn put(r: &mut Rng) -> Put {
    let mut p = Put::new(key(r), format!("v{}", r.below(5)));
    if r.chance(15) {
        p = p.lease(LeaseId::new(*r.pick(&LEASES)));
    }
    if r.chance(30) {
        p = p.prev_kv();
    }
    if r.chance(3) {
        p = Put::new(p.key().clone(), "").ignore_value();
    }
    p
}

fn delete(r: &mut Rng) -> aether_etcd::Delete {
    let (a, b) = bounds(r);
    let d = aether_etcd::Delete::between(a, b);
    if r.chance(50) { d.prev_kv() } else { d }
}

fn range(r: &mut Rng) -> Range {
    let (a, b) = bounds(r);
    let mut q = Range::between(a, b);
    if r.chance(30) {
        q = q.limit(r.below(4) as i64);
    }
    if r.chance(15) {
        q = q.keys_only();
    }
    if r.chance(10) {
        q = q.count_only();
    }
    if r.chance(20) {
        let t = *r.pick(&[
            SortTarget::Key,
            SortTarget::Version,
            SortTarget::CreateRevision,
            SortTarget::ModRevision,
            SortTarget::Value,
        ]);
        let o = if r.chance(50) {
            SortOrder::Ascend
        } else {
            SortOrder::Descend
        };
        q = q.sort(t, o);
    }
    if r.chance(10) {
        q = q.min_mod_revision(r.below(20) as i64);
    }
    if r.chance(10) {
        q = q.max_create_revision(r.below(20) as i64);
    }
    q
}

fn compare(r: &mut Rng) -> Compare {
    let (a, b) = bounds(r);
    let op = *r.pick(&[
        CompareOp::Equal,
        CompareOp::NotEqual,
        CompareOp::Greater,
        CompareOp::Less,
    ]);
    let n = r.below(6) as i64;
    let c = match r.below(5) {
        0 => Compare::value(a, op, format!("v{}", r.below(5))),
        1 => Compare::version(a, op, n),
        2 => Compare::create_revision(a, op, n * 3),
        3 => Compare::mod_revision(a, op, n * 3),
        _ => Compare::lease(a, op, LeaseId::new(*r.pick(&[0, LEASES[0], LEASES[1]]))),
    };
    if b.is_empty() { c } else { c.with_range_end(b) }
}

fn op(r: &mut Rng, depth: u32) -> Op {
    match r.below(if depth < 2 { 10 } else { 9 }) {
        0..=3 => Op::from(put(r)),
        4 | 5 => Op::from(delete(r)),
        6..=8 => Op::from(range(r)),
        _ => Op::from(txn(r, depth + 1)),
    }
}

fn txn(r: &mut Rng, depth: u32) -> Txn {
    let n = r.below(3) as usize;
    let compares: Vec<Compare> = (0..n).map(|_| compare(r)).collect();
    let s = r.below(4) as usize;
    let f = r.below(3) as usize;
    let success: Vec<Op> = (0..s).map(|_| op(r, depth)).collect();
    let failure: Vec<Op> = (0..f).map(|_| op(r, depth)).collect();
    Txn::new().when(compares).and_then(success).or_else(failure)
}

fn random_script(seed: u64, len: usize) -> Vec<Step> {
    let mut r = Rng(seed);
    let mut steps = Vec::with_capacity(len);
    for _ in 0..len {
        let s = match r.below(100) {
            0..=29 => Step::Put(put(&mut r)),
            30..=37 => Step::Delete(delete(&mut r)),
            38..=52 => Step::Range(range(&mut r)),
            53..=57 => Step::RangeBack(range(&mut r), r.below(12) as i64 - 1),
            58..=79 => Step::Txn(txn(&mut r, 0)),
            80..=83 => Step::Grant(*r.pick(&LEASES), 300 + r.below(300) as i64),
            84..=86 => Step::Revoke(*r.pick(&LEASES)),
            87..=89 => Step::Ttl(*r.pick(&LEASES)),
            90..=92 => Step::Compact(r.below(15) as i64),
            _ => {
                let (a, b) = bounds(&mut r);
                Step::Watch {
                    key: a,
                    end: b,
                    back: if r.chance(20) {
                        None
                    } else {
                        Some(r.below(20) as i64)
                    },
                    prev_kv: r.chance(50),
                    filter: r.below(3) as u8,
                }
            }
        };
        steps.push(s);
    }
    steps
}

/// Ops per random script.
const RANDOM_STEPS: usize = 300;

async fn random_seeds(seeds: &[u64]) {
    let mut total = 0;
    for &seed in seeds {
        total += conform(&format!("seed {seed}"), &random_script(seed, RANDOM_STEPS)).await;
    }
    eprintln!("{} random scripts, {total} steps compared", seeds.len());
    print_tally();
    let t = TALLY.lock().unwrap();
    for kind in [
        "Txn ok",
        "Txn failure branch",
        "Put ok",
        "Watch ok",
        "Compact ok",
    ] {
        assert!(
            t.get(kind).copied().unwrap_or(0) > 0,
            "the scripts never made a {kind}"
        );
    }
}

#[tokio::test]
async fn random_scripts_agree_a() {
    random_seeds(&[1, 2]).await;
}

#[tokio::test]
async fn random_scripts_agree_b() {
    random_seeds(&[3, 4]).await;
}
