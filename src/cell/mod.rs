//! Per-key state cells and the one compare-and-swap loop that applies a pure decision to them.
//!
//! A word cell is one `AtomicU64` whose bits the algorithm's module documents:
//! [`gcra`](crate::algo::gcra) (the whole word is the TAT), [`fixed`](crate::algo::fixed)
//! (window | count) and [`sliding`](crate::algo::sliding) (window | prev | cur). Zero is the fresh
//! state for all three. The sliding window log cannot fit a word; it is a small mutex-guarded log.
//!
//! A denial is a plain load: no write, so a flood of rejected requests does not move the cache
//! line between cores.

use crate::algo::{self, Kind, Rule, Step, log::Log};
use crate::decision::Decision;
use crate::sync::{AtomicPair, AtomicU64, Mutex, Ordering, lock};

/// What a call wants from a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Decide and charge if admitted.
    Check,
    /// Decide, charge nothing.
    Peek,
    /// Admit for a later moment, at most this many ns away (bucket algorithms; windows can only
    /// admit now).
    Reserve(u64),
    /// Decide as [`Mode::Reserve`] would, charge nothing (a peek under a queue strategy).
    PeekReserve(u64),
}

impl Mode {
    /// True for the modes that charge nothing.
    #[inline(always)]
    pub(crate) fn is_peek(self) -> bool {
        matches!(self, Mode::Peek | Mode::PeekReserve(_))
    }

    /// The charging mode whose decision a peek previews.
    #[inline(always)]
    pub(crate) fn previewed(self) -> Mode {
        match self {
            Mode::Peek => Mode::Check,
            Mode::PeekReserve(max_delay) => Mode::Reserve(max_delay),
            m => m,
        }
    }
}

/// The result of applying a call to a cell.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Applied {
    pub(crate) decision: Decision,
    /// What [`Cell::refund`] needs to take the charge back; `None` when nothing was charged.
    pub(crate) token: Option<u64>,
    /// Failed compare-and-swap attempts (contention), for the stats.
    pub(crate) retries: u32,
}

/// The ordering of the loads a charge decides on (a cell's in [`update`], an inline slot's in the
/// flat store's probe): `Acquire`, except in the deliberately broken build
/// `--cfg tollgate_broken="relaxed"` (scripts/must-fail.sh), which the loom suite must catch.
pub(crate) const ACQUIRE: Ordering = if cfg!(tollgate_broken = "relaxed") {
    Ordering::Relaxed
} else {
    Ordering::Acquire
};

/// A word the one CAS loop can drive: a cell's `AtomicU64`, or an inline slot of the flat store
/// (whose word belongs to the key only while the slot still holds the key's tag).
pub(crate) trait Word {
    /// Replaces `current` by `next`; on failure, what the word holds now (`None`: no longer the
    /// key's).
    fn swap(&self, current: u64, next: u64) -> Result<(), Option<u64>>;
    /// The deliberately broken build's blind write (scripts/must-fail.sh).
    #[cfg(tollgate_broken = "load_store")]
    fn overwrite(&self, next: u64);
}

impl Word for AtomicU64 {
    #[inline]
    fn swap(&self, current: u64, next: u64) -> Result<(), Option<u64>> {
        // AcqRel on success: this charge is ordered with every other charge of the cell (they
        // all RMW the same word, so whichever exchange comes first, the second sees its value and
        // decides on it). On failure we get the value that beat us and decide again (Acquire).
        self.compare_exchange_weak(current, next, Ordering::AcqRel, ACQUIRE)
            .map(drop)
            .map_err(Some)
    }
    #[cfg(tollgate_broken = "load_store")]
    fn overwrite(&self, next: u64) {
        // Release: publishes like the exchange would; the bug is the missing compare.
        self.store(next, Ordering::Release);
    }
}

/// An inline slot of the flat store, as the word of the key whose tag it held when found.
pub(crate) struct Inline<'a> {
    pub(crate) slot: &'a AtomicPair,
    pub(crate) tag: u64,
}

