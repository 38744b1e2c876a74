//! The charge engine: one all-or-nothing routine ([`all_or_nothing`]) for any number of limits,
//! and the short path over a plan's word states, generic in the part count.
//!
//! Every call that charges more than one limit goes through [`all_or_nothing`]: the parts of a
//! compound plan on one key (the short path, [`InSlots`], and the general path, in
//! `charge.rs`), the parts of a [`check_all`](super::check_all), and the HTTP layer's plan and
//! rules. Each says how to charge, peek and refund one of its limits ([`Limits`]); the
//! routine says what all or nothing means: limits are decided in order, each without writing
//! where it can ([`Limits::decide`]), and written only once every limit has admitted, so a call
//! that one limit denies writes nothing and takes nothing back; a limit that must be charged to
//! be decided (a new key, a penalty, a cell beside the table) is charged in order after the
//! ones decided before it are written. At the first denial the limits before it report what
//! they hold without the call (refunded, where they were charged) and those after it are only
//! peeked, so the merged decision's `retry_after` is the moment the same call passes; a failure
//! refunds everything charged. A new charge semantic is added here once.

use std::hash::Hash;

use super::Limiter;
use super::book::Words;
use crate::cell::{self, Mode};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::plan::MAX_PARTS;
use crate::store::{FlatStore, Kept, Near, Pending, RuleId};

/// The limits of one call, as [`all_or_nothing`] drives them. Limit `i` is charged at most once,
/// refunded at most once after that, and a limit after a denial is only peeked.
pub(crate) trait Limits {
    /// Why a limit could not be decided (nothing then stays charged).
    type Error;
    /// How many limits.
    fn len(&self) -> usize;
    /// Decides limit `i` without writing anything, where it can: whether it would admit (what
    /// it decided is kept for [`charge`](Self::charge) to write, or [`release`](Self::release)
    /// to drop); `None` where it must be charged to be decided. Limits after a `None` are not
    /// asked.
    #[inline(always)]
    fn decide(&mut self, _i: usize) -> Result<Option<bool>, Self::Error> {
        Ok(None)
    }
    /// Drops what [`decide`](Self::decide) decided for limit `i` (an admission) because another
    /// limit denied the call: nothing was written; its decision then says what it holds
    /// ([`Decision::held`]). Only called where `decide` answered.
    fn release(&mut self, _i: usize) {}
    /// Decides limit `i`: charges it (writes what [`decide`](Self::decide) decided, where it
    /// did, decided again on the state as it is then if it changed meanwhile), or with `peek` (a
    /// limit after a denial) only decides it. Whether it admitted.
    fn charge(&mut self, i: usize, peek: bool) -> Result<bool, Self::Error>;
    /// Takes back limit `i`'s charge, if it charged anything; with `report`, its decision then
    /// says what it holds without the call ([`Decision::held`]).
    fn refund(&mut self, i: usize, report: bool);
}

/// Charges `limits`, all or nothing: `Ok(None)` when every limit admitted (every one stays
/// charged); `Ok(Some(i))` when limit `i` denied first (those after it are peeked, then those
/// before it refunded or released: nothing stays charged); `Err` when a limit could not be
/// decided (everything charged is refunded, as a failed call's).
///
/// Decided first, written after: every limit but the last is decided without writing where it
/// can ([`Limits::decide`]); when all of them admit, the last is charged first and the others
/// after it, so a denial by any of them leaves nothing to take back. From the first limit that
/// must be charged to be decided, the limits are charged in order (the ones decided before it
/// first).
#[inline(always)]
pub(crate) fn all_or_nothing<L: Limits + ?Sized>(
    limits: &mut L,
) -> Result<Option<usize>, L::Error> {
    let n = limits.len();
    let mut decided = 0;
    while decided + 1 < n {
        match limits.decide(decided)? {
            Some(true) => decided += 1,
            Some(false) => return denied_first(limits, decided, n).map(Some),
            None => break,
        }
    }
    // Where all the others were decided, the last is charged first: its denial leaves nothing
    // to take back either.
    let last = n > 1 && decided == n - 1;
    if last {
        match limits.charge(n - 1, false)? {
            true => {}
            false => {
                for j in 0..n - 1 {
                    limits.release(j);
                }
                return Ok(Some(n - 1));
            }
        }
    }
    // The rest in order (writing what was decided, deciding again where the state changed).
    let rest = if last { n - 1 } else { n };
    for i in 0..rest {
        match limits.charge(i, false) {
            Ok(true) => {}
            Ok(false) => {
                // The limits after it first, so a failure among them still finds the limits
                // before it charged, to refund as a failed call's.
                for j in i + 1..rest {
                    if let Err(e) = limits.charge(j, true) {
                        refund_charged(limits, i, last, false);
                        return Err(e);
                    }
                }
                refund_charged(limits, i, last, true);
                return Ok(Some(i));
            }
            Err(e) => {
                refund_charged(limits, i, last, false);
                return Err(e);
            }
        }
    }
    Ok(None)
}

