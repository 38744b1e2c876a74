//! The one facade for every atomic and lock in the engine.
//!
//! Nothing else in `src/` names `std::sync::atomic`: under `--cfg tollgate_loom` these names
//! switch to loom's model-checked versions, so a loom model sees every atomic operation the engine
//! performs. Keep it that way: a raw `std` atomic elsewhere is invisible to the model checker.

#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A process-wide lock that no model needs to see: only the hand-out of stats stripe indices to
/// threads (once per thread start and exit) uses it. Under loom every model thread shares one
/// OS thread's index and counts on the shared stripe, so the models lose nothing.
pub(crate) use std::sync::Mutex as StaticMutex;

/// A tag for a new limiter, distinct from every other limiter's in the process until 2^32 - 1
/// have been built (then the tags come round again), never 0: its plan ids carry it (see
/// `PlanId`). A process-wide counter that no model needs to see, like [`StaticMutex`]: it
/// orders nothing, it only hands out distinct values.
pub(crate) fn next_limiter_tag() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    loop {
        // Relaxed: only distinctness matters, which one RMW gives.
        let tag = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if tag != 0 {
            return tag;
        }
    }
}

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU64, AtomicUsize, Ordering,
};
#[cfg(tollgate_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, recovering the data if a panicking thread poisoned it.
///
/// Every structure behind a mutex in this crate is valid after any partial update (a log of
/// timestamps, a sweeper flag), so poisoning carries no information worth propagating.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(tollgate_loom))]
    {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(tollgate_loom)]
    {
        m.lock().unwrap()
    }
}

/// Takes `l`'s read lock, recovering from poisoning (see [`lock`]).
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    #[cfg(not(tollgate_loom))]
    {
        l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(tollgate_loom)]
    {
        l.read().unwrap()
    }
}

/// Takes `l`'s write lock, recovering from poisoning (see [`lock`]).
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    #[cfg(not(tollgate_loom))]
    {
        l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(tollgate_loom)]
    {
        l.write().unwrap()
    }
}

/// A 16-byte atomic: a (tag, word) pair read and compare-and-swapped as one, so a swap that
/// expects one key's tag can never land on a slot that another key has taken since (no ABA).
///
/// On x86_64 this is `cmpxchg16b` for the swap (inline where the CPU has it, see [`cmpxchg16b`])
/// and, on CPUs with AVX, one `vmovdqa` for the load (a plain read: a denial writes nothing) and
/// the store; portable-atomic picks them at run time and falls back to a lock elsewhere. Under loom it is a mutex around the pair, which loom
/// explores like any other synchronisation.
#[repr(transparent)]
pub(crate) struct AtomicPair {
    #[cfg(not(tollgate_loom))]
    v: portable_atomic::AtomicU128,
    #[cfg(tollgate_loom)]
    v: loom::sync::Mutex<u128>,
}

impl AtomicPair {
    /// A pair holding `(tag, word)`.
    #[cfg_attr(not(tollgate_loom), allow(dead_code))]
    pub(crate) fn new(tag: u64, word: u64) -> Self {
        let v = pack(tag, word);
        AtomicPair {
            #[cfg(not(tollgate_loom))]
            v: portable_atomic::AtomicU128::new(v),
            #[cfg(tollgate_loom)]
            v: loom::sync::Mutex::new(v),
        }
    }

    /// Both halves at one instant, as `(tag, word)`.
    #[inline]
    pub(crate) fn load(&self, order: Ordering) -> (u64, u64) {
        #[cfg(not(tollgate_loom))]
        let v = self.v.load(order);
        #[cfg(tollgate_loom)]
        let v = {
            let _ = order;
            *self.v.lock().unwrap()
        };
        unpack(v)
    }

    /// Writes `(tag, word)`, for a writer that no other write can race (see `FlatStore::claim`).
    #[inline]
    pub(crate) fn store(&self, tag: u64, word: u64, order: Ordering) {
        let v = pack(tag, word);
        #[cfg(not(tollgate_loom))]
        self.v.store(v, order);
        #[cfg(tollgate_loom)]
        {
            let _ = order;
            *self.v.lock().unwrap() = v;
        }
    }