impl Word for Inline<'_> {
    #[inline]
    fn swap(&self, current: u64, next: u64) -> Result<(), Option<u64>> {
        // AcqRel / Acquire: as for a cell. The swap compares the tag too, so it fails once the
        // slot was removed (swept, reset, evicted, spilled) or taken by another key: a charge
        // never lands on a slot that is no longer this key's.
        self.slot
            .compare_exchange(
                (self.tag, current),
                (self.tag, next),
                Ordering::AcqRel,
                ACQUIRE,
            )
            .map_err(|(tag, word)| (tag == self.tag).then_some(word))
    }
    #[cfg(tollgate_broken = "load_store")]
    fn overwrite(&self, next: u64) {
        // The broken build's blind write: whatever the slot holds now is replaced.
        let seen = self.slot.load(ACQUIRE);
        let _ = self
            .slot
            .compare_exchange(seen, (self.tag, next), Ordering::AcqRel, ACQUIRE);
    }
}

/// Applies `step` to `cell` from `current`, a value of the word the caller has just read with
/// [`ACQUIRE`] (a cell's own load in [`update`]; the flat store's probe, which reads an inline
/// slot's state with its tag), until it sticks, through [`swap_loop`]. A stale `current` only
/// costs a failed swap.
///
/// `step` may run several times (once per lost race), each time on the freshest value; it must
/// be a pure function of its argument. When it returns a denial the loop ends with no write.
/// Returns the decision, the state written (if any) and the number of retries; `None` when the
/// word stopped being the key's (an inline slot removed under us).
#[inline(always)]
fn update_word_from(
    cell: &impl Word,
    current: u64,
    mut step: impl FnMut(u64) -> Step<u64>,
) -> Option<(Decision, Option<u64>, u32)> {
    // The decision of the last step taken: the one on the state the outcome was decided on.
    let mut decision = None;
    let (_, written, retries) = swap_loop(cell, current, |s| {
        let Step { decision: d, next } = step(s);
        decision = Some(d);
        next
    })?;
    let decision = decision.expect("the loop decides at least once");
    Some((decision, written, retries))
}

/// The one retry loop: from `current` (just read with `Acquire`), swaps in `next(state)` until a
/// swap sticks or `next` declines (a denial: no write). `next` may run several times, once per
/// lost race, each time on the freshest value; it must be a pure function of its argument.
/// Returns the state the outcome was decided on, the state written (if any) and the number of
/// retries; `None` when the word stopped being the key's (an inline slot removed under us).
#[inline(always)]
#[cfg_attr(tollgate_broken = "load_store", allow(unreachable_code))]
fn swap_loop(
    cell: &impl Word,
    mut current: u64,
    mut next: impl FnMut(u64) -> Option<u64>,
) -> Option<(u64, Option<u64>, u32)> {
    let mut retries = 0;
    loop {
        let Some(n) = next(current) else {
            return Some((current, None, retries));
        };
        // Deliberately broken cell for scripts/must-fail.sh: a load then a blind write, so two
        // racing charges can both decide on the same state and one overwrites the other.
        #[cfg(tollgate_broken = "load_store")]
        {
            cell.overwrite(n);
            return Some((current, Some(n), retries));
        }
        match cell.swap(current, n) {
            Ok(()) => return Some((current, Some(n), retries)),
            Err(actual) => {
                current = actual?;
                retries += 1;
            }
        }
    }
}

/// [`update_word_from`] on a cell's own word, which is always the key's, from a fresh load.
#[inline]
pub(crate) fn update(
    cell: &AtomicU64,
    step: impl FnMut(u64) -> Step<u64>,
) -> (Decision, Option<u64>, u32) {
    // Acquire: pairs with the AcqRel exchange of `Word::swap` (and the Release stores of reset
    // and migration), so a thread that reads a state reads the latest one other threads
    // published; the loom model `denial_sees_what_admissions_published` checks that a denial is
    // ordered after the admissions it counted. Relaxed would do for the count itself (one word,
    // one modification order); Acquire costs nothing on x86.
    let current = cell.load(ACQUIRE);
    update_word_from(cell, current, step).expect("a cell's word is always its key's")
}

/// One call on a word state, as the store runs it on the slot it finds the state in: the
/// decision step and its arguments, applied by [`apply`](Self::apply) inline (a closure of the
/// same body was left out of line, a call per check).
#[derive(Clone, Copy)]
pub(crate) struct WordCall<'r> {
    pub(crate) rule: &'r Rule,
    pub(crate) now: u64,
    pub(crate) cost: u64,
    pub(crate) headroom: u64,
    /// Whether the charge must leave a refund token ([`apply_inline_part`]); else the
    /// algorithm's own check loop ([`apply_inline`]).
    pub(crate) token: bool,
}

