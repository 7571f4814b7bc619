//! A property test of the merge-join (`src/mirror/diff.rs`) that the
//! sync, the verification pass and `check` share: random contents on a
//! source and a peer etcd (real processes), joined at many page sizes over
//! both the short-link path (one sequential scan of the peer) and the
//! long-link one (several scans over intervals the source marks out),
//! against a plain-map oracle. The join reads through the client's scans,
//! so it runs against real etcds; tiny pages split the contents at every
//! boundary.
//!
//! The seed is printed; `MERGE_SEED=<n>` replays a run.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use aether_replicator::etcd::{Client, KeyValue, LeaseId, Put, Txn};
use aether_replicator::mirror::check::{JOIN_LONG_LINK, join};
use common::mirror::{Lcg, Scene};

/// Random cases per run.
const CASES: usize = 40;
/// Page sizes each case is joined at: one key a page (every boundary), a
/// few, and larger than any case.
const PAGE_SIZES: [usize; 5] = [1, 2, 3, 7, 1000];

/// (value, lease) of one key on one side.
type Held = (Vec<u8>, i64);

/// One side's contents under the case's prefix.
type Side = BTreeMap<Vec<u8>, Held>;

fn held(kv: &KeyValue) -> (Vec<u8>, Held) {
    (kv.key().to_vec(), (kv.value().to_vec(), kv.lease().get()))
}

/// A key under `prefix`: a short name, or the key right after another
/// (a trailing 0 byte: where a page's next range starts), or one ending in
/// 0xff, or the prefix itself.
fn random_key(rng: &mut Lcg, prefix: &str) -> Vec<u8> {
    let mut k = prefix.as_bytes().to_vec();
    match rng.below(10) {
        0 => {}
        1 | 2 => {
            k.extend_from_slice(format!("k{}", rng.below(20)).as_bytes());
            k.push(0);
        }
        3 => {
            k.extend_from_slice(format!("k{}", rng.below(20)).as_bytes());
            k.push(0xff);
        }
        _ => k.extend_from_slice(format!("k{}", rng.below(40)).as_bytes()),
    }
    k
}

/// Random contents for both sides: keys on one side only, on both with
/// the same value and lease, a different value, or another lease.
fn random_case(rng: &mut Lcg, prefix: &str, src_lease: i64, peer_leases: [i64; 2]) -> (Side, Side) {
    let (mut src, mut peer) = (Side::new(), Side::new());
    // Empty sides and a side much larger than the other come up often.
    let n = match rng.below(6) {
        0 => 0,
        1 => 1 + rng.below(3),
        _ => rng.below(40),
    };
    let lean = rng.below(5); // 0: source only, 1: peer only, else mixed
    let keys: BTreeSet<Vec<u8>> = (0..n).map(|_| random_key(rng, prefix)).collect();
    for (i, k) in keys.into_iter().enumerate() {
        let value = format!("v{i}-{}", rng.below(1000)).into_bytes();
        let lease = |rng: &mut Lcg| match rng.below(3) {
            0 => 0,
            x => peer_leases[x as usize - 1],
        };
        let s_lease = if rng.below(4) == 0 { src_lease } else { 0 };
        let roll = match lean {
            0 => 0,
            1 => 1,
            _ => rng.below(6),
        };
        match roll {
            0 => {
                src.insert(k, (value, s_lease));
            }
            1 => {
                let l = lease(rng);
                peer.insert(k, (value, l));
            }
            2 => {
                // Equal keys, different values.
                let l = lease(rng);
                peer.insert(k.clone(), (b"other".to_vec(), l));
                src.insert(k, (value, s_lease));
            }
            _ => {
                // Equal keys and values, on whatever lease.
                let l = lease(rng);
                peer.insert(k.clone(), (value.clone(), l));
                src.insert(k, (value, s_lease));
            }
        }
    }
    (src, peer)
}

async fn write(c: &Client, side: &Side, outside: &[Vec<u8>]) {
    let puts = side
        .iter()
        .map(|(k, (v, l))| Put::new(k.clone(), v.clone()).lease(LeaseId::new(*l)))
        .chain(outside.iter().map(|k| Put::new(k.clone(), "outside")));
    c.txn(Txn::new().and_then(puts))
        .await
        .expect("write a case");
}

