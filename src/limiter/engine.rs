//! The charge engine: one all-or-nothing routine ([`all_or_nothing`]) for any number of limits,
//! and the short path over a plan's word states, generic in the part count.
//!
//! Every call that charges more than one limit goes through [`all_or_nothing`]: the parts of a
//! compound plan on one key (the short path, [`InSlots`], and the general path, in
//! `charge.rs`), the parts of a [`check_all`](super::check_all), and the HTTP layer's plan and
//! rules. Each says how to charge, peek and refund one of its limits ([`Limits`]); the
//! routine says what all or nothing means: limits are charged in order; at the first denial the
//! limits charged before it are refunded (and report what they hold without the call) and those
//! after it are only peeked, so the merged decision's `retry_after` is the moment the same call
//! passes; a failure refunds everything charged. A new charge semantic is added here once.

use std::hash::Hash;

use super::Limiter;
use super::book::Words;
use crate::cell::{self, Mode};
use crate::clock::Clock;
use crate::decision::Decision;
use crate::plan::MAX_PARTS;
use crate::store::{FlatStore, Kept, RuleId};

/// The limits of one call, as [`all_or_nothing`] drives them. Limit `i` is charged at most once,
/// refunded at most once after that, and a limit after a denial is only peeked.
pub(crate) trait Limits {
    /// Why a limit could not be decided (nothing then stays charged).
    type Error;
    /// How many limits.
    fn len(&self) -> usize;
    /// Decides limit `i`: charges it, or with `peek` (a limit after a denial) only decides it.
    /// Whether it admitted.
    fn charge(&mut self, i: usize, peek: bool) -> Result<bool, Self::Error>;
    /// Takes back limit `i`'s charge, if it charged anything; with `report`, its decision then
    /// says what it holds without the call ([`Decision::held`]).
    fn refund(&mut self, i: usize, report: bool);
}

/// Charges `limits` in order, all or nothing: `Ok(None)` when every limit admitted (every one
/// stays charged); `Ok(Some(i))` when limit `i` denied first (those after it are peeked, then
/// those before it refunded: nothing stays charged); `Err` when a limit could not be decided
/// (everything charged is refunded, as a failed call's).
#[inline(always)]
pub(crate) fn all_or_nothing<L: Limits + ?Sized>(
    limits: &mut L,
) -> Result<Option<usize>, L::Error> {
    let n = limits.len();
    for i in 0..n {
        match limits.charge(i, false) {
            Ok(true) => {}
            Ok(false) => {
                // The limits after it first, so a failure among them still finds the limits
                // before it charged, to refund as a failed call's.
                for j in i + 1..n {
                    if let Err(e) = limits.charge(j, true) {
                        for k in (0..i).rev() {
                            limits.refund(k, false);
                        }
                        return Err(e);
                    }
                }
                for j in 0..i {
                    limits.refund(j, true);
                }
                return Ok(Some(i));
            }
            Err(e) => {
                for j in (0..i).rev() {
                    limits.refund(j, false);
                }
                return Err(e);
            }
        }
    }
    Ok(None)
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
    out: Charged<N>,
}

/// A part's state left its slot under the short path (or was never there): the general path
/// decides.
pub(crate) struct Missed;

impl<K: Hash + Eq + Clone, const N: usize> InSlots<'_, K, N> {
    /// Notes part `i`'s decision `d` in the merged one: `first` starts it anew (the first part
    /// charged, or the denying part, whose decision a denial's report starts from).
    #[inline(always)]
    fn note(&mut self, i: usize, d: &Decision, first: bool) {
        if let Some(parts) = &mut self.parts {
            parts[i] = *d;
        }
        if first {
            self.out.decision = *d;
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
    fn charge(&mut self, i: usize, peek: bool) -> Result<bool, Missed> {
        let Request { hash, now, cost } = self.req;
        if peek {
            let d = peek_word(self.store, self.words, i, self.req).ok_or(Missed)?;
            self.note(i, &d, false);
            return Ok(d.allowed);
        }
        let call = cell::WordCall {
            rule: &self.words.rules[i],
            now,
            cost,
            headroom: self.words.headroom,
            token: N > 1 || self.tokens,
        };
        let a = self
            .store
            .charge_once(hash, self.words.ids[i], &call)
            .ok_or(Missed)?;
        self.out.tokens[i] = a.token;
        self.out.retries += a.retries;
        // A denial's report starts from the denying part's decision (the parts before it are
        // refunded and report again what they hold).
        self.note(i, &a.decision, i == 0 || !a.decision.allowed);
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
