//! A new state's slot: the probe under the shard's write lock, the claim that honours the cap
//! and the `OnFull` policy, and the evictions that make room at the cap.

use std::hash::Hash;

use super::{EMPTY, FlatStore, GROUP, INLINE, KIND, SPILLED, Shard, Spill, TOMB, Table, tag};
use crate::store::{Fresh, Full, OnFull, rule_hash, rule_of};
use crate::sync::{self, AtomicPair, Ordering};

/// Groups (of four slots) an eviction looks at in each shard, from the new key's home group.
const EVICT_GROUPS: usize = 16;
/// Shards an eviction looks in: the new key's and the next ones (so a new key whose own shard
/// holds no fresh key can still take a fresh key's place elsewhere).
const EVICT_SHARDS: usize = 4;

/// A free slot found under the write lock, and how many groups from home it is.
pub(super) struct Free<'a> {
    slot: &'a AtomicPair,
    distance: usize,
    /// The slot was never used (not a tombstone): claiming it raises the table's `used`.
    empty: bool,
}

/// A shard whose write lock the caller holds, and its spill map (what the lock guards): what
/// a claim needs to take a slot, evict, or grow the shard.
pub(super) struct Locked<'l, K> {
    shard: &'l Shard<K>,
    spill: &'l mut Spill<K>,
}

impl<'l, K> Locked<'l, K> {
    /// `shard`, with `spill` the map its held write lock guards.
    #[inline]
    pub(super) fn new(shard: &'l Shard<K>, spill: &'l mut Spill<K>) -> Self {
        Locked { shard, spill }
    }
}

