//! The one facade for every atomic and lock in the engine.
//!
//! Nothing else in `src/` names `std::sync::atomic`: under `--cfg turnstile_loom` these names
//! switch to loom's model-checked versions, so a loom model sees every atomic operation the engine
//! performs. Keep it that way: a raw `std` atomic elsewhere is invisible to the model checker.

#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(turnstile_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// A process-wide counter that no model needs to see (statics cannot hold loom atomics): only the
/// round-robin assignment of stats stripes to threads uses it.
pub(crate) use std::sync::atomic::AtomicUsize as StaticAtomicUsize;

#[cfg(turnstile_loom)]
pub(crate) use loom::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
#[cfg(turnstile_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard, RwLock};

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
