//! The general path: one call on every part of a plan, each part the state of one (key, rule)
//! in whichever store and algorithm (a new state, a state carried over from a plan's earlier
//! rule, a sliding log, a synced limiter's hook), all or nothing through the engine's routine
//! ([`all_or_nothing`]), with exact refunds.
//!
//! On the flat store a word-cell part is its slot, charged with one compare-and-swap; a new
//! state is claimed under its shard's write lock. Sliding logs are cells beside the table (one
//! lock per call, as the log itself takes).

use std::hash::Hash;

use super::book::{Book, Compiled, PartRule};
use super::engine::{Limits, Request, all_or_nothing};
use super::{Limiter, Map};
use crate::algo::Kind;
use crate::cell::{self, Applied, Cell, Mode};
use crate::clock::Clock;
use crate::decision::{Decision, Reason};
use crate::plan::MAX_PARTS;
use crate::store::{FlatStore, Fresh, Full, Kept, RuleId, Store};

/// One call on one key as the charge path passes it down to each part: the book it decides by,
/// the key and its hash ([`Limiter::key_hash`]), the time, the cost, and the plan's headroom
/// and mode.
pub(crate) struct Call<'a, K> {
    pub(crate) book: &'a Book,
    pub(crate) key: &'a K,
    pub(crate) hash: u64,
    pub(crate) now: u64,
    pub(crate) cost: u64,
    pub(crate) headroom: u64,
    pub(crate) mode: Mode,
}

impl<K> Clone for Call<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Call<'_, K> {}

impl<'a, K> Call<'a, K> {
    /// The call `req` on `key` under `plan`, in `mode`, by `book`.
    pub(crate) fn new(
        book: &'a Book,
        key: &'a K,
        req: Request,
        plan: &Compiled,
        mode: Mode,
    ) -> Self {
        Call {
            book,
            key,
            hash: req.hash,
            now: req.now,
            cost: req.cost,
            headroom: plan.headroom,
            mode,
        }
    }

    /// The same call, only decided (a part after a denial).
    fn peek(self) -> Self {
        Call {
            mode: Mode::Peek,
            ..self
        }
    }
}

/// One call's outcome on every part of a plan.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    /// The merged decision (before the plan's soft strategy).
    pub(crate) decision: Decision,
    /// Each part's own decision, in the plan's order; `None` past its parts.
    pub(crate) parts: [Option<Decision>; MAX_PARTS],
    /// What a refund of each part needs: its rule and token; `None` where nothing stays charged.
    pub(crate) tokens: [Option<(RuleId, u64)>; MAX_PARTS],
    /// Compare-and-swap attempts lost to other threads.
    pub(crate) retries: u32,
}

impl Outcome {
    pub(crate) fn new(decision: Decision) -> Outcome {
        Outcome {
            decision,
            parts: [None; MAX_PARTS],
            tokens: [None; MAX_PARTS],
            retries: 0,
        }
    }
}

/// What taking a charge back needs: the key's hash, the cost and each charged part's token.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Undo {
    pub(crate) hash: u64,
    pub(crate) cost: u64,
    /// The limiter's reset count when the charge was made.
    pub(crate) resets: u64,
    pub(crate) tokens: [Option<(RuleId, u64)>; MAX_PARTS],
}

impl Undo {
    /// The refund record of an admitted charge (`decision`) that left `tokens`: `None` when
    /// nothing stays charged (a denial, a peek, a charge that wrote nothing to take back).
    #[inline(always)]
    pub(crate) fn of(
        decision: &Decision,
        hash: u64,
        cost: u64,
        resets: u64,
        tokens: [Option<(RuleId, u64)>; MAX_PARTS],
    ) -> Option<Undo> {
        if !decision.allowed {
            return None;
        }
        Self::kept(hash, cost, resets, tokens)
    }

    /// The refund record of the charge tokens `tokens` left (`None` when they hold none:
    /// nothing stays charged).
    #[inline(always)]
    pub(crate) fn kept(
        hash: u64,
        cost: u64,
        resets: u64,
        tokens: [Option<(RuleId, u64)>; MAX_PARTS],
    ) -> Option<Undo> {
        tokens.iter().any(Option::is_some).then_some(Undo {
            hash,
            cost,
            resets,
            tokens,
        })
    }
}

