//! The dash store's protocol on loom's `RwLock`, built only under `--cfg tollgate_loom`.
//!
//! `DashMap` guards each shard with its own spin/park lock on plain `std` atomics: loom cannot
//! see it, and a model thread blocking on it would stall the model checker. This store takes the
//! same steps as [`DashStore`](super::dash::DashStore) in the same order (a shard read lock for a
//! lookup; a slot of the cap taken before the shard write lock for an insert, and given back when
//! another thread inserted first; eviction and sweeping under the write lock), so the loom models
//! check the limiter's logic on top of that protocol: first-insert races, the cap, sweeping
//! against checks, compound refunds. dashmap itself is trusted, not model-checked.

use std::collections::HashMap;
use std::hash::Hash;

use super::{Fresh, Full, OnFull, RuleId, Store};
use crate::cell::Cell;
use crate::sync::{AtomicUsize, Ordering, RwLock};

type Table<K> = HashMap<(K, RuleId), Cell>;

/// Sharded `RwLock<HashMap>` with a cap, like `DashMap` plus the dash store's counter.
pub(crate) struct LoomDashStore<K> {
    shards: Box<[RwLock<Table<K>>]>,
    /// A fixed seed: loom replays every execution and needs the same shard choices each time.
    hasher: ahash::RandomState,
    /// States held or being inserted; never above `max_keys`.
    len: AtomicUsize,
    max_keys: usize,
    on_full: OnFull,
}

impl<K: Hash + Eq + Clone> LoomDashStore<K> {
    /// An empty store with `shards` shards (rounded up to a power of two, at least 2).
    pub(crate) fn new(shards: usize, max_keys: usize, on_full: OnFull) -> Self {
        let shards = shards.max(2).next_power_of_two();
        LoomDashStore {
            shards: (0..shards).map(|_| RwLock::new(HashMap::new())).collect(),
            hasher: ahash::RandomState::with_seeds(1, 2, 3, 4),
            len: AtomicUsize::new(0),
            max_keys,
            on_full,
        }
    }

    fn shard_of(&self, key: &(K, RuleId)) -> &RwLock<Table<K>> {
        let i = (self.hasher.hash_one(key) as usize) & (self.shards.len() - 1);
        &self.shards[i]
    }

    /// Takes one slot of the cap; false when the table is full.
    fn reserve_slot(&self) -> bool {
        super::take_slot(&self.len, self.max_keys)
    }

    fn evict_one(&self, key: &(K, RuleId), fresh: Fresh<'_>) -> bool {
        let mut table = self.shard_of(key).write().unwrap();
        let victim = table
            .iter()
            .find(|((_, rule), cell)| fresh.cell(*rule, cell))
            .map(|(k, _)| k.clone());
        match victim {
            Some(k) => {
                table.remove(&k);
                // Relaxed: see `reserve_slot`.
                self.len.fetch_sub(1, Ordering::Relaxed);
                fresh.evicted(k.1);
                true
            }
            None => false,
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync> Store<K> for LoomDashStore<K> {
    fn with<R>(&self, key: &K, rule: RuleId, f: impl FnOnce(&Cell) -> R) -> Option<R> {
        let key = (key.clone(), rule);
        self.shard_of(&key).read().unwrap().get(&key).map(f)
    }

    fn with_or_insert<R>(
        &self,
        key: &K,
        rule: RuleId,
        make: impl FnOnce() -> Cell,
        fresh: Fresh<'_>,
        f: impl FnOnce(&Cell) -> R,
    ) -> Result<R, Full> {
        let key = (key.clone(), rule);
        {
            let table = self.shard_of(&key).read().unwrap();
            if let Some(e) = table.get(&key) {
                return Ok(f(e));
            }
        }
        let mut reserved = self.reserve_slot();
        if !reserved && self.on_full == OnFull::EvictFresh && self.evict_one(&key, fresh) {
            reserved = self.reserve_slot();
        }
        let mut table = self.shard_of(&key).write().unwrap();
        if let Some(e) = table.get(&key) {
            if reserved {
                // Relaxed: see `reserve_slot`.
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
            return Ok(f(e));
        }
        if !reserved {
            return Err(Full);
        }
        let e = table.entry(key).or_insert_with(make);
        Ok(f(e))
    }

    fn remove(&self, key: &K, rule: RuleId) -> bool {
        let key = (key.clone(), rule);
        let removed = self.shard_of(&key).write().unwrap().remove(&key).is_some();
        if removed {
            // Relaxed: see `reserve_slot`.
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    fn shards(&self) -> usize {
        self.shards.len()
    }

    fn sweep_shard(&self, shard: usize, fresh: Fresh<'_>) -> (usize, usize) {
        let Some(lock) = self.shards.get(shard) else {
            return (0, 0);
        };
        let mut table = lock.write().unwrap();
        let visited = table.len();
        table.retain(|(_, rule), cell| !fresh.cell(*rule, cell));
        let removed = visited - table.len();
        // Relaxed: see `reserve_slot`.
        self.len.fetch_sub(removed, Ordering::Relaxed);
        (visited, removed)
    }

    fn len(&self) -> usize {
        // Relaxed: a snapshot of a counter.
        self.len.load(Ordering::Relaxed)
    }

    fn shard_len(&self, shard: usize) -> usize {
        self.shards
            .get(shard)
            .map_or(0, |s| s.read().unwrap().len())
    }

    fn sum_cells(&self, mut f: impl FnMut(&Cell) -> usize) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap().values().map(&mut f).sum::<usize>())
            .sum()
    }

    fn count_by_rule(&self, by_rule: &mut [u64; super::MAX_RULES]) {
        for s in &self.shards {
            for (_, rule) in s.read().unwrap().keys() {
                by_rule[usize::from(*rule)] += 1;
            }
        }
    }
}
