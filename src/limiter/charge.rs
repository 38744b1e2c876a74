//! The charge path: one call against every part of a plan, each part the state of one
//! (key, rule), all or nothing, with exact refunds; and the compound limits across keys built on
//! it ([`check_all`], the HTTP layer's charges).
//!
//! On the flat store a word-cell part is its slot: found with one probe of the (key, rule) hash
//! and charged with one compare-and-swap, no lock and no allocation; a new state is claimed under
//! its shard's write lock. Sliding logs live in the store's side map (one lock per call, as
//! the log itself takes). A denial by part `i` refunds parts `0..i` through the same slots and
//! only peeks the rest, for the latest `retry_after`.

use std::hash::Hash;

use super::book::{Book, Compiled, PartRule};
use super::{Limiter, Map};
use crate::algo::Kind;
use crate::cell::{self, Applied, Cell, Mode};
use crate::clock::Clock;
use crate::decision::{Decision, Reason};
use crate::error::Error;
use crate::plan::{MAX_PARTS, PlanId};
use crate::stats::{Count, Counts};
use crate::store::{FlatStore, Fresh, Full, Kept, RuleId, Store};

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
    fn new(decision: Decision) -> Outcome {
        Outcome {
            decision,
            parts: [None; MAX_PARTS],
            tokens: [None; MAX_PARTS],
            retries: 0,
        }
    }

    /// True when a part stays charged (only then is there anything to refund).
    #[cfg(feature = "http")]
    pub(crate) fn charged(&self) -> bool {
        self.tokens.iter().any(Option::is_some)
    }
}

