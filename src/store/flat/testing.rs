//! The flat store's insides, as tests see them: sizes, generations, pass counts, where a key
//! sits, and the switches that force the portable load or the sweep without transactions.

use std::hash::Hash;

use super::{FlatStore, GEN_BITS, GROUP, Group, INLINE, KIND, PASSES_STUCK, Table};
use crate::sync::Ordering;

/// A group whose pass count is off, for tests: `(shard, group, count, expected)`.
pub(crate) type WrongPassCount = (usize, usize, u8, usize);

impl<K: Hash + Eq + Clone> FlatStore<K> {
    /// Bytes of the shards' tables once all have grown to the cap's size.
    pub(crate) fn cap_bytes(&self) -> usize {
        let last = self.gens.last().expect("at least one generation");
        last.total * (std::mem::size_of::<Group>() + 1)
    }

    /// The address of the first slot of the last generation's tables, for tests.
    pub(crate) fn table_address(&self) -> usize {
        let last = self.gens.last().expect("at least one generation");
        last.all().as_ptr() as usize
    }

    /// The generation of each shard's table now, for tests.
    pub(crate) fn generations(&self) -> Vec<usize> {
        self.shards
            .iter()
            .map(|shard| self.table(shard).word & GEN_BITS)
            .collect()
    }

    /// Loads slots through portable-atomic from now on (see [`Limiter::without_inline_load`]).
    ///
    /// [`Limiter::without_inline_load`]: crate::Limiter::without_inline_load
    pub(crate) fn without_inline_load(&mut self) {
        self.vmovdqa = None;
    }

    /// Removes swept keys one `cmpxchg16b` at a time from now on, as on a CPU without RTM.
    pub(crate) fn without_rtm(&mut self) {
        self.rtm = None;
    }

    /// Whether sweeps remove keys in transactions (see [`sync::Rtm`]).
    pub(crate) fn uses_rtm(&self) -> bool {
        self.rtm.is_some()
    }

    /// See the field.
    pub(crate) fn met_moves(&self) -> usize {
        self.met_moves.load(Ordering::Relaxed)
    }

    /// See the field.
    pub(crate) fn near_hits(&self) -> usize {
        self.near_hits.load(Ordering::Relaxed)
    }

    /// See the field.
    pub(crate) fn lost_removals(&self) -> usize {
        self.lost_removals.load(Ordering::Relaxed)
    }

    /// For tests, with no other thread touching the table: each group whose pass count is not
    /// what the slots say it should be (the keys lying beyond it along their probe), as
    /// `(shard, group, count, expected)`. A stuck count may exceed what it should be.
    pub(crate) fn wrong_pass_counts(&self) -> Vec<WrongPassCount> {
        let mut wrong = Vec::new();
        for (i, shard) in self.shards.iter().enumerate() {
            let Table { groups, passes, .. } = self.table(shard);
            let mut expected = vec![0usize; groups.len()];
            for (at, group) in groups.iter().enumerate() {
                for slot in &group.0 {
                    let (t, _) = slot.load(Ordering::Acquire);
                    if t & INLINE != 0 {
                        let mut g = Self::home(groups, t);
                        while g != at {
                            expected[g] += 1;
                            g = (g + 1) % groups.len();
                        }
                    }
                }
            }
            for (g, (c, &e)) in passes.iter().zip(&expected).enumerate() {
                let c = c.load(Ordering::Relaxed);
                if usize::from(c) != e && !(c == PASSES_STUCK && e < usize::from(c)) {
                    wrong.push((i, g, c, e));
                }
            }
        }
        wrong
    }

    /// For tests: the largest pass count in the table.
    pub(crate) fn max_pass_count(&self) -> u8 {
        self.shards
            .iter()
            .flat_map(|shard| self.table(shard).passes)
            .map(|c| c.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
    }

    /// Where the key hashed to `hash` sits, for tests: (groups from its home group, whether it
    /// is in the first slot its probe reads); `None` when no slot holds it.
    pub(super) fn placement(&self, hash: u64) -> Option<(usize, bool)> {
        let groups = self.table(self.shard(hash)).groups;
        let home = Self::home(groups, hash);
        let first = Self::first_slot(hash);
        (0..groups.len()).find_map(|d| {
            let group = &groups[(home + d) % groups.len()].0;
            (0..GROUP).find_map(|j| {
                let t = group[j].load(Ordering::Acquire).0;
                (t & INLINE != 0 && t & !KIND == hash & !KIND).then_some((d, j == first))
            })
        })
    }
}
