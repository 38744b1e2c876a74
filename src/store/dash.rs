//! The first store: a `DashMap` (sharded `RwLock<HashMap>`) with ahash and a per-process random
//! seed, so nobody can aim hash collisions at one shard.
//!
//! Contention: a check of an existing key takes its shard's read lock (a shared counter write);
//! inserting, removing, migrating and sweeping take the shard's write lock.

use std::hash::Hash;

use dashmap::DashMap;

use super::{Entry, Full, OnFull, Store};
use crate::sync::{AtomicUsize, Ordering};

/// `DashMap<K, Entry>` with a cap.
pub(crate) struct DashStore<K> {
    map: DashMap<K, Entry, ahash::RandomState>,
    /// Keys held or being inserted; never above `max_keys`.
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

    /// Removes one entry of `key`'s shard for which `evictable` holds.
    fn evict_one(&self, key: &K, mut evictable: impl FnMut(&Entry) -> bool) -> bool {
        let shard = self.map.determine_map(key);
        let mut table = self.map.shards()[shard].write();
        // SAFETY: we hold the shard's write lock, so the table is not used concurrently; the
        // bucket comes from this table's own iterator and is erased at most once, after which the
        // loop ends (hashbrown's own `retain` erases during iteration the same way).
        unsafe {
            for bucket in table.iter() {
                if evictable(bucket.as_ref().1.get()) {
                    table.erase(bucket);
                    // Relaxed: see `reserve_slot`.
                    self.len.fetch_sub(1, Ordering::Relaxed);
                    return true;
                }
            }
        }
        false
    }
}

impl<K: Hash + Eq + Clone + Send + Sync> Store<K> for DashStore<K> {
    #[inline]
    fn with<R>(&self, key: &K, f: impl FnOnce(&Entry) -> R) -> Option<R> {
        self.map.get(key).map(|e| f(&e))
    }

    #[inline]
    fn with_or_insert<R>(
        &self,
        key: &K,
        make: impl FnOnce() -> Entry,
        mut evictable: impl FnMut(&Entry) -> bool,
        f: impl FnOnce(&Entry) -> R,
    ) -> Result<R, Full> {
        if let Some(e) = self.map.get(key) {
            return Ok(f(&e));
        }
        let mut reserved = self.reserve_slot();
        if !reserved && self.on_full == OnFull::EvictFresh && self.evict_one(key, &mut evictable) {
            reserved = self.reserve_slot();
        }
        match self.map.entry(key.clone()) {
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

    fn replace(&self, key: &K, f: impl FnOnce(&Entry) -> Option<Entry>) {
        if let Some(mut e) = self.map.get_mut(key) {
            if let Some(next) = f(&e) {
                *e = next;
            }
        }
    }

    fn remove(&self, key: &K) -> bool {
        let removed = self.map.remove(key).is_some();
        if removed {
            // Relaxed: see `reserve_slot`.
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    fn shards(&self) -> usize {
        self.map.shards().len()
    }

    fn sweep_shard(&self, shard: usize, now: u64) -> (usize, usize) {
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
                if bucket.as_ref().1.get().is_fresh(now) {
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

    fn sum_entries(&self, mut f: impl FnMut(&Entry) -> usize) -> usize {
        self.map.iter().map(|e| f(e.value())).sum()
    }
}
