//! Penalties ([`Limiter::block`](crate::Limiter::block)): a side table beside the store, so a key
//! with no penalty pays for the feature one load of a small filter that no check writes.

use std::collections::HashMap;
use std::hash::Hash;

use crate::sync::{self, AtomicU64, AtomicUsize, Ordering, RwLock};

/// Words of the filter: 4,096 bits, 512 bytes (one word under loom, whose models are small).
const FILTER_WORDS: usize = if cfg!(tollgate_loom) { 1 } else { 64 };

/// Keys under a penalty, and a filter that says which keys may be.
pub(crate) struct Penalties<K> {
    /// key -> (the key's hash, the deadline in ns). Its write lock serialises every change of
    /// the filter too.
    map: RwLock<HashMap<K, (u64, u64), ahash::RandomState>>,
    /// One bit per hash bucket: set while some key of that bucket may be under a penalty.
    /// A clear bit means no key of the bucket is.
    filter: [AtomicU64; FILTER_WORDS],
    /// Entries of `map`, for [`Penalties::len`] without the lock.
    len: AtomicUsize,
    /// The earliest deadline in `map` (or earlier: a removal leaves it), `u64::MAX` when
    /// empty: a `block` at the cap looks for penalties that are over only when one can be.
    /// Written under the map's write lock.
    earliest: AtomicU64,
    /// The most keys under a penalty at once.
    max: usize,
    /// Hashes keys for the filter where the store does not (the dash store).
    hasher: ahash::RandomState,
}

/// The filter word and bit of a key hash (bits the store's shard and home do not favour).
#[inline(always)]
fn bit(hash: u64) -> (usize, u64) {
    let b = (hash >> 40) as usize % (FILTER_WORDS * 64);
    (b / 64, 1 << (b % 64))
}

impl<K: Hash + Eq + Clone> Penalties<K> {
    pub(crate) fn new(max: usize) -> Self {
        Penalties {
            map: RwLock::new(HashMap::with_hasher(crate::store::random_state())),
            filter: std::array::from_fn(|_| AtomicU64::new(0)),
            len: AtomicUsize::new(0),
            earliest: AtomicU64::new(u64::MAX),
            max,
            hasher: crate::store::random_state(),
        }
    }

    /// A key's hash for the filter, where the store gives none.
    pub(crate) fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    /// True when the key hashed to `hash` may be under a penalty: one load.
    #[inline(always)]
    pub(crate) fn maybe(&self, hash: u64) -> bool {
        let (w, b) = bit(hash);
        // Relaxed: the bit is set under the map's write lock before `block` returns; a check
        // that misses a bit being set is ordered before that `block`, and one that sees it then
        // takes the read lock, which orders it after the entry's insertion.
        self.filter[w].load(Ordering::Relaxed) & b != 0
    }

    /// The penalty deadline of `key` (hashed to `hash`), 0 when none.
    #[inline]
    pub(crate) fn until(&self, hash: u64, key: &K) -> u64 {
        if !self.maybe(hash) {
            return 0;
        }
        // Contention: the read lock, only for keys whose filter bit is set.
        sync::read(&self.map)
            .get(key)
            .map_or(0, |&(_, until)| until)
    }

    /// Blocks `key` until `until` (a longer penalty already set stays). False when `max` keys are
    /// under a penalty at `now` already and `key` is not one of them (penalties over by `now`
    /// make room first, as a sweep would drop them).
    pub(crate) fn block(&self, hash: u64, key: &K, now: u64, until: u64) -> bool {
        let mut map = sync::write(&self.map);
        // Relaxed (`earliest`, `len`): written under the write lock we hold.
        if map.len() >= self.max
            && self.earliest.load(Ordering::Relaxed) <= now
            && !map.contains_key(key)
        {
            // Their filter bits stay until the next sweep: a check that reads one finds no
            // entry, or one that is over, and is not blocked.
            map.retain(|_, &mut (_, until)| until > now);
            self.settle(&map);
        }
        let full = map.len() >= self.max;
        match map.get_mut(key) {
            Some(e) => e.1 = e.1.max(until),
            None if full => return false,
            None => {
                map.insert(key.clone(), (hash, until));
                self.len.store(map.len(), Ordering::Relaxed);
                let earliest = self.earliest.load(Ordering::Relaxed).min(until);
                self.earliest.store(earliest, Ordering::Relaxed);
            }
        }
        let (w, b) = bit(hash);
        // Relaxed: see `maybe`; every writer of the filter holds the write lock.
        self.filter[w].fetch_or(b, Ordering::Relaxed);
        true
    }

    /// Lifts `key`'s penalty; true if it had one.
    pub(crate) fn remove(&self, key: &K) -> bool {
        if self.len() == 0 {
            return false;
        }
        let mut map = sync::write(&self.map);
        let had = map.remove(key).is_some();
        // Relaxed: see `len`.
        self.len.store(map.len(), Ordering::Relaxed);
        had
    }

    /// Drops the penalties over by `now` and clears the filter bits no key needs any more.
    pub(crate) fn sweep(&self, now: u64) -> usize {
        if self.len() == 0 {
            return 0;
        }
        let mut map = sync::write(&self.map);
        let before = map.len();
        map.retain(|_, &mut (_, until)| until > now);
        let mut bits = [0u64; FILTER_WORDS];
        for &(hash, _) in map.values() {
            let (w, b) = bit(hash);
            bits[w] |= b;
        }
        for (f, b) in self.filter.iter().zip(bits) {
            // Relaxed: see `maybe`. A bit cleared here belongs to no key under a penalty.
            f.store(b, Ordering::Relaxed);
        }
        self.settle(&map);
        before - map.len()
    }

    /// After entries left `map` (under its write lock): its length and earliest deadline.
    fn settle(&self, map: &HashMap<K, (u64, u64), ahash::RandomState>) {
        let earliest = map.values().map(|&(_, until)| until).min();
        // Relaxed: see `len` and `earliest`.
        self.len.store(map.len(), Ordering::Relaxed);
        self.earliest
            .store(earliest.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Keys under a penalty (or whose penalty is over but not yet swept).
    pub(crate) fn len(&self) -> usize {
        // Relaxed: a snapshot of a counter written under the lock.
        self.len.load(Ordering::Relaxed)
    }

    /// Heap bytes the table holds (about).
    pub(crate) fn heap_bytes(&self) -> usize {
        sync::read(&self.map).capacity() * (std::mem::size_of::<(K, (u64, u64))>() + 1)
    }
}
