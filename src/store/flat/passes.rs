//! Each group's pass count (see [`Groups`](super::Groups)): what a claim adds, what a removal
//! owes, and how a sweep pays its removals' debts in one pass under the lock.

use std::hash::Hash;

use super::{FlatStore, Group, PASSES_STUCK, Table};
use crate::sync::{self, AtomicPair, Ordering};

/// What a sweep's removals owe their shard's pass counts, as differences: group `g`'s count
/// drops by `wraps` plus the sum of the first `g + 1` entries of `diffs` (each removed key that
/// lay beyond its home adds 1 at its home and takes 1 off at its own group, and adds 1 to
/// `wraps` when its probe wrapped around the shard's end). Kept in the lock-free loop without a
/// branch on where the key lay and paid under the lock at its end in one pass: a decrement per
/// group passed, as each removal went, is a walk per displaced key, of a length the branch
/// predictor cannot guess, in the loop that should cost a swap per key. The wraps are apart
/// from `diffs[0]` so that removals do not all update one word in turn (a chain of
/// store-to-load forwards). `diffs` is empty until the first removal.
pub(super) struct Uncounts {
    diffs: Vec<i32>,
    wraps: i32,
}

impl Uncounts {
    pub(super) fn new() -> Self {
        Uncounts {
            diffs: Vec::new(),
            wraps: 0,
        }
    }

    /// Owes one pass of each group from `home` up to (not including) `at`, in a shard of
    /// `groups` groups. Nothing when they are equal.
    #[inline(always)]
    pub(super) fn removed(&mut self, groups: usize, home: usize, at: usize) {
        if self.diffs.is_empty() {
            self.diffs = vec![0; groups];
        }
        self.diffs[home] += 1;
        self.diffs[at] -= 1;
        if home > at {
            self.wraps += 1;
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.diffs.is_empty()
    }
}

impl<K: Hash + Eq + Clone> FlatStore<K> {
    /// Counts a key placed `distance` groups from `hash`'s home in `table` as passing each
    /// group before its own. Under the shard's write lock (every write of a count holds it, so a
    /// load and a store, not an atomic update), before the key's tag is published.
    pub(super) fn count_passes(table: Table<'_>, hash: u64, distance: usize) {
        let passes = table.passes;
        let mut g = Self::home(table.groups, hash);
        for _ in 0..distance {
            let c = &passes[g];
            // Relaxed: published with the key's tag (the claim's Release store), and only read
            // to decide whether to probe on, where a count that a lookup does not see raised
            // yet is that of a key arriving after it (see `find_on`).
            let n = c.load(Ordering::Relaxed);
            if n != PASSES_STUCK {
                c.store(n + 1, Ordering::Relaxed);
            }
            g = if g + 1 == passes.len() { 0 } else { g + 1 };
        }
    }

    /// Where the key whose tag `t` sits in `slot` of `table` lies outside its home group:
    /// `(home, group)`, group indices in the table, for
    /// [`uncount_passes`](Self::uncount_passes) once the slot has turned `TOMB`. `None` too when
    /// `slot` is not in `table` (it was in a table the shard has since grown out of, whose
    /// counts no longer matter).
    #[inline]
    pub(super) fn displaced(table: Table<'_>, t: u64, slot: &AtomicPair) -> Option<(usize, usize)> {
        let groups = table.groups;
        let offset = (slot as *const AtomicPair as usize).wrapping_sub(groups.as_ptr() as usize);
        let at = offset / std::mem::size_of::<Group>();
        let home = Self::home(groups, t);
        (at < groups.len() && home != at).then_some((home, at))
    }

    /// Notes in `uncounts` the pass counts owed for the key that `removal` took out of its slot,
    /// in a shard whose groups are `groups`. Inline, with the groups the sweep loop already
    /// holds, and with no branch on where the key lay: out of line, finding the shard again from
    /// the tag, it came close to doubling what a sweep that removes every key costs a key.
    #[inline(always)]
    pub(super) fn owe(groups: &[Group], uncounts: &mut Uncounts, removal: &sync::PairSwap<'_>) {
        let at = (removal.pair() as *const AtomicPair as usize - groups.as_ptr() as usize)
            / std::mem::size_of::<Group>();
        uncounts.removed(groups.len(), Self::home(groups, removal.tag()), at);
    }

    /// Pays what a sweep's removals owe `table`'s pass counts. Under the shard's write lock.
    pub(super) fn apply_uncounts(table: Table<'_>, uncounts: &Uncounts) {
        let mut run = uncounts.wraps;
        for (c, d) in table.passes.iter().zip(&uncounts.diffs) {
            run += d;
            // Relaxed load: counts change only under the lock we hold. Release store: see
            // `uncount_passes`. Stored whether or not it changed, so the loop has no branch.
            let n = c.load(Ordering::Relaxed);
            let paid = u8::try_from(run).map_or(0, |run| n.saturating_sub(run));
            debug_assert!(n == PASSES_STUCK || u8::try_from(run).is_ok_and(|run| run <= n));
            c.store(if n == PASSES_STUCK { n } else { paid }, Ordering::Release);
        }
    }

    /// Uncounts a removed key that lay in group `at` of `table`, probing from `home` (see
    /// [`displaced`](Self::displaced)). Under the shard's write lock.
    pub(super) fn uncount_passes(table: Table<'_>, (home, at): (usize, usize)) {
        let passes = table.passes;
        let mut g = home;
        while g != at {
            let c = &passes[g];
            // Relaxed load: counts change only under the lock we hold. Release store: a lookup
            // that reads the lowered count (Acquire) and so stops short of the removed slot
            // then also sees it removed, should it go on to insert the key again.
            let n = c.load(Ordering::Relaxed);
            debug_assert!(n > 0, "a pass count below the keys that passed");
            if n != PASSES_STUCK {
                c.store(n.saturating_sub(1), Ordering::Release);
            }
            g = if g + 1 == passes.len() { 0 } else { g + 1 };
        }
    }
}
