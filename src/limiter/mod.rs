//! The public face: builder, checks, plans, penalties, sweeping, stats. The plans and their rule
//! table are in [`book`], the charge path and compound limits in [`charge`], penalties in
//! [`penalty`].

/// Runs `$body` with `$s` bound to whichever store `$map` holds.
macro_rules! on_store {
    ($map:expr, $s:ident => $body:expr) => {
        match $map {
            $crate::limiter::Map::Dash($s) => $body,
            $crate::limiter::Map::Flat($s) => $body,
        }
    };
}

mod backend;
mod book;
mod builder;
// Before the modules that add more of `Limiter`'s methods: rustdoc lists them in this order.
mod calls;
mod charge;
mod cross;
mod decided;
#[cfg(feature = "http")]
mod detailed;
mod engine;
#[cfg(feature = "redis")]
mod exact;
mod housekeeping;
mod observe;
mod penalty;
#[cfg(feature = "redis")]
mod synced;
#[cfg(any(test, tollgate_loom))]
mod testing;
#[cfg(not(feature = "redis"))]
mod twins;

use std::hash::Hash;
use std::time::Duration;

pub use crate::plan::{MAX_PARTS, Plan, PlanId, Strategy};
pub use builder::{Builder, MAX_SHARDS};
pub use cross::{Bound, Part, check_all};
#[cfg(feature = "http")]
pub(crate) use decided::{Decided, Time};
#[cfg(feature = "http")]
pub(crate) use detailed::Detailed;
#[cfg(feature = "http")]
pub(crate) use engine::{Limits, all_or_nothing};

use crate::cell::Mode;
use crate::clock::{Clock, MonotonicClock, nanos};
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::stats::{Count, Counters};
use crate::store::{DashStore, FlatStore, Full, OnFull, Store, StoreKind};
use crate::sync::AtomicUsize;
use backend::Backend;
use book::{Book, Books, Compiled, Short, Words};
use charge::Call;
use engine::Request;
use penalty::Penalties;

/// A keyed rate limiter: any `K: Hash + Eq` (u64, `IpAddr`, `String`, tuples for composite keys).
///
/// Every (key, rule) has its own state: a key checked under several plans keeps one state per
/// distinct quota, so no plan ever admits above its own bound, whatever other plans share the
/// key. On the default flat store, a check of a known state is lock-free (one compare-and-swap
/// when admitted, a plain load when denied).
///
/// Changing a plan on a live limiter ([`set_plan`](Self::set_plan)) keeps what keys have spent
/// under it: a part whose quota changed starts, for each key, from the key's state under the
/// part's previous quota, carried over lazily on the key's next call (a bucket keeps its debt in
/// units, re-measured in the new emission interval and capped at the new burst; a window keeps
/// its counts; a log keeps its entries; a part whose algorithm changes starts fresh, except
/// between the token and the leaky bucket, one automaton, which keep the debt). The carry
/// is a copy, made once, only along a plan's own changes: two live plans never carry state into
/// each other.
///
/// ```
/// use tollgate::{FakeClock, Limiter, Quota};
/// let clock = FakeClock::new();
/// let limiter = Limiter::<&str>::builder()
///     .quota(Quota::per_second(1).burst(2))
///     .clock(clock.clone())
///     .build()
///     .unwrap();
/// assert!(limiter.check(&"alice").is_allowed());
/// assert!(limiter.check(&"alice").is_allowed());
/// let denied = limiter.check(&"alice");
/// assert!(!denied.is_allowed());
/// assert_eq!(denied.retry_after().as_millis(), 1000);
/// ```
pub struct Limiter<K, C = MonotonicClock> {
    store: Map<K>,
    book: Books,
    /// The plans as configured, for rebuilding the book on a change.
    plans: crate::sync::Mutex<Vec<(String, Plan)>>,
    penalties: Penalties<K>,
    clock: C,
    counters: Counters,
    sweep_cursor: AtomicUsize,
    full_retry_ns: u64,
    /// Sweeping and eviction judge freshness this long in the past (see `Builder::sweep_grace`).
    sweep_grace_ns: u64,
    /// Calls of [`reset`](Self::reset) so far: a refund across calls ([`Undo`](charge::Undo))
    /// is dropped when a reset came between its charge and it, so it never lands on a state
    /// that the reset started afresh.
    resets: crate::sync::AtomicU64,
    /// States about to be created since the limiter was built: the housekeeping step's clock,
    /// a count that orders nothing (the step it triggers is an ordinary sweep, with the sweep's
    /// own synchronisation).
    new_states: crate::sync::AtomicUsize,
    /// New states between two housekeeping steps; 0 when housekeeping is off.
    housekeep_every: usize,
    /// A housekeeping step is running: the others skip theirs.
    housekeeping: crate::sync::AtomicBool,
    /// Whether a new state at the cap may take a fresh one's place (`OnFull::EvictFresh`).
    evicts: bool,
    /// In process, or through Redis (synced or exact).
    backend: Backend<K>,
    /// A walk of the table for a new state at the cap is running (see
    /// [`reclaim_at_cap`](Self::reclaim_at_cap)): one at a time.
    reclaiming: crate::sync::AtomicBool,
    /// The moment (in sweep terms: clock less the sweep grace) before which no state in the
    /// table can be stale, as the last walk at the cap that freed nothing found it; 0 when
    /// unknown (a walk may free something), [`WALKING`] while a walk runs. A removal that is
    /// not of a stale state (`reset`, a plan change's move) sets it to 0: a state inserted in
    /// its place may go stale sooner.
    stale_from: crate::sync::AtomicU64,
}

