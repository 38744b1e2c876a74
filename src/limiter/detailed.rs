//! A charge that reports each part's decision and can be taken back later: what the HTTP
//! layer needs for its headers and its refunds after the response.

use std::hash::Hash;

use super::book::{Short, Words};
use super::charge::{Call, Outcome, Undo};
use super::engine::Request;
use super::{Limiter, Map};
use crate::cell::Mode;
use crate::clock::Clock;
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::plan::{MAX_PARTS, PlanId};
use crate::store::{FlatStore, Full};

/// One charge with every part's decision: what [`Limiter::charge_detailed`] returns.
#[derive(Debug)]
pub(crate) struct Detailed {
    /// The merged decision, with the plan's strategy applied (as [`Limiter::check_in`] answers).
    pub(crate) decision: Decision,
    /// Each part's own decision, in the plan's quota order, for a plan of several parts
    /// (`None` past its parts); a one-part plan's part is `decision` itself (see
    /// [`parts`](Self::parts)). Boxed: the common one-part charge stays small to move.
    more: Option<Box<[Option<Decision>; MAX_PARTS]>>,
    /// What it takes to refund the charge (only when it was admitted and charged something).
    pub(crate) undo: Option<Undo>,
    /// The clock reading the decision was made at (ns since the clock's epoch).
    pub(crate) now: u64,
}

impl Detailed {
    /// A decision made elsewhere (Redis, exact mode) at `now`: one part, nothing to undo.
    #[cfg(feature = "redis")]
    pub(crate) fn external(decision: Decision, now: u64) -> Self {
        Self::one(decision, None, now)
    }

    /// A one-part plan's decision at `now`, taken back with `undo` (where anything stays
    /// charged).
    pub(crate) fn one(decision: Decision, undo: Option<Undo>, now: u64) -> Self {
        Detailed {
            decision,
            more: None,
            undo,
            now,
        }
    }

    fn new(
        decision: Decision,
        parts: &[Option<Decision>; MAX_PARTS],
        undo: Option<Undo>,
        now: u64,
    ) -> Self {
        let more = parts[1].is_some().then(|| Box::new(*parts));
        Detailed {
            decision,
            more,
            undo,
            now,
        }
    }

    /// Each part's decision, in the plan's quota order. A one-part plan's is the merged
    /// decision: a soft strategy changes only its `allowed` and `reason`.
    pub(crate) fn parts(&self) -> impl Iterator<Item = &Decision> {
        let (one, more) = match &self.more {
            Some(parts) => (None, &parts[..]),
            None => (Some(&self.decision), &[][..]),
        };
        one.into_iter().chain(more.iter().flatten())
    }

    /// After a refund of `cost`, where the states cannot be read again (see
    /// [`Limiter::refunded_detailed`]): every `remaining` without the charge.
    fn refunded(&mut self, cost: u64) {
        let back = |d: &mut Decision| d.remaining = d.remaining.saturating_add(cost).min(d.limit);
        for d in self.more.iter_mut().flat_map(|p| p.iter_mut().flatten()) {
            back(d);
        }
        back(&mut self.decision);
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// A charge on the short path of a plan of `N` word parts with every part's decision and
    /// refund token; `None`, having changed nothing, where it does not apply (see
    /// [`charge_words`](Self::charge_words)).
    #[inline(always)]
    fn short_outcome<const N: usize>(
        &self,
        s: &FlatStore<K>,
        words: &Words<N>,
        req: Request,
    ) -> Option<Outcome> {
        let mut parts = [Decision::NEUTRAL; N];
        let c = self.charge_words(s, words, req, true, Some(&mut parts))?;
        let mut out = Outcome::new(c.decision);
        (out.tokens, out.retries) = (c.undo_tokens(words), c.retries);
        for (slot, d) in out.parts.iter_mut().zip(parts) {
            *slot = Some(d);
        }
        Some(out)
    }

    /// After the charge `detailed` of `key` under `plan` was refunded: each part's decision
    /// reports what the key holds now ([`Decision::held`]: `remaining` and `reset_after`
    /// without the charge), and the merged one too.
    pub(crate) fn refunded_detailed(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
        detailed: &mut Detailed,
    ) {
        let book = self.book.current();
        let Ok(compiled) = book.get(plan) else {
            return detailed.refunded(cost);
        };
        let req = Request {
            hash: self.key_hash(key),
            now: super::clamp_now(self.clock.now()),
            cost,
        };
        let call = Call::new(book, key, req, compiled, Mode::Peek);
        let mut merged = Decision::NEUTRAL;
        for (i, part) in compiled.parts.iter().enumerate() {
            let Some(d) = self.held(&call, part) else {
                return detailed.refunded(cost);
            };
            if let Some(parts) = &mut detailed.more {
                parts[i] = Some(d);
            }
            merged.merge(&d);
        }
        // A request a soft or shadow limit let through stays one (its response still says so).
        if matches!(detailed.decision.reason, Reason::SoftLimit | Reason::Shadow) {
            merged.reason = detailed.decision.reason;
        }
        detailed.decision = merged;
        detailed.now = call.now;
    }

    /// [`check_in`](Self::check_in) (or a peek or a reservation, by `mode`) that also reports
    /// each part's decision and can be undone with [`take_back`](Self::take_back). Counts in
    /// the stats like `check_in`.
    pub(crate) fn charge_detailed(
        &self,
        key: &K,
        plan: PlanId,
        cost: u64,
        mode: Mode,
    ) -> Result<Detailed, Error> {
        let book = self.book.current();
        let plan = book.get(plan)?;
        plan.check_cost(cost)?;
        let mode = plan.mode(mode);
        let now = super::clamp_now(self.clock.now());
        let hash = self.key_hash(key);
        let resets = self.resets();
        let req = Request { hash, now, cost };
        let short = match (mode, &self.store, &plan.short) {
            (Mode::Check, Map::Flat(s), Short::One(words)) => {
                // The common charge (one part): no outcome to fill, the part's decision is the
                // merged one.
                if let Some(c) = self.charge_words(s, words, req, true, None) {
                    let mut d = c.decision;
                    self.settle(plan, &mut d, c.retries, mode);
                    return Ok(Detailed {
                        decision: d,
                        more: None,
                        undo: Undo::of(&d, hash, cost, resets, c.undo_tokens(words)),
                        now,
                    });
                }
                None
            }
            (Mode::Check, Map::Flat(s), Short::Two(words)) => self.short_outcome(s, words, req),
            // A one-part plan's peek: its decision is the part's.
            (Mode::Peek, Map::Flat(s), Short::One(words)) => {
                self.peek_words(s, words, req).map(|d| {
                    let mut out = Outcome::new(d);
                    out.parts[0] = Some(d);
                    out
                })
            }
            _ => None,
        };
        let out = match short {
            Some(out) => out,
            None => {
                let mut out = Outcome::new(Decision::denied(Reason::Limited, 0));
                let call = Call::new(book, key, req, plan, mode);
                match self.charge_parts(call, plan, &mut out) {
                    Ok(()) => out,
                    Err(Full) => {
                        let mut out = Outcome::new(self.table_full(plan));
                        for (p, part) in out.parts.iter_mut().zip(&plan.parts) {
                            *p = Some(Decision {
                                limit: part.rule.capacity,
                                ..out.decision
                            });
                        }
                        out
                    }
                }
            }
        };
        let mut d = out.decision;
        self.settle(plan, &mut d, out.retries, mode);
        let undo = match mode.is_peek() {
            true => None,
            false => Undo::of(&d, hash, cost, resets, out.tokens),
        };
        Ok(Detailed::new(d, &out.parts, undo, now))
    }
}