impl<K: Hash + Eq + Clone> FlatStore<K> {
    /// Under `shard`'s write lock: the slot holding the key (inline or spilled), or the first
    /// free slot its probe passes (none when the shard's table is full).
    pub(super) fn probe_locked<'a>(
        &'a self,
        shard: &Shard<K>,
        hash: u64,
    ) -> Result<(&'a AtomicPair, (u64, u64)), Option<Free<'a>>> {
        let Table { groups, passes, .. } = self.table(shard);
        let (inline, spilled) = (tag(hash, INLINE), tag(hash, SPILLED));
        let n = groups.len();
        // Relaxed: reach only changes under the write lock, which we hold.
        let reach = shard.reach.load(Ordering::Relaxed);
        let mut free = None;
        let mut g = Self::home(groups, hash);
        let first = Self::first_slot(hash);
        for distance in 0..n {
            let group = &groups[g].0;
            for j in 0..GROUP {
                let slot = &group[(first + j) % GROUP];
                // Acquire (`cell::ACQUIRE`): see `find`.
                let seen = self.load(slot);
                if seen.0 == inline || seen.0 == spilled {
                    return Ok((slot, seen));
                }
                if (seen.0 == EMPTY || seen.0 == TOMB) && free.is_none() {
                    free = Some(Free {
                        slot,
                        distance,
                        empty: seen.0 == EMPTY,
                    });
                }
                if seen.0 == EMPTY {
                    return Err(free);
                }
            }
            // No key lies beyond reach, nor beyond a group that no key has passed (Acquire: see
            // `find_on`; claims raise counts under this lock); past either we only look for a
            // free slot.
            if free.is_some() && (distance + 1 >= reach || passes[g].load(Ordering::Acquire) == 0) {
                return Err(free);
            }
            g = if g + 1 == n { 0 } else { g + 1 };
        }
        Err(free)
    }

    /// Takes one slot of the cap; false when the table is full.
    fn reserve(&self) -> bool {
        crate::store::take_slot(&self.len, self.max_keys)
    }

    pub(super) fn release(&self, n: usize) {
        // Relaxed: see `reserve`.
        self.len.fetch_sub(n, Ordering::Relaxed);
    }

    /// Claims a slot for a new key (under its shard's write lock: see [`Locked`]), honouring
    /// the cap and the `OnFull` policy: `free` is the slot [`probe_locked`](Self::probe_locked)
    /// found, if any. Writes `(tag, word)`, the tag of the key hashed to `hash` with the kind
    /// `kind` ([`INLINE`] or [`SPILLED`]).
    pub(super) fn claim<'a>(
        &'a self,
        locked: Locked<'_, K>,
        hash: u64,
        kind: u64,
        word: u64,
        mut free: Option<Free<'a>>,
        fresh: Fresh<'_>,
    ) -> Result<(), Full> {
        let Locked { shard, spill } = locked;
        if !self.reserve() {
            let evicted = self.on_full == OnFull::EvictFresh
                && (self.evict_one(hash, fresh) || self.evict_spilled(shard, fresh, spill));
            if !evicted {
                return Err(Full);
            }
            if !self.reserve() {
                return Err(Full);
            }
            // The eviction may have opened a slot nearer home than the one found before it.
            if let Err(Some(nearer)) = self.probe_locked(shard, hash) {
                free = Some(nearer);
            }
        }
        // Past its generation's load, or with no free slot on the key's probe, the shard grows
        // into its next table first (where the key, absent before, has a free slot).
        if self.grow_for_claim(shard, free.is_none()) {
            free = self.probe_locked(shard, hash).err().flatten();
        }
        let Some(free) = free else {
            self.release(1);
            return Err(Full);
        };
        // Relaxed: reach is read Relaxed by lock-free lookups (see `find`) and exactly under
        // this lock, the only place it changes (so a load and a store, not an RMW); raising it
        // before publishing the tag lets most lookups find the key.
        if free.distance + 1 > shard.reach.load(Ordering::Relaxed) {
            shard.reach.store(free.distance + 1, Ordering::Relaxed);
        }
        Self::count_passes(self.table(shard), hash, free.distance);
        if free.empty {
            // Relaxed: changes only under this lock.
            shard
                .used
                .store(shard.used.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
        // Release: publishes the state with the tag (pairs with `find`'s Acquire). A plain
        // store, not a swap (one locked instruction fewer per new key): every other write to
        // a slot is a swap from a live tag (a charge, a removal, a spill), so a free slot is
        // written only by claims, which hold this lock. On x86_64 with AVX the store is one
        // 16-byte `vmovdqa`, atomic like the swaps and loads it meets.
        free.slot.store(tag(hash, kind), word, Ordering::Release);
        Ok(())
    }

    /// Evicts one inline state that is `fresh`, among the [`EVICT_GROUPS`] groups from
    /// the new key's home position in its shard and in the next [`EVICT_SHARDS`]` - 1` shards;
    /// true if one went. Bounded, so a flood of new keys at a full table of live keys costs
    /// each a few dozen cache lines, not a scan of a shard.
    fn evict_one(&self, hash: u64, fresh: Fresh<'_>) -> bool {
        // The new key's shard first, then the next few: a removal is a lock-free swap, so a
        // victim may come from a shard whose lock we do not hold.
        let first = (hash >> self.shard_shift) as usize;
        let own = &self.shards[first];
        let shards = (0..EVICT_SHARDS.min(self.shards.len()))
            .map(|i| &self.shards[(first + i) % self.shards.len()]);
        let near = shards.flat_map(|shard| {
            let table = self.table(shard);
            let groups = table.groups;
            let home = Self::home(groups, hash);
            let mine = std::ptr::eq(shard, own);
            groups[home..]
                .iter()
                .chain(&groups[..home])
                .take(EVICT_GROUPS)
                .map(move |group| (table, mine, group))
        });
        for (table, mine, group) in near {
            for slot in &group.0 {
                // Acquire: see `find`.
                let (t, word) = slot.load(Ordering::Acquire);
                if t & KIND != INLINE {
                    continue;
                }
                // A key outside its home group is uncounted under its shard's lock, which we
                // hold only for the new key's shard: elsewhere such a key is not a victim.
                let displaced = Self::displaced(table, t, slot);
                if displaced.is_some() && !mine {
                    continue;
                }
                // AcqRel: the removal is ordered with every charge of the slot: if a charge
                // lands first, this swap fails (the state is no longer `word`).
                if fresh.word(rule_of(t), word)
                    && slot
                        .compare_exchange((t, word), (TOMB, 0), Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    if let Some(d) = displaced {
                        Self::uncount_passes(table, d);
                    }
                    self.release(1);
                    fresh.evicted(rule_of(t));
                    return true;
                }
            }
        }
        false
    }

    /// Evicts one spilled state of `shard` that is `fresh`, with its marker unless another state
    /// of the same fingerprint keeps it, looking at [`EVICT_GROUPS`]` * 4` cells at most. Under
    /// `shard`'s write lock (`spill` is its map); true if one went.
    fn evict_spilled(&self, shard: &Shard<K>, fresh: Fresh<'_>, spill: &mut Spill<K>) -> bool {
        let victim = spill
            .iter()
            .take(EVICT_GROUPS * GROUP)
            .find(|((_, rule), cell)| fresh.cell(*rule, cell))
            .map(|(k, _)| k.clone());
        let Some(victim) = victim else {
            return false;
        };
        spill.remove(&victim);
        let hash = rule_hash(self.hash(&victim.0), victim.1);
        if !self.fingerprints(spill).contains(&tag(hash, SPILLED)) {
            if let Ok((slot, seen)) = self.probe_locked(shard, hash) {
                // AcqRel: as every removal; markers change only under this lock.
                if slot
                    .compare_exchange(seen, (TOMB, 0), Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    if let Some(d) = Self::displaced(self.table(shard), seen.0, slot) {
                        Self::uncount_passes(self.table(shard), d);
                    }
                    self.release(1);
                    fresh.evicted(victim.1);
                    return true;
                }
            }
        }
        // The marker stays (another state of its fingerprint): no slot of the cap came free.
        false
    }

    /// True when a new key would certainly be refused: the table is at the cap and the policy
    /// is to deny. Lets a flood of new keys at a full table be denied with one read of a counter
    /// instead of a shard's write lock each.
    #[inline]
    pub(crate) fn refuses_new_keys(&self) -> bool {
        // Relaxed: a snapshot; a key refused while a removal is in flight is refused as if it
        // came just before the removal.
        self.on_full == OnFull::Deny && self.len.load(Ordering::Relaxed) >= self.max_keys
    }

    /// Inserts the (key, rule) hashed to `hash` as an inline state holding `first` (a fresh
    /// state after its first call, so insertion and first charge are one write). `Ok(false)`
    /// when it turned out to be present already (the caller looks it up again); `Err(Full)` at
    /// the cap when nothing may be evicted.
    pub(super) fn insert_inline(
        &self,
        hash: u64,
        first: u64,
        fresh: Fresh<'_>,
    ) -> Result<bool, Full> {
        let shard = self.shard(hash);
        let mut claims = sync::write(&shard.spill);
        match self.probe_locked(shard, hash) {
            Ok(_) => Ok(false),
            Err(free) => self
                .claim(
                    Locked::new(shard, &mut claims),
                    hash,
                    INLINE,
                    first,
                    free,
                    fresh,
                )
                .map(|()| true),
        }
    }
}
