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
//! generation, sized for the cap: about 19.4-19.9 bytes per key there (16-byte slots at most
//! ~84% full, a one-byte pass count per 64-byte group, slack for uneven shards, less at most
//! 1/128 for the doubling steps; a cap of at most 16 Ki keys is sized at 45% instead, 36-50
//! bytes per key, at most ~580 KiB in all, so most keys sit in the first slot they probe).
//! Below the cap a shard's table is 25-50% full, so most keys sit in the first slot they
//! probe: 32-65 bytes per state.
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
//!
//! # Where the code is
//!
//! This file holds the types, the sizes and the [`Store`] trait's methods. `probe`: a key's
//! shard, table and home group, and the lock-free lookup. `claim`: a new state's slot under
//! the shard's write lock, the cap and evictions. `grow`: a shard's move into its next table.
//! `sweep`: lock-free removal, one state or a shard's fresh ones. `passes`: the pass counts
//! that claims raise and removals lower. `generation`: the mapped memory of each generation's
//! tables. `word`: the seam the limiter charges word states through. `testing`: what tests
//! read of the insides.

use std::collections::HashMap;
use std::hash::Hash;

use crossbeam_utils::CachePadded;

use super::{Fresh, Full, OnFull, RuleId, Store, rule_hash, rule_of};
use crate::cell::Cell;
use crate::sync::{self, AtomicPair, AtomicU8, AtomicUsize, Ordering, RwLock};

mod claim;
mod generation;
mod grow;
mod passes;
mod probe;
mod sweep;
#[cfg(test)]
mod testing;
mod word;

use claim::Locked;
use generation::Groups;
use passes::Uncounts;

#[cfg(test)]
pub(crate) use testing::WrongPassCount;
pub(crate) use word::{Kept, Near, Pending};

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

/// A pass count that stays: a group that this many keys have probed past is always probed
/// past (see [`Groups`]), so a count never wraps.
const PASSES_STUCK: u8 = u8::MAX;

/// Live keys per slot at the cap, in percent (the rest is what keeps probes short).
const LOAD_PERCENT: usize = 84;
/// Used slots (live and removed) per hundred past which a shard grows into its next table
/// (below the cap). A table between 25% and 50% full keeps most keys in the first slot their
/// probe reads; a fuller one (grown at the cap's load, [`LOAD_PERCENT`]) saves memory, but
/// costs every check a slot or group more, which a compound plan's check pays for each part.
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

/// One cache line of slots.
#[repr(align(64))]
struct Group([AtomicPair; GROUP]);

/// What a probe found for a key.
enum Found<'a> {
    /// The key's state is `word`, in `slot` of the cache line `line`, which held `tag` when
    /// read.
    Inline {
        slot: &'a AtomicPair,
        line: &'a Group,
        tag: u64,
        word: u64,
    },
    /// The key's state is in the spill map (or nowhere yet: then it is fresh).
    Spilled,
    /// No slot holds the key.
    Absent,
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
    /// Lookups of a key's state found in the cache line of another of its states
    /// ([`pending_near`](Self::pending_near)): the evidence, for tests, that the path ran.
    #[cfg(test)]
    near_hits: AtomicUsize,
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
            #[cfg(test)]
            near_hits: AtomicUsize::new(0),
        })
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
                Err(free) => {
                    self.claim(Locked::new(shard, &mut map), hash, SPILLED, 0, free, fresh)?
                }
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
