//! Synced mode: local atomic cells answer every check at in-process speed; a background task
//! pushes what each key consumed locally to Redis in pipelined batches on an interval and adopts
//! the global state it gets back.
//!
//! Token and leaky buckets push units and adopt the global TAT; fixed windows and sliding
//! window counters push each window's units to a Redis counter per (key, window) and adopt the
//! global counts of the current and the previous window.
//!
//! # Over-admission bounds
//!
//! Between two rounds each of `N` processes sees only its own consumption, so each may admit up
//! to what its last view allowed, plus what it admits before the next round brings the others'
//! units. With `d` the most units one process admits in `interval + round_trip`:
//!
//! - **Buckets**: in a span of `t`, at most
//!   `burst + rate * t  +  (N - 1) * min(burst + rate * (interval + round_trip), d)`;
//!   once a key is saturated the excess per interval is about `(N - 1) * rate * interval`. The
//!   global TAT charges every admitted unit, so excess is paid back as later denials.
//! - **Fixed window**: in any one window, at most `limit + (N - 1) * min(limit, d)`. A window
//!   starts here at the other processes' share of the previous one (what the last round saw:
//!   the global count less this process's units, scaled to the limit), and within a window the
//!   local view only grows; so with steady traffic a window admits about the limit, and the
//!   bound is reached only when the shares are unknown (a key's first window) or shift.
//! - **Sliding window counter**: the estimate over any window position stays within
//!   `limit + (N - 1) * min(limit, d)`; the previous window's global count weighs on every
//!   process from the window's first round, so there is no burst at a boundary, and with steady
//!   traffic the excess is what the decaying weight frees between two rounds.
//!
//! `tests/redis_synced.rs` measures each with three engines on one key: the first window, with
//! no shares known yet, may reach the bound; from the second on the engines together admit
//! about the limit.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;

use super::link::{Breaker, Gate, Link, Target};
use super::round::{Global, Push, Reconciler};
use super::track::{self, Tracker, Units};
use super::{Common, FailurePolicy, common_setters};
use crate::algo::{Kind, Rule};
use crate::cell::update;
use crate::clock::{Clock, MonotonicClock};
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::sync::{AtomicU64, Ordering};

