//! [`LeaseId`], the one type every service names a lease by.

use std::fmt;

/// The id of a lease.
///
/// etcd's lease ids are non-zero 64-bit integers; in a put, a compare and a
/// key-value, id 0 means "no lease", which is [`LeaseId::NONE`]. It prints
/// in hex, as `etcdctl` and the keys of Go's `concurrency` package show it
/// (`{:x}`, and `Display`); `{:?}` shows both forms.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(i64);

impl LeaseId {
    /// No lease: a put without a lease, or a key that has none.
    pub const NONE: LeaseId = LeaseId(0);

    /// The lease with this id, as etcd gave it (0 is [`LeaseId::NONE`]).
    pub const fn new(id: i64) -> LeaseId {
        LeaseId(id)
    }

    /// The id as etcd's wire format and `etcdctl` (in decimal) take it.
    pub const fn get(self) -> i64 {
        self.0
    }

    /// Whether this is [`LeaseId::NONE`].
    pub const fn is_none(self) -> bool {
        self.0 == 0
    }
}

impl From<i64> for LeaseId {
    fn from(id: i64) -> LeaseId {
        LeaseId(id)
    }
}

impl From<LeaseId> for i64 {
    fn from(id: LeaseId) -> i64 {
        id.0
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(self, f)
    }
}

impl fmt::LowerHex for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseId({:x} = {})", self.0, self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::LeaseId;

    #[test]
    fn prints_in_hex_like_etcdctl_and_round_trips() {
        let id = LeaseId::new(0x694d_7d6e_4d3c_0a1b);
        assert_eq!(id.to_string(), "694d7d6e4d3c0a1b");
        assert_eq!(format!("{id:x}"), "694d7d6e4d3c0a1b");
        assert_eq!(
            format!("{id:?}"),
            "LeaseId(694d7d6e4d3c0a1b = 7587858859884808731)"
        );
        assert_eq!(i64::from(id), 0x694d_7d6e_4d3c_0a1b);
        assert_eq!(LeaseId::from(5).get(), 5);
        assert!(LeaseId::NONE.is_none() && LeaseId::default().is_none());
        assert!(!id.is_none());
    }
}
