//! Exact mode's builder, [`RedisBuilder`], and the settings both modes' builders share
//! ([`Common`], `common_setters!`): what is checked before anything connects.

use std::sync::Arc;
use std::time::Duration;

use super::config::check_prefix;
use super::exact::{Counters, Inner, LocalShare, RedisLimiter};
use super::link::{Breaker, BreakerConfig, Link, Target};
use super::{FailurePolicy, RedisConfig, script};
use crate::algo::{Algorithm, Kind, Rule};
use crate::clock::{Clock, MonotonicClock};
use crate::error::Error;
use crate::plan::MAX_PARTS;
use crate::quota::Quota;

/// Default per-call deadline.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(5);

/// The largest window period exact mode accepts: 2^62 ns (about 146 years), so the period in
/// microseconds times a count stays within the script's exact range.
const MAX_WINDOW_PERIOD_NS: u64 = 1 << 62;

/// Settings shared by both modes.
#[derive(Clone)]
pub(super) struct Common {
    pub(super) target: Result<Target, Error>,
    pub(super) quotas: Vec<Quota>,
    /// Units of every quota left unavailable to this limiter's callers (a lower tier of a
    /// `Limiter` in exact mode; see `Plan::headroom`), 0 for a plain `RedisLimiter`.
    pub(super) headroom: u64,
    pub(super) prefix: String,
    pub(super) deadline: Duration,
    pub(super) policy: FailurePolicy,
    pub(super) breaker: BreakerConfig,
}

impl Common {
    pub(super) fn new(target: Result<Target, Error>) -> Common {
        Common {
            target,
            quotas: Vec::new(),
            headroom: 0,
            prefix: "tollgate:".into(),
            deadline: DEFAULT_DEADLINE,
            policy: FailurePolicy::Closed,
            breaker: BreakerConfig::DEFAULT,
        }
    }

    /// Checks the quotas for exact mode and compiles them on Unix time (phase 0).
    pub(super) fn rules(&self) -> Result<Vec<Rule>, Error> {
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
        check_prefix(&self.prefix)?;
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

    /// Each quota's share for [`FailurePolicy::LocalShare`] (`None` under another policy): a
    /// `nodes`-th of its limit and burst, at least 1.
    pub(crate) fn shares(&self) -> Option<Vec<Quota>> {
        let FailurePolicy::LocalShare { nodes } = self.policy else {
            return None;
        };
        let share = |q: &Quota| {
            Quota::new((q.limit() / nodes).max(1), q.period())
                .burst((q.burst_size() / nodes).max(1))
                .algorithm(q.algo())
        };
        Some(self.quotas.iter().map(share).collect())
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
            self.common.breaker =
                $crate::redis::link::BreakerConfig::new(threshold, min_backoff, max_backoff);
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

    /// Each quota's share under [`FailurePolicy::LocalShare`] (`None` under another policy),
    /// once the settings are checked: what the local share that `build` makes holds.
    pub(crate) fn shares(&self) -> Result<Option<Vec<Quota>>, Error> {
        self.common.rules()?;
        self.common.target.clone()?;
        Ok(self.common.shares())
    }

    /// The local clock.
    pub(crate) fn local_clock(&self) -> &C {
        &self.clock
    }

    /// The limiter, its local share (`local`, built from [`shares`](Self::shares)) answering
    /// for [`FailurePolicy::LocalShare`]. `build`, in `limiter/local_share.rs`.
    pub(crate) fn build_with(
        self,
        local: Option<Box<dyn LocalShare>>,
    ) -> Result<RedisLimiter<C>, Error> {
        let rules = self.common.rules()?;
        let target = self.common.target.clone()?;
        let kinds: Vec<Kind> = rules.iter().map(|r| r.kind).collect();
        let source = script::source(&kinds);
        let script = ::redis::Script::new(&source);
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
