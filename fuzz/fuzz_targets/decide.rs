//! Raw state, time, cost and parameters straight into each pure algorithm (`algo/*`, through
//! `tollgate::fuzz_api`): no panic, no overflow (the fuzz build has overflow checks), and the
//! invariants hold, exactly:
//!
//! - purity: the same inputs give the same outcome;
//! - an admission writes a state, a denial writes none;
//! - `remaining` is exact: `remaining` more units pass at the same moment, one more does not;
//! - `retry_after` is exact: the same request passes that much later, not a nanosecond sooner;
//! - `reset_after` is exact: the state is fresh that much later, not a nanosecond sooner;
//! - the queue's `delay` is exact and at most the maximum asked; a denied reservation passes
//!   `retry_after` later;
//! - a refund right after a charge gives back exactly the state's answers before it;
//! - a migration to the same rules keeps the state; a bucket's carried debt is within the new
//!   tolerance;
//! - the log admits at most `limit` units in any interval of length `period`, through arbitrary
//!   clock moves, forwards and back.
#![no_main]
use std::time::Duration;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use tollgate::fuzz_api::{FuzzLog, FuzzRule, Outcome};
use tollgate::{Algorithm, Decision, Quota};

/// Times stay below 2^63 ns: the limiter clamps every clock reading there.
const MAX_NOW: u64 = (1 << 63) - 1;

fn rule(u: &mut Unstructured) -> Result<Option<FuzzRule>> {
    let alg = Algorithm::ALL[usize::from(u.arbitrary::<u8>()?) % Algorithm::ALL.len()];
    let limit = match u.arbitrary::<u8>()? % 4 {
        0 => u.arbitrary::<u64>()?,
        _ => u.int_in_range(1..=20)?,
    };
    let period = match u.arbitrary::<u8>()? % 4 {
        0 => u.arbitrary::<u64>()?,
        1 => u.int_in_range(1..=10_000)?,
        2 => 1_000_000_000,
        _ => u.int_in_range(1..=100_000_000_000)?,
    };
    let burst = match u.arbitrary::<u8>()? % 4 {
        0 => u.arbitrary::<u64>()?,
        _ => u.int_in_range(1..=20)?,
    };
    let epoch = u.arbitrary::<u64>()?;
    let quota = Quota::new(limit, Duration::from_nanos(period))
        .burst(burst)
        .algorithm(alg);
    Ok(FuzzRule::new(quota, epoch).ok())
}

fn time(u: &mut Unstructured, near: u64) -> Result<u64> {
    Ok(match u.arbitrary::<u8>()? % 4 {
        0 => u.arbitrary::<u64>()? & MAX_NOW,
        1 => near
            .saturating_add(u.int_in_range(0..=1_000_000_000)?)
            .min(MAX_NOW),
        2 => near.saturating_sub(u.int_in_range(0..=1_000_000_000)?),
        _ => near,
    })
}

/// `now + d` if it is still a valid time.
fn later(now: u64, d: u64) -> Option<u64> {
    now.checked_add(d).filter(|&t| t <= MAX_NOW)
}

/// The inputs of the check running now, printed by the panic hook if an assertion fails
/// (libFuzzer aborts on a panic, so nothing unwinds).
static CONTEXT: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

fn set_context(text: String) {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Ok(c) = CONTEXT.try_lock() {
                eprintln!("failing case: {c}");
            }
            previous(info);
        }));
    });
    *CONTEXT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = text;
}

