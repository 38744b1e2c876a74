//! A limit decided first and written after (see [`all_or_nothing`](super::engine)): a
//! one-quota plan's state on the flat store, found once ([`Limiter::find_state`]), decided on
//! without writing, then charged on the word found or dropped. `check_all`'s parts and the HTTP
//! layer's limits are decided this way.

use std::hash::Hash;

use super::book::{Compiled, Lenient, Short, Words};
use super::charge::Undo;
use super::engine::Request;
use super::{Limiter, Map, clamp_now};
use crate::cell::{self, Mode, WordCall};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::plan::MAX_PARTS;
use crate::stats::Count;
use crate::store::Pending;

/// The clock reading the limits of one call share: the [`Clock::shared_id`] of the clock it
/// was read from, and the time.
#[doc(hidden)]
pub type Time = Option<(usize, u64)>;

/// A limit decided without writing anything: its state as read and what writing it later
/// needs.
#[doc(hidden)]
pub struct Decided<'a> {
    pending: Pending<'a>,
    words: &'a Words<1>,
    req: Request,
    /// The limiter's reset count when the state was read.
    resets: u64,
    /// Once charged, the refund token of what the charge wrote.
    token: Option<u64>,
}

impl std::fmt::Debug for Decided<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decided")
            .field("req", &self.req)
            .finish_non_exhaustive()
    }
}

impl Decided<'_> {
    /// The call's decision on the word read. An admission is decided again when it is
    /// charged, on the word then (the same one, unless another call charged it meanwhile).
    #[inline(always)]
    pub(crate) fn decide(&self) -> Decision {
        self.decide_cost(self.req.cost)
    }

    /// The decision of `cost` units on the word read.
    #[inline(always)]
    fn decide_cost(&self, cost: u64) -> Decision {
        let words = self.words;
        let (rule, headroom, now) = (&words.rules[0], words.headroom, self.req.now);
        let step = cell::decide_word(self.pending.word(), now, cost, rule, headroom, Mode::Check);
        step.decision
    }

    /// Counts `d`, the call's denial by this limit, in its plan's stats.
    #[inline(always)]
    pub(crate) fn count_denial(&self, d: &Decision) {
        debug_assert_eq!(Count::of(d), Count::Denied);
        self.words.counts.count(Count::Denied, 0);
    }

    /// Counts a peek of this limit after another one denied, in its plan's stats.
    #[inline(always)]
    pub(crate) fn count_peek(&self) {
        self.words.counts.count(Count::DeniedElsewhere, 0);
    }

    /// Charges the limit, decided on the word read (or on the word it holds then, where it
    /// changed since): its decision, counted in its plan's stats; what a refund needs is kept
    /// ([`undo`](Self::undo)). `None`, having written and counted nothing, when the state left
    /// its slot meanwhile.
    #[inline(always)]
    pub(crate) fn charge(&mut self) -> Option<Decision> {
        let Request { now, cost, .. } = self.req;
        let words = self.words;
        let call = WordCall {
            rule: &words.rules[0],
            now,
            cost,
            headroom: words.headroom,
            token: true,
        };
        let a = self.pending.charge(&call)?;
        let d = a.decision;
        // A decided limit's decision is its word's own, no strategy applied (a part of
        // `check_all` denies as a hard one; the HTTP layer decides only hard plans first): within
        // the limit or over it.
        let count = if d.allowed {
            Count::Allowed
        } else {
            Count::Denied
        };
        debug_assert_eq!(count, Count::of(&d));
        words.counts.count(count, a.retries);
        self.token = a.token.filter(|_| d.allowed);
        Some(d)
    }

    /// The refund record of the charge (`None`: nothing stays charged).
    #[inline(always)]
    pub(crate) fn undo(&self) -> Option<Undo> {
        let mut tokens = [None; MAX_PARTS];
        tokens[0] = self.token.map(|token| (self.words.ids[0], token));
        Undo::kept(self.req.hash, self.req.cost, self.resets, tokens)
    }

    /// Drops what was decided because another limit denied the call (counted as denied
    /// elsewhere): what the limit holds (see [`Decision::held`]).
    #[inline(always)]
    pub(crate) fn release(&self) -> Decision {
        self.count_peek();
        self.decide_cost(0).held()
    }

    /// The clock reading the limit was decided at.
    #[cfg(feature = "http")]
    pub(crate) fn now(&self) -> u64 {
        self.req.now
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// `key`'s state under `plan` found, to be decided on for `cost` units and charged later,
    /// where the plan and the state allow: a one-quota plan on the flat store, not in shadow
    /// mode (nor, with `strategies`, letting any denial through: a caller that applies the
    /// plan's strategy), the key under no penalty, its state in the table. `None` where the
    /// general path decides. Writes and counts nothing; `time` as [`now_shared`](Self::now_shared).
    #[inline(always)]
    pub(crate) fn find_state<'s>(
        &'s self,
        key: &K,
        plan: &'s Compiled,
        cost: u64,
        strategies: bool,
        time: &mut Time,
    ) -> Option<Decided<'s>> {
        let (Map::Flat(s), Short::One(words)) = (&self.store, &plan.short) else {
            return None;
        };
        // Shadow mode, and any strategy the caller applies, take the general path.
        if words.lenient == Lenient::Shadow || (strategies && words.lenient != Lenient::Hard) {
            return None;
        }
        let hash = self.key_hash(key);
        if self.penalties.maybe(hash) {
            return None;
        }
        let resets = self.resets();
        let pending = s.pending(hash, words.ids[0])?;
        // The clock read once the state is found: a limit charged instead reads it itself.
        let req = Request {
            hash,
            now: self.now_shared(time),
            cost,
        };
        Some(Decided {
            pending,
            words,
            req,
            resets,
            token: None,
        })
    }

    /// [`find_state`](Self::find_state) under the plan `plan` of this limiter, whose strategy
    /// the caller applies: an error for a plan not the limiter's, or a cost it cannot admit.
    #[cfg(feature = "http")]
    pub(crate) fn find_in(
        &self,
        key: &K,
        plan: crate::plan::PlanId,
        cost: u64,
        time: &mut Time,
    ) -> Result<Option<Decided<'_>>, crate::error::Error> {
        let plan = self.book.current().get(plan)?;
        plan.check_cost(cost)?;
        Ok(self.find_state(key, plan, cost, true, time))
    }

    /// The time a limit of a call decides at: the reading of an earlier limit whose clock is
    /// this one (`time`), else this clock's own, which later limits of the same clock then
    /// share.
    #[inline(always)]
    pub(crate) fn now_shared(&self, time: &mut Time) -> u64 {
        let id = self.clock.shared_id();
        match *time {
            Some((shared, now)) if Some(shared) == id => now,
            _ => {
                let now = clamp_now(self.clock.now());
                *time = id.map(|id| (id, now));
                now
            }
        }
    }
}
