//! Cluster-wide limits on Redis, Redis Cluster or Valkey (feature `redis`).
//!
//! Two modes:
//!
//! - [`RedisLimiter`], **exact mode**: every check is one Lua script that reads, decides and
//!   writes atomically on the server, with the server's clock (`TIME`), so every app server gets
//!   exactly the [`Decision`] the in-process engine would give for the same history, whatever its
//!   own clock says. Compound limits (several quotas) are all-or-nothing in one script; their
//!   keys share a hash tag, so they live in one Cluster slot.
//! - [`SyncedLimiter`], **synced mode**: local atomic cells answer at in-process speed, and a
//!   background task reconciles local consumption with Redis in pipelined batches. It over-admits
//!   by a bounded amount (see its docs).
//!
//! When Redis is down, slow or has lost its data, a [`FailurePolicy`] answers instead: fail open,
//! fail closed, or a local share of the quota. Each call has a deadline; a circuit breaker stops
//! calling a dead server and probes it with backoff; nothing is queued while it is down, and a
//! call whose outcome is unknown is never replayed. Every degraded decision is counted in
//! [`RedisStats`].

mod config;
pub(crate) mod link;
mod name;
pub(crate) mod round;
mod script;
mod synced;
#[cfg(test)]
mod tests;
pub(crate) mod track;

use std::sync::Arc;
use std::time::Duration;

use ::redis::{Cmd, Value};

use crate::algo::{Algorithm, Kind, Rule};
use crate::clock::{Clock, MonotonicClock, nanos};
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::limiter::Limiter;
use crate::plan::MAX_PARTS;
use crate::quota::Quota;
use crate::sync::{AtomicU64, Ordering};

use link::{Breaker, BreakerConfig, Gate, Link, Target};
pub(crate) use name::state_key;
use script::Call;

pub use config::RedisConfig;
pub use synced::{SyncedBuilder, SyncedLimiter, SyncedStats};

/// What a limiter answers when Redis cannot.
///
/// | policy | while Redis is unreachable | use when |
/// |---|---|---|
/// | `Open` | every request passes | availability matters more than the limit |
/// | `Closed` (default) | every request is denied, `retry_after` = time to the next probe | the limit protects something fragile (logins, payments) |
/// | `LocalShare { nodes }` | exact mode: each process enforces `1/nodes` of every quota on its own; synced mode: each process's local cells go on deciding alone, with the whole quota (`nodes` unused) | a rough limit beats none and beats a full stop |
///
/// ```
/// use tollgate::redis::FailurePolicy;
/// let p = FailurePolicy::LocalShare { nodes: 4 };
/// assert_ne!(p, FailurePolicy::Closed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let every request through.
    Open,
    /// Deny every request.
    #[default]
    Closed,
    /// Exact mode: enforce `limit / nodes` (and `burst / nodes`, at least 1) per process, in
    /// memory. Synced mode: the local cells go on deciding alone, each process with the whole
    /// quota from what it last knew (so up to `N` times it in all; `nodes` is not used).
    LocalShare {
        /// How many processes share the quota.
        nodes: u64,
    },
}

/// Who answered a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// Redis, exactly.
    Redis,
    /// The policy let it through: Redis could not answer.
    FailedOpen,
    /// The policy denied it: Redis could not answer.
    FailedClosed,
    /// The local share answered: Redis could not.
    LocalShare,
}

/// A decision and where it came from.
///
/// ```
/// use tollgate::redis::{Checked, Source};
/// fn header(c: &Checked) -> &'static str {
///     if c.source() == Source::Redis { "exact" } else { "degraded" }
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a Checked holds whether the request may pass"]
pub struct Checked {
    decision: Decision,
    source: Source,
    server_time_ns: Option<u64>,
}