impl WordCall<'_> {
    /// Charges the word `word` of `slot`, read with the slot's tag (see [`apply_inline`]).
    #[inline(always)]
    pub(crate) fn apply(&self, slot: &impl Word, word: u64) -> Option<Applied> {
        let (now, cost, rule, headroom) = (self.now, self.cost, self.rule, self.headroom);
        if self.token {
            apply_inline_part(slot, word, now, cost, rule, headroom, Mode::Check)
        } else {
            apply_inline(slot, word, now, cost, rule, headroom, Mode::Check)
        }
    }
}

/// Applies one call to an inline slot: the same decision and state as [`Cell::apply`] on a word
/// cell holding `word`. `None` when the slot is no longer the key's.
#[inline(always)]
pub(crate) fn apply_inline(
    slot: &impl Word,
    word: u64,
    now: u64,
    cost: u64,
    rule: &Rule,
    headroom: u64,
    mode: Mode,
) -> Option<Applied> {
    if mode.is_peek() {
        let step = decide_word(word, now, cost, rule, headroom, mode.previewed());
        return Some(Applied {
            decision: step.decision,
            token: None,
            retries: 0,
        });
    }
    let (decision, retries) = match (rule.kind, mode) {
        // The check of the default algorithm (see `swap_then_decide`).
        (Kind::Gcra, Mode::Check) => swap_then_decide(
            slot,
            word,
            #[inline(always)]
            |s| algo::gcra::decide(s, now, cost, rule, headroom),
        )?,
        // The fixed window's check, the same way: its decision is cheap enough to take twice,
        // and a loop that carries the whole decision costs more than taking it again.
        (Kind::Fixed, Mode::Check) => swap_then_decide(
            slot,
            word,
            #[inline(always)]
            |s| algo::fixed::decide(s, now, cost, rule, headroom),
        )?,
        // The sliding counter's decision is dearer (a 128-by-64 division): taking it twice
        // costs more than the loop saves, so the loop keeps the whole decision, but on its own
        // arm, so that its step is the algorithm's decision alone, not `decide_word`'s match.
        (Kind::Sliding, Mode::Check) => {
            let (decision, _, retries) = update_word_from(slot, word, |s| {
                algo::sliding::decide(s, now, cost, rule, headroom)
            })?;
            (decision, retries)
        }
        _ => {
            let (decision, _, retries) = update_word_from(slot, word, |s| {
                decide_word(s, now, cost, rule, headroom, mode)
            })?;
            (decision, retries)
        }
    };
    // No refund token: a part that may need one is charged through `apply_inline_part`.
    Some(Applied {
        decision,
        token: None,
        retries,
    })
}

/// [`apply_inline`] for one part of a compound charge: the same decision, with the refund token
/// [`refund_inline`] needs to take the charge back. `None` when the slot is no longer the key's.
#[inline(always)]
pub(crate) fn apply_inline_part(
    slot: &impl Word,
    word: u64,
    now: u64,
    cost: u64,
    rule: &Rule,
    headroom: u64,
    mode: Mode,
) -> Option<Applied> {
    let call = WordCall {
        rule,
        now,
        cost,
        headroom,
        token: true,
    };
    apply_inline_from(slot, word, &call, mode, |s| s)
}