/// Refunds what [`all_or_nothing`] charged before limit `i` (with `last`, the last limit too,
/// charged first), in the reverse order of the charges; with `report`, each refunded limit
/// then reports what it holds.
#[inline(always)]
fn refund_charged<L: Limits + ?Sized>(limits: &mut L, i: usize, last: bool, report: bool) {
    for j in (0..i).rev() {
        limits.refund(j, report);
    }
    if last {
        limits.refund(limits.len() - 1, report);
    }
}

/// [`all_or_nothing`] where limit `i` denied when decided, with the ones before it decided
/// and nothing written: those after it are peeked, those before it released. Returns `i`, or
/// the error of a peek (nothing charged).
#[inline(always)]
fn denied_first<L: Limits + ?Sized>(limits: &mut L, i: usize, n: usize) -> Result<usize, L::Error> {
    for j in i + 1..n {
        limits.charge(j, true)?;
    }
    for j in 0..i {
        limits.release(j);
    }
    Ok(i)
}

/// One call on the short path: the key's hash ([`Limiter::key_hash`]), the time and the cost.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    pub(crate) hash: u64,
    pub(crate) now: u64,
    pub(crate) cost: u64,
}

/// What a charge on the short path did: the merged decision (before the plan's soft
/// strategy) and what a refund of each part needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Charged<const N: usize> {
    pub(crate) decision: Decision,
    /// Each part's refund token; `None` where nothing stays charged.
    pub(crate) tokens: [Option<u64>; N],
    /// Compare-and-swap attempts lost to other threads.
    pub(crate) retries: u32,
}

impl<const N: usize> Charged<N> {
    /// The tokens as a refund record keeps them (rule id and token, per part).
    #[inline(always)]
    pub(crate) fn undo_tokens(&self, words: &Words<N>) -> [Option<(RuleId, u64)>; MAX_PARTS] {
        let mut tokens = [None; MAX_PARTS];
        for (i, t) in self.tokens.iter().enumerate() {
            tokens[i] = t.map(|t| (words.ids[i], t));
        }
        tokens
    }
}

/// A plan's word states in their flat-store slots as [`Limits`]: the short path's parts.
struct InSlots<'a, K, const N: usize> {
    store: &'a FlatStore<K>,
    words: &'a Words<N>,
    req: Request,
    /// Whether every part must leave a refund token (a charge that may be taken back later).
    /// One part that nothing can take back needs none: its check then runs the algorithm's
    /// own loop.
    tokens: bool,
    /// Where each part's decision goes, for a caller that reports them.
    parts: Option<&'a mut [Decision; N]>,
    /// Each part's state as [`Limits::decide`] read it (an admission, to be charged).
    decided: [Option<Pending<'a>>; N],
    /// Where the first state of the key found is: the others are looked for there first.
    near: Option<Near<'a>>,
    out: Charged<N>,
}

/// A part's state left its slot under the short path (or was never there): the general path
/// decides.
pub(crate) struct Missed;