impl<K, C: std::fmt::Debug> std::fmt::Debug for Limiter<K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (synced, exact) = (self.backend.is_synced(), self.backend.is_exact());
        let book = self.book.current();
        f.debug_struct("Limiter")
            .field("flat_store", &matches!(self.store, Map::Flat(_)))
            .field(
                "plans",
                &book.plans.iter().map(|p| &p.name).collect::<Vec<_>>(),
            )
            .field("rules", &book.rules.len())
            .field("clock", &self.clock)
            .field("synced", &synced)
            .field("exact", &exact)
            .finish_non_exhaustive()
    }
}

/// The store a limiter was built with (see [`StoreKind`]). One per limiter, built once and
/// never moved on a hot path, so the flat store's size (cache-padded counters) stays inline.
#[allow(clippy::large_enum_variant)]
enum Map<K> {
    Dash(DashStore<K>),
    Flat(FlatStore<K>),
}

impl<K: Hash + Eq + Clone> Map<K> {
    fn new(kind: StoreKind, shards: usize, max_keys: usize, on_full: OnFull) -> Self {
        if kind == StoreKind::Flat {
            if let Some(s) = FlatStore::new(shards, max_keys, on_full) {
                return Map::Flat(s);
            }
        }
        Map::Dash(DashStore::new(shards, max_keys, on_full))
    }
}

/// A soft or shadow strategy lets a request through that its limit denied (see
/// [`Strategy::passes`]), flagged with the strategy's reason.
#[inline(always)]
pub(crate) fn soften(strategy: Strategy, d: &mut Decision) {
    if !d.allowed {
        if let Some(reason) = strategy.passes(d.reason) {
            d.allowed = true;
            d.reason = reason;
        }
    }
}

/// The latest time the algorithms accept: 2^63 - 1 ns (292 years). Later readings (a clock
/// saturated at `u64::MAX`, say) are held there, so no sum of a time and a tolerance can wrap
/// and turn a denial into an admission.
const MAX_NOW_NS: u64 = (1 << 63) - 1;

#[inline]
fn clamp_now(now: u64) -> u64 {
    now.min(MAX_NOW_NS)
}
