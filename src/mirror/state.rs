//! The per-origin state key each peer holds, and the fence built on it.
//!
//! `<state_root><region>/state` lives outside the registry root, under the
//! mirror lease, and reads
//! `v1 revision=<r> lease=<id> holder=<hex> source=<hex> origin=<hex> heartbeat=<ms> synced=<0|1> ttl=<s>`:
//!
//! - `revision`: every source revision up to it is applied on this peer.
//!   It is a lower bound (txns may be in flight past it), so resuming from
//!   it replays at most a few batches, which is harmless: mirroring is
//!   idempotent. 0 means "no complete sync under this lease yet".
//! - `lease`: the lease every mirrored key is attached to.
//! - `holder`: the engine incarnation that wrote it.
//! - `source`: the cluster id of the source etcd the copy came from. A
//!   source whose cluster id changed forces a full re-sync; a *different*
//!   source holding a live claim is another site with the same region
//!   name, and the claim is not taken from it.
//! - `origin`: the source's own id, a random number the engine keeps in the
//!   source etcd itself (`<state_root><region>/source-id`, created once).
//!   Two sites given one region name differ here even when their etcds
//!   share a cluster id (one manifest deployed twice: same member name,
//!   peer URL and token); the cluster id alone could not tell them apart.
//! - `heartbeat`: Unix time in milliseconds when the peer was last known to
//!   hold everything through the source's revision of that moment. A
//!   consumer's staleness is its clock minus this (clock skew included).
//! - `synced`: a complete copy was made under this lease: a consumer never
//!   mistakes a half-done first sync for the region's registry.
//! - `ttl`: the TTL the lease was granted with, in seconds. The key lives
//!   under that lease, so a successor that reads it knows the lease alive
//!   and its TTL without asking the peer (a round trip less on a restart).
//!
//! The last five were added later; a value without them decodes with
//! `source=0` and `origin=0` (unknown), `heartbeat=0` (never),
//! `synced=0` and `ttl=0` (unknown: the reader asks the lease). Readers
//! skip fields they do not know, so an engine that predates a field reads
//! a value that carries it (a rolling upgrade runs both).
//!
//! **Fencing.** An engine claims a peer by deleting the state key and
//! creating it anew; the creation revision is its fence. Every mirror txn
//! compares `create_revision(state) == fence`, so once a successor has
//! claimed the peer, every txn of the predecessor fails, including those
//! already in flight. Comparing the create revision rather than the mod
//! revision (which changes with every batch) lets many txns be in flight.

use bytes::Bytes;

use crate::etcd::{
    Compare, CompareOp, Delete, Header, KeyValue, LeaseId, Op, OpResponse, Put, Range, Txn,
};
use crate::store::Store;

/// The parsed value of a state key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    /// Applied through this source revision; 0: no complete sync yet.
    pub revision: i64,
    /// The lease the mirrored keys are attached to.
    pub lease: LeaseId,
    /// The engine incarnation that wrote it.
    pub holder: u64,
    /// The source etcd's cluster id; 0: unknown.
    pub source_cluster: u64,
    /// The source's own id (kept in the source etcd); 0: unknown.
    pub source_id: u64,
    /// When the peer was last known current, Unix ms by the writer's
    /// clock; 0: never. Read it with [`State::staleness_at`].
    pub heartbeat_unix_ms: i64,
    /// A complete copy was made under this lease.
    pub synced: bool,
    /// The TTL the lease was granted with, seconds; 0: unknown (written
    /// by an engine that predates the field).
    pub lease_ttl: i64,
}

impl State {
    /// How stale the copy is by a reader's clock reading `now_unix_ms`;
    /// `None` when the key carries no heartbeat. The one rule every
    /// consumer of a state key uses (the view, `status`, the incoming
    /// copies' metrics).
    ///
    /// The heartbeat is the writer's wall clock, so skew between the two
    /// clocks moves the answer: that is the price of a reader that needs
    /// nothing but the key. Two rules keep a clock step from making a
    /// copy read fresher than it is:
    /// - the writer never writes a heartbeat ahead of its own clock: it
    ///   derives it, at each write, from its clock now less the copy's age
    ///   on its monotonic clock (so a step of its wall clock moves the
    ///   heartbeat only while the step lasts);
    /// - a heartbeat in the reader's future is *suspect*: it counts as old
    ///   as it is far ahead, never as age 0. A writer whose clock was set
    ///   an hour ahead and then cut off reads an hour stale, not fresh.
    ///
    /// Why not a staleness free of clocks altogether: a reader that
    /// watches the key could time its writes on its own monotonic clock,
    /// but a one-shot reader (`status`, an alert's scrape of a fresh
    /// process) sees one write and has nothing to time it against except
    /// the writer's clock. Skew between regions is bounded by NTP; the
    /// rules above make sure it can only hide up to that skew.
    pub fn staleness_at(&self, now_unix_ms: i64) -> Option<std::time::Duration> {
        staleness(self.heartbeat_unix_ms, now_unix_ms)
    }

