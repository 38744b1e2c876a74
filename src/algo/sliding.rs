//! Sliding window counter: the usual estimate `prev * (1 - elapsed/period) + cur` over two
//! Unix-aligned windows ("counter pairs"), in exact integer arithmetic.
//!
//! A cost-`n` request is admitted iff the estimate after charging stays within the limit:
//! `prev * (period - elapsed) + (cur + n) * period <= limit * period`, which in whole units is
//! `ceil(prev * (period - elapsed) / period) + cur + n <= limit` (see [`used`]: one 128-by-64
//! division). This is stricter than the common `total < limit` test by less than one unit.
//!
//! | bits   | field  | meaning |
//! |--------|--------|---------|
//! | 63..44 | window | low 20 bits of the index of the window `cur` counts |
//! | 43..22 | prev   | units admitted in the window before it |
//! | 21..0  | cur    | units admitted in that window |
//!
//! The largest limit is 2^22 - 1 = 4,194,303 per window. Window ids wrap at 2^20. A stored window
//! up to 2^12 windows ahead of `now` means the clock went back, and the counts are kept; so a key
//! idle for between 2^20 - 2^12 and 2^20 windows (or a multiple of 2^20) could see an old count
//! again: only ever more restrictive, and the sweeper removes such keys long before. A clock that
//! steps back more than 2^12 windows sees fresh keys.

use super::{Rule, Step, window_of};

/// Width of each counter.
const COUNT_BITS: u32 = 22;
/// Mask of one counter.
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// Shift of the `prev` counter.
const PREV_SHIFT: u32 = COUNT_BITS;
/// Shift of the window field.
const WINDOW_SHIFT: u32 = 2 * COUNT_BITS;
/// Mask of the window field (after shifting).
const WINDOW_MASK: u64 = (1 << (64 - WINDOW_SHIFT)) - 1;
/// A stored window at most this many windows ahead of `now` means the clock went back (the
/// counts are kept); further ahead, the id is an old one that wrapped and the state is stale.
const MAX_AHEAD: u64 = 1 << 12;
/// The largest limit a sliding window counter can count.
pub(crate) const MAX_LIMIT: u64 = COUNT_MASK;

/// Packs `(window, prev, cur)`.
#[inline]
pub(crate) fn encode(window: u64, prev: u64, cur: u64) -> u64 {
    debug_assert!(prev <= COUNT_MASK && cur <= COUNT_MASK);
    ((window & WINDOW_MASK) << WINDOW_SHIFT) | (prev << PREV_SHIFT) | cur
}

/// Unpacks `(window, prev, cur)`.
#[inline]
pub(crate) fn decode(state: u64) -> (u64, u64, u64) {
    (
        state >> WINDOW_SHIFT,
        (state >> PREV_SHIFT) & COUNT_MASK,
        state & COUNT_MASK,
    )
}

/// The counters as seen at `now`.
struct View {
    window: u64,
    prev: u64,
    cur: u64,
    /// ns into the window.
    elapsed: u64,
    /// ns from `now` until the moment the view describes (non-zero only when the clock went back).
    lead: u64,
}

#[inline]
fn view(state: u64, now: u64, rule: &Rule) -> View {
    let (w, e) = window_of(now, rule.phase, rule.period);
    let w = w & WINDOW_MASK;
    let (sw, prev, cur) = decode(state);
    let d = w.wrapping_sub(sw) & WINDOW_MASK;
    match d {
        0 => View {
            window: w,
            prev,
            cur,
            elapsed: e,
            lead: 0,
        },
        1 => View {
            window: w,
            prev: cur,
            cur: 0,
            elapsed: e,
            lead: 0,
        },
        d if WINDOW_MASK + 1 - d > MAX_AHEAD => View {
            window: w,
            prev: 0,
            cur: 0,
            elapsed: e,
            lead: 0,
        },
        d => {
            // The clock went back: judge as at the start of the stored window (the strictest
            // moment of it), and report times from there.
            let ahead = (WINDOW_MASK + 1 - d).saturating_mul(rule.period);
            View {
                window: sw,
                prev,
                cur,
                elapsed: 0,
                lead: ahead - e,
            }
        }
    }
}

/// The estimate in whole units, rounded up: `ceil(prev * (period - elapsed) / period) + cur`,
/// which is `prev - floor(prev * elapsed / period) + cur` (one division, whose quotient is below
/// `prev`). With whole-unit costs and limits, `estimate + cost <= limit` is the admission test
/// `prev * (period - elapsed) + (cur + cost) * period <= limit * period` exactly.
#[inline(always)]
fn used(v: &View, period: u64) -> u64 {
    v.prev - super::mul_div(v.prev, v.elapsed, period) + v.cur
}