impl Checked {
    /// The decision.
    pub fn decision(&self) -> Decision {
        self.decision
    }
    /// Who made it.
    pub fn source(&self) -> Source {
        self.source
    }
    /// True when the failure policy answered instead of Redis.
    pub fn is_degraded(&self) -> bool {
        self.source != Source::Redis
    }
    /// The Redis server's Unix time (ns, microsecond resolution) the decision was made at;
    /// `None` when degraded.
    pub fn server_time_ns(&self) -> Option<u64> {
        self.server_time_ns
    }
}

/// Counters of a Redis-backed limiter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Decisions Redis made.
    pub exact: u64,
    /// Degraded decisions: let through by [`FailurePolicy::Open`].
    pub failed_open: u64,
    /// Degraded decisions: denied by [`FailurePolicy::Closed`].
    pub failed_closed: u64,
    /// Degraded decisions: made by the local share.
    pub local_share: u64,
    /// Calls that hit their deadline (outcome unknown; never replayed).
    pub timeouts: u64,
    /// Calls that failed with an error (connection refused or dropped, a server error).
    pub errors: u64,
    /// Calls answered by the policy without trying Redis because the breaker was open.
    pub short_circuited: u64,
    /// Times the breaker opened.
    pub breaker_opens: u64,
    /// Probes sent while the breaker was open.
    pub probes: u64,
    /// Scripts reloaded after NOSCRIPT (a flush, a restart, a failover).
    pub reloads: u64,
    /// Connections made.
    pub connects: u64,
    /// Calls waiting on Redis right now.
    pub in_flight: u64,
    /// Times the script's verdict and the in-process algorithm disagreed (a bug if non-zero).
    pub mismatches: u64,
}

impl RedisStats {
    /// All degraded decisions.
    pub fn degraded(&self) -> u64 {
        self.failed_open + self.failed_closed + self.local_share
    }
}

/// The open policy's answer while Redis cannot give one: admitted, with nothing known of what
/// remains (every mode's `FailurePolicy::Open`).
pub(crate) fn open_decision(limit: u64) -> Decision {
    Decision {
        allowed: true,
        reason: Reason::Within,
        limit,
        remaining: 0,
        reset_after_ns: 0,
        retry_after_ns: 0,
        delay_ns: 0,
    }
}

/// Default per-call deadline.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(5);

/// The largest window period exact mode accepts: 2^62 ns (about 146 years), so the period in
/// microseconds times a count stays within the script's exact range.
const MAX_WINDOW_PERIOD_NS: u64 = 1 << 62;

/// Settings shared by both modes.
#[derive(Clone)]
struct Common {
    target: Result<Target, Error>,
    quotas: Vec<Quota>,
    /// Units of every quota left unavailable to this limiter's callers (a lower tier of a
    /// `Limiter` in exact mode; see `Plan::headroom`), 0 for a plain `RedisLimiter`.
    headroom: u64,
    prefix: String,
    deadline: Duration,
    policy: FailurePolicy,
    breaker: BreakerConfig,
}

impl Common {
    fn new(target: Result<Target, Error>) -> Common {
        Common {
            target,
            quotas: Vec::new(),
            headroom: 0,
            prefix: "tollgate:".into(),
            deadline: DEFAULT_DEADLINE,
            policy: FailurePolicy::Closed,
            breaker: BreakerConfig {
                threshold: 3,
                min_backoff_ns: 100_000_000,
                max_backoff_ns: 5_000_000_000,
            },
        }
    }

