//! One generation's tables: the memory behind every shard's table of one size, mapped up
//! front, handed out by the operating system as first written and handed back after a move.

#[cfg(tollgate_loom)]
use super::EMPTY;
use super::Group;
#[cfg(tollgate_loom)]
use crate::sync::AtomicPair;
use crate::sync::AtomicU8;
#[cfg(not(tollgate_loom))]
use crate::sync::Ordering;

/// A generation's tables (all shards') at least this large ask for transparent huge pages when
/// the first shard grows into them: a grown table is dense (every 4 KiB page holds dozens of
/// states), so huge pages cost no memory that 4 KiB pages would not, and spare the TLB misses
/// that random probes of a table this large take in 4 KiB pages.
#[cfg(not(tollgate_loom))]
const HUGE_TABLE_BYTES: usize = 2 << 20;
/// The size (and alignment) of a transparent huge page on x86-64 and most arm64 kernels.
#[cfg(not(tollgate_loom))]
const HUGE_PAGE: usize = 2 << 20;

/// One generation's tables: every shard's table of `len` groups, `(EMPTY, 0)` in every slot at
/// first, and each group's pass count, 0 at first.
///
/// A group's pass count is how many keys lie beyond it along their probe (placed in a later
/// group, having found this one full), up to [`PASSES_STUCK`], where it stays: a claim raises
/// the counts of the groups it passed, a removal lowers them again. A lookup that has scanned a
/// group whose count is 0 stops there. `EMPTY` slots also end a probe, but removals leave
/// `TOMB`s, so in a table whose keys come and go (clients arrive, go quiet, are swept) the
/// `EMPTY`s run out, and without the counts every lookup of a key not in its home group, and
/// every new key (twice: once without the lock and once under it), would probe the shard's
/// whole reach, dearer with every round of keys that came and went; with the counts both stay
/// at what they cost in a table that never had a removal. One byte a group (0.3 bytes a key at
/// the cap).
///
/// Outside loom they live in an anonymous memory map, which the operating system hands out
/// zeroed and maps page by page as keys first land on them: reserving every generation up to
/// the cap costs a system call each, not writes, and a generation no shard has reached costs
/// address space only. (The global allocator would do the same for one large `calloc`, but
/// glibc serves repeated large allocations from its heap and zeroes them by hand.) A table a
/// shard has grown out of is handed back to the operating system ([`Groups::release`]).
///
/// [`PASSES_STUCK`]: super::PASSES_STUCK
pub(super) struct Groups {
    /// The mapping, owned here (unmapped on drop) and reached through `first`.
    #[cfg(not(tollgate_loom))]
    map: memmap2::MmapMut,
    /// The first group, in `map` (a large generation starts on a 2 MiB boundary): kept as a
    /// pointer, so that a lookup does not add an offset to the map's address (a load and an
    /// add on every lookup).
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
    pub(super) total: usize,
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
    pub(super) fn new(shards: usize, len: usize, generation: usize) -> Option<Self> {
        let total = shards.checked_mul(len)?;
        #[cfg(not(tollgate_loom))]
        {
            let groups = total.checked_mul(std::mem::size_of::<Group>())?;
            let bytes = groups.checked_add(total)?;
            // Large tables are probed at random: 2 MiB pages spare most TLB misses. The kernel
            // backs only whole, aligned 2 MiB ranges with them, so a large generation is mapped
            // with 2 MiB to spare and starts on a boundary: all of it but the tail (less than
            // 2 MiB) can then be in huge pages, where an unaligned start loses a partial page at
            // each end (3.4 of 19.4 MB at a million keys). Only whole huge pages are advised, so
            // the slack is never touched. The advice is a hint (the kernel may not have
            // transparent huge pages). The first generation keeps 4 KiB pages, so an idle
            // limiter stays cheap.
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
    pub(super) fn entered(&self) {
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
    ///
    /// [`FlatStore::find`]: super::FlatStore::find
    pub(super) fn release(&self, shard: usize) {
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
    pub(super) fn groups(&self, shard: usize) -> &[Group] {
        &self.all()[shard * self.len..][..self.len]
    }

    /// Every shard's groups.
    #[inline]
    pub(super) fn all(&self) -> &[Group] {
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
    pub(super) fn passes(&self, shard: usize) -> &[AtomicU8] {
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
