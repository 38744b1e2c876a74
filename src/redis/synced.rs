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
//! Measured (three engines hammering one key, 300 a second, interval 50 ms, 2-core VM): the
//! fixed window admitted 900 in the first window and 300, 300, 300 after; the sliding counter
//! 900, then 312-350.
//!
//! `tests/redis_synced.rs` measures each with three engines on one key.

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

/// The reconciling script of the window algorithms: for each key, add the units pushed to
/// the counter of their window (`KEYS[i]:<window>`, the key's hash tag keeps every window of a
/// key in one cluster slot) and refresh its TTL, then return the counts of the round's current
/// and previous windows. `ARGV`: the TTL in ms, the current and previous window ids, then four
/// per key: a window id and its units, twice.
const SYNC_WINDOWS: &str = r#"
local ttl, wc, wp = ARGV[1], ARGV[2], ARGV[3]
local out = {}
for i = 1, #KEYS do
  local b = 3 + (i - 1) * 4
  for j = 0, 2, 2 do
    local n = tonumber(ARGV[b + j + 2])
    if n > 0 then
      local k = KEYS[i] .. ':' .. ARGV[b + j + 1]
      redis.call('INCRBY', k, n)
      redis.call('PEXPIRE', k, ttl)
    end
  end
  out[2 * i - 1] = redis.call('GET', KEYS[i] .. ':' .. wc) or '0'
  out[2 * i] = redis.call('GET', KEYS[i] .. ':' .. wp) or '0'
end
return out
"#;

/// Keys per script call in a round.
const BATCH: usize = 128;

/// A key's units to push in a round: `(window, units)` twice (window algorithms: the earlier and
/// the current window; buckets: the count in the second field of the first).
type Units = [(u64, u64); 2];

/// Bits of a window id in a window algorithm's pending word (the rest count units): ids are
/// told apart over 2^24 windows, and a round is never that far behind a check.
const PENDING_WINDOW_BITS: u32 = 24;
/// Mask of the units in a pending word.
const PENDING_UNITS: u64 = (1 << (64 - PENDING_WINDOW_BITS)) - 1;

/// A window algorithm's pending word: `units` admitted in local window `window`.
fn pending_word(window: u64, units: u64) -> u64 {
    (window << (64 - PENDING_WINDOW_BITS)) | units.min(PENDING_UNITS)
}

/// `(window id bits, units)` of a pending word.
fn pending_parts(p: u64) -> (u64, u64) {
    (p >> (64 - PENDING_WINDOW_BITS), p & PENDING_UNITS)
}

