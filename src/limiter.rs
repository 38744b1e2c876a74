//! The public face: builder, plans, checks, compound limits, strategies, stats.

use std::collections::HashMap;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use crate::cell::Mode;
use crate::clock::{Clock, MonotonicClock, nanos};
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::quota::{Quota, Rule};
use crate::stats::{Count, Counters, Stats};
use crate::store::flat::Found;
use crate::store::{DashStore, Entry, FlatStore, OnFull, Rules, Store, StoreKind};
use crate::sweep::{self, Sweep, Sweeper};
use crate::sync::{AtomicPtr, AtomicUsize, Ordering};

/// The most quotas one plan may combine (10/s AND 1000/day is two).
pub const MAX_PARTS: usize = 4;

/// What happens to a request over its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Strategy {
    /// Deny it (HTTP 429).
    #[default]
    Hard,
    /// Let it through, flagged as [`Reason::SoftLimit`], charging nothing.
    Soft,
    /// Admit it for a later moment, at most `max_delay` away (the leaky bucket as a queue, nginx
    /// `burst` without `nodelay`); the decision's [`delay`](Decision::delay) says how long to
    /// wait. Window algorithms cannot schedule ahead and admit only what passes now.
    Queue {
        /// The longest wait a request may be given.
        max_delay: Duration,
    },
}

/// A named tier: its quotas (all must pass), what happens over them, and its priority headroom.
///
/// ```
/// use tollgate::{Plan, Quota, Strategy};
/// let pro = Plan::new([Quota::per_second(10), Quota::per_day(1000)]).strategy(Strategy::Soft);
/// assert_eq!(pro.quotas().len(), 2);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    quotas: Vec<Quota>,
    strategy: Strategy,
    headroom: u64,
}

impl Plan {
    /// A plan whose requests must pass every one of `quotas`.
    pub fn new(quotas: impl IntoIterator<Item = Quota>) -> Self {
        Plan {
            quotas: quotas.into_iter().collect(),
            strategy: Strategy::Hard,
            headroom: 0,
        }
    }
    /// What happens over the quota.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }
    /// Priority: this plan's requests are denied while fewer than `units` would remain, keeping
    /// that much of a shared key's quota for higher tiers (give lower tiers larger headroom).
    pub fn headroom(mut self, units: u64) -> Self {
        self.headroom = units;
        self
    }
    /// The quotas.
    pub fn quotas(&self) -> &[Quota] {
        &self.quotas
    }
    /// The strategy.
    pub fn strategy_kind(&self) -> Strategy {
        self.strategy
    }
    /// The headroom.
    pub fn headroom_units(&self) -> u64 {
        self.headroom
    }
}

/// A handle to one of a limiter's plans, resolved once by name with [`Limiter::plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanId(u32);

impl PlanId {
    /// The plan that [`Limiter::check`] uses.
    pub const DEFAULT: PlanId = PlanId(0);
}

/// A plan checked and compiled to integer rules.
struct Compiled {
    name: String,
    rules: Arc<Rules>,
    strategy: Strategy,
    headroom: u64,
    /// The largest cost that can ever pass: the smallest capacity minus the headroom.
    max_cost: u64,
}

impl Compiled {
    fn mode(&self, mode: Mode) -> Mode {
        match (mode, self.strategy) {
            (Mode::Check, Strategy::Queue { max_delay }) => Mode::Reserve(nanos(max_delay)),
            (m, _) => m,
        }
    }
}

/// All plans of a limiter; replaced as a whole (copy on write) when one changes.
struct Book {
    plans: Vec<Compiled>,
    by_name: HashMap<String, PlanId>,
    /// The default plan as the short path serves it (see [`InlinePlan`]).
    inline: Option<InlinePlan>,
}

/// The default plan, when [`Limiter::check_inline`] can serve it: its rules are the flat store's
/// inline rules (one part, whose state is the slot's word) and it is not a queue. Worked out
/// once per book, so a check reads one field of the book where it followed the plan and its
/// rules through four pointers and compared them with the store's.
#[derive(Debug, Clone, Copy)]
struct InlinePlan {
    rule: Rule,
    headroom: u64,
    soft: bool,
}

impl InlinePlan {
    /// `default` as served inline from a flat store whose inline rules are `store`.
    fn of(default: &Compiled, store: Option<&Arc<Rules>>) -> Option<InlinePlan> {
        let served = store.is_some_and(|s| Arc::ptr_eq(&default.rules, s))
            && !matches!(default.strategy, Strategy::Queue { .. });
        if !served {
            return None;
        }
        Some(InlinePlan {
            rule: *default.rules.parts.first()?,
            headroom: default.headroom,
            soft: default.strategy == Strategy::Soft,
        })
    }
}

impl Book {
    fn compile(
        plans: &[(String, Plan)],
        unix_epoch_ns: u64,
        previous: Option<&Book>,
    ) -> Result<Book, Error> {
        let mut compiled: Vec<Compiled> = Vec::with_capacity(plans.len());
        let mut by_name = HashMap::new();
        for (name, plan) in plans {
            if plan.quotas.is_empty() {
                return Err(Error::NoQuota);
            }
            if plan.quotas.len() > MAX_PARTS {
                return Err(Error::Config {
                    line: None,
                    message: format!(
                        "plan '{name}' combines {} quotas; at most {MAX_PARTS}",
                        plan.quotas.len()
                    ),
                });
            }
            let parts = plan
                .quotas
                .iter()
                .map(|q| q.compile(unix_epoch_ns))
                .collect::<Result<Box<[_]>, _>>()?;
            let capacity = parts.iter().map(|r| r.capacity).min().unwrap_or(0);
            if plan.headroom >= capacity {
                return Err(Error::HeadroomTooLarge {
                    plan: name.clone(),
                    headroom: plan.headroom,
                    capacity,
                });
            }
            let rules = Rules { parts };
            // Plans with equal rules share one `Rules`, so a shared key checked under several
            // tiers (the priority strategy) is never migrated back and forth; rules equal to the
            // previous book's are reused so a reload migrates only the keys whose rules changed.
            let shared = compiled
                .iter()
                .map(|c| &c.rules)
                .chain(
                    previous
                        .into_iter()
                        .flat_map(|b| b.plans.iter().map(|c| &c.rules)),
                )
                .find(|r| ***r == rules)
                .cloned();
            let rules = shared.unwrap_or_else(|| Arc::new(rules));
            by_name.insert(name.clone(), PlanId(compiled.len() as u32));
            compiled.push(Compiled {
                name: name.clone(),
                rules,
                strategy: plan.strategy,
                headroom: plan.headroom,
                max_cost: capacity - plan.headroom,
            });
        }
        Ok(Book {
            plans: compiled,
            by_name,
            inline: None,
        })
    }