    /// Checks the quotas for exact mode and compiles them on Unix time (phase 0).
    fn rules(&self) -> Result<Vec<Rule>, Error> {
        if self.quotas.is_empty() {
            return Err(Error::NoQuota);
        }
        if self.quotas.len() > MAX_PARTS {
            return Err(Error::Config {
                line: None,
                message: format!(
                    "redis limiter combines {} quotas; at most {MAX_PARTS}",
                    self.quotas.len()
                ),
            });
        }
        if self.deadline.is_zero() {
            return Err(Error::Config {
                line: None,
                message: "redis deadline is 0: a call needs some time to reach Redis".into(),
            });
        }
        if self.prefix.contains(['{', '}']) {
            return Err(Error::Config {
                line: None,
                message: format!(
                    "redis prefix '{}' contains a brace: the hash tag must be the key's own",
                    self.prefix
                ),
            });
        }
        if let FailurePolicy::LocalShare { nodes: 0 } = self.policy {
            return Err(Error::Config {
                line: None,
                message: "FailurePolicy::LocalShare nodes is 0: at least 1 process shares it"
                    .into(),
            });
        }
        let mut rules = Vec::new();
        for q in &self.quotas {
            let r = q.compile(0)?;
            if matches!(r.kind, Kind::Fixed | Kind::Sliding)
                && (r.period % 1000 != 0 || r.period > MAX_WINDOW_PERIOD_NS)
            {
                return Err(Error::Config {
                    line: None,
                    message: format!(
                        "redis: {} period {} ns must be a whole number of microseconds, at most 2^62 ns",
                        r.algorithm.name(),
                        r.period
                    ),
                });
            }
            rules.push(r);
        }
        Ok(rules)
    }

    /// The in-process limiter that answers for [`FailurePolicy::LocalShare`].
    fn local_share<C: Clock>(&self, clock: C) -> Result<Option<Limiter<String, C>>, Error> {
        let FailurePolicy::LocalShare { nodes } = self.policy else {
            return Ok(None);
        };
        let mut b = Limiter::<String>::builder().clock(clock);
        for q in &self.quotas {
            let share = Quota::new((q.limit() / nodes).max(1), q.period())
                .burst((q.burst_size() / nodes).max(1))
                .algorithm(q.algo());
            b = b.quota(share);
        }
        b.build().map(Some)
    }
}

/// Builds a [`RedisLimiter`]. Nothing connects until the first call.
pub struct RedisBuilder<C = MonotonicClock> {
    common: Common,
    clock: C,
}

macro_rules! common_setters {
    () => {
        /// Adds a quota; several make a compound limit (all pass or nothing is charged).
        pub fn quota(mut self, quota: $crate::Quota) -> Self {
            self.common.quotas.push(quota);
            self
        }
        /// The prefix of every key this limiter writes (default `tollgate:`; a brace in it is
        /// an error). Keys are named by client and quota (`prefix{client}:quota`), so limiters
        /// under one prefix that list an equal quota share each client's state under it, as an
        /// in-process limiter's plans do. The client is written with `%`, `{` and `}` as `%25`,
        /// `%7B` and `%7D` (the empty client as `%`): distinct clients never share a name, and
        /// the part in braces is the client's Cluster hash tag, one slot for all its states.
        pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
            self.common.prefix = prefix.into();
            self
        }
        /// How long a call may wait for Redis before the policy answers (default 5 ms).
        pub fn deadline(mut self, deadline: Duration) -> Self {
            self.common.deadline = deadline;
            self
        }
        /// What answers when Redis cannot (default [`FailurePolicy::Closed`]).
        pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
            self.common.policy = policy;
            self
        }
        /// The circuit breaker: opens after `threshold` consecutive failures, then probes after
        /// `min_backoff`, doubling up to `max_backoff` while probes fail (defaults 3, 100 ms, 5 s).
        pub fn breaker(
            mut self,
            threshold: u64,
            min_backoff: Duration,
            max_backoff: Duration,
        ) -> Self {
            let min = $crate::clock::nanos(min_backoff).max(1);
            self.common.breaker = $crate::redis::link::BreakerConfig {
                threshold: threshold.max(1),
                min_backoff_ns: min,
                max_backoff_ns: $crate::clock::nanos(max_backoff).max(min),
            };
            self
        }
    };
}
pub(crate) use common_setters;

impl RedisLimiter {
    /// A builder on the server, prefix, deadline, failure policy and breaker of `cfg` (its
    /// interval, synced mode's, is unused here): a `Limiter`'s plans in exact mode.
    pub(crate) fn builder_of(cfg: &RedisConfig) -> RedisBuilder {
        RedisBuilder {
            common: Common {
                target: cfg.target.clone(),
                quotas: Vec::new(),
                headroom: 0,
                prefix: cfg.prefix.clone(),
                deadline: cfg.deadline,
                policy: cfg.policy,
                breaker: cfg.breaker,
            },
            clock: MonotonicClock::new(),
        }
    }

