//! The map from keys to their state, behind a small trait so stores can be compared in one run.
//!
//! A store holds one state per (key, rule): a [`Cell`] (the flat store keeps word cells inline in
//! its slots). It knows rules only by id; what a state means is the limiter's business. It
//! enforces the `max_keys` cap itself, counted in states, so no caller can insert past it.

#[cfg_attr(tollgate_loom, allow(dead_code))]
pub(crate) mod dash;
pub(crate) mod flat;
#[cfg(tollgate_loom)]
pub(crate) mod loom_dash;

use crate::algo::Rule;
use crate::cell::Cell;
use crate::sync::{AtomicUsize, Ordering};

#[cfg(not(tollgate_loom))]
pub(crate) use dash::DashStore;
pub(crate) use flat::FlatStore;
pub(crate) use flat::{Kept, Near, Pending};
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
    /// The lock-free table: the state of every (key, rule) of a word-cell algorithm inline in a
    /// 16-byte slot, checked with one compare-and-swap and no lock (sliding logs keep their
    /// entries in a locked side map). Sized for `max_keys` states up front (about 20 bytes per
    /// state, 36-50 for a table of at most 16 Ki; mapped lazily). Used whenever a table for
    /// `max_keys` can be mapped; otherwise the limiter falls back to `Dash` (see
    /// `Limiter::store_kind`).
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
    /// Deny the new key with [`Reason::TableFull`](crate::Reason::TableFull); track nothing,
    /// and never remove a state to make room (stale states go only by sweeping).
    Deny,
    /// The default: reclaim a state already back to fresh (so the reclaim gives nobody extra
    /// permits), first in the neighbourhood the insert visits, else by sweeping shards in turn
    /// until one frees a state; deny as [`OnFull::Deny`] only when nothing in the table is
    /// stale. The flat store looks at 64 slots from the new state's home position in its shard
    /// and in each of the next three, and at the spilled logs of its own shard (a bounded cost
    /// per new state, against one read of a counter under [`OnFull::Deny`]: the eviction flood
    /// test prints it); the dash store at the new state's shard and the next three. A walk of
    /// the shards that frees nothing notes when the next state can go stale: until then (at
    /// most 100 ms) a new state is denied after one load, so a table full of live state is not
    /// walked once per new key.
    #[default]
    EvictFresh,
}

/// A rule's index in its limiter's rule table (see the limiter's book): equal quotas are one
/// rule, whichever plans list them. At most [`MAX_RULES`] per limiter.
pub(crate) type RuleId = u8;

/// The most distinct rules a limiter may ever have (one tag byte in the flat store).
pub(crate) const MAX_RULES: usize = 256;

/// Bits 2..10 of a (key, rule) hash: the rule's id, so a slot's tag says which rule its word
/// runs under, and two rules of one key never share a fingerprint.
pub(crate) const RULE_SHIFT: u32 = 2;
/// See [`RULE_SHIFT`].
pub(crate) const RULE_MASK: u64 = 0xFF << RULE_SHIFT;

/// The hash of (key, rule) from the key's hash `h` (keyed by the store's secret seed): the
/// key's hash with the rule's id in bits 2..10 (see [`RULE_SHIFT`]). Two keys of one rule then
/// collide only where their hashes do, two rules of one key never, and every rule of a key has
/// the key's shard and home group: a compound plan's parts sit in one cache line (a separate
/// mix per rule would put them a cache miss apart).
#[inline(always)]
pub(super) fn rule_hash(h: u64, rule: RuleId) -> u64 {
    (h & !RULE_MASK) | (u64::from(rule) << RULE_SHIFT)
}

/// The rule id a (key, rule) hash or a slot tag carries (see [`rule_hash`]).
#[inline(always)]
pub(super) fn rule_of(hash: u64) -> RuleId {
    ((hash & RULE_MASK) >> RULE_SHIFT) as RuleId
}