/// Decides a cost-`cost` request at `now`. Always inline: out of line, the call would be about
/// a fifth of a denial's time, and a plain `#[inline]` is only a request, which some binaries
/// (criterion's bench among them) do not grant.
#[inline(always)]
pub(crate) fn decide(state: u64, now: u64, cost: u64, rule: &Rule, headroom: u64) -> Step<u64> {
    let v = view(state, now, rule);
    let cap = rule.limit - headroom;
    // Below 2^24: both counters are below 2^22, and so is the cost.
    let used = used(&v, rule.period);
    // Saturating: with a period near 2^64 ns (a quota of centuries) the sums would wrap; such a
    // reset is "never" either way.
    let reset = |cur: u64, prev: u64| {
        let left = rule.period - v.elapsed;
        v.lead.saturating_add(if cur > 0 {
            left.saturating_add(rule.period)
        } else if prev > 0 {
            left
        } else {
            0
        })
    };
    if used + cost <= cap {
        let cur = v.cur + cost;
        Step::allow(
            encode(v.window, v.prev, cur),
            rule.limit,
            cap - used - cost,
            reset(cur, v.prev),
            0,
        )
    } else {
        let retry = v
            .lead
            .saturating_add(retry_after(&v, cost, cap, rule.period));
        Step::deny(
            rule.limit,
            cap.saturating_sub(used),
            reset(v.cur, v.prev),
            retry,
        )
    }
}

/// The earliest wait after which the same request passes, given it does not pass now.
fn retry_after(v: &View, cost: u64, cap: u64, period: u64) -> u64 {
    let left = period - v.elapsed;
    // Later in this window: prev's weight falls as elapsed grows; need
    // prev * (P - e') <= (cap - cur - cost) * P, i.e. P - e' <= q.
    if v.cur + cost <= cap && v.prev > 0 {
        // Below P: cap - cur - cost < prev, or the request would pass now.
        let q = super::mul_div(cap - v.cur - cost, period, v.prev);
        if q > 0 {
            // q < P - elapsed here, or the request would pass now.
            return period - q - v.elapsed;
        }
    }
    // In the next window, cur becomes prev: need cur * (P - e'') <= (cap - cost) * P, which
    // holds from its start when cur <= cap - cost; otherwise the quotient is below P.
    if v.cur <= cap - cost {
        return left;
    }
    let q2 = super::mul_div(cap - cost, period, v.cur);
    left.saturating_add(period - q2)
}

/// True when the estimate is zero at `now` and stays zero.
pub(crate) fn is_fresh(state: u64, now: u64, rule: &Rule) -> bool {
    let v = view(state, now, rule);
    v.prev == 0 && v.cur == 0
}

/// The earliest moment from `now` on at which the state can be fresh: `now` if it is, else
/// the end of `now`'s window (see [`super::window_end`]; a count in the current window lasts
/// one window more, so this is a lower bound).
pub(crate) fn fresh_from(state: u64, now: u64, rule: &Rule) -> u64 {
    if is_fresh(state, now, rule) {
        now
    } else {
        super::window_end(now, rule)
    }
}

/// The window a charge landed in (the refund token).
#[inline]
pub(crate) fn token(state: u64) -> u64 {
    decode(state).0
}

/// Takes back `cost` charged in window `token`: from `cur` if the window is still current, from
/// `prev` if it has rolled once, nothing if it has gone.
pub(crate) fn refund(state: u64, cost: u64, token: u64) -> u64 {
    let (sw, prev, cur) = decode(state);
    if sw == token {
        encode(sw, prev, cur.saturating_sub(cost))
    } else if sw == (token + 1) & WINDOW_MASK {
        encode(sw, prev.saturating_sub(cost), cur)
    } else {
        state
    }
}

/// Carries a key across a quota change: the estimate it has used stays used, as the new rule's
/// current-window count (when the period is unchanged, the counters are kept as they are).
pub(crate) fn migrate(state: u64, now: u64, old: &Rule, new: &Rule) -> u64 {
    if old.period == new.period && old.phase == new.phase {
        return state;
    }
    let v = view(state, now, old);
    let (w, _) = window_of(now, new.phase, new.period);
    encode(w, 0, used(&v, old.period).min(MAX_LIMIT))
}
