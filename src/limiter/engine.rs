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
use crate::cell::{self, Applied, Mode};
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
/// stays charged); `Ok(Some(i))` when limit `i` denied first (the limits before it are
/// refunded, those after it peeked: nothing stays charged); `Err` when a limit could not be
/// decided (everything charged is refunded).
#[inline(always)]
pub(crate) fn all_or_nothing<L: Limits + ?Sized>(
    limits: &mut L,
) -> Result<Option<usize>, L::Error> {
    let n = limits.len();
    for i in 0..n {
        match limits.charge(i, false) {
            Ok(true) => {}
            Ok(false) => {
                for j in 0..i {
                    limits.refund(j, true);
                }
                for j in i + 1..n {
                    limits.charge(j, true)?;
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

/// What a charge on the short path did: each part's decision, the merged one (before the
/// plan's soft strategy), and what a refund of each part needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Charged<const N: usize> {
    pub(crate) decision: Decision,
    pub(crate) parts: [Decision; N],
    /// Each part's refund token; `None` where nothing stays charged.
    pub(crate) tokens: [Option<u64>; N],
    /// Compare-and-swap attempts lost to other threads.
    pub(crate) retries: u32,
}

impl<const N: usize> Charged<N> {
    /// The tokens as a refund record keeps them (rule id and token, per part).
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
    hash: u64,
    now: u64,
    cost: u64,
    /// Whether a refund token is wanted for every part (a one-part charge that no later limit
    /// can deny needs none, and its check then takes the algorithm's own loop).
    tokens: bool,
    out: Charged<N>,
}

/// A part's state left its slot under the short path (or was never there): the general path
/// decides.
pub(crate) struct Missed;

impl<K: Hash + Eq + Clone, const N: usize> Limits for InSlots<'_, K, N> {
    type Error = Missed;

    #[inline(always)]
    fn len(&self) -> usize {
        N
    }

    #[inline(always)]
    fn charge(&mut self, i: usize, peek: bool) -> Result<bool, Missed> {
        let (rule, id) = (&self.words.rules[i], self.words.ids[i]);
        let (now, cost, headroom) = (self.now, self.cost, self.words.headroom);
        let a = if peek {
            Applied {
                decision: peek_word(self.store, self.words, i, self.hash, now, cost)
                    .ok_or(Missed)?,
                token: None,
                retries: 0,
            }
        } else if N == 1 && !self.tokens {
            self.store
                .apply_word_once(self.hash, id, |slot, word| {
                    cell::apply_inline(slot, word, now, cost, rule, headroom, Mode::Check)
                })
                .ok_or(Missed)?
        } else {
            self.store
                .apply_word_once(self.hash, id, |slot, word| {
                    cell::apply_inline_part(slot, word, now, cost, rule, headroom, Mode::Check)
                })
                .ok_or(Missed)?
        };
        self.out.parts[i] = a.decision;
        self.out.tokens[i] = a.token;
        self.out.retries += a.retries;
        Ok(a.decision.allowed)
    }

    #[inline(always)]
    fn refund(&mut self, i: usize, report: bool) {
        let (rule, id) = (&self.words.rules[i], self.words.ids[i]);
        let (now, cost) = (self.now, self.cost);
        if let Some(token) = self.out.tokens[i].take() {
            // A state removed meanwhile holds nothing left to take back.
            self.store.update_word(self.hash, id, |slot, word| {
                cell::refund_inline(slot, word, cost, rule, token, now)
            });
        }
        if report {
            // Read again: a state removed meanwhile is fresh.
            let word = self.store.word_or_fresh(self.hash, id);
            let step = cell::decide_word(word, now, 0, rule, self.words.headroom, Mode::Check);
            self.out.parts[i] = step.decision.held();
        }
    }
}

/// Part `i` of `words` decided for `cost` units at `now`, charging nothing: `None` when its
/// state is not a word in the table.
#[inline(always)]
fn peek_word<K: Hash + Eq + Clone, const N: usize>(
    store: &FlatStore<K>,
    words: &Words<N>,
    i: usize,
    hash: u64,
    now: u64,
    cost: u64,
) -> Option<Decision> {
    let Kept::Word(word) = store.kept(hash, words.ids[i]) else {
        return None;
    };
    let rule = &words.rules[i];
    Some(cell::decide_word(word, now, cost, rule, words.headroom, Mode::Check).decision)
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static, C: Clock> Limiter<K, C> {
    /// The short path: one call of `cost` units on a plan's `N` word states, all or nothing
    /// (see [`all_or_nothing`]), each state charged with one compare-and-swap in its slot (a
    /// denial: one load). `tokens`: whether a refund of the charge may follow (each part then
    /// reports its token). `None`, with nothing left charged and nothing counted, when the
    /// short path does not apply: a key that may be under a penalty, a state not in its slot
    /// (new, or moved away under the call). The general path then decides the same way.
    #[inline(always)]
    pub(crate) fn charge_words<const N: usize>(
        &self,
        store: &FlatStore<K>,
        words: &Words<N>,
        hash: u64,
        now: u64,
        cost: u64,
        tokens: bool,
    ) -> Option<Charged<N>> {
        if self.penalties.maybe(hash) {
            return None;
        }
        let mut parts = InSlots {
            store,
            words,
            hash,
            now,
            cost,
            tokens,
            out: Charged {
                decision: Decision::NEUTRAL,
                parts: [Decision::NEUTRAL; N],
                tokens: [None; N],
                retries: 0,
            },
        };
        all_or_nothing(&mut parts).ok()?;
        let mut out = parts.out;
        out.decision = out.parts[0];
        for d in &out.parts[1..] {
            out.decision.merge(d);
        }
        Some(out)
    }

    /// What the short path would decide for `cost` units on a plan's `N` word states, charging
    /// nothing (merged as a charge merges them): `None` where it does not apply (a key that may
    /// be under a penalty, a state not in its slot).
    #[inline(always)]
    pub(crate) fn peek_words<const N: usize>(
        &self,
        store: &FlatStore<K>,
        words: &Words<N>,
        hash: u64,
        now: u64,
        cost: u64,
    ) -> Option<Decision> {
        if self.penalties.maybe(hash) {
            return None;
        }
        let mut d = peek_word(store, words, 0, hash, now, cost)?;
        for i in 1..N {
            d.merge(&peek_word(store, words, i, hash, now, cost)?);
        }
        Some(d)
    }
}
