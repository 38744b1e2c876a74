//! Compound limits across keys and limiters ([`check_all`]: per-user AND global): each part a
//! [`Bound`] key, charged as its limiter charges a plan, all or nothing through the engine's
//! routine ([`all_or_nothing`]).

use std::hash::Hash;

use super::book::{Book, Compiled, Lenient, Short, Words};
use super::charge::{Call, Outcome, Undo};
use super::decided::{Decided, Time};
use super::engine::{Limits, Request, all_or_nothing};
use super::{Limiter, Map, soften};
use crate::cell::Mode;
use crate::clock::Clock;
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::plan::{PlanId, Strategy};
use crate::stats::Count;
use crate::store::{FlatStore, Full};

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

/// How a part takes part in a call (see [`Bound::decide`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Charged, and counted in its plan's stats.
    Charge,
    /// Only decided, after another part denied: counted as denied elsewhere.
    Peek,
    /// What it holds (a peek of cost 0), counted nowhere.
    Held,
}

/// One part of a compound limit across keys: a [`Bound`] key. Sealed.
pub trait Part: sealed::Sealed {
    /// Finds the part's state to be decided on for `cost` units and charged later, where its
    /// plan and state allow (a one-rule plan on the flat store, the key's state in the table,
    /// no penalty), into `decided`, left `None` where the general path decides
    /// ([`charge_part`](Self::charge_part)). Writes and counts nothing.
    #[doc(hidden)]
    fn decide_part<'s>(
        &'s self,
        cost: u64,
        time: &mut Time,
        decided: &mut Option<Decided<'s>>,
    ) -> Result<(), Error>;
    /// Decides the part for `cost` units without charging it, another part having denied the
    /// call (counted as denied elsewhere), where its plan and state allow as for
    /// [`decide_part`](Self::decide_part): its decision, or `None` where the general path
    /// peeks it ([`charge_part`](Self::charge_part)). Writes nothing.
    #[doc(hidden)]
    fn peek_part(&self, cost: u64, time: &mut Time) -> Result<Option<Decision>, Error>;
    /// Decides the part for `cost` units into `d`: charges it (counted in its plan's stats,
    /// with what a refund needs written into `undo`, left `None` when nothing stays charged),
    /// or with `peek` (another part denied the call) only decides it (nothing charged;
    /// counted as denied elsewhere). `time` is the clock reading of an earlier part, used when
    /// this part's clock is the same, else replaced by this part's own.
    #[doc(hidden)]
    fn charge_part(
        &self,
        cost: u64,
        peek: bool,
        d: &mut Decision,
        undo: &mut Option<Undo>,
        time: &mut Time,
    ) -> Result<(), Error>;
    /// Takes back an admission: its charge (`undo`, where anything stays charged) and its
    /// count, counted instead as denied elsewhere (`elsewhere`: another part denied the call)
    /// or not at all (the call failed). With `elsewhere`, what the part holds afterwards (see
    /// [`Decision::held`]), where it can be read here (not a plan gone, not exact mode).
    #[doc(hidden)]
    fn undo_part(&self, undo: Option<Undo>, elsewhere: bool, time: &mut Time) -> Option<Decision>;
}

