//! What synced mode keeps per (key, rule) beside the local word cell: the units admitted here
//! and not yet pushed, this process's share of a fixed window, and how a round's reply becomes
//! the local word. Shared by [`SyncedLimiter`](super::SyncedLimiter) (whose cells are its own)
//! and a [`Limiter`](crate::Limiter) synced through Redis (whose cells are its table's slots).

use super::round::Global;
use crate::algo::{self, Kind, Rule};
use crate::error::Error;
use crate::sync::{AtomicU64, Ordering};

/// Bits of a window id in a window algorithm's pending word (the rest count units): ids are
/// told apart over 2^24 windows, and a round is never that far behind a check.
const WINDOW_BITS: u32 = 24;
/// Mask of a window id in a pending word.
const WINDOW_MASK: u64 = (1 << WINDOW_BITS) - 1;
/// Mask of the units in a pending word.
const UNITS: u64 = (1 << (64 - WINDOW_BITS)) - 1;

/// A key's units to push in a round: `(window, units)` twice (window algorithms: the earlier and
/// the current window; buckets: the count in the second field of the first).
pub(crate) type Units = [(u64, u64); 2];

/// A window algorithm's pending word: `units` admitted in local window `window`.
fn word_of(window: u64, units: u64) -> u64 {
    ((window & WINDOW_MASK) << (64 - WINDOW_BITS)) | units.min(UNITS)
}

/// `(window id bits, units)` of a pending word.
fn parts(p: u64) -> (u64, u64) {
    (p >> (64 - WINDOW_BITS), p & UNITS)
}

/// The full local window id of a pending word's id bits: the latest one at or before `window`.
fn full_window(window: u64, id: u64) -> u64 {
    window - ((window & WINDOW_MASK).wrapping_sub(id) & WINDOW_MASK)
}

/// The local window `now` falls in under `rule` (window algorithms).
pub(crate) fn window(rule: &Rule, now: u64) -> u64 {
    algo::window_of(now, rule.phase, rule.period).0
}

/// Whether a local word of `rule` holds nothing that still counts at `now`.
pub(crate) fn is_fresh(rule: &Rule, word: u64, now: u64) -> bool {
    match rule.kind {
        Kind::Gcra => algo::gcra::is_fresh(word, now),
        Kind::Fixed => algo::fixed::is_fresh(word, now, rule),
        Kind::Sliding => algo::sliding::is_fresh(word, now, rule),
        Kind::Log => true,
    }
}

/// Whether `rules` can be synced: a sliding log cannot (it keeps every request's time). The
/// error names the limiter (`who`) and what to use instead.
pub(crate) fn check_syncable(rules: &[Rule], who: &str, instead: &str) -> Result<(), Error> {
    match rules.iter().find(|r| r.kind == Kind::Log) {
        Some(r) => Err(Error::Config {
            line: None,
            message: format!(
                "{who} runs token and leaky buckets, fixed windows and sliding window counters, \
                 not {} ({instead})",
                r.algorithm.name()
            ),
        }),
        None => Ok(()),
    }
}

/// One (key, rule)'s synced bookkeeping.
pub(crate) struct Tracker {
    /// Units admitted locally and not yet pushed: a count (buckets), or a pending word (window
    /// algorithms: the window they were admitted in and how many).
    pending: AtomicU64,
    /// Window algorithms: a pending word of an earlier window, moved aside when a check in a
    /// later window found units of it not yet pushed (0 when none).
    earlier: AtomicU64,
    /// Checked since the last round (1) or not (0).
    touched: AtomicU64,
    /// Fixed windows: a pending word of the units admitted here in the latest window, pushed
    /// or not (this process's share of the window).
    own: AtomicU64,
    /// Fixed windows: the count a new window starts from here: the other processes' share of
    /// the limit, as the last round saw the shares (0 before any).
    baseline: AtomicU64,
}

impl Tracker {
    pub(crate) fn new() -> Tracker {
        Tracker {
            pending: AtomicU64::new(0),
            earlier: AtomicU64::new(0),
            touched: AtomicU64::new(0),
            own: AtomicU64::new(0),
            baseline: AtomicU64::new(0),
        }
    }

