//! Compound limits across keys and limiters ([`check_all`]: per-user AND global): each part a
//! [`Bound`] key, charged as its limiter charges a plan, all or nothing through the engine's
//! routine ([`all_or_nothing`]).

use std::hash::Hash;

use super::charge::{Call, Outcome, Undo};
use super::engine::{Limits, all_or_nothing};
use super::{Limiter, clamp_now};
use crate::cell::Mode;
use crate::clock::Clock;
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::plan::PlanId;
use crate::stats::Count;
use crate::store::Full;

/// A key bound to its limiter and plan: one part of a cross-key compound limit ([`check_all`]).
pub struct Bound<'a, K, C> {
    pub(crate) limiter: &'a Limiter<K, C>,
    pub(crate) key: &'a K,
    pub(crate) plan: PlanId,
}

impl<K, C> std::fmt::Debug for Bound<'_, K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bound")
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

mod sealed {
    pub trait Sealed {}
}

/// The clock reading parts of one call share: the [`Clock::shared_id`] of the clock it was
/// read from, and the time.
type Time = Option<(usize, u64)>;

/// One part of a compound limit across keys: a [`Bound`] key. Sealed.
pub trait Part: sealed::Sealed {
    /// Decides the part for `cost` units into `d`: charges it (counted in its plan's stats,
    /// with what a refund needs written into `undo`, left `None` when nothing stays charged),
    /// or with `peek` only decides (nothing charged, nothing counted). `time` is the clock
    /// reading of an earlier part, used when this part's clock is the same, else replaced by
    /// this part's own.
    #[doc(hidden)]
    fn charge_part(
        &self,
        cost: u64,
        peek: bool,
        d: &mut Decision,
        undo: &mut Option<Undo>,
        time: &mut Time,
    ) -> Result<(), Error>;
    /// Takes back a charge; what the part holds afterwards (see [`Decision::held`]), where it
    /// can be read here (not a plan gone, not exact mode).
    #[doc(hidden)]
    fn undo_part(&self, undo: Option<Undo>, time: &mut Time) -> Option<Decision>;
    /// Counts in the part's stats that another part denied the call (`elsewhere`): in place of
    /// the admission [`charge_part`](Self::charge_part) counted (`admitted`), or, for a part
    /// never charged, on its own. `elsewhere` false: the admission is not counted after all
    /// (the call failed).
    #[doc(hidden)]
    fn recount(&self, admitted: bool, elsewhere: bool);
}

impl<K, C> sealed::Sealed for Bound<'_, K, C> {}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Part for Bound<'_, K, C> {
    fn charge_part(
        &self,
        cost: u64,
        peek: bool,
        d: &mut Decision,
        undo: &mut Option<Undo>,
        time: &mut Time,
    ) -> Result<(), Error> {
        self.charge(cost, peek, d, undo, time)
    }

    fn undo_part(&self, undo: Option<Undo>, time: &mut Time) -> Option<Decision> {
        if let Some(undo) = undo {
            self.limiter.take_back(self.key, undo, self.now(time));
        }
        let mut held = Decision::NEUTRAL;
        self.charge(0, true, &mut held, &mut None, time).ok()?;
        Some(held.held())
    }