impl<'a, K: Hash + Eq + Clone, const N: usize> InSlots<'a, K, N> {
    /// Part `i`'s state, read now (`None`: it is not a word in the table): in the cache line
    /// of a state of the key found before, where it most likely is (every rule of a key has
    /// the same home group), else looked up.
    #[inline(always)]
    fn find(&mut self, i: usize) -> Option<Pending<'a>> {
        let (hash, id) = (self.req.hash, self.words.ids[i]);
        if N == 1 {
            return self.store.pending(hash, id);
        }
        match self.near {
            Some(near) => self.store.pending_near(near, hash, id),
            None => {
                let found = self.store.pending(hash, id);
                self.near = found.map(|p| p.near());
                found
            }
        }
    }

    /// Notes part `i`'s decision `d` in the merged one: `denied` starts it anew (a denial's
    /// report starts from the denying part's decision); else it is merged in, with the first
    /// part's decision as the base (an admission's reason is the first part's, whatever order
    /// the parts were charged in).
    #[inline(always)]
    fn note(&mut self, i: usize, d: &Decision, denied: bool) {
        if let Some(parts) = &mut self.parts {
            parts[i] = *d;
        }
        if denied {
            self.out.decision = *d;
        } else if i == 0 {
            let before = self.out.decision;
            self.out.decision = *d;
            self.out.decision.merge(&before);
        } else {
            self.out.decision.merge(d);
        }
    }
}

impl<K: Hash + Eq + Clone, const N: usize> Limits for InSlots<'_, K, N> {
    type Error = Missed;

    #[inline(always)]
    fn len(&self) -> usize {
        N
    }

    #[inline(always)]
    fn decide(&mut self, i: usize) -> Result<Option<bool>, Missed> {
        let Request { now, cost, .. } = self.req;
        let pending = self.find(i).ok_or(Missed)?;
        let (rule, headroom) = (&self.words.rules[i], self.words.headroom);
        let step = cell::decide_word(pending.word(), now, cost, rule, headroom, Mode::Check);
        if !step.decision.allowed {
            // A denial's report starts from the denying part's decision.
            self.note(i, &step.decision, true);
            return Ok(Some(false));
        }
        // An admission is decided again when it is charged, on the word then (the same one,
        // unless another call charged it meanwhile).
        self.decided[i] = Some(pending);
        Ok(Some(true))
    }

    #[inline(always)]
    fn release(&mut self, i: usize) {
        if let Some(pending) = self.decided[i].take() {
            let (rule, headroom) = (&self.words.rules[i], self.words.headroom);
            let now = self.req.now;
            let step = cell::decide_word(pending.word(), now, 0, rule, headroom, Mode::Check);
            self.note(i, &step.decision.held(), false);
        }
    }

    #[inline(always)]
    fn charge(&mut self, i: usize, peek: bool) -> Result<bool, Missed> {
        let Request { now, cost, .. } = self.req;
        if peek {
            let pending = self.find(i).ok_or(Missed)?;
            let (rule, headroom) = (&self.words.rules[i], self.words.headroom);
            let step = cell::decide_word(pending.word(), now, cost, rule, headroom, Mode::Check);
            self.note(i, &step.decision, false);
            return Ok(step.decision.allowed);
        }
        let call = cell::WordCall {
            rule: &self.words.rules[i],
            now,
            cost,
            headroom: self.words.headroom,
            token: N > 1 || self.tokens,
        };
        let a = match self.decided[i] {
            Some(pending) => pending.charge(&call),
            // One part: found and charged in one go.
            None if N == 1 => self
                .store
                .charge_once(self.req.hash, self.words.ids[i], &call),
            None => self.find(i).ok_or(Missed)?.charge(&call),
        }
        .ok_or(Missed)?;
        self.out.tokens[i] = a.token;
        self.out.retries += a.retries;
        // A denial's report starts from the denying part's decision (the parts before it are
        // refunded and report again what they hold).
        self.note(i, &a.decision, !a.decision.allowed);
        Ok(a.decision.allowed)
    }

    #[inline(always)]
    fn refund(&mut self, i: usize, report: bool) {
        let (rule, id) = (&self.words.rules[i], self.words.ids[i]);
        let Request { hash, now, cost } = self.req;
        // The state after the refund, as the refund left it (`None`: nothing to take back,
        // or the state is gone: a state removed meanwhile holds nothing left to take back).
        let after = self.out.tokens[i].take().and_then(|token| {
            self.store.update_word(hash, id, |slot, word| {
                cell::refund_inline(slot, word, cost, rule, token, now)
            })
        });
        if report {
            // Else read again: a state removed meanwhile is fresh.
            let word = after.unwrap_or_else(|| self.store.word_or_fresh(hash, id));
            let step = cell::decide_word(word, now, 0, rule, self.words.headroom, Mode::Check);
            self.note(i, &step.decision.held(), false);
        }
    }
}