fn check_word(r: &FuzzRule, u: &mut Unstructured) -> Result<()> {
    let cap = r.capacity();
    let headroom = u.int_in_range(0..=cap - 1)?;
    let usable = cap - headroom;
    let now = time(u, 1_000_000_000_000)?;
    // A raw state, or one a few admissions around `now` (clock going back included) wrote.
    let mut state = 0;
    if u.arbitrary::<bool>()? {
        state = u.arbitrary()?;
    } else {
        for _ in 0..u.int_in_range(0..=4)? {
            let t = time(u, now)?;
            let c = u.int_in_range(1..=usable)?;
            if let (_, Some(next)) = r.decide(state, t, c, 0) {
                state = next;
            }
        }
    }
    let cost = u.int_in_range(1..=usable)?;
    set_context(format!(
        "{r:?}, state {state:#x}, now {now}, cost {cost}, headroom {headroom}"
    ));
    let out = r.decide(state, now, cost, headroom);
    assert_eq!(out, r.decide(state, now, cost, headroom), "not pure");
    let (d, next) = out;
    check_decision(r, &d, next, state, now, cost, headroom, usable);
    if let Some(next) = next {
        // A refund right after the charge restores every answer of the state before it.
        let back = r.refund(next, cost, r.token(next), now);
        for k in [1, cost, usable] {
            assert_eq!(
                r.decide(back, now, k, headroom),
                r.decide(state, now, k, headroom),
                "refund of {cost} did not restore the state's answer for {k}"
            );
        }
    }
    // Migration: the same rules keep the state (a later `now` must not move a newer window);
    // another rule of the same layout gets a state that decides without panicking, and a
    // bucket's carried debt is within the new tolerance.
    let same = r.migrate(state, now, r);
    let (_, tolerance) = r.emission_tolerance();
    if tolerance == 0 {
        assert_eq!(same, state, "a window migrated to its own rules changed");
    } else if state > now && state - now <= tolerance {
        assert_eq!(same, state, "a bucket migrated to its own rules changed");
    }
    if let Some(other) = rule(u)? {
        if r.same_kind(&other) && !other.is_log() {
            let m = r.migrate(state, now, &other);
            let (_, tolerance) = other.emission_tolerance();
            if tolerance > 0 && m > now {
                assert!(m - now <= tolerance, "carried debt above the new tolerance");
            }
            let _ = other.decide(m, now, 1, 0);
        }
    }
    if r.emission_tolerance().0 > 0 {
        check_reserve(r, u, state, now, cost, headroom)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn check_decision(
    r: &FuzzRule,
    d: &Decision,
    next: Option<u64>,
    state: u64,
    now: u64,
    cost: u64,
    headroom: u64,
    usable: u64,
) {
    assert_eq!(d.limit(), r.capacity());
    assert!(d.remaining() <= usable, "remaining above what can pass");
    // The state whose answers the decision describes: after the charge, or unchanged.
    let after = match (d.is_allowed(), next) {
        (true, Some(next)) => {
            assert_eq!(d.retry_after_ns(), 0);
            next
        }
        (false, None) => {
            assert!(d.retry_after_ns() > 0, "a denial must say when to retry");
            assert!(
                cost > d.remaining(),
                "denied while {} remain",
                d.remaining()
            );
            state
        }
        _ => panic!("an admission must write a state and a denial none: {d:?} {next:?}"),
    };
    // remaining is exact.
    let rem = d.remaining();
    if rem >= 1 {
        assert!(
            r.decide(after, now, rem, headroom).0.is_allowed(),
            "remaining {rem} do not pass"
        );
    }
    if rem < usable {
        assert!(
            !r.decide(after, now, rem + 1, headroom).0.is_allowed(),
            "more than remaining {rem} pass"
        );
    }
    // retry_after is exact.
    if !d.is_allowed() {
        let retry = d.retry_after_ns();
        if let Some(t) = later(now, retry) {
            assert!(
                r.decide(state, t, cost, headroom).0.is_allowed(),
                "denied at retry_after {retry}"
            );
            assert!(
                !r.decide(state, t - 1, cost, headroom).0.is_allowed(),
                "passes before retry_after {retry}"
            );
        }
    }
    // reset_after is exact.
    let reset = d.reset_after_ns();
    if let Some(t) = later(now, reset) {
        assert!(r.is_fresh(after, t), "not fresh at reset_after {reset}");
        if reset > 0 {
            assert!(
                !r.is_fresh(after, t - 1),
                "fresh before reset_after {reset}"
            );
        }
    }
}

fn check_reserve(
    r: &FuzzRule,
    u: &mut Unstructured,
    state: u64,
    now: u64,
    cost: u64,
    headroom: u64,
) -> Result<()> {
    let (t, tolerance) = r.emission_tolerance();
    let max_delay = match u.arbitrary::<u8>()? % 3 {
        0 => 0,
        1 => u.int_in_range(0..=t.saturating_mul(10))?,
        _ => u.arbitrary::<u64>()? >> 2,
    };
    let (d, next): Outcome = r.reserve(state, now, cost, max_delay, headroom);
    match next {
        Some(next) => {
            assert!(d.is_allowed());
            let delay = d.delay_ns();
            assert!(delay <= max_delay, "delay {delay} above {max_delay}");
            let at = now + delay;
            // Admitted within the bound at the moment it runs.
            assert!(
                next - at <= tolerance - headroom * t,
                "reservation beyond the burst"
            );
            // The delay is exact: the plain request conforms then, not a nanosecond sooner.
            if at <= MAX_NOW {
                assert!(
                    r.decide(state, at, cost, headroom).0.is_allowed(),
                    "delay too short"
                );
                if delay > 0 {
                    assert!(
                        !r.decide(state, at - 1, cost, headroom).0.is_allowed(),
                        "delay too long"
                    );
                }
            }
        }
        None => {
            assert!(!d.is_allowed());
            let retry = d.retry_after_ns();
            assert!(retry > 0);
            if let Some(t) = later(now, retry) {
                let (d2, _) = r.reserve(state, t, cost, max_delay, headroom);
                assert!(
                    d2.is_allowed(),
                    "reservation still denied at retry_after {retry}"
                );
            }
        }
    }
    Ok(())
}

/// A log through arbitrary clock moves: while the clock moves forward, every admission keeps at
/// most `limit` units in any interval of length `period` (counted on the stamps the log wrote);
/// remaining and retry_after exact throughout; refunds taken back.
fn check_log(r: &FuzzRule, u: &mut Unstructured) -> Result<()> {
    let cap = r.capacity();
    let p = r.period();
    let mut log = FuzzLog::default();
    // Everything admitted: (stamp, cost).
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    let mut now: u64 = u.int_in_range(0..=1_000_000_000_000)?;
    for _ in 0..u.int_in_range(1..=64)? {
        now = match u.arbitrary::<u8>()? % 4 {
            0 => {
                // The clock went back: "any interval" is measured on a monotone clock, so the
                // window check starts over (decisions must stay exact and panic-free).
                admitted.clear();
                now.saturating_sub(u.int_in_range(0..=p.saturating_mul(2))?)
            }
            1 => now,
            _ => now
                .saturating_add(u.int_in_range(0..=p.saturating_mul(2))?)
                .min(MAX_NOW),
        };
        let cost = u.int_in_range(1..=cap)?;
        log.expire(now, p);
        let d = r.decide_log(&log, now, cost, 0);
        assert_eq!(d, r.decide_log(&log, now, cost, 0), "not pure");
        let rem = d.remaining();
        if d.is_allowed() {
            let stamp = log.push(now, cost);
            assert!(stamp >= now);
            admitted.push((stamp, cost));
            // At most `cap` units stamped within any period ending at this stamp.
            let window: u64 = admitted
                .iter()
                .filter(|&&(s, _)| s <= stamp && stamp - s < p)
                .map(|&(_, c)| c)
                .sum();
            assert!(
                window <= cap,
                "{window} units within one period, limit {cap}"
            );
            if u.arbitrary::<bool>()? {
                log.refund(stamp, cost);
                admitted.pop();
            }
        } else {
            assert!(cost > rem);
            let retry = d.retry_after_ns();
            assert!(retry > 0);
            if let Some(t) = later(now, retry) {
                assert!(
                    r.decide_log(&log, t, cost, 0).is_allowed(),
                    "denied at retry_after"
                );
                assert!(
                    !r.decide_log(&log, t - 1, cost, 0).is_allowed(),
                    "passes before retry_after"
                );
            }
        }
        // remaining is exact (on the log as it is now).
        let d = r.decide_log(&log, now, 1, 0);
        let rem = d.remaining();
        if d.is_allowed() {
            assert!(
                r.decide_log(&log, now, rem + 1, 0).is_allowed(),
                "remaining after one more"
            );
            if rem + 2 <= cap {
                assert!(!r.decide_log(&log, now, rem + 2, 0).is_allowed());
            }
        } else {
            assert_eq!(rem, 0);
        }
        let reset = d.reset_after_ns();
        if !d.is_allowed() {
            if let Some(t) = later(now, reset) {
                assert!(log.is_fresh(t, p), "not fresh at reset_after");
            }
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(Some(r)) = rule(&mut u) else {
        return;
    };
    let _ = if r.is_log() {
        check_log(&r, &mut u)
    } else {
        check_word(&r, &mut u)
    };
});
