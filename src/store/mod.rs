//! The map from keys to their state, behind a small trait so stores can be compared in one run.
//!
//! A store holds [`Entry`] values: the rules the entry's cells were built for, a penalty deadline
//! and the cells. It enforces the `max_keys` cap itself, so no caller can insert past it.

#[cfg_attr(tollgate_loom, allow(dead_code))]
pub(crate) mod dash;
pub(crate) mod flat;
#[cfg(tollgate_loom)]
pub(crate) mod loom_dash;

use std::sync::Arc;

use crate::cell::Cell;
use crate::quota::Rule;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};

#[cfg(not(tollgate_loom))]
pub(crate) use dash::DashStore;
pub(crate) use flat::FlatStore;
/// Under loom, dashmap's own locks are invisible to the model checker (and would block it): the
/// same protocol on loom's `RwLock` stands in.
#[cfg(tollgate_loom)]
pub(crate) use loom_dash::LoomDashStore as DashStore;

/// Which concurrent map holds a limiter's keys (see [`Builder::store`](crate::Builder::store)).
///
/// Every store gives the same decisions; they differ in speed, memory and locking. The benchmark
/// harness runs every kind in [`StoreKind::ALL`] side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StoreKind {
    /// `DashMap` (sharded `RwLock<HashMap>`) with ahash: a check takes its shard's read lock.
    Dash,
    /// The lock-free table: the state of a single-quota key inline in a 16-byte slot, checked
    /// with one compare-and-swap and no lock; keys that need more (penalties, other plans,
    /// cross-key compound limits) spill to a locked map. Sized for `max_keys` up front (about
    /// 20 bytes per key, 36-50 for a table of at most 16 Ki keys; mapped lazily). Used only when the default plan is one quota of a
    /// word-cell algorithm (not the sliding log) and a table for `max_keys` can be mapped;
    /// otherwise the limiter falls back to `Dash` (see `Limiter::store_kind`).
    #[default]
    Flat,
}

impl StoreKind {
    /// Every store, for benchmarks that compare them in one run.
    pub const ALL: [StoreKind; 2] = [StoreKind::Flat, StoreKind::Dash];

    /// A short name for tables and benchmark ids.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Dash => "dash",
            StoreKind::Flat => "flat",
        }
    }
}

/// A hasher for a new map: a random seed per map, so nobody can aim keys at one shard or one
/// probe chain. Under loom the seed is fixed: a model must run the same way every time.
pub(crate) fn random_state() -> ahash::RandomState {
    #[cfg(not(tollgate_loom))]
    {
        ahash::RandomState::new()
    }
    #[cfg(tollgate_loom)]
    {
        ahash::RandomState::with_seeds(1, 2, 3, 4)
    }
}

/// What to do with a new key when the table holds `max_keys` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnFull {
    /// Deny the new key with [`Reason::TableFull`](crate::Reason::TableFull); track nothing.
    #[default]
    Deny,
    /// Evict a key whose state is already back to fresh (so the eviction gives nobody extra
    /// permits); deny as [`OnFull::Deny`] when there is none. The flat store looks at 64 slots
    /// from the new key's home position in its shard and in each of the next three (a bounded
    /// cost per new key, even in a flood); the dash store at the new key's shard.
    EvictFresh,
}

/// The rules of one plan: the parts of a compound limit, checked in order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Rules {
    pub(crate) parts: Box<[Rule]>,
}

/// One key's state.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The rules `cells` were built for; when the key is checked under other rules (a plan
    /// change), the entry is migrated first.
    pub(crate) rules: Arc<Rules>,
    /// Which incarnation of the key this is (unique per limiter; kept across migration): a
    /// compound refund lands only on the entry it charged, never on one recreated after a reset
    /// or sweep.
    pub(crate) id: u64,
    /// A penalty: no request passes before this time (ns). 0 when none.
    pub(crate) blocked_until: AtomicU64,
    pub(crate) cells: Cells,
}

/// The cells of an entry: inline for the common single-quota case.
#[derive(Debug)]
pub(crate) enum Cells {
    One(Cell),
    Many(Box<[Cell]>),
}

impl Entry {
    /// A fresh entry for `rules`, incarnation `id`.
    pub(crate) fn fresh(rules: &Arc<Rules>, id: u64) -> Entry {
        let cells = match &*rules.parts {
            [one] => Cells::One(Cell::fresh(one.kind)),
            parts => Cells::Many(parts.iter().map(|r| Cell::fresh(r.kind)).collect()),
        };
        Entry {
            rules: Arc::clone(rules),
            id,
            blocked_until: AtomicU64::new(0),
            cells,
        }
    }

