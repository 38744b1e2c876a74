//! The public face: builder, checks, plans, penalties, sweeping, stats. The plans and their rule
//! table are in [`book`], the charge path and compound limits in [`charge`], penalties in
//! [`penalty`].

mod book;
mod charge;
mod cross;
#[cfg(feature = "http")]
mod detailed;
mod engine;
#[cfg(feature = "redis")]
mod exact;
mod penalty;
#[cfg(feature = "redis")]
mod synced;

use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

pub use crate::plan::{MAX_PARTS, Plan, PlanId, Strategy};
pub use cross::{Bound, Part, check_all};
#[cfg(feature = "http")]
pub(crate) use detailed::Detailed;
#[cfg(feature = "http")]
pub(crate) use engine::{Limits, all_or_nothing};

use crate::cell::Mode;
use crate::clock::{Clock, MonotonicClock, nanos};
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::quota::Quota;
use crate::stats::{Count, Counters, PlanStats, RuleStats, Stats};
use crate::store::{DashStore, FlatStore, Full, OnFull, RuleId, Store, StoreKind};
use crate::sweep::{self, Sweep, Sweeper};
use crate::sync::AtomicUsize;
use book::{Book, Books, Compiled, Short, Words};
use charge::Call;
use penalty::Penalties;

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
    housekeeping: bool,
    clock: C,
    /// Through Redis (see [`redis_synced`](Builder::redis_synced) and
    /// [`redis_exact`](Builder::redis_exact)).
    #[cfg(feature = "redis")]
    redis: Option<crate::redis::RedisConfig>,
    /// Exact mode rather than synced.
    #[cfg(feature = "redis")]
    exact: bool,
    key: PhantomData<fn(K)>,
}

