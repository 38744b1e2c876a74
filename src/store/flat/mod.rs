//! The lock-free store: a sharded open-addressing table of 16-byte `(tag, word)` slots, with the
//! key's state *inline* in the word, so checking a known key is one hash, one cache line and one
//! compare-and-swap (a denial: one load), with no lock and no pointer to chase.
//!
//! # Slots
//!
//! | tag (low 64 bits of the slot) | meaning | word (high 64 bits) |
//! |---|---|---|
//! | `0` (`EMPTY`) | never used; a probe stops here | 0 |
//! | `1` (`TOMB`) | removed; a probe goes on; an insert may reuse it | 0 |
//! | `fp \| 0b10` (`INLINE`) | a (key, rule) whose state is this word | the cell |
//! | `fp \| 0b11` (`SPILLED`) | a (key, rule) whose state is a [`Cell`] in its shard's spill map | 0 |
//!
//! `fp` is the (key, rule) hash ([`rule_hash`]: the key's ahash under a random seed per store,
//! mixed with the rule's id, which then fills bits 2..10) with its two low bits cleared. So a
//! slot's tag says which rule its word runs under (the sweep reads it there), two rules of one
//! key never share a slot, and keys are not stored: two keys whose 54 free fingerprint bits
//! are equal share one state of that rule. With `n` states of a rule the chance that any two
//! do is about `n^2 / 2^55` (3e-5 at one million), the seed is secret, so nobody can aim for
//! it, and the effect is bounded: the two keys share a bucket, neither gains a permit.
//!
//! A slot is read and swapped as one 16-byte atomic ([`AtomicPair`]), so a swap that expects
//! `(tag, state)` fails once the slot was removed or reused by another key: there is no ABA,
//! and no epoch or hazard pointer is needed, because nothing is ever freed while the table lives.
//!
//! # What lives where
//!
//! Every word-cell rule (token and leaky bucket, fixed window, sliding counter) of every plan
//! keeps its (key, rule) state inline, whatever plans share it. A sliding log cannot fit a word:
//! its slot is a `SPILLED` marker and its state a [`Cell`] in the shard's spill map (a
//! `RwLock<HashMap>` keyed by (key, rule)), until it is swept (then the marker goes too).
//!
//! # Locking
//!
//! - Check, peek, reset or sweep of an inline key: no lock (a load and a compare-and-swap).
//! - Spilled states (logs): the shard's read lock to check, its write lock to insert.
//! - Claiming a slot for a new state and removing markers: the shard's write lock, so
//!   no two slots ever hold one fingerprint, a free slot has one writer at a time (so a claim is
//!   a plain 16-byte store, not a swap), and a marker never vanishes under a check that is
//!   inserting its entry.
//! - Growing a shard into its next table: the shard's write lock (see below); lookups of the
//!   shard wait only if they meet a slot already moved.
//!
//! # Memory: tables that grow
//!
//! `max_keys` is a cap, not a preallocation. Each shard starts with a small table (128 to 255
//! groups of four slots, 8-16 KiB) and grows, one shard at a time, into a table twice as large
//! when a claim would take it past half its slots ([`GROW_PERCENT`]), up to the last
//! generation, sized for the cap as the whole table used to be: about 19.4-19.9 bytes per key
//! there (16-byte slots at most ~84% full, a one-byte pass count per 64-byte group, slack for
//! uneven shards, less at most 1/128 for the doubling steps; a cap of at most 16 Ki keys is
//! sized at 45% instead, 36-50 bytes per key, at most ~580 KiB in all, so most keys sit in the
//! first slot they probe). Below the cap a shard's table is 25-50% full, so most keys sit in
//! the first slot they probe: 32-65 bytes per state.
//!
//! Every generation's tables (all shards') are one anonymous mapping, reserved when the store
//! is built (address space only: the operating system hands out pages zeroed, as they are
//! first written). A shard's table word ([`Shard::table`]) names its table now. A move, under
//! the shard's write lock (the lock claims take), swaps every slot of the old table to `MOVED`
//! from what it holds (so a charge racing it either lands first and moves with the state, or
//! fails and looks again), writes the new table while no lookup can see it, publishes it with
//! one Release store, and hands the old table's pages back to the operating system
//! (`MADV_DONTNEED`). A lookup that meets a `MOVED` slot waits for the move (the shard's read
//! lock) and looks again; one that finds a key absent in a table that is no longer its shard's
//! looks again too (a handed-back page reads as zeros, `EMPTY`). Tables never shrink. Large
//! generations (2 MiB and more) start on a 2 MiB boundary and are advised as huge pages when
//! the first shard grows into them (a grown table is dense); the first generation keeps 4 KiB
//! pages, so an idle limiter costs a few KiB a shard.
//!
//! Probes scan whole 64-byte groups of four slots (starting, in each group, at a slot picked by
//! the hash), never more groups than the farthest any key of the shard was placed (`reach`),
//! and stop after a group that no key has probed past (its pass count is 0), so tombstones left
//! by sweeping cannot make a miss scan the shard.

use std::collections::HashMap;
use std::hash::Hash;

use crossbeam_utils::CachePadded;

use super::{Fresh, Full, OnFull, RuleId, Store, rule_hash, rule_of};
use crate::cell::Cell;
use crate::sync::{self, AtomicPair, AtomicU8, AtomicUsize, Ordering, RwLock};

mod word;

pub(crate) use word::Kept;

/// Slots per probe group: 4 x 16 bytes, one 64-byte cache line.
const GROUP: usize = 4;

