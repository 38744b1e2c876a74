//! A limiter whose every decision is one Lua script on Redis, in exact mode (feature `redis`,
//! [`Builder::redis_exact`](super::Builder::redis_exact)).
//!
//! Each plan is a [`RedisLimiter`] over the plan's quotas (a compound plan is one script over
//! its parts, all or nothing), with the plan's `headroom` (a lower tier sees that much less of
//! every quota) and its strategy (soft flags, queue reserves). Redis names a (key, quota) state
//! by the key and the quota, so plans that list an equal quota share it per key, as in process.
//! The book, the plan names and ids and the per-plan stats are the local limiter's; its table
//! holds nothing but what the failure policy decides locally.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use super::Limiter;
use crate::cell::Mode;
use crate::clock::Clock;
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::plan::{Plan, PlanId, Strategy};
use crate::redis::{LocalShare, RedisConfig, RedisLimiter, ScriptCall};
use crate::sync::{AtomicU64, Ordering};

/// One plan on Redis.
#[derive(Clone)]
struct ExactPlan {
    redis: RedisLimiter,
    strategy: Strategy,
}

/// What an exact-mode limiter keeps beside its book.
pub(crate) struct Exact<K> {
    /// Each plan's Redis limiter, by plan id (rebuilt by `set_plan`). Read per call, never
    /// held across an await.
    plans: RwLock<Vec<Option<ExactPlan>>>,
    config: RedisConfig,
    /// The key's `Display`, which its Redis names escape (`redis::state_key`).
    name: fn(&K) -> String,
    /// Synchronous calls, answered by the failure policy.
    sync_calls: AtomicU64,
}

/// The three kinds of async call.
#[derive(Clone, Copy)]
enum Call {
    Check,
    Peek,
    Reserve(Duration),
}

impl<K> Exact<K> {
    /// Each of `plans` on Redis under `config`, by the ids `ids` gives them.
    pub(crate) fn new(
        config: RedisConfig,
        plans: &[(String, Plan)],
        ids: &HashMap<String, PlanId>,
        name: fn(&K) -> String,
    ) -> Result<Self, Error> {
        config.validate()?;
        let exact = Exact {
            plans: RwLock::new(Vec::new()),
            config,
            name,
            sync_calls: AtomicU64::new(0),
        };
        exact.install(plans, ids)?;
        Ok(exact)
    }

    /// Builds every plan's Redis limiter and installs them (all or none).
    pub(crate) fn install(
        &self,
        plans: &[(String, Plan)],
        ids: &HashMap<String, PlanId>,
    ) -> Result<(), Error> {
        let mut built: Vec<Option<ExactPlan>> = Vec::new();
        for (name, plan) in plans {
            let mut b = RedisLimiter::builder_of(&self.config).headroom(plan.headroom_units());
            for q in plan.quotas() {
                b = b.quota(*q);
            }
            let at = ids
                .get(name)
                .ok_or_else(|| Error::UnknownPlan(name.clone()))?
                .index();
            if built.len() <= at {
                built.resize_with(at + 1, || None);
            }
            built[at] = Some(ExactPlan {
                redis: b.build()?,
                strategy: plan.strategy_kind(),
            });
        }
        *self.plans.write().unwrap_or_else(|e| e.into_inner()) = built;
        Ok(())
    }

    /// Plan `plan`'s Redis limiter (a clone: an `Arc`).
    fn plan(&self, plan: PlanId) -> Result<ExactPlan, Error> {
        let plans = self.plans.read().unwrap_or_else(|e| e.into_inner());
        plans
            .get(plan.index())
            .and_then(Option::as_ref)
            .cloned()
            .ok_or_else(|| Error::UnknownPlan(format!("#{}", plan.index())))
    }

    /// What a synchronous call on an exact-mode limiter gets (in `mode`, the plan's strategy
    /// applied): the failure policy's answer, as the plan's script gets it while Redis is out
    /// of reach (`Closed`: denied until the breaker's next probe; `LocalShare`: the plan's
    /// in-memory share, `limit/nodes`), counted.
    pub(crate) fn sync_answer(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
        mode: Mode,
    ) -> Result<Decision, Error> {
        // Relaxed: a statistic.
        self.sync_calls.fetch_add(1, Ordering::Relaxed);
        Ok(self
            .plan(plan)?
            .redis
            .unreached(&(self.name)(key), cost, mode))
    }