impl<K, C> sealed::Sealed for Bound<'_, K, C> {}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Part for Bound<'_, K, C> {
    #[inline(always)]
    fn decide_part<'s>(
        &'s self,
        cost: u64,
        time: &mut Time,
        decided: &mut Option<Decided<'s>>,
    ) -> Result<(), Error> {
        let (_, plan) = self.plan(Role::Charge, cost)?;
        // Strategies do not apply here but shadow mode, which the general path decides.
        *decided = self.limiter.find_state(self.key, plan, cost, false, time);
        Ok(())
    }

    #[inline(always)]
    fn peek_part(&self, cost: u64, time: &mut Time) -> Result<Option<Decision>, Error> {
        let (_, plan) = self.plan(Role::Peek, cost)?;
        let Some(decided) = self.limiter.find_state(self.key, plan, cost, false, time) else {
            return Ok(None);
        };
        let d = decided.decide();
        decided.count_peek();
        Ok(Some(d))
    }

    fn charge_part(
        &self,
        cost: u64,
        peek: bool,
        d: &mut Decision,
        undo: &mut Option<Undo>,
        time: &mut Time,
    ) -> Result<(), Error> {
        let role = if peek { Role::Peek } else { Role::Charge };
        self.decide(cost, role, d, undo, time)
    }

    fn undo_part(&self, undo: Option<Undo>, elsewhere: bool, time: &mut Time) -> Option<Decision> {
        let l = self.limiter;
        let now = l.now_shared(time);
        // An admission always leaves a refund record (a cost is at least 1): with none, the
        // part passed in shadow mode, charging nothing.
        let shadow = || {
            l.book
                .current()
                .get(self.plan)
                .is_ok_and(|p| p.strategy == Strategy::Shadow)
        };
        let counted = if undo.is_none() && shadow() {
            Count::ShadowPassed
        } else {
            Count::Allowed
        };
        l.recount(self.plan, Some(counted), elsewhere);
        if let Some(undo) = undo {
            // On the short path the refunds themselves report what the part holds.
            if elsewhere {
                if let Some(held) = self.refund_short(undo, now) {
                    return Some(held);
                }
            }
            l.take_back(self.key, undo, now);
        }
        if !elsewhere {
            return None;
        }
        let mut held = Decision::NEUTRAL;
        self.decide(0, Role::Held, &mut held, &mut None, time)
            .ok()?;
        Some(held.held())
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Bound<'_, K, C> {
    /// The limiter's book and the part's plan in it, for a call in `role` of `cost` units: an
    /// error where the call cannot be decided here (exact mode, a plan not the limiter's, a
    /// cost the plan cannot admit).
    #[inline(always)]
    fn plan(&self, role: Role, cost: u64) -> Result<(&Book, &Compiled), Error> {
        let l = self.limiter;
        if l.backend.is_exact() {
            return Err(Error::Config {
                line: None,
                message: "check_all: a limiter in Redis exact mode decides one script per plan, \
                          not across limiters; use synced mode for check_all"
                    .into(),
            });
        }
        let book = l.book.current();
        let plan = book.get(self.plan)?;
        if role == Role::Charge {
            plan.check_cost(cost)?;
        }
        Ok((book, plan))
    }

    /// The part's decision for `cost` units in `role` (see [`Part::charge_part`]), on the short
    /// path where the plan has one, else on the general path.
    #[inline(always)]
    fn decide(
        &self,
        cost: u64,
        role: Role,
        d: &mut Decision,
        undo: &mut Option<Undo>,
        time: &mut Time,
    ) -> Result<(), Error> {
        let l = self.limiter;
        let (book, plan) = self.plan(role, cost)?;
        let req = Request {
            hash: l.key_hash(self.key),
            now: l.now_shared(time),
            cost,
        };
        // A plan in shadow mode takes the general path, which lets its denials through.
        let done = match (&l.store, &plan.short) {
            (Map::Flat(s), Short::One(words)) if words.lenient != Lenient::Shadow => {
                self.short(s, words, req, role, d, undo)
            }
            (Map::Flat(s), Short::Two(words)) if words.lenient != Lenient::Shadow => {
                self.short(s, words, req, role, d, undo)
            }
            _ => false,
        };
        if !done {
            self.general(book, plan, req, role, d, undo);
        }
        if role == Role::Peek {
            plan.counts.count(Count::DeniedElsewhere, 0);
        }
        Ok(())
    }

    /// [`decide`](Self::decide) on the short path (see [`Limiter::charge_words`]): true when
    /// it applied and decided into `d` and `undo`, false, having changed nothing, when the
    /// general path decides.
    #[inline(always)]
    fn short<const N: usize>(
        &self,
        s: &FlatStore<K>,
        words: &Words<N>,
        req: Request,
        role: Role,
        d: &mut Decision,
        undo: &mut Option<Undo>,
    ) -> bool {
        let l = self.limiter;
        if role != Role::Charge {
            return l
                .peek_words(s, words, req)
                .map(|peeked| *d = peeked)
                .is_some();
        }
        let resets = l.resets();
        let Some(c) = l.charge_words(s, words, req, true, None) else {
            return false;
        };
        *d = c.decision;
        words.counts.count(Count::of(d), c.retries);
        *undo = Undo::of(d, req.hash, req.cost, resets, c.undo_tokens(words));
        true
    }

    /// [`Part::undo_part`]'s refund of a charge the short path made, where it still applies
    /// (the plan's rules and the key's state as they were, no penalty): the charge taken back,
    /// and what the part holds afterwards. `None`, having changed nothing, where the general
    /// path must.
    #[inline(always)]
    fn refund_short(&self, undo: Undo, now: u64) -> Option<Decision> {
        let l = self.limiter;
        let Map::Flat(s) = &l.store else {
            return None;
        };
        let plan = l.book.current().get(self.plan).ok()?;
        if l.resets() != undo.resets || l.penalties.maybe(undo.hash) {
            return None;
        }
        let req = Request {
            hash: undo.hash,
            now,
            cost: undo.cost,
        };
        let held = match &plan.short {
            Short::One(words) => l.refund_words(s, words, req, tokens_of(words, &undo)?),
            Short::Two(words) => l.refund_words(s, words, req, tokens_of(words, &undo)?),
            Short::None => return None,
        };
        Some(held)
    }

    /// [`decide`](Self::decide) on the general path (out of line: the short path stays small).
    #[inline(never)]
    fn general(
        &self,
        book: &Book,
        plan: &Compiled,
        req: Request,
        role: Role,
        d: &mut Decision,
        undo: &mut Option<Undo>,
    ) {
        let l = self.limiter;
        let resets = l.resets();
        let mut out = Outcome::new(Decision::denied(Reason::Limited, 0));
        let mode = if role == Role::Charge {
            Mode::Check
        } else {
            Mode::Peek
        };
        let call = Call::new(book, self.key, req, plan, mode);
        if let Err(Full) = l.charge_parts(call, plan, &mut out) {
            out = Outcome::new(l.table_full(plan));
        }
        *d = out.decision;
        if role == Role::Charge {
            shadow_only(plan.strategy, d);
            plan.counts.count(Count::of(d), out.retries);
            debug_assert!(
                !d.allowed || matches!(d.reason, Reason::Within | Reason::Shadow),
                "{d:?}"
            );
            *undo = Undo::of(d, req.hash, req.cost, resets, out.tokens);
        }
    }
}

