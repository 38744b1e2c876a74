//! A limiter whose states are cluster-wide through Redis, in synced mode (feature `redis`,
//! [`Builder::redis_synced`](super::Builder::redis_synced)).
//!
//! Every check decides on the local table, as in process; beside each (key, rule) state a
//! [`Tracker`] keeps the units admitted here and not yet pushed. A background task runs a
//! round every interval: it takes every tracked state's units, pushes them to Redis
//! ([`Reconciler`]: one script call per rule and batch) and writes the global state it gets
//! back into the state's slot. All of it goes through the general charge path (the short paths
//! are off for a synced limiter), where [`SyncHook`] is the hook of
//! [`apply_inline`](super::Limiter::apply_inline).

use std::hash::Hash;
use std::sync::{Arc, Weak};

use dashmap::DashMap;

use super::book::PartRule;
use super::charge::{Call, StateHook};
use super::{Limiter, Map};
use crate::algo::{Kind, Rule};
use crate::cell::{self, Applied, Mode};
use crate::clock::Clock;
use crate::error::Error;
use crate::redis::link::{Breaker, Link};
use crate::redis::round::{self, Global, Reconciler, Tracked};
use crate::redis::track::{self, Tracker, Units};
use crate::redis::{Fallback, RedisConfig, SyncedStats};
use crate::store::{FlatStore, Full, RuleId};

/// A tracked (key, rule): the key (to name it in Redis, and to tell a hash collision) and its
/// bookkeeping.
struct Entry<K> {
    key: K,
    track: Tracker,
}

/// What a synced limiter keeps beside its table.
pub(crate) struct Synced<K> {
    /// By (key hash, rule): looked up without cloning the key.
    tracks: DashMap<(u64, RuleId), Entry<K>, ahash::RandomState>,
    /// The key's `Display`, which its Redis names escape (`redis::state_key`).
    name: fn(&K) -> String,
    sync: Reconciler,
    prefix: String,
    /// Held by a round for its whole length and by [`forget`](Self::forget): units a round has
    /// taken are pushed before a forget deletes the key, never after.
    rounds: tokio::sync::Mutex<()>,
}

impl<K: Hash + Eq + Clone> Synced<K> {
    pub(crate) fn new(cfg: RedisConfig, name: fn(&K) -> String) -> Result<Self, Error> {
        cfg.validate()?;
        let target = cfg.target?;
        Ok(Synced {
            tracks: DashMap::with_hasher(ahash::RandomState::new()),
            name,
            sync: Reconciler::new(
                Link::new(target),
                Breaker::new(cfg.breaker),
                cfg.deadline,
                cfg.policy,
            ),
            prefix: cfg.prefix,
            rounds: tokio::sync::Mutex::new(()),
        })
    }

    /// Runs `f` on the tracker of (`key`, `rule`), created on first use. A key whose hash
    /// another tracked key already holds (a 64-bit collision) is tracked under a second slot;
    /// past that, not at all (its units then reach Redis through no one: the other processes
    /// see less, never more, than it admitted).
    fn with_track<R>(
        &self,
        key: &K,
        hash: u64,
        rule: RuleId,
        f: impl FnOnce(&Tracker) -> R,
    ) -> Option<R> {
        for h in track_slots(hash) {
            if let Some(e) = self.tracks.get(&(h, rule)) {
                if e.key == *key {
                    return Some(f(&e.track));
                }
                continue;
            }
            let e = self.tracks.entry((h, rule)).or_insert_with(|| Entry {
                key: key.clone(),
                track: Tracker::new(),
            });
            if e.key == *key {
                return Some(f(&e.track));
            }
        }
        None
    }

    /// Forgets `key` on Redis and here: its global state under each of `rules` (deleted: a
    /// bucket's one key; a window rule's counters of the windows around `now`, local time of a
    /// clock whose epoch is `unix_epoch_ns`) and the units it has not pushed yet. After any round
    /// in flight, so nothing it took is pushed back after the deletion. True if Redis held any
    /// of them.
    pub(crate) async fn forget(
        &self,
        key: &K,
        hash: u64,
        rules: &[Rule],
        now: u64,
        unix_epoch_ns: u64,
    ) -> Result<bool, Error> {
        let _round = self.rounds.lock().await;
        let mut names = Vec::with_capacity(rules.len() * 3);
        for (id, rule) in rules.iter().enumerate() {
            for h in track_slots(hash) {
                self.tracks
                    .remove_if(&(h, id as RuleId), |_, e| e.key == *key);
            }
            let name = self.redis_key(key, rule);
            if rule.kind == Kind::Gcra {
                names.push(name);
            } else {
                // As a round names them: the Unix window ids of the previous, current and next
                // local windows (a clock a little ahead).
                let w = round::unix_window(rule, track::window(rule, now), unix_epoch_ns);
                for unix in [w.saturating_sub(1), w, w + 1] {
                    names.push(format!("{name}:{unix}"));
                }
            }
        }
        crate::redis::link::delete(&self.sync.link, self.sync.deadline, &names)
            .await
            .map(|n| n > 0)
    }