/// A never-used slot: probes stop here.
const EMPTY: u64 = 0;
/// A removed slot: probes go on; inserts may reuse it.
const TOMB: u64 = 1;
/// Low tag bits of a key whose state is the slot's word.
const INLINE: u64 = 0b10;
/// Low tag bits of a key whose state is in the spill map.
const SPILLED: u64 = 0b11;
/// The low tag bits that say which kind of slot it is.
const KIND: u64 = 0b11;
/// A slot of a table its shard has grown out of (every slot of it: live, removed or never
/// used): the state, if any, is in the shard's next table. Neither a fingerprint's tag (those
/// end in `INLINE` or `SPILLED`) nor `EMPTY` or `TOMB`.
const MOVED: u64 = 0b101;

/// The low bits of a shard's table word that hold its table's generation; the rest is the
/// address of the table's first group (64-byte aligned, so those bits are free).
const GEN_BITS: usize = 63;
/// Groups of a shard's first table, at least (8 KiB; the last table has at most 1/128 fewer
/// groups than one table sized for the cap, see [`FlatStore::new`]). Loom models start at one group, so a few
/// states make a shard grow.
#[cfg(not(tollgate_loom))]
const FIRST_GROUPS: usize = 128;
#[cfg(tollgate_loom)]
const FIRST_GROUPS: usize = 1;

/// A generation's tables (all shards') at least this large ask for transparent huge pages when
/// the first shard grows into them: a grown table is dense (every 4 KiB page holds dozens of
/// states), so huge pages cost no memory that 4 KiB pages would not, and spare TLB misses (a
/// 3.9 MiB generation in 4 KiB pages made a check of 100,000 keys 5-15% slower).
#[cfg(not(tollgate_loom))]
const HUGE_TABLE_BYTES: usize = 2 << 20;
/// The size (and alignment) of a transparent huge page on x86-64 and most arm64 kernels.
#[cfg(not(tollgate_loom))]
const HUGE_PAGE: usize = 2 << 20;

/// Fresh keys a sweep removes in one hardware transaction, where the CPU has them: at most 32
/// cache lines written, well inside what a transaction holds, and enough that its cost (about
/// one locked instruction) is small against the removals' (32, 16-byte: 1.0-1.2 ns a slot in a
/// bare loop on this project's machine, where 4 took 3.7 and a `lock cmpxchg16b` alone 5.6).
const RTM_BATCH: usize = 32;
/// Transactions in a row that may abort for a reason other than a changed slot before a sweep
/// removes the rest of its shard one swap at a time.
const RTM_ABORTS: usize = 4;

/// A pass count that stays: a group that this many keys have probed past is always probed
/// past (see [`Groups`]), so a count never wraps.
const PASSES_STUCK: u8 = u8::MAX;

/// Groups (of four slots) an eviction looks at in each shard, from the new key's home group.
const EVICT_GROUPS: usize = 16;
/// Shards an eviction looks in: the new key's and the next ones (so a new key whose own shard
/// holds no fresh key can still take a fresh key's place elsewhere).
const EVICT_SHARDS: usize = 4;

/// Live keys per slot at the cap, in percent (the rest is what keeps probes short).
const LOAD_PERCENT: usize = 84;
/// Used slots (live and removed) per hundred past which a shard grows into its next table
/// (below the cap). A table between 25% and 50% full keeps most keys in the first slot their
/// probe reads; grown at 84%, tables of 42-84% made a compound plan's check 20-30% slower
/// (`benches/plans.rs`, 100,000 keys in a limiter for 400,000 states) than the cap-sized
/// table it replaced, for half the memory of this.
const GROW_PERCENT: usize = 50;
/// The same for a table of at most [`SMALL_KEYS`] keys: it stays within a 1-2 MiB L2 cache
/// either way, so the lower load costs ~270 KiB at most and keeps most keys in their first slot.
const SMALL_LOAD_PERCENT: usize = 45;
/// The largest `max_keys` sized at [`SMALL_LOAD_PERCENT`].
const SMALL_KEYS: usize = 1 << 14;

#[inline]
fn tag(hash: u64, kind: u64) -> u64 {
    (hash & !KIND) | kind
}

/// What a sweep's removals owe their shard's pass counts, as differences: group `g`'s count
/// drops by `wraps` plus the sum of the first `g + 1` entries of `diffs` (each removed key that
/// lay beyond its home adds 1 at its home and takes 1 off at its own group, and adds 1 to
/// `wraps` when its probe wrapped around the shard's end). Kept in the lock-free loop without a
/// branch on where the key lay and paid under the lock at its end in one pass; a decrement per
/// group passed, as each removal went, cost a sweep that removes every key 3.7 ns a key more on
/// the 2-core AMD VM (9.3 -> 13.0), half of it a mispredicted walk per displaced key. The wraps
/// are apart from `diffs[0]` so that removals do not all update one word in turn (a chain of
/// store-to-load forwards). `diffs` is empty until the first removal.
struct Uncounts {
    diffs: Vec<i32>,
    wraps: i32,
}

impl Uncounts {
    fn new() -> Self {
        Uncounts {
            diffs: Vec::new(),
            wraps: 0,
        }
    }

    /// Owes one pass of each group from `home` up to (not including) `at`, in a shard of
    /// `groups` groups. Nothing when they are equal.
    #[inline(always)]
    fn removed(&mut self, groups: usize, home: usize, at: usize) {
        if self.diffs.is_empty() {
            self.diffs = vec![0; groups];
        }
        self.diffs[home] += 1;
        self.diffs[at] -= 1;
        if home > at {
            self.wraps += 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.diffs.is_empty()
    }
}

/// A group whose pass count is off, for tests: `(shard, group, count, expected)`.
#[cfg(test)]
pub(crate) type WrongPassCount = (usize, usize, u8, usize);

/// One cache line of slots.
#[repr(align(64))]
struct Group([AtomicPair; GROUP]);

/// What a probe found for a key.
pub(super) enum Found<'a> {
    /// The key's state is `word`, in `slot`, which held `tag` when read.
    Inline {
        slot: &'a AtomicPair,
        tag: u64,
        word: u64,
    },
    /// The key's state is in the spill map (or nowhere yet: then it is fresh).
    Spilled,
    /// No slot holds the key.
    Absent,
}