    #[inline]
    fn get(&self, id: PlanId) -> Result<&Compiled, Error> {
        match self.plans.get(id.0 as usize) {
            Some(plan) => Ok(plan),
            None => Err(unknown_plan(id)),
        }
    }
}

#[cold]
fn unknown_plan(id: PlanId) -> Error {
    Error::UnknownPlan(format!("#{}", id.0))
}

/// The current book behind one plain load.
///
/// Plan changes are rare (a config reload), so every book ever installed is kept until the
/// limiter drops: a reader never needs a reference count or a guard, and a check reads the
/// current book with one Acquire load of a pointer that no core writes on the hot path.
struct Books {
    current: AtomicPtr<Book>,
    /// Owns every installed book, the current one included. Only `install` pushes. The boxes
    /// give each book an address that stays put while the Vec grows.
    #[allow(clippy::vec_box)]
    all: crate::sync::Mutex<Vec<Box<Book>>>,
}

impl Books {
    fn new(book: Book) -> Self {
        let mut first = Box::new(book);
        let current = AtomicPtr::new(&mut *first as *mut Book);
        Books {
            current,
            all: crate::sync::Mutex::new(vec![first]),
        }
    }

    #[inline]
    fn current(&self) -> &Book {
        // Acquire: pairs with the Release store in `install`, so the book's contents, written
        // before it was published, are visible here.
        let p = self.current.load(Ordering::Acquire);
        // SAFETY: `p` points into a Box owned by `all`, which only ever grows and is dropped
        // with `self`; the returned borrow cannot outlive `self`. Books are never mutated after
        // being published.
        unsafe { &*p }
    }

    fn install(&self, book: Book) {
        let mut all = crate::sync::lock(&self.all);
        let mut boxed = Box::new(book);
        let p = &mut *boxed as *mut Book;
        all.push(boxed);
        // Release: pairs with the Acquire load in `current`.
        self.current.store(p, Ordering::Release);
    }
}

/// Builds a [`Limiter`].
pub struct Builder<K, C = MonotonicClock> {
    quotas: Vec<Quota>,
    strategy: Strategy,
    plans: Vec<(String, Plan)>,
    max_keys: usize,
    on_full: OnFull,
    store: StoreKind,
    shards: usize,
    full_retry: Duration,
    sweep_grace: Duration,
    clock: C,
    key: PhantomData<fn(K)>,
}

impl<K, C: Clock> Builder<K, C> {
    /// Adds a quota to the default plan (several quotas: a compound limit on each key).
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }
    /// The default plan's strategy.
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }
    /// Adds a named plan. Without [`quota`](Self::quota) calls, the first plan added is the
    /// default one.
    pub fn plan(mut self, name: impl Into<String>, plan: Plan) -> Self {
        self.plans.push((name.into(), plan));
        self
    }
    /// Adds every plan of a parsed configuration (see [`PlanConfig`](crate::PlanConfig)).
    pub fn plans(mut self, config: crate::plan::PlanConfig) -> Self {
        self.plans.extend(config.into_plans());
        self
    }
    /// The most keys the table holds (default 1,000,000).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }
    /// What to do with a new key when the table is full (default: deny it).
    pub fn on_full(mut self, on_full: OnFull) -> Self {
        self.on_full = on_full;
        self
    }
    /// Which map holds the keys (default [`StoreKind::Flat`]).
    pub fn store(mut self, kind: StoreKind) -> Self {
        self.store = kind;
        self
    }
    /// Number of shards of the map (default: 4 per core, a power of two).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards;
        self
    }
    /// The `retry_after` given to a new key denied because the table is full (default 1 s).
    pub fn full_retry_after(mut self, d: Duration) -> Self {
        self.full_retry = d;
        self
    }
    /// Sweeping and eviction remove only state that was already fresh this long ago (default
    /// 1 s). A check that read its clock before a sweep and runs after it finds a fresh key; the
    /// grace makes that harmless for any check whose clock reading is at most this stale.
    pub fn sweep_grace(mut self, grace: Duration) -> Self {
        self.sweep_grace = grace;
        self
    }
    /// The time source (default [`MonotonicClock`]).
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<K, C2> {
        Builder {
            quotas: self.quotas,
            strategy: self.strategy,
            plans: self.plans,
            max_keys: self.max_keys,
            on_full: self.on_full,
            store: self.store,
            shards: self.shards,
            full_retry: self.full_retry,
            sweep_grace: self.sweep_grace,
            clock,
            key: PhantomData,
        }
    }

    /// Checks every quota and builds the limiter.
    pub fn build(self) -> Result<Limiter<K, C>, Error>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
    {
        if self.max_keys == 0 {
            return Err(Error::ZeroMaxKeys);
        }
        let mut plans = Vec::with_capacity(self.plans.len() + 1);
        if !self.quotas.is_empty() {
            plans.push((
                "default".to_string(),
                Plan::new(self.quotas).strategy(self.strategy),
            ));
        }
        plans.extend(self.plans);
        if plans.is_empty() {
            return Err(Error::NoQuota);
        }
        let mut book = Book::compile(&plans, self.clock.unix_epoch_ns(), None)?;
        let store = Map::new(
            self.store,
            self.shards,
            self.max_keys,
            self.on_full,
            &book.plans[0].rules,
        );
        book.inline = InlinePlan::of(&book.plans[0], store.inline_rules());
        Ok(Limiter {
            store,
            book: Books::new(book),
            plans: crate::sync::Mutex::new(plans),
            clock: self.clock,
            counters: Counters::new(),
            sweep_cursor: AtomicUsize::new(0),
            full_retry_ns: nanos(self.full_retry),
            next_entry_id: crate::sync::AtomicU64::new(1),
            sweep_grace_ns: nanos(self.sweep_grace),
        })
    }
}