    /// Replaces `current` by `new` if the pair still holds `current`; else returns what it holds.
    #[inline]
    pub(crate) fn compare_exchange(
        &self,
        current: (u64, u64),
        new: (u64, u64),
        success: Ordering,
        failure: Ordering,
    ) -> Result<(), (u64, u64)> {
        #[cfg(all(target_arch = "x86_64", not(tollgate_loom)))]
        if portable_atomic::AtomicU128::is_lock_free() {
            // A locked instruction orders as SeqCst, stronger than any `success` / `failure`.
            let _ = (success, failure);
            // SAFETY: portable-atomic's 128-bit atomics are lock-free here (it says so from the
            // same CPU detection it dispatches by; a build that makes it use its lock, such as
            // `portable_atomic_no_outline_atomics`, says false), so on x86-64 every other
            // access to the pair is `cmpxchg16b` too (or a `vmovdqa` load or store, never a
            // lock): all single 16-byte atomic instructions. The cell is 16-aligned and valid
            // for the borrow of `self`.
            return unsafe { cmpxchg16b(&self.v, current, new) };
        }
        let (current, new) = (pack(current.0, current.1), pack(new.0, new.1));
        #[cfg(not(tollgate_loom))]
        {
            self.v
                .compare_exchange(current, new, success, failure)
                .map(drop)
                .map_err(unpack)
        }
        #[cfg(tollgate_loom)]
        {
            let _ = (success, failure);
            let mut v = self.v.lock().unwrap();
            if *v == current {
                *v = new;
                Ok(())
            } else {
                Err(unpack(*v))
            }
        }
    }
}

/// `lock cmpxchg16b` on `v`, inline: portable-atomic's own swap on a CPU that has it, minus the
/// call through the function pointer it dispatches by (an indirect call per charge, with the
/// registers spilled around it). `(tag, word)` pairs as [`pack`] lays them out: the tag is the
/// low half (`rax` / `rbx`), the word the high one (`rdx` / `rcx`).
///
/// # Safety
///
/// The CPU must have `cmpxchg16b`, and every other access to `v` must be a 16-byte atomic
/// instruction (as portable-atomic's are where its 128-bit atomics are lock-free).
#[cfg(all(target_arch = "x86_64", not(tollgate_loom)))]
#[inline(always)]
unsafe fn cmpxchg16b(
    v: &portable_atomic::AtomicU128,
    current: (u64, u64),
    new: (u64, u64),
) -> Result<(), (u64, u64)> {
    let (tag, word, swapped): (u64, u64, u64);
    // SAFETY: as the caller promises. `rbx` cannot be named as an operand, so the new tag is
    // swapped into it and the register restored after (as portable-atomic does); every other
    // register is named, so none of them can be `rbx` when the instruction runs (a pointer
    // left to the allocator was given `rbx`, which the swap then replaced). The block may read
    // and write memory, so it is a compiler barrier.
    unsafe {
        std::arch::asm!(
            "xchg {new_tag}, rbx",
            "lock cmpxchg16b xmmword ptr [rdi]",
            "sete cl",
            "mov rbx, {new_tag}",
            in("rdi") v.as_ptr(),
            new_tag = inout(reg) new.0 => _,
            inout("rcx") new.1 => swapped,
            inout("rax") current.0 => tag,
            inout("rdx") current.1 => word,
            options(nostack),
        );
    }
    if swapped as u8 != 0 {
        Ok(())
    } else {
        Err((tag, word))
    }
}

/// How a loop over many pairs loads each one, chosen once for the loop.
///
/// [`AtomicPair::load`] goes through portable-atomic, which picks its instruction at run time
/// through a function pointer on every call. The sweep makes one per slot, and there the call
/// was a third of its time (`perf`); a probe that misses its first slot loads the other three
/// of the group, and that scan is worth making only with the inline load.
pub(crate) trait PairLoad: Copy {
    /// Both halves of `pair` at one instant, with at least `Acquire` ordering.
    fn load(self, pair: &AtomicPair) -> (u64, u64);
}

/// [`AtomicPair::load`]: whatever portable-atomic picks, on every CPU.
#[derive(Clone, Copy)]
pub(crate) struct Dispatched;

impl PairLoad for Dispatched {
    #[inline]
    fn load(self, pair: &AtomicPair) -> (u64, u64) {
        pair.load(Ordering::Acquire)
    }
}

/// One inline `vmovdqa`: what portable-atomic itself uses for a load on a CPU with AVX and
/// `cmpxchg16b`, minus the call. Only [`Vmovdqa::detect`] makes one, so holding one proves the
/// CPU has both.
#[derive(Clone, Copy)]
pub(crate) struct Vmovdqa(());