    /// A builder for one Redis server (or a Valkey), e.g. `redis://127.0.0.1:6379/`.
    /// A malformed URL is an [`Error::Config`] from `build`.
    pub fn builder(url: &str) -> RedisBuilder {
        RedisBuilder {
            common: Common::new(Target::single(url)),
            clock: MonotonicClock::new(),
        }
    }

    /// A builder for a Redis Cluster, from one or more seed nodes.
    pub fn cluster_builder(nodes: &[&str]) -> RedisBuilder {
        RedisBuilder {
            common: Common::new(Target::cluster(nodes, DEFAULT_DEADLINE)),
            clock: MonotonicClock::new(),
        }
    }
}

impl<C: Clock + Clone> RedisBuilder<C> {
    common_setters!();

    /// Leaves `units` of every quota unavailable to this limiter's callers (a lower tier; see
    /// `Plan::headroom`). The `Limiter`'s plans in exact mode; checked against the quotas there.
    pub(crate) fn headroom(mut self, units: u64) -> Self {
        self.common.headroom = units;
        self
    }

    /// The local clock: it times the breaker's backoff and runs the local share. Decisions Redis
    /// makes use the server's clock only, so app servers with skewed clocks agree.
    pub fn clock<C2: Clock>(self, clock: C2) -> RedisBuilder<C2> {
        RedisBuilder {
            common: self.common,
            clock,
        }
    }

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
        let rules = self.common.rules()?;
        let target = self.common.target.clone()?;
        let kinds: Vec<Kind> = rules.iter().map(|r| r.kind).collect();
        let source = script::source(&kinds);
        let script = ::redis::Script::new(&source);
        let local = self.common.local_share(self.clock.clone())?;
        Ok(RedisLimiter {
            inner: Arc::new(Inner {
                max_cost: rules.iter().map(|r| r.capacity).min().unwrap_or(0),
                names: rule_names(&rules),
                headroom: self.common.headroom,
                rules,
                sha: script.get_hash().to_string(),
                source,
                link: Link::new(target),
                breaker: Breaker::new(self.common.breaker),
                prefix: self.common.prefix,
                deadline: self.common.deadline,
                policy: self.common.policy,
                local,
                clock: self.clock,
                counters: Counters::default(),
            }),
        })
    }
}

impl<C: Clock> Clone for RedisBuilder<C>
where
    C: Clone,
{
    fn clone(&self) -> Self {
        RedisBuilder {
            common: self.common.clone(),
            clock: self.clock.clone(),
        }
    }
}

/// Exact mode: every decision is one atomic Lua script on Redis. Cheap to clone (clones share
/// the connection and the counters).
///
/// ```no_run
/// # async fn demo() -> Result<(), tollgate::Error> {
/// use std::time::Duration;
/// use tollgate::Quota;
/// use tollgate::redis::{FailurePolicy, RedisLimiter};
///
/// let limiter = RedisLimiter::builder("redis://127.0.0.1:6379/")
///     .quota(Quota::per_second(10))
///     .quota(Quota::per_day(1000))          // compound: both must pass
///     .deadline(Duration::from_millis(5))
///     .on_failure(FailurePolicy::LocalShare { nodes: 4 })
///     .build()?;
/// let c = limiter.check("user:42").await;
/// if !c.decision().is_allowed() {
///     println!("429, retry after {:?}", c.decision().retry_after());
/// }
/// # Ok(()) }
/// ```
pub struct RedisLimiter<C = MonotonicClock> {
    inner: Arc<Inner<C>>,
}

