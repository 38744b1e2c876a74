//! Building a [`Limiter`]: its plans, store, cap, clock and backend (in process, or through
//! Redis in synced or exact mode).

use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use super::book::{Book, Books};
use super::penalty::Penalties;
use super::{Limiter, Map};
use crate::clock::{Clock, MonotonicClock, nanos};
use crate::error::Error;
use crate::plan::{Plan, Strategy};
use crate::quota::Quota;
use crate::stats::Counters;
use crate::store::{OnFull, StoreKind};
use crate::sync::AtomicUsize;

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
            backend: super::Backend::in_process(),
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
            limiter.backend.exact = Some(super::exact::Exact::new(
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
            super::synced::check_rules(&limiter.book.current().rules)?;
            limiter.backend.synced = Some(super::synced::Synced::new(
                redis,
                <K as ToString>::to_string,
            )?);
            let limiter = Arc::new(limiter);
            super::synced::spawn_rounds(&limiter, interval)?;
            return Ok(limiter);
        }
        self.build_local().map(Arc::new)
    }
}

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