impl<K, C: Clock> Builder<K, C> {
    /// Adds a quota to the default plan (several quotas: a compound limit on each key).
    ///
    /// ```
    /// use tollgate::{Limiter, Quota};
    /// // 10 a second AND 1,000 a day on every key, all or nothing.
    /// let limiter = Limiter::<u64>::builder()
    ///     .quota(Quota::per_second(10))
    ///     .quota(Quota::per_day(1000))
    ///     .build()?;
    /// assert_eq!(limiter.check_n(&1, 10)?.remaining(), 0);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn quota(mut self, quota: Quota) -> Self {
        self.quotas.push(quota);
        self
    }
    /// The default plan's strategy.
    ///
    /// ```
    /// use tollgate::{Limiter, Quota, Reason, Strategy};
    /// let limiter = Limiter::<u64>::builder()
    ///     .quota(Quota::per_minute(1))
    ///     .strategy(Strategy::Soft) // over the quota: let through, flagged
    ///     .build()?;
    /// assert!(limiter.check(&1).is_allowed());
    /// let over = limiter.check(&1);
    /// assert!(over.is_allowed());
    /// assert_eq!(over.reason(), Reason::SoftLimit);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }
    /// Adds a named plan. Without [`quota`](Self::quota) calls, the first plan added is the
    /// default one.
    ///
    /// ```
    /// use tollgate::{Limiter, Plan, Quota};
    /// let limiter = Limiter::<u64>::builder()
    ///     .plan("free", Plan::new([Quota::per_minute(10)]))
    ///     .plan("pro", Plan::new([Quota::per_minute(1000)]))
    ///     .build()?;
    /// assert_eq!(limiter.plan_names(), ["free", "pro"]);
    /// assert_eq!(limiter.check(&1).limit(), 10); // `check` uses the first plan
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn plan(mut self, name: impl Into<String>, plan: Plan) -> Self {
        self.plans.push((name.into(), plan));
        self
    }
    /// Adds every plan of a parsed configuration (see [`PlanConfig`](crate::PlanConfig)).
    ///
    /// ```
    /// use tollgate::{Limiter, PlanConfig};
    /// let config = PlanConfig::parse("[plans.free]\nlimit = 100\nwindow = \"1m\"\n")?;
    /// let limiter = Limiter::<u64>::builder().plans(config).build()?;
    /// assert!(limiter.plan("free").is_some());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn plans(mut self, config: crate::plan::PlanConfig) -> Self {
        self.plans.extend(config.into_plans());
        self
    }
    /// The most states the table holds (default 1,000,000): one per (key, rule) in use, so a
    /// key checked under a compound plan of two quotas holds two, and two plans that share a
    /// quota share its state. Accepted: 1 and up; a table that cannot be mapped at that size
    /// falls back to the dash store (see [`Limiter::store_kind`]).
    ///
    /// ```
    /// use tollgate::{Limiter, Quota, Reason};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(5)).max_keys(2).build()?;
    /// assert!(limiter.check(&1).is_allowed());
    /// assert!(limiter.check(&2).is_allowed());
    /// assert_eq!(limiter.check(&3).reason(), Reason::TableFull);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }
    /// What to do with a new state when the table is full (default: reclaim a fresh state
    /// near it, else deny it; see [`OnFull`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, Limiter, OnFull, Quota, StoreKind};
    /// let clock = FakeClock::new();
    /// // Two shards of the dash store: an eviction looks at every state. (The flat store looks
    /// // at a bounded neighbourhood of the new state's slot; see `OnFull::EvictFresh`.)
    /// let limiter = Limiter::<u64, _>::builder()
    ///     .quota(Quota::per_second(5))
    ///     .max_keys(1)
    ///     .store(StoreKind::Dash)
    ///     .shards(2)
    ///     .on_full(OnFull::EvictFresh)
    ///     .sweep_grace(Duration::ZERO)
    ///     .clock(clock.clone())
    ///     .build()?;
    /// assert!(limiter.check(&1).is_allowed());
    /// clock.advance(Duration::from_secs(1)); // key 1 is back to fresh: it may go
    /// assert!(limiter.check(&2).is_allowed());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn on_full(mut self, on_full: OnFull) -> Self {
        self.on_full = on_full;
        self
    }
    /// Which map holds the keys (default [`StoreKind::Flat`]).
    ///
    /// ```
    /// use tollgate::{Limiter, Quota, StoreKind};
    /// let limiter = Limiter::<u64>::builder()
    ///     .quota(Quota::per_second(5))
    ///     .store(StoreKind::Dash)
    ///     .build()?;
    /// assert_eq!(limiter.store_kind(), StoreKind::Dash);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn store(mut self, kind: StoreKind) -> Self {
        self.store = kind;
        self
    }
    /// Number of shards of the map (default: 4 per core), rounded up to a power of two, at
    /// least 2. Accepted: 1 to [`MAX_SHARDS`]; anything else is
    /// [`Error::ShardsOutOfRange`] from [`build`](Self::build).
    ///
    /// ```
    /// use tollgate::{Error, Limiter, Quota};
    /// assert!(Limiter::<u64>::builder().quota(Quota::per_second(5)).shards(16).build().is_ok());
    /// let too_many = Limiter::<u64>::builder().quota(Quota::per_second(5)).shards(usize::MAX).build();
    /// assert!(matches!(too_many, Err(Error::ShardsOutOfRange { .. })));
    /// ```
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards;
        self
    }
    /// The `retry_after` given to a new key denied because the table is full (default 1 s).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder()
    ///     .quota(Quota::per_second(5))
    ///     .max_keys(1)
    ///     .full_retry_after(Duration::from_secs(30))
    ///     .build()?;
    /// assert!(limiter.check(&1).is_allowed());
    /// assert_eq!(limiter.check(&2).retry_after(), Duration::from_secs(30));
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn full_retry_after(mut self, d: Duration) -> Self {
        self.full_retry = d;
        self
    }
    /// Sweeping and eviction remove only state that was already fresh this long ago (default
    /// 1 s). A check that read its clock before a sweep and runs after it finds a fresh key; the
    /// grace makes that harmless for any check whose clock reading is at most this stale.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, Limiter, Quota};
    /// let clock = FakeClock::new();
    /// let limiter = Limiter::<u64, _>::builder()
    ///     .quota(Quota::per_second(1))
    ///     .sweep_grace(Duration::from_secs(5))
    ///     .clock(clock.clone())
    ///     .build()?;
    /// assert!(limiter.check(&1).is_allowed());
    /// clock.advance(Duration::from_secs(2)); // fresh, but not yet for 5 s
    /// assert_eq!(limiter.sweep_now(), 0);
    /// clock.advance(Duration::from_secs(5));
    /// assert_eq!(limiter.sweep_now(), 1);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn sweep_grace(mut self, grace: Duration) -> Self {
        self.sweep_grace = grace;
        self
    }

    /// Whether calls that create state also sweep, now and then, one shard from where the last
    /// sweep stopped (default on): every `max_keys / shards / 8` new states (at least 64, at
    /// most 65,536), the call that makes the count sweeps one shard (others skip while it
    /// runs), so stale states go and sliding logs give their memory back with no sweeper
    /// thread and no sweep call; amortised, about 10 slot visits a new state (a shard has about
    /// 1.2 slots a state). Off: stale states go only by sweeping (`sweep_once`,
    /// `start_sweeper`) and by reclaim at the cap, which is the same either way: a new state at
    /// the cap is denied only when nothing in the table is stale (see [`OnFull::EvictFresh`]).
    ///
    /// ```
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(5)).housekeeping(false).build()?;
    /// # let _ = limiter;
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn housekeeping(mut self, on: bool) -> Self {
        self.housekeeping = on;
        self
    }

    /// The time source (default [`MonotonicClock`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, Limiter, Quota};
    /// let clock = FakeClock::new(); // tests move time by hand
    /// let limiter = Limiter::<u64, _>::builder().quota(Quota::per_second(1)).clock(clock.clone()).build()?;
    /// assert!(limiter.check(&1).is_allowed());
    /// assert!(!limiter.check(&1).is_allowed());
    /// clock.advance(Duration::from_secs(1));
    /// assert!(limiter.check(&1).is_allowed());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
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
            housekeeping: self.housekeeping,
            clock,
            #[cfg(feature = "redis")]
            redis: self.redis,
            #[cfg(feature = "redis")]
            exact: self.exact,
            key: PhantomData,
        }
    }

    /// Checks every quota and builds the limiter.
    ///
    /// ```
    /// use tollgate::{Error, Limiter, Quota};
    /// assert!(matches!(Limiter::<u64>::builder().build(), Err(Error::NoQuota)));
    /// assert!(Limiter::<u64>::builder().quota(Quota::per_second(1)).build().is_ok());
    /// ```
    pub fn build(self) -> Result<Limiter<K, C>, Error>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
    {
        #[cfg(feature = "redis")]
        if self.redis.is_some() {
            return Err(Error::Config {
                line: None,
                message: "a limiter through Redis (synced or exact) is shared: build it with build_shared()"
                    .into(),
            });
        }
        self.build_local()
    }

    /// The limiter of [`build`](Self::build), without its backend's checks.
    fn build_local(self) -> Result<Limiter<K, C>, Error>
    where
        K: Hash + Eq + Clone + Send + Sync + 'static,
    {
        let on_redis = self.on_redis();
        if self.max_keys == 0 {
            return Err(Error::ZeroMaxKeys);
        }
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(Error::ShardsOutOfRange {
                shards: self.shards,
                max: MAX_SHARDS,
            });
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
        let store = Map::new(self.store, self.shards, self.max_keys, self.on_full);
        // A limiter through Redis charges on the general path only (where its hooks are).
        let inline = matches!(store, Map::Flat(_)) && !on_redis;
        let book = Book::compile(&plans, self.clock.unix_epoch_ns(), None, inline)?;
        Ok(Limiter {
            store,
            book: Books::new(book),
            plans: crate::sync::Mutex::new(plans),
            penalties: Penalties::new(self.max_keys),
            clock: self.clock,
            counters: Counters::new(),
            sweep_cursor: AtomicUsize::new(0),
            full_retry_ns: nanos(self.full_retry),
            sweep_grace_ns: nanos(self.sweep_grace),
            resets: crate::sync::AtomicU64::new(0),
            new_states: crate::sync::AtomicUsize::new(0),
            housekeep_every: if self.housekeeping {
                (self.max_keys / self.shards.max(1) / 8).clamp(64, 1 << 16)
            } else {
                0
            },
            housekeeping: crate::sync::AtomicBool::new(false),
            evicts: self.on_full == OnFull::EvictFresh,
            reclaiming: crate::sync::AtomicBool::new(false),
            stale_from: crate::sync::AtomicU64::new(0),
            #[cfg(feature = "redis")]
            synced: None,
            #[cfg(feature = "redis")]
            exact: None,
        })
    }

    /// Whether the limiter's decisions go through Redis (synced or exact: the short paths,
    /// which bypass the hooks, are off).
    fn on_redis(&self) -> bool {
        #[cfg(feature = "redis")]
        {
            self.redis.is_some()
        }
        #[cfg(not(feature = "redis"))]
        {
            false
        }
    }

    /// Makes the limiter's states cluster-wide through Redis in synced mode (feature `redis`;
    /// see [`RedisConfig`](crate::redis::RedisConfig)); build it with
    /// [`build_shared`](Self::build_shared).
    #[cfg(feature = "redis")]
    pub fn redis_synced(mut self, redis: crate::redis::RedisConfig) -> Self {
        self.redis = Some(redis);
        self.exact = false;
        self
    }

    /// Makes every decision of the limiter one Lua script on Redis, in exact mode (feature
    /// `redis`; see [`RedisConfig`](crate::redis::RedisConfig): its `interval` is unused):
    /// *exactly* the decisions of one in-process limiter, across every process that shares the
    /// server. Build it with [`build_shared`](Self::build_shared) and decide with the async
    /// calls ([`Limiter::check_in_async`] and its siblings): a synchronous call cannot wait for
    /// Redis, so on an exact-mode limiter it is answered as while Redis is out of reach, by the
    /// failure policy (and counted as degraded). Plans, compound plans, tiers (`headroom`),
    /// the strategies, `peek` and the per-plan stats work as in process; `check_all` is an
    /// error (its parts would be separate scripts: use synced mode).
    #[cfg(feature = "redis")]
    pub fn redis_exact(mut self, redis: crate::redis::RedisConfig) -> Self {
        self.redis = Some(redis);
        self.exact = true;
        self
    }

    /// Builds the limiter behind an `Arc`, as servers share it. With
    /// [`redis_synced`](Self::redis_synced), starts its reconciliation rounds on the current
    /// tokio runtime (so call it inside one; they stop when the last `Arc` is dropped), and
    /// checks that it can be synced: the flat store, and no sliding log (exact mode only).
    /// The key's `Display` names it in Redis, escaped so that keys with distinct `Display`s
    /// never share a state there (see
    /// [`RedisConfig::prefix`](crate::redis::RedisConfig::prefix)).
    ///
    /// ```
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(5)).build_shared()?;
    /// assert!(limiter.check(&1).is_allowed());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn build_shared(self) -> Result<Arc<Limiter<K, C>>, Error>
    where
        K: Hash + Eq + Clone + Send + Sync + std::fmt::Display + 'static,
    {
        #[cfg(feature = "redis")]
        if let (Some(redis), true) = (self.redis.clone(), self.exact) {
            let mut limiter = self.build_local()?;
            let plans = crate::sync::lock(&limiter.plans).clone();
            limiter.exact = Some(exact::Exact::new(
                redis,
                &plans,
                &limiter.book.current().by_name,
                <K as ToString>::to_string,
            )?);
            return Ok(Arc::new(limiter));
        }
        #[cfg(feature = "redis")]
        if let Some(redis) = self.redis.clone() {
            let interval = redis.interval;
            let mut limiter = self.build_local()?;
            if !matches!(limiter.store, Map::Flat(_)) {
                return Err(Error::Config {
                    line: None,
                    message: "a limiter synced through Redis runs on the flat store".into(),
                });
            }
            synced::check_rules(&limiter.book.current().rules)?;
            limiter.synced = Some(synced::Synced::new(redis, <K as ToString>::to_string)?);
            let limiter = Arc::new(limiter);
            synced::spawn_rounds(&limiter, interval)?;
            return Ok(limiter);
        }
        self.build_local().map(Arc::new)
    }
}

