//! The comparison store: a `DashMap` (sharded `RwLock<HashMap>`) from (key, rule) to a cell, with
//! ahash and a per-process random seed, so nobody can aim hash collisions at one shard.
//!
//! Contention: a check of an existing state takes its shard's read lock (a shared counter
//! write); inserting, removing and sweeping take the shard's write lock. A lookup builds the
//! `(key, rule)` pair, so it clones the key (free for integers and addresses, an allocation for
//! strings): this store is the baseline the flat store is measured against.

use std::hash::Hash;

use dashmap::DashMap;

use super::{Fresh, Full, OnFull, RuleId, Store};

/// Shards an eviction looks in: the new state's and the next ones.
const EVICT_SHARDS: usize = 4;
use crate::cell::Cell;
use crate::sync::{AtomicUsize, Ordering};

/// `DashMap<(K, RuleId), Cell>` with a cap.
pub(crate) struct DashStore<K> {
    map: DashMap<(K, RuleId), Cell, ahash::RandomState>,
    /// States held or being inserted; never above `max_keys`.
    len: AtomicUsize,
    max_keys: usize,
    on_full: OnFull,
}

impl<K: Hash + Eq + Clone> DashStore<K> {
    /// An empty store with `shards` shards (rounded up to a power of two, at least 2).
    pub(crate) fn new(shards: usize, max_keys: usize, on_full: OnFull) -> Self {
        let shards = shards.max(2).next_power_of_two();
        DashStore {
            map: DashMap::with_hasher_and_shard_amount(super::random_state(), shards),
            len: AtomicUsize::new(0),
            max_keys,
            on_full,
        }
    }

    /// Takes one slot of the cap; false when the table is full.
    fn reserve_slot(&self) -> bool {
        super::take_slot(&self.len, self.max_keys)
    }

    /// Removes one state for which `fresh` holds, from `key`'s shard or the next
    /// [`EVICT_SHARDS`]` - 1` (as the flat store looks).
    fn evict_one(&self, key: &(K, RuleId), fresh: Fresh<'_>) -> bool {
        let first = self.map.determine_map(key);
        let n = self.map.shards().len();
        (0..EVICT_SHARDS.min(n)).any(|i| self.evict_in((first + i) % n, fresh))
    }

    /// Removes one state of shard `shard` for which `fresh` holds.
    fn evict_in(&self, shard: usize, fresh: Fresh<'_>) -> bool {
        let mut table = self.map.shards()[shard].write();
        // SAFETY: we hold the shard's write lock, so the table is not used concurrently; the
        // bucket comes from this table's own iterator and is erased at most once, after which the
        // loop ends (hashbrown's own `retain` erases during iteration the same way).
        unsafe {
            for bucket in table.iter() {
                let ((_, rule), cell) = bucket.as_ref();
                let rule = *rule;
                if fresh.cell(rule, cell.get()) {
                    table.erase(bucket);
                    // Relaxed: see `reserve_slot`.
                    self.len.fetch_sub(1, Ordering::Relaxed);
                    fresh.evicted(rule);
                    return true;
                }
            }
        }
        false
    }
}

impl<K: Hash + Eq + Clone + Send + Sync> Store<K> for DashStore<K> {
    #[inline]
    fn with<R>(&self, key: &K, rule: RuleId, f: impl FnOnce(&Cell) -> R) -> Option<R> {
        self.map.get(&(key.clone(), rule)).map(|e| f(&e))
    }

    #[inline]
    fn with_or_insert<R>(
        &self,
        key: &K,
        rule: RuleId,
        make: impl FnOnce() -> Cell,
        fresh: Fresh<'_>,
        f: impl FnOnce(&Cell) -> R,
    ) -> Result<R, Full> {
        let key = (key.clone(), rule);
        if let Some(e) = self.map.get(&key) {
            return Ok(f(&e));
        }
        let mut reserved = self.reserve_slot();
        if !reserved && self.on_full == OnFull::EvictFresh && self.evict_one(&key, fresh) {
            reserved = self.reserve_slot();
        }
        match self.map.entry(key) {
            dashmap::Entry::Occupied(e) => {
                if reserved {
                    // Relaxed: see `reserve_slot`.
                    self.len.fetch_sub(1, Ordering::Relaxed);
                }
                Ok(f(e.get()))
            }
            dashmap::Entry::Vacant(v) => {
                if !reserved {
                    return Err(Full);
                }
                Ok(f(&v.insert(make())))
            }
        }
    }

    fn remove(&self, key: &K, rule: RuleId) -> bool {
        let removed = self.map.remove(&(key.clone(), rule)).is_some();
        if removed {
            // Relaxed: see `reserve_slot`.
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    fn shards(&self) -> usize {
        self.map.shards().len()
    }

    fn sweep_shard(&self, shard: usize, fresh: Fresh<'_>) -> (usize, usize) {
        let Some(lock) = self.map.shards().get(shard) else {
            return (0, 0);
        };
        let mut table = lock.write();
        let visited = table.len();
        let mut removed = 0;
        // SAFETY: exclusive access through the write lock; each bucket comes from this table's
        // iterator and is erased once, which hashbrown allows during iteration (its `retain`
        // does the same).
        unsafe {
            for bucket in table.iter() {
                let ((_, rule), cell) = bucket.as_ref();
                if fresh.cell(*rule, cell.get()) {
                    table.erase(bucket);
                    removed += 1;
                }
            }
        }
        // Relaxed: see `reserve_slot`.
        self.len.fetch_sub(removed, Ordering::Relaxed);
        (visited, removed)
    }

    fn len(&self) -> usize {
        // Relaxed: a snapshot of a counter.
        self.len.load(Ordering::Relaxed)
    }

    fn shard_len(&self, shard: usize) -> usize {
        // Contention: takes the shard's read lock.
        self.map.shards().get(shard).map_or(0, |s| s.read().len())
    }

    fn sum_cells(&self, mut f: impl FnMut(&Cell) -> usize) -> usize {
        self.map.iter().map(|e| f(e.value())).sum()
    }

    fn count_by_rule(&self, by_rule: &mut [u64; super::MAX_RULES]) {
        for e in self.map.iter() {
            by_rule[usize::from(e.key().1)] += 1;
        }
    }
}
