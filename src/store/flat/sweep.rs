//! Removal: a shard's inline states swept without a lock (in hardware transactions where the
//! CPU has them), and one inline state removed by key.

use std::hash::Hash;

use super::{FlatStore, Found, Group, INLINE, KIND, SPILLED, TOMB, Table, Uncounts};
use crate::store::{Fresh, rule_of};
use crate::sync::{self, Ordering};

/// Fresh keys a sweep removes in one hardware transaction, where the CPU has them: at most 32
/// cache lines written, well inside what a transaction holds, and enough that its cost (about
/// one locked instruction) is spread thin: a batch removes a slot in about 1 ns, where one
/// `lock cmpxchg16b` a removal costs several times that.
const RTM_BATCH: usize = 32;
/// Transactions in a row that may abort for a reason other than a changed slot before a sweep
/// removes the rest of its shard one swap at a time.
const RTM_ABORTS: usize = 4;

impl<K: Hash + Eq + Clone> FlatStore<K> {
    /// Sweeps `shard`'s inline states, with no lock: each removal is a swap that fails if a
    /// charge landed first. A state is fresh when its word is, under the rule its tag names.
    /// Returns (visited, removed, whether any slot is a spilled state's marker, the pass counts
    /// the removals owe: see [`Uncounts`]).
    ///
    /// Where the CPU has RTM, the removals go in batches of [`RTM_BATCH`], each one transaction
    /// (one swap at a time if it aborts), where a `lock cmpxchg16b` per removal was most of a
    /// sweep that removes every key.
    #[inline(always)]
    pub(super) fn sweep_inline(
        &self,
        table: Table<'_>,
        fresh: Fresh<'_>,
        load: impl sync::PairLoad,
    ) -> (usize, usize, bool, Uncounts) {
        self.sweep_slots(table, load, |t, word| fresh.word(rule_of(t), word))
    }

    /// [`sweep_inline`](Self::sweep_inline)'s loop, for the freshness test `fresh`.
    #[inline(always)]
    fn sweep_slots(
        &self,
        table: Table<'_>,
        load: impl sync::PairLoad,
        fresh: impl Fn(u64, u64) -> bool,
    ) -> (usize, usize, bool, Uncounts) {
        let (mut visited, mut removed, mut markers) = (0, 0, false);
        let mut uncounts = Uncounts::new();
        let mut rtm = self.rtm;
        let mut batch = Vec::with_capacity(if rtm.is_some() { RTM_BATCH } else { 0 });
        let mut aborts = 0;
        let groups = table.groups;
        for (g, group) in groups.iter().enumerate() {
            for slot in &group.0 {
                // Acquire: see `find`.
                let (t, word) = load.load(slot);
                // EMPTY, TOMB and MOVED (a table the shard grew out of under the sweep: its
                // states are swept in the new one next time) hold nothing to sweep.
                if t & INLINE == 0 {
                    continue;
                }
                if t & KIND == SPILLED {
                    markers = true;
                    continue;
                }
                visited += 1;
                if !fresh(t, word) {
                    continue;
                }
                // A swap from what we read: it fails if a charge landed since (see `evict_one`).
                if rtm.is_none() {
                    if sync::PairSwap::new(slot, (t, word)).swap_alone((TOMB, 0)) {
                        removed += 1;
                        uncounts.removed(groups.len(), Self::home(groups, t), g);
                    } else {
                        #[cfg(test)]
                        self.lost_removals.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                // Built in place: built first and moved in, the entry is stored in halves and
                // loaded whole, a store-forwarding stall.
                batch.push(sync::PairSwap::new(slot, (t, word)));
                if batch.len() == RTM_BATCH {
                    removed +=
                        self.remove_batch(&mut rtm, &batch, &mut aborts, groups, &mut uncounts);
                    batch.clear();
                }
            }
        }
        removed += self.remove_batch(&mut rtm, &batch, &mut aborts, groups, &mut uncounts);
        (visited, removed, markers, uncounts)
    }

    /// Applies `batch`'s removals in one transaction, or, where it aborts, one at a time; the
    /// number that took effect. After [`RTM_ABORTS`] aborts in a row for reasons other than a
    /// changed slot (a CPU whose transactions always abort, say), `rtm` is dropped for the rest
    /// of the sweep. The pass counts the removals owe go to `uncounts`.
    fn remove_batch(
        &self,
        rtm: &mut Option<sync::Rtm>,
        batch: &[sync::PairSwap<'_>],
        aborts: &mut usize,
        groups: &[Group],
        uncounts: &mut Uncounts,
    ) -> usize {
        let Some(r) = *rtm else {
            return self.remove_alone(batch, groups, uncounts);
        };
        match r.swap_all(batch, (TOMB, 0)) {
            Ok(()) => {
                *aborts = 0;
                for r in batch {
                    Self::owe(groups, uncounts, r);
                }
                batch.len()
            }
            Err(sync::Abort::Mismatch) => self.remove_alone(batch, groups, uncounts),
            Err(sync::Abort::Other) => {
                *aborts += 1;
                if *aborts >= RTM_ABORTS {
                    *rtm = None;
                }
                self.remove_alone(batch, groups, uncounts)
            }
        }
    }

    /// Applies each removal of `batch` as its own `cmpxchg16b`; the number that took effect.
    /// The pass counts the removals owe go to `uncounts`.
    fn remove_alone(
        &self,
        batch: &[sync::PairSwap<'_>],
        groups: &[Group],
        uncounts: &mut Uncounts,
    ) -> usize {
        let mut done = 0;
        for r in batch.iter().filter(|r| r.swap_alone((TOMB, 0))) {
            done += 1;
            Self::owe(groups, uncounts, r);
        }
        #[cfg(test)]
        self.lost_removals
            .fetch_add(batch.len() - done, Ordering::Relaxed);
        done
    }

    /// Removes the inline state hashed to `hash`: `Some(true)` when removed, `Some(false)` when
    /// absent, `None` when it is not inline (the caller looks again).
    pub(super) fn remove_inline(&self, hash: u64) -> Option<bool> {
        let shard = self.shard(hash);
        loop {
            let Found::Inline {
                slot, tag: t, word, ..
            } = self.find(hash)
            else {
                return match self.find(hash) {
                    Found::Absent => Some(false),
                    _ => None,
                };
            };
            // AcqRel: see `evict_one`; a charge landing first makes us look again.
            if slot
                .compare_exchange((t, word), (TOMB, 0), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                // Under the lock, in the table the shard has then: a slot of a table it grew
                // out of meanwhile owes nothing (the move counted the new table afresh).
                if Self::displaced(self.table(shard), t, slot).is_some() {
                    let _counts = sync::write(&shard.spill);
                    let table = self.table(shard);
                    if let Some(d) = Self::displaced(table, t, slot) {
                        Self::uncount_passes(table, d);
                    }
                }
                self.release(1);
                return Some(true);
            }
        }
    }
}
