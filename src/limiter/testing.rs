//! The flat store's insides, reached through a limiter for tests (and the loom models' growth).

use std::hash::Hash;

use super::{Limiter, Map};
use crate::clock::Clock;

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// Where `key`'s default-plan state sits in the flat store, for tests (see
    /// `FlatStore::placement`).
    #[cfg(test)]
    pub(crate) fn placement(&self, key: &K) -> Option<(usize, bool)> {
        let id = self.book.current().plans[0].parts[0].id;
        match &self.store {
            Map::Flat(s) => s.placement_of(s.hash(key), id),
            Map::Dash(_) => None,
        }
    }
    /// Makes the flat store's sweeps remove keys one `cmpxchg16b` at a time, as on a CPU
    /// without RTM, for tests of that path.
    #[cfg(test)]
    pub(crate) fn without_rtm(mut self) -> Self {
        if let Map::Flat(s) = &mut self.store {
            s.without_rtm();
        }
        self
    }
    /// For tests of the flat store's sweep: (whether it removes in transactions, removals of
    /// fresh-looking keys that a charge beat so far); `None` on the dash store.
    #[cfg(test)]
    pub(crate) fn sweep_races(&self) -> Option<(bool, usize)> {
        match &self.store {
            Map::Flat(s) => Some((s.uses_rtm(), s.lost_removals())),
            Map::Dash(_) => None,
        }
    }
    /// For tests of the flat store's pass counts (see `FlatStore::wrong_pass_counts`): the
    /// groups whose count is wrong, and the largest count; `None` on the dash store.
    #[cfg(test)]
    pub(crate) fn pass_counts(&self) -> Option<(Vec<crate::store::flat::WrongPassCount>, u8)> {
        match &self.store {
            Map::Flat(s) => Some((s.wrong_pass_counts(), s.max_pass_count())),
            Map::Dash(_) => None,
        }
    }
    /// The address of the flat store's first slot, for tests; `None` on the dash store.
    #[cfg(test)]
    pub(crate) fn table_address(&self) -> Option<usize> {
        match &self.store {
            Map::Flat(s) => Some(s.table_address()),
            Map::Dash(_) => None,
        }
    }
    /// Bytes of the flat store's tables once every shard has grown to the cap's size, for
    /// tests; 0 on the dash store.
    #[cfg(test)]
    pub(crate) fn cap_bytes(&self) -> usize {
        match &self.store {
            Map::Flat(s) => s.cap_bytes(),
            Map::Dash(_) => 0,
        }
    }
    /// Lookups of the flat store that met a shard's move, for tests.
    #[cfg(test)]
    pub(crate) fn met_moves(&self) -> usize {
        match &self.store {
            Map::Flat(s) => s.met_moves(),
            Map::Dash(_) => 0,
        }
    }
    /// Lookups of the flat store found beside another state of their key, for tests.
    #[cfg(test)]
    pub(crate) fn near_hits(&self) -> usize {
        match &self.store {
            Map::Flat(s) => s.near_hits(),
            Map::Dash(_) => 0,
        }
    }
    /// The generation of each of the flat store's shard tables now, for tests.
    #[cfg(test)]
    pub(crate) fn generations(&self) -> Vec<usize> {
        match &self.store {
            Map::Flat(s) => s.generations(),
            Map::Dash(_) => Vec::new(),
        }
    }
    /// Grows every shard of the flat store into its next table now (those not yet at the
    /// cap's size), as new states would: for tests and loom models of a move.
    #[cfg(any(test, tollgate_loom))]
    #[doc(hidden)]
    pub fn grow_all(&self) {
        if let Map::Flat(s) = &self.store {
            s.grow_all();
        }
    }
    /// Makes the flat store's probe and sweep load slots through portable-atomic, as on a CPU
    /// without the inline `vmovdqa`, for tests of that path.
    #[cfg(test)]
    pub(crate) fn without_inline_load(mut self) -> Self {
        if let Map::Flat(s) = &mut self.store {
            s.without_inline_load();
        }
        self
    }
}