    /// The Redis key of (`key`, `rule`): the key escaped into a hash tag, the rule by its quota
    /// (the same in every process with the same plans, whatever their rule ids).
    fn redis_key(&self, key: &K, rule: &Rule) -> String {
        crate::redis::state_key(
            &self.prefix,
            &(self.name)(key),
            format_args!(
                "{}:{}:{}:{}",
                rule.algorithm.name(),
                rule.limit,
                rule.period,
                rule.capacity
            ),
        )
    }
}

/// Where a key hashed to `hash` may be tracked: its hash, else (when another tracked key holds
/// that hash already) a second slot.
fn track_slots(hash: u64) -> [u64; 2] {
    [hash, hash.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15]
}

/// A synced limiter's hook on a charge: decide from the tracker's start, count what was
/// admitted.
struct SyncHook<'a> {
    track: &'a Tracker,
    rule: &'a Rule,
    now: u64,
    cost: u64,
    mode: Mode,
    headroom: u64,
}

impl StateHook for SyncHook<'_> {
    fn start(&self, word: u64) -> u64 {
        self.track.start(self.rule, word, self.now)
    }

    fn apply<W: cell::Word>(
        &self,
        slot: &W,
        word: u64,
        _apply: impl FnOnce(&W, u64) -> Option<Applied>,
    ) -> Option<Applied> {
        let (track, rule, now) = (self.track, self.rule, self.now);
        let call = cell::WordCall {
            rule,
            now,
            cost: self.cost,
            headroom: self.headroom,
            token: true,
        };
        let a =
            cell::apply_inline_from(slot, word, &call, self.mode, |w| track.start(rule, w, now))?;
        if a.token.is_some() {
            self.charged();
        }
        Some(a)
    }

    fn charged(&self) {
        self.track.charged(self.rule, self.now, self.cost);
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// [`apply_part`](Self::apply_part) on a synced limiter: the policy's answer while Redis
    /// is out of reach, else the charge with the tracker's hook.
    pub(crate) fn apply_synced(
        &self,
        s: &FlatStore<K>,
        call: &Call<'_, K>,
        part: &PartRule,
    ) -> Result<Applied, Full> {
        let sh = self
            .backend
            .synced
            .as_ref()
            .expect("apply_synced on a synced limiter");
        // While Redis is out of reach: the policy's answer. Unlike `SyncedLimiter`, a local
        // share's decision (the local table goes on deciding) is not counted as degraded here.
        if let Some(Fallback::Decided(decision, _)) = sh.sync.fallback(part.rule.capacity, call.now)
        {
            return Ok(Applied {
                decision,
                token: None,
                retries: 0,
            });
        }
        let charged = sh.with_track(call.key, call.hash, part.id, |track| {
            if !call.mode.is_peek() {
                track.checked();
            }
            let hook = SyncHook {
                track,
                rule: &part.rule,
                now: call.now,
                cost: call.cost,
                mode: call.mode,
                headroom: call.headroom,
            };
            self.apply_inline(s, call, part, true, &hook)
        });
        match charged {
            Some(a) => a,
            None => self.apply_inline(s, call, part, true, &super::charge::NoHook),
        }
    }

    /// A refund of `call.cost` on (`call.key`, `rule`) at `call.now`: the units come off what
    /// is still to push.
    pub(crate) fn refund_synced(&self, call: &Call<'_, K>, rule_id: RuleId, rule: &Rule) {
        if let Some(sh) = &self.backend.synced {
            sh.with_track(call.key, call.hash, rule_id, |t| {
                t.refunded(rule, call.now, call.cost)
            });
        }
    }

    /// Synced mode's counters; `None` for a limiter in process only.
    pub fn synced_stats(&self) -> Option<SyncedStats> {
        let sh = self.backend.synced.as_ref()?;
        Some(sh.sync.stats.snapshot(sh.tracks.len() as u64))
    }

    /// Runs one reconciliation round now (the background task runs them on the interval);
    /// nothing for a limiter in process only.
    pub async fn sync_now(&self) {
        self.sync_round().await;
    }

    /// One round: every tracked state's units pushed, the global states written into the
    /// slots, the trackers of idle states that are back to fresh dropped.
    async fn sync_round(&self) {
        let (Some(sh), Map::Flat(store)) = (&self.backend.synced, &self.store) else {
            return;
        };
        let _round = sh.rounds.lock().await;
        let now = self.clock.now();
        let local = TrackedStates {
            synced: sh,
            store,
            rules: &self.book.current().rules,
            clock: &self.clock,
        };
        sh.sync.round(&local, now, self.clock.unix_epoch_ns()).await;
    }
}