impl Vmovdqa {
    /// `Some` where a 16-byte aligned `vmovdqa` is an atomic load and portable-atomic swaps with
    /// `cmpxchg16b` (so both sides of a race are single 16-byte instructions): x86_64 with AVX
    /// and `cmpxchg16b` detected, outside loom. Intel and AMD guarantee the atomicity; LLVM,
    /// Boost and portable-atomic rely on it.
    pub(crate) fn detect() -> Option<Self> {
        #[cfg(all(target_arch = "x86_64", not(tollgate_loom)))]
        {
            // Lock-free: portable-atomic uses `cmpxchg16b` itself (not its lock), so every
            // write to a pair is a single 16-byte instruction this load can race.
            (std::is_x86_feature_detected!("avx")
                && std::is_x86_feature_detected!("cmpxchg16b")
                && portable_atomic::AtomicU128::is_lock_free())
            .then_some(Vmovdqa(()))
        }
        #[cfg(not(all(target_arch = "x86_64", not(tollgate_loom))))]
        {
            None
        }
    }
}

impl PairLoad for Vmovdqa {
    #[inline(always)]
    fn load(self, pair: &AtomicPair) -> (u64, u64) {
        #[cfg(all(target_arch = "x86_64", not(tollgate_loom)))]
        {
            #[cfg(not(tollgate_broken = "torn_load"))]
            let (tag, word): (u64, u64);
            // SAFETY: `self` exists only where `detect` found AVX and `cmpxchg16b`, so the
            // instructions exist and every write to the pair is a `cmpxchg16b` or, for
            // `store`, a `vmovdqa` (portable-atomic uses no lock there): one 16-byte `vmovdqa`
            // of the pair's 16-aligned cell is an atomic load of it, as portable-atomic's own
            // load is. A load on x86 has acquire ordering, and the block is a compiler barrier
            // (it neither claims `nomem` nor `readonly`). The pointer is valid for the borrow of
            // `pair`.
            #[cfg(not(tollgate_broken = "torn_load"))]
            unsafe {
                std::arch::asm!(
                    "vmovdqa {v}, xmmword ptr [{p}]",
                    "vmovq {tag}, {v}",
                    "vpextrq {word}, {v}, 1",
                    p = in(reg) pair.v.as_ptr(),
                    v = out(xmm_reg) _,
                    tag = out(reg) tag,
                    word = out(reg) word,
                    options(nostack, preserves_flags),
                );
            }
            // Deliberately broken (scripts/must-fail.sh): the halves taken from two loads, the
            // word first, which the tearing test must catch.
            #[cfg(tollgate_broken = "torn_load")]
            let (tag, word) = {
                let word = pair.load(Ordering::Acquire).1;
                std::hint::spin_loop();
                (pair.load(Ordering::Acquire).0, word)
            };
            (tag, word)
        }
        #[cfg(not(all(target_arch = "x86_64", not(tollgate_loom))))]
        {
            pair.load(Ordering::Acquire)
        }
    }
}

/// One compare-and-swap of a batch for [`Rtm::swap_all`]: `pair` from `current` (`[tag,
/// word]`) to the batch's new value. `repr(C)`: the transaction's loop reads the fields at fixed
/// offsets (`AtomicPair` is `repr(transparent)`, so the pair's address is its cell's).
#[repr(C)]
pub(crate) struct PairSwap<'a> {
    pair: &'a AtomicPair,
    current: [u64; 2],
}