/// Each rule's part of its Redis keys' names: the rule itself (algorithm, limit, period in ns,
/// burst), so a key's state under a quota is one Redis key whichever limiters (plans) list that
/// quota under one prefix, as an in-process limiter keeps one state per (key, rule). A quota
/// listed twice by one limiter keeps one key each (`~` and its place).
fn rule_names(rules: &[Rule]) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(rules.len());
    for (i, r) in rules.iter().enumerate() {
        let algorithm = match r.algorithm {
            Algorithm::TokenBucket => 't',
            Algorithm::LeakyBucket => 'l',
            Algorithm::FixedWindow => 'f',
            Algorithm::SlidingWindowCounter => 's',
            Algorithm::SlidingWindowLog => 'w',
        };
        let mut name = format!("{algorithm}{}/{}+{}", r.limit, r.period, r.capacity);
        if names.contains(&name) {
            name = format!("{name}~{i}");
        }
        names.push(name);
    }
    names
}

impl<C> Clone for RedisLimiter<C> {
    fn clone(&self) -> Self {
        RedisLimiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<C> {
    rules: Vec<Rule>,
    /// Each rule's part of its Redis keys' names (see [`rule_names`]).
    names: Vec<String>,
    /// See [`Common::headroom`].
    headroom: u64,
    max_cost: u64,
    sha: String,
    source: String,
    link: Link,
    breaker: Breaker,
    prefix: String,
    deadline: Duration,
    policy: FailurePolicy,
    local: Option<Limiter<String, C>>,
    clock: C,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    exact: AtomicU64,
    failed_open: AtomicU64,
    failed_closed: AtomicU64,
    local_share: AtomicU64,
    timeouts: AtomicU64,
    errors: AtomicU64,
    short_circuited: AtomicU64,
    breaker_opens: AtomicU64,
    probes: AtomicU64,
    reloads: AtomicU64,
    in_flight: AtomicU64,
    mismatches: AtomicU64,
}

/// Adds one to a statistic.
fn bump(c: &AtomicU64) {
    // Relaxed: statistics; one RMW each, so none is lost.
    c.fetch_add(1, Ordering::Relaxed);
}

/// Counts a call as in flight until dropped (also when the caller drops the future).
struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    fn new(c: &'a AtomicU64) -> Self {
        bump(c);
        InFlight(c)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // Relaxed: a gauge; paired increments and decrements are each one RMW.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Releases the probe slot if a probing call is dropped before it learns its outcome.
struct ProbeGuard<'a> {
    breaker: &'a Breaker,
    armed: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.breaker.abandon();
        }
    }
}

/// Why a call did not get an answer from Redis.
enum Failure {
    Timeout,
    Redis(::redis::RedisError),
    Reply,
}

impl<C: Clock> RedisLimiter<C> {
    /// Checks one unit for `key`. Never fails: when Redis cannot answer, the policy does.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
    /// use std::time::Duration;
    /// use tollgate::Quota;
    /// use tollgate::redis::{FailurePolicy, RedisLimiter, Source};
    /// // Nothing listens on port 1: the failure policy answers, within the deadline.
    /// let limiter = RedisLimiter::builder("redis://127.0.0.1:1/")
    ///     .quota(Quota::per_second(10))
    ///     .deadline(Duration::from_millis(50))
    ///     .on_failure(FailurePolicy::Closed)
    ///     .build()?;
    /// let c = limiter.check("user:42").await;
    /// assert!(!c.decision().is_allowed());
    /// assert_eq!(c.source(), Source::FailedClosed);
    /// assert!(c.is_degraded());
    /// # Ok::<(), tollgate::Error>(()) }).unwrap();
    /// ```
    pub async fn check(&self, key: &str) -> Checked {
        // Cost 1 is always valid (every quota holds at least one unit), so the error arm is
        // never taken; it answers by the policy rather than panic.
        match self.call(key, 1, Call::Check).await {
            Ok(c) => c,
            Err(_) => self.degraded(key, 1, self.inner.clock.now(), Call::Check),
        }
    }

    /// Checks `cost` units for `key`. A zero cost, or one above the smallest capacity, is an
    /// error (it could never pass).
    pub async fn check_n(&self, key: &str, cost: u64) -> Result<Checked, Error> {
        self.call(key, cost, Call::Check).await
    }