    /// The encoded value.
    pub fn encode(&self) -> Bytes {
        Bytes::from(format!(
            "v1 revision={} lease={} holder={:016x} source={:016x} origin={:016x} heartbeat={} synced={} ttl={}",
            self.revision,
            // Decimal, as the format always had it (not LeaseId's hex).
            self.lease.get(),
            self.holder,
            self.source_cluster,
            self.source_id,
            self.heartbeat_unix_ms,
            u8::from(self.synced),
            self.lease_ttl
        ))
    }

    /// Parses a value written by [`State::encode`].
    pub fn decode(value: &[u8]) -> Option<State> {
        let text = std::str::from_utf8(value).ok()?;
        let mut parts = text.split(' ');
        if parts.next()? != "v1" {
            return None;
        }
        let (mut revision, mut lease, mut holder) = (None, None, None);
        let (mut source_cluster, mut source_id, mut heartbeat_unix_ms, mut synced) =
            (0, 0, 0, false);
        let mut lease_ttl = 0;
        for part in parts {
            let (k, v) = part.split_once('=')?;
            match k {
                "revision" => revision = v.parse().ok(),
                "lease" => lease = v.parse::<i64>().ok().map(LeaseId::new),
                "holder" => holder = u64::from_str_radix(v, 16).ok(),
                "source" => source_cluster = u64::from_str_radix(v, 16).ok()?,
                "origin" => source_id = u64::from_str_radix(v, 16).ok()?,
                "heartbeat" => heartbeat_unix_ms = v.parse().ok()?,
                "synced" => synced = v == "1",
                // A negative TTL is no TTL: ask the lease.
                "ttl" => lease_ttl = v.parse::<i64>().ok()?.max(0),
                _ => {}
            }
        }
        Some(State {
            revision: revision?,
            lease: lease?,
            holder: holder?,
            source_cluster,
            source_id,
            heartbeat_unix_ms,
            synced,
            lease_ttl,
        })
    }
}

/// [`State::staleness_at`] for a heartbeat kept apart from its key.
pub fn staleness(heartbeat_unix_ms: i64, now_unix_ms: i64) -> Option<std::time::Duration> {
    (heartbeat_unix_ms > 0)
        .then(|| std::time::Duration::from_millis(now_unix_ms.abs_diff(heartbeat_unix_ms)))
}

/// The state key as read from a peer.
#[derive(Clone, Debug)]
pub(crate) struct Stored {
    pub state: Option<State>,
    pub mod_revision: i64,
    pub create_revision: i64,
}

impl Stored {
    pub(crate) fn from_kv(kv: Option<&KeyValue>) -> Stored {
        match kv {
            Some(kv) => Stored {
                state: State::decode(kv.value()),
                mod_revision: kv.mod_revision(),
                create_revision: kv.create_revision(),
            },
            None => Stored {
                state: None,
                mod_revision: 0,
                create_revision: 0,
            },
        }
    }
}

pub(crate) async fn read(peer: &Store, key: &Bytes) -> crate::etcd::Result<(Stored, Header)> {
    let resp = peer.range(Range::key(key.clone())).await?;
    Ok((Stored::from_kv(resp.kvs().first()), resp.header))
}

/// The guard every mirror txn carries.
pub(crate) fn fence(key: &Bytes, create_revision: i64) -> Compare {
    Compare::create_revision(key.clone(), CompareOp::Equal, create_revision)
}

/// The first step of a claim when the peer holds a state key: deletes it
/// if it is still as `seen` (compare-and-delete). From the moment this
/// commits every txn of the key's holder fails its fence. False if the
/// key moved meanwhile.
pub(crate) async fn release(peer: &Store, key: &Bytes, seen: &Stored) -> crate::etcd::Result<bool> {
    let del = Txn::new()
        .when([Compare::mod_revision(
            key.clone(),
            CompareOp::Equal,
            seen.mod_revision,
        )])
        .and_then([Delete::key(key.clone())]);
    Ok(peer.txn(del).await?.succeeded)
}

/// The claim's last step, once the peer holds no state key (seen absent,
/// or [`release`]d): creates it (create-if-absent) and returns the new
/// fence, its create revision. `None` if another engine created it first.
/// Two steps, not one txn: etcd refuses a delete and a put of one key in
/// the same txn, and the fence must be a new create revision.
pub(crate) async fn create(
    peer: &Store,
    key: &Bytes,
    state: State,
) -> crate::etcd::Result<Option<i64>> {
    let create = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([Put::new(key.clone(), state.encode()).lease(state.lease)]);
    let resp = peer.txn(create).await?;
    Ok(resp.succeeded.then_some(resp.header.revision))
}

/// What a claim made in one txn found on the peer ([`claim_at_once`]).
pub(crate) enum AtOnce {
    /// No state key: the claim created it, its fence is the header's
    /// revision, and the copy's first keys (at most the page asked for)
    /// were read in the same txn.
    Created {
        header: Header,
        kvs: Vec<KeyValue>,
        /// Keys remain past the last of `kvs`.
        more: bool,
    },
    /// A state key: as read, for the claim's usual steps.
    Held(Stored, Header),
}