/// How long a walk at the cap that freed nothing is trusted at most (see
/// [`Limiter::reclaim_at_cap`]): 100 ms. A call racing the walk (an insert behind it, a
/// refund) can leave a state that goes stale before the moment the walk noted; the next walk,
/// at most this much later, finds it.
const RECLAIM_EVERY_NS: u64 = 100_000_000;

/// [`Limiter::stale_from`] while a walk at the cap runs: later than any moment, so other new
/// states at the cap are denied meanwhile, as when a walk has just found nothing.
const WALKING: u64 = u64::MAX;

/// The most shards [`Builder::shards`] accepts.
pub const MAX_SHARDS: usize = 1 << 16;

impl<K, C: std::fmt::Debug> std::fmt::Debug for Builder<K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        #[cfg(feature = "redis")]
        let synced = self.redis.is_some();
        #[cfg(not(feature = "redis"))]
        let synced = false;
        f.debug_struct("Builder")
            .field("quotas", &self.quotas)
            .field("strategy", &self.strategy)
            .field("plans", &self.plans)
            .field("max_keys", &self.max_keys)
            .field("on_full", &self.on_full)
            .field("store", &self.store)
            .field("shards", &self.shards)
            .field("full_retry", &self.full_retry)
            .field("sweep_grace", &self.sweep_grace)
            .field("housekeeping", &self.housekeeping)
            .field("clock", &self.clock)
            .field("synced", &synced)
            .finish()
    }
}

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
    /// Synced through Redis: the trackers and the rounds' Redis side.
    #[cfg(feature = "redis")]
    synced: Option<synced::Synced<K>>,
    /// Exact mode: each plan's Redis limiter.
    #[cfg(feature = "redis")]
    exact: Option<exact::Exact<K>>,
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
        #[cfg(feature = "redis")]
        let (synced, exact) = (self.synced.is_some(), self.exact.is_some());
        #[cfg(not(feature = "redis"))]
        let (synced, exact) = (false, false);
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
    fn new(kind: StoreKind, shards: usize, max_keys: usize, on_full: OnFull) -> Self {
        if kind == StoreKind::Flat {
            if let Some(s) = FlatStore::new(shards, max_keys, on_full) {
                return Map::Flat(s);
            }
        }
        Map::Dash(DashStore::new(shards, max_keys, on_full))
    }
}