    /// The queue strategy (leaky bucket as a shaper): admits `cost` units for the moment they
    /// conform if that is at most `max_delay` away (`delay` in the decision says how long to
    /// wait). Window parts admit now or deny, as in process.
    pub async fn reserve(
        &self,
        key: &str,
        cost: u64,
        max_delay: Duration,
    ) -> Result<Checked, Error> {
        self.call(key, cost, Call::Reserve(nanos(max_delay))).await
    }

    /// What [`check_n`](Self::check_n) would answer now, charging nothing (the script decides
    /// and writes nothing). The same errors.
    pub async fn peek(&self, key: &str, cost: u64) -> Result<Checked, Error> {
        self.call(key, cost, Call::Peek(None)).await
    }

    /// What [`reserve`](Self::reserve) would answer now, reserving nothing (a queue plan's
    /// peek in exact mode).
    pub(crate) async fn peek_reserve(
        &self,
        key: &str,
        cost: u64,
        max_delay: Duration,
    ) -> Result<Checked, Error> {
        self.call(key, cost, Call::Peek(Some(nanos(max_delay))))
            .await
    }

    /// The counters.
    pub fn stats(&self) -> RedisStats {
        let c = &self.inner.counters;
        // Relaxed (all): a snapshot of statistics.
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RedisStats {
            exact: r(&c.exact),
            failed_open: r(&c.failed_open),
            failed_closed: r(&c.failed_closed),
            local_share: r(&c.local_share),
            timeouts: r(&c.timeouts),
            errors: r(&c.errors),
            short_circuited: r(&c.short_circuited),
            breaker_opens: r(&c.breaker_opens),
            probes: r(&c.probes),
            reloads: r(&c.reloads),
            connects: r(&self.inner.link.connects),
            in_flight: r(&c.in_flight),
            mismatches: r(&c.mismatches),
        }
    }

    /// The SHA1 of this limiter's script (what it sends with EVALSHA), for other tools such as
    /// `redis-benchmark`.
    pub fn script_sha(&self) -> &str {
        &self.inner.sha
    }

    /// True while the circuit breaker is open (Redis is considered down).
    pub fn is_degraded(&self) -> bool {
        self.inner.breaker.is_open()
    }

    /// Forgets `key` on Redis: deletes its state under every quota (its [`keys_of`]), so it
    /// starts afresh in every process. True if any existed; an error when Redis could not be
    /// asked within the deadline (nothing is assumed deleted then).
    ///
    /// [`keys_of`]: Self::keys_of
    pub async fn reset(&self, key: &str) -> Result<bool, Error> {
        let inner = &*self.inner;
        link::delete(&inner.link, inner.deadline, &self.keys_of(key))
            .await
            .map(|n| n > 0)
    }

    /// The Redis keys that hold `key`'s state (one per quota; two for a sliding log), for
    /// inspection and tests. They share one hash tag, so one Cluster slot: `key` escaped
    /// (`%`, `{` and `}` as `%25`, `%7B` and `%7D`; the empty key as `%`), so two keys never
    /// share a name.
    ///
    /// ```
    /// use tollgate::Quota;
    /// use tollgate::redis::RedisLimiter;
    /// let l = RedisLimiter::builder("redis://127.0.0.1:1/").quota(Quota::per_second(1)).build()?;
    /// assert_eq!(l.keys_of("u1"), vec!["tollgate:{u1}:t1/1000000000+1".to_string()]);
    /// // Braces and `%` are escaped, so "{u1}" is not "u1" and its tag has no brace.
    /// assert_eq!(l.keys_of("{u1}"), vec!["tollgate:{%7Bu1%7D}:t1/1000000000+1".to_string()]);
    /// # Ok::<(), tollgate::Error>(())
    /// ```
    pub fn keys_of(&self, key: &str) -> Vec<String> {
        let mut keys = Vec::new();
        for (r, name) in self.inner.rules.iter().zip(&self.inner.names) {
            let k = state_key(&self.inner.prefix, key, name);
            if r.kind == Kind::Log {
                keys.push(format!("{k}:n"));
                keys.insert(keys.len() - 1, k);
            } else {
                keys.push(k);
            }
        }
        keys
    }