/// The one strategy a part of [`check_all`] follows: shadow mode lets a denial through (nothing
/// charged, counted as a shadow pass); every other strategy denies as a hard one.
#[inline(always)]
fn shadow_only(strategy: Strategy, d: &mut Decision) {
    if strategy == Strategy::Shadow {
        soften(strategy, d);
    }
}

/// The refund tokens of `undo` as the short path of `words` left them, part by part; `None`
/// when the plan's rules changed since (the general path then takes the charge back).
#[inline(always)]
fn tokens_of<const N: usize>(words: &Words<N>, undo: &Undo) -> Option<[Option<u64>; N]> {
    let mut tokens = [None; N];
    for (i, t) in undo.tokens.iter().enumerate() {
        match t {
            Some((id, token)) if i < N && *id == words.ids[i] => tokens[i] = Some(*token),
            Some(_) => return None,
            None => {}
        }
    }
    Some(tokens)
}

/// Checks `cost` units against every part (per-user AND global, across limiters and key types),
/// all or nothing: when any part denies, the parts already charged are refunded, so nothing stays
/// charged; no part ever admits beyond its own bound. Parts are charged in order, so list the
/// most likely to deny first. Strategies of the parts' plans do not apply here (hard denial),
/// but for shadow mode ([`Strategy::Shadow`]): a part in shadow mode never denies the call.
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
/// Parts are decided before anything is written: when a part denies, the others are left as
/// they were, not charged and taken back (on the flat store, for the first four parts whose
/// plans have one quota and whose states are in the table). Where a part had to be charged
/// first (a key's first call, a state beside the table, a race lost to another call), its
/// refund follows the charge, so for that instant a concurrent request on the same key may be
/// denied when it would otherwise pass (never admitted when it should not be).
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
    // Up to four parts, the part count is a constant the engine's routine is specialised for,
    // and the refund records live on the stack; more take one allocation.
    match parts.len() {
        0 => Ok(Decision::denied(Reason::Limited, 0)),
        1 => decide_all::<_, 1>(parts, cost, [None; 1]),
        2 => decide_all::<_, 2>(parts, cost, [None; 2]),
        3 => decide_all::<_, 3>(parts, cost, [None; 3]),
        4 => decide_all::<_, 4>(parts, cost, [None; 4]),
        n => decide_all::<_, ON_STACK>(parts, cost, vec![None; n]),
    }
}

/// The parts of a [`check_all`] of more than four parts that are decided before anything is
/// written ([`Limits::decide`]): the first four.
const ON_STACK: usize = 4;

/// [`check_all`] with each part's refund record in `undos` (one per part); the first `N`
/// parts (all of them, up to four) are decided before anything is written.
#[inline(always)]
fn decide_all<U: AsMut<[Option<Undo>]> + AsRef<[Option<Undo>]>, const N: usize>(
    parts: &[&dyn Part],
    cost: u64,
    undos: U,
) -> Result<Decision, Error> {
    let mut all = Across {
        parts,
        cost,
        time: None,
        decided: std::array::from_fn::<_, N, _>(|_| None),
        undos,
        merged: Decision::NEUTRAL,
        reported: Decision::NEUTRAL,
    };
    match all_or_nothing(&mut all)? {
        None => Ok(all.merged),
        Some(_) => {
            // Denied still, for the denying part's reason: the report starts from its decision.
            let mut d = all.reported;
            d.allowed = false;
            d.delay_ns = 0;
            Ok(d)
        }
    }
}

