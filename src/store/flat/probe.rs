//! Where a key's state is: its shard, its table, its home group and first slot, and the
//! lock-free probe that finds it ([`FlatStore::find`]).

use std::hash::Hash;

use super::{
    EMPTY, FlatStore, Found, GEN_BITS, GROUP, Group, INLINE, MOVED, SPILLED, Shard, Table, tag,
};
use crate::sync::{self, AtomicPair, Ordering};

impl<K: Hash + Eq + Clone> FlatStore<K> {
    #[inline]
    pub(crate) fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    pub(super) fn shard(&self, hash: u64) -> &Shard<K> {
        &self.shards[(hash >> self.shard_shift) as usize]
    }

    /// `shard`'s table now. Acquire: as in [`find`](Self::find).
    #[inline]
    pub(super) fn table(&self, shard: &Shard<K>) -> Table<'_> {
        self.table_of(shard, shard.table.load(Ordering::Acquire))
    }

    /// The table of `shard` that `word` names (its table now or an earlier one).
    #[inline]
    pub(super) fn table_of(&self, shard: &Shard<K>, word: usize) -> Table<'_> {
        let generation = &self.gens[word & GEN_BITS];
        Table {
            groups: generation.groups(shard.index),
            passes: generation.passes(shard.index),
            word,
        }
    }

    /// The group a hash starts probing at: the low 32 bits scaled to the group count.
    #[inline]
    pub(super) fn home(groups: &[Group], hash: u64) -> usize {
        Self::home_of(groups.len(), hash)
    }

    /// The slot of its group a probe starts at (in every group it visits), from hash bits that
    /// neither the shard nor the home group use. Keys of one group then start at different
    /// slots, so most keys sit in the first slot their probe reads: the branch that finds them
    /// is predictable, where with every probe starting at slot 0 the position of a key in its
    /// group was random and the branch mispredicted on most lookups of a busy table.
    #[inline]
    pub(super) fn first_slot(hash: u64) -> usize {
        // The rule's id too: the rules of one key share a home group (see `rule_hash`) and
        // start at different slots of it.
        (((hash >> 32) + (hash >> crate::store::RULE_SHIFT)) as usize) % GROUP
    }

    /// [`home`](Self::home) for a shard of `groups` groups. The two bits a tag replaces by its
    /// kind take no part, so a slot's tag tells its key's home (see [`displaced`](Self::displaced)),
    /// nor do the rule's id bits, so every rule of a key has the same home (see [`rule_hash`]).
    ///
    /// [`rule_hash`]: crate::store::rule_hash
    #[inline(always)]
    fn home_of(groups: usize, hash: u64) -> usize {
        (((hash & 0xFFFF_F800) * groups as u64) >> 32) as usize
    }

    /// Starts loading the cache line `key`'s probe starts at (for batches).
    #[inline]
    pub(super) fn prefetch(&self, hash: u64) {
        let shard = self.shard(hash);
        // Relaxed: a hint; whatever table it names lives as long as `self`.
        let (group, _) = self.home_group(shard.table.load(Ordering::Relaxed), hash);
        prefetch_line(group as *const Group as *const u8);
    }

    /// The home group of `hash` in the table named by `word` (see [`Shard::table`]), and the
    /// table's length in groups. Reads no memory but `word`.
    #[inline(always)]
    fn home_group(&self, word: usize, hash: u64) -> (&Group, usize) {
        let len = self.first_groups << (word & GEN_BITS);
        let first = (word & !GEN_BITS) as *const Group;
        // SAFETY: `word` names a table of `len` groups in one of `self.gens`' maps (every table
        // word does: see `FlatStore::new` and `grow`), which live as long as `self`, and the
        // home is below `len`.
        (unsafe { &*first.add(Self::home_of(len, hash)) }, len)
    }

    /// Finds the slot of the key hashed to `hash`. No lock, no write.
    ///
    /// Most keys sit in the first slot their probe reads (see [`first_slot`](Self::first_slot)),
    /// so that one is read first, inline. Where the CPU has the inline load, a key elsewhere in
    /// its home group is then found without a branch on its position: all four slots of the
    /// line are loaded (each one atomically, which is all a slot needs) and the one holding the
    /// key's tag is picked from a mask (a fingerprint is in at most one slot of a shard, so any
    /// match is the key). Branching slot by slot mispredicts on about a third of the lookups of
    /// a full table, whose keys are in random positions.
    /// The rest of the probe runs out of line ([`find_on`](Self::find_on)).
    ///
    /// The shard's table is read first (its word: see [`Shard::table`]). A lookup that meets a
    /// slot the shard has moved out of waits for the move to end and looks again; one that
    /// finds the key absent in a table that is no longer the shard's looks again too (the old
    /// table's pages may have been handed back, reading as `EMPTY`).
    #[inline(always)]
    pub(super) fn find(&self, hash: u64) -> Found<'_> {
        let shard = self.shard(hash);
        // Acquire: pairs with the Release that published a grown table, so the slots and
        // counts moved into it are seen.
        let table = shard.table.load(Ordering::Acquire);
        let line = self.home_group(table, hash).0;
        let group = &line.0;
        let slot = &group[Self::first_slot(hash)];
        // Acquire (`cell::ACQUIRE`, which the deliberately broken build weakens, for
        // portable-atomic's load and so under loom; the inline `vmovdqa` is an x86 load, always
        // acquire, so that build leaves it as it is): pairs with the
        // Release of the claim that wrote this tag, so the state word the claim published
        // (fresh, 0) or any later swap's word is what we see; and with the AcqRel swaps of the
        // key's charges, so a check that decides on this word (a denial writes nothing more) is
        // ordered after the admissions it counts. The same for every load below.
        let (t, word) = self.load(slot);
        let inline = tag(hash, INLINE);
        if t == inline {
            return Found::Inline {
                slot,
                line,
                tag: t,
                word,
            };
        }
        // A slot is EMPTY until its first claim (removals leave TOMB), and a claim takes the
        // first free slot of its key's probe: no key lies past an EMPTY slot. A new key's check
        // stops here; an existing key's first slot is never EMPTY, so this never mispredicts
        // for it.
        if t == EMPTY {
            return self.absent(shard, table, hash);
        }
        if let Some(v) = self.vmovdqa {
            if let Some((slot, word)) = Self::scan_line(v, line, inline) {
                return Found::Inline {
                    slot,
                    line,
                    tag: inline,
                    word,
                };
            }
        }
        self.find_on(hash, table, t)
    }

    /// The slot of `line` that holds the tag `inline`, and its word: all four slots loaded at
    /// once (each one atomically, which is all a slot needs) and the one holding the tag picked
    /// from a mask, without a branch on its position (a fingerprint is in at most one slot of a
    /// shard, so any match is the key's).
    #[inline(always)]
    pub(super) fn scan_line(
        v: sync::Vmovdqa,
        line: &Group,
        inline: u64,
    ) -> Option<(&AtomicPair, u64)> {
        // Acquire (an x86 load): see `find`.
        let pairs: [(u64, u64); GROUP] =
            std::array::from_fn(|j| sync::PairLoad::load(v, &line.0[j]));
        let hits = (0..GROUP).fold(0u32, |m, j| m | u32::from(pairs[j].0 == inline) << j);
        if hits == 0 {
            return None;
        }
        let j = hits.trailing_zeros() as usize % GROUP;
        Some((&line.0[j], pairs[j].1))
    }

    /// What a probe of the table named by `table` that found no key means: `Absent` while it
    /// is still the shard's table; else the shard grew meanwhile, and the key is looked up again.
    #[inline(always)]
    fn absent(&self, shard: &Shard<K>, table: usize, hash: u64) -> Found<'_> {
        // Acquire: as in `find`. A lookup that read an old table's handed-back (zeroed) page
        // reads the word that replaced it: the move published it before handing the page back.
        if shard.table.load(Ordering::Acquire) == table {
            return Found::Absent;
        }
        self.find_again(hash)
    }

    /// [`find`](Self::find) again, out of line, after the shard grew under a lookup.
    #[cold]
    #[inline(never)]
    fn find_again(&self, hash: u64) -> Found<'_> {
        #[cfg(test)]
        self.met_moves.fetch_add(1, Ordering::Relaxed);
        self.find(hash)
    }

    /// A lookup met a slot its shard has moved out of: it waits for the move (its shard's write
    /// lock) to end, then looks again.
    #[cold]
    #[inline(never)]
    fn after_move(&self, shard: &Shard<K>, hash: u64) -> Found<'_> {
        drop(sync::read(&shard.spill));
        #[cfg(test)]
        self.met_moves.fetch_add(1, Ordering::Relaxed);
        self.find(hash)
    }

    /// A probe's load of `slot`, with at least acquire ordering: the inline `vmovdqa` where the
    /// CPU has it (a predicted branch instead of portable-atomic's call through a function
    /// pointer), else portable-atomic's load at [`cell::ACQUIRE`](crate::cell::ACQUIRE).
    #[inline(always)]
    pub(super) fn load(&self, slot: &AtomicPair) -> (u64, u64) {
        match self.vmovdqa {
            Some(v) => sync::PairLoad::load(v, slot),
            None => slot.load(crate::cell::ACQUIRE),
        }
    }

    /// The rest of [`find`](Self::find)'s probe in the table named by `table`, whose first
    /// slot held `first_tag` (not the key's inline tag, nor EMPTY: `find` answers those itself).
    #[inline(never)]
    fn find_on(&self, hash: u64, table: usize, first_tag: u64) -> Found<'_> {
        let (inline, spilled) = (tag(hash, INLINE), tag(hash, SPILLED));
        if first_tag == spilled {
            return Found::Spilled;
        }
        let shard = self.shard(hash);
        if first_tag == MOVED {
            return self.after_move(shard, hash);
        }
        let Table { groups, passes, .. } = self.table_of(shard, table);
        let n = groups.len();
        let mut g = Self::home(groups, hash);
        // Relaxed: a stale (smaller) reach can only make a lookup miss a key placed far away
        // just now; a miss goes to `insert_inline` or the spill path, which look again under
        // the write lock, where reach is exact. Reach is the farthest over all of the shard's
        // tables, so it may exceed this one's length.
        let reach = shard.reach.load(Ordering::Relaxed).min(n);
        let first = Self::first_slot(hash);
        // The first slot of the home group was read by `find`.
        let mut skip = 1;
        for _ in 0..reach {
            let line = &groups[g];
            for j in skip..GROUP {
                let slot = &line.0[(first + j) % GROUP];
                // Acquire (`cell::ACQUIRE`): see `find`.
                let (t, word) = self.load(slot);
                if t == inline {
                    return Found::Inline {
                        slot,
                        line,
                        tag: t,
                        word,
                    };
                }
                if t == spilled {
                    return Found::Spilled;
                }
                if t == EMPTY {
                    return self.absent(shard, table, hash);
                }
                if t == MOVED {
                    return self.after_move(shard, hash);
                }
            }
            // No key lies beyond a group that no key has passed. Acquire: pairs with the
            // Release of `uncount_passes`; a count raised by a claim we do not see yet is a key that
            // arrived after this lookup (like a stale reach, above).
            if passes[g].load(Ordering::Acquire) == 0 {
                return self.absent(shard, table, hash);
            }
            skip = 0;
            g = if g + 1 == n { 0 } else { g + 1 };
        }
        self.absent(shard, table, hash)
    }
}

/// Asks the CPU to start loading the line at `p` (a hint; no effect on correctness).
#[inline]
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint that never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