/// A keyed rate limiter: any `K: Hash + Eq` (u64, `IpAddr`, `String`, tuples for composite keys).
///
/// Checks of existing keys are lock-free at the cell (one compare-and-swap when admitted, a plain
/// load when denied); the map itself is a sharded `DashMap`.
///
/// Changing quotas on a live limiter ([`set_plan`](Self::set_plan)) keeps what keys have spent:
/// a bucket keeps its debt in units (re-measured in the new emission interval, capped at the new
/// burst); a window keeps its counts (moved into the new current window when the period changes);
/// a log keeps its entries. A part whose algorithm changes starts fresh. Keys move to the new
/// rules lazily, on their next check.
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
    clock: C,
    counters: Counters,
    sweep_cursor: AtomicUsize,
    full_retry_ns: u64,
    /// The next `Entry::id`.
    next_entry_id: crate::sync::AtomicU64,
    /// Sweeping and eviction judge freshness this long in the past (see `Builder::sweep_grace`).
    sweep_grace_ns: u64,
}

/// The store a limiter was built with (see [`StoreKind`]).
enum Map<K> {
    Dash(DashStore<K>),
    Flat(FlatStore<K>),
}

/// Runs `$body` with `$s` bound to whichever store `$map` holds.
macro_rules! on_store {
    ($map:expr, $s:ident => $body:expr) => {
        match $map {
            Map::Dash($s) => $body,
            Map::Flat($s) => $body,
        }
    };
}

impl<K: Hash + Eq + Clone> Map<K> {
    fn new(
        kind: StoreKind,
        shards: usize,
        max_keys: usize,
        on_full: OnFull,
        default: &Arc<Rules>,
    ) -> Self {
        let inline = matches!(&*default.parts, [rule] if rule.kind != crate::quota::Kind::Log);
        if kind == StoreKind::Flat && inline {
            if let Some(s) = FlatStore::new(shards, max_keys, on_full, Arc::clone(default)) {
                return Map::Flat(s);
            }
        }
        Map::Dash(DashStore::new(shards, max_keys, on_full))
    }

    /// The rules the store serves inline: the flat store's; none for the dash store.
    fn inline_rules(&self) -> Option<&Arc<Rules>> {
        match self {
            Map::Flat(s) => Some(s.rules()),
            Map::Dash(_) => None,
        }
    }
}

impl<K> Limiter<K, MonotonicClock> {
    /// A builder with no quota, the monotonic clock, 1,000,000 keys at most, new keys denied when
    /// full.
    pub fn builder() -> Builder<K, MonotonicClock> {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        Builder {
            quotas: Vec::new(),
            strategy: Strategy::Hard,
            plans: Vec::new(),
            max_keys: 1_000_000,
            on_full: OnFull::Deny,
            store: StoreKind::default(),
            shards: cores * 4,
            full_retry: Duration::from_secs(1),
            sweep_grace: Duration::from_secs(1),
            clock: MonotonicClock::new(),
            key: PhantomData,
        }
    }
}

/// What the caller already knows of a key's place in the flat store, at the decision's `now`.
#[derive(Debug, Clone, Copy)]
enum Seen {
    /// Nothing: the general path hashes the key and probes.
    Nothing,
    /// The key's hash.
    Hash(u64),
    /// The key's hash, and a probe found no slot for it.
    Absent(u64),
}

/// A soft strategy lets an over-quota request through, flagged.
#[inline(always)]
fn soften(plan: &Compiled, d: &mut Decision) {
    if plan.strategy == Strategy::Soft {
        soften_limited(d);
    }
}

/// [`soften`] under a soft strategy: an over-quota denial passes, flagged.
#[inline(always)]
fn soften_limited(d: &mut Decision) {
    if !d.allowed && d.reason == Reason::Limited {
        d.allowed = true;
        d.reason = Reason::SoftLimit;
    }
}

/// Undo information for a charged key: one refund token per part.
#[derive(Debug, Clone, Copy, Default)]
struct Tokens {
    cells: [Option<u64>; MAX_PARTS],
    /// The charged entry's incarnation (`Entry::id`).
    entry: u64,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// Checks one unit for `key` under the default plan.
    // Always inlined: the short path is small (the rest is out of line in `check_general`), and
    // inlined into its caller it drops the work for the decision's fields the caller never
    // reads. A caller that LLVM chose not to inline it into, one thread denying one hot key:
    // 19.9 -> 17.0 ns a check (2-core Intel VM); the harness, which inlined it already, is
    // unchanged.
    #[inline(always)]
    pub fn check(&self, key: &K) -> Decision {
        match &self.store {
            Map::Flat(s) => {
                let hash = s.hash(key);
                let now = clamp_now(self.clock.now());
                match self.check_inline(s, hash, now) {
                    Ok(d) => d,
                    Err(seen) => self.check_general(key, seen, now),
                }
            }
            Map::Dash(_) => self.check_general(key, Seen::Nothing, clamp_now(self.clock.now())),
        }
    }

    /// [`check`](Self::check) on the general path (out of line, so the short one stays small).
    #[inline(never)]
    fn check_general(&self, key: &K, seen: Seen, now: u64) -> Decision {
        self.decide_at(key, seen, PlanId::DEFAULT, 1, Mode::Check, now)
            .unwrap_or_else(|_| Decision::denied(Reason::Limited, 0))
    }

    /// The shortest path, for [`check`](Self::check) and [`check_many`](Self::check_many): one
    /// unit under the default plan at `now` for a key whose state is inline in its flat-store
    /// slot. The same decision, state and count as [`decide_at`](Self::decide_at) (a cost of one
    /// always fits a plan, and only a queue strategy changes the mode); `Err` when it does not
    /// apply (a new or spilled key, a default plan the slots do not hold, a queue strategy, a
    /// slot removed under us), having changed nothing: the caller takes the general path, at
    /// the same `now`, with what the probe saw (a new key's insert then skips a second probe).
    ///
    /// The clock is read before the probe: on this path the TSC read costs about as much as
    /// everything else, and issued first it overlaps the probe's loads and the GCRA test, where
    /// read after the slot it waited for them (measured on the 2-core Intel VM, one thread, with
    /// the probe's branch-free scan of the home group: a denial of one hot key 21.4 -> 18.1 ns,
    /// of random keys among 1,000 30.3 -> 27.0 ns). It is also the order a key that threads are
    /// admitting on at once wants: the slot's line is fetched just before the swap, not before a
    /// clock read that gives another core time to take it.
    #[inline(always)]
    fn check_inline(&self, s: &FlatStore<K>, hash: u64, now: u64) -> Result<Decision, Seen> {
        let general = Seen::Hash(hash);
        let plan = self.book.current().inline.as_ref().ok_or(general)?;
        let (slot, tag, word) = match s.find(hash) {
            Found::Inline { slot, tag, word } => (slot, tag, word),
            Found::Absent => return Err(Seen::Absent(hash)),
            Found::Spilled => return Err(general),
        };
        let slot = crate::cell::Inline { slot, tag };
        let tally = self.counters.tally();
        let a =
            crate::cell::apply_inline(&slot, word, now, 1, &plan.rule, plan.headroom, Mode::Check)
                .ok_or(general)?;
        let mut d = a.decision;
        // An inline key's denial is over quota (`Reason::Limited`): a new key's table-full
        // denial and a blocked key's are decided on the general path.
        let count = if d.allowed {
            Count::Allowed
        } else if plan.soft {
            soften_limited(&mut d);
            Count::of(&d)
        } else {
            Count::Denied
        };
        debug_assert_eq!(count, Count::of(&d));
        tally.add(count, a.retries);
        Ok(d)
    }