/// What taking a charge back needs: the key's hash, the cost and each charged part's token.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct Undo {
    hash: u64,
    cost: u64,
    /// The limiter's reset count when the charge was made.
    resets: u64,
    tokens: [Option<(RuleId, u64)>; MAX_PARTS],
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// Charges (or peeks, by `mode`) `cost` units for `key`, hashed to `hash` (see
    /// [`key_hash`](Self::key_hash)), on every part of `plan`, all or nothing: the merged
    /// decision and the compare-and-swap retries. `Err(Full)` when a part's state is new and
    /// the table is full (nothing then stays charged).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn charge(
        &self,
        book: &Book,
        key: &K,
        hash: u64,
        plan: &Compiled,
        now: u64,
        cost: u64,
        mode: Mode,
    ) -> Result<(Decision, u32), Full> {
        if let [part] = plan.parts.as_slice() {
            if let Some(out) = self.blocked(key, hash, plan, now) {
                return Ok((out.decision, 0));
            }
            let a =
                self.apply_part(book, key, hash, part, plan.headroom, now, cost, mode, false)?;
            return Ok((a.decision, a.retries));
        }
        let mut out = Outcome::new(Decision::denied(Reason::Limited, 0));
        self.charge_parts(book, key, hash, plan, now, cost, mode, &mut out)?;
        Ok((out.decision, out.retries))
    }

    /// One charge of a one-part plan's known state, with its refund token: `None`, having
    /// changed nothing, for a key that may be under a penalty or a state not in its slot.
    #[inline(always)]
    fn apply_known(
        &self,
        s: &FlatStore<K>,
        plan: &super::book::InlinePlan,
        hash: u64,
        now: u64,
        cost: u64,
    ) -> Option<Applied> {
        if self.penalties.maybe(hash) {
            return None;
        }
        s.apply_word_once(hash, plan.id, |slot, word| {
            cell::apply_inline_part(
                slot,
                word,
                now,
                cost,
                &plan.rule,
                plan.headroom,
                Mode::Check,
            )
        })
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

    /// [`charge`](Self::charge) with each part's decision and refund token, for a plan of any
    /// number of parts (a compound plan, a part of a cross-key limit, an HTTP rule), into `out` (as [`Outcome::new`] made it; written in place, where a
    /// returned outcome was copied twice).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    pub(crate) fn charge_parts(
        &self,
        book: &Book,
        key: &K,
        hash: u64,
        plan: &Compiled,
        now: u64,
        cost: u64,
        mode: Mode,
        out: &mut Outcome,
    ) -> Result<(), Full> {
        if let Some(blocked) = self.blocked(key, hash, plan, now) {
            *out = blocked;
            return Ok(());
        }
        if let Map::Flat(s) = &self.store {
            // Every part's slot is asked for before the first is read, so their cache misses
            // overlap instead of following one another.
            for part in &plan.parts {
                s.prefetch_state(hash, part.id);
            }
        }
        let mut denied = false;
        for (i, part) in plan.parts.iter().enumerate() {
            let m = if denied { Mode::Peek } else { mode };
            let a = match self.apply_part(book, key, hash, part, plan.headroom, now, cost, m, true)
            {
                Ok(a) => a,
                Err(Full) => {
                    self.refund(book, key, hash, cost, &mut out.tokens, now);
                    return Err(Full);
                }
            };
            out.retries += a.retries;
            out.parts[i] = Some(a.decision);
            if !denied {
                out.tokens[i] = a.token.map(|t| (part.id, t));
                if !a.decision.allowed {
                    denied = true;
                    if i > 0 {
                        self.refund(book, key, hash, cost, &mut out.tokens, now);
                        // Parts charged and then refunded report what they hold without it.
                        for (d, p) in out.parts[..i].iter_mut().zip(&plan.parts) {
                            *d = self.held(book, key, hash, p, plan.headroom, now).or(*d);
                        }
                    }
                }
            }
        }
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

    /// Applies one call to the state of (`key`, `part`): `with_token` asks for the token a
    /// refund needs.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn apply_part(
        &self,
        book: &Book,
        key: &K,
        hash: u64,
        part: &PartRule,
        headroom: u64,
        now: u64,
        cost: u64,
        mode: Mode,
        with_token: bool,
    ) -> Result<Applied, Full> {
        match &self.store {
            #[cfg(feature = "redis")]
            Map::Flat(s) if self.synced.is_some() => {
                self.apply_synced(s, book, key, hash, part, headroom, now, cost, mode)
            }
            Map::Flat(s) if part.rule.kind != Kind::Log => self.apply_inline(
                s, book, key, hash, part, headroom, now, cost, mode, with_token, &NoHook,
            ),
            Map::Flat(s) => self.apply_cell(s, book, key, part, headroom, now, cost, mode),
            Map::Dash(s) => self.apply_cell(s, book, key, part, headroom, now, cost, mode),
        }
    }

    /// What (`key`, `part`) holds at `now`, as [`Decision::held`] reports it: a peek of cost 0
    /// (`remaining` and `reset_after` as the state is, where a charge's decision counts the
    /// charge). `None` only where the store could not be read (never for a peek).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn held(
        &self,
        book: &Book,
        key: &K,
        hash: u64,
        part: &PartRule,
        headroom: u64,
        now: u64,
    ) -> Option<Decision> {
        self.apply_part(book, key, hash, part, headroom, now, 0, Mode::Peek, false)
            .ok()
            .map(|a| a.decision.held())
    }

    /// [`apply_part`](Self::apply_part) for a word-cell part on the flat store: its slot.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn apply_inline(
        &self,
        s: &FlatStore<K>,
        book: &Book,
        key: &K,
        hash: u64,
        part: &PartRule,
        headroom: u64,
        now: u64,
        cost: u64,
        mode: Mode,
        with_token: bool,
        hook: &impl StateHook,
    ) -> Result<Applied, Full> {
        let rule = &part.rule;
        loop {
            let charged = s.apply_word(hash, part.id, |slot, word| {
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
            let start = hook.start(self.inherited_word(s, book, hash, part, now));
            let step = cell::decide_word(start, now, cost, rule, headroom, mode.previewed());
            if mode.is_peek() {
                return Ok(Applied {
                    decision: step.decision,
                    token: None,
                    retries: 0,
                });
            }
            self.new_state_seen();
            let fresh = self.fresh(book, now, true);
            if s.refuses_new_keys() {
                return Err(Full);
            }
            // Insertion and first charge are one write (a denial claims the start).
            let first = step.next.unwrap_or(start);
            let inserted = match s.insert_word(hash, part.id, first, fresh) {
                Ok(inserted) => inserted,
                // Stale states elsewhere in the table make room: look again.
                Err(Full) if self.reclaim_at_cap(now) => continue,
                Err(Full) => return Err(Full),
            };
            if inserted {
                self.retire_lineage(s, key, part);
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
    #[allow(clippy::too_many_arguments)]
    fn apply_cell<S: Store<K>>(
        &self,
        s: &S,
        book: &Book,
        key: &K,
        part: &PartRule,
        headroom: u64,
        now: u64,
        cost: u64,
        mode: Mode,
    ) -> Result<Applied, Full> {
        let apply = |c: &Cell| c.apply(now, cost, &part.rule, headroom, mode);
        if let Some(a) = s.with(key, part.id, apply) {
            return Ok(a);
        }
        // Looked up before the insert, which holds the store's lock while it builds the cell.
        let start = self.inherited_cell(s, book, key, part, now);
        if mode.is_peek() {
            return Ok(apply(&start));
        }
        self.new_state_seen();
        let fresh = self.fresh(book, now, true);
        let a = match s.with_or_insert(key, part.id, || start, fresh, apply) {
            // Stale states elsewhere in the table make room: once more.
            Err(Full) if self.reclaim_at_cap(now) => {
                let start = self.inherited_cell(s, book, key, part, now);
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
    fn inherited_word(
        &self,
        s: &FlatStore<K>,
        book: &Book,
        hash: u64,
        part: &PartRule,
        now: u64,
    ) -> u64 {
        for &old in &part.lineage {
            let rule = &book.rules[usize::from(old)];
            match s.kept(hash, old) {
                Kept::Word(word) => return cell::migrate_word(word, now, rule, &part.rule),
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
            s.remove(key, old);
        }
    }

    /// [`inherited_word`](Self::inherited_word) for a store's cells.
    fn inherited_cell<S: Store<K>>(
        &self,
        s: &S,
        book: &Book,
        key: &K,
        part: &PartRule,
        now: u64,
    ) -> Cell {
        for &old in &part.lineage {
            let rule = &book.rules[usize::from(old)];
            if let Some(c) = s.with(key, old, |c| c.migrate(now, rule, &part.rule)) {
                return c;
            }
        }
        Cell::fresh(part.rule.kind)
    }

    /// Takes back every charge in `tokens` (clearing them).
    pub(crate) fn refund(
        &self,
        book: &Book,
        key: &K,
        hash: u64,
        cost: u64,
        tokens: &mut [Option<(RuleId, u64)>; MAX_PARTS],
        now: u64,
    ) {
        for (id, token) in tokens.iter_mut().filter_map(Option::take) {
            let rule = &book.rules[usize::from(id)];
            match &self.store {
                Map::Flat(s) if rule.kind != Kind::Log => {
                    // A state removed meanwhile (a reset) holds nothing left to take back; one
                    // that moved (its shard grew) is found again in its new slot.
                    let refunded = s.update_word(hash, id, |slot, word| {
                        cell::refund_inline(slot, word, cost, rule, token, now)
                    });
                    #[cfg(feature = "redis")]
                    if refunded {
                        self.refund_synced(key, hash, id, rule, now, cost);
                    }
                    #[cfg(not(feature = "redis"))]
                    let _ = refunded;
                }
                Map::Flat(s) => {
                    s.with(key, id, |c| c.refund(cost, rule, token, now));
                }
                Map::Dash(s) => {
                    s.with(key, id, |c| c.refund(cost, rule, token, now));
                }
            }
        }
    }

    /// Resets so far (see the field).
    fn resets(&self) -> u64 {
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

/// One part of a compound limit across keys: a [`Bound`] key. Sealed.
pub trait Part: sealed::Sealed {
    /// Charges the part, merges its decision into `merged` (replaces it when `first`), counts
    /// it in the part's stats, and writes into `undo` what a refund needs (left `None` when
    /// nothing stays charged): whether the part admitted. The merge and the count happen here,
    /// where the part's decision is at hand, so no decision crosses the call. `time` is the
    /// clock reading of an earlier part (its clock's [`Clock::shared_id`] and the time), used
    /// when this part's clock is the same, else replaced by this part's own.
    #[doc(hidden)]
    fn charge_part(
        &self,
        cost: u64,
        merged: &mut Decision,
        first: bool,
        undo: &mut Option<Undo>,
        time: &mut Option<(usize, u64)>,
    ) -> Result<bool, Error>;
    #[doc(hidden)]
    fn undo_part(&self, undo: Undo);
    /// Counts in the part's stats that another part denied the call (`elsewhere`): in place of
    /// the admission [`charge_part`](Self::charge_part) counted (`admitted`), or, for a part
    /// never charged, on its own. `elsewhere` false: the admission is not counted after all
    /// (the call failed).
    #[doc(hidden)]
    fn recount(&self, admitted: bool, elsewhere: bool);
    /// The part's decision for `cost` units without charging them (a peek), or with `held`
    /// what the part holds as it is (see [`Decision::held`]: a part charged and then
    /// refunded). `None` where the part cannot be peeked here (a plan gone, exact mode).
    #[doc(hidden)]
    fn peek_part(&self, cost: u64, held: bool, time: &mut Option<(usize, u64)>)
    -> Option<Decision>;
}

impl<K, C> sealed::Sealed for Bound<'_, K, C> {}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Part for Bound<'_, K, C> {
    fn charge_part(
        &self,
        cost: u64,
        merged: &mut Decision,
        first: bool,
        undo: &mut Option<Undo>,
        time: &mut Option<(usize, u64)>,
    ) -> Result<bool, Error> {
        self.charge(cost, merged, first, undo, time)
    }

    fn undo_part(&self, mut undo: Undo) {
        let l = self.limiter;
        if l.resets() != undo.resets {
            // A reset came between: the state may be a new one, which owes this charge nothing.
            return;
        }
        let now = super::clamp_now(l.clock.now());
        l.refund(
            l.book.current(),
            self.key,
            undo.hash,
            undo.cost,
            &mut undo.tokens,
            now,
        );
    }

    fn recount(&self, admitted: bool, elsewhere: bool) {
        self.limiter
            .recount(self.plan, admitted.then_some(Count::Allowed), elsewhere);
    }

    fn peek_part(
        &self,
        cost: u64,
        held: bool,
        time: &mut Option<(usize, u64)>,
    ) -> Option<Decision> {
        let l = self.limiter;
        #[cfg(feature = "redis")]
        if l.exact.is_some() {
            return None;
        }
        let book = l.book.current();
        let plan = book.get(self.plan).ok()?;
        let now = self.now(time);
        let hash = l.key_hash(self.key);
        let cost = if held { 0 } else { cost };
        let (d, _) = l
            .charge(book, self.key, hash, plan, now, cost, Mode::Peek)
            .ok()?;
        Some(if held { d.held() } else { d })
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Bound<'_, K, C> {
    /// The time this part decides at: the reading of an earlier part whose clock is this one
    /// (`time`), else this clock's own, which later parts of the same clock then share.
    #[inline(always)]
    fn now(&self, time: &mut Option<(usize, u64)>) -> u64 {
        let l = self.limiter;
        let id = l.clock.shared_id();
        match *time {
            Some((shared, now)) if Some(shared) == id => now,
            _ => {
                let now = super::clamp_now(l.clock.now());
                *time = id.map(|id| (id, now));
                now
            }
        }
    }

    /// One part's charge of a compound limit across keys: its decision counted in the plan's
    /// stats and merged into `merged` (its first value when `first`) where it is made, so no
    /// decision-sized value is copied between frames (a store-forwarding stall per part when it
    /// was returned); into `undo` what a refund needs. Whether the part admitted.
    #[inline(always)]
    fn charge(
        &self,
        cost: u64,
        merged: &mut Decision,
        first: bool,
        undo: &mut Option<Undo>,
        time: &mut Option<(usize, u64)>,
    ) -> Result<bool, Error> {
        let settle = |merged: &mut Decision, d: &Decision, retries: u32, counts: &Counts| {
            settle_part(merged, first, d, retries, counts)
        };
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
        plan.check_cost(cost)?;
        let now = self.now(time);
        let hash = l.key_hash(self.key);
        let resets = l.resets();
        if let (Map::Flat(s), Some(inline)) = (&l.store, &plan.inline) {
            // A known state of a one-part plan (a user's plan, a global limit): its slot, as
            // `check` finds it.
            if let Some(a) = l.apply_known(s, inline, hash, now, cost) {
                if let (true, Some(t)) = (a.decision.allowed, a.token) {
                    let mut tokens = [None; MAX_PARTS];
                    tokens[0] = Some((inline.id, t));
                    *undo = Some(Undo {
                        hash,
                        cost,
                        resets,
                        tokens,
                    });
                }
                return Ok(settle(merged, &a.decision, a.retries, &plan.counts));
            }
        }
        let charged = match plan.parts.as_slice() {
            // One part (a user's plan, a global limit): its slot, with no outcome to fill.
            [part] if !l.penalties.maybe(hash) => l
                .apply_part(
                    book,
                    self.key,
                    hash,
                    part,
                    plan.headroom,
                    now,
                    cost,
                    Mode::Check,
                    true,
                )
                .map(|a| {
                    let mut tokens = [None; MAX_PARTS];
                    tokens[0] = a.token.map(|t| (part.id, t));
                    (a.decision, tokens, a.retries)
                }),
            _ => {
                let mut out = Outcome::new(Decision::denied(Reason::Limited, 0));
                l.charge_parts(book, self.key, hash, plan, now, cost, Mode::Check, &mut out)
                    .map(|()| (out.decision, out.tokens, out.retries))
            }
        };
        match charged {
            Ok((d, tokens, retries)) => {
                if d.allowed && tokens.iter().any(Option::is_some) {
                    *undo = Some(Undo {
                        hash,
                        cost,
                        resets,
                        tokens,
                    });
                }
                Ok(settle(merged, &d, retries, &plan.counts))
            }
            Err(Full) => Ok(settle(merged, &l.table_full(plan), 0, &plan.counts)),
        }
    }
}

/// Counts a part's decision `d` in its plan's `counts` and merges it into `merged` (which it
/// starts when `first`): whether the part admitted. The first decision is merged into the
/// neutral one, which makes it that decision, read field by field as it was written: a copy of
/// the whole read it back wider than its stores, a store-forwarding stall per part.
#[inline(always)]
fn settle_part(
    merged: &mut Decision,
    first: bool,
    d: &Decision,
    retries: u32,
    counts: &Counts,
) -> bool {
    counts.count(Count::of(d), retries);
    debug_assert!(!d.allowed || d.reason == Reason::Within, "{d:?}");
    if first {
        *merged = Decision::NEUTRAL;
    }
    merged.merge(d);
    d.allowed
}

/// Checks `cost` units against every part (per-user AND global, across limiters and key types),
/// all or nothing: when any part denies, the parts already charged are refunded, so nothing stays
/// charged; no part ever admits beyond its own bound. Parts are charged in order, so list the
/// most likely to deny first. Strategies of the parts' plans do not apply here (hard denial).
/// Each part is its limiter's (key, rule) states, charged as [`Limiter::check_in`] charges them:
/// no lock and no allocation on the flat store. Parts whose limiters read one clock (every
/// limiter built without [`Builder::clock`] reads [`MonotonicClock::process`]; clones of one
/// `FakeClock`) decide at one reading of it.
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
    let mut merged = Decision::denied(Reason::Limited, 0);
    let mut time = None;
    if let [first, second] = parts {
        // The common compound (per-user AND global): `charge_from` unrolled, no recursion.
        let mut undo = None;
        if !first.charge_part(cost, &mut merged, true, &mut undo, &mut time)? {
            second.recount(false, true);
            denied(parts, 0, cost, &mut merged, &mut time);
            return Ok(merged);
        }
        let admitted = second.charge_part(cost, &mut merged, false, &mut None, &mut time);
        if !matches!(admitted, Ok(true)) {
            if let Some(u) = undo {
                first.undo_part(u);
            }
            first.recount(true, admitted.is_ok());
            if admitted.is_ok() {
                denied(parts, 1, cost, &mut merged, &mut time);
            }
        }
        return admitted.map(|_| merged);
    }
    if let Some(at) = charge_from(parts, cost, &mut merged, true, &mut time)? {
        denied(parts, at, cost, &mut merged, &mut time);
    }
    Ok(merged)
}

/// The decision of a [`check_all`] that `parts[at]` denied, once the parts before it were
/// refunded: those report what they hold without the request ([`Decision::held`]), the parts
/// from `at` on are peeked (so `retry_after` is the latest of them: the moment the same call
/// passes), merged as the parts of a compound plan are. Denied still, for the denying part's
/// reason.
#[cold]
fn denied(
    parts: &[&dyn Part],
    at: usize,
    cost: u64,
    merged: &mut Decision,
    time: &mut Option<(usize, u64)>,
) {
    let mut all = Decision::NEUTRAL;
    let mut peeked = false;
    for (i, p) in parts.iter().enumerate() {
        if let Some(d) = p.peek_part(cost, i < at, time) {
            all.merge(&d);
            peeked = true;
        }
    }
    if !peeked {
        return;
    }
    all.allowed = false;
    all.reason = merged.reason;
    // The denying part's own wait stands even if a peek saw it pass (a race, a full table).
    all.retry_after_ns = all.retry_after_ns.max(merged.retry_after_ns);
    all.delay_ns = 0;
    *merged = all;
}

/// [`check_all`] from `parts[0]` on, merging into `merged`: the part charged (and counted),
/// then the rest (only while it admits), then the part refunded when they deny or fail. Each
/// part's undo record lives in its own frame: no array to fill and no allocation, for any number
/// of parts. `None` when every part admitted, else the index of the part that denied.
fn charge_from(
    parts: &[&dyn Part],
    cost: u64,
    merged: &mut Decision,
    first: bool,
    time: &mut Option<(usize, u64)>,
) -> Result<Option<usize>, Error> {
    let Some((part, rest)) = parts.split_first() else {
        return Ok(None);
    };
    let mut undo = None;
    if !part.charge_part(cost, merged, first, &mut undo, time)? {
        // This part denied: it counted the denial; the parts after it, never charged, count
        // it as denied elsewhere.
        for p in rest {
            p.recount(false, true);
        }
        return Ok(Some(0));
    }
    // Each outcome is answered anew rather than passed on, so the common one (every part
    // admitted) moves no error-sized value between frames.
    match charge_from(rest, cost, merged, false, time) {
        Ok(None) => Ok(None),
        Ok(Some(at)) => {
            // A later part denied: this admission is taken back, in the state and the stats.
            if let Some(u) = undo {
                part.undo_part(u);
            }
            part.recount(true, true);
            Ok(Some(at + 1))
        }
        Err(e) => {
            if let Some(u) = undo {
                part.undo_part(u);
            }
            part.recount(true, false);
            Err(e)
        }
    }
}

/// One charge with every part's decision: what [`Limiter::charge_detailed`] returns.
#[cfg(feature = "http")]
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

#[cfg(feature = "http")]
impl Detailed {
    /// A decision made elsewhere (Redis, exact mode) at `now`: one part, nothing to undo.
    #[cfg(feature = "redis")]
    pub(crate) fn external(decision: Decision, now: u64) -> Self {
        Detailed {
            decision,
            more: None,
            undo: None,
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

#[cfg(feature = "http")]
impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
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
        let now = super::clamp_now(self.clock.now());
        let hash = self.key_hash(key);
        let mut merged = Decision::NEUTRAL;
        for (i, part) in compiled.parts.iter().enumerate() {
            let Some(d) = self.held(book, key, hash, part, compiled.headroom, now) else {
                return detailed.refunded(cost);
            };
            if let Some(parts) = &mut detailed.more {
                parts[i] = Some(d);
            }
            merged.merge(&d);
        }
        // A request a soft limit let through stays one (its response still says so).
        if detailed.decision.reason == Reason::SoftLimit {
            merged.reason = Reason::SoftLimit;
        }
        detailed.decision = merged;
        detailed.now = now;
    }

    /// [`check_in`](Self::check_in) (or a peek or a reservation, by `mode`) that also reports
    /// each part's decision and can be undone with [`Part::undo_part`] on
    /// [`key_in`](Self::key_in)`(key, plan)`. Counts in the stats like `check_in`.
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
        if let (Map::Flat(s), Some(inline), Mode::Check) = (&self.store, &plan.inline, mode) {
            // A known state of a one-part plan: its slot, as `check` finds it.
            if let Some(a) = self.apply_known(s, inline, hash, now, cost) {
                let mut d = a.decision;
                self.settle(plan, &mut d, a.retries, mode);
                let undo = match (d.allowed, a.token) {
                    (true, Some(t)) => {
                        let mut tokens = [None; MAX_PARTS];
                        tokens[0] = Some((inline.id, t));
                        Some(Undo {
                            hash,
                            cost,
                            resets,
                            tokens,
                        })
                    }
                    _ => None,
                };
                return Ok(Detailed {
                    decision: d,
                    more: None,
                    undo,
                    now,
                });
            }
        }
        let mut out = Outcome::new(Decision::denied(Reason::Limited, 0));
        let out = match self.charge_parts(book, key, hash, plan, now, cost, mode, &mut out) {
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
        };
        let mut d = out.decision;
        self.settle(plan, &mut d, out.retries, mode);
        let undo = (d.allowed && out.charged() && !mode.is_peek()).then_some(Undo {
            hash,
            cost,
            resets,
            tokens: out.tokens,
        });
        Ok(Detailed::new(d, &out.parts, undo, now))
    }
}