    async fn call(&self, key: &str, cost: u64, call: Call) -> Result<Checked, Error> {
        let inner = &*self.inner;
        if cost == 0 {
            return Err(Error::ZeroCost);
        }
        if cost > inner.max_cost {
            return Err(Error::CostExceedsCapacity {
                cost,
                capacity: inner.max_cost,
            });
        }
        let now = inner.clock.now();
        let gate = inner.breaker.gate(now);
        if gate == Gate::Shut {
            bump(&inner.counters.short_circuited);
            return Ok(self.degraded(key, cost, now, call));
        }
        if gate == Gate::Probe {
            bump(&inner.counters.probes);
        }
        let mut probe = ProbeGuard {
            breaker: &inner.breaker,
            armed: gate == Gate::Probe,
        };
        let outcome = {
            let _flight = InFlight::new(&inner.counters.in_flight);
            match tokio::time::timeout(inner.deadline, self.run(key, cost, call)).await {
                Ok(r) => r,
                Err(_) => Err(Failure::Timeout),
            }
        };
        probe.armed = false;
        match outcome {
            Ok((decision, server_now)) => {
                inner.breaker.success(gate);
                bump(&inner.counters.exact);
                Ok(Checked {
                    decision,
                    source: Source::Redis,
                    server_time_ns: Some(server_now),
                })
            }
            Err(f) => {
                let now = inner.clock.now();
                match &f {
                    Failure::Timeout => bump(&inner.counters.timeouts),
                    Failure::Redis(_) | Failure::Reply => bump(&inner.counters.errors),
                }
                let dropped = matches!(&f, Failure::Redis(e) if e.is_io_error()
                    || e.is_connection_dropped() || e.is_connection_refusal());
                if matches!(&f, Failure::Redis(e) if key_local(e)) {
                    // This key's state is unreadable (another program wrote the key): the
                    // server is fine, so the breaker is not involved; the policy answers.
                    if gate == Gate::Probe {
                        inner.breaker.success(gate);
                    }
                    return Ok(self.degraded(key, cost, now, call));
                }
                if inner.breaker.failure(gate, now) {
                    bump(&inner.counters.breaker_opens);
                    // Abandon the connection with whatever is stuck on it.
                    inner.link.reset();
                } else if dropped || gate == Gate::Probe {
                    inner.link.reset();
                }
                Ok(self.degraded(key, cost, now, call))
            }
        }
    }