/// A plan's parts on one key as [`Limits`]: the general path's parts.
struct PlanParts<'o, 'a, K, C> {
    limiter: &'a Limiter<K, C>,
    call: Call<'a, K>,
    plan: &'a Compiled,
    out: &'o mut Outcome,
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limits for PlanParts<'_, '_, K, C> {
    type Error = Full;

    fn len(&self) -> usize {
        self.plan.parts.len()
    }

    fn charge(&mut self, i: usize, peek: bool) -> Result<bool, Full> {
        let part = &self.plan.parts[i];
        let call = if peek { self.call.peek() } else { self.call };
        let a = self.limiter.apply_part(&call, part, true)?;
        self.out.retries += a.retries;
        self.out.parts[i] = Some(a.decision);
        if !peek {
            self.out.tokens[i] = a.token.map(|t| (part.id, t));
        }
        Ok(a.decision.allowed)
    }

    fn refund(&mut self, i: usize, report: bool) {
        if let Some(token) = self.out.tokens[i].take() {
            self.limiter.refund_part(&self.call, token);
        }
        if report {
            // What the part holds without the call (its state read again).
            let held = self.limiter.held(&self.call, &self.plan.parts[i]);
            self.out.parts[i] = held.or(self.out.parts[i]);
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// Charges (or peeks, by `call.mode`) every part of `plan` on the general path, all or
    /// nothing: the merged decision and the compare-and-swap retries. `Err(Full)` when a part's
    /// state is new and the table is full (nothing then stays charged).
    #[inline(always)]
    pub(crate) fn charge(
        &self,
        call: Call<'_, K>,
        plan: &Compiled,
    ) -> Result<(Decision, u32), Full> {
        let mut out = Outcome::new(Decision::denied(Reason::Limited, 0));
        self.charge_parts(call, plan, &mut out)?;
        Ok((out.decision, out.retries))
    }

    /// [`charge`](Self::charge) with each part's decision and refund token, into `out` (as
    /// [`Outcome::new`] made it: written in place, where a returned outcome was copied twice).
    #[inline(never)]
    pub(crate) fn charge_parts(
        &self,
        call: Call<'_, K>,
        plan: &Compiled,
        out: &mut Outcome,
    ) -> Result<(), Full> {
        if let Some(blocked) = self.blocked(call.key, call.hash, plan, call.now) {
            *out = blocked;
            return Ok(());
        }
        if let Map::Flat(s) = &self.store {
            // Every part's state is asked for before the first is read, so their cache misses
            // overlap instead of following one another.
            for part in &plan.parts {
                s.prefetch_state(call.hash, part.id);
            }
        }
        let mut parts = PlanParts {
            limiter: self,
            call,
            plan,
            out,
        };
        all_or_nothing(&mut parts)?;
        let mut merged: Option<Decision> = None;
        for d in out.parts.iter().flatten() {
            match &mut merged {
                Some(m) => m.merge(d),
                None => merged = Some(*d),
            }
        }
        out.decision = merged.unwrap_or(out.decision);
        Ok(())
    }

    /// Every part of `plan` denied by a penalty, when `key` is under one at `now`.
    #[inline(always)]
    pub(super) fn blocked(&self, key: &K, hash: u64, plan: &Compiled, now: u64) -> Option<Outcome> {
        if !self.penalties.maybe(hash) {
            return None;
        }
        let until = self.penalties.until(hash, key);
        (until > now).then(|| blocked_outcome(plan, until - now))
    }

    /// Applies one call to the state of (`call.key`, `part`): `with_token` asks for the token
    /// a refund needs.
    #[inline(always)]
    fn apply_part(
        &self,
        call: &Call<'_, K>,
        part: &PartRule,
        with_token: bool,
    ) -> Result<Applied, Full> {
        match &self.store {
            #[cfg(feature = "redis")]
            Map::Flat(s) if self.backend.is_synced() => self.apply_synced(s, call, part),
            Map::Flat(s) if part.rule.kind != Kind::Log => {
                self.apply_inline(s, call, part, with_token, &NoHook)
            }
            Map::Flat(s) => self.apply_cell(s, call, part),
            Map::Dash(s) => self.apply_cell(s, call, part),
        }
    }

    /// What (`call.key`, `part`) holds at `call.now`, as [`Decision::held`] reports it: a peek
    /// of cost 0 (`remaining` and `reset_after` as the state is, where a charge's decision
    /// counts the charge). `None` only where the store could not be read (never for a peek).
    pub(crate) fn held(&self, call: &Call<'_, K>, part: &PartRule) -> Option<Decision> {
        let call = Call {
            cost: 0,
            mode: Mode::Peek,
            ..*call
        };
        self.apply_part(&call, part, false)
            .ok()
            .map(|a| a.decision.held())
    }

    /// [`apply_part`](Self::apply_part) for a word-cell part on the flat store: its slot.
    #[inline(always)]
    pub(crate) fn apply_inline(
        &self,
        s: &FlatStore<K>,
        call: &Call<'_, K>,
        part: &PartRule,
        with_token: bool,
        hook: &impl StateHook,
    ) -> Result<Applied, Full> {
        let rule = &part.rule;
        let Call {
            now,
            cost,
            headroom,
            mode,
            ..
        } = *call;
        loop {
            let charged = s.apply_word(call.hash, part.id, |slot, word| {
                hook.apply(slot, word, |slot, word| {
                    if with_token {
                        cell::apply_inline_part(slot, word, now, cost, rule, headroom, mode)
                    } else {
                        cell::apply_inline(slot, word, now, cost, rule, headroom, mode)
                    }
                })
            });
            if let Some(a) = charged {
                return Ok(a);
            }
            // No word state (a word rule's state is never a cell; a cell of this rule's id is
            // another key's log state of the same fingerprint: shared, as collisions are).
            // A state never seen starts where the plan's previous rules left the key.
            let start = hook.start(self.inherited_word(s, call, part));
            let step = cell::decide_word(start, now, cost, rule, headroom, mode.previewed());
            if mode.is_peek() {
                return Ok(Applied {
                    decision: step.decision,
                    token: None,
                    retries: 0,
                });
            }
            self.new_state_seen();
            let fresh = self.fresh(call.book, now, true);
            if s.refuses_new_keys() {
                return Err(Full);
            }
            // Insertion and first charge are one write (a denial claims the start).
            let first = step.next.unwrap_or(start);
            let inserted = match s.insert_word(call.hash, part.id, first, fresh) {
                Ok(inserted) => inserted,
                // Stale states elsewhere in the table make room: look again.
                Err(Full) if self.reclaim_at_cap(now) => continue,
                Err(Full) => return Err(Full),
            };
            if inserted {
                self.retire_lineage(s, call.key, part);
                if step.next.is_some() {
                    hook.charged();
                }
                return Ok(Applied {
                    decision: step.decision,
                    token: step.next.map(|w| cell::token_of(rule.kind, w)),
                    retries: 0,
                });
            }
            // Inserted by another thread meanwhile: charge that.
        }
    }

    /// [`apply_part`](Self::apply_part) through a store's cells (sliding logs; every part on
    /// the dash store).
    fn apply_cell<S: Store<K>>(
        &self,
        s: &S,
        call: &Call<'_, K>,
        part: &PartRule,
    ) -> Result<Applied, Full> {
        let Call {
            key,
            now,
            cost,
            headroom,
            mode,
            ..
        } = *call;
        let apply = |c: &Cell| c.apply(now, cost, &part.rule, headroom, mode);
        if let Some(a) = s.with(key, part.id, apply) {
            return Ok(a);
        }
        // Looked up before the insert, which holds the store's lock while it builds the cell.
        let start = self.inherited_cell(s, call, part);
        if mode.is_peek() {
            return Ok(apply(&start));
        }
        self.new_state_seen();
        let fresh = self.fresh(call.book, now, true);
        let a = match s.with_or_insert(key, part.id, || start, fresh, apply) {
            // Stale states elsewhere in the table make room: once more.
            Err(Full) if self.reclaim_at_cap(now) => {
                let start = self.inherited_cell(s, call, part);
                s.with_or_insert(key, part.id, || start, fresh, apply)?
            }
            a => a?,
        };
        self.retire_lineage(s, key, part);
        Ok(a)
    }

    /// Where a new inline state of `part` starts: the key's state under the latest rule of the
    /// part's lineage that it has, carried over (fresh, 0, when that rule is a log: another
    /// algorithm starts fresh); else fresh.
    fn inherited_word(&self, s: &FlatStore<K>, call: &Call<'_, K>, part: &PartRule) -> u64 {
        for &old in &part.lineage {
            let rule = &call.book.rules[usize::from(old)];
            match s.kept(call.hash, old) {
                Kept::Word(word) => return cell::migrate_word(word, call.now, rule, &part.rule),
                Kept::Cell => return 0,
                Kept::Absent => {}
            }
        }
        0
    }

    /// Once the key has a state under `part`, its states under the part's lineage go: they
    /// moved (see [`PartRule::lineage`]). A check on a book from before the change that charges
    /// an old state meanwhile loses that charge with it (only while the change is installed).
    fn retire_lineage<S: Store<K>>(&self, s: &S, key: &K, part: &PartRule) {
        for &old in &part.lineage {
            if s.remove(key, old) {
                self.forget_stale_from();
            }
        }
    }

    /// [`inherited_word`](Self::inherited_word) for a store's cells.
    fn inherited_cell<S: Store<K>>(&self, s: &S, call: &Call<'_, K>, part: &PartRule) -> Cell {
        for &old in &part.lineage {
            let rule = &call.book.rules[usize::from(old)];
            if let Some(c) = s.with(call.key, old, |c| c.migrate(call.now, rule, &part.rule)) {
                return c;
            }
        }
        Cell::fresh(part.rule.kind)
    }

    /// Takes back every charge in `tokens` (clearing them).
    pub(crate) fn refund(
        &self,
        call: &Call<'_, K>,
        tokens: &mut [Option<(RuleId, u64)>; MAX_PARTS],
    ) {
        for token in tokens.iter_mut().filter_map(Option::take) {
            self.refund_part(call, token);
        }
    }

    /// Takes back one part's charge: `token` of rule `id`, `call.cost` units.
    fn refund_part(&self, call: &Call<'_, K>, (id, token): (RuleId, u64)) {
        let rule = &call.book.rules[usize::from(id)];
        let (cost, now) = (call.cost, call.now);
        match &self.store {
            Map::Flat(s) if rule.kind != Kind::Log => {
                // A state removed meanwhile (a reset) holds nothing left to take back; one
                // that moved (its shard grew) is found again in its new slot.
                let refunded = s.update_word(call.hash, id, |slot, word| {
                    cell::refund_inline(slot, word, cost, rule, token, now)
                });
                #[cfg(feature = "redis")]
                if refunded.is_some() {
                    self.refund_synced(call, id, rule);
                }
                #[cfg(not(feature = "redis"))]
                let _ = refunded;
            }
            Map::Flat(s) => {
                s.with(call.key, id, |c| c.refund(cost, rule, token, now));
            }
            Map::Dash(s) => {
                s.with(call.key, id, |c| c.refund(cost, rule, token, now));
            }
        }
    }

    /// Takes back a charge an earlier call made (`undo`), at `now`, unless a reset came
    /// between: the state may then be a new one, which owes that charge nothing.
    pub(crate) fn take_back(&self, key: &K, mut undo: Undo, now: u64) {
        if self.resets() != undo.resets {
            return;
        }
        let call = Call {
            book: self.book.current(),
            key,
            hash: undo.hash,
            now: super::clamp_now(now),
            cost: undo.cost,
            headroom: 0,
            mode: Mode::Check,
        };
        self.refund(&call, &mut undo.tokens);
    }

    /// Resets so far (see the field).
    pub(crate) fn resets(&self) -> u64 {
        // Acquire: pairs with `reset`'s AcqRel increment.
        self.resets.load(crate::sync::Ordering::Acquire)
    }

    /// The freshness test for sweeps and evictions at `now` (less the grace), counting
    /// evictions when `evictions` is set.
    pub(crate) fn fresh<'a>(&'a self, book: &'a Book, now: u64, evictions: bool) -> Fresh<'a> {
        Fresh {
            now: now.saturating_sub(self.sweep_grace_ns),
            rules: &book.rules,
            evictions: evictions.then_some(&self.counters),
            next: None,
        }
    }
}

/// Every part of `plan` denied by a penalty that ends in `wait` ns.
fn blocked_outcome(plan: &Compiled, wait: u64) -> Outcome {
    let d = Decision {
        limit: plan.parts[0].rule.capacity,
        reset_after_ns: wait,
        ..Decision::denied(Reason::Blocked, wait)
    };
    let mut out = Outcome::new(d);
    for (slot, part) in out.parts.iter_mut().zip(&plan.parts) {
        *slot = Some(Decision {
            limit: part.rule.capacity,
            ..d
        });
    }
    out
}

/// What [`Limiter::apply_inline`] does beside the charge itself: nothing ([`NoHook`], every
/// limiter in process), or a synced limiter's bookkeeping (the word decided on, the units to
/// push).
pub(crate) trait StateHook {
    /// The word a new state starts from.
    fn start(&self, word: u64) -> u64;
    /// Runs `apply` (the charge of a known state) or the hook's own version of it.
    fn apply<W: cell::Word>(
        &self,
        slot: &W,
        word: u64,
        apply: impl FnOnce(&W, u64) -> Option<Applied>,
    ) -> Option<Applied>;
    /// A new state was inserted with a charge.
    fn charged(&self);
}

/// No hook: the in-process limiter.
pub(crate) struct NoHook;

impl StateHook for NoHook {
    #[inline(always)]
    fn start(&self, word: u64) -> u64 {
        word
    }
    #[inline(always)]
    fn apply<W: cell::Word>(
        &self,
        slot: &W,
        word: u64,
        apply: impl FnOnce(&W, u64) -> Option<Applied>,
    ) -> Option<Applied> {
        apply(slot, word)
    }
    #[inline(always)]
    fn charged(&self) {}
}
