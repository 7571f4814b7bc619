//! The multi-version store: one global revision, every key's versions,
//! the event log watches replay from, and compaction.
//!
//! Each key keeps the list of its versions in revision order, a delete
//! being a tombstone (`None`). A read at revision `r` takes, per key, the
//! last version at or below `r`; so a historical read is the same walk as
//! a current one. The event log keeps, per revision, the events of the
//! txn that made it, in the order etcd emits them (the txn's op order),
//! each with the key-value it replaced, so a watch with `prev_kv` needs no
//! second lookup.

use std::collections::BTreeMap;
use std::ops::Bound;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::pb::{PbEvent, PbEventType, PbKeyValue};

/// One version of a key: the revision that wrote it and what it wrote
/// (`None`: the delete that ended a generation).
#[derive(Clone, Debug)]
pub(super) struct Version {
    pub(super) rev: i64,
    pub(super) kv: Option<PbKeyValue>,
}

/// One change of the log, as a watch delivers it: the event and, apart,
/// the key-value before it (attached only for watchers that ask).
#[derive(Clone, Debug)]
pub(super) struct Change {
    pub(super) event: PbEvent,
    pub(super) prev: Option<PbKeyValue>,
}

impl Change {
    pub(super) fn key(&self) -> &Bytes {
        &self
            .event
            .kv
            .as_ref()
            .expect("events carry a key-value")
            .key
    }
    pub(super) fn is_put(&self) -> bool {
        self.event.r#type == PbEventType::Put as i32
    }
}

/// The store. Cloning it is a snapshot.
#[derive(Clone, Debug)]
pub(super) struct Store {
    /// The current revision. A fresh etcd is at 1.
    pub(super) rev: i64,
    /// The last compaction's revision; -1 before any (etcd's own start).
    pub(super) compact_rev: i64,
    keys: BTreeMap<Bytes, Vec<Version>>,
    /// The changes of each revision, in op order.
    log: BTreeMap<i64, Vec<Change>>,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            rev: 1,
            compact_rev: -1,
            keys: BTreeMap::new(),
            log: BTreeMap::new(),
        }
    }
}

/// etcd's range convention: an empty end is exactly `key`, `[0]` is every
/// key from `key` on, anything else is `[key, end)`.
pub(super) fn in_range(k: &[u8], key: &[u8], end: &[u8]) -> bool {
    if end.is_empty() {
        k == key
    } else if end == [0] {
        k >= key
    } else {
        k >= key && k < end
    }
}

impl Store {
    /// Checks a read revision the way etcd's `rangeKeys` does: the future
    /// is refused before the compaction, and the compaction revision
    /// itself is still readable. Returns the revision to read at.
    pub(super) fn read_rev(&self, asked: i64, current: i64) -> Result<i64> {
        if asked > current {
            return Err(Error::FutureRevision);
        }
        let rev = if asked <= 0 { current } else { asked };
        if rev < self.compact_rev {
            return Err(Error::Compacted {
                compact_revision: None,
            });
        }
        Ok(rev)
    }

    /// The live key-values in `[key, end)` at `rev`, in key order.
    pub(super) fn range(&self, key: &[u8], end: &[u8], rev: i64) -> Vec<PbKeyValue> {
        let versions: Box<dyn Iterator<Item = (&Bytes, &Vec<Version>)>> = if end.is_empty() {
            Box::new(self.keys.get_key_value(key).into_iter())
        } else if end == [0] {
            Box::new(
                self.keys
                    .range::<[u8], _>((Bound::Included(key), Bound::Unbounded)),
            )
        } else if end <= key {
            // etcd answers an inverted range with nothing; BTreeMap would panic.
            Box::new(std::iter::empty())
        } else {
            Box::new(
                self.keys
                    .range::<[u8], _>((Bound::Included(key), Bound::Excluded(end))),
            )
        };
        versions
            .filter_map(|(_, vs)| at(vs, rev).cloned())
            .collect()
    }

    /// The key's live value now.
    pub(super) fn get(&self, key: &[u8]) -> Option<&PbKeyValue> {
        self.keys.get(key).and_then(|vs| at(vs, self.rev))
    }

    /// Writes `key` at revision `rev` (the txn's, one past the current).
    /// Returns the new key-value and the one it replaced.
    pub(super) fn put(
        &mut self,
        rev: i64,
        key: Bytes,
        value: Bytes,
        lease: i64,
    ) -> (PbKeyValue, Option<PbKeyValue>) {
        let prev = self.keys.get(&key).and_then(|vs| at(vs, rev)).cloned();
        let kv = PbKeyValue {
            key: key.clone(),
            create_revision: prev.as_ref().map_or(rev, |p| p.create_revision),
            mod_revision: rev,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            value,
            lease,
        };
        self.keys.entry(key).or_default().push(Version {
            rev,
            kv: Some(kv.clone()),
        });
        self.log_change(rev, PbEventType::Put, kv.clone(), prev.clone());
        (kv, prev)
    }