/// A whole claim in one round trip, for a peer that most likely holds no
/// state key: creates it if absent, as [`create`] does, and in the same
/// txn reads the first `page` keys under `prefix` (the sync's first read
/// of the copy, at the claim's own revision: no txn of an earlier holder
/// can land after it, since none passes its fence once the key is new);
/// if present, reads it, as [`read`] does. `state.lease` must exist by
/// the time etcd applies the txn, or the txn fails as a whole with
/// [`crate::etcd::Error::LeaseNotFound`].
pub(crate) async fn claim_at_once(
    peer: &Store,
    key: &Bytes,
    state: State,
    prefix: &Bytes,
    page: i64,
) -> crate::etcd::Result<AtOnce> {
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([
            Op::from(Put::new(key.clone(), state.encode()).lease(state.lease)),
            Op::from(Range::prefix(prefix.clone()).limit(page)),
        ])
        .or_else([Range::key(key.clone())]);
    let resp = peer.txn(txn).await?;
    let range = resp.responses.into_iter().find_map(|r| match r {
        OpResponse::Range(r) => Some(r),
        _ => None,
    });
    Ok(if resp.succeeded {
        let more = range.as_ref().is_some_and(|r| r.more);
        AtOnce::Created {
            header: resp.header,
            kvs: range.map(|r| r.into_kvs()).unwrap_or_default(),
            more,
        }
    } else {
        AtOnce::Held(
            Stored::from_kv(range.as_ref().and_then(|r| r.kvs().first())),
            resp.header,
        )
    })
}

/// Deletes the state key if it is still the one created at `fence`: a
/// claim that turned out to hang on a lease that is not its own.
pub(crate) async fn withdraw(peer: &Store, key: &Bytes, fence: i64) -> crate::etcd::Result<()> {
    let del = Txn::new()
        .when([self::fence(key, fence)])
        .and_then([Delete::key(key.clone())]);
    peer.txn(del).await.map(|_| ())
}

/// The source's own id, kept in the source etcd at `key`: read, or created
/// (with a random value) if absent, in one txn. Whoever creates it first
/// wins; every engine of the region then reads the same id. Also returns
/// the source's header (cluster id, revision) as of that txn.
pub(crate) async fn source_id(
    local: &Store,
    key: &Bytes,
    fresh: u64,
) -> crate::etcd::Result<(u64, Header)> {
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([Put::new(key.clone(), format!("{fresh:016x}"))])
        .or_else([Range::key(key.clone())]);
    let resp = local.txn(txn).await?;
    if resp.succeeded {
        return Ok((fresh, resp.header));
    }
    let stored = resp.responses.iter().find_map(|r| match r {
        crate::etcd::OpResponse::Range(r) => r.kvs().first().map(|kv| parse_id(kv.value())),
        _ => None,
    });
    Ok((stored.flatten().unwrap_or(0), resp.header))
}

/// The source id as stored (16 hex digits); `None` if unreadable.
pub(crate) fn parse_id(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
        .filter(|id| *id != 0)
}

/// A fresh identity for an engine incarnation.
pub(crate) fn new_holder() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish() | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips() {
        let s = State {
            revision: 42,
            lease: LeaseId::new(7_587_869_230_000_000_123),
            holder: 0xdead_beef,
            source_cluster: 0xcdf8_18194e3a8c32,
            source_id: 0x1234_5678_9abc_def1,
            heartbeat_unix_ms: 1_796_000_000_123,
            synced: true,
            lease_ttl: 30,
        };
        assert_eq!(State::decode(&s.encode()), Some(s));
        // Written by an engine before the identity fields.
        let old = State::decode(b"v1 revision=9 lease=3 holder=00000000000000aa").unwrap();
        assert_eq!(
            (
                old.revision,
                old.source_cluster,
                old.source_id,
                old.heartbeat_unix_ms,
                old.synced
            ),
            (9, 0, 0, 0, false)
        );
        assert_eq!(old.lease_ttl, 0, "unknown: the reader asks the lease");
        // Written before the TTL field, and read by an engine that has it.
        let before_ttl = State::decode(
            b"v1 revision=9 lease=3 holder=00000000000000aa source=0000000000000001 origin=0000000000000002 heartbeat=5 synced=1",
        )
        .unwrap();
        assert_eq!((before_ttl.synced, before_ttl.lease_ttl), (true, 0));
        // A field this engine does not know (written by a later one) is
        // skipped, as an engine before `ttl` skips `ttl`.
        let later = State::decode(b"v1 revision=9 lease=3 holder=aa ttl=7 future=x").unwrap();
        assert_eq!(later.lease_ttl, 7);
        assert_eq!(State::decode(b"v1 revision=1 lease=1 holder=1 ttl=x"), None);
        assert_eq!(State::decode(b"v2 revision=1 lease=1 holder=1"), None);
        assert_eq!(State::decode(b"v1 revision=x lease=1 holder=1"), None);
        assert_eq!(State::decode(b"\xff"), None);
        assert_ne!(new_holder(), new_holder());
    }
}