/// Part `i` of `words` decided for the request, charging nothing: `None` when its state is
/// not a word in the table.
#[inline(always)]
fn peek_word<K: Hash + Eq + Clone, const N: usize>(
    store: &FlatStore<K>,
    words: &Words<N>,
    i: usize,
    req: Request,
) -> Option<Decision> {
    let Kept::Word(word) = store.kept(req.hash, words.ids[i]) else {
        return None;
    };
    let rule = &words.rules[i];
    let step = cell::decide_word(word, req.now, req.cost, rule, words.headroom, Mode::Check);
    Some(step.decision)
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// The short path: one call on a plan's `N` word states, all or nothing (see
    /// [`all_or_nothing`]), each state charged with one compare-and-swap in its slot (a
    /// denial: one load). `tokens`: whether a refund of the charge may follow (each part then
    /// leaves its token); `parts`: where to write each part's decision, for a caller that
    /// reports them. `None`, with nothing left charged and nothing counted, when the short path
    /// does not apply: a key that may be under a penalty, a state not in its slot (new, or moved
    /// away under the call). The general path then decides the same way.
    #[inline(always)]
    pub(crate) fn charge_words<const N: usize>(
        &self,
        store: &FlatStore<K>,
        words: &Words<N>,
        req: Request,
        tokens: bool,
        parts: Option<&mut [Decision; N]>,
    ) -> Option<Charged<N>> {
        if self.penalties.maybe(req.hash) {
            return None;
        }
        let mut slots = InSlots {
            store,
            words,
            req,
            tokens,
            parts,
            decided: [None; N],
            near: None,
            out: Charged {
                decision: Decision::NEUTRAL,
                tokens: [None; N],
                retries: 0,
            },
        };
        if all_or_nothing(&mut slots).ok()?.is_some() {
            // Denied still, for the denying part's reason, whatever the others report.
            slots.out.decision.allowed = false;
        }
        Some(slots.out)
    }

    /// Takes back a charge the short path made on a plan's `N` word states (`tokens`, as
    /// [`Charged::tokens`] gave them) and reports what the parts hold afterwards, merged (each
    /// read from its refund where it had one). The caller has made sure the key is under no
    /// penalty and no reset came between the charge and now.
    #[inline(always)]
    pub(crate) fn refund_words<const N: usize>(
        &self,
        store: &FlatStore<K>,
        words: &Words<N>,
        req: Request,
        tokens: [Option<u64>; N],
    ) -> Decision {
        let mut slots = InSlots {
            store,
            words,
            req,
            tokens: true,
            parts: None,
            decided: [None; N],
            near: None,
            out: Charged {
                decision: Decision::NEUTRAL,
                tokens,
                retries: 0,
            },
        };
        for i in 0..N {
            slots.refund(i, true);
        }
        slots.out.decision
    }

    /// What the short path would decide for the request on a plan's `N` word states, charging
    /// nothing (merged as a charge merges them): `None` where it does not apply (a key that may
    /// be under a penalty, a state not in its slot).
    #[inline(always)]
    pub(crate) fn peek_words<const N: usize>(
        &self,
        store: &FlatStore<K>,
        words: &Words<N>,
        req: Request,
    ) -> Option<Decision> {
        if self.penalties.maybe(req.hash) {
            return None;
        }
        let mut d = peek_word(store, words, 0, req)?;
        for i in 1..N {
            d.merge(&peek_word(store, words, i, req)?);
        }
        Some(d)
    }
}
