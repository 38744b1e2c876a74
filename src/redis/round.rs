//! A synced-mode round's Redis side: the reconciling scripts, the pipelined pushes (one script
//! call per rule and batch of keys, or one per key on a Cluster), the replies read back as each
//! key's global state, the breaker and statistics around them, and the failure policy's answer
//! while the breaker is open. Shared by [`SyncedLimiter`](super::SyncedLimiter) and a
//! [`Limiter`](crate::Limiter) synced through Redis: each keeps its own cells and
//! [`Tracker`](super::track::Tracker)s and shows them to a round through [`Tracked`]; the
//! round itself ([`Reconciler::round`]) and the rounds' timer ([`spawn_rounds`]) are written
//! once, here.

use std::future::Future;
use std::time::Duration;

use ::redis::{Cmd, Pipeline, Value};

use super::link::{Breaker, Conn, Gate, Link};
use super::policy::{CountsDegraded, Fallback};
use super::track::{self, Units};
use super::{FailurePolicy, Source};
use crate::algo::{Kind, Rule};
use crate::error::Error;
use crate::sync::{AtomicU64, Ordering};

/// The buckets' reconciling script: for each key, charge the units pushed (`max(TAT, now) +
/// n*T`, no admission test: they were already admitted), set the TTL, and return the debt
/// `TAT - now`.
const SYNC_BUCKETS: &str = r#"
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

/// The window algorithms' reconciling script: for each key, add the units pushed to the counter
/// of their window (`KEYS[i]:<window>`; the key's hash tag keeps every window of a key in one
/// cluster slot) and refresh its TTL, then return the counts of the round's current and
/// previous windows. `ARGV`: the TTL in ms, the current and previous window ids, then four per
/// key: a window id and its units, twice.
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

/// How often rounds run unless configured (both synced engines).
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);

/// How long a round (and a Cluster's first contact) may wait for Redis unless configured: a
/// round is in the background, so it can wait longer than an exact-mode call.
pub(crate) const DEFAULT_ROUND_DEADLINE: Duration = Duration::from_millis(100);

/// Keys per script call in a round.
const BATCH: usize = 128;

/// Counters of synced mode.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) rounds: AtomicU64,
    pub(crate) failed_rounds: AtomicU64,
    pub(crate) keys_synced: AtomicU64,
    pub(crate) units_pushed: AtomicU64,
    pub(crate) units_unconfirmed: AtomicU64,
    pub(crate) degraded: AtomicU64,
    pub(crate) evicted: AtomicU64,
}

impl Counters {
    /// A snapshot, with `keys` tracked states.
    pub(crate) fn snapshot(&self, keys: u64) -> super::SyncedStats {
        // Relaxed (all): a snapshot of statistics.
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        super::SyncedStats {
            rounds: r(&self.rounds),
            failed_rounds: r(&self.failed_rounds),
            keys_synced: r(&self.keys_synced),
            units_pushed: r(&self.units_pushed),
            units_unconfirmed: r(&self.units_unconfirmed),
            degraded: r(&self.degraded),
            evicted: r(&self.evicted),
            keys,
        }
    }
}

/// Synced mode counts every degraded decision in one counter, whoever made it.
impl CountsDegraded for Counters {
    fn count(&self, _: Source) {
        // Relaxed: a statistic.
        self.degraded.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a round pushes for one (key, rule).
struct Push<'a> {
    /// The Redis key (the window algorithms' counters are this plus `:<window>`).
    key: String,
    rule: &'a Rule,
    units: Units,
}

/// The global state a round read back for one push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Global {
    /// A bucket's debt in Redis: `TAT - now`, ns.
    Debt(u64),
    /// A window algorithm's counts of the round's local window `window` and the one before.
    Counts { window: u64, cur: u64, prev: u64 },
}

/// The Redis side of synced mode.
pub(crate) struct Reconciler {
    pub(crate) link: Link,
    breaker: Breaker,
    pub(crate) deadline: Duration,
    pub(crate) stats: Counters,
    /// What answers while the breaker is open.
    policy: FailurePolicy,
    /// The buckets' script, with the 128-bit helpers it needs.
    buckets: String,
}