    /// Marks the key as checked: the next round reconciles it.
    #[inline]
    pub(crate) fn checked(&self) {
        // Relaxed: a hint for the next round; a lost mark only delays one key's adoption by a
        // round. Loaded first so a hot key does not write the line on every check.
        if self.touched.load(Ordering::Relaxed) == 0 {
            self.touched.store(1, Ordering::Relaxed);
        }
    }

    /// The word a check at `now` decides on: `word` itself, except that a fixed window this
    /// process has no count of yet starts at the others' share of the limit (see
    /// [`adopt_window`](Self::adopt_window)), not at 0, so that N processes starting a window
    /// together do not each spend the whole limit before their next round.
    #[inline]
    pub(crate) fn start(&self, rule: &Rule, word: u64, now: u64) -> u64 {
        if rule.kind != Kind::Fixed {
            return word;
        }
        // Relaxed: a hint written by the rounds; any value it held is a valid start.
        let baseline = self.baseline.load(Ordering::Relaxed);
        if baseline == 0 {
            return word;
        }
        let w = window(rule, now) as u32;
        let (sw, _) = algo::fixed::decode(word);
        let ahead = sw.wrapping_sub(w);
        if ahead == 0 || ahead < 1 << 20 {
            // This window's count (or, with a clock that went back, a later one's): as it is.
            return word;
        }
        algo::fixed::encode(w, baseline.min(rule.limit))
    }