    /// Synchronous calls answered by the policy so far.
    pub(crate) fn sync_calls(&self) -> u64 {
        // Relaxed: a statistic.
        self.sync_calls.load(Ordering::Relaxed)
    }
}

impl<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// [`check`](Self::check) on every backend: in exact mode ([`Builder::redis_exact`]) one
    /// script on Redis, elsewhere the same as `check` (so code written once runs on all three).
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// use tollgate::{Limiter, Quota};
    /// let limiter = Limiter::<u64>::builder().quota(Quota::per_second(1)).build_shared()?;
    /// assert!(limiter.check_async(&7).await.is_allowed());
    /// assert!(!limiter.check_async(&7).await.is_allowed());
    /// # Ok::<(), tollgate::Error>(()) }).unwrap();
    /// ```
    ///
    /// [`Builder::redis_exact`]: crate::Builder::redis_exact
    pub async fn check_async(&self, key: &K) -> Decision {
        self.check_in_async(key, PlanId::DEFAULT, 1)
            .await
            .unwrap_or_else(|_| Decision::denied(Reason::Limited, 0))
    }

    /// [`check_in`](Self::check_in) on every backend (see [`check_async`](Self::check_async)):
    /// the plan's strategy applies (soft flags, queue reserves up to its `max_delay`).
    pub async fn check_in_async(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
    ) -> Result<Decision, Error> {
        match &self.backend.exact {
            Some(x) => self.exact_call(x, key, plan, cost, Call::Check).await,
            None => self.check_in(key, plan, cost),
        }
    }

    /// [`peek_in`](Self::peek_in) on every backend (see [`check_async`](Self::check_async)):
    /// in exact mode the script decides and writes nothing.
    pub async fn peek_in_async(&self, key: &K, plan: PlanId, cost: u64) -> Result<Decision, Error> {
        match &self.backend.exact {
            Some(x) => self.exact_call(x, key, plan, cost, Call::Peek).await,
            None => self.peek_in(key, plan, cost),
        }
    }

    /// [`reserve_in`](Self::reserve_in) on every backend (see
    /// [`check_async`](Self::check_async)).
    pub async fn reserve_in_async(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
        max_delay: Duration,
    ) -> Result<Decision, Error> {
        match &self.backend.exact {
            Some(x) => {
                self.exact_call(x, key, plan, cost, Call::Reserve(max_delay))
                    .await
            }
            None => self.reserve_in(key, plan, cost, max_delay),
        }
    }

    /// [`reset`](Self::reset) on every backend: also the key's state on Redis, which a
    /// synchronous call cannot reach. In exact mode ([`Builder::redis_exact`]) its state under
    /// every plan's quotas is deleted there; synced, its global state under every rule and the
    /// units this process has not pushed yet. True if anything was tracked here or held there;
    /// an error when Redis could not be asked within the deadline (the local state is forgotten
    /// all the same).
    ///
    /// [`Builder::redis_exact`]: crate::Builder::redis_exact
    pub async fn reset_async(&self, key: &K) -> Result<bool, Error> {
        let mut any = self.reset(key);
        if let Some(x) = &self.backend.exact {
            let name = (x.name)(key);
            let plans: Vec<RedisLimiter> = {
                let plans = x.plans.read().unwrap_or_else(|e| e.into_inner());
                plans.iter().flatten().map(|p| p.redis.clone()).collect()
            };
            for redis in plans {
                any |= redis.reset(&name).await?;
            }
        }
        if let Some(sh) = &self.backend.synced {
            let rules = self.book.current().rules.clone();
            let (now, epoch) = (self.clock.now(), self.clock.unix_epoch_ns());
            any |= sh
                .forget(key, self.key_hash(key), &rules, now, epoch)
                .await?;
        }
        Ok(any)
    }

    /// Whether every decision is made on Redis ([`Builder::redis_exact`]).
    ///
    /// [`Builder::redis_exact`]: crate::Builder::redis_exact
    pub fn is_exact(&self) -> bool {
        self.backend.exact.is_some()
    }

    /// Synchronous calls an exact-mode limiter answered by its failure policy (they cannot wait
    /// for Redis); 0 elsewhere.
    pub fn sync_calls_degraded(&self) -> u64 {
        self.backend.exact.as_ref().map_or(0, Exact::sync_calls)
    }

    /// One decision on Redis, with the plan's strategy, counted in the plan's stats (a peek
    /// counts nothing, as in process).
    async fn exact_call(
        &self,
        x: &Exact<K>,
        key: &K,
        plan: PlanId,
        cost: u64,
        call: Call,
    ) -> Result<Decision, Error> {
        let compiled = self.book.current().get(plan)?;
        compiled.check_cost(cost)?;
        // A penalty (`block`) is this process's, and denies before Redis is asked.
        let now = super::clamp_now(self.clock.now());
        if let Some(out) = self.blocked(key, self.key_hash(key), compiled, now) {
            if !matches!(call, Call::Peek) {
                self.count_external(plan, &out.decision);
            }
            return Ok(out.decision);
        }
        let p = x.plan(plan)?;
        let name = (x.name)(key);
        let checked = match (call, p.strategy) {
            // A queue plan's peek is the reservation it would make, as in process.
            (Call::Peek, Strategy::Queue { max_delay }) => {
                p.redis.peek_reserve(&name, cost, max_delay).await?
            }
            (Call::Peek, _) => p.redis.peek(&name, cost).await?,
            (Call::Reserve(max), _) | (Call::Check, Strategy::Queue { max_delay: max }) => {
                p.redis.reserve(&name, cost, max).await?
            }
            (Call::Check, _) => p.redis.check_n(&name, cost).await?,
        };
        let mut d = checked.decision();
        super::soften(p.strategy, &mut d);
        if !matches!(call, Call::Peek) {
            self.count_external(plan, &d);
        }
        Ok(d)
    }

    /// A synchronous call's answer on an exact-mode limiter (`None` in process or synced: the
    /// engine decides). A penalty is this process's: it denies before anything else; otherwise
    /// the failure policy answers, as the plan's script would while Redis is out of reach
    /// (Redis decides exact mode, and a synchronous call cannot wait for it).
    pub(crate) fn remote_answer(
        &self,
        key: &K,
        plan: PlanId,
        req: super::engine::Request,
        mode: Mode,
    ) -> Option<Result<Decision, Error>> {
        let x = self.backend.exact.as_ref()?;
        let book = self.book.current();
        let compiled = match book.get(plan) {
            Ok(compiled) => compiled,
            Err(e) => return Some(Err(e)),
        };
        if let Some(out) = self.blocked(key, req.hash, compiled, req.now) {
            return Some(Ok(out.decision));
        }
        Some(x.sync_answer(key, plan, req.cost, mode))
    }
}