// The offsets `Rtm::swap_all`'s loop reads.
const _: () = {
    assert!(std::mem::offset_of!(PairSwap<'static>, pair) == 0);
    assert!(std::mem::offset_of!(PairSwap<'static>, current) == 8);
    assert!(std::mem::size_of::<PairSwap<'static>>() == 24);
};

impl<'a> PairSwap<'a> {
    pub(crate) fn new(pair: &'a AtomicPair, current: (u64, u64)) -> Self {
        PairSwap {
            pair,
            current: [current.0, current.1],
        }
    }

    /// The pair this swap is for.
    pub(crate) fn pair(&self) -> &'a AtomicPair {
        self.pair
    }

    /// The tag half of what the swap expects.
    pub(crate) fn tag(&self) -> u64 {
        self.current[0]
    }

    /// The swap to `new` alone, as `cmpxchg16b`: true if it took effect.
    #[cfg_attr(tollgate_broken = "blind_removal", allow(unreachable_code))]
    pub(crate) fn swap_alone(&self, new: (u64, u64)) -> bool {
        // Deliberately broken (scripts/must-fail.sh): a blind store, some time after the visit
        // read the slot (as for a sweeper preempted there), which overwrites a charge that landed
        // in between; the sweep race tests must catch the extra permits.
        #[cfg(tollgate_broken = "blind_removal")]
        {
            for _ in 0..2_000 {
                std::hint::spin_loop();
            }
            self.pair.store(new.0, new.1, Ordering::Release);
            return true;
        }
        // AcqRel: like a committed transaction, which orders like a locked instruction.
        self.pair
            .compare_exchange(
                (self.current[0], self.current[1]),
                new,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }
}

/// Intel's restricted transactional memory (RTM), where the CPU has it: a batch of 16-byte
/// compare-and-swaps that take effect all at once or not at all, for about the price of one
/// locked instruction. The sweep removes fresh keys in batches with it: a `lock cmpxchg16b` per
/// removal costs more than the sweep's whole budget per key, even in a bare loop over a cached
/// table, while in a transaction of 32 a removal costs about 1 ns.
///
/// A transaction may abort at any time (a concurrent write to a line it read, an interrupt, a
/// full cache set): the caller then swaps one by one. While it runs, another core's access to
/// any line it touched aborts it (strong isolation), and a committed one is ordered like a
/// locked instruction (Intel's SDM, on RTM's memory ordering), so against the checks'
/// `cmpxchg16b` each swap of a committed batch is one atomic compare-and-swap. Only
/// [`Rtm::detect`] makes one.
#[derive(Clone, Copy)]
pub(crate) struct Rtm(());

impl Rtm {
    /// `Some` on x86_64 with RTM detected, outside loom (whose pairs are mutexes).
    pub(crate) fn detect() -> Option<Self> {
        #[cfg(all(target_arch = "x86_64", not(tollgate_loom)))]
        {
            std::is_x86_feature_detected!("rtm").then_some(Rtm(()))
        }
        #[cfg(not(all(target_arch = "x86_64", not(tollgate_loom))))]
        {
            None
        }
    }

    /// Applies every swap of `batch` in one transaction: `Ok(())` when each pair held its
    /// `current` and now holds `new`; otherwise nothing was written, and `Err` says whether a
    /// pair held something else (`Mismatch`) or the transaction aborted for another reason.
    #[cfg_attr(
        tollgate_broken = "blind_removal",
        allow(unreachable_code, unused_variables)
    )]
    pub(crate) fn swap_all(self, batch: &[PairSwap<'_>], new: (u64, u64)) -> Result<(), Abort> {
        if batch.is_empty() {
            return Ok(());
        }
        // The broken build's removals all go through its blind `PairSwap::swap_alone`.
        #[cfg(tollgate_broken = "blind_removal")]
        return Err(Abort::Other);
        #[cfg(all(target_arch = "x86_64", not(tollgate_loom)))]
        {
            let status: u32;
            // SAFETY: `self` exists only where `detect` found RTM, so the instructions exist.
            // `batch` is a live slice of `PairSwap`s (`repr(C)`, 24 bytes each: the pair's
            // address at offset 0, then `current`, 8 bytes a half; see the asserts), and each
            // pair is a live, 16-aligned `AtomicPair` (`repr(transparent)` over its cell),
            // borrowed for as long as the batch, and only ever accessed atomically: inside a
            // transaction the two 8-byte loads and stores of a pair commit together with the
            // rest, so no other core sees half of one (a conflicting access aborts the
            // transaction instead).
            // On an abort the CPU discards the stores and restores every register but eax to
            // its value at `xbegin`, and resumes at `3:`; the pointer and count registers are
            // clobbered outputs, so their restored values are never read. No stack is used.
            unsafe {
                std::arch::asm!(
                    "xbegin 3f",
                    "2:",
                    "mov {p}, qword ptr [{s}]",
                    "mov {x}, qword ptr [{s} + 8]",
                    "cmp {x}, qword ptr [{p}]",
                    "jne 4f",
                    "mov {x}, qword ptr [{s} + 16]",
                    "cmp {x}, qword ptr [{p} + 8]",
                    "jne 4f",
                    "mov qword ptr [{p}], {tag}",
                    "mov qword ptr [{p} + 8], {word}",
                    "add {s}, 24",
                    "dec {n}",
                    "jnz 2b",
                    "xend",
                    "mov eax, -1",
                    "jmp 3f",
                    "4:",
                    "xabort 1",
                    "3:",
                    s = inout(reg) batch.as_ptr() => _,
                    n = inout(reg) batch.len() => _,
                    p = out(reg) _,
                    x = out(reg) _,
                    tag = in(reg) new.0,
                    word = in(reg) new.1,
                    out("eax") status,
                    options(nostack),
                );
            }
            match status {
                u32::MAX => Ok(()),
                // An explicit abort (bit 0) with our code (bits 31..24): a pair differed.
                s if s & 1 != 0 && s >> 24 == 1 => Err(Abort::Mismatch),
                _ => Err(Abort::Other),
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(tollgate_loom))))]
        {
            Err(Abort::Other)
        }
    }
}

/// Why [`Rtm::swap_all`] wrote nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Abort {
    /// A pair did not hold its `current`.
    Mismatch,
    /// A conflict with another core, an interrupt, a capacity limit...: worth a retry later.
    Other,
}

/// The tag is the low half, the word the high half.
#[inline]
fn pack(tag: u64, word: u64) -> u128 {
    (u128::from(word) << 64) | u128::from(tag)
}

#[inline]
fn unpack(v: u128) -> (u64, u64) {
    (v as u64, (v >> 64) as u64)
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;

    /// The inline load, where the CPU has it (this machine's CI does).
    fn vmovdqa() -> Option<Vmovdqa> {
        let v = Vmovdqa::detect();
        if v.is_none() {
            eprintln!("no AVX or cmpxchg16b on this CPU: the inline load is never used");
        }
        v
    }

    /// A batch of swaps in one transaction: all of them where every pair holds what it should
    /// (a transaction may abort at any time, so the test allows a few tries), none of them
    /// where one pair holds something else, on every try.
    #[test]
    fn transactions_swap_all_pairs_or_none() {
        let Some(rtm) = Rtm::detect() else {
            eprintln!("no RTM on this CPU: the transactional swap is never used");
            return;
        };
        let pairs: Vec<AtomicPair> = (0..32).map(|i| AtomicPair::new(i, !i)).collect();
        let mut batch: Vec<PairSwap<'_>> = pairs
            .iter()
            .zip(0..)
            .map(|(p, i)| PairSwap::new(p, (i, !i)))
            .collect();
        // One pair differs: never a write.
        batch[17] = PairSwap::new(&pairs[17], (17, 0));
        let mismatch = |batch: &[PairSwap<'_>], new| {
            let outcomes: Vec<_> = (0..100).map(|_| rtm.swap_all(batch, new)).collect();
            assert!(
                outcomes.iter().all(Result::is_err),
                "a transaction committed"
            );
            assert!(
                outcomes.contains(&Err(Abort::Mismatch)),
                "never told a mismatch"
            );
        };
        mismatch(&batch, (1, 0));
        for (p, i) in pairs.iter().zip(0..) {
            assert_eq!(p.load(Ordering::Acquire), (i, !i), "pair {i} unchanged");
        }
        // All match: every pair swapped, once one try commits.
        batch[17] = PairSwap::new(&pairs[17], (17, !17));
        let tries = (1..=100).find(|_| rtm.swap_all(&batch, (1, 0)).is_ok());
        assert!(tries.is_some(), "100 transactions aborted in a row");
        assert!(pairs.iter().all(|p| p.load(Ordering::Acquire) == (1, 0)));
        // And now none holds what the batch expects.
        mismatch(&batch, (2, 0));
        assert!(pairs.iter().all(|p| p.load(Ordering::Acquire) == (1, 0)));
        assert!(rtm.swap_all(&[], (2, 0)).is_ok(), "an empty batch is done");
    }

    #[test]
    fn inline_load_reads_what_portable_atomic_reads() {
        let Some(v) = vmovdqa() else { return };
        let p = AtomicPair::new(u64::MAX - 3, 42);
        assert_eq!(v.load(&p), (u64::MAX - 3, 42));
        assert_eq!(v.load(&p), Dispatched.load(&p));
        let next = (7, u64::MAX);
        p.compare_exchange(
            (u64::MAX - 3, 42),
            next,
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .unwrap();
        assert_eq!(v.load(&p), next);
        assert_eq!(v.load(&p), Dispatched.load(&p));
    }

    /// One thread swaps `(i, !i)` for `(i + 1, !(i + 1))` while another loads with `vmovdqa`:
    /// every load sees one swap's pair whole, and the reader sees the pair change many times.
    #[test]
    fn inline_load_never_tears_under_swaps() {
        let Some(v) = vmovdqa() else { return };
        const CHANGES: usize = 20_000;
        let pair = AtomicPair::new(0, !0);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut i = 0u64;
                while !done.load(Ordering::Relaxed) {
                    pair.compare_exchange(
                        (i, !i),
                        (i + 1, !(i + 1)),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .unwrap();
                    i += 1;
                }
            });
            // Stop the writer before judging, so a failure cannot leave it spinning.
            let torn = (|| {
                let (mut last, mut changes) = (0, 0);
                while changes < CHANGES {
                    let (tag, word) = v.load(&pair);
                    if word != !tag || tag < last {
                        return Some((last, tag, word));
                    }
                    changes += usize::from(tag != last);
                    last = tag;
                }
                None
            })();
            done.store(true, Ordering::Relaxed);
            assert_eq!(torn, None, "(last tag, tag, word): a torn or stale load");
        });
    }
}