impl<K> Limiter<K, MonotonicClock> {
    /// A builder with no quota, the monotonic clock, 1,000,000 states at most; when full, a new
    /// state takes the place of one already back to fresh, and is denied only where there is
    /// none ([`OnFull::EvictFresh`]).
    pub fn builder() -> Builder<K, MonotonicClock> {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        Builder {
            quotas: Vec::new(),
            strategy: Strategy::Hard,
            plans: Vec::new(),
            max_keys: 1_000_000,
            on_full: OnFull::EvictFresh,
            store: StoreKind::default(),
            shards: cores * 4,
            full_retry: Duration::from_secs(1),
            sweep_grace: Duration::from_secs(1),
            housekeeping: true,
            clock: MonotonicClock::process(),
            #[cfg(feature = "redis")]
            redis: None,
            #[cfg(feature = "redis")]
            exact: false,
            key: PhantomData,
        }
    }
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
pub(crate) fn soften_limited(d: &mut Decision) {
    if !d.allowed && d.reason == Reason::Limited {
        d.allowed = true;
        d.reason = Reason::SoftLimit;
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// Checks one unit for `key` under the default plan.
    ///
    /// ```
    /// use tollgate::{Limiter, Quota, Reason};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_minute(60).burst(2)).build()?;
    /// assert!(limiter.check(&7).is_allowed());
    /// assert!(limiter.check(&7).is_allowed());
    /// let third = limiter.check(&7);
    /// assert_eq!(third.reason(), Reason::Limited);
    /// assert!(third.retry_after().as_millis() > 900); // about one second: 60 a minute
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    // Always inlined: the short path is small (the rest is out of line in `check_general`), and
    // inlined into its caller it drops the work for the decision's fields the caller never
    // reads.
    #[inline(always)]
    pub fn check(&self, key: &K) -> Decision {
        match &self.store {
            Map::Flat(s) => {
                let hash = s.hash(key);
                let now = clamp_now(self.clock.now());
                match self.check_inline(s, hash, now) {
                    Some(d) => d,
                    None => self.check_general(key, hash, now),
                }
            }
            Map::Dash(_) => {
                self.check_general(key, self.key_hash(key), clamp_now(self.clock.now()))
            }
        }
    }

    /// [`check`](Self::check) on the general path (out of line, so the short one stays small).
    #[inline(never)]
    fn check_general(&self, key: &K, hash: u64, now: u64) -> Decision {
        // The short path was tried by `check`: do not probe again.
        self.decide_at(key, hash, PlanId::DEFAULT, 1, Mode::Check, now, false)
            .unwrap_or_else(|_| Decision::denied(Reason::Limited, 0))
    }

    /// The short path of [`check`](Self::check) and [`check_many`](Self::check_many): one unit
    /// under the default plan at `now` (see [`charge_short`](Self::charge_short)).
    ///
    /// The clock is read before the probe: issued first, the TSC read overlaps the probe's loads.
    #[inline(always)]
    fn check_inline(&self, s: &FlatStore<K>, hash: u64, now: u64) -> Option<Decision> {
        let words = self.book.current().default_words.as_ref()?;
        self.charge_short(s, words, hash, now, 1)
    }

    /// A call of `cost` units (a cost the plan can admit, checked by the caller) on the short
    /// path ([`charge_words`](Self::charge_words)), with the plan's strategy and counted: the
    /// same decision, state and count as [`decide_at`](Self::decide_at). `None`, having changed
    /// nothing, where the short path does not apply.
    #[inline(always)]
    fn charge_short<const N: usize>(
        &self,
        s: &FlatStore<K>,
        words: &Words<N>,
        hash: u64,
        now: u64,
        cost: u64,
    ) -> Option<Decision> {
        let tally = words.counts.tally();
        let req = engine::Request { hash, now, cost };
        let charged = self.charge_words(s, words, req, false, None)?;
        let mut d = charged.decision;
        // A denial on the short path is over quota (`Reason::Limited`): a new state's
        // table-full denial and a blocked key's are decided on the general path.
        let count = if d.allowed {
            Count::Allowed
        } else if words.soft {
            soften_limited(&mut d);
            Count::of(&d)
        } else {
            Count::Denied
        };
        debug_assert_eq!(count, Count::of(&d));
        tally.add(count, charged.retries);
        Some(d)
    }

    /// The hash a key's states and penalty are found by: the flat store's (one hash for every
    /// rule of the key), or the penalty table's own on the dash store.
    #[inline]
    pub(crate) fn key_hash(&self, key: &K) -> u64 {
        match &self.store {
            Map::Flat(s) => s.hash(key),
            Map::Dash(_) => self.penalties.hash(key),
        }
    }

    /// Where `key`'s default-plan state sits in the flat store, for tests (see
    /// `FlatStore::placement`).
    #[cfg(test)]
    pub(crate) fn placement(&self, key: &K) -> Option<(usize, bool)> {
        let id = self.book.current().plans[0].parts[0].id;
        match &self.store {
            Map::Flat(s) => s.placement_of(s.hash(key), id),
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

    /// Bytes of the flat store's tables once every shard has grown to the cap's size, for
    /// tests; 0 on the dash store.
    #[cfg(test)]
    pub(crate) fn cap_bytes(&self) -> usize {
        match &self.store {
            Map::Flat(s) => s.cap_bytes(),
            Map::Dash(_) => 0,
        }
    }

    /// Lookups of the flat store that met a shard's move, for tests.
    #[cfg(test)]
    pub(crate) fn met_moves(&self) -> usize {
        match &self.store {
            Map::Flat(s) => s.met_moves(),
            Map::Dash(_) => 0,
        }
    }

    /// The generation of each of the flat store's shard tables now, for tests.
    #[cfg(test)]
    pub(crate) fn generations(&self) -> Vec<usize> {
        match &self.store {
            Map::Flat(s) => s.generations(),
            Map::Dash(_) => Vec::new(),
        }
    }

    /// Grows every shard of the flat store into its next table now (those not yet at the
    /// cap's size), as new states would: for tests and loom models of a move.
    #[cfg(any(test, tollgate_loom))]
    #[doc(hidden)]
    pub fn grow_all(&self) {
        if let Map::Flat(s) = &self.store {
            s.grow_all();
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
    ///
    /// ```
    /// use tollgate::{Error, Limiter, Quota};
    /// let limiter = Limiter::<&str>::builder().quota(Quota::per_second(10)).build()?;
    /// assert_eq!(limiter.check_n(&"upload", 4)?.remaining(), 6);
    /// assert!(matches!(limiter.check_n(&"upload", 11), Err(Error::CostExceedsCapacity { .. })));
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn check_n(&self, key: &K, cost: u64) -> Result<Decision, Error> {
        self.decide(key, PlanId::DEFAULT, cost, Mode::Check)
    }

    /// Checks `cost` units for `key` under `plan` (resolved per request, e.g. from the caller's
    /// account), with that plan's strategy. Each of the plan's quotas is its own state for the
    /// key, shared with every other plan that lists an equal quota. A `plan` another limiter
    /// issued is [`Error::ForeignPlan`].
    ///
    /// ```
    /// use tollgate::{Limiter, Plan, Quota};
    /// let limiter = Limiter::<u64>::builder()
    ///     .plan("free", Plan::new([Quota::per_minute(2)]))
    ///     .plan("pro", Plan::new([Quota::per_minute(100)]))
    ///     .build()?;
    /// let (free, pro) = (limiter.plan("free").unwrap(), limiter.plan("pro").unwrap());
    /// assert!(limiter.check_in(&1, free, 2)?.is_allowed());
    /// assert!(!limiter.check_in(&1, free, 1)?.is_allowed());
    /// // The same key under another plan is another state: free's spending does not count there.
    /// assert_eq!(limiter.check_in(&1, pro, 1)?.remaining(), 99);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
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
        let rule = self
            .book
            .current()
            .default_words
            .as_ref()
            .map_or(0, |w| w.ids[0]);
        let mut hashes = [0u64; CHUNK];
        for (keys, out) in keys[..n].chunks(CHUNK).zip(out[..n].chunks_mut(CHUNK)) {
            for (h, key) in hashes.iter_mut().zip(keys) {
                *h = s.hash(key);
                s.prefetch_state(*h, rule);
            }
            let now = clamp_now(self.clock.now());
            for ((key, d), h) in keys.iter().zip(out).zip(hashes) {
                *d = match self.check_inline(s, h, now) {
                    Some(d) => d,
                    None => self.check_general(key, h, now),
                };
            }
        }
        n
    }

    /// What [`check`](Self::check) would answer, charging nothing and inserting nothing (under a
    /// queue strategy, the reservation it would make).
    ///
    /// ```
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(1)).build()?;
    /// assert!(limiter.peek(&3).is_allowed());
    /// assert!(limiter.peek(&3).is_allowed()); // nothing was charged
    /// assert!(limiter.check(&3).is_allowed());
    /// assert!(!limiter.peek(&3).is_allowed());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
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
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, Limiter, Quota};
    /// let limiter = Limiter::<u64, _>::builder()
    ///     .quota(Quota::per_second(10).burst(1))
    ///     .clock(FakeClock::new())
    ///     .build()?;
    /// assert_eq!(limiter.reserve(&1, 1, Duration::from_secs(1))?.delay(), Duration::ZERO);
    /// let later = limiter.reserve(&1, 1, Duration::from_secs(1))?;
    /// assert!(later.is_allowed());
    /// assert_eq!(later.delay(), Duration::from_millis(100)); // go in 100 ms
    /// # Ok::<(), tollgate::Error>(())
    /// ```
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

    /// Whether every part of `plan` is a bucket, which schedules reservations ahead (windows
    /// admit now or deny).
    #[cfg(feature = "tokio")]
    pub(crate) fn schedules(&self, plan: PlanId) -> Result<bool, Error> {
        let book = self.book.current();
        let plan = book.get(plan)?;
        Ok(plan
            .parts
            .iter()
            .all(|p| p.rule.kind == crate::algo::Kind::Gcra))
    }

    /// The plan called `name`: an id for this limiter's calls (and only this limiter's: see
    /// [`PlanId`]), which stays the plan's when [`set_plan`](Self::set_plan) changes it.
    pub fn plan(&self, name: &str) -> Option<PlanId> {
        self.book.current().by_name.get(name).copied()
    }

    /// This limiter's own id of its default plan: the plan [`PlanId::DEFAULT`] names here, as
    /// [`plan`](Self::plan) gives it (for tables keyed by plan id).
    #[cfg(feature = "http")]
    pub(crate) fn default_plan_id(&self) -> PlanId {
        self.book.current().default_id()
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

    /// Forgets `key` entirely: its state under every rule and its penalty (back to fresh).
    /// True if anything was tracked. A limiter on Redis forgets only what this process holds:
    /// [`reset_async`](Self::reset_async) forgets the key there too.
    ///
    /// ```
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_hour(1)).build()?;
    /// assert!(limiter.check(&9).is_allowed());
    /// assert!(!limiter.check(&9).is_allowed());
    /// assert!(limiter.reset(&9));
    /// assert!(limiter.check(&9).is_allowed());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    ///
    /// Contention: one probe per rule the limiter has; the shard's write lock where a removed
    /// state lay outside its home group.
    pub fn reset(&self, key: &K) -> bool {
        let rules = self.book.current().rules.len();
        // AcqRel: a refund that reads the count after this reset (Acquire) sees it, and one
        // whose charge read it before cannot land (see `resets`).
        self.resets.fetch_add(1, crate::sync::Ordering::AcqRel);
        let blocked = self.penalties.remove(key);
        let mut removed = false;
        for id in 0..rules {
            removed |= on_store!(&self.store, s => s.remove(key, id as crate::store::RuleId));
        }
        if removed {
            self.forget_stale_from();
        }
        blocked || removed
    }

    /// A penalty: `key` is denied for `duration` from now under every plan, whatever its
    /// quotas say (an existing longer penalty stays). False when `max_keys` keys are under a
    /// penalty already (penalties that are over do not count, swept or not).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limiter, Quota, Reason};
    /// let limiter = Limiter::<&str>::builder().quota(Quota::per_second(100)).build()?;
    /// assert!(limiter.block(&"mallory", Duration::from_secs(60)));
    /// assert_eq!(limiter.check(&"mallory").reason(), Reason::Blocked);
    /// assert!(limiter.check(&"alice").is_allowed());
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn block(&self, key: &K, duration: Duration) -> bool {
        let now = clamp_now(self.clock.now());
        let until = now.saturating_add(nanos(duration));
        self.penalties.block(self.key_hash(key), key, now, until)
    }

    /// Adds or replaces the plan called `name` on the live limiter; see the type's docs for what
    /// happens to keys already tracked. `"default"` is the plan [`check`](Self::check) uses.
    ///
    /// ```
    /// use tollgate::{FakeClock, Limiter, Plan, Quota};
    /// let limiter = Limiter::<u64, _>::builder()
    ///     .quota(Quota::per_minute(10))
    ///     .clock(FakeClock::new())
    ///     .build()?;
    /// assert_eq!(limiter.check_n(&1, 8)?.remaining(), 2);
    /// // Raise the limit: key 1 keeps what it spent (8 units of debt), now out of 20.
    /// limiter.set_plan("default", Plan::new([Quota::per_minute(20)]))?;
    /// assert_eq!(limiter.check(&1).remaining(), 11);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    ///
    /// Contention: serialised with other plan changes; checks are never blocked.
    pub fn set_plan(&self, name: &str, plan: Plan) -> Result<PlanId, Error> {
        let mut plans = crate::sync::lock(&self.plans);
        let mut next = plans.clone();
        match next.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = plan,
            None => next.push((name.to_string(), plan)),
        }
        let book = Book::compile(
            &next,
            self.clock.unix_epoch_ns(),
            Some(self.book.current()),
            matches!(self.store, Map::Flat(_)) && !self.is_synced(),
        )?;
        #[cfg(feature = "redis")]
        if self.is_synced() {
            synced::check_rules(&book.rules)?;
        }
        #[cfg(feature = "redis")]
        if let Some(x) = &self.exact {
            x.install(&next, &book.by_name)?;
        }
        let id = book.by_name[name];
        self.book.install(book);
        *plans = next;
        #[cfg(feature = "tracing")]
        tracing::info!(target: "tollgate", plan = name, "plan changed");
        Ok(id)
    }

    /// Counts under `plan` a request that another limit of the same call denied
    /// (`elsewhere`; see [`PlanStats`]): in place of `counted`, what this plan's own decision
    /// counted on this thread (an admission or a soft pass, taken back), or on its own. With
    /// `elsewhere` false only `counted` is taken back (the call failed: nothing is counted).
    pub(crate) fn recount(&self, plan: PlanId, counted: Option<Count>, elsewhere: bool) {
        // The plan's counts: a plan change meanwhile keeps them (they move to the new book).
        let Ok(plan) = self.book.current().get(plan) else {
            return;
        };
        if let Some(c) = counted {
            plan.counts.uncount(c);
        }
        if elsewhere {
            plan.counts.count(Count::DeniedElsewhere, 0);
        }
    }

    /// Counts a decision made for `plan` elsewhere (exact mode, on Redis) in the plan's stats.
    #[cfg(feature = "redis")]
    pub(crate) fn count_external(&self, plan: PlanId, d: &Decision) {
        if let Ok(p) = self.book.current().get(plan) {
            p.counts.count(Count::of(d), 0);
        }
    }

    /// Whether the limiter is synced through Redis ([`Builder::redis_synced`]).
    pub fn is_synced(&self) -> bool {
        #[cfg(feature = "redis")]
        {
            self.synced.is_some()
        }
        #[cfg(not(feature = "redis"))]
        {
            false
        }
    }

    /// Which store this limiter runs on: the one asked for, or [`StoreKind::Dash`] where a flat
    /// table for `max_keys` cannot be mapped.
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

    /// States tracked now: one per (key, rule) in use.
    pub fn len(&self) -> usize {
        on_store!(&self.store, s => s.len())
    }

    /// True when no state is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters (cheap: sums a few cache lines).
    pub fn stats(&self) -> Stats {
        let book = self.book.current();
        self.counters
            .snapshot(book.plans.iter().map(|p| &p.counts), self.len())
    }

    /// Each plan's decisions so far, in the order the plans were added (`"default"` first):
    /// exact, and summing to [`stats`](Self::stats)' decision counts. A plan's own calls and
    /// its share of [`check_all`] count under it, each for what the plan decided: a
    /// [`check_all`] that another part denied is [`PlanStats::denied_elsewhere`] here, not
    /// `denied`.
    ///
    /// ```
    /// use tollgate::{FakeClock, Limiter, Plan, Quota};
    /// let limiter = Limiter::<u64, _>::builder()
    ///     .quota(Quota::per_minute(2))
    ///     .plan("pro", Plan::new([Quota::per_minute(100)]))
    ///     .clock(FakeClock::new())
    ///     .build()?;
    /// let pro = limiter.plan("pro").unwrap();
    /// for _ in 0..3 {
    ///     let _ = limiter.check(&1);
    ///     let _ = limiter.check_in(&2, pro, 1)?;
    /// }
    /// let stats = limiter.plan_stats();
    /// assert_eq!((stats[0].plan.as_str(), stats[0].allowed, stats[0].denied), ("default", 2, 1));
    /// assert_eq!((stats[1].plan.as_str(), stats[1].allowed, stats[1].denied), ("pro", 3, 0));
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn plan_stats(&self) -> Vec<PlanStats> {
        self.book
            .current()
            .plans
            .iter()
            .map(|p| p.counts.plan_stats(&p.name))
            .collect()
    }

    /// Each rule's states and evictions, for every rule a plan lists now (a rule is one quota,
    /// shared by the plans that list it), in plan order.
    ///
    /// Contention: counts the states by a scan of the whole table, taking each shard's read
    /// lock in turn (about a millisecond a million slots); for a metrics scrape, not a hot path.
    ///
    /// ```
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(10)).build()?;
    /// assert!(limiter.check(&1).is_allowed() && limiter.check(&2).is_allowed());
    /// let rules = limiter.rule_stats();
    /// assert_eq!(rules[0].rule, "token_bucket 10/1s");
    /// assert_eq!((rules[0].plans.as_slice(), rules[0].keys), (&["default.0".to_string()][..], 2));
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn rule_stats(&self) -> Vec<RuleStats> {
        let book = self.book.current();
        let mut keys = [0u64; crate::store::MAX_RULES];
        on_store!(&self.store, s => s.count_by_rule(&mut keys));
        let mut out: Vec<(RuleId, RuleStats)> = Vec::new();
        for plan in &book.plans {
            for (i, part) in plan.parts.iter().enumerate() {
                let name = format!("{}.{i}", plan.name);
                match out.iter_mut().find(|(id, _)| *id == part.id) {
                    Some((_, r)) => r.plans.push(name),
                    None => out.push((
                        part.id,
                        RuleStats {
                            rule: part.rule.describe(),
                            plans: vec![name],
                            keys: keys[usize::from(part.id)],
                            evictions: self.counters.evictions_of(part.id),
                        },
                    )),
                }
            }
        }
        out.into_iter().map(|(_, r)| r).collect()
    }

    /// The limiter's clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

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

    /// Publishes [`stats`](Self::stats) through the `metrics` facade (feature `metrics`),
    /// labelled `limiter = name` (see [`Stats::publish`]), with each plan's decisions
    /// ([`plan_stats`](Self::plan_stats): counter `tollgate_plan_decisions_total`, labels `plan`
    /// and `outcome`) and each rule's states and evictions ([`rule_stats`](Self::rule_stats):
    /// gauge `tollgate_rule_keys` and counter `tollgate_rule_evictions_total`, label `rule`).
    /// Call it from a timer or a scrape: it scans the table for the states by rule.
    ///
    /// ```
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(5)).build()?;
    /// limiter.check(&1);
    /// limiter.publish_metrics("api"); // a no-op until a recorder is installed
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    #[cfg(feature = "metrics")]
    pub fn publish_metrics(&self, name: &str) {
        let base = crate::stats::publish::limiter(name);
        crate::stats::publish::totals(&base, &self.stats());
        crate::stats::publish::breakdown(&base, &self.plan_stats(), &self.rule_stats());
    }

