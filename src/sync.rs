//! The one facade for every atomic and lock in the engine.
//!
//! Nothing else in `src/` names `std::sync::atomic`: under `--cfg turnstile_loom` these names
//! switch to loom's model-checked versions, so a loom model sees every atomic operation the engine
//! performs. Keep it that way: a raw `std` atomic elsewhere is invisible to the model checker.

#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A process-wide lock that no model needs to see: only the hand-out of stats stripe indices to
/// threads (once per thread start and exit) uses it. Under loom every model thread shares one
/// OS thread's index and counts on the shared stripe, so the models lose nothing.
pub(crate) use std::sync::Mutex as StaticMutex;
/// A process-wide counter that no model needs to see (statics cannot hold loom atomics): only the
/// counting allocator uses it.
pub(crate) use std::sync::atomic::AtomicUsize as StaticAtomicUsize;

#[cfg(turnstile_loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(turnstile_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, recovering the data if a panicking thread poisoned it.
///
/// Every structure behind a mutex in this crate is valid after any partial update (a log of
/// timestamps, a sweeper flag), so poisoning carries no information worth propagating.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(not(turnstile_loom))]
    {
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(turnstile_loom)]
    {
        m.lock().unwrap()
    }
}

/// Takes `l`'s read lock, recovering from poisoning (see [`lock`]).
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    #[cfg(not(turnstile_loom))]
    {
        l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(turnstile_loom)]
    {
        l.read().unwrap()
    }
}

/// Takes `l`'s write lock, recovering from poisoning (see [`lock`]).
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    #[cfg(not(turnstile_loom))]
    {
        l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    #[cfg(turnstile_loom)]
    {
        l.write().unwrap()
    }
}

/// A 16-byte atomic: a (tag, word) pair read and compare-and-swapped as one, so a swap that
/// expects one key's tag can never land on a slot that another key has taken since (no ABA).
///
/// On x86_64 this is `cmpxchg16b` for the swap and, on CPUs with AVX, one `vmovdqa` for the load
/// (a plain read: a denial writes nothing); portable-atomic picks them at run time and falls back
/// to a lock elsewhere. Under loom it is a mutex around the pair, which loom explores like any
/// other synchronisation.
pub(crate) struct AtomicPair {
    #[cfg(not(turnstile_loom))]
    v: portable_atomic::AtomicU128,
    #[cfg(turnstile_loom)]
    v: loom::sync::Mutex<u128>,
}

impl AtomicPair {
    /// A pair holding `(tag, word)`.
    #[cfg_attr(not(turnstile_loom), allow(dead_code))]
    pub(crate) fn new(tag: u64, word: u64) -> Self {
        let v = pack(tag, word);
        AtomicPair {
            #[cfg(not(turnstile_loom))]
            v: portable_atomic::AtomicU128::new(v),
            #[cfg(turnstile_loom)]
            v: loom::sync::Mutex::new(v),
        }
    }

    /// Both halves at one instant, as `(tag, word)`.
    #[inline]
    pub(crate) fn load(&self, order: Ordering) -> (u64, u64) {
        #[cfg(not(turnstile_loom))]
        let v = self.v.load(order);
        #[cfg(turnstile_loom)]
        let v = {
            let _ = order;
            *self.v.lock().unwrap()
        };
        unpack(v)
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
        let (current, new) = (pack(current.0, current.1), pack(new.0, new.1));
        #[cfg(not(turnstile_loom))]
        {
            self.v
                .compare_exchange(current, new, success, failure)
                .map(drop)
                .map_err(unpack)
        }
        #[cfg(turnstile_loom)]
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

/// The tag is the low half, the word the high half.
#[inline]
fn pack(tag: u64, word: u64) -> u128 {
    (u128::from(word) << 64) | u128::from(tag)
}

#[inline]
fn unpack(v: u128) -> (u64, u64) {
    (v as u64, (v >> 64) as u64)
}
