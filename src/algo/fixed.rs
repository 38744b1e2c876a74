//! Fixed window: at most `limit` units per window, windows aligned to Unix time
//! (`floor(unix_t / period)`, as in the common Redis key `ratelimit:ip:28421876`).
//!
//! The 2x burst across a window boundary is real: `limit` at the end of one window and `limit`
//! at the start of the next are both admitted.
//!
//! | bits   | field  | meaning |
//! |--------|--------|---------|
//! | 63..32 | window | low 32 bits of the window index the count belongs to |
//! | 31..0  | count  | units admitted in that window |
//!
//! Window indices wrap at 2^32. A stored window up to 2^20 windows ahead of `now` means the clock
//! went back, and its count is kept; so a key idle for between 2^32 - 2^20 and 2^32 windows (or a
//! multiple of 2^32) would see its old count again: more restrictive, never less, and the sweeper
//! removes such keys long before. A clock that steps back more than 2^20 windows sees fresh keys.

use super::{Rule, Step, window_of};

/// Bits of the window field.
const WINDOW_SHIFT: u32 = 32;
/// Mask of the count field.
const COUNT_MASK: u64 = (1 << WINDOW_SHIFT) - 1;
/// A stored window at most this many windows ahead of `now` means the clock went back (the
/// count is kept, strictly); further ahead, the id is an old one that wrapped and the state is
/// stale. A key idle for between 2^32 - 2^20 and 2^32 windows would be misjudged as ahead.
const MAX_AHEAD: u32 = 1 << 20;
/// The largest limit a fixed window can count.
pub(crate) const MAX_LIMIT: u64 = COUNT_MASK;

/// Packs a window id and a count.
#[inline]
pub(crate) fn encode(window: u32, count: u64) -> u64 {
    debug_assert!(count <= COUNT_MASK);
    (u64::from(window) << WINDOW_SHIFT) | count
}

/// Unpacks `(window, count)`.
#[inline]
pub(crate) fn decode(state: u64) -> (u32, u64) {
    ((state >> WINDOW_SHIFT) as u32, state & COUNT_MASK)
}

/// The effective `(window, count, ns until that window ends)` at `now`.
#[inline]
fn effective(state: u64, now: u64, rule: &Rule) -> (u32, u64, u64) {
    let (w, e) = window_of(now, rule.phase, rule.period);
    let w = w as u32;
    let (sw, count) = decode(state);
    let ahead = sw.wrapping_sub(w);
    if ahead == 0 {
        (w, count, rule.period - e)
    } else if ahead <= MAX_AHEAD {
        // The clock went back into an earlier window: keep counting in the stored one.
        let lead = u64::from(ahead).saturating_mul(rule.period);
        (sw, count, (rule.period - e).saturating_add(lead))
    } else {
        // A later window (or one so far ahead it can only be an old id that wrapped): fresh.
        (w, 0, rule.period - e)
    }
}

/// Decides a cost-`cost` request at `now`.
#[inline]
pub(crate) fn decide(state: u64, now: u64, cost: u64, rule: &Rule, headroom: u64) -> Step<u64> {
    let (window, count, left) = effective(state, now, rule);
    let cap = rule.limit - headroom;
    let after = count + cost;
    if after <= cap {
        // Nothing in the window (a report of cost 0 on an empty one): already full.
        let reset = if after == 0 { 0 } else { left };
        Step::allow(encode(window, after), rule.limit, cap - after, reset, 0)
    } else {
        let reset = if count == 0 { 0 } else { left };
        Step::deny(rule.limit, cap.saturating_sub(count), reset, left)
    }
}

/// True when the state holds nothing for the current window.
#[inline]
pub(crate) fn is_fresh(state: u64, now: u64, rule: &Rule) -> bool {
    effective(state, now, rule).1 == 0
}

/// The earliest moment from `now` on at which the state can be fresh: `now` if it is, else
/// the end of `now`'s window (see [`super::window_end`]).
pub(crate) fn fresh_from(state: u64, now: u64, rule: &Rule) -> u64 {
    if is_fresh(state, now, rule) {
        now
    } else {
        super::window_end(now, rule)
    }
}

/// The window a charge at `now` landed in (the refund token).
#[inline]
pub(crate) fn token(state: u64) -> u64 {
    u64::from(decode(state).0)
}

/// Takes back `cost` charged in window `token`; nothing if that window has already ended.
#[inline]
pub(crate) fn refund(state: u64, cost: u64, token: u64) -> u64 {
    let (sw, count) = decode(state);
    if u64::from(sw) == token {
        encode(sw, count.saturating_sub(cost))
    } else {
        state
    }
}

/// Carries a key across a quota change: what it spent in its current window stays spent in the
/// new rule's current window.
pub(crate) fn migrate(state: u64, now: u64, old: &Rule, new: &Rule) -> u64 {
    if old.period == new.period && old.phase == new.phase {
        // Same windows: keep the state as it is (a stale `now` must not move a newer window's
        // count back into an older one).
        return state;
    }
    let (_, count, _) = effective(state, now, old);
    let (w, _) = window_of(now, new.phase, new.period);
    encode(w as u32, count.min(MAX_LIMIT))
}