    /// Where `key` sits in the flat store, for tests (see `FlatStore::placement`).
    #[cfg(test)]
    pub(crate) fn placement(&self, key: &K) -> Option<(usize, bool)> {
        match &self.store {
            Map::Flat(s) => s.placement(s.hash(key)),
            Map::Dash(_) => None,
        }
    }

    /// Makes the flat store's sweeps remove keys one `cmpxchg16b` at a time, as on a CPU
    /// without RTM, for tests of that path.
    #[cfg(test)]
    pub(crate) fn without_rtm(mut self) -> Self {
        if let Map::Flat(s) = &mut self.store {
            s.without_rtm();
        }
        self
    }

    /// For tests of the flat store's sweep: (whether it removes in transactions, removals of
    /// fresh-looking keys that a charge beat so far); `None` on the dash store.
    #[cfg(test)]
    pub(crate) fn sweep_races(&self) -> Option<(bool, usize)> {
        match &self.store {
            Map::Flat(s) => Some((s.uses_rtm(), s.lost_removals())),
            Map::Dash(_) => None,
        }
    }

    /// For tests of the flat store's pass counts (see `FlatStore::wrong_pass_counts`): the
    /// groups whose count is wrong, and the largest count; `None` on the dash store.
    #[cfg(test)]
    pub(crate) fn pass_counts(&self) -> Option<(Vec<crate::store::flat::WrongPassCount>, u8)> {
        match &self.store {
            Map::Flat(s) => Some((s.wrong_pass_counts(), s.max_pass_count())),
            Map::Dash(_) => None,
        }
    }

    /// The address of the flat store's first slot, for tests; `None` on the dash store.
    #[cfg(test)]
    pub(crate) fn table_address(&self) -> Option<usize> {
        match &self.store {
            Map::Flat(s) => Some(s.table_address()),
            Map::Dash(_) => None,
        }
    }

    /// Makes the flat store's probe and sweep load slots through portable-atomic, as on a CPU
    /// without the inline `vmovdqa`, for tests of that path.
    #[cfg(test)]
    pub(crate) fn without_inline_load(mut self) -> Self {
        if let Map::Flat(s) = &mut self.store {
            s.without_inline_load();
        }
        self
    }

    /// Checks `cost` units for `key` under the default plan. A cost above what the plan can ever
    /// admit is an error, not a denial.
    pub fn check_n(&self, key: &K, cost: u64) -> Result<Decision, Error> {
        self.decide(key, PlanId::DEFAULT, cost, Mode::Check)
    }

    /// Checks `cost` units for `key` under `plan` (resolved per request, e.g. from the caller's
    /// account), with that plan's strategy.
    pub fn check_in(&self, key: &K, plan: PlanId, cost: u64) -> Result<Decision, Error> {
        self.decide(key, plan, cost, Mode::Check)
    }

    /// Checks one unit for each of `keys` under the default plan, writing the decision for
    /// `keys[i]` to `out[i]`; returns how many were checked (the shorter of the two lengths).
    ///
    /// The same decisions as calling [`check`](Self::check) in order; for callers holding many
    /// requests at once (a batch from a socket, a queue), whose table lookups can overlap.
    ///
    /// ```
    /// use tollgate::{Decision, FakeClock, Limiter, Quota};
    /// let limiter = Limiter::<u64, _>::builder()
    ///     .quota(Quota::per_second(1))
    ///     .clock(FakeClock::new())
    ///     .build()?;
    /// let keys = [1, 2, 1];
    /// let mut out = [limiter.peek(&0); 3];
    /// assert_eq!(limiter.check_many(&keys, &mut out), 3);
    /// let allowed: Vec<bool> = out.iter().map(Decision::is_allowed).collect();
    /// assert_eq!(allowed, [true, true, false]);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    ///
    /// With the flat store, a batch hashes a chunk of keys and asks the CPU to fetch each one's
    /// slot before checking the first, so the cache misses of a large table overlap instead of
    /// following one another. Each chunk is checked at one clock reading.
    pub fn check_many(&self, keys: &[K], out: &mut [Decision]) -> usize {
        /// Keys whose slots are in flight at once: enough to cover a DRAM miss with the work of
        /// the checks before it, few enough for the CPU's line fill buffers.
        const CHUNK: usize = 16;
        let n = keys.len().min(out.len());
        let Map::Flat(s) = &self.store else {
            for (key, d) in keys[..n].iter().zip(&mut out[..n]) {
                *d = self.check(key);
            }
            return n;
        };
        let mut hashes = [0u64; CHUNK];
        for (keys, out) in keys[..n].chunks(CHUNK).zip(out[..n].chunks_mut(CHUNK)) {
            for (h, key) in hashes.iter_mut().zip(keys) {
                *h = s.hash(key);
                s.prefetch(*h);
            }
            let now = clamp_now(self.clock.now());
            for ((key, d), h) in keys.iter().zip(out).zip(hashes) {
                *d = match self.check_inline(s, h, now) {
                    Ok(d) => d,
                    Err(seen) => self.check_general(key, seen, now),
                };
            }
        }
        n
    }

    /// What [`check`](Self::check) would answer, charging nothing and inserting nothing.
    pub fn peek(&self, key: &K) -> Decision {
        self.decide(key, PlanId::DEFAULT, 1, Mode::Peek)
            .unwrap_or_else(|_| Decision::denied(Reason::Limited, 0))
    }