/// One key's local state: its word cell and what synced mode tracks beside it.
struct Slot {
    /// The local word cell: the GCRA TAT on the local clock, or a window algorithm's word.
    word: AtomicU64,
    track: Tracker,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            word: AtomicU64::new(0),
            track: Tracker::new(),
        }
    }
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
    /// A synced limiter takes one quota: a token or leaky bucket, a fixed window or a sliding
    /// window counter (a sliding log is an exact-mode algorithm: it keeps every request's time).
    /// While Redis is unreachable, [`FailurePolicy::Open`] admits everything, [`FailurePolicy::Closed`] denies
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
        if rule.kind == Kind::Log {
            return Err(Error::Config {
                line: None,
                message: format!(
                    "synced mode runs token and leaky buckets, fixed windows and sliding window \
                     counters, not {} (use exact mode)",
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
        let clock = MonotonicClock::new();
        // The rules were compiled for Redis's own clock (Unix time, phase 0); the local cells run
        // on this clock, whose windows must be the same Unix-aligned ones in every process.
        let mut rule = rule;
        rule.phase = clock.unix_epoch_ns() % rule.period;
        let inner = Arc::new(SyncedInner {
            rule,
            slots: DashMap::with_hasher(ahash::RandomState::new()),
            clock,
            sync: Reconciler::new(
                Link::new(target),
                Breaker::new(self.common.breaker),
                self.common.deadline,
            ),
            prefix: self.common.prefix,
            policy: self.common.policy,
        });
        let task = runtime.spawn(run(Arc::clone(&inner), self.interval));
        Ok(SyncedLimiter { inner, task })
    }
}

struct SyncedInner {
    rule: Rule,
    slots: DashMap<Box<str>, Slot, ahash::RandomState>,
    clock: MonotonicClock,
    sync: Reconciler,
    prefix: String,
    policy: FailurePolicy,
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
        if inner.sync.breaker.is_open() {
            if let Some(d) = self.degraded() {
                return d;
            }
        }
        let now = inner.clock.now();
        if let Some(slot) = inner.slots.get(key) {
            return inner.apply(&slot, now, cost);
        }
        let slot = inner.slots.entry(key.into()).or_insert_with(Slot::new);
        inner.apply(&slot, now, cost)
    }

    /// The policy's answer while the breaker is open; `None` for the local share (the local
    /// cells go on deciding).
    fn degraded(&self) -> Option<Decision> {
        let inner = &*self.inner;
        // Relaxed: a statistic.
        inner.sync.stats.degraded.fetch_add(1, Ordering::Relaxed);
        let limit = inner.rule.capacity;
        match inner.policy {
            FailurePolicy::Open => Some(crate::redis::open_decision(limit)),
            FailurePolicy::Closed => {
                let wait = inner.sync.breaker.wait_ns(inner.clock.now());
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
        self.inner
            .sync
            .stats
            .snapshot(self.inner.slots.len() as u64)
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
        let (d, written, _) = update(&slot.word, |s| {
            let s = slot.track.start(rule, s, now);
            crate::cell::decide_word(s, now, cost, rule, 0, crate::cell::Mode::Check)
        });
        if written.is_some() {
            slot.track.charged(rule, now, cost);
        }
        slot.track.checked();
        d
    }

    fn key(&self, key: &str) -> String {
        super::state_key(&self.prefix, key, "s")
    }

    /// One round: push every touched key's pending units, adopt the global states.
    async fn round(&self) {
        let now = self.clock.now();
        let gate = self.sync.breaker.gate(now);
        if gate == Gate::Shut {
            return;
        }
        // The round's local window (window algorithms); a check may already be in the next.
        let window = track::window(&self.rule, now);
        // Take the work: every key checked since the last round, with its units.
        let mut work: Vec<(Box<str>, Units)> = Vec::new();
        let mut idle: Vec<Box<str>> = Vec::new();
        for e in self.slots.iter() {
            match e.value().track.take(&self.rule, window) {
                Some(units) => work.push((e.key().clone(), units)),
                None => idle.push(e.key().clone()),
            }
        }
        // Drop idle keys that are back to fresh (under the shard's write lock, so a check that
        // races the removal either lands before it, making the slot non-idle, or after, on a
        // fresh slot: both equal a fresh key).
        for k in idle {
            let removed = self.slots.remove_if(&k, |_, s| {
                // Acquire: see `cell::update`. Under the write lock no check runs on this slot.
                s.track.is_idle()
                    && track::is_fresh(&self.rule, s.word.load(Ordering::Acquire), now)
            });
            if removed.is_some() {
                // Relaxed: a statistic.
                self.sync.stats.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let pushes: Vec<Push<'_>> = work
            .iter()
            .map(|(k, units)| Push {
                key: self.key(k),
                rule: &self.rule,
                units: *units,
            })
            .collect();
        let adopt = |i: usize, global: Global| {
            let k: &str = &work[i].0;
            match global {
                Global::Debt(debt) => self.adopt(k, self.clock.now(), debt),
                Global::Counts { window, cur, prev } => self.adopt_window(k, window, cur, prev),
            }
        };
        let give_back = |i: usize| {
            let (k, units) = &work[i];
            self.slots
                .get(k)
                .map_or(0, |s| s.track.give_back(&self.rule, units))
        };
        let epoch = self.clock.unix_epoch_ns();
        self.sync
            .push(gate, now, epoch, &pushes, adopt, give_back)
            .await;
    }

    /// Takes a window cell's global counts (see [`Tracker::adopt_window`]).
    fn adopt_window(&self, key: &str, window: u64, cur: u64, prev: u64) {
        let Some(slot) = self.slots.get(key) else {
            return;
        };
        // Acquire: see `cell::update`.
        let mut word = slot.word.load(Ordering::Acquire);
        while let Some(next) = slot.track.adopt_window(&self.rule, word, window, cur, prev) {
            // AcqRel: ordered with every charge of the cell; on failure re-read and retry.
            match slot
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => word = actual,
            }
        }
    }

    /// Takes the global state: the debt Redis reports, plus what was admitted here since the
    /// round took this key's units.
    fn adopt(&self, key: &str, local_now: u64, debt: u64) {
        let Some(slot) = self.slots.get(key) else {
            return;
        };
        // Acquire: see `cell::update`.
        let mut cur = slot.word.load(Ordering::Acquire);
        loop {
            let next = slot.track.adopt_gcra(&self.rule, local_now, debt);
            // AcqRel: ordered with every charge of the cell; on failure re-read both and retry.
            match slot
                .word
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }
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