/// One key's local state.
struct Slot {
    /// The local word cell: the GCRA TAT on the local clock, or a window algorithm's word.
    word: AtomicU64,
    /// Units admitted locally and not yet pushed: a count (buckets), or a pending word (window
    /// algorithms: the window they were admitted in and how many).
    pending: AtomicU64,
    /// Window algorithms: a pending word of an earlier window, moved aside when a check in a
    /// later window found units of it not yet pushed (0 when none).
    earlier: AtomicU64,
    /// Checked since the last round (1) or not (0).
    touched: AtomicU64,
    /// Fixed windows: a pending word of the units admitted here in the latest window, pushed
    /// or not (this process's share of the window).
    own: AtomicU64,
    /// Fixed windows: the count a new window starts from here: the other processes' share of
    /// the limit, as the last round saw the shares (0 before any).
    baseline: AtomicU64,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            word: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            earlier: AtomicU64::new(0),
            touched: AtomicU64::new(0),
            own: AtomicU64::new(0),
            baseline: AtomicU64::new(0),
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
        let script = if rule.kind == Kind::Gcra {
            format!("{}{}", super::script::prelude(), SYNC)
        } else {
            SYNC_WINDOWS.to_string()
        };
        let inner = Arc::new(SyncedInner {
            rule,
            // Window `w` of the local clock is Unix window `w + window_offset` (the rule's
            // phase aligns local windows to Unix ones), the same id in every process.
            window_offset: clock.unix_epoch_ns() / rule.period,
            slots: DashMap::with_hasher(ahash::RandomState::new()),
            clock,
            link: Link::new(target),
            breaker: Breaker::new(self.common.breaker),
            prefix: self.common.prefix,
            deadline: self.common.deadline,
            policy: self.common.policy,
            source: script,
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
    /// Window algorithms: the Unix window id of local window 0.
    window_offset: u64,
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
        let slot = inner.slots.entry(key.into()).or_insert_with(Slot::new);
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
        let fixed = rule.kind == Kind::Fixed;
        // Fixed windows: a window this process has no count of yet starts at the others'
        // share of the limit (see `adopt_window`), not at 0, so that N processes starting a
        // window together do not each spend the whole limit before their next round.
        // Relaxed: a hint written by the rounds; any value it held is a valid start.
        let baseline = if fixed {
            slot.baseline.load(Ordering::Relaxed)
        } else {
            0
        };
        let window = self.window(now);
        let (d, written, _) = update(&slot.word, |s| {
            let s = if fixed
                && baseline > 0
                && u64::from(algo::fixed::decode(s).0) != window & 0xFFFF_FFFF
            {
                let (sw, _) = algo::fixed::decode(s);
                let ahead = sw.wrapping_sub(window as u32);
                if ahead != 0 && ahead < 1 << 20 {
                    s
                } else {
                    algo::fixed::encode(window as u32, baseline.min(rule.limit))
                }
            } else {
                s
            };
            crate::cell::decide_word(s, now, cost, rule, 0, crate::cell::Mode::Check)
        });
        if written.is_some() {
            if rule.kind == Kind::Gcra {
                // Release: pairs with the AcqRel swap in `round`; the units are counted once,
                // by whichever round swaps after this add (this one or the next).
                slot.pending.fetch_add(cost, Ordering::Release);
            } else {
                self.add_pending(slot, window, cost);
                if fixed {
                    let id = window & ((1 << PENDING_WINDOW_BITS) - 1);
                    // Relaxed: a statistic of this process's share, read by the rounds.
                    let _ = slot
                        .own
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |o| {
                            let (w, n) = pending_parts(o);
                            Some(pending_word(id, if w == id { n + cost } else { cost }))
                        });
                }
            }
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

    /// The local window `now` falls in (window algorithms).
    fn window(&self, now: u64) -> u64 {
        algo::window_of(now, self.rule.phase, self.rule.period).0
    }

    /// Counts `cost` units admitted in local window `window` as pending. Units of an earlier
    /// window not yet pushed move to `earlier` (replacing any of a window before that: no
    /// decision looks further back than the previous window).
    fn add_pending(&self, slot: &Slot, window: u64, cost: u64) {
        let id = window & ((1 << PENDING_WINDOW_BITS) - 1);
        // Acquire/AcqRel (all): pairs with the swaps in `round`, as the buckets' add does.
        let mut cur = slot.pending.load(Ordering::Acquire);
        loop {
            let (w, n) = pending_parts(cur);
            let next = if n == 0 || w == id {
                pending_word(id, n + cost)
            } else {
                pending_word(id, cost)
            };
            match slot
                .pending
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if n > 0 && w != id {
                        let _ =
                            slot.earlier
                                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
                                    let (ew, en) = pending_parts(e);
                                    Some(if en > 0 && ew == w {
                                        pending_word(w, en + n)
                                    } else {
                                        cur
                                    })
                                });
                    }
                    return;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// The full local window id of a pending word's id bits, the latest one at or before
    /// `window`.
    fn full_window(window: u64, id: u64) -> u64 {
        let mask = (1 << PENDING_WINDOW_BITS) - 1;
        window - ((window & mask).wrapping_sub(id) & mask)
    }

    /// Whether a local word holds nothing that still counts at `now`.
    fn is_fresh(&self, word: u64, now: u64) -> bool {
        match self.rule.kind {
            Kind::Gcra => algo::gcra::is_fresh(word, now),
            Kind::Fixed => algo::fixed::is_fresh(word, now, &self.rule),
            Kind::Sliding => algo::sliding::is_fresh(word, now, &self.rule),
            Kind::Log => true,
        }
    }

    /// One round: push every touched key's pending units, adopt the global debts.
    async fn round(&self) {
        let now = self.clock.now();
        let gate = self.breaker.gate(now);
        if gate == Gate::Shut {
            return;
        }
        let windows = self.rule.kind != Kind::Gcra;
        // The round's local window (window algorithms); a check may already be in the next.
        let window = self.window(now);
        // Take the work: every key checked since the last round, with its units: for buckets
        // one count, for windows (window, units) of the earlier and the current window.
        let mut work: Vec<(Box<str>, Units)> = Vec::new();
        let mut idle: Vec<Box<str>> = Vec::new();
        for e in self.slots.iter() {
            let s = e.value();
            // Relaxed: see `apply`.
            let touched = s.touched.swap(0, Ordering::Relaxed) == 1;
            // AcqRel: pairs with the Release add in `apply`; each unit goes to exactly one round.
            let n = s.pending.swap(0, Ordering::AcqRel);
            let units = if windows {
                // AcqRel: as `pending`.
                let earlier = pending_parts(s.earlier.swap(0, Ordering::AcqRel));
                let current = pending_parts(n);
                let full = |(id, n): (u64, u64)| (Self::full_window(window + 1, id), n);
                [full(earlier), full(current)]
            } else {
                [(0, n), (0, 0)]
            };
            if touched || units[0].1 > 0 || units[1].1 > 0 {
                work.push((e.key().clone(), units));
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
                let word = s.word.load(Ordering::Acquire);
                // Relaxed: see `apply`; under the write lock no check runs on this slot.
                s.touched.load(Ordering::Relaxed) == 0
                    && s.pending.load(Ordering::Acquire) == 0
                    && s.earlier.load(Ordering::Acquire) == 0
                    && self.is_fresh(word, now)
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
        let unix = |w: u64| (w + self.window_offset).to_string();
        for chunk in work.chunks(batch) {
            let mut cmd = Cmd::new();
            // EVAL, not EVALSHA: a pipeline cannot reload half-way, and EVAL never meets
            // NOSCRIPT (Redis caches the compiled script by its hash anyway).
            cmd.arg("EVAL").arg(&self.source).arg(chunk.len());
            for (k, _) in chunk {
                cmd.arg(self.key(k));
            }
            if windows {
                // Each window's counter lives two periods: the previous window still counts.
                let ttl_ms = self.rule.period.saturating_mul(2) / 1_000_000 + 1_000;
                cmd.arg(ttl_ms)
                    .arg(unix(window))
                    .arg(unix(window.saturating_sub(1)));
                for (_, units) in chunk {
                    for (w, n) in units {
                        cmd.arg(unix(*w)).arg(*n);
                    }
                }
            } else {
                for (_, [(_, n), _]) in chunk {
                    cmd.arg(n.saturating_mul(self.rule.emission).to_string());
                }
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
        let total: u64 = work.iter().map(|(_, u)| u[0].1 + u[1].1).sum();
        match reply {
            Ok(values) => {
                self.breaker.success(gate);
                let local_now = self.clock.now();
                let mut numbers = values.into_iter().flat_map(|v| match v {
                    Value::Array(items) => items,
                    _ => Vec::new(),
                });
                let mut number = || match numbers.next() {
                    Some(Value::BulkString(b)) => std::str::from_utf8(&b)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok()),
                    Some(Value::Int(n)) => u64::try_from(n).ok(),
                    _ => None,
                };
                for (k, _) in &work {
                    if windows {
                        if let (Some(cur), Some(prev)) = (number(), number()) {
                            self.adopt_window(k, window, cur, prev);
                        }
                    } else if let Some(debt) = number() {
                        self.adopt(k, local_now, debt);
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
                    for (k, units) in &work {
                        if let Some(s) = self.slots.get(k) {
                            if windows {
                                for &(w, n) in units {
                                    if n > 0 && !self.give_back(&s, w, n) {
                                        // Relaxed: a statistic.
                                        self.stats
                                            .units_unconfirmed
                                            .fetch_add(n, Ordering::Relaxed);
                                    }
                                }
                            } else {
                                // Release: as in `apply`.
                                s.pending.fetch_add(units[0].1, Ordering::Release);
                            }
                        }
                    }
                }
                self.link.reset();
                let _ = self.breaker.failure(gate, self.clock.now());
            }
        }
    }

    /// Puts `units` of local window `window` that a failed round did not send back among the
    /// pending ones: into `pending` or `earlier`, whichever holds that window or nothing. False
    /// when both hold other windows (the units are then only counted as unconfirmed).
    fn give_back(&self, slot: &Slot, window: u64, units: u64) -> bool {
        let id = window & ((1 << PENDING_WINDOW_BITS) - 1);
        let merge = |p: u64| {
            let (w, n) = pending_parts(p);
            (n == 0 || w == id).then(|| pending_word(id, n + units))
        };
        // AcqRel/Acquire: as in `add_pending`.
        slot.pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, merge)
            .or_else(|_| {
                slot.earlier
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, merge)
            })
            .is_ok()
    }

    /// Takes the global counts of local window `window` (`cur`) and the one before (`prev`),
    /// plus what was admitted here in `window` since the round took this key's units. A local
    /// state already in a later window keeps its own (the next round brings the global one).
    fn adopt_window(&self, key: &str, window: u64, cur: u64, prev: u64) {
        let Some(slot) = self.slots.get(key) else {
            return;
        };
        // Acquire: see `cell::update`.
        let mut word = slot.word.load(Ordering::Acquire);
        loop {
            // Acquire: pairs with the AcqRel update in `add_pending`.
            let (id, n) = pending_parts(slot.pending.load(Ordering::Acquire));
            let since = if n > 0 && Self::full_window(window + 1, id) == window {
                n
            } else {
                0
            };
            let next = match self.rule.kind {
                Kind::Fixed => {
                    // The next window starts at the others' share of this one.
                    // Relaxed (both): see `apply`.
                    let (ow, on) = pending_parts(slot.own.load(Ordering::Relaxed));
                    let own = if Self::full_window(window + 1, ow) == window {
                        on
                    } else {
                        0
                    };
                    let global = cur.max(own);
                    let others = if global == 0 {
                        0
                    } else {
                        ((u128::from(self.rule.limit) * u128::from(global - own))
                            / u128::from(global)) as u64
                    };
                    slot.baseline.store(others, Ordering::Relaxed);
                    let (sw, count) = algo::fixed::decode(word);
                    let ahead = sw.wrapping_sub(window as u32);
                    if ahead != 0 && ahead < 1 << 20 {
                        return;
                    }
                    // Within a window the view only grows: the others' units only ever add
                    // up, and a start at the others' share stays until their count passes it.
                    let local = if ahead == 0 { count } else { 0 };
                    algo::fixed::encode(
                        window as u32,
                        cur.saturating_add(since)
                            .max(local)
                            .min(algo::fixed::MAX_LIMIT),
                    )
                }
                Kind::Sliding => {
                    let (sw, local_prev, local_cur) = algo::sliding::decode(word);
                    let ahead = sw.wrapping_sub(window) & ((1 << 20) - 1);
                    if ahead != 0 && ahead < 1 << 12 {
                        return;
                    }
                    let (local_prev, local_cur) = if ahead == 0 {
                        (local_prev, local_cur)
                    } else {
                        (0, 0)
                    };
                    algo::sliding::encode(
                        window,
                        prev.max(local_prev).min(algo::sliding::MAX_LIMIT),
                        cur.saturating_add(since)
                            .max(local_cur)
                            .min(algo::sliding::MAX_LIMIT),
                    )
                }
                Kind::Gcra | Kind::Log => return,
            };
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
        let t = self.rule.emission;
        let base = local_now.saturating_add(debt);
        // Acquire: see `cell::update`.
        let mut cur = slot.word.load(Ordering::Acquire);
        loop {
            // Acquire: pairs with the Release add in `apply` (units admitted since the swap).
            let since = slot.pending.load(Ordering::Acquire);
            let next = base.saturating_add(since.saturating_mul(t));
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
