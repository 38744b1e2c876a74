//! [`RedisConfig`]: where and how a [`Limiter`](crate::Limiter) or the HTTP layer reaches Redis.

use std::time::Duration;

use super::FailurePolicy;
use super::link::{BreakerConfig, Target};
use super::round::{DEFAULT_INTERVAL, DEFAULT_ROUND_DEADLINE};
use crate::error::Error;

/// The Redis a limiter's states live on: the server (or Cluster), key prefix, deadline, failure
/// policy and breaker, and synced mode's interval. With
/// [`Builder::redis_synced`](crate::Builder::redis_synced) it makes every state of a
/// [`Limiter`](crate::Limiter) (each plan's, each quota's, each key's) cluster-wide in synced mode: checks decide on the local table at in-process
/// speed, and a background task pushes what each (key, quota) admitted here to Redis every
/// `interval` and adopts the global state it gets back. Plans, `check_in`, compound plans,
/// tiers, `check_all`, `peek`, `reserve`, the strategies and the stats work as in process, with
/// each algorithm's over-admission bound (see [`SyncedLimiter`](super::SyncedLimiter)); sliding
/// logs are exact mode only (a construction error here).
///
/// Set it with [`Builder::redis_synced`](crate::Builder::redis_synced) and build with
/// [`Builder::build_shared`](crate::Builder::build_shared) inside a tokio runtime.
///
/// ```no_run
/// # async fn demo() -> Result<(), tollgate::Error> {
/// use std::time::Duration;
/// use tollgate::{Limiter, Plan, Quota};
/// use tollgate::redis::{FailurePolicy, RedisConfig};
/// let limiter = Limiter::<String>::builder()
///     .quota(Quota::per_minute(100))
///     .plan("pro", Plan::new([Quota::per_second(50), Quota::per_day(100_000)]))
///     .redis_synced(
///         RedisConfig::new("redis://10.0.0.5:6379/")
///             .interval(Duration::from_millis(50))
///             .on_failure(FailurePolicy::Closed),
///     )
///     .build_shared()?;
/// let pro = limiter.plan("pro").unwrap();
/// assert!(limiter.check_in(&"tenant-7".to_string(), pro, 1)?.is_allowed());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) target: Result<Target, Error>,
    /// The URL or seed nodes `target` was made from (to tell two configs apart on a reload).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) nodes: Vec<String>,
    pub(crate) interval: Duration,
    pub(crate) prefix: String,
    pub(crate) deadline: Duration,
    pub(crate) policy: FailurePolicy,
    pub(crate) breaker: BreakerConfig,
}

impl RedisConfig {
    /// One Redis server (or a Valkey), e.g. `redis://127.0.0.1:6379/`; a malformed URL is an
    /// [`Error::Config`] from `build_shared`.
    pub fn new(url: &str) -> Self {
        Self::with_target(Target::single(url), vec![url.to_string()])
    }

    /// A Redis Cluster, from one or more seed nodes: each (key, quota) is reconciled with its
    /// own script call, all in flight at once.
    pub fn cluster(nodes: &[&str]) -> Self {
        Self::with_target(
            Target::cluster(nodes, DEFAULT_ROUND_DEADLINE),
            nodes.iter().map(|n| n.to_string()).collect(),
        )
    }

    /// Whether `other` reaches the same Redis with the same settings.
    #[cfg(feature = "http")]
    pub(crate) fn same_as(&self, other: &RedisConfig) -> bool {
        self.nodes == other.nodes && format!("{self:?}") == format!("{other:?}")
    }

    fn with_target(target: Result<Target, Error>, nodes: Vec<String>) -> Self {
        RedisConfig {
            target,
            nodes,
            interval: DEFAULT_INTERVAL,
            prefix: "tollgate:".into(),
            deadline: DEFAULT_ROUND_DEADLINE,
            policy: FailurePolicy::Closed,
            breaker: BreakerConfig::DEFAULT,
        }
    }

    /// How often the background task reconciles (default 100 ms). The over-admission bounds
    /// grow with it.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The prefix of every key written (default `tollgate:`; a brace in it is an error). Each
    /// (key, quota) state is named `prefix{key}:quota`, the key being its `Display` with `%`,
    /// `{` and `}` written as `%25`, `%7B` and `%7D` (the empty key as `%`): keys whose
    /// `Display`s differ never share a name, and the part in braces is the key's Cluster hash
    /// tag, so all its states live in one slot. Limiters with different plans on one Redis need
    /// different prefixes; processes that share limits share one.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long a round may wait for Redis before it counts as failed (default 100 ms).
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// What answers while Redis cannot (the breaker is open; default
    /// [`FailurePolicy::Closed`]): `Closed` denies, `Open` admits, `LocalShare` keeps the local
    /// table deciding alone.
    pub fn on_failure(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The circuit breaker: opens after `threshold` consecutive failed rounds, then probes after
    /// `min_backoff`, doubling up to `max_backoff` while probes fail (defaults 3, 100 ms, 5 s).
    pub fn breaker(mut self, threshold: u64, min_backoff: Duration, max_backoff: Duration) -> Self {
        self.breaker = BreakerConfig::new(threshold, min_backoff, max_backoff);
        self
    }

    /// Checks the settings.
    pub(crate) fn validate(&self) -> Result<(), Error> {
        let bad = |message: String| {
            Err(Error::Config {
                line: None,
                message,
            })
        };
        if self.interval.is_zero() {
            return bad("redis sync interval is 0".into());
        }
        if self.deadline.is_zero() {
            return bad("redis deadline is 0: a round needs some time to reach Redis".into());
        }
        check_prefix(&self.prefix)?;
        if let Err(e) = &self.target {
            return Err(e.clone());
        }
        Ok(())
    }
}

/// A key prefix with a brace would take the client's place as the Cluster hash tag (and let two
/// clients share a name): an error in every mode.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), Error> {
    if prefix.contains(['{', '}']) {
        return Err(Error::Config {
            line: None,
            message: format!(
                "redis prefix '{prefix}' contains a brace: the hash tag must be the key's own"
            ),
        });
    }
    Ok(())
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("interval", &self.interval)
            .field("prefix", &self.prefix)
            .field("deadline", &self.deadline)
            .field("policy", &self.policy)
            .field("breaker", &self.breaker)
            .finish_non_exhaustive()
    }
}
