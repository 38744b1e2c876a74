//! Synced mode: local atomic cells answer every check at in-process speed; a background task
//! pushes what each key consumed locally to Redis in pipelined batches on an interval and adopts
//! the global state it gets back.
//!
//! # Over-admission bound
//!
//! Between two rounds each of `N` processes sees only its own consumption, so each may admit up
//! to what its last view of the bucket allowed plus `rate * interval`. In the worst case (all
//! processes start on a full bucket) the total admitted in a span of `t` is at most
//!
//! `burst + rate * t  +  (N - 1) * (burst + rate * (interval + round_trip))`
//!
//! and once a key is saturated (the bucket empty at each round) the excess per interval is about
//! `(N - 1) * rate * interval`. The global state in Redis charges every admitted unit, so excess
//! is paid back as later denials (the long-run rate holds). `tests/redis_synced.rs` measures it
//! with three engines on one key.

use std::sync::Arc;
use std::time::Duration;

use ::redis::{Cmd, Pipeline, Value};
use dashmap::DashMap;

use super::link::{Breaker, Conn, Gate, Link, Target};
use super::{Common, FailurePolicy, common_setters};
use crate::algo;
use crate::cell::update;
use crate::clock::{Clock, MonotonicClock};
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::quota::{Kind, Rule};
use crate::sync::{AtomicU64, Ordering};

/// The reconciling script: for each key, charge the units pushed (`max(TAT, now) + n*T`, no
/// admission test: they were already admitted), set the TTL, and return the debt `TAT - now`.
const SYNC: &str = r#"
local out = {}
for i = 1, #KEYS do
  local raw = redis.call('GET', KEYS[i])
  local th, tl = big(raw)
  local nh, nl = big(ARGV[i])
  if nh > 0 or nl > 0 then
    if le(th, tl, NH, NL) then th, tl = NH, NL end
    th, tl = add(th, tl, nh, nl)
  end
  local dh, dl = sub(th, tl, NH, NL)
  if (nh > 0 or nl > 0) and (dh > 0 or dl > 0) then
    redis.call('SET', KEYS[i], str(th, tl), 'PX', px(dh, dl))
  end
  out[i] = str(dh, dl)
end
return out
"#;

/// Keys per script call in a round.
const BATCH: usize = 128;

/// One key's local state.
struct Slot {
    /// The GCRA TAT on the local clock.
    tat: AtomicU64,
    /// Units admitted locally and not yet pushed.
    pending: AtomicU64,
    /// Checked since the last round (1) or not (0).
    touched: AtomicU64,
}

/// Counters of a synced limiter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SyncedStats {
    /// Reconciliation rounds that reached Redis.
    pub rounds: u64,
    /// Rounds that failed (timeout, connection, server error).
    pub failed_rounds: u64,
    /// Key states pushed and adopted.
    pub keys_synced: u64,
    /// Units pushed to Redis.
    pub units_pushed: u64,
    /// Units admitted locally whose push had an unknown outcome (a timeout or a dropped
    /// connection after sending): not replayed, so possibly never charged globally.
    pub units_unconfirmed: u64,
    /// Degraded decisions: made while the breaker was open (Redis unreachable).
    pub degraded: u64,
    /// Local keys dropped because they were back to fresh and idle.
    pub evicted: u64,
    /// Keys held locally now.
    pub keys: u64,
}

/// Builds a [`SyncedLimiter`].
pub struct SyncedBuilder {
    common: Common,
    interval: Duration,
}

impl SyncedBuilder {
    common_setters!();

    /// How often the background task reconciles (default 100 ms). The over-admission bound
    /// grows with it.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Checks the settings and starts the background task on the current tokio runtime (so
    /// call it inside one). Does not connect: the task connects, and reconnects, by itself.
    ///
    /// A synced limiter takes one bucket quota (token or leaky bucket). While Redis is
    /// unreachable, [`FailurePolicy::Open`] admits everything, [`FailurePolicy::Closed`] denies
    /// everything, and [`FailurePolicy::LocalShare`] keeps the local cells deciding alone
    /// (each process then enforces the whole quota, so up to `N` times it in total).
    pub fn build(self) -> Result<SyncedLimiter, Error> {
        let rules = self.common.rules()?;
        let [rule] = rules[..] else {
            return Err(Error::Config {
                line: None,
                message: format!("synced mode takes exactly one quota, got {}", rules.len()),
            });
        };
        if rule.kind != Kind::Gcra {
            return Err(Error::Config {
                line: None,
                message: format!(
                    "synced mode runs token or leaky buckets, not {}",
                    rule.algorithm.name()
                ),
            });
        }
        if self.interval.is_zero() {
            return Err(Error::Config {
                line: None,
                message: "synced interval is 0".into(),
            });
        }
        let target = self.common.target.clone()?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::Config {
            line: None,
            message: "SyncedLimiter::build must run inside a tokio runtime".into(),
        })?;
        let inner = Arc::new(SyncedInner {
            rule,
            slots: DashMap::with_hasher(ahash::RandomState::new()),
            clock: MonotonicClock::new(),
            link: Link::new(target),
            breaker: Breaker::new(self.common.breaker),
            prefix: self.common.prefix,
            deadline: self.common.deadline,
            policy: self.common.policy,
            source: format!("{}{}", super::script::prelude(), SYNC),
            stats: Counters::default(),
        });
        let task = runtime.spawn(run(Arc::clone(&inner), self.interval));
        Ok(SyncedLimiter { inner, task })
    }
}