    fn recount(&self, admitted: bool, elsewhere: bool) {
        self.limiter
            .recount(self.plan, admitted.then_some(Count::Allowed), elsewhere);
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Bound<'_, K, C> {
    /// The time this part decides at: the reading of an earlier part whose clock is this one
    /// (`time`), else this clock's own, which later parts of the same clock then share.
    #[inline(always)]
    fn now(&self, time: &mut Time) -> u64 {
        let l = self.limiter;
        let id = l.clock.shared_id();
        match *time {
            Some((shared, now)) if Some(shared) == id => now,
            _ => {
                let now = clamp_now(l.clock.now());
                *time = id.map(|id| (id, now));
                now
            }
        }
    }

    /// See [`Part::charge_part`]; a peek of cost 0 decides what the part holds.
    #[inline(always)]
    fn charge(
        &self,
        cost: u64,
        peek: bool,
        d: &mut Decision,
        undo: &mut Option<Undo>,
        time: &mut Time,
    ) -> Result<(), Error> {
        let l = self.limiter;
        #[cfg(feature = "redis")]
        if l.exact.is_some() {
            return Err(Error::Config {
                line: None,
                message: "check_all: a limiter in Redis exact mode decides one script per plan, \
                          not across limiters; use synced mode for check_all"
                    .into(),
            });
        }
        let book = l.book.current();
        let plan = book.get(self.plan)?;
        if !peek {
            plan.check_cost(cost)?;
        }
        let now = self.now(time);
        let hash = l.key_hash(self.key);
        let resets = l.resets();
        if peek {
            if let Some(peeked) = l.peek_short(plan, hash, now, cost) {
                *d = peeked;
                return Ok(());
            }
        }
        let short = match peek {
            false => l.charge_short_outcome(plan, hash, now, cost),
            true => None,
        };
        let out = match short {
            Some(out) => out,
            None => {
                let mut out = Outcome::new(Decision::denied(Reason::Limited, 0));
                let call = Call {
                    book,
                    key: self.key,
                    hash,
                    now,
                    cost,
                    headroom: plan.headroom,
                    mode: if peek { Mode::Peek } else { Mode::Check },
                };
                match l.charge_parts(call, plan, &mut out) {
                    Ok(()) => out,
                    Err(Full) => Outcome::new(l.table_full(plan)),
                }
            }
        };
        *d = out.decision;
        if !peek {
            plan.counts.count(Count::of(d), out.retries);
            debug_assert!(!d.allowed || d.reason == Reason::Within, "{d:?}");
            *undo = Undo::of(d, hash, cost, resets, out.tokens);
        }
        Ok(())
    }
}

/// Checks `cost` units against every part (per-user AND global, across limiters and key types),
/// all or nothing: when any part denies, the parts already charged are refunded, so nothing stays
/// charged; no part ever admits beyond its own bound. Parts are charged in order, so list the
/// most likely to deny first. Strategies of the parts' plans do not apply here (hard denial).
/// Each part is its limiter's (key, rule) states, charged as [`Limiter::check_in`] charges them:
/// no lock and no allocation on the flat store (for up to four parts). Parts whose limiters
/// read one clock (every limiter built without [`Builder::clock`] reads
/// [`MonotonicClock::process`]; clones of one `FakeClock`) decide at one reading of it.
///
/// A denial reports every part: those charged before it as they hold without the call, the
/// denying one, and those after it peeked, so `retry_after` is the moment the same call passes.
/// Each plan's stats count what that plan decided (see
/// [`PlanStats::denied_elsewhere`](crate::PlanStats::denied_elsewhere)).
///
/// [`Builder::clock`]: crate::Builder::clock
/// [`MonotonicClock::process`]: crate::MonotonicClock::process
///
/// A refund happens after the charge, so for that instant a concurrent request on the same key
/// may be denied when it would otherwise pass (never admitted when it should not be).
///
/// ```
/// use tollgate::{check_all, FakeClock, Limiter, Quota};
/// let clock = FakeClock::new();
/// let per_user = Limiter::<u64>::builder().quota(Quota::per_second(2)).clock(clock.clone()).build().unwrap();
/// let global = Limiter::<()>::builder().quota(Quota::per_second(3)).clock(clock.clone()).build().unwrap();
/// let mut admitted = 0;
/// for user in [1, 1, 1, 2, 2] {
///     if check_all(&[&per_user.key(&user), &global.key(&())], 1).unwrap().is_allowed() {
///         admitted += 1;
///     }
/// }
/// assert_eq!(admitted, 3); // user 1: 2 of 3; user 2: 1 of 2, the global limit is spent
/// ```
pub fn check_all(parts: &[&dyn Part], cost: u64) -> Result<Decision, Error> {
    /// Parts whose refund records live on the stack; more take one allocation.
    const ON_STACK: usize = 4;
    if parts.len() <= ON_STACK {
        decide_all(parts, cost, [None; ON_STACK])
    } else {
        decide_all(parts, cost, vec![None; parts.len()])
    }
}

/// [`check_all`] with each part's refund record in `undos` (at least one per part).
#[inline(always)]
fn decide_all(
    parts: &[&dyn Part],
    cost: u64,
    undos: impl AsMut<[Option<Undo>]>,
) -> Result<Decision, Error> {
    let mut all = Across {
        parts,
        cost,
        time: None,
        undos,
        merged: Decision::denied(Reason::Limited, 0),
        reported: Decision::NEUTRAL,
    };
    match all_or_nothing(&mut all)? {
        None => Ok(all.merged),
        Some(_) => {
            // Denied still, for the denying part's reason (merged: the parts up to it).
            let mut d = all.reported;
            d.allowed = false;
            d.reason = all.merged.reason;
            d.delay_ns = 0;
            Ok(d)
        }
    }
}

/// The parts of a [`check_all`] as [`Limits`].
struct Across<'p, U> {
    parts: &'p [&'p dyn Part],
    cost: u64,
    time: Time,
    undos: U,
    /// The charged parts' decisions merged (the call's decision when every part admits).
    merged: Decision,
    /// Every part's decision as a denial reports it: the refunded parts' holdings, the
    /// denying part's decision, the later parts' peeks.
    reported: Decision,
}

impl<U: AsMut<[Option<Undo>]>> Limits for Across<'_, U> {
    type Error = Error;

    #[inline(always)]
    fn len(&self) -> usize {
        self.parts.len()
    }

    #[inline(always)]
    fn charge(&mut self, i: usize, peek: bool) -> Result<bool, Error> {
        let part = self.parts[i];
        let mut d = Decision::NEUTRAL;
        if peek {
            // Never charged: its plan counts the call as denied elsewhere. A part that cannot
            // be peeked here (exact mode) is left out of the report.
            part.recount(false, true);
            if part
                .charge_part(self.cost, true, &mut d, &mut None, &mut self.time)
                .is_ok()
            {
                self.reported.merge(&d);
            }
            return Ok(d.allowed);
        }
        part.charge_part(
            self.cost,
            false,
            &mut d,
            &mut self.undos.as_mut()[i],
            &mut self.time,
        )?;
        if i == 0 {
            self.merged = Decision::NEUTRAL;
        }
        self.merged.merge(&d);
        if !d.allowed {
            self.reported.merge(&d);
        }
        Ok(d.allowed)
    }

    fn refund(&mut self, i: usize, report: bool) {
        let part = self.parts[i];
        let undo = self.undos.as_mut()[i].take();
        if report {
            // Another part denied: this admission is taken back, in the state and the stats.
            part.recount(true, true);
            if let Some(held) = part.undo_part(undo, &mut self.time) {
                self.reported.merge(&held);
            }
        } else {
            // The call failed: the admission is not counted after all.
            part.recount(true, false);
            if undo.is_some() {
                let _ = part.undo_part(undo, &mut self.time);
            }
        }
    }
}