    /// The cells, one per part of the rules.
    #[inline]
    pub(crate) fn cells(&self) -> &[Cell] {
        match &self.cells {
            Cells::One(c) => std::slice::from_ref(c),
            Cells::Many(cs) => cs,
        }
    }

    /// The penalty deadline (ns), 0 when none.
    #[inline]
    pub(crate) fn blocked_until(&self) -> u64 {
        // Relaxed: a deadline is a single self-contained word; `block` raises it with fetch_max,
        // and a check that misses a penalty set concurrently is ordered before that call.
        self.blocked_until.load(Ordering::Relaxed)
    }

    /// True when removing this entry changes no future decision: no penalty, every cell fresh.
    pub(crate) fn is_fresh(&self, now: u64) -> bool {
        self.blocked_until() <= now
            && self
                .cells()
                .iter()
                .zip(self.rules.parts.iter())
                .all(|(c, r)| c.is_fresh(now, r))
    }

    /// This entry carried over to `rules` at `now` (see `Cell::migrate`).
    pub(crate) fn migrate(&self, now: u64, rules: &Arc<Rules>) -> Entry {
        let old = &self.rules.parts;
        let cells: Vec<Cell> = rules
            .parts
            .iter()
            .enumerate()
            .map(|(i, new)| match (self.cells().get(i), old.get(i)) {
                (Some(cell), Some(old)) => cell.migrate(now, old, new),
                _ => Cell::fresh(new.kind),
            })
            .collect();
        let cells = if cells.len() == 1 {
            Cells::One(cells.into_iter().next().expect("one cell"))
        } else {
            Cells::Many(cells.into_boxed_slice())
        };
        Entry {
            rules: Arc::clone(rules),
            id: self.id,
            blocked_until: AtomicU64::new(self.blocked_until()),
            cells,
        }
    }

    /// Heap bytes owned by this entry beyond its inline size.
    pub(crate) fn heap_bytes(&self) -> usize {
        let boxed = match &self.cells {
            Cells::One(_) => 0,
            Cells::Many(cs) => cs.len() * std::mem::size_of::<Cell>(),
        };
        boxed + self.cells().iter().map(Cell::heap_bytes).sum::<usize>()
    }
}

/// Takes one of `max_keys` slots counted by `len`; false when all are taken (every store's cap).
pub(crate) fn take_slot(len: &AtomicUsize, max_keys: usize) -> bool {
    // Relaxed: the counter only has to be exact, not ordered with anything; fetch_add is one RMW,
    // so two racing inserts get different values and at most `max_keys` succeed.
    if len.fetch_add(1, Ordering::Relaxed) < max_keys {
        true
    } else {
        len.fetch_sub(1, Ordering::Relaxed);
        false
    }
}

/// The table is at `max_keys` and the key is not in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full;

/// A concurrent map from keys to entries, capped at `max_keys`.
pub(crate) trait Store<K>: Send + Sync {
    /// Runs `f` on `key`'s entry if there is one.
    fn with<R>(&self, key: &K, f: impl FnOnce(&Entry) -> R) -> Option<R>;

    /// Runs `f` on `key`'s entry, inserting `make()` first when absent. At the cap, `OnFull`
    /// decides: deny, or evict an entry of the same shard for which `evictable` holds.
    fn with_or_insert<R>(
        &self,
        key: &K,
        make: impl FnOnce() -> Entry,
        evictable: impl FnMut(&Entry) -> bool,
        f: impl FnOnce(&Entry) -> R,
    ) -> Result<R, Full>;

    /// Replaces `key`'s entry by `f(old)` under exclusive access, if it is present and `f`
    /// returns a replacement.
    fn replace(&self, key: &K, f: impl FnOnce(&Entry) -> Option<Entry>);

    /// Removes `key`; true if it was present.
    fn remove(&self, key: &K) -> bool;

    /// Number of shards (the unit of [`Store::sweep_shard`]).
    fn shards(&self) -> usize;

    /// Removes the entries of shard `shard` that are fresh at `now` ([`Entry::is_fresh`]), under
    /// exclusive access to that shard. Returns `(visited, removed)`.
    fn sweep_shard(&self, shard: usize, now: u64) -> (usize, usize);

    /// Keys held.
    fn len(&self) -> usize;

    /// Keys held in shard `shard` (0 for a shard that does not exist): how evenly the hasher
    /// spreads keys, for the hash-flood test.
    fn shard_len(&self, shard: usize) -> usize;

    /// Sums `f` over every entry (for memory accounting; takes each shard's read lock in turn).
    fn sum_entries(&self, f: impl FnMut(&Entry) -> usize) -> usize;
}