#[derive(Default)]
struct Counters {
    rounds: AtomicU64,
    failed_rounds: AtomicU64,
    keys_synced: AtomicU64,
    units_pushed: AtomicU64,
    units_unconfirmed: AtomicU64,
    degraded: AtomicU64,
    evicted: AtomicU64,
}

struct SyncedInner {
    rule: Rule,
    slots: DashMap<Box<str>, Slot, ahash::RandomState>,
    clock: MonotonicClock,
    link: Link,
    breaker: Breaker,
    prefix: String,
    deadline: Duration,
    policy: FailurePolicy,
    source: String,
    stats: Counters,
}

/// Synced mode: checks at in-process speed, reconciled with Redis in the background.
/// The background task stops when the limiter is dropped.
///
/// ```no_run
/// # async fn demo() -> Result<(), tollgate::Error> {
/// use std::time::Duration;
/// use tollgate::Quota;
/// use tollgate::redis::SyncedLimiter;
/// let limiter = SyncedLimiter::builder("redis://127.0.0.1:6379/")
///     .quota(Quota::per_second(1000))
///     .interval(Duration::from_millis(50))
///     .build()?;
/// assert!(limiter.check("tenant-7").is_allowed());
/// # Ok(()) }
/// ```
pub struct SyncedLimiter {
    inner: Arc<SyncedInner>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SyncedLimiter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SyncedLimiter {
    /// A builder for one Redis server (or a Valkey).
    pub fn builder(url: &str) -> SyncedBuilder {
        Self::with_target(Target::single(url))
    }

    /// A builder for a Redis Cluster, from one or more seed nodes. Each key is reconciled with
    /// its own script call (keys of one round live in different slots), all in flight at once.
    pub fn cluster_builder(nodes: &[&str]) -> SyncedBuilder {
        Self::with_target(Target::cluster(nodes, Duration::from_millis(100)))
    }

    fn with_target(target: Result<Target, Error>) -> SyncedBuilder {
        let mut common = Common::new(target);
        common.deadline = Duration::from_millis(100);
        SyncedBuilder {
            common,
            interval: Duration::from_millis(100),
        }
    }

    /// Checks one unit for `key`, locally.
    pub fn check(&self, key: &str) -> Decision {
        self.decide(key, 1)
    }

    /// Checks `cost` units for `key`, locally. A zero cost, or one above the burst, is an error.
    pub fn check_n(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        if cost == 0 {
            return Err(Error::ZeroCost);
        }
        if cost > self.inner.rule.capacity {
            return Err(Error::CostExceedsCapacity {
                cost,
                capacity: self.inner.rule.capacity,
            });
        }
        Ok(self.decide(key, cost))
    }

    #[inline]
    fn decide(&self, key: &str, cost: u64) -> Decision {
        let inner = &*self.inner;
        if inner.breaker.is_open() {
            if let Some(d) = self.degraded() {
                return d;
            }
        }
        let now = inner.clock.now();
        if let Some(slot) = inner.slots.get(key) {
            return inner.apply(&slot, now, cost);
        }
        let slot = inner.slots.entry(key.into()).or_insert_with(|| Slot {
            tat: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            touched: AtomicU64::new(0),
        });
        inner.apply(&slot, now, cost)
    }

    /// The policy's answer while the breaker is open; `None` for the local share (the local
    /// cells go on deciding).
    fn degraded(&self) -> Option<Decision> {
        let inner = &*self.inner;
        // Relaxed: a statistic.
        inner.stats.degraded.fetch_add(1, Ordering::Relaxed);
        let limit = inner.rule.capacity;
        match inner.policy {
            FailurePolicy::Open => Some(Decision {
                allowed: true,
                reason: Reason::Within,
                limit,
                remaining: 0,
                reset_after_ns: 0,
                retry_after_ns: 0,
                delay_ns: 0,
            }),
            FailurePolicy::Closed => {
                let wait = inner.breaker.wait_ns(inner.clock.now());
                Some(Decision {
                    limit,
                    reset_after_ns: wait,
                    ..Decision::denied(Reason::Limited, wait)
                })
            }
            FailurePolicy::LocalShare { .. } => None,
        }
    }

    /// The counters.
    pub fn stats(&self) -> SyncedStats {
        let c = &self.inner.stats;
        // Relaxed (all): a snapshot of statistics.
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SyncedStats {
            rounds: r(&c.rounds),
            failed_rounds: r(&c.failed_rounds),
            keys_synced: r(&c.keys_synced),
            units_pushed: r(&c.units_pushed),
            units_unconfirmed: r(&c.units_unconfirmed),
            degraded: r(&c.degraded),
            evicted: r(&c.evicted),
            keys: self.inner.slots.len() as u64,
        }
    }

    /// Runs one reconciliation round now (the background task runs them on the interval).
    pub async fn sync_now(&self) {
        self.inner.round().await;
    }
}

impl SyncedInner {
    #[inline]
    fn apply(&self, slot: &Slot, now: u64, cost: u64) -> Decision {
        let rule = &self.rule;
        let (d, written, _) = update(&slot.tat, |s| algo::gcra::decide(s, now, cost, rule, 0));
        if written.is_some() {
            // Release: pairs with the AcqRel swap in `round`; the units are counted once, by
            // whichever round swaps after this add (this one or the next).
            slot.pending.fetch_add(cost, Ordering::Release);
        }
        // Relaxed: a hint for the next round; a lost mark only delays one key's adoption by a
        // round. Loaded first so a hot key does not write the line on every check.
        if slot.touched.load(Ordering::Relaxed) == 0 {
            slot.touched.store(1, Ordering::Relaxed);
        }
        d
    }