    /// Deletes every live key in `[key, end)` at revision `rev`; returns
    /// the deleted key-values in key order.
    pub(super) fn delete(&mut self, rev: i64, key: &[u8], end: &[u8]) -> Vec<PbKeyValue> {
        let gone = self.range(key, end, rev);
        for kv in &gone {
            self.keys
                .get_mut(&kv.key)
                .expect("a live key has versions")
                .push(Version { rev, kv: None });
            // A delete event carries only the key and the delete's revision.
            let tomb = PbKeyValue {
                key: kv.key.clone(),
                mod_revision: rev,
                ..Default::default()
            };
            self.log_change(rev, PbEventType::Delete, tomb, Some(kv.clone()));
        }
        gone
    }

    fn log_change(&mut self, rev: i64, ty: PbEventType, kv: PbKeyValue, prev: Option<PbKeyValue>) {
        self.log.entry(rev).or_default().push(Change {
            event: PbEvent {
                r#type: ty as i32,
                kv: Some(kv),
                prev_kv: None,
            },
            prev,
        });
    }

    /// Whether revision `rev` has changes (a txn that wrote nothing does
    /// not make a revision).
    pub(super) fn changed_at(&self, rev: i64) -> bool {
        self.log.contains_key(&rev)
    }

    /// The changes of the revisions in `[from, to]`, by revision.
    pub(super) fn changes(&self, from: i64, to: i64) -> impl Iterator<Item = (&i64, &Vec<Change>)> {
        // Not `range(from..=to)`: that panics when `to < from`.
        self.log.range(from..).take_while(move |(r, _)| **r <= to)
    }

    /// Compacts the history up to `rev`, as etcd's `Compact`: refused at or
    /// below the last compaction and past the current revision.
    pub(super) fn compact(&mut self, rev: i64) -> Result<()> {
        if rev <= self.compact_rev {
            return Err(Error::Compacted {
                compact_revision: None,
            });
        }
        if rev > self.rev {
            return Err(Error::FutureRevision);
        }
        self.compact_rev = rev;
        self.keys.retain(|_, vs| {
            // Keep the version live at `rev` (if it is not a tombstone)
            // and everything after it.
            let keep_from = vs.partition_point(|v| v.rev <= rev);
            let mut cut = keep_from.saturating_sub(1);
            if vs.get(cut).is_some_and(|v| v.rev <= rev && v.kv.is_none()) {
                cut += 1;
            }
            vs.drain(..cut);
            !vs.is_empty()
        });
        self.log = self.log.split_off(&(rev + 1));
        Ok(())
    }

    /// Every live key-value in `[key, end)` now.
    pub(super) fn dump(&self, key: &[u8], end: &[u8]) -> Vec<PbKeyValue> {
        self.range(key, end, self.rev)
    }
}

/// The version of a key live at `rev`, if any.
fn at(vs: &[Version], rev: i64) -> Option<&PbKeyValue> {
    let n = vs.partition_point(|v| v.rev <= rev);
    vs[..n].last().and_then(|v| v.kv.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn versions_generations_and_history() {
        let mut s = Store::default();
        s.put(2, b("a"), b("1"), 0);
        s.put(3, b("a"), b("2"), 0);
        s.delete(4, b"a", b"");
        s.put(5, b("a"), b("3"), 0);
        s.rev = 5;
        let now = &s.range(b"a", b"", 5)[0];
        assert_eq!(
            (now.create_revision, now.version, now.mod_revision),
            (5, 1, 5)
        );
        let old = &s.range(b"a", b"", 3)[0];
        assert_eq!((old.create_revision, old.version), (2, 2));
        assert!(s.range(b"a", b"", 4).is_empty());
        assert!(s.range(b"a", b"", 1).is_empty());
    }

    #[test]
    fn compaction_keeps_what_reads_at_or_after_it_need() {
        let mut s = Store::default();
        s.put(2, b("a"), b("1"), 0);
        s.put(3, b("b"), b("1"), 0);
        s.delete(4, b"b", b"");
        s.put(5, b("a"), b("2"), 0);
        s.rev = 5;
        s.compact(4).unwrap();
        assert_eq!(s.range(b"a", b"\0", 4).len(), 1);
        assert!(matches!(s.read_rev(3, 5), Err(Error::Compacted { .. })));
        assert_eq!(s.read_rev(4, 5).unwrap(), 4);
        assert!(matches!(s.read_rev(6, 5), Err(Error::FutureRevision)));
        assert!(matches!(s.compact(4), Err(Error::Compacted { .. })));
        assert!(matches!(s.compact(6), Err(Error::FutureRevision)));
        assert_eq!(s.changes(0, 5).map(|(r, _)| *r).collect::<Vec<_>>(), [5]);
        // The tombstone of b went with the compaction.
        assert!(!s.keys.contains_key(&b("b")));
    }

    #[test]
    fn ranges_follow_etcds_conventions() {
        let mut s = Store::default();
        for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
            s.put(2 + i as i64, b(k), b("v"), 0);
        }
        s.rev = 4;
        assert_eq!(s.range(b"b", b"\0", 4).len(), 2);
        assert_eq!(s.range(b"a", b"c", 4).len(), 2);
        assert!(s.range(b"c", b"a", 4).is_empty());
        assert!(in_range(b"zz", b"b", b"\0") && !in_range(b"a", b"b", b"\0"));
    }
}