/// [`apply_inline_part`] deciding on `start(word)` instead of the slot's word (a synced fixed
/// window starts at the other processes' share): what it writes is the decision's next state.
/// As `swap_then_decide`, the loop computes next states only; the decision is taken once after
/// it, from the state the outcome was decided on. `call` gives the rule, the moment, the cost
/// and the headroom, `mode` what the call wants; `call.token` is not read: this always leaves
/// the refund token of what it charged.
#[inline(always)]
pub(crate) fn apply_inline_from(
    slot: &impl Word,
    word: u64,
    call: &WordCall<'_>,
    mode: Mode,
    start: impl Fn(u64) -> u64,
) -> Option<Applied> {
    let WordCall {
        now,
        cost,
        rule,
        headroom,
        ..
    } = *call;
    if mode.is_peek() {
        let step = decide_word(start(word), now, cost, rule, headroom, mode.previewed());
        return Some(Applied {
            decision: step.decision,
            token: None,
            retries: 0,
        });
    }
    if let (Kind::Gcra, Mode::Check) = (rule.kind, mode) {
        // The default algorithm's check on its own arm, as `apply_inline` has it: a step small
        // enough to inline in the loop and to take twice (the generic step below, every
        // algorithm's, stays an out-of-line call that returns its decision through memory).
        // Its token is the TAT written (`token_of`).
        let step = |s| algo::gcra::decide(start(s), now, cost, rule, headroom);
        let (state, written, retries) = swap_loop(slot, word, |s| step(s).next)?;
        return Some(Applied {
            decision: step(state).decision,
            token: written,
            retries,
        });
    }
    let step = |s| decide_word(start(s), now, cost, rule, headroom, mode);
    let (state, written, retries) = swap_loop(slot, word, |s| step(s).next)?;
    Some(Applied {
        decision: step(state).decision,
        token: written.map(|s| token_of(rule.kind, s)),
        retries,
    })
}

/// Takes back from an inline slot a charge that [`apply_inline_part`] admitted (`token`),
/// starting from `word`, read with the slot's tag: the state the slot holds after it. `None`
/// when the slot is no longer the key's (it was reset or removed: then there is nothing left to
/// take back).
#[inline]
pub(crate) fn refund_inline(
    slot: &impl Word,
    word: u64,
    cost: u64,
    rule: &Rule,
    token: u64,
    now: u64,
) -> Option<u64> {
    let step = |s| refund_step(s, cost, rule, token, now).next;
    swap_loop(slot, word, step).map(|(decided_on, written, _)| written.unwrap_or(decided_on))
}

/// Replaces an inline slot's word by `next(word)` until a swap sticks, from `word` read with
/// the slot's tag (`next` answering `None`: leave it as it is). `None` when the slot is no
/// longer the key's.
#[cfg(feature = "redis")]
#[inline]
pub(crate) fn replace_inline(
    slot: &impl Word,
    word: u64,
    next: impl FnMut(u64) -> Option<u64>,
) -> Option<()> {
    swap_loop(slot, word, next).map(drop)
}

/// The refund token of a word charge that wrote `written`: what [`refund_step`] needs to take
/// back only what of the charge is left.
#[inline]
pub(crate) fn token_of(kind: Kind, written: u64) -> u64 {
    match kind {
        Kind::Fixed => algo::fixed::token(written),
        Kind::Sliding => algo::sliding::token(written),
        // The TAT this charge wrote: a refund takes back only what of it is left.
        _ => written,
    }
}

/// The pure refund of a word cell: a step that always writes.
#[inline]
fn refund_step(s: u64, cost: u64, rule: &Rule, token: u64, now: u64) -> Step<u64> {
    let next = match rule.kind {
        Kind::Gcra => algo::gcra::refund(s, cost, rule, token, now),
        Kind::Fixed => algo::fixed::refund(s, cost, token),
        Kind::Sliding => algo::sliding::refund(s, cost, token),
        Kind::Log => s,
    };
    Step {
        decision: Decision::denied(crate::Reason::Within, 0),
        next: Some(next),
    }
}

/// A word state of rule `old` carried over to rule `new` at `now` (a plan change; see the
/// limiter's docs for the rule). A word of another algorithm starts fresh.
pub(crate) fn migrate_word(state: u64, now: u64, old: &Rule, new: &Rule) -> u64 {
    if old.kind != new.kind {
        return 0;
    }
    match new.kind {
        Kind::Gcra => algo::gcra::migrate(state, now, old, new),
        Kind::Fixed => algo::fixed::migrate(state, now, old, new),
        Kind::Sliding => algo::sliding::migrate(state, now, old, new),
        Kind::Log => 0,
    }
}

/// [`swap_loop`] on `step`'s next state only (the unused fields of its decision compile away),
/// then the decision taken once, after it, from the state the outcome was decided on: the same
/// `Decision` as [`update_word_from`], for a `step` cheap enough to run twice. Returns the
/// decision and the retries; `None` when the word stopped being the key's.
#[inline(always)]
fn swap_then_decide(
    cell: &impl Word,
    current: u64,
    step: impl Fn(u64) -> Step<u64>,
) -> Option<(Decision, u32)> {
    let (state, _, retries) = swap_loop(cell, current, |s| step(s).next)?;
    Some((step(state).decision, retries))
}

