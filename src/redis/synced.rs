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

use super::builder::Common;
use super::link::{Breaker, Link, Target};
use super::round::{self, Global, Reconciler, Tracked};
use super::track::{self, Tracker, Units};
use super::{CountsDegraded, FailurePolicy, Fallback, Source, common_setters};
use crate::algo::Rule;
use crate::cell::{self, update};
use crate::clock::{Clock, MonotonicClock};
use crate::decision::Decision;
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
        track::check_syncable(&rules, "synced mode", "use exact mode")?;
        if self.interval.is_zero() {
            return Err(Error::Config {
                line: None,
                message: "synced interval is 0".into(),
            });
        }
        let target = self.common.target.clone()?;
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
                self.common.policy,
            ),
            prefix: self.common.prefix,
        });
        let rounds = Arc::clone(&inner);
        let task = round::spawn_rounds(
            self.interval,
            "SyncedLimiter::build must run inside a tokio runtime",
            move || {
                let inner = Arc::clone(&rounds);
                Some(async move { inner.round().await })
            },
        )?;
        Ok(SyncedLimiter { inner, task })
    }
}

struct SyncedInner {
    rule: Rule,
    slots: DashMap<Box<str>, Slot, ahash::RandomState>,
    clock: MonotonicClock,
    sync: Reconciler,
    prefix: String,
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
        Self::with_target(Target::cluster(nodes, round::DEFAULT_ROUND_DEADLINE))
    }

    fn with_target(target: Result<Target, Error>) -> SyncedBuilder {
        let mut common = Common::new(target);
        common.deadline = round::DEFAULT_ROUND_DEADLINE;
        SyncedBuilder {
            common,
            interval: round::DEFAULT_INTERVAL,
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
        let now = inner.clock.now();
        match inner.sync.fallback(inner.rule.capacity, now) {
            None => {}
            Some(Fallback::Decided(d, _)) => return d,
            // The local share: the local cells decide alone, a degraded decision all the same.
            Some(Fallback::Local) => inner.sync.stats.count(Source::LocalShare),
        }
        if let Some(slot) = inner.slots.get(key) {
            return inner.apply(&slot, now, cost);
        }
        let slot = inner.slots.entry(key.into()).or_insert_with(Slot::new);
        inner.apply(&slot, now, cost)
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
        let epoch = self.clock.unix_epoch_ns();
        self.sync.round(self, self.clock.now(), epoch).await;
    }
}

/// A round's view of the local slots: each key's one state, named by the key.
impl Tracked for SyncedInner {
    type Id = Box<str>;
    type Idle = Box<str>;

    fn take(&self, now: u64, work: &mut Vec<(Box<str>, Units)>, idle: &mut Vec<Box<str>>) {
        // The round's local window (window algorithms); a check may already be in the next.
        let window = track::window(&self.rule, now);
        for e in self.slots.iter() {
            match e.value().track.take(&self.rule, window) {
                Some(units) => work.push((e.key().clone(), units)),
                None => idle.push(e.key().clone()),
            }
        }
    }

    fn evict(&self, key: Box<str>, now: u64) -> bool {
        // Under the shard's write lock, so a check that races the removal either lands before
        // it, making the slot non-idle, or after, on a fresh slot: both equal a fresh key.
        let removed = self.slots.remove_if(&key, |_, s| {
            // Acquire: see `cell::update`. Under the write lock no check runs on this slot.
            s.track.is_idle() && track::is_fresh(&self.rule, s.word.load(Ordering::Acquire), now)
        });
        removed.is_some()
    }

    fn rule(&self, _: &Box<str>) -> &Rule {
        &self.rule
    }

    fn redis_key(&self, key: &Box<str>) -> String {
        self.key(key)
    }

    /// Takes the global state into the key's cell: a bucket's debt at the local time now, plus
    /// what was admitted here since the round took this key's units; a window cell's counts
    /// (see [`Tracker::adopt`]).
    fn adopt(&self, key: &Box<str>, global: Global) {
        let Some(slot) = self.slots.get(key) else {
            return;
        };
        let now = self.clock.now();
        // Acquire: see `cell::update`.
        let word = slot.word.load(Ordering::Acquire);
        cell::replace_inline(&slot.word, word, |word| {
            slot.track.adopt(&self.rule, word, global, now)
        });
    }

    fn give_back(&self, key: &Box<str>, units: &Units) -> u64 {
        self.slots
            .get(key)
            .map_or(0, |s| s.track.give_back(&self.rule, units))
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
