//! Exact mode: [`RedisLimiter`], every decision one Lua script on Redis, within a deadline,
//! behind the circuit breaker, the failure policy answering when Redis cannot.

use std::sync::Arc;
use std::time::Duration;

use ::redis::{Cmd, Value};

use super::link::{self, Breaker, Gate, Link};
use super::policy::{CountsDegraded, Fallback};
use super::script::{self, Call};
use super::{Checked, FailurePolicy, RedisStats, Source, state_key};
use crate::algo::{Kind, Rule};
use crate::clock::{Clock, MonotonicClock, nanos};
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::sync::{AtomicU64, Ordering};

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
    pub(super) inner: Arc<Inner<C>>,
}

impl<C> Clone for RedisLimiter<C> {
    fn clone(&self) -> Self {
        RedisLimiter {
            inner: Arc::clone(&self.inner),
        }
    }
}

pub(super) struct Inner<C> {
    pub(super) rules: Vec<Rule>,
    /// Each rule's part of its Redis keys' names (see `rule_names` in `builder.rs`).
    pub(super) names: Vec<String>,
    /// See `Common::headroom` in `builder.rs`.
    pub(super) headroom: u64,
    pub(super) max_cost: u64,
    pub(super) sha: String,
    pub(super) source: String,
    pub(super) link: Link,
    pub(super) breaker: Breaker,
    pub(super) prefix: String,
    pub(super) deadline: Duration,
    pub(super) policy: FailurePolicy,
    pub(super) local: Option<Box<dyn LocalShare>>,
    pub(super) clock: C,
    pub(super) counters: Counters,
}

#[derive(Default)]
pub(super) struct Counters {
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

impl CountsDegraded for Counters {
    fn count(&self, source: Source) {
        match source {
            Source::FailedOpen => bump(&self.failed_open),
            Source::FailedClosed => bump(&self.failed_closed),
            Source::LocalShare => bump(&self.local_share),
            Source::Redis => {}
        }
    }
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
        // `EVALSHA sha` or `EVAL source`, over the keys and arguments.
        let script_call = |verb: &str, script: &str| {
            let mut cmd = Cmd::new();
            cmd.arg(verb)
                .arg(script)
                .arg(keys.len())
                .arg(&keys)
                .arg(&args);
            cmd
        };
        let value: Value = match conn.query(&script_call("EVALSHA", &inner.sha)).await {
            Ok(v) => v,
            Err(e)
                if e.kind() == ::redis::ErrorKind::Server(::redis::ServerErrorKind::NoScript) =>
            {
                bump(&inner.counters.reloads);
                conn.query(&script_call("EVAL", &inner.source))
                    .await
                    .map_err(Failure::Redis)?
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

    /// The policy's answer when Redis cannot give one (the decision reports the first quota's
    /// capacity as its `limit`), counted by who made it.
    fn degraded(&self, key: &str, cost: u64, now: u64, call: Call) -> Checked {
        let inner = &*self.inner;
        let limit = inner.rules[0].capacity;
        let answer = inner
            .policy
            .answer(limit, &inner.breaker, now, &inner.counters);
        let (decision, source) = match answer {
            Fallback::Decided(decision, source) => (decision, source),
            Fallback::Local => {
                inner.counters.count(Source::LocalShare);
                (self.local_share(key, cost, call, limit), Source::LocalShare)
            }
        };
        Checked {
            decision,
            source,
            server_time_ns: None,
        }
    }

    /// The in-memory share's decision ([`FailurePolicy::LocalShare`]). A cost above the
    /// share's smaller capacity can never pass locally: a denial.
    fn local_share(&self, key: &str, cost: u64, call: Call, limit: u64) -> Decision {
        self.inner
            .local
            .as_ref()
            .and_then(|l| l.decide(key, cost, call))
            .unwrap_or(Decision {
                limit,
                ..Decision::denied(Reason::Limited, 0)
            })
    }
}

/// What answers for [`FailurePolicy::LocalShare`] while Redis cannot: the share of every quota
/// this process keeps in memory. An in-process limiter, built above this module (the limiter
/// depends on the Redis backend, not the other way round): `limiter/local_share.rs`.
pub(crate) trait LocalShare: Send + Sync {
    /// The share's decision of `call` for `key` (`None`: it cannot decide, a denial).
    fn decide(&self, key: &str, cost: u64, call: Call) -> Option<Decision>;
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

impl<C> std::fmt::Debug for RedisLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter").finish_non_exhaustive()
    }
}
