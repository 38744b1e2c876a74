//! A shard grows: its states move into its next generation's table, under its write lock.

use std::hash::Hash;

use super::{EMPTY, FlatStore, GEN_BITS, GROUP, GROW_PERCENT, INLINE, MOVED, Shard, Table};
#[cfg(any(test, tollgate_loom))]
use crate::sync;
use crate::sync::Ordering;

impl<K: Hash + Eq + Clone> FlatStore<K> {
    /// Under `shard`'s write lock, before a claim of a new state: grows the shard into its next
    /// table when the claim would take its table past the generation's load, or the table has
    /// no free slot on the key's probe (`full`). True when it grew.
    pub(super) fn grow_for_claim(&self, shard: &Shard<K>, full: bool) -> bool {
        // Relaxed: `table` and `used` change only under the lock we hold.
        let word = shard.table.load(Ordering::Relaxed);
        let generation = word & GEN_BITS;
        if generation + 1 == self.gens.len() {
            return false;
        }
        let slots = (self.first_groups << generation) * GROUP;
        let used = shard.used.load(Ordering::Relaxed);
        if !full && (used + 1) * 100 <= slots * GROW_PERCENT {
            return false;
        }
        self.grow(shard);
        true
    }

    /// Moves `shard` into its next generation's table, under its write lock. One shard at a
    /// time; lookups of other shards go on, and lookups of this one go on in the old table
    /// until they meet a slot already moved, then wait for the move to end (see `find_on`).
    ///
    /// Each slot of the old table, live or not, is swapped to `MOVED` from what it holds, so a
    /// charge either lands before the move (and moves with the state) or fails and looks again:
    /// no charge is lost or counted twice. The new table is written while no lookup can see it
    /// and published with one Release store; then the old one is handed back to the system.
    pub(super) fn grow(&self, shard: &Shard<K>) {
        let old = self.table(shard);
        let generation = old.word & GEN_BITS;
        let next = &self.gens[generation + 1];
        next.entered();
        let word = next.groups(shard.index).as_ptr() as usize | (generation + 1);
        let new = self.table_of(shard, word);
        let (mut used, mut farthest) = (0, 0);
        for slot in old.groups.iter().flat_map(|g| &g.0) {
            // Acquire (`cell::ACQUIRE`): see `find`.
            let mut seen = self.load(slot);
            // AcqRel: ordered with every charge of the slot, like a removal (see `evict_one`).
            #[cfg(not(tollgate_broken = "blind_move"))]
            while let Err(now) =
                slot.compare_exchange(seen, (MOVED, 0), Ordering::AcqRel, crate::cell::ACQUIRE)
            {
                seen = now;
            }
            // The deliberately broken build (scripts/must-fail.sh): a plain store a little
            // while after the load, so a charge landing in between is lost with the move.
            #[cfg(tollgate_broken = "blind_move")]
            {
                #[cfg(not(tollgate_loom))]
                std::thread::yield_now();
                slot.store(MOVED, 0, Ordering::Release);
            }
            if seen.0 & INLINE != 0 {
                farthest = farthest.max(Self::place(new, seen));
                used += 1;
            }
        }
        // Relaxed: under the lock (see `claim`); reach only grows.
        if farthest + 1 > shard.reach.load(Ordering::Relaxed) {
            shard.reach.store(farthest + 1, Ordering::Relaxed);
        }
        shard.used.store(used, Ordering::Relaxed);
        // Release: publishes the moved slots and counts (pairs with `find`'s Acquire).
        shard.table.store(word, Ordering::Release);
        self.gens[generation].release(shard.index);
    }

    /// Writes the state `(t, word)` into the first free slot of its probe in `table`, a table
    /// no lookup sees yet (Relaxed stores: published by the table word's Release); the
    /// distance from its home group.
    fn place(table: Table<'_>, (t, word): (u64, u64)) -> usize {
        let groups = table.groups;
        let mut g = Self::home(groups, t);
        let first = Self::first_slot(t);
        for distance in 0..groups.len() {
            for j in 0..GROUP {
                let slot = &groups[g].0[(first + j) % GROUP];
                if slot.load(Ordering::Relaxed).0 == EMPTY {
                    Self::count_passes(table, t, distance);
                    slot.store(t, word, Ordering::Relaxed);
                    return distance;
                }
            }
            g = if g + 1 == groups.len() { 0 } else { g + 1 };
        }
        unreachable!("a grown table has twice the slots of the one it replaces");
    }

    /// Grows every shard into its next table now (those not at the last already), for tests and
    /// models of a move.
    #[cfg(any(test, tollgate_loom))]
    pub(crate) fn grow_all(&self) {
        for shard in self.shards.iter() {
            let _claims = sync::write(&shard.spill);
            // Relaxed: under the lock.
            if (shard.table.load(Ordering::Relaxed) & GEN_BITS) + 1 < self.gens.len() {
                self.grow(shard);
            }
        }
    }
}
