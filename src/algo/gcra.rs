//! GCRA, the generic cell rate algorithm: the token bucket (and the leaky bucket as a meter) in
//! time arithmetic.
//!
//! State is the theoretical arrival time `TAT` in ns. With emission interval `T` and tolerance
//! `tau = burst * T`, a cost-`n` request at `t` is admitted iff `max(TAT, t) + n*T - t <= tau`;
//! then `TAT' = max(TAT, t) + n*T`. `TAT - t` (when positive) is the bucket's debt: the leaky
//! bucket's water level, or the token bucket's missing tokens, times `T`.

use super::{Rule, Step};

/// Decides a cost-`cost` request at `now`; `headroom` units stay unavailable to this caller
/// (the priority strategy).
#[inline(always)]
pub(crate) fn decide(tat: u64, now: u64, cost: u64, rule: &Rule, headroom: u64) -> Step<u64> {
    let t = rule.emission;
    let tau = rule.tolerance - headroom * t;
    let base = tat.max(now);
    let debt = base - now;
    let new_tat = base.saturating_add(cost * t);
    let need = new_tat - now;
    if need <= tau {
        Step::allow(
            new_tat,
            rule.capacity,
            rule.per_emission.divide(tau - need),
            need,
            0,
        )
    } else {
        Step::deny(rule.capacity, remaining(tau, debt, rule), debt, need - tau)
    }
}

/// Whole units a bucket holding `debt` can still spend: `(tau - debt) / T`. A denied request
/// usually leaves less than one unit (it was denied because `debt + cost*T > tau`; for a cost
/// of one that means less than one), so the division is skipped then.
#[inline(always)]
fn remaining(tau: u64, debt: u64, rule: &Rule) -> u64 {
    let room = tau.saturating_sub(debt);
    if room < rule.emission {
        0
    } else {
        rule.per_emission.divide(room)
    }
}

/// The leaky bucket as a queue (nginx `limit_req` without `nodelay`): the request is admitted
/// for the moment it conforms, `max(TAT, now) + n*T - tau`, if that is at most `max_delay_ns`
/// away; the decision's `delay` says how long to wait.
#[inline]
pub(crate) fn reserve(
    tat: u64,
    now: u64,
    cost: u64,
    rule: &Rule,
    max_delay_ns: u64,
    headroom: u64,
) -> Step<u64> {
    let t = rule.emission;
    let tau = rule.tolerance - headroom * t;
    let base = tat.max(now);
    let Some(new_tat) = base.checked_add(cost * t) else {
        // A queue reaching past the end of time (u64 ns): no moment can be reserved, and a
        // saturated TAT would hand the same moment out again and again. Never, as a denial.
        let debt = base - now;
        return Step::deny(
            rule.capacity,
            remaining(tau, debt, rule),
            debt,
            u64::MAX - now,
        );
    };
    let conform = new_tat.saturating_sub(tau);
    let delay = conform.saturating_sub(now);
    if delay <= max_delay_ns {
        let at = now + delay;
        let remaining = rule.per_emission.divide(tau - (new_tat - at));
        Step::allow(new_tat, rule.capacity, remaining, new_tat - now, delay)
    } else {
        let debt = base - now;
        Step::deny(
            rule.capacity,
            remaining(tau, debt, rule),
            debt,
            delay - max_delay_ns,
        )
    }
}

/// True when the state is indistinguishable from a key never seen: its debt has run out.
#[inline]
pub(crate) fn is_fresh(tat: u64, now: u64) -> bool {
    tat <= now
}

/// The first moment from `now` on at which the state is fresh: when its debt runs out.
#[inline]
pub(crate) fn fresh_from(tat: u64, now: u64) -> u64 {
    tat.max(now)
}

/// Takes back a charge of `cost` that wrote `written` (a compound limit whose other part
/// denied), at `now`. Only what is left of that charge comes back: the part of it that has
/// already drained (`written - now` is less than `cost * T`) is gone, and others' charges made
/// in between stay, so a refund never hands out time that was not ours.
#[inline]
pub(crate) fn refund(tat: u64, cost: u64, rule: &Rule, written: u64, now: u64) -> u64 {
    let left = (cost * rule.emission).min(written.saturating_sub(now));
    tat.saturating_sub(left)
}

/// Carries a key's state across a quota change: the units it has spent stay spent, measured in
/// the new rule's emission interval, capped at the new tolerance.
pub(crate) fn migrate(tat: u64, now: u64, old: &Rule, new: &Rule) -> u64 {
    let debt = tat.saturating_sub(now);
    if debt == 0 {
        return 0;
    }
    let scaled = u128::from(debt) * u128::from(new.emission) / u128::from(old.emission);
    now + u64::try_from(scaled).unwrap_or(u64::MAX).min(new.tolerance)
}