/// One part of a key's state: a packed word, or a log.
#[derive(Debug)]
pub(crate) enum Cell {
    Word(AtomicU64),
    Log(Box<Mutex<Log>>),
}

impl Cell {
    /// A fresh cell for a rule of this kind.
    pub(crate) fn fresh(kind: Kind) -> Cell {
        match kind {
            Kind::Log => Cell::Log(Box::new(Mutex::new(Log::default()))),
            _ => Cell::Word(AtomicU64::new(0)),
        }
    }

    /// Applies one call at `now`.
    #[inline]
    pub(crate) fn apply(
        &self,
        now: u64,
        cost: u64,
        rule: &Rule,
        headroom: u64,
        mode: Mode,
    ) -> Applied {
        match self {
            Cell::Word(word) => {
                if mode.is_peek() {
                    // Acquire: see `update`.
                    let state = word.load(Ordering::Acquire);
                    let step = decide_word(state, now, cost, rule, headroom, mode.previewed());
                    return Applied {
                        decision: step.decision,
                        token: None,
                        retries: 0,
                    };
                }
                let (decision, written, retries) =
                    update(word, |s| decide_word(s, now, cost, rule, headroom, mode));
                let token = written.map(|s| token_of(rule.kind, s));
                Applied {
                    decision,
                    token,
                    retries,
                }
            }
            Cell::Log(log) => {
                // Contention: one short critical section per call on this key.
                let mut log = lock(log);
                if !mode.is_peek() {
                    // A peek writes nothing, not even expiry (the clock may later step back).
                    log.expire(now, rule.period);
                }
                let step = algo::log::decide(&log, now, cost, rule, headroom);
                let token = match (step.next, mode) {
                    (Some(()), Mode::Check | Mode::Reserve(_)) => Some(log.push(now, cost)),
                    _ => None,
                };
                Applied {
                    decision: step.decision,
                    token,
                    retries: 0,
                }
            }
        }
    }

    /// Takes back a charge this cell admitted (`token` from [`Applied`]).
    pub(crate) fn refund(&self, cost: u64, rule: &Rule, token: u64, now: u64) {
        match self {
            Cell::Word(word) => {
                let _ = update(word, |s| refund_step(s, cost, rule, token, now));
            }
            Cell::Log(log) => lock(log).refund(token, cost),
        }
    }

    /// True when this cell is indistinguishable from a fresh one at `now`.
    pub(crate) fn is_fresh(&self, now: u64, rule: &Rule) -> bool {
        match self {
            // Acquire: see `update`; the sweeper's caller holds the store's exclusive access, so
            // no charge can land between this load and the removal.
            Cell::Word(word) => word_is_fresh(word.load(Ordering::Acquire), now, rule),
            Cell::Log(log) => lock(log).is_fresh(now, rule.period),
        }
    }

    /// The earliest moment from `now` on at which this cell can be fresh (see
    /// [`word_fresh_from`]).
    pub(crate) fn fresh_from(&self, now: u64, rule: &Rule) -> u64 {
        match self {
            // Acquire: see `update`. A charge landing after the load only makes the moment
            // later.
            Cell::Word(word) => word_fresh_from(word.load(Ordering::Acquire), now, rule),
            Cell::Log(log) => lock(log).fresh_from(now, rule.period),
        }
    }

    /// A cell for `new` that carries this one's spending under `old` (see the limiter's docs for
    /// the rule). Cells of a different kind start fresh.
    pub(crate) fn migrate(&self, now: u64, old: &Rule, new: &Rule) -> Cell {
        if old.kind != new.kind {
            return Cell::fresh(new.kind);
        }
        match self {
            Cell::Word(word) => {
                // Acquire: see `update`.
                let s = word.load(Ordering::Acquire);
                Cell::Word(AtomicU64::new(migrate_word(s, now, old, new)))
            }
            Cell::Log(log) => {
                let mut copy = lock(log).clone();
                copy.expire(now, new.period);
                Cell::Log(Box::new(Mutex::new(copy)))
            }
        }
    }

    /// Heap bytes this cell owns beyond its own size (for memory accounting).
    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            Cell::Word(_) => 0,
            Cell::Log(log) => std::mem::size_of::<Mutex<Log>>() + lock(log).len() * 16,
        }
    }
}