/// The local side of a synced round: the (key, rule) states a limiter tracks. A round takes
/// their units ([`take`](Self::take)), drops the idle ones that are back to fresh
/// ([`evict`](Self::evict)), pushes the units under each state's [`redis_key`](Self::redis_key)
/// and writes the global state it reads back into the local word ([`adopt`](Self::adopt)), or,
/// when nothing reached Redis, [`give_back`](Self::give_back) the units.
pub(crate) trait Tracked {
    /// How a round names a state it pushes.
    type Id;
    /// How a round names an idle state (one with nothing to push).
    type Idle;
    /// Takes every tracked state's units for a round at local time `now`
    /// ([`Tracker::take`](super::track::Tracker::take) in the window `now` falls in): into
    /// `work` those with units to push or checked since the last round, the states of one rule
    /// together (a round makes one script call per run of one rule), into `idle` the others.
    fn take(&self, now: u64, work: &mut Vec<(Self::Id, Units)>, idle: &mut Vec<Self::Idle>);
    /// Drops an idle state's tracker (and the local state with it, where the limiter keeps
    /// it there) if it is still idle and its local state holds nothing that counts at `now`:
    /// such a state is a fresh one. True if dropped.
    fn evict(&self, idle: Self::Idle, now: u64) -> bool;
    /// The rule of a pushed state.
    fn rule(&self, id: &Self::Id) -> &Rule;
    /// The Redis key of a pushed state.
    fn redis_key(&self, id: &Self::Id) -> String;
    /// Writes the global state a round read back into the state's local word (nothing when
    /// the state is gone).
    fn adopt(&self, id: &Self::Id, global: Global);
    /// Puts back the units of a round that reached nothing; returns the units that found no
    /// place (see [`Tracker::give_back`](super::track::Tracker::give_back)).
    fn give_back(&self, id: &Self::Id, units: &Units) -> u64;
}

/// The Unix window id of local window `window` of `rule` on a clock whose epoch is
/// `unix_epoch_ns` (the rule's phase aligns local windows to Unix ones): the same id in every
/// process, which names the window's counter in Redis.
pub(crate) fn unix_window(rule: &Rule, window: u64, unix_epoch_ns: u64) -> u64 {
    window + unix_epoch_ns / rule.period
}

/// Runs `round()`'s future every `interval` on the current tokio runtime (a round that
/// overruns delays the next), until `round` gives `None`; `no_runtime` is the error when there
/// is no runtime.
pub(crate) fn spawn_rounds<F>(
    interval: Duration,
    no_runtime: &str,
    mut round: impl FnMut() -> Option<F> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, Error>
where
    F: Future<Output = ()> + Send,
{
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::Config {
        line: None,
        message: no_runtime.into(),
    })?;
    Ok(runtime.spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(next) = round() else { return };
            next.await;
        }
    }))
}

impl Reconciler {
    pub(crate) fn new(
        link: Link,
        breaker: Breaker,
        deadline: Duration,
        policy: FailurePolicy,
    ) -> Reconciler {
        Reconciler {
            link,
            breaker,
            deadline,
            stats: Counters::default(),
            policy,
            buckets: format!("{}{}", super::script::prelude(), SYNC_BUCKETS),
        }
    }

    /// The failure policy's answer to a check of a rule of capacity `limit` (the decision's
    /// `limit`) at local time `now`: `None` while the breaker is closed (the local cells
    /// decide), else [`FailurePolicy::answer`]'s (`Open` admits, `Closed` denies until the next
    /// probe, counted in `degraded`; [`Fallback::Local`] for the local share: the local cells go
    /// on deciding alone, and the caller counts that decision or not).
    #[inline]
    pub(crate) fn fallback(&self, limit: u64, now: u64) -> Option<Fallback> {
        if !self.breaker.is_open() {
            return None;
        }
        Some(self.policy.answer(limit, &self.breaker, now, &self.stats))
    }