    /// Counts `cost` units admitted at `now`, to push.
    #[inline]
    pub(crate) fn charged(&self, rule: &Rule, now: u64, cost: u64) {
        if rule.kind == Kind::Gcra {
            // Release: pairs with the AcqRel swap in `take`; the units are counted once, by
            // whichever round swaps after this add (this one or the next).
            self.pending.fetch_add(cost, Ordering::Release);
            return;
        }
        let w = window(rule, now);
        self.add_pending(w, cost);
        if rule.kind == Kind::Fixed {
            let id = w & WINDOW_MASK;
            // Relaxed: a statistic of this process's share, read by the rounds.
            let _ = self
                .own
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |o| {
                    let (ow, n) = parts(o);
                    Some(word_of(id, if ow == id { n + cost } else { cost }))
                });
        }
    }

    /// Takes back `cost` units refunded at `at` from what is still to push: for a window
    /// algorithm, only from the window `at` falls in (a refund after its window ended, or of
    /// units already pushed, leaves them counted globally: the stricter side).
    pub(crate) fn refunded(&self, rule: &Rule, at: u64, cost: u64) {
        if rule.kind == Kind::Gcra {
            // AcqRel/Acquire: as the add in `charged`.
            let _ = self
                .pending
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    Some(n.saturating_sub(cost))
                });
            return;
        }
        let id = window(rule, at) & WINDOW_MASK;
        let _ = self
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                let (w, n) = parts(p);
                (w == id && n > 0).then(|| word_of(id, n.saturating_sub(cost)))
            });
    }

    /// Counts `cost` units admitted in local window `w` as pending. Units of an earlier window
    /// not yet pushed move to `earlier` (replacing any of a window before that: no decision
    /// looks further back than the previous window).
    fn add_pending(&self, w: u64, cost: u64) {
        let id = w & WINDOW_MASK;
        // Acquire/AcqRel (all): pairs with the swaps in `take`, as the buckets' add does.
        let mut cur = self.pending.load(Ordering::Acquire);
        loop {
            let (pw, n) = parts(cur);
            let next = if n == 0 || pw == id {
                word_of(id, n + cost)
            } else {
                word_of(id, cost)
            };
            match self
                .pending
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if n > 0 && pw != id {
                        let _ =
                            self.earlier
                                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
                                    let (ew, en) = parts(e);
                                    Some(if en > 0 && ew == pw {
                                        word_of(pw, en + n)
                                    } else {
                                        cur
                                    })
                                });
                    }
                    return;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Takes the units to push, for a round in local window `w`: `None` when the key was not
    /// checked since the last round and has nothing to push (an idle key).
    pub(crate) fn take(&self, rule: &Rule, w: u64) -> Option<Units> {
        // Relaxed: see `checked`.
        let touched = self.touched.swap(0, Ordering::Relaxed) == 1;
        // AcqRel: pairs with the Release add in `charged`; each unit goes to exactly one round.
        let n = self.pending.swap(0, Ordering::AcqRel);
        let units = if rule.kind == Kind::Gcra {
            [(0, n), (0, 0)]
        } else {
            // AcqRel: as `pending`. A check may already be in the next window.
            let full = |(id, n): (u64, u64)| (full_window(w + 1, id), n);
            let earlier = parts(self.earlier.swap(0, Ordering::AcqRel));
            [full(earlier), full(parts(n))]
        };
        (touched || units[0].1 > 0 || units[1].1 > 0).then_some(units)
    }

    /// True when nothing is pending and the key was not checked since the last round.
    pub(crate) fn is_idle(&self) -> bool {
        // Relaxed / Acquire: see `checked` and `take`.
        self.touched.load(Ordering::Relaxed) == 0
            && self.pending.load(Ordering::Acquire) == 0
            && self.earlier.load(Ordering::Acquire) == 0
    }

    /// Puts back the units a failed round did not send; returns the units that found no place
    /// (window algorithms: when both pending words hold other windows), to count as unconfirmed.
    pub(crate) fn give_back(&self, rule: &Rule, units: &Units) -> u64 {
        if rule.kind == Kind::Gcra {
            // Release: as in `charged`.
            self.pending.fetch_add(units[0].1, Ordering::Release);
            return 0;
        }
        let mut lost = 0;
        for &(w, n) in units {
            if n == 0 {
                continue;
            }
            let id = w & WINDOW_MASK;
            let merge = |p: u64| {
                let (pw, pn) = parts(p);
                (pn == 0 || pw == id).then(|| word_of(id, pn + n))
            };
            // AcqRel/Acquire: as in `add_pending`.
            let placed = self
                .pending
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, merge)
                .or_else(|_| {
                    self.earlier
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, merge)
                })
                .is_ok();
            if !placed {
                lost += n;
            }
        }
        lost
    }

    /// Units admitted here in local window `w` since the round took them (window algorithms).
    fn since(&self, w: u64) -> u64 {
        // Acquire: pairs with the AcqRel update in `add_pending`.
        let (id, n) = parts(self.pending.load(Ordering::Acquire));
        if n > 0 && full_window(w + 1, id) == w {
            n
        } else {
            0
        }
    }

    /// The word a local cell of `rule` holding `word` takes from a round that read `global`
    /// (a bucket's at local time `local_now`): see [`adopt_gcra`](Self::adopt_gcra) and
    /// [`adopt_window`](Self::adopt_window). `None`: leave the word as it is.
    pub(crate) fn adopt(
        &self,
        rule: &Rule,
        word: u64,
        global: Global,
        local_now: u64,
    ) -> Option<u64> {
        match global {
            Global::Debt(debt) => Some(self.adopt_gcra(rule, local_now, debt)),
            Global::Counts { window, cur, prev } => {
                self.adopt_window(rule, word, window, cur, prev)
            }
        }
    }

    /// The word a GCRA cell takes from a round: the global debt (`TAT - now` in Redis), plus
    /// what was admitted here since the round took this key's units.
    fn adopt_gcra(&self, rule: &Rule, local_now: u64, debt: u64) -> u64 {
        // Acquire: pairs with the Release add in `charged` (units admitted since the swap).
        let since = self.pending.load(Ordering::Acquire);
        local_now
            .saturating_add(debt)
            .saturating_add(since.saturating_mul(rule.emission))
    }

    /// The word a window cell holding `word` takes from a round in local window `w` that read
    /// the global counts `cur` (of `w`) and `prev` (of the window before), plus what was
    /// admitted here in `w` since the round took this key's units; `None` when the local state
    /// is already in a later window (the next round brings the global one). Within a window the
    /// view only grows: the others' units only ever add up, and a start at the others' share
    /// stays until their count passes it. For a fixed window, also sets the next window's start
    /// to the others' share of this one (the global count less this process's own units,
    /// scaled to the limit).
    fn adopt_window(&self, rule: &Rule, word: u64, w: u64, cur: u64, prev: u64) -> Option<u64> {
        let cur = cur.saturating_add(self.since(w));
        match rule.kind {
            Kind::Fixed => {
                // Relaxed (both): see `charged` and `start`.
                let (ow, on) = parts(self.own.load(Ordering::Relaxed));
                let own = if full_window(w + 1, ow) == w { on } else { 0 };
                let global = cur.max(own);
                let others = if global == 0 {
                    0
                } else {
                    ((u128::from(rule.limit) * u128::from(global - own)) / u128::from(global))
                        as u64
                };
                self.baseline.store(others, Ordering::Relaxed);
                let (sw, count) = algo::fixed::decode(word);
                let ahead = sw.wrapping_sub(w as u32);
                if ahead != 0 && ahead < 1 << 20 {
                    return None;
                }
                let local = if ahead == 0 { count } else { 0 };
                Some(algo::fixed::encode(
                    w as u32,
                    cur.max(local).min(algo::fixed::MAX_LIMIT),
                ))
            }
            Kind::Sliding => {
                let (sw, local_prev, local_cur) = algo::sliding::decode(word);
                let ahead = sw.wrapping_sub(w) & ((1 << 20) - 1);
                if ahead != 0 && ahead < 1 << 12 {
                    return None;
                }
                let (local_prev, local_cur) = if ahead == 0 {
                    (local_prev, local_cur)
                } else {
                    (0, 0)
                };
                Some(algo::sliding::encode(
                    w,
                    prev.max(local_prev).min(algo::sliding::MAX_LIMIT),
                    cur.max(local_cur).min(algo::sliding::MAX_LIMIT),
                ))
            }
            Kind::Gcra | Kind::Log => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;

    fn rule(q: Quota) -> Rule {
        q.compile(0).unwrap()
    }

    /// Units of two windows are kept apart, a third window's replace the oldest, and a round
    /// takes them with their full window ids.
    #[test]
    fn pending_units_keep_their_windows() {
        let r = rule(Quota::per_second(100).algorithm(crate::Algorithm::FixedWindow));
        let t = Tracker::new();
        let s = 1_000_000_000;
        t.charged(&r, 5 * s, 2);
        t.charged(&r, 5 * s + 10, 1);
        t.charged(&r, 6 * s, 4);
        assert_eq!(t.take(&r, 6), Some([(5, 3), (6, 4)]));
        assert_eq!(t.take(&r, 6), None, "nothing pending, not checked");
        t.charged(&r, 7 * s, 1);
        t.charged(&r, 8 * s, 1);
        t.charged(&r, 9 * s, 1);
        assert_eq!(
            t.take(&r, 9),
            Some([(8, 1), (9, 1)]),
            "window 7 is two back"
        );
        t.checked();
        assert_eq!(
            t.take(&r, 9),
            Some([(0, 0), (0, 0)]),
            "checked, nothing to push"
        );
        t.charged(&r, 9 * s, 3);
        t.refunded(&r, 9 * s, 1);
        t.refunded(&r, 8 * s, 1); // a refund of an earlier window's charge: already pushed
        assert_eq!(t.take(&r, 9), Some([(0, 0), (9, 2)]));
    }

    /// A fixed window starts at the others' share of the last one; adoption never lowers a
    /// window's view.
    #[test]
    fn a_fixed_window_starts_at_the_others_share() {
        let r = rule(Quota::per_second(300).algorithm(crate::Algorithm::FixedWindow));
        let t = Tracker::new();
        let s = 1_000_000_000;
        t.charged(&r, 2 * s, 100);
        let _ = t.take(&r, 2);
        // Globally 300 in window 2, 100 of them here: the others' share is 200.
        let word = algo::fixed::encode(2, 100);
        assert_eq!(
            t.adopt_window(&r, word, 2, 300, 0),
            Some(algo::fixed::encode(2, 300))
        );
        assert_eq!(t.start(&r, word, 3 * s), algo::fixed::encode(3, 200));
        // A lower global count (others' units not pushed yet) does not lower the view.
        let word = algo::fixed::encode(3, 250);
        assert_eq!(t.adopt_window(&r, word, 3, 120, 300), Some(word));
    }
}