    fn key(&self, key: &str) -> String {
        format!("{}{{{key}}}:s", self.prefix)
    }

    /// One round: push every touched key's pending units, adopt the global debts.
    async fn round(&self) {
        let now = self.clock.now();
        let gate = self.breaker.gate(now);
        if gate == Gate::Shut {
            return;
        }
        // Take the work: (key, units) of every key checked since the last round.
        let mut work: Vec<(Box<str>, u64)> = Vec::new();
        let mut idle: Vec<Box<str>> = Vec::new();
        for e in self.slots.iter() {
            let s = e.value();
            // Relaxed: see `apply`.
            let touched = s.touched.swap(0, Ordering::Relaxed) == 1;
            // AcqRel: pairs with the Release add in `apply`; each unit goes to exactly one round.
            let n = s.pending.swap(0, Ordering::AcqRel);
            if touched || n > 0 {
                work.push((e.key().clone(), n));
            } else {
                idle.push(e.key().clone());
            }
        }
        // Drop idle keys that are back to fresh (under the shard's write lock, so a check that
        // races the removal either lands before it, making the slot non-idle, or after, on a
        // fresh slot: both equal a fresh key).
        for k in idle {
            let removed = self.slots.remove_if(&k, |_, s| {
                // Acquire: see `cell::update`.
                let tat = s.tat.load(Ordering::Acquire);
                // Relaxed: see `apply`; under the write lock no check runs on this slot.
                s.touched.load(Ordering::Relaxed) == 0
                    && s.pending.load(Ordering::Acquire) == 0
                    && algo::gcra::is_fresh(tat, now)
            });
            if removed.is_some() {
                // Relaxed: a statistic.
                self.stats.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        if work.is_empty() {
            if gate == Gate::Probe {
                // Nothing to push (checks are answered by the policy while the breaker is
                // open, so they touch no key): probe with a PING.
                let ping = tokio::time::timeout(self.deadline, async {
                    let mut conn = self.link.get().await?;
                    conn.query::<String>(&::redis::cmd("PING")).await
                })
                .await;
                if matches!(ping, Ok(Ok(_))) {
                    self.breaker.success(gate);
                } else {
                    self.link.reset();
                    let _ = self.breaker.failure(gate, self.clock.now());
                }
            }
            return;
        }
        // A cluster cannot run one script over keys in different slots: one key per script
        // there, sent concurrently over the cluster connection.
        let batch = if self.link.is_cluster() { 1 } else { BATCH };
        let mut pipe = Pipeline::new();
        for chunk in work.chunks(batch) {
            let mut cmd = Cmd::new();
            // EVAL, not EVALSHA: a pipeline cannot reload half-way, and EVAL never meets
            // NOSCRIPT (Redis caches the compiled script by its hash anyway).
            cmd.arg("EVAL").arg(&self.source).arg(chunk.len());
            for (k, _) in chunk {
                cmd.arg(self.key(k));
            }
            for (_, n) in chunk {
                cmd.arg(n.saturating_mul(self.rule.emission).to_string());
            }
            pipe.add_command(cmd);
        }
        let reply = tokio::time::timeout(self.deadline, async {
            let mut conn = match self.link.get().await {
                Ok(c) => c,
                Err(e) => return Err((false, e.to_string())),
            };
            let out = match &conn {
                Conn::Single(_) => conn.pipe::<Vec<Value>>(&pipe).await,
                Conn::Cluster(c) => concurrently(c, pipe.cmd_iter()).await,
            };
            out.map_err(|e| (true, e.to_string()))
        })
        .await
        .unwrap_or_else(|_| Err((true, "deadline".into())));
        let total: u64 = work.iter().map(|(_, n)| n).sum();
        match reply {
            Ok(values) => {
                self.breaker.success(gate);
                let local_now = self.clock.now();
                let mut i = 0;
                for v in values {
                    let Value::Array(debts) = v else { continue };
                    for d in debts {
                        let debt = match d {
                            Value::BulkString(b) => std::str::from_utf8(&b)
                                .ok()
                                .and_then(|s| s.parse::<u64>().ok()),
                            _ => None,
                        };
                        if let (Some(debt), Some((k, _))) = (debt, work.get(i)) {
                            self.adopt(k, local_now, debt);
                        }
                        i += 1;
                    }
                }
                // Relaxed (all): statistics.
                self.stats.rounds.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .keys_synced
                    .fetch_add(work.len() as u64, Ordering::Relaxed);
                self.stats.units_pushed.fetch_add(total, Ordering::Relaxed);
            }
            Err((sent, _)) => {
                // Relaxed: a statistic.
                self.stats.failed_rounds.fetch_add(1, Ordering::Relaxed);
                if sent {
                    // The pipeline may or may not have run: never replay it.
                    self.stats
                        .units_unconfirmed
                        .fetch_add(total, Ordering::Relaxed);
                } else {
                    // Nothing reached Redis: the units are still owed; give them back.
                    for (k, n) in &work {
                        if let Some(s) = self.slots.get(k) {
                            // Release: as in `apply`.
                            s.pending.fetch_add(*n, Ordering::Release);
                        }
                    }
                }
                self.link.reset();
                let _ = self.breaker.failure(gate, self.clock.now());
            }
        }
    }

    /// Takes the global state: the debt Redis reports, plus what was admitted here since the
    /// round took this key's units.
    fn adopt(&self, key: &str, local_now: u64, debt: u64) {
        let Some(slot) = self.slots.get(key) else {
            return;
        };
        let t = self.rule.emission;
        let base = local_now.saturating_add(debt);
        // Acquire: see `cell::update`.
        let mut cur = slot.tat.load(Ordering::Acquire);
        loop {
            // Acquire: pairs with the Release add in `apply` (units admitted since the swap).
            let since = slot.pending.load(Ordering::Acquire);
            let next = base.saturating_add(since.saturating_mul(t));
            // AcqRel: ordered with every charge of the cell; on failure re-read both and retry.
            match slot
                .tat
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }
}

/// Sends every command on its own over a cluster connection, all in flight at once, and
/// returns the replies in order (or the first error: the round then counts as failed and none
/// of it is replayed).
async fn concurrently<'a>(
    conn: &::redis::cluster_async::ClusterConnection,
    cmds: impl Iterator<Item = &'a Cmd>,
) -> ::redis::RedisResult<Vec<Value>> {
    let mut set = tokio::task::JoinSet::new();
    let mut n = 0;
    for (i, cmd) in cmds.enumerate() {
        let (mut c, cmd) = (conn.clone(), cmd.clone());
        set.spawn(async move { (i, cmd.query_async::<Value>(&mut c).await) });
        n += 1;
    }
    let mut out = vec![Value::Nil; n];
    while let Some(joined) = set.join_next().await {
        let (i, r) = joined.map_err(|e| {
            ::redis::RedisError::from(std::io::Error::other(format!("sync task: {e}")))
        })?;
        out[i] = r?;
    }
    Ok(out)
}

async fn run(inner: Arc<SyncedInner>, interval: Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        inner.round().await;
    }
}

impl std::fmt::Debug for SyncedBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncedBuilder")
            .field("common", &self.common)
            .field("interval", &self.interval)
            .finish()
    }
}

impl std::fmt::Debug for SyncedLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncedLimiter").finish_non_exhaustive()
    }
}
