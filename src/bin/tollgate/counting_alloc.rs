//! A counting global allocator, for measuring bytes per key: the `tollgate` program's, and the
//! tests' and benches' (which include this file with `#[path]`). Not part of the library, so it
//! cannot use the library's `sync` facade; its atomics live in statics, which cannot hold loom's
//! atomics anyway, and no loom model builds this program.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize as StaticAtomicUsize, Ordering};

/// Bytes currently allocated through a [`CountingAllocator`].
static LIVE_BYTES: StaticAtomicUsize = StaticAtomicUsize::new(0);
/// Allocation calls made through a [`CountingAllocator`].
static ALLOCATIONS: StaticAtomicUsize = StaticAtomicUsize::new(0);

/// The system allocator, counting live bytes and allocation calls.
///
/// Install it with `#[global_allocator] static ALLOC: CountingAllocator = CountingAllocator;`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CountingAllocator;

impl CountingAllocator {
    /// Bytes allocated and not yet freed.
    #[allow(dead_code)] // not every includer measures bytes
    pub fn live_bytes() -> usize {
        // Relaxed: a statistic; every update is one RMW, so none is lost.
        LIVE_BYTES.load(Ordering::Relaxed)
    }
    /// Allocation calls so far (alloc, alloc_zeroed and realloc).
    #[allow(dead_code)] // not every includer counts calls
    pub fn allocations() -> usize {
        ALLOCATIONS.load(Ordering::Relaxed)
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the counters
// are bookkeeping only and never affect what is returned.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we forward.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            // Relaxed (all counters): statistics, see `live_bytes`.
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract of `GlobalAlloc::alloc_zeroed`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract of `GlobalAlloc::dealloc`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded contract of `GlobalAlloc::realloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(new_size, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }
}