/// A free slot found under the write lock, and how many groups from home it is.
struct Free<'a> {
    slot: &'a AtomicPair,
    distance: usize,
    /// The slot was never used (not a tombstone): claiming it raises the table's `used`.
    empty: bool,
}

/// One table of a shard: its groups and their pass counts, and the shard's table word that
/// names it (see [`Shard::table`]).
#[derive(Clone, Copy)]
struct Table<'a> {
    groups: &'a [Group],
    passes: &'a [AtomicU8],
    word: usize,
}

/// A shard's spilled states, by (key, rule).
type Spill<K> = HashMap<(K, RuleId), Cell, ahash::RandomState>;

struct Shard<K> {
    /// This shard's place among the shards (its tables' place in each generation's map).
    index: usize,
    /// The shard's table now: the address of its first group, with its generation in the low
    /// bits ([`GEN_BITS`]). Changes only under `spill`'s write lock, when the shard grows.
    table: AtomicUsize,
    /// Slots of the current table that are not `EMPTY` (live states and tombstones): past the
    /// generation's load the shard grows. Changes only under `spill`'s write lock.
    used: AtomicUsize,
    /// Groups a lookup scans at most: one more than the farthest from its home group that any
    /// key of this shard was ever placed, in any of its tables. Only raised, under `spill`'s
    /// write lock.
    reach: AtomicUsize,
    /// Cells of spilled states. Its write lock also serialises slot claims and marker removal.
    spill: CachePadded<RwLock<Spill<K>>>,
}

/// The lock-free store (see the module docs).
pub(crate) struct FlatStore<K> {
    /// The tables of each generation: generation `g` holds every shard's table of
    /// `first_groups << g` groups, in one mapping (so huge pages can cover it whole). A shard
    /// starts in generation 0 and grows one generation at a time, up to the last, sized for
    /// the cap.
    gens: Box<[Groups]>,
    /// Groups of a shard's table in generation 0.
    first_groups: usize,
    hasher: ahash::RandomState,
    shards: Box<[Shard<K>]>,
    /// `64 - log2(shards)`: a key's shard is its hash's top bits.
    shard_shift: u32,
    /// Slots taken (inline keys and markers); never above `max_keys`.
    len: CachePadded<AtomicUsize>,
    max_keys: usize,
    on_full: OnFull,
    /// The inline slot load of the sweep and the probe, where the CPU has it (see
    /// [`sync::PairLoad`]).
    vmovdqa: Option<sync::Vmovdqa>,
    /// Hardware transactions for the sweep's removals, where the CPU has them.
    rtm: Option<sync::Rtm>,
    /// Removals of fresh-looking keys that failed because the slot changed first (a charge
    /// landed): the evidence, for tests, that a sweep raced a check.
    #[cfg(test)]
    lost_removals: AtomicUsize,
    /// Lookups that met a move (a moved slot, or an old table): the evidence, for tests, that
    /// a check raced a shard's growth.
    #[cfg(test)]
    met_moves: AtomicUsize,
}

impl<K: Hash + Eq + Clone> FlatStore<K> {
    /// A store for at most `max_keys` states in `shards` shards (a power of two, at least 2).
    /// `None` when tables that large cannot be mapped (a `max_keys` meant as "unbounded", say).
    pub(crate) fn new(shards: usize, max_keys: usize, on_full: OnFull) -> Option<Self> {
        let shards = shards.max(2).next_power_of_two();
        let per_shard = max_keys.div_ceil(shards);
        // Slack for a shard that draws more than its share: two standard deviations of a
        // binomial share (about sqrt(per_shard)), so running out before the cap is negligible.
        let slack = 2 * (per_shard as f64).sqrt() as usize + 2 * GROUP;
        // Never fewer slots than a smaller table got, so the size grows with `max_keys`.
        let small = max_keys.min(SMALL_KEYS).div_ceil(shards) * 100 / SMALL_LOAD_PERCENT;
        let slots = (per_shard.checked_mul(100)? / LOAD_PERCENT).max(small) + slack;
        // Group indices are computed from 32 hash bits.
        let groups = u32::try_from(slots.div_ceil(GROUP).max(2)).ok()? as usize;
        // Generations: the first of FIRST_GROUPS to 2 * FIRST_GROUPS - 1 groups (or all of
        // them, for a small cap), each next one twice as large, the last `groups` rounded down
        // to a multiple of the doublings (at most 1/FIRST_GROUPS fewer, taken from the slack:
        // never more memory at the cap than one table for the cap, and a larger cap never gets
        // fewer slots).
        let mut last = 0;
        while groups >> (last + 1) >= FIRST_GROUPS {
            last += 1;
        }
        let first = groups >> last;
        let gens = (0..=last)
            .map(|g| Groups::new(shards, first << g, g))
            .collect::<Option<Box<[_]>>>()?;
        Some(FlatStore {
            shards: (0..shards)
                .map(|i| Shard {
                    index: i,
                    table: AtomicUsize::new(gens[0].groups(i).as_ptr() as usize),
                    used: AtomicUsize::new(0),
                    reach: AtomicUsize::new(1),
                    spill: CachePadded::new(RwLock::new(HashMap::with_hasher(
                        super::random_state(),
                    ))),
                })
                .collect(),
            gens,
            first_groups: first,
            hasher: super::random_state(),
            shard_shift: 64 - shards.trailing_zeros(),
            len: CachePadded::new(AtomicUsize::new(0)),
            max_keys,
            on_full,
            vmovdqa: sync::Vmovdqa::detect(),
            rtm: sync::Rtm::detect(),
            #[cfg(test)]
            lost_removals: AtomicUsize::new(0),
            #[cfg(test)]
            met_moves: AtomicUsize::new(0),
        })
    }