/// True when a word cell holding `state` is indistinguishable from a fresh one at `now`.
#[inline]
pub(crate) fn word_is_fresh(state: u64, now: u64, rule: &Rule) -> bool {
    word_is_fresh_as(rule.kind, state, now, rule)
}

/// The earliest moment from `now` on at which a word cell holding `state` can be fresh: `now`
/// when it is; otherwise a lower bound (exact for the buckets; the end of `now`'s window for
/// the window algorithms). A charge only moves it later. A walk of the table at the cap that
/// finds nothing stale notes the least of these, so the next walk waits for it.
pub(crate) fn word_fresh_from(state: u64, now: u64, rule: &Rule) -> u64 {
    match rule.kind {
        Kind::Gcra => algo::gcra::fresh_from(state, now),
        Kind::Fixed => algo::fixed::fresh_from(state, now, rule),
        Kind::Sliding => algo::sliding::fresh_from(state, now, rule),
        Kind::Log => now,
    }
}

/// [`word_is_fresh`] for a rule of `kind`: a loop that passes a constant gets that algorithm's
/// test alone, with no match per call.
#[inline(always)]
pub(crate) fn word_is_fresh_as(kind: Kind, state: u64, now: u64, rule: &Rule) -> bool {
    match kind {
        Kind::Gcra => algo::gcra::is_fresh(state, now),
        Kind::Fixed => algo::fixed::is_fresh(state, now, rule),
        Kind::Sliding => algo::sliding::is_fresh(state, now, rule),
        Kind::Log => true,
    }
}

/// The pure step for a word cell.
#[inline(always)]
pub(crate) fn decide_word(
    state: u64,
    now: u64,
    cost: u64,
    rule: &Rule,
    headroom: u64,
    mode: Mode,
) -> Step<u64> {
    match (rule.kind, mode) {
        (Kind::Gcra, Mode::Reserve(max_delay)) => {
            algo::gcra::reserve(state, now, cost, rule, max_delay, headroom)
        }
        (Kind::Gcra, _) => algo::gcra::decide(state, now, cost, rule, headroom),
        (Kind::Fixed, _) => algo::fixed::decide(state, now, cost, rule, headroom),
        (Kind::Sliding, _) => algo::sliding::decide(state, now, cost, rule, headroom),
        (Kind::Log, _) => unreachable!("a log rule always has a log cell"),
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::{Mode, decide_word, word_fresh_from, word_is_fresh};
    use crate::{Algorithm, Quota};

    proptest! {
        /// `word_fresh_from` is `now` exactly when the state is fresh, and otherwise no moment
        /// from `now` up to it finds the state fresh, so a walk at the cap that waits for the
        /// least of them never waits past a stale state. States made by charges at earlier
        /// moments, and any word at all (a clock that went back, a wrapped window id).
        #[test]
        fn no_state_is_fresh_before_its_fresh_from(
            algorithm in prop::sample::select(vec![
                Algorithm::TokenBucket,
                Algorithm::FixedWindow,
                Algorithm::SlidingWindowCounter,
            ]),
            limit in 1u64..10,
            period in 100u64..10_000,
            mut charges in prop::collection::vec(0u64..20_000, 0..6),
            raw in prop::option::of(any::<u64>()),
            later in 0u64..30_000,
        ) {
            let rule = Quota::new(limit, Duration::from_nanos(period))
                .algorithm(algorithm)
                .compile(7)
                .unwrap();
            charges.sort_unstable();
            let mut state = 0;
            for &t in &charges {
                if let Some(next) = decide_word(state, t, 1, &rule, 0, Mode::Check).next {
                    state = next;
                }
            }
            let state = raw.unwrap_or(state);
            let now = charges.last().copied().unwrap_or(0) + later;
            let from = word_fresh_from(state, now, &rule);
            prop_assert!(from >= now);
            prop_assert_eq!(from == now, word_is_fresh(state, now, &rule));
            for k in 0..16 {
                let t = now + (from - now) / 16 * k;
                prop_assert!(t == now && from == now || !word_is_fresh(state, t, &rule), "{t}");
            }
            if from > now {
                prop_assert!(!word_is_fresh(state, from - 1, &rule));
            }
        }
    }
}