/// A round's view of a synced limiter: its trackers, by (key hash, rule), and the table that
/// holds their states.
struct TrackedStates<'a, K, C> {
    synced: &'a Synced<K>,
    store: &'a FlatStore<K>,
    /// The current book's rules, by rule id.
    rules: &'a [Rule],
    clock: &'a C,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Tracked for TrackedStates<'_, K, C> {
    /// The rule, the key's hash and the key.
    type Id = (RuleId, u64, K);
    /// The tracker's place: (key hash, rule).
    type Idle = (u64, RuleId);

    fn take(&self, now: u64, work: &mut Vec<(Self::Id, Units)>, idle: &mut Vec<Self::Idle>) {
        for e in self.synced.tracks.iter() {
            let &(h, id) = e.key();
            let rule = &self.rules[usize::from(id)];
            match e.value().track.take(rule, track::window(rule, now)) {
                Some(units) => work.push(((id, h, e.value().key.clone()), units)),
                None => idle.push((h, id)),
            }
        }
        // Grouped by rule: one script call per rule and batch.
        work.sort_unstable_by_key(|w| w.0.0);
    }

    fn evict(&self, (h, id): Self::Idle, now: u64) -> bool {
        let (s, rule) = (self.store, &self.rules[usize::from(id)]);
        // Under the shard's write lock: a check that races the removal either lands before
        // it (the tracker is then not idle) or after it, on a new tracker.
        let removed = self.synced.tracks.remove_if(&(h, id), |_, e| {
            let state = s.word_or_fresh(s.hash(&e.key), id);
            e.track.is_idle() && track::is_fresh(rule, state, now)
        });
        removed.is_some()
    }

    fn rule(&self, (id, _, _): &Self::Id) -> &Rule {
        &self.rules[usize::from(*id)]
    }

    fn redis_key(&self, id: &Self::Id) -> String {
        self.synced.redis_key(&id.2, self.rule(id))
    }

    /// Writes the global state into (key, rule)'s slot (nothing when the state is gone: swept
    /// or evicted meanwhile).
    fn adopt(&self, id: &Self::Id, global: Global) {
        let (rule_id, h, key) = id;
        let (s, rule) = (self.store, self.rule(id));
        self.synced.with_track(key, *h, *rule_id, |t| {
            s.update_word(s.hash(key), *rule_id, |slot, word| {
                cell::replace_inline(slot, word, |word| {
                    t.adopt(rule, word, global, self.clock.now())
                })
            })
        });
    }

    fn give_back(&self, id: &Self::Id, units: &Units) -> u64 {
        let (rule_id, h, key) = id;
        self.synced
            .with_track(key, *h, *rule_id, |t| t.give_back(self.rule(id), units))
            .unwrap_or(units[0].1 + units[1].1)
    }
}

/// Starts a synced limiter's rounds on the current tokio runtime: one every `interval` while
/// the limiter lives.
pub(crate) fn spawn_rounds<K, C>(
    limiter: &Arc<Limiter<K, C>>,
    interval: std::time::Duration,
) -> Result<(), Error>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock,
{
    let weak: Weak<Limiter<K, C>> = Arc::downgrade(limiter);
    round::spawn_rounds(
        interval,
        "a limiter synced through Redis is built inside a tokio runtime",
        move || {
            let l = weak.upgrade()?;
            Some(async move { l.sync_round().await })
        },
    )?;
    Ok(())
}

/// Whether a rule can be synced (a sliding log cannot: it keeps every request's time).
pub(crate) fn check_rules(rules: &[Rule]) -> Result<(), Error> {
    track::check_syncable(
        rules,
        "a limiter synced through Redis",
        "use RedisLimiter, exact mode",
    )
}