/// The parts of a [`check_all`] as [`Limits`].
struct Across<'p, U, const N: usize> {
    parts: &'p [&'p dyn Part],
    cost: u64,
    time: Time,
    /// What [`Limits::decide`] decided for each of the first parts, until it is written or
    /// dropped.
    decided: [Option<Decided<'p>>; N],
    undos: U,
    /// The charged parts' decisions merged (the call's decision when every part admits).
    merged: Decision,
    /// Every part's decision as a denial reports it: the refunded parts' holdings, the
    /// denying part's decision, the later parts' peeks.
    reported: Decision,
}

impl<U: AsMut<[Option<Undo>]>, const N: usize> Across<'_, U, N> {
    /// [`Limits::charge`] of part `i` on the general path (through [`Part::charge_part`]).
    fn charge_general(&mut self, i: usize, peek: bool) -> Result<bool, Error> {
        let part = self.parts[i];
        let mut d = Decision::NEUTRAL;
        if peek {
            // A part that cannot be peeked here (exact mode) is left out of the report.
            let peeked = part.charge_part(self.cost, true, &mut d, &mut None, &mut self.time);
            if peeked.is_ok() {
                self.reported.merge(&d);
            }
            return Ok(d.allowed);
        }
        let undo = &mut self.undos.as_mut()[i];
        part.charge_part(self.cost, false, &mut d, undo, &mut self.time)?;
        Ok(self.note(i, d))
    }

    /// Notes charged part `i`'s decision `d` in the merged one: whether it admitted.
    #[inline(always)]
    fn note(&mut self, i: usize, d: Decision) -> bool {
        if i == 0 {
            // The first part's decision is the base (an admission's reason is its reason),
            // whatever order the parts were charged in.
            let before = self.merged;
            self.merged = d;
            self.merged.merge(&before);
        } else {
            self.merged.merge(&d);
        }
        if !d.allowed {
            // A denial's report starts from the denying part's decision.
            self.reported = d;
        }
        d.allowed
    }
}

impl<U: AsMut<[Option<Undo>]> + AsRef<[Option<Undo>]>, const N: usize> Limits for Across<'_, U, N> {
    type Error = Error;

    #[inline(always)]
    fn len(&self) -> usize {
        // A constant for up to four parts (the refund records' array).
        self.undos.as_ref().len()
    }

    #[inline(always)]
    fn decide(&mut self, i: usize) -> Result<Option<bool>, Error> {
        let Some(slot) = self.decided.get_mut(i) else {
            return Ok(None);
        };
        self.parts[i].decide_part(self.cost, &mut self.time, slot)?;
        let Some(decided) = slot else {
            return Ok(None);
        };
        let d = decided.decide();
        if !d.allowed {
            // A denial's report starts from the denying part's decision.
            decided.count_denial(&d);
            self.reported = d;
            *slot = None;
            return Ok(Some(false));
        }
        Ok(Some(true))
    }

    #[inline(always)]
    fn release(&mut self, i: usize) {
        if let Some(decided) = self.decided[i].take() {
            let held = decided.release();
            self.reported.merge(&held);
        }
    }

    #[inline(always)]
    fn charge(&mut self, i: usize, peek: bool) -> Result<bool, Error> {
        let Some(slot) = self.decided.get_mut(i) else {
            return self.charge_general(i, peek);
        };
        if peek {
            // After another part's denial: read afresh, written nowhere.
            *slot = None;
            return match self.parts[i].peek_part(self.cost, &mut self.time) {
                Ok(Some(d)) => {
                    self.reported.merge(&d);
                    Ok(d.allowed)
                }
                // The general path peeks it (and leaves out of the report a part it cannot
                // peek).
                Ok(None) | Err(_) => self.charge_general(i, true),
            };
        }
        // A part decided before is charged on what it read; any other is looked up now.
        if slot.is_none() {
            self.parts[i].decide_part(self.cost, &mut self.time, slot)?;
        }
        let Some(decided) = slot else {
            return self.charge_general(i, false);
        };
        match decided.charge() {
            Some(d) => Ok(self.note(i, d)),
            None => {
                // The state left its slot: the general path charges it.
                *slot = None;
                self.charge_general(i, false)
            }
        }
    }

    fn refund(&mut self, i: usize, report: bool) {
        let undo = match self.decided.get_mut(i).and_then(Option::take) {
            Some(charged) => charged.undo(),
            None => self.undos.as_mut()[i].take(),
        };
        let held = self.parts[i].undo_part(undo, report, &mut self.time);
        if let Some(held) = held {
            self.reported.merge(&held);
        }
    }
}
