//! Sorted and revision-bounded ranges.
//!
//! Election and lock queues are ordered by create revision: "the first
//! key to be created under a prefix" and "the last key created before mine"
//! are ranges sorted by create revision with a limit of one, which etcd
//! answers without returning the rest of the prefix. Mod-revision bounds
//! answer "which keys changed since (or not since) a revision" with one
//! range instead of a watch.

use super::types::Range;
use crate::pb::{PbSortOrder, PbSortTarget};

/// The field a [`Range`] is sorted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortTarget {
    /// The key bytes.
    Key,
    /// The key's version.
    Version,
    /// The key's create revision.
    CreateRevision,
    /// The key's mod revision.
    ModRevision,
    /// The value bytes.
    Value,
}

/// The direction of a sort.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortOrder {
    /// Smallest first.
    Ascend,
    /// Largest first.
    Descend,
}

impl Range {
    /// Sorts the result by `target` in `order` (applied before the limit,
    /// so `.sort(..).limit(1)` is the first or last key by that field).
    ///
    /// ```
    /// use aether_etcd::{Range, SortOrder, SortTarget};
    /// // The oldest key under /queue/: the head of a queue.
    /// let head = Range::prefix("/queue/")
    ///     .sort(SortTarget::CreateRevision, SortOrder::Ascend)
    ///     .limit(1);
    /// # let _ = head;
    /// ```
    pub fn sort(mut self, target: SortTarget, order: SortOrder) -> Self {
        self.0.sort_target = match target {
            SortTarget::Key => PbSortTarget::Key,
            SortTarget::Version => PbSortTarget::Version,
            SortTarget::CreateRevision => PbSortTarget::Create,
            SortTarget::ModRevision => PbSortTarget::Mod,
            SortTarget::Value => PbSortTarget::Value,
        } as i32;
        self.0.sort_order = match order {
            SortOrder::Ascend => PbSortOrder::Ascend,
            SortOrder::Descend => PbSortOrder::Descend,
        } as i32;
        self
    }

    /// Only keys created at or before `rev` (0: no bound).
    pub fn max_create_revision(mut self, rev: i64) -> Self {
        self.0.max_create_revision = rev;
        self
    }

    /// Only keys created at or after `rev` (0: no bound).
    pub fn min_create_revision(mut self, rev: i64) -> Self {
        self.0.min_create_revision = rev;
        self
    }

    /// Only keys last modified at or before `rev` (0: no bound).
    ///
    /// etcd applies every revision bound (mod and create) to the whole
    /// range before the limit: it reads all of `[key, range_end)` to answer,
    /// so a bounded range costs what an unlimited one does. The response's
    /// `count` is still the number of keys in the range, bounds ignored, and
    /// with [`Range::count_only`] the bounds do nothing at all.
    #[must_use]
    pub fn max_mod_revision(mut self, rev: i64) -> Self {
        self.0.max_mod_revision = rev;
        self
    }

    /// Only keys last modified at or after `rev` (0: no bound): what
    /// changed since a revision, without a watch. Filters as
    /// [`Range::max_mod_revision`] does.
    #[must_use]
    pub fn min_mod_revision(mut self, rev: i64) -> Self {
        self.0.min_mod_revision = rev;
        self
    }
}