    /// What [`check_in`](Self::check_in) would answer, charging nothing.
    pub fn peek_in(&self, key: &K, plan: PlanId, cost: u64) -> Result<Decision, Error> {
        self.decide(key, plan, cost, Mode::Peek)
    }

    /// Reserves `cost` units for a moment at most `max_delay` away: the decision's
    /// [`delay`](Decision::delay) says how long to wait before proceeding. Bucket algorithms
    /// schedule ahead; window algorithms admit only what passes now.
    pub fn reserve(&self, key: &K, cost: u64, max_delay: Duration) -> Result<Decision, Error> {
        self.decide(key, PlanId::DEFAULT, cost, Mode::Reserve(nanos(max_delay)))
    }

    /// [`reserve`](Self::reserve) under `plan`.
    pub fn reserve_in(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
        max_delay: Duration,
    ) -> Result<Decision, Error> {
        self.decide(key, plan, cost, Mode::Reserve(nanos(max_delay)))
    }

    /// The plan called `name`.
    pub fn plan(&self, name: &str) -> Option<PlanId> {
        self.book.current().by_name.get(name).copied()
    }

    /// The names of the plans, in [`PlanId`] order.
    pub fn plan_names(&self) -> Vec<String> {
        self.book
            .current()
            .plans
            .iter()
            .map(|p| p.name.clone())
            .collect()
    }

    /// Forgets `key` entirely (back to fresh). True if it was tracked.
    ///
    /// Contention: takes the key's shard write lock.
    pub fn reset(&self, key: &K) -> bool {
        on_store!(&self.store, s => s.remove(key))
    }

    /// A penalty: `key` is denied for `duration` from now, whatever its quota says (an existing
    /// longer penalty stays). False when the key is new and the table is full.
    pub fn block(&self, key: &K, duration: Duration) -> bool {
        let now = clamp_now(self.clock.now());
        let until = now.saturating_add(nanos(duration));
        let book = self.book.current();
        let Ok(plan) = book.get(PlanId::DEFAULT) else {
            return false;
        };
        on_store!(&self.store, s => s
            .with_or_insert(
                key,
                || Entry::fresh(&plan.rules, self.next_entry_id()),
                |e| self.evictable(e, now),
                // Relaxed: see `Entry::blocked_until`; fetch_max keeps the later deadline.
                |e| {
                    e.blocked_until
                        .fetch_max(until, crate::sync::Ordering::Relaxed)
                },
            )
            .is_ok())
    }