impl<C: Clock + Clone> crate::redis::RedisBuilder<C> {
    /// Checks the settings. Does not connect: a limiter starts while Redis is down.
    ///
    /// ```
    /// use tollgate::{Error, Quota};
    /// use tollgate::redis::RedisLimiter;
    /// let bad = RedisLimiter::builder("redis://127.0.0.1:1/").quota(Quota::per_second(0)).build();
    /// assert!(matches!(bad, Err(Error::ZeroLimit)));
    /// let bad = RedisLimiter::builder("no-such-scheme://x").quota(Quota::per_second(5)).build();
    /// assert!(matches!(bad, Err(Error::Config { .. })));
    /// ```
    pub fn build(self) -> Result<RedisLimiter<C>, Error> {
        // The local share, an in-process limiter of each quota's share, is made here, above
        // the Redis backend, and handed down to it.
        let local = match self.shares()? {
            None => None,
            Some(shares) => {
                let mut b = Limiter::<String>::builder().clock(self.local_clock().clone());
                for q in shares {
                    b = b.quota(q);
                }
                Some(Box::new(b.build()?) as Box<dyn LocalShare>)
            }
        };
        self.build_with(local)
    }
}

/// The local share of [`FailurePolicy::LocalShare`](crate::redis::FailurePolicy::LocalShare):
/// the default plan of an in-process limiter of each quota's share.
impl<C: Clock> LocalShare for Limiter<String, C> {
    fn decide(&self, key: &str, cost: u64, call: ScriptCall) -> Option<Decision> {
        let key = key.to_string();
        let plan = PlanId::DEFAULT;
        match call {
            ScriptCall::Peek(_) => self.peek_in(&key, plan, cost).ok(),
            ScriptCall::Reserve(max) => self
                .reserve_in(&key, plan, cost, Duration::from_nanos(max))
                .ok(),
            ScriptCall::Check => self.check_n(&key, cost).ok(),
        }
    }
}