    /// One script call: EVALSHA, and once more with the source on NOSCRIPT (the script did not
    /// run, so this is not a replay).
    async fn run(&self, key: &str, cost: u64, call: Call) -> Result<(Decision, u64), Failure> {
        let inner = &*self.inner;
        let mut conn = inner.link.get().await.map_err(Failure::Redis)?;
        let keys = self.keys_of(key);
        let mut args: Vec<String> = vec![call.count_arg(inner.rules.len())];
        for r in &inner.rules {
            args.extend(script::part_args(r, cost, call, inner.headroom));
        }
        let mut cmd = Cmd::new();
        cmd.arg("EVALSHA")
            .arg(&inner.sha)
            .arg(keys.len())
            .arg(&keys)
            .arg(&args);
        let value: Value = match conn.query(&cmd).await {
            Ok(v) => v,
            Err(e)
                if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) =>
            {
                bump(&inner.counters.reloads);
                let mut eval = Cmd::new();
                eval.arg("EVAL")
                    .arg(&inner.source)
                    .arg(keys.len())
                    .arg(&keys)
                    .arg(&args);
                conn.query(&eval).await.map_err(Failure::Redis)?
            }
            Err(e) => return Err(Failure::Redis(e)),
        };
        let (all, now, replies) =
            script::parse_reply(&value, inner.rules.len()).map_err(|_| Failure::Reply)?;
        let (decision, mismatches) =
            script::combine(&inner.rules, &replies, now, cost, call, inner.headroom)
                .map_err(|_| Failure::Reply)?;
        if mismatches > 0 || decision.allowed != all {
            bump(&inner.counters.mismatches);
        }
        // The script's verdict is what was written; report that.
        let mut decision = decision;
        decision.allowed = all;
        if !all && decision.reason == Reason::Within {
            decision.reason = Reason::Limited;
        }
        Ok((decision, now))
    }

    /// The policy's answer to a call in `mode` that cannot reach Redis at all (a synchronous
    /// call on an exact-mode `Limiter`): as while Redis is out of reach, counted as degraded.
    pub(crate) fn unreached(&self, key: &str, cost: u64, mode: crate::cell::Mode) -> Decision {
        use crate::cell::Mode;
        let call = match mode {
            Mode::Check => Call::Check,
            Mode::Reserve(max) => Call::Reserve(max),
            Mode::Peek => Call::Peek(None),
            Mode::PeekReserve(max) => Call::Peek(Some(max)),
        };
        self.degraded(key, cost, self.inner.clock.now(), call)
            .decision
    }

    /// The policy's answer when Redis cannot give one.
    fn degraded(&self, key: &str, cost: u64, now: u64, call: Call) -> Checked {
        let inner = &*self.inner;
        let limit = inner.rules[0].capacity;
        match inner.policy {
            FailurePolicy::Open => {
                bump(&inner.counters.failed_open);
                Checked {
                    decision: open_decision(limit),
                    source: Source::FailedOpen,
                    server_time_ns: None,
                }
            }
            FailurePolicy::LocalShare { .. } => {
                bump(&inner.counters.local_share);
                // A cost above the share's smaller capacity can never pass locally: a denial.
                let decision = inner
                    .local
                    .as_ref()
                    .and_then(|l| {
                        let key = key.to_string();
                        let plan = l.plan("default")?;
                        match call {
                            Call::Peek(_) => l.peek_in(&key, plan, cost).ok(),
                            Call::Reserve(max) => l
                                .reserve_in(&key, plan, cost, Duration::from_nanos(max))
                                .ok(),
                            Call::Check => l.check_n(&key, cost).ok(),
                        }
                    })
                    .unwrap_or(Decision {
                        limit,
                        ..Decision::denied(Reason::Limited, 0)
                    });
                Checked {
                    decision,
                    source: Source::LocalShare,
                    server_time_ns: None,
                }
            }
            FailurePolicy::Closed => {
                bump(&inner.counters.failed_closed);
                let wait = inner.breaker.wait_ns(now);
                Checked {
                    decision: Decision {
                        limit,
                        reset_after_ns: wait,
                        ..Decision::denied(Reason::Limited, wait)
                    },
                    source: Source::FailedClosed,
                    server_time_ns: None,
                }
            }
        }
    }
}

/// True for an error that concerns one key's contents, not the server's health: a value of the
/// wrong type (`WRONGTYPE`, from Redis) or of a shape this limiter never writes (the script's
/// own `TOLLGATE_FOREIGN`): another program's data. Read from the message, where both servers
/// put it (Redis 7 replies `WRONGTYPE ...` and `ERR user_script:N: TOLLGATE_FOREIGN ...`;
/// Redis 6 wraps either in `ERR Error running script ...`).
fn key_local(e: &::redis::RedisError) -> bool {
    let msg = e.to_string();
    msg.contains("WRONGTYPE") || msg.contains("TOLLGATE_FOREIGN")
}

impl std::fmt::Debug for Common {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Common")
            .field("quotas", &self.quotas)
            .field("prefix", &self.prefix)
            .field("deadline", &self.deadline)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl<C: std::fmt::Debug> std::fmt::Debug for RedisBuilder<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBuilder")
            .field("common", &self.common)
            .field("clock", &self.clock)
            .finish()
    }
}

impl<C> std::fmt::Debug for RedisLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter").finish_non_exhaustive()
    }
}
