//! Housekeeping with no thread: the steps new states take (a sweep now and then, a walk at
//! the cap), and the sweeps a caller or a sweeper thread asks for.

use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::{Limiter, clamp_now};
use crate::clock::Clock;
use crate::store::Store;
use crate::sweep::{self, Sweep, Sweeper};

/// How long a walk at the cap that freed nothing is trusted at most (see
/// [`Limiter::reclaim_at_cap`]): 100 ms. A call racing the walk (an insert behind it, a
/// refund) can leave a state that goes stale before the moment the walk noted; the next walk,
/// at most this much later, finds it.
const RECLAIM_EVERY_NS: u64 = 100_000_000;

/// [`Limiter::stale_from`] while a walk at the cap runs: later than any moment, so other new
/// states at the cap are denied meanwhile, as when a walk has just found nothing.
const WALKING: u64 = u64::MAX;

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// One bounded sweep step: shards from where the last step stopped, until at least `budget`
    /// states were visited (and every expired penalty). Returns the number of states removed.
    ///
    /// Contention: takes each visited shard's write lock in turn.
    pub fn sweep_once(&self, budget: usize) -> usize {
        let now = clamp_now(self.clock.now());
        // Judged `sweep_grace` in the past: a check holding an older clock reading would
        // otherwise find a fresh state where the removed one still counted.
        let fresh = self.fresh(self.book.current(), now, false);
        self.penalties.sweep(fresh.now);
        self.counters.sweep_step();
        let removed = on_store!(&self.store, s => sweep::sweep_once(s, &self.sweep_cursor, fresh, budget, |r| {
            self.counters.swept(r)
        })
        .1);
        #[cfg(feature = "tracing")]
        tracing::debug!(target: "tollgate", removed, keys = self.len(), "sweep step");
        removed
    }
    /// Sweeps every shard once; returns the number of states removed.
    pub fn sweep_now(&self) -> usize {
        self.sweep_once(usize::MAX)
    }
    /// Starts a background [`Sweeper`] that sweeps every `interval`.
    pub fn start_sweeper(self: &Arc<Self>, interval: Duration) -> Sweeper {
        Sweeper::start(Arc::downgrade(self), interval)
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// A call is about to create a state (no store lock held): counts it, and every
    /// `housekeep_every`-th one sweeps one shard (see [`Builder::housekeeping`]).
    #[inline]
    pub(crate) fn new_state_seen(&self) {
        if self.housekeep_every == 0 {
            return;
        }
        // Relaxed: a count that only paces the step.
        let n = self.new_states.fetch_add(1, crate::sync::Ordering::Relaxed);
        if n % self.housekeep_every == self.housekeep_every - 1 {
            self.housekeep();
        }
    }

    /// A new state found the table at the cap and no fresh state near its slot: walks the
    /// shards from the sweep cursor, sweeping each, until one frees a state (true: the insert
    /// is worth another try), so a stale state anywhere in the table makes room, with or
    /// without housekeeping. Only with eviction (`OnFull::EvictFresh`, the default).
    ///
    /// A walk that frees nothing has swept every shard and noted the earliest moment a state
    /// it kept can go stale ([`Fresh::next`](crate::store::Fresh::next)); until then (for at
    /// most [`RECLAIM_EVERY_NS`]) a new state at the cap is denied after one load, so a table
    /// full of live state, flooded with new keys, costs a walk when a state may have gone
    /// stale, not one per key. A walk
    /// that freed a state leaves the next one free to run (it continues from the cursor, where
    /// the stale states not yet swept are). One walk at a time: a new state at the cap while
    /// one runs is denied, as if it came just before the walk freed anything.
    #[cold]
    pub(crate) fn reclaim_at_cap(&self, now: u64) -> bool {
        use crate::sync::Ordering::{Acquire, Relaxed, Release};
        if !self.evicts {
            return false;
        }
        let judged = now.saturating_sub(self.sweep_grace_ns);
        // Relaxed: a hint that only spares walks; each removal is exact by itself.
        if judged < self.stale_from.load(Relaxed) {
            return false;
        }
        // Acquire/Release: only makes one walk run at a time, so only one thread writes
        // WALKING and then replaces it.
        if self.reclaiming.swap(true, Acquire) {
            return false;
        }
        // Relaxed (both): one variable, whose modification order is all that matters: if a
        // removal stores 0 after WALKING, the walk's exchange below fails and 0 stays.
        self.stale_from.store(WALKING, Relaxed);
        let next = std::cell::Cell::new(u64::MAX);
        let fresh = crate::store::Fresh {
            next: Some(&next),
            ..self.fresh(self.book.current(), now, false)
        };
        self.counters.sweep_step();
        let removed = on_store!(&self.store, s => sweep::sweep_until(
            s,
            &self.sweep_cursor,
            fresh,
            |_, removed| removed > 0,
            |r| self.counters.swept(r),
        )
        .1);
        let stale_from = if removed == 0 {
            next.get().min(judged.saturating_add(RECLAIM_EVERY_NS))
        } else {
            0
        };
        let _ = self
            .stale_from
            .compare_exchange(WALKING, stale_from, Relaxed, Relaxed);
        self.reclaiming.store(false, Release);
        #[cfg(feature = "tracing")]
        tracing::debug!(target: "tollgate", removed, "walk at the cap");
        removed > 0
    }

    /// A state that may not be stale was removed (`reset`, a plan change's move): a new one in
    /// its place may go stale before the moment the last walk at the cap noted, so the next
    /// new state at the cap walks again.
    pub(crate) fn forget_stale_from(&self) {
        // Relaxed: see `stale_from`; a load first, so a table below the cap writes nothing.
        if self.stale_from.load(crate::sync::Ordering::Relaxed) != 0 {
            self.stale_from.store(0, crate::sync::Ordering::Relaxed);
        }
    }

    #[cold]
    fn housekeep(&self) {
        // Acquire/Release: only makes one step run at a time; the sweep synchronises itself.
        if self.housekeeping.swap(true, crate::sync::Ordering::Acquire) {
            return;
        }
        self.sweep_once(1);
        self.housekeeping
            .store(false, crate::sync::Ordering::Release);
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Sweep for Limiter<K, C> {
    fn sweep_all(&self) -> usize {
        self.sweep_now()
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// States held in each shard of the map, in shard order (for the hash-flood test: how
    /// evenly the per-process random hasher spreads keys an attacker chose).
    ///
    /// Contention: takes each shard's read lock in turn.
    #[doc(hidden)]
    pub fn shard_loads(&self) -> Vec<usize> {
        on_store!(&self.store, s => (0..s.shards()).map(|i| s.shard_len(i)).collect())
    }
}