    /// Sweeps every shard once; returns the number of states removed.
    pub fn sweep_now(&self) -> usize {
        self.sweep_once(usize::MAX)
    }

    /// Starts a background [`Sweeper`] that sweeps every `interval`.
    pub fn start_sweeper(self: &Arc<Self>, interval: Duration) -> Sweeper {
        Sweeper::start(Arc::downgrade(self), interval)
    }

    /// Heap bytes held by state beyond the table's slots (sliding logs, the dash store's cells,
    /// penalties).
    pub fn state_heap_bytes(&self) -> usize {
        on_store!(&self.store, s => s.sum_cells(crate::cell::Cell::heap_bytes))
            + self.penalties.heap_bytes()
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

    /// The denial of a new state when the table is full.
    fn table_full(&self, plan: &Compiled) -> Decision {
        #[cfg(feature = "tracing")]
        tracing::debug!(
            target: "tollgate",
            keys = self.len(),
            "table full: a new state was denied (Reason::TableFull)"
        );
        Decision {
            limit: plan.parts[0].rule.capacity,
            ..Decision::denied(Reason::TableFull, self.full_retry_ns)
        }
    }

    /// The whole decision path: plan, cost, strategy, states, stats.
    #[inline(always)]
    fn decide(&self, key: &K, plan: PlanId, cost: u64, mode: Mode) -> Result<Decision, Error> {
        let now = clamp_now(self.clock.now());
        self.decide_at(key, self.key_hash(key), plan, cost, mode, now, true)
    }

    /// [`decide`](Self::decide) at `now`, for `key` hashed to `hash`; `short`: whether to try
    /// the short path first (a caller that just tried it passes false).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn decide_at(
        &self,
        key: &K,
        hash: u64,
        plan_id: PlanId,
        cost: u64,
        mode: Mode,
        now: u64,
        short: bool,
    ) -> Result<Decision, Error> {
        let book = self.book.current();
        let plan = book.get(plan_id)?;
        plan.check_cost(cost)?;
        let mode = plan.mode(mode);
        if let (Map::Flat(s), Mode::Check, true) = (&self.store, mode, short) {
            // Known states of a one-part plan (as `check` takes them) or of a two-part one
            // (the semantics of `charge_parts`): the short paths.
            let fast = match &plan.short {
                Short::One(words) => self.charge_short(s, words, hash, now, cost),
                Short::Two(words) => self.charge_short(s, words, hash, now, cost),
                Short::None => None,
            };
            if let Some(d) = fast {
                return Ok(d);
            }
        }
        #[cfg(feature = "redis")]
        if let Some(x) = &self.exact {
            // A penalty is this process's: it denies before anything else.
            if let Some(out) = self.blocked(key, hash, plan, now) {
                let mut d = out.decision;
                self.settle(plan, &mut d, 0, mode);
                return Ok(d);
            }
            // Exact mode decides on Redis, which a synchronous call cannot wait for: the
            // failure policy answers, as the plan's script would while Redis is out of reach.
            let mut d = x.sync_answer(key, plan_id, cost, mode)?;
            self.settle(plan, &mut d, 0, mode);
            return Ok(d);
        }
        let call = Call {
            book,
            key,
            hash,
            now,
            cost,
            headroom: plan.headroom,
            mode,
        };
        let (mut d, retries) = match self.charge(call, plan) {
            Ok(charged) => charged,
            Err(Full) => (self.table_full(plan), 0),
        };
        self.settle(plan, &mut d, retries, mode);
        Ok(d)
    }