    /// Sweeps `shard`'s inline states, with no lock: each removal is a swap that fails if a
    /// charge landed first. A state is fresh when its word is, under the rule its tag names.
    /// Returns (visited, removed, whether any slot is a spilled state's marker, the pass counts
    /// the removals owe: see [`Uncounts`]).
    ///
    /// Where the CPU has RTM, the removals go in batches of [`RTM_BATCH`], each one transaction
    /// (one swap at a time if it aborts), where a `lock cmpxchg16b` per removal was most of a
    /// sweep that removes every key.
    #[inline(always)]
    fn sweep_inline(
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
                // Built in place: built first and moved in, the entry was stored in halves and
                // loaded whole, a store-forwarding stall (43% of the sweep's samples).
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

    /// Bytes of the shards' tables now (slots and pass counts; mapped outside the global
    /// allocator, resident as touched): they grow with the states held, up to
    /// [`cap_bytes`](Self::cap_bytes).
    pub(crate) fn table_bytes(&self) -> usize {
        let per_group = std::mem::size_of::<Group>() + 1;
        self.shards
            .iter()
            .map(|shard| self.table(shard).groups.len() * per_group)
            .sum()
    }

    /// Bytes of the shards' tables once all have grown to the cap's size.
    #[cfg(test)]
    pub(crate) fn cap_bytes(&self) -> usize {
        let last = self.gens.last().expect("at least one generation");
        last.total * (std::mem::size_of::<Group>() + 1)
    }

    /// The address of the first slot of the last generation's tables, for tests.
    #[cfg(test)]
    pub(crate) fn table_address(&self) -> usize {
        let last = self.gens.last().expect("at least one generation");
        last.all().as_ptr() as usize
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

    /// The generation of each shard's table now, for tests.
    #[cfg(test)]
    pub(crate) fn generations(&self) -> Vec<usize> {
        self.shards
            .iter()
            .map(|shard| self.table(shard).word & GEN_BITS)
            .collect()
    }

    /// Loads slots through portable-atomic from now on (see [`Limiter::without_inline_load`]).
    ///
    /// [`Limiter::without_inline_load`]: crate::Limiter::without_inline_load
    #[cfg(test)]
    pub(crate) fn without_inline_load(&mut self) {
        self.vmovdqa = None;
    }

    /// Removes swept keys one `cmpxchg16b` at a time from now on, as on a CPU without RTM.
    #[cfg(test)]
    pub(crate) fn without_rtm(&mut self) {
        self.rtm = None;
    }

    /// Whether sweeps remove keys in transactions (see [`sync::Rtm`]).
    #[cfg(test)]
    pub(crate) fn uses_rtm(&self) -> bool {
        self.rtm.is_some()
    }

    /// See the field.
    #[cfg(test)]
    pub(crate) fn met_moves(&self) -> usize {
        self.met_moves.load(Ordering::Relaxed)
    }

    /// See the field.
    #[cfg(test)]
    pub(crate) fn lost_removals(&self) -> usize {
        self.lost_removals.load(Ordering::Relaxed)
    }

    /// For tests, with no other thread touching the table: each group whose pass count is not
    /// what the slots say it should be (the keys lying beyond it along their probe), as
    /// `(shard, group, count, expected)`. A stuck count may exceed what it should be.
    #[cfg(test)]
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
    #[cfg(test)]
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
    #[cfg(test)]
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

    #[inline]
    pub(crate) fn hash(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard<K> {
        &self.shards[(hash >> self.shard_shift) as usize]
    }

    /// `shard`'s table now. Acquire: as in [`find`](Self::find).
    #[inline]
    fn table(&self, shard: &Shard<K>) -> Table<'_> {
        self.table_of(shard, shard.table.load(Ordering::Acquire))
    }

    /// The table of `shard` that `word` names (its table now or an earlier one).
    #[inline]
    fn table_of(&self, shard: &Shard<K>, word: usize) -> Table<'_> {
        let generation = &self.gens[word & GEN_BITS];
        Table {
            groups: generation.groups(shard.index),
            passes: generation.passes(shard.index),
            word,
        }
    }

    /// The group a hash starts probing at: the low 32 bits scaled to the group count.
    #[inline]
    fn home(groups: &[Group], hash: u64) -> usize {
        Self::home_of(groups.len(), hash)
    }

    /// The slot of its group a probe starts at (in every group it visits), from hash bits that
    /// neither the shard nor the home group use. Keys of one group then start at different
    /// slots, so most keys sit in the first slot their probe reads: the branch that finds them
    /// is predictable, where with every probe starting at slot 0 the position of a key in its
    /// group was random and the branch mispredicted on most lookups of a busy table.
    #[inline]
    fn first_slot(hash: u64) -> usize {
        // The rule's id too: the rules of one key share a home group (see `rule_hash`) and
        // start at different slots of it.
        (((hash >> 32) + (hash >> crate::store::RULE_SHIFT)) as usize) % GROUP
    }

    /// [`home`](Self::home) for a shard of `groups` groups. The two bits a tag replaces by its
    /// kind take no part, so a slot's tag tells its key's home (see [`displaced`](Self::displaced)),
    /// nor do the rule's id bits, so every rule of a key has the same home (see [`rule_hash`]).
    #[inline(always)]
    fn home_of(groups: usize, hash: u64) -> usize {
        (((hash & 0xFFFF_F800) * groups as u64) >> 32) as usize
    }

    /// Counts a key placed `distance` groups from `hash`'s home in `table` as passing each
    /// group before its own. Under the shard's write lock (every write of a count holds it, so a
    /// load and a store, not an atomic update), before the key's tag is published.
    fn count_passes(table: Table<'_>, hash: u64, distance: usize) {
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
    fn displaced(table: Table<'_>, t: u64, slot: &AtomicPair) -> Option<(usize, usize)> {
        let groups = table.groups;
        let offset = (slot as *const AtomicPair as usize).wrapping_sub(groups.as_ptr() as usize);
        let at = offset / std::mem::size_of::<Group>();
        let home = Self::home(groups, t);
        (at < groups.len() && home != at).then_some((home, at))
    }

    /// Notes in `uncounts` the pass counts owed for the key that `removal` took out of its slot,
    /// in a shard whose groups are `groups`. Inline and with no branch on where the key lay: out
    /// of line, finding the shard again from the tag, it took a sweep that removes every key
    /// from 6.8 to 12.5-13.3 ns a key on the 2-core Intel VM (removals in transactions).
    #[inline(always)]
    fn owe(groups: &[Group], uncounts: &mut Uncounts, removal: &sync::PairSwap<'_>) {
        let at = (removal.pair() as *const AtomicPair as usize - groups.as_ptr() as usize)
            / std::mem::size_of::<Group>();
        uncounts.removed(groups.len(), Self::home(groups, removal.tag()), at);
    }

    /// Pays what a sweep's removals owe `table`'s pass counts. Under the shard's write lock.
    fn apply_uncounts(table: Table<'_>, uncounts: &Uncounts) {
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
    fn uncount_passes(table: Table<'_>, (home, at): (usize, usize)) {
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
    /// match is the key). Branching slot by slot mispredicted on a third of the lookups of a
    /// full table, whose keys are in random positions (1,000 random keys in a table of 1,000:
    /// a denial 30.3 -> 27.0 ns, together with the clock read's move in `Limiter::check`).
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
        let group = &self.home_group(table, hash).0.0;
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
            return Found::Inline { slot, tag: t, word };
        }
        // A slot is EMPTY until its first claim (removals leave TOMB), and a claim takes the
        // first free slot of its key's probe: no key lies past an EMPTY slot. A new key's check
        // stops here; an existing key's first slot is never EMPTY, so this never mispredicts
        // for it.
        if t == EMPTY {
            return self.absent(shard, table, hash);
        }
        if let Some(v) = self.vmovdqa {
            let pairs: [(u64, u64); GROUP] =
                std::array::from_fn(|j| sync::PairLoad::load(v, &group[j]));
            let hits = (0..GROUP).fold(0u32, |m, j| m | u32::from(pairs[j].0 == inline) << j);
            if hits != 0 {
                let j = hits.trailing_zeros() as usize % GROUP;
                return Found::Inline {
                    slot: &group[j],
                    tag: inline,
                    word: pairs[j].1,
                };
            }
        }
        self.find_on(hash, table, t)
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
    fn load(&self, slot: &AtomicPair) -> (u64, u64) {
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
            let group = &groups[g].0;
            for j in skip..GROUP {
                let slot = &group[(first + j) % GROUP];
                // Acquire (`cell::ACQUIRE`): see `find`.
                let (t, word) = self.load(slot);
                if t == inline {
                    return Found::Inline { slot, tag: t, word };
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

    /// Under `shard`'s write lock: the slot holding the key (inline or spilled), or the first
    /// free slot its probe passes (none when the shard's table is full).
    fn probe_locked<'a>(
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

    /// Under `shard`'s write lock, before a claim of a new state: grows the shard into its next
    /// table when the claim would take its table past the generation's load, or the table has
    /// no free slot on the key's probe (`full`). True when it grew.
    fn grow_for_claim(&self, shard: &Shard<K>, full: bool) -> bool {
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
    fn grow(&self, shard: &Shard<K>) {
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

    /// Takes one slot of the cap; false when the table is full.
    fn reserve(&self) -> bool {
        super::take_slot(&self.len, self.max_keys)
    }

    fn release(&self, n: usize) {
        // Relaxed: see `reserve`.
        self.len.fetch_sub(n, Ordering::Relaxed);
    }

    /// Claims a slot for a new key (under `shard`'s write lock), honouring the cap and the
    /// `OnFull` policy. Writes `(tag, word)`.
    #[allow(clippy::too_many_arguments)]
    fn claim<'a>(
        &'a self,
        shard: &Shard<K>,
        hash: u64,
        kind: u64,
        word: u64,
        mut free: Option<Free<'a>>,
        fresh: Fresh<'_>,
        spill: &mut Spill<K>,
    ) -> Result<(), Full> {
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
        // store, not a swap (one locked instruction fewer per new key; 1M keys through
        // `check_many`, one thread, 90.6-102.0 -> 77.4-78.3 ns a new key): every other write to
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

    /// Removes the inline state hashed to `hash`: `Some(true)` when removed, `Some(false)` when
    /// absent, `None` when it is not inline (the caller looks again).
    fn remove_inline(&self, hash: u64) -> Option<bool> {
        let shard = self.shard(hash);
        loop {
            let Found::Inline { slot, tag: t, word } = self.find(hash) else {
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
                .claim(shard, hash, INLINE, first, free, fresh, &mut claims)
                .map(|()| true),
        }
    }

    /// The fingerprints of `map`'s states, sorted (to tell which markers still have cells).
    fn fingerprints(&self, map: &Spill<K>) -> Vec<u64> {
        let mut fps: Vec<u64> = map
            .keys()
            .map(|(k, rule)| tag(rule_hash(self.hash(k), *rule), SPILLED))
            .collect();
        fps.sort_unstable();
        fps
    }
}

impl<K: Hash + Eq + Clone + Send + Sync> Store<K> for FlatStore<K> {
    /// The spill map's cell of (`key`, `rule`) (a word-cell rule's state is inline: the limiter
    /// reads it with [`find`](FlatStore::find), not here).
    fn with<R>(&self, key: &K, rule: RuleId, f: impl FnOnce(&Cell) -> R) -> Option<R> {
        let hash = rule_hash(self.hash(key), rule);
        match self.find(hash) {
            Found::Spilled => sync::read(&self.shard(hash).spill)
                .get(&(key.clone(), rule))
                .map(f),
            Found::Inline { .. } | Found::Absent => None,
        }
    }

    /// The spill path (sliding logs): makes sure (`key`, `rule`) has a marker and a cell
    /// (inserting `make()`), then runs `f` on its cell.
    fn with_or_insert<R>(
        &self,
        key: &K,
        rule: RuleId,
        make: impl FnOnce() -> Cell,
        fresh: Fresh<'_>,
        f: impl FnOnce(&Cell) -> R,
    ) -> Result<R, Full> {
        let hash = rule_hash(self.hash(key), rule);
        let shard = self.shard(hash);
        let key = (key.clone(), rule);
        if let Found::Spilled = self.find(hash) {
            // Contention: the shard's read lock (a shared counter write), as in the dash store.
            let map = sync::read(&shard.spill);
            if let Some(c) = map.get(&key) {
                return Ok(f(c));
            }
        }
        let mut map = sync::write(&shard.spill);
        if !map.contains_key(&key) {
            match self.probe_locked(shard, hash) {
                // A marker with no cell (another key of this fingerprint went): start fresh.
                Ok(_) => {}
                Err(free) => self.claim(shard, hash, SPILLED, 0, free, fresh, &mut map)?,
            }
            map.insert(key.clone(), make());
        }
        Ok(f(map
            .get(&key)
            .expect("inserted or present under the write lock")))
    }

    fn remove(&self, key: &K, rule: RuleId) -> bool {
        let hash = rule_hash(self.hash(key), rule);
        let shard = self.shard(hash);
        loop {
            match self.find(hash) {
                Found::Inline { .. } => {
                    if let Some(removed) = self.remove_inline(hash) {
                        return removed;
                    }
                }
                Found::Absent => return false,
                Found::Spilled => {
                    let mut map = sync::write(&shard.spill);
                    let had = map.remove(&(key.clone(), rule)).is_some();
                    let shared = self.fingerprints(&map).contains(&tag(hash, SPILLED));
                    if let Ok((slot, seen)) = self.probe_locked(shard, hash) {
                        // Another key with this fingerprint keeps the marker.
                        if !shared
                            && slot
                                .compare_exchange(
                                    seen,
                                    (TOMB, 0),
                                    Ordering::AcqRel,
                                    Ordering::Relaxed,
                                )
                                .is_ok()
                        {
                            let table = self.table(shard);
                            if let Some(d) = Self::displaced(table, seen.0, slot) {
                                Self::uncount_passes(table, d);
                            }
                            self.release(1);
                        }
                    }
                    return had;
                }
            }
        }
    }

    fn shards(&self) -> usize {
        self.shards.len()
    }

    fn sweep_shard(&self, shard: usize, fresh: Fresh<'_>) -> (usize, usize) {
        let Some(shard) = self.shards.get(shard) else {
            return (0, 0);
        };
        let table = self.table(shard);
        // One loop per load, picked here rather than once a slot.
        let (mut visited, mut removed, markers, uncounts) = match self.vmovdqa {
            Some(load) => self.sweep_inline(table, fresh, load),
            None => self.sweep_inline(table, fresh, sync::Dispatched),
        };
        // The counts the removals owe, under the lock, if the shard has not grown out of the
        // swept table meanwhile (a move counts the new table afresh).
        let pay = |uncounts: &Uncounts| {
            // Relaxed: under the lock, where the word changes.
            if shard.table.load(Ordering::Relaxed) == table.word {
                Self::apply_uncounts(table, uncounts);
            }
        };
        if !uncounts.is_empty() && !markers {
            let _counts = sync::write(&shard.spill);
            pay(&uncounts);
        }
        if markers {
            // Spilled states: their cells, then the markers left with no cell, under the write
            // lock, so no check can be inserting the cell of a marker we remove.
            let mut map = sync::write(&shard.spill);
            pay(&uncounts);
            visited += map.len();
            map.retain(|(_, rule), cell| !fresh.cell(*rule, cell));
            let fps = self.fingerprints(&map);
            let table = self.table(shard);
            for group in table.groups {
                for slot in &group.0 {
                    // Acquire: see `find`.
                    let seen = slot.load(Ordering::Acquire);
                    if seen.0 & KIND == SPILLED
                        && fps.binary_search(&seen.0).is_err()
                        && slot
                            .compare_exchange(seen, (TOMB, 0), Ordering::AcqRel, Ordering::Relaxed)
                            .is_ok()
                    {
                        if let Some(d) = Self::displaced(table, seen.0, slot) {
                            Self::uncount_passes(table, d);
                        }
                        removed += 1;
                    }
                }
            }
        }
        self.release(removed);
        (visited, removed)
    }

    fn shard_len(&self, shard: usize) -> usize {
        let Some(shard) = self.shards.get(shard) else {
            return 0;
        };
        self.table(shard)
            .groups
            .iter()
            .flat_map(|g| &g.0)
            // Acquire: see `find`.
            .filter(|slot| slot.load(Ordering::Acquire).0 & INLINE != 0)
            .count()
    }

    fn len(&self) -> usize {
        // Relaxed: a snapshot of a counter.
        self.len.load(Ordering::Relaxed)
    }

    fn sum_cells(&self, mut f: impl FnMut(&Cell) -> usize) -> usize {
        self.shards
            .iter()
            .map(|s| sync::read(&s.spill).values().map(&mut f).sum::<usize>())
            .sum()
    }

    fn count_by_rule(&self, by_rule: &mut [u64; super::MAX_RULES]) {
        for shard in self.shards.iter() {
            // The spill map's read lock holds its states still; inline states are read as
            // they are (a snapshot, as statistics are).
            let spill = sync::read(&shard.spill);
            for (_, rule) in spill.keys() {
                by_rule[usize::from(*rule)] += 1;
            }
            for slot in self.table(shard).groups.iter().flat_map(|g| &g.0) {
                // Acquire: see `find`.
                let (t, _) = slot.load(Ordering::Acquire);
                if t & KIND == INLINE {
                    by_rule[usize::from(rule_of(t))] += 1;
                }
            }
        }
    }
}

/// One generation's tables: every shard's table of `len` groups, `(EMPTY, 0)` in every slot at
/// first, and each group's pass count, 0 at first.
///
/// A group's pass count is how many keys lie beyond it along their probe (placed in a later
/// group, having found this one full), up to [`PASSES_STUCK`], where it stays: a claim raises
/// the counts of the groups it passed, a removal lowers them again. A lookup that has scanned a
/// group whose count is 0 stops there. `EMPTY` slots also end a probe, but removals leave
/// `TOMB`s, so in a table whose keys come and go (clients arrive, go quiet, are swept) the
/// `EMPTY`s run out, and without the counts every lookup of a key not in its home group, and
/// every new key (twice: once without the lock and once under it), probed the shard's whole
/// reach. One thread, 1M keys, each round new keys filling the table and swept away, rounds 0
/// to 5 on the 2-core AMD VM: a new key 217, 297, 538, 884, 1303, 1394 ns, a lookup of an
/// absent key 191 to 757 ns; with the counts both stay at their first round's cost. One byte a
/// group (0.3 bytes a key at the cap).
///
/// Outside loom they live in an anonymous memory map, which the operating system hands out
/// zeroed and maps page by page as keys first land on them: reserving every generation up to
/// the cap costs a system call each, not writes, and a generation no shard has reached costs
/// address space only. (The global allocator would do the same for one large `calloc`, but
/// glibc serves repeated large allocations from its heap and zeroes them by hand.) A table a
/// shard has grown out of is handed back to the operating system ([`Groups::release`]).
struct Groups {
    /// The mapping, owned here (unmapped on drop) and reached through `first`.
    #[cfg(not(tollgate_loom))]
    map: memmap2::MmapMut,
    /// The first group, in `map` (a large generation starts on a 2 MiB boundary): kept as a
    /// pointer, since adding an offset to the map's address on every lookup cost a load and an
    /// add (2.5 instructions a hot-key denial, callgrind).
    #[cfg(not(tollgate_loom))]
    first: *const Group,
    /// The pass counts, one a group, in `map` after the groups.
    #[cfg(not(tollgate_loom))]
    passes: *const AtomicU8,
    #[cfg(tollgate_loom)]
    vec: Box<[Group]>,
    #[cfg(tollgate_loom)]
    passes: Box<[AtomicU8]>,
    /// Groups of each shard's table.
    len: usize,
    /// Groups of all shards' tables.
    total: usize,
    /// The generation's whole 2 MiB pages (offset in `map` and bytes), for a large generation
    /// after the first: advised as huge pages when the first shard grows into it.
    #[cfg(not(tollgate_loom))]
    huge: Option<(usize, usize)>,
    /// Whether they have been.
    #[cfg(not(tollgate_loom))]
    advised: crate::sync::AtomicBool,
}

// SAFETY: `first` and `passes` point into `map`, which `Groups` owns and which is `Send` and
// `Sync`; the groups and counts are only ever accessed through atomics (see `groups` and
// `passes`), as a `Box<[Group]>` and a `Box<[AtomicU8]>` would be.
#[cfg(not(tollgate_loom))]
unsafe impl Send for Groups {}
#[cfg(not(tollgate_loom))]
unsafe impl Sync for Groups {}

impl Groups {
    /// Generation `generation` for `shards` shards of `len` groups each; `None` when the system will
    /// not map that much.
    fn new(shards: usize, len: usize, generation: usize) -> Option<Self> {
        let total = shards.checked_mul(len)?;
        #[cfg(not(tollgate_loom))]
        {
            let groups = total.checked_mul(std::mem::size_of::<Group>())?;
            let bytes = groups.checked_add(total)?;
            // Large tables are probed at random: 2 MiB pages spare most TLB misses. The kernel
            // backs only whole, aligned 2 MiB ranges with them, so a large generation is mapped
            // with 2 MiB to spare and starts on a boundary: all of it but the tail (less than
            // 2 MiB) can then be in huge pages, where an unaligned start lost a partial page at
            // each end (3.4 of 19.4 MB at a million keys; aligning took a denial there from
            // 91-131 to 87-93 ns and a new key from 197-216 to 175-194, a one-thread loop on
            // this VM). Only whole huge pages are advised, so the slack is never touched. The
            // advice is a hint (the kernel may not have transparent huge pages). The first
            // generation keeps 4 KiB pages, so an idle limiter stays cheap.
            let huge = bytes >= HUGE_TABLE_BYTES;
            let slack = if huge { HUGE_PAGE } else { 0 };
            let map = memmap2::MmapMut::map_anon(bytes.checked_add(slack)?).ok()?;
            let mut offset = 0;
            let mut advice = None;
            if huge {
                // The distance up to the next boundary: less than the slack.
                offset = (map.as_ptr() as usize).wrapping_neg() % HUGE_PAGE;
                let whole = bytes / HUGE_PAGE * HUGE_PAGE;
                if generation == 0 {
                    // Also where the kernel would use them unasked.
                    let _ = map.advise_range(memmap2::Advice::NoHugePage, offset, whole);
                } else {
                    advice = Some((offset, whole));
                }
            }
            // SAFETY: `offset` is below the 2 MiB of slack, so `offset + bytes` is in the map.
            let first = unsafe { map.as_ptr().add(offset) } as *const Group;
            // SAFETY: the counts' `total` bytes follow the groups, inside `bytes`.
            let passes = unsafe { map.as_ptr().add(offset + groups) } as *const AtomicU8;
            Some(Groups {
                map,
                first,
                passes,
                len,
                total,
                huge: advice,
                advised: crate::sync::AtomicBool::new(false),
            })
        }
        #[cfg(tollgate_loom)]
        {
            let _ = generation;
            let vec = (0..total)
                .map(|_| Group(std::array::from_fn(|_| AtomicPair::new(EMPTY, 0))))
                .collect();
            let passes = (0..total).map(|_| AtomicU8::new(0)).collect();
            Some(Groups {
                vec,
                passes,
                len,
                total,
            })
        }
    }

    /// A shard is growing into this generation: its whole 2 MiB pages are advised as huge
    /// pages, once (the new table is written as the shard moves in, so its pages are faulted
    /// in as huge pages where the kernel has them).
    fn entered(&self) {
        #[cfg(not(tollgate_loom))]
        if let Some((offset, whole)) = self.huge {
            // Relaxed: the flag only makes the advice happen once; the advice orders nothing.
            if !self.advised.swap(true, Ordering::Relaxed) {
                let _ = self
                    .map
                    .advise_range(memmap2::Advice::HugePage, offset, whole);
            }
        }
    }

    /// Hands shard `shard`'s table (its whole 4 KiB pages) back to the operating system, once
    /// the shard has grown out of it. Its slots then read as `(EMPTY, 0)`: a lookup that loaded
    /// the shard's table before it grew and reads one sees the key absent and looks again
    /// (see [`FlatStore::find`]); a swap expecting a state there fails.
    fn release(&self, shard: usize) {
        #[cfg(all(not(tollgate_loom), target_os = "linux"))]
        {
            const PAGE: usize = 4096;
            let whole = |start: usize, bytes: usize| {
                let from = start.next_multiple_of(PAGE);
                let to = (start + bytes) / PAGE * PAGE;
                (from < to).then(|| (from, to - from))
            };
            let groups = self.groups(shard);
            let ranges = [
                whole(groups.as_ptr() as usize, std::mem::size_of_val(groups)),
                whole(self.passes(shard).as_ptr() as usize, self.len),
            ];
            for (from, bytes) in ranges.into_iter().flatten() {
                // SAFETY: the range is whole pages of this shard's table or counts, inside
                // `map`, which stays mapped; no other shard's slots share them. MADV_DONTNEED
                // replaces them with zero-filled pages: every access to them is atomic, and
                // all-zero is a valid `Group` and count, so a thread still reading them (a
                // lookup that loaded the table word before the move) reads `EMPTY` slots.
                unsafe {
                    let _ = libc::madvise(from as *mut libc::c_void, bytes, libc::MADV_DONTNEED);
                }
            }
        }
        #[cfg(not(all(not(tollgate_loom), target_os = "linux")))]
        let _ = shard;
    }

    /// Shard `shard`'s groups.
    #[inline]
    fn groups(&self, shard: usize) -> &[Group] {
        &self.all()[shard * self.len..][..self.len]
    }

    /// Every shard's groups.
    #[inline]
    fn all(&self) -> &[Group] {
        #[cfg(not(tollgate_loom))]
        // SAFETY: the map holds `total * size_of::<Group>()` bytes from `first`, which is
        // page-aligned (so 64-aligned); they are zero-filled by the operating system, and the
        // map lives as long as `self`. All-zero bytes are a valid `Group` (four `AtomicPair`s,
        // each an `UnsafeCell<u128>` holding 0), and the slots are only ever accessed through
        // atomic operations, never through the map's `&mut`.
        unsafe {
            std::slice::from_raw_parts(self.first, self.total)
        }
        #[cfg(tollgate_loom)]
        {
            &self.vec
        }
    }

    /// Shard `shard`'s pass counts, one a group.
    #[inline]
    fn passes(&self, shard: usize) -> &[AtomicU8] {
        #[cfg(not(tollgate_loom))]
        // SAFETY: the map holds `total` bytes from `passes`, zero-filled by the operating
        // system and living as long as `self`; a zero byte is a valid `AtomicU8` holding 0, and
        // the counts are only ever accessed through atomic operations.
        let all = unsafe { std::slice::from_raw_parts(self.passes, self.total) };
        #[cfg(tollgate_loom)]
        let all = &self.passes;
        &all[shard * self.len..][..self.len]
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