    /// One round at local time `now` (`unix_epoch_ns`: the local clock's epoch) over `local`'s
    /// states: nothing while the breaker is shut; else every state's units taken, the idle
    /// states that are back to fresh dropped (counted `evicted`), the units pushed and the
    /// global states adopted (or, when nothing reached Redis, the units given back).
    pub(crate) async fn round<T: Tracked>(&self, local: &T, now: u64, unix_epoch_ns: u64) {
        let gate = self.breaker.gate(now);
        if gate == Gate::Shut {
            return;
        }
        let mut work: Vec<(T::Id, Units)> = Vec::new();
        let mut idle: Vec<T::Idle> = Vec::new();
        local.take(now, &mut work, &mut idle);
        for i in idle {
            if local.evict(i, now) {
                // Relaxed: a statistic.
                self.stats.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let pushes: Vec<Push<'_>> = work
            .iter()
            .map(|(id, units)| Push {
                key: local.redis_key(id),
                rule: local.rule(id),
                units: *units,
            })
            .collect();
        let adopt = |i: usize, global: Global| local.adopt(&work[i].0, global);
        let give_back = |i: usize| local.give_back(&work[i].0, &work[i].1);
        self.push(gate, now, unix_epoch_ns, &pushes, adopt, give_back)
            .await;
    }

    /// Pushes `work` for a round that started at local time `now` (`unix_epoch_ns`: the local
    /// clock's epoch, which names the windows in Redis), under `gate`. On success
    /// `adopt(i, global)` gets each push's global state; when nothing reached Redis,
    /// `give_back(i)` puts push `i`'s units back and returns the units that found no place.
    /// Units whose push may or may not have run are never replayed: counted unconfirmed.
    async fn push(
        &self,
        gate: Gate,
        now: u64,
        unix_epoch_ns: u64,
        work: &[Push<'_>],
        mut adopt: impl FnMut(usize, Global),
        mut give_back: impl FnMut(usize) -> u64,
    ) {
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
                    let _ = self.breaker.failure(gate, now);
                }
            }
            return;
        }
        // One script call per run of pushes of one rule, at most BATCH keys; a cluster cannot
        // run one script over keys in different slots: one key per call there, sent
        // concurrently over the cluster connection.
        let batch = if self.link.is_cluster() { 1 } else { BATCH };
        let mut calls: Vec<(usize, usize)> = Vec::new();
        let mut start = 0;
        while start < work.len() {
            let rule = work[start].rule;
            let mut end = start + 1;
            while end < work.len() && end - start < batch && std::ptr::eq(work[end].rule, rule) {
                end += 1;
            }
            calls.push((start, end));
            start = end;
        }
        let mut pipe = Pipeline::new();
        for &(a, b) in &calls {
            pipe.add_command(self.command(now, unix_epoch_ns, &work[a..b]));
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
        let total: u64 = work.iter().map(|p| p.units[0].1 + p.units[1].1).sum();
        match reply {
            Ok(values) => {
                self.breaker.success(gate);
                for (&(a, b), v) in calls.iter().zip(values) {
                    let Value::Array(items) = v else { continue };
                    let mut numbers = items.into_iter().map(|v| match v {
                        Value::BulkString(b) => std::str::from_utf8(&b)
                            .ok()
                            .and_then(|s| s.parse::<u64>().ok()),
                        Value::Int(n) => u64::try_from(n).ok(),
                        _ => None,
                    });
                    for (i, p) in work.iter().enumerate().take(b).skip(a) {
                        let global = if p.rule.kind == Kind::Gcra {
                            numbers.next().flatten().map(Global::Debt)
                        } else {
                            match (numbers.next().flatten(), numbers.next().flatten()) {
                                (Some(cur), Some(prev)) => Some(Global::Counts {
                                    window: track::window(p.rule, now),
                                    cur,
                                    prev,
                                }),
                                _ => None,
                            }
                        };
                        if let Some(g) = global {
                            adopt(i, g);
                        }
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
                let unconfirmed = if sent {
                    // The pipeline may or may not have run: never replay it.
                    total
                } else {
                    // Nothing reached Redis: the units are still owed; give them back.
                    (0..work.len()).map(&mut give_back).sum()
                };
                // Relaxed: a statistic.
                self.stats
                    .units_unconfirmed
                    .fetch_add(unconfirmed, Ordering::Relaxed);
                self.link.reset();
                let _ = self.breaker.failure(gate, now);
            }
        }
    }

    /// One script call for `pushes`, all of one rule.
    fn command(&self, now: u64, unix_epoch_ns: u64, pushes: &[Push<'_>]) -> Cmd {
        let rule = pushes[0].rule;
        let mut cmd = Cmd::new();
        // EVAL, not EVALSHA: a pipeline cannot reload half-way, and EVAL never meets NOSCRIPT
        // (Redis caches the compiled script by its hash anyway).
        let source = if rule.kind == Kind::Gcra {
            self.buckets.as_str()
        } else {
            SYNC_WINDOWS
        };
        cmd.arg("EVAL").arg(source).arg(pushes.len());
        for p in pushes {
            cmd.arg(&p.key);
        }
        if rule.kind == Kind::Gcra {
            for p in pushes {
                cmd.arg(p.units[0].1.saturating_mul(rule.emission).to_string());
            }
        } else {
            let unix = |w: u64| unix_window(rule, w, unix_epoch_ns).to_string();
            let window = track::window(rule, now);
            // Each window's counter lives two periods: the previous window still counts.
            let ttl_ms = rule.period.saturating_mul(2) / 1_000_000 + 1_000;
            cmd.arg(ttl_ms)
                .arg(unix(window))
                .arg(unix(window.saturating_sub(1)));
            for p in pushes {
                for (w, n) in p.units {
                    cmd.arg(unix(w)).arg(n);
                }
            }
        }
        cmd
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