    /// The last step of every decision: the plan's soft strategy lets an over-quota request
    /// through (flagged), and the outcome is counted (a peek counts nothing).
    #[inline(always)]
    fn settle(&self, plan: &Compiled, d: &mut Decision, retries: u32, mode: Mode) {
        soften(plan, d);
        if !mode.is_peek() {
            plan.counts.count(Count::of(d), retries);
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

/// The async twins without the `redis` feature, where every limiter is in process: each answers
/// at once with its synchronous call (with the feature they are defined beside exact mode, which
/// awaits Redis), so code written once runs on every backend.
#[cfg(not(feature = "redis"))]
impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// [`check`](Self::check) on every backend (in process: `check` itself).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(1)).build()?;
    /// assert!(limiter.check_async(&7).await.is_allowed());
    /// assert!(!limiter.check_async(&7).await.is_allowed());
    /// # Ok::<(), tollgate::Error>(()) }).unwrap();
    /// ```
    pub async fn check_async(&self, key: &K) -> Decision {
        self.check(key)
    }

    /// [`check_in`](Self::check_in) on every backend (in process: `check_in` itself).
    pub async fn check_in_async(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
    ) -> Result<Decision, Error> {
        self.check_in(key, plan, cost)
    }

    /// [`peek_in`](Self::peek_in) on every backend (in process: `peek_in` itself).
    pub async fn peek_in_async(&self, key: &K, plan: PlanId, cost: u64) -> Result<Decision, Error> {
        self.peek_in(key, plan, cost)
    }

    /// [`reset`](Self::reset) on every backend (in process: `reset` itself).
    pub async fn reset_async(&self, key: &K) -> Result<bool, Error> {
        Ok(self.reset(key))
    }

    /// [`reserve_in`](Self::reserve_in) on every backend (in process: `reserve_in` itself).
    pub async fn reserve_in_async(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
        max_delay: Duration,
    ) -> Result<Decision, Error> {
        self.reserve_in(key, plan, cost, max_delay)
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