    /// Adds or replaces the plan called `name` on the live limiter; see the type's docs for what
    /// happens to keys already tracked. `"default"` is the plan [`check`](Self::check) uses.
    ///
    /// Contention: serialised with other plan changes; checks are never blocked.
    pub fn set_plan(&self, name: &str, plan: Plan) -> Result<PlanId, Error> {
        let mut plans = crate::sync::lock(&self.plans);
        let mut next = plans.clone();
        match next.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = plan,
            None => next.push((name.to_string(), plan)),
        }
        let mut book = Book::compile(&next, self.clock.unix_epoch_ns(), Some(self.book.current()))?;
        book.inline = InlinePlan::of(&book.plans[0], self.store.inline_rules());
        let id = book.by_name[name];
        self.book.install(book);
        *plans = next;
        Ok(id)
    }

    /// Which store this limiter runs on: the one asked for, or [`StoreKind::Dash`] where the
    /// flat store cannot serve the configuration (see [`StoreKind::Flat`]).
    pub fn store_kind(&self) -> StoreKind {
        match self.store {
            Map::Dash(_) => StoreKind::Dash,
            Map::Flat(_) => StoreKind::Flat,
        }
    }

    /// Bytes the store holds outside the global allocator: the flat store's slot table (mapped
    /// from the operating system, resident only where keys landed); 0 for the dash store. Add it
    /// to what a counting allocator reports for the whole footprint.
    pub fn table_bytes(&self) -> usize {
        match &self.store {
            Map::Dash(_) => 0,
            Map::Flat(s) => s.table_bytes(),
        }
    }

    /// Keys tracked now.
    pub fn len(&self) -> usize {
        on_store!(&self.store, s => s.len())
    }

    /// True when no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters (cheap: sums a few cache lines).
    pub fn stats(&self) -> Stats {
        self.counters.snapshot(self.len())
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// One bounded sweep step: shards from where the last step stopped, until at least `budget`
    /// entries were visited. Returns the number of keys removed.
    ///
    /// Contention: takes each visited shard's write lock in turn.
    pub fn sweep_once(&self, budget: usize) -> usize {
        // Judge freshness `sweep_grace` in the past: a check holding an older clock reading
        // would otherwise find a fresh key where the removed state still counted.
        let now = clamp_now(self.clock.now()).saturating_sub(self.sweep_grace_ns);
        on_store!(&self.store, s => sweep::sweep_once(s, &self.sweep_cursor, now, budget, |r| {
            self.counters.swept(r)
        })
        .1)
    }

    /// Sweeps every shard once; returns the number of keys removed.
    pub fn sweep_now(&self) -> usize {
        self.sweep_once(usize::MAX)
    }

    /// Starts a background [`Sweeper`] that sweeps every `interval`.
    pub fn start_sweeper(self: &Arc<Self>, interval: Duration) -> Sweeper {
        Sweeper::start(Arc::downgrade(self), interval)
    }

    /// Heap bytes held by per-key state beyond the map's own slots (logs, compound cells).
    pub fn state_heap_bytes(&self) -> usize {
        on_store!(&self.store, s => s.sum_entries(Entry::heap_bytes))
    }

    /// Binds `key` (under the default plan) for [`check_all`].
    pub fn key<'a>(&'a self, key: &'a K) -> Bound<'a, K, C> {
        Bound {
            limiter: self,
            key,
            plan: PlanId::DEFAULT,
        }
    }

    /// Binds `key` under `plan` for [`check_all`].
    pub fn key_in<'a>(&'a self, key: &'a K, plan: PlanId) -> Bound<'a, K, C> {
        Bound {
            limiter: self,
            key,
            plan,
        }
    }

    /// The denial of a new key when the table is full.
    fn table_full(&self, plan: &Compiled) -> Decision {
        Decision {
            limit: plan.rules.parts[0].capacity,
            ..Decision::denied(Reason::TableFull, self.full_retry_ns)
        }
    }

    /// A new entry incarnation id (only on insertion, never on the hot path of a known key).
    fn next_entry_id(&self) -> u64 {
        // Relaxed: only uniqueness matters, and fetch_add gives it.
        self.next_entry_id.fetch_add(1, Ordering::Relaxed)
    }

    fn evictable(&self, e: &Entry, now: u64) -> bool {
        let fresh = e.is_fresh(now.saturating_sub(self.sweep_grace_ns));
        if fresh {
            self.counters.evicted();
        }
        fresh
    }

    /// The whole decision path: plan, cost, strategy, entry, cells, stats.
    #[inline(always)]
    fn decide(&self, key: &K, plan: PlanId, cost: u64, mode: Mode) -> Result<Decision, Error> {
        let now = clamp_now(self.clock.now());
        self.decide_at(key, Seen::Nothing, plan, cost, mode, now)
    }

    /// [`decide`](Self::decide) at `now`, with what a probe of the flat store already saw.
    #[inline(always)]
    fn decide_at(
        &self,
        key: &K,
        seen: Seen,
        plan: PlanId,
        cost: u64,
        mode: Mode,
        now: u64,
    ) -> Result<Decision, Error> {
        let book = self.book.current();
        let plan = book.get(plan)?;
        check_cost(plan, cost)?;
        let mode = plan.mode(mode);
        let (mut d, retries) = match self.charge(key, seen, plan, now, cost, mode, None) {
            Some(r) => r,
            None => (self.table_full(plan), 0),
        };
        self.settle(plan, &mut d, retries, mode);
        Ok(d)
    }

    /// The last step of every decision: the plan's soft strategy lets an over-quota request
    /// through (flagged), and the outcome is counted (a peek counts nothing).
    #[inline(always)]
    fn settle(&self, plan: &Compiled, d: &mut Decision, retries: u32, mode: Mode) {
        soften(plan, d);
        if mode != Mode::Peek {
            self.counters.count(Count::of(d), retries);
        }
    }

    /// Charges (or peeks) `key`: inline in the flat store when it can, else through its entry.
    /// Returns the decision and the CAS retries; `None` when the key is new and the table is
    /// full. Asking for refund `tokens` forces the entry path (cross-key compound limits need an
    /// entry's tokens).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn charge(
        &self,
        key: &K,
        seen: Seen,
        plan: &Compiled,
        now: u64,
        cost: u64,
        mode: Mode,
        tokens: Option<&mut Tokens>,
    ) -> Option<(Decision, u32)> {
        let charged = match &self.store {
            Map::Flat(s) => {
                if tokens.is_none() && Arc::ptr_eq(&plan.rules, s.rules()) {
                    let (hash, absent) = match seen {
                        Seen::Nothing => (s.hash(key), false),
                        Seen::Hash(h) => (h, false),
                        Seen::Absent(h) => (h, true),
                    };
                    if let Some(r) = self.charge_inline(s, hash, absent, plan, now, cost, mode) {
                        return r;
                    }
                }
                self.charge_entry(s, key, plan, now, cost, mode)
            }
            Map::Dash(s) => self.charge_entry(s, key, plan, now, cost, mode),
        };
        let (d, t, retries) = charged?;
        if let Some(tokens) = tokens {
            *tokens = t;
        }
        Some((d, retries))
    }

    /// The flat store's fast path: the key's state inline in its slot. `None` when the key is
    /// spilled (its state is an entry: take the entry path). `absent`: a probe just found the
    /// key absent, so the first round goes straight to the insert, which probes again under
    /// the shard's lock anyway (a key inserted meanwhile is found there, and charged).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn charge_inline(
        &self,
        s: &FlatStore<K>,
        hash: u64,
        mut absent: bool,
        plan: &Compiled,
        now: u64,
        cost: u64,
        mode: Mode,
    ) -> Option<Option<(Decision, u32)>> {
        let rule = &plan.rules.parts[0];
        loop {
            let found = if std::mem::take(&mut absent) {
                Found::Absent
            } else {
                s.find(hash)
            };
            match found {
                Found::Inline { slot, tag, word } => {
                    let slot = crate::cell::Inline { slot, tag };
                    if let Some(a) =
                        crate::cell::apply_inline(&slot, word, now, cost, rule, plan.headroom, mode)
                    {
                        return Some(Some((a.decision, a.retries)));
                    }
                    // Removed or spilled under us: look again.
                }
                Found::Spilled => return None,
                Found::Absent if mode == Mode::Peek => {
                    // A key never seen: judged as fresh, with nothing built or written.
                    let step =
                        crate::cell::decide_fresh(now, cost, rule, plan.headroom, Mode::Check);
                    return Some(Some((step.decision, 0)));
                }
                Found::Absent if s.refuses_new_keys() => return Some(None),
                Found::Absent => {
                    // A new key: its first call decided on the fresh state, and the slot is
                    // claimed holding the result (a denial leaves it fresh).
                    let step = crate::cell::decide_fresh(now, cost, rule, plan.headroom, mode);
                    let first = step.next.unwrap_or(0);
                    match s.insert_inline(hash, first, |e| self.evictable(e, now)) {
                        Ok(true) => return Some(Some((step.decision, 0))),
                        Ok(false) => {}
                        Err(_) => return Some(None),
                    }
                }
            }
        }
    }

    /// Charges (or peeks) `key`'s entry, migrating it first if it was built for other rules.
    /// `None` when the key is new and the table is full.
    fn charge_entry<S: Store<K>>(
        &self,
        store: &S,
        key: &K,
        plan: &Compiled,
        now: u64,
        cost: u64,
        mode: Mode,
    ) -> Option<(Decision, Tokens, u32)> {
        self.with_entry(store, key, plan, now, mode, |e| {
            charge_entry(e, plan, now, cost, mode)
        })
    }

    /// Runs `apply` on `key`'s entry under `plan`'s rules: inserting it when new, migrating it
    /// first when it was built for other rules (a plan change or another tier). A peek writes
    /// nothing: an entry of other rules is judged on a private migrated copy, an absent key as a
    /// fresh one. `None` when the key is new and the table is full.
    fn with_entry<S: Store<K>, R>(
        &self,
        store: &S,
        key: &K,
        plan: &Compiled,
        now: u64,
        mode: Mode,
        apply: impl Fn(&Entry) -> R,
    ) -> Option<R> {
        let run = |e: &Entry| Arc::ptr_eq(&e.rules, &plan.rules).then(|| apply(e));
        if mode == Mode::Peek {
            let peeked = store.with(key, |e| {
                run(e).unwrap_or_else(|| apply(&e.migrate(now, &plan.rules)))
            });
            return Some(peeked.unwrap_or_else(|| apply(&Entry::fresh(&plan.rules, 0))));
        }
        loop {
            let outcome = store
                .with_or_insert(
                    key,
                    || Entry::fresh(&plan.rules, self.next_entry_id()),
                    |e| self.evictable(e, now),
                    run,
                )
                .ok()?;
            if let Some(r) = outcome {
                return Some(r);
            }
            store.replace(key, |e| {
                (!Arc::ptr_eq(&e.rules, &plan.rules)).then(|| e.migrate(now, &plan.rules))
            });
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

fn check_cost(plan: &Compiled, cost: u64) -> Result<(), Error> {
    if cost == 0 {
        return Err(Error::ZeroCost);
    }
    if cost > plan.max_cost {
        return Err(Error::CostExceedsCapacity {
            cost,
            capacity: plan.max_cost,
        });
    }
    Ok(())
}

/// Applies one call to every part of an entry, all or nothing: when a part denies, the parts
/// already charged are refunded and the rest are only peeked (for the latest `retry_after`).
#[inline]
fn charge_entry(
    e: &Entry,
    plan: &Compiled,
    now: u64,
    cost: u64,
    mode: Mode,
) -> (Decision, Tokens, u32) {
    if let ([cell], [rule]) = (e.cells(), &*plan.rules.parts) {
        if e.blocked_until() <= now {
            let a = cell.apply(now, cost, rule, plan.headroom, mode);
            let mut tokens = Tokens {
                entry: e.id,
                ..Tokens::default()
            };
            tokens.cells[0] = a.token;
            return (a.decision, tokens, a.retries);
        }
    }
    let (d, _, tokens, retries) = charge_entry_parts(e, plan, now, cost, mode);
    (d, tokens, retries)
}

/// Refunds every charged part of `e` and clears the tokens.
fn refund(e: &Entry, parts: &[crate::quota::Rule], cost: u64, tokens: &mut Tokens, now: u64) {
    for ((cell, rule), token) in e.cells().iter().zip(parts).zip(tokens.cells.iter_mut()) {
        if let Some(t) = token.take() {
            cell.refund(cost, rule, t, now);
        }
    }
}

/// A key bound to its limiter and plan: one part of a cross-key compound limit ([`check_all`]).
pub struct Bound<'a, K, C> {
    limiter: &'a Limiter<K, C>,
    key: &'a K,
    plan: PlanId,
}

mod sealed {
    pub trait Sealed {}
}

/// What a charged part needs to be taken back.
#[doc(hidden)]
#[derive(Debug)]
pub struct Undo {
    rules: Arc<Rules>,
    tokens: Tokens,
    cost: u64,
}

/// One part of a compound limit across keys: a [`Bound`] key. Sealed.
pub trait Part: sealed::Sealed {
    #[doc(hidden)]
    fn charge_part(&self, cost: u64) -> Result<(Decision, Option<Undo>), Error>;
    #[doc(hidden)]
    fn undo_part(&self, undo: Undo);
    #[doc(hidden)]
    fn record(&self, decision: &Decision);
}

impl<K, C> sealed::Sealed for Bound<'_, K, C> {}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Part for Bound<'_, K, C> {
    fn charge_part(&self, cost: u64) -> Result<(Decision, Option<Undo>), Error> {
        let l = self.limiter;
        let book = l.book.current();
        let plan = book.get(self.plan)?;
        check_cost(plan, cost)?;
        let now = clamp_now(l.clock.now());
        let mut tokens = Tokens::default();
        match l.charge(
            self.key,
            Seen::Nothing,
            plan,
            now,
            cost,
            Mode::Check,
            Some(&mut tokens),
        ) {
            Some((d, _)) => {
                let undo = d.allowed.then(|| Undo {
                    rules: Arc::clone(&plan.rules),
                    tokens,
                    cost,
                });
                Ok((d, undo))
            }
            None => Ok((l.table_full(plan), None)),
        }
    }

    fn undo_part(&self, mut undo: Undo) {
        let now = clamp_now(self.limiter.clock.now());
        on_store!(&self.limiter.store, s => s.with(self.key, |e| {
            // Only the entry the charge landed on can be refunded; a migrated one kept the
            // charge in converted form, which errs on the strict side.
            if e.id == undo.tokens.entry && Arc::ptr_eq(&e.rules, &undo.rules) {
                refund(e, &undo.rules.parts, undo.cost, &mut undo.tokens, now);
            }
        }));
    }

    fn record(&self, d: &Decision) {
        self.limiter.counters.count(Count::of(d), 0);
    }
}

/// Checks `cost` units against every part (per-user AND global, across limiters and key types),
/// all or nothing: when any part denies, the parts already charged are refunded, so nothing stays
/// charged; no part ever admits beyond its own bound. Parts are charged in order, so list the
/// most likely to deny first. Strategies of the parts' plans do not apply here (hard denial).
///
/// A refund happens after the charge, so for that instant a concurrent request on the same key
/// may be denied when it would otherwise pass (never admitted when it should not be).
///
/// ```
/// use tollgate::{check_all, FakeClock, Limiter, Quota};
/// let clock = FakeClock::new();
/// let per_user = Limiter::<u64>::builder().quota(Quota::per_second(2)).clock(clock.clone()).build().unwrap();
/// let global = Limiter::<()>::builder().quota(Quota::per_second(3)).clock(clock.clone()).build().unwrap();
/// let mut admitted = 0;
/// for user in [1, 1, 1, 2, 2] {
///     if check_all(&[&per_user.key(&user), &global.key(&())], 1).unwrap().is_allowed() {
///         admitted += 1;
///     }
/// }
/// assert_eq!(admitted, 3); // user 1: 2 of 3; user 2: 1 of 2, the global limit is spent
/// ```
pub fn check_all(parts: &[&dyn Part], cost: u64) -> Result<Decision, Error> {
    let mut undos: Vec<Option<Undo>> = Vec::with_capacity(parts.len());
    let mut merged: Option<Decision> = None;
    let mut result = Ok(());
    for part in parts {
        match part.charge_part(cost) {
            Ok((d, undo)) => {
                let denied = !d.allowed;
                undos.push(undo);
                match &mut merged {
                    Some(m) => m.merge(&d),
                    None => merged = Some(d),
                }
                if denied {
                    break;
                }
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let d = merged.unwrap_or_else(|| Decision::denied(Reason::Limited, 0));
    if !d.allowed || result.is_err() {
        for (part, undo) in parts.iter().zip(undos) {
            if let Some(u) = undo {
                part.undo_part(u);
            }
        }
    }
    result?;
    for part in parts {
        part.record(&d);
    }
    Ok(d)
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Sweep for Limiter<K, C> {
    fn sweep_all(&self) -> usize {
        self.sweep_now()
    }
}

// ---------------------------------------------------------------------------------------------
// Per-part decisions (used by the HTTP layer's headers, which list every part of a compound
// limit). Additive: `charge_entry` above is untouched; `charge_entry_parts` is its compound loop
// returning each part's decision next to the merged one.
// ---------------------------------------------------------------------------------------------

/// One charge with every part's decision: what [`Limiter::charge_detailed`] returns.
#[cfg(feature = "http")]
#[derive(Debug)]
pub(crate) struct Detailed {
    /// The merged decision, with the plan's strategy applied (as [`Limiter::check_in`] answers).
    pub(crate) decision: Decision,
    /// Each part's own decision, in the plan's quota order; `None` past the plan's parts.
    pub(crate) parts: [Option<Decision>; MAX_PARTS],
    /// What it takes to refund the charge (only when it was admitted and charged something).
    pub(crate) undo: Option<Undo>,
    /// The clock reading the decision was made at (ns since the clock's epoch).
    pub(crate) now: u64,
}

#[cfg(feature = "http")]
impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// [`check_in`](Self::check_in) (or a peek or a reservation, by `mode`) that also reports
    /// each part's decision and can be undone with [`Part::undo_part`] on
    /// [`key_in`](Self::key_in)`(key, plan)`. Counts in the stats like `check_in`.
    pub(crate) fn charge_detailed(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
        mode: Mode,
    ) -> Result<Detailed, Error> {
        let book = self.book.current();
        let plan = book.get(plan)?;
        check_cost(plan, cost)?;
        let mode = plan.mode(mode);
        let now = clamp_now(self.clock.now());
        let charged =
            on_store!(&self.store, s => self.charge_entry_detailed(s, key, plan, now, cost, mode));
        let (mut d, parts, tokens, retries) = match charged {
            Some(r) => r,
            None => {
                let d = self.table_full(plan);
                let mut parts = [None; MAX_PARTS];
                for (p, rule) in parts.iter_mut().zip(plan.rules.parts.iter()) {
                    *p = Some(Decision {
                        limit: rule.capacity,
                        ..d
                    });
                }
                (d, parts, Tokens::default(), 0)
            }
        };
        self.settle(plan, &mut d, retries, mode);
        let charged_any = tokens.cells.iter().any(Option::is_some);
        let undo = (d.allowed && charged_any && mode != Mode::Peek).then(|| Undo {
            rules: Arc::clone(&plan.rules),
            tokens,
            cost,
        });
        Ok(Detailed {
            decision: d,
            parts,
            undo,
            now,
        })
    }

    /// The entry path of [`charge_detailed`](Self::charge_detailed) on one store (the flat
    /// store serves it from the key's spilled entry: refund tokens need one).
    #[allow(clippy::type_complexity)]
    fn charge_entry_detailed<S: Store<K>>(
        &self,
        store: &S,
        key: &K,
        plan: &Compiled,
        now: u64,
        cost: u64,
        mode: Mode,
    ) -> Option<(Decision, [Option<Decision>; MAX_PARTS], Tokens, u32)> {
        self.with_entry(store, key, plan, now, mode, |e| {
            charge_entry_parts(e, plan, now, cost, mode)
        })
    }
}

/// [`charge_entry`] with each part's decision too (a blocked key reports the penalty on every
/// part): parts are charged in order, and when one denies, the parts already charged are
/// refunded and the rest only peeked (for the latest `retry_after`).
fn charge_entry_parts(
    e: &Entry,
    plan: &Compiled,
    now: u64,
    cost: u64,
    mode: Mode,
) -> (Decision, [Option<Decision>; MAX_PARTS], Tokens, u32) {
    let parts = &plan.rules.parts;
    let mut decisions: [Option<Decision>; MAX_PARTS] = [None; MAX_PARTS];
    let blocked = e.blocked_until();
    if blocked > now {
        let wait = blocked - now;
        let d = Decision {
            limit: parts[0].capacity,
            reset_after_ns: wait,
            ..Decision::denied(Reason::Blocked, wait)
        };
        for (slot, rule) in decisions.iter_mut().zip(parts.iter()) {
            *slot = Some(Decision {
                limit: rule.capacity,
                ..d
            });
        }
        return (d, decisions, Tokens::default(), 0);
    }
    let mut tokens = Tokens {
        entry: e.id,
        ..Tokens::default()
    };
    let mut retries = 0;
    let mut denied_at = None;
    for (i, (cell, rule)) in e.cells().iter().zip(parts.iter()).enumerate() {
        let m = if denied_at.is_some() {
            Mode::Peek
        } else {
            mode
        };
        let a = cell.apply(now, cost, rule, plan.headroom, m);
        retries += a.retries;
        if denied_at.is_none() {
            tokens.cells[i] = a.token;
            if !a.decision.allowed {
                denied_at = Some(i);
                refund(e, parts, cost, &mut tokens, now);
            }
        }
        decisions[i] = Some(a.decision);
    }
    // Parts charged and then refunded report what they hold without this request.
    if let Some(at) = denied_at {
        for d in decisions[..at].iter_mut().flatten() {
            d.remaining = (d.remaining + cost).min(d.limit);
        }
    }
    let mut merged: Option<Decision> = None;
    for d in decisions.iter().flatten() {
        match &mut merged {
            Some(m) => m.merge(d),
            None => merged = Some(*d),
        }
    }
    let d = merged.unwrap_or_else(|| Decision::denied(Reason::Limited, 0));
    (d, decisions, tokens, retries)
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// Keys held in each shard of the map, in shard order (for the hash-flood test: how evenly
    /// the per-process random hasher spreads keys an attacker chose).
    ///
    /// Contention: takes each shard's read lock in turn.
    #[doc(hidden)]
    pub fn shard_loads(&self) -> Vec<usize> {
        on_store!(&self.store, s => (0..s.shards()).map(|i| s.shard_len(i)).collect())
    }
}