/// What the join must return: every key of either side once, in order.
type Row = (Vec<u8>, Option<Held>, Option<Held>);

fn expected(src: &Side, peer: &Side) -> Vec<Row> {
    let keys: BTreeSet<&Vec<u8>> = src.keys().chain(peer.keys()).collect();
    keys.into_iter()
        .map(|k| (k.clone(), src.get(k).cloned(), peer.get(k).cloned()))
        .collect()
}

fn rows(joined: Vec<(Option<KeyValue>, Option<KeyValue>)>) -> Result<Vec<Row>, String> {
    joined
        .into_iter()
        .map(|(s, d)| {
            let s = s.as_ref().map(held);
            let d = d.as_ref().map(held);
            match (s, d) {
                (Some((ks, s)), Some((kd, d))) if ks == kd => Ok((ks, Some(s), Some(d))),
                (Some((ks, _)), Some((kd, _))) => Err(format!(
                    "a pair of different keys: {:?} and {:?}",
                    String::from_utf8_lossy(&ks),
                    String::from_utf8_lossy(&kd)
                )),
                (Some((k, s)), None) => Ok((k, Some(s), None)),
                (None, Some((k, d))) => Ok((k, None, Some(d))),
                (None, None) => Err("a row with neither side".into()),
            }
        })
        .collect()
}

fn show(rows: &[Row]) -> String {
    let side = |h: &Option<Held>| {
        h.as_ref().map_or("-".to_string(), |(v, l)| {
            format!("{}@{l:x}", String::from_utf8_lossy(v))
        })
    };
    rows.iter()
        .map(|(k, s, d)| {
            format!(
                "  {:?}: {} | {}",
                String::from_utf8_lossy(k),
                side(s),
                side(d)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_join_matches_a_plain_map_oracle_at_every_page_size() {
    let seed: u64 = std::env::var("MERGE_SEED")
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("MERGE_SEED must be a u64"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000_000
        });
    eprintln!("MERGE_SEED={seed}");
    let scene = Scene::start();
    let (src, peer) = scene.clients();
    let src_lease = src
        .lease_grant(Duration::from_secs(600))
        .await
        .unwrap()
        .id
        .get();
    let peer_leases = [
        peer.lease_grant(Duration::from_secs(600))
            .await
            .unwrap()
            .id
            .get(),
        peer.lease_grant(Duration::from_secs(600))
            .await
            .unwrap()
            .id
            .get(),
    ];
    let mut rng = Lcg(seed);
    let (mut joins, mut keys) = (0usize, 0usize);
    for case in 0..CASES {
        let prefix = format!("/merge/{case}/");
        let (s, p) = random_case(&mut rng, &prefix, src_lease, peer_leases);
        // Neighbours just outside the prefix, on both sides: never joined.
        let outside = vec![
            format!("/merge/{case}.").into_bytes(),
            format!("/merge/{case}0").into_bytes(),
        ];
        write(&src, &s, &outside).await;
        write(&peer, &p, &outside).await;
        let want = expected(&s, &p);
        keys += want.len();
        for page_size in PAGE_SIZES {
            for rtt in [Duration::ZERO, JOIN_LONG_LINK] {
                let got = join(
                    src.clone(),
                    peer.clone(),
                    prefix.clone().into(),
                    page_size,
                    Some(rtt),
                )
                .await
                .map_err(|e| format!("join failed: {e}"))
                .and_then(rows);
                joins += 1;
                match got {
                    Ok(got) if got == want => {}
                    Ok(got) => {
                        let at = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
                        panic!(
                            "MERGE_SEED={seed} case {case} ({prefix}), pages of {page_size}, \
                             rtt {rtt:?}: the join differs from the oracle from row {at} \
                             ({} rows, {} expected)\njoin:\n{}\noracle:\n{}",
                            got.len(),
                            want.len(),
                            show(&got),
                            show(&want)
                        );
                    }
                    Err(e) => panic!(
                        "MERGE_SEED={seed} case {case} ({prefix}), pages of {page_size}, \
                         rtt {rtt:?}: {e}\noracle:\n{}",
                        show(&want)
                    ),
                }
            }
        }
    }
    eprintln!("{CASES} cases, {keys} keys, {joins} joins, all as the oracle says");
}