/// Tells sweeps and evictions whether a state is indistinguishable from a fresh one at `now`: the
/// limiter hands it the rule table (append-only, so every id a state carries is in it), and
/// the store, which knows rules only by id, asks it about each state.
#[derive(Clone, Copy)]
pub(crate) struct Fresh<'a> {
    pub(crate) now: u64,
    pub(crate) rules: &'a [Rule],
    /// Where evictions are counted (none for sweeps, which count their own removals).
    pub(crate) evictions: Option<&'a crate::stats::Counters>,
    /// Where a walk of the table at the cap keeps the earliest moment (in `now`'s terms) at
    /// which a state it judged not fresh can be (see [`crate::cell::word_fresh_from`]); none
    /// for other sweeps and evictions.
    pub(crate) next: Option<&'a std::cell::Cell<u64>>,
}

impl Fresh<'_> {
    /// Counts one state of rule `rule` an eviction removed.
    pub(crate) fn evicted(&self, rule: RuleId) {
        if let Some(c) = self.evictions {
            c.evicted(rule);
        }
    }

    /// Whether a word cell of rule `rule` holding `word` is fresh.
    #[inline(always)]
    pub(crate) fn word(&self, rule: RuleId, word: u64) -> bool {
        self.rules.get(usize::from(rule)).is_some_and(|r| {
            let fresh = crate::cell::word_is_fresh(word, self.now, r);
            if let (false, Some(next)) = (fresh, self.next) {
                next.set(
                    next.get()
                        .min(crate::cell::word_fresh_from(word, self.now, r)),
                );
            }
            fresh
        })
    }

    /// Whether `cell`, of rule `rule`, is fresh.
    pub(crate) fn cell(&self, rule: RuleId, cell: &Cell) -> bool {
        self.rules.get(usize::from(rule)).is_some_and(|r| {
            let fresh = cell.is_fresh(self.now, r);
            if let (false, Some(next)) = (fresh, self.next) {
                next.set(next.get().min(cell.fresh_from(self.now, r)));
            }
            fresh
        })
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

/// A concurrent map from (key, rule) to a state cell, capped at `max_keys` states.
pub(crate) trait Store<K>: Send + Sync {
    /// Runs `f` on the state of (`key`, `rule`) if there is one.
    fn with<R>(&self, key: &K, rule: RuleId, f: impl FnOnce(&Cell) -> R) -> Option<R>;

    /// Runs `f` on the state of (`key`, `rule`), inserting `make()` first when absent. At the
    /// cap, `OnFull` decides: deny, or evict a state for which `fresh` holds.
    fn with_or_insert<R>(
        &self,
        key: &K,
        rule: RuleId,
        make: impl FnOnce() -> Cell,
        fresh: Fresh<'_>,
        f: impl FnOnce(&Cell) -> R,
    ) -> Result<R, Full>;

    /// Removes the state of (`key`, `rule`); true if it was present.
    fn remove(&self, key: &K, rule: RuleId) -> bool;

    /// Number of shards (the unit of [`Store::sweep_shard`]).
    fn shards(&self) -> usize;

    /// Removes the states of shard `shard` for which `fresh` holds, each atomically with the
    /// test (no charge can land between them). Returns `(visited, removed)`.
    fn sweep_shard(&self, shard: usize, fresh: Fresh<'_>) -> (usize, usize);

    /// States held.
    fn len(&self) -> usize;

    /// States held in shard `shard` (0 for a shard that does not exist): how evenly the hasher
    /// spreads keys, for the hash-flood test.
    fn shard_len(&self, shard: usize) -> usize;

    /// Sums `f` over every state kept as a cell outside the flat store's slots (for memory
    /// accounting; takes each shard's read lock in turn).
    fn sum_cells(&self, f: impl FnMut(&Cell) -> usize) -> usize;

    /// Adds to `by_rule[r]` the states of rule `r` held now (a scan of the whole store, for
    /// statistics: takes each shard's read lock in turn).
    fn count_by_rule(&self, by_rule: &mut [u64; MAX_RULES]);
}
