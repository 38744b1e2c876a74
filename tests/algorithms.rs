//! Hand-computed decision tables for every algorithm, through the public API only.
//!
//! Every table row asserts all seven fields of a [`Decision`]: `is_allowed`, `reason`, `limit`,
//! `remaining`, `reset_after_ns`, `retry_after_ns` and `delay_ns`. The values are worked out by
//! hand from the documented integer semantics (see `src/algo/*.rs` and DESIGN.md "Semantics"):
//!
//! - GCRA (token bucket, leaky bucket meter): `T = ceil(period / limit)`, `tau = burst * T`; a
//!   cost-`n` request at `t` passes iff `max(TAT, t) + n*T - t <= tau`.
//! - Fixed window: windows `floor(unix_ns / period)`, at most `limit` units in each.
//! - Sliding window counter: passes iff `prev * (P - e) + (cur + n) * P <= limit * P`.
//! - Sliding window log: at most `limit` units in any interval of length `period`.
//!
//! [`FakeClock::new`] starts at Unix second 1_700_006_400, a whole day, so windows of 1 s, 1 min,
//! 1 h and 1 d all start at `t = 0`.

use std::time::Duration;

use tollgate::{
    Algorithm, Builder, Clock, Decision, Error, FAKE_UNIX_EPOCH_S, FakeClock, Limiter, PlanId,
    Quota, Reason, Strategy,
};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// All seven fields of a decision, in a comparable tuple:
/// `(allowed, reason, limit, remaining, reset_after_ns, retry_after_ns, delay_ns)`.
type Fields = (bool, Reason, u64, u64, u64, u64, u64);

fn fields(d: &Decision) -> Fields {
    (
        d.is_allowed(),
        d.reason(),
        d.limit(),
        d.remaining(),
        d.reset_after_ns(),
        d.retry_after_ns(),
        d.delay_ns(),
    )
}

/// An admission: no retry, no delay.
fn allow(limit: u64, remaining: u64, reset: u64) -> Fields {
    (true, Reason::Within, limit, remaining, reset, 0, 0)
}

/// A reservation admitted after `delay`.
fn queued(limit: u64, remaining: u64, reset: u64, delay: u64) -> Fields {
    (true, Reason::Within, limit, remaining, reset, 0, delay)
}

/// A denial over the quota.
fn deny(limit: u64, remaining: u64, reset: u64, retry: u64) -> Fields {
    (false, Reason::Limited, limit, remaining, reset, retry, 0)
}

#[track_caller]
fn expect(d: Decision, want: Fields) {
    assert_eq!(
        fields(&d),
        want,
        "(allowed, reason, limit, remaining, reset_after_ns, retry_after_ns, delay_ns)"
    );
}

fn builder(q: Quota, clock: &FakeClock) -> Builder<u64, FakeClock> {
    Limiter::<u64>::builder().quota(q).clock(clock.clone())
}

fn limiter(q: Quota, clock: &FakeClock) -> Limiter<u64, FakeClock> {
    builder(q, clock).build().expect("valid quota")
}

/// Checks that a denial's `retry_after` is exact, without charging anything: one nanosecond
/// earlier the same request is still denied, at `retry_after` it passes. Word cells only (the
/// sliding window log expires entries when looked at, so it is checked by moving forward).
#[track_caller]
fn assert_retry_exact(l: &Limiter<u64, FakeClock>, clock: &FakeClock, key: u64, cost: u64) {
    let now = clock.now();
    let d = l.peek_in(&key, PlanId::DEFAULT, cost).unwrap();
    assert!(!d.is_allowed(), "the request must be denied now");
    let r = d.retry_after_ns();
    assert!(r > 0);
    clock.set_ns(now + r - 1);
    let before = l.peek_in(&key, PlanId::DEFAULT, cost).unwrap();
    assert!(
        !before.is_allowed(),
        "one ns before retry_after ({r} ns) it must still be denied"
    );
    assert_eq!(before.retry_after_ns(), 1, "one ns before: retry in 1 ns");
    clock.set_ns(now + r);
    assert!(
        l.peek_in(&key, PlanId::DEFAULT, cost).unwrap().is_allowed(),
        "at retry_after ({r} ns) it must pass"
    );
    clock.set_ns(now);
}

// ---------------------------------------------------------------------------------------------
// Token bucket (GCRA)
// ---------------------------------------------------------------------------------------------

/// 10/s, burst 3: T = 100 ms, tau = 300 ms.
#[test]
fn token_bucket_table() {
    let clock = FakeClock::new();
    let l = limiter(Quota::per_second(10).burst(3), &clock);
    // t = 0: TAT 0 -> 100 -> 200 -> 300 ms; need = TAT' - t.
    expect(l.check(&1), allow(3, 2, 100 * MS));
    expect(l.check(&1), allow(3, 1, 200 * MS));
    expect(l.check(&1), allow(3, 0, 300 * MS));
    // need = 400 ms > 300 ms: retry after 100 ms; the debt (reset) is still 300 ms.
    expect(l.check(&1), deny(3, 0, 300 * MS, 100 * MS));
    assert_retry_exact(&l, &clock, 1, 1);
    // A denial changed nothing.
    expect(l.check(&1), deny(3, 0, 300 * MS, 100 * MS));

    // 99.999999 ms later: 1 ns short.
    clock.advance_ns(100 * MS - 1);
    expect(l.check(&1), deny(3, 0, 200 * MS + 1, 1));
    clock.advance_ns(1);
    // t = 100 ms: debt 200 ms, one more admitted, TAT 400 ms.
    expect(l.check(&1), allow(3, 0, 300 * MS));
    expect(l.check(&1), deny(3, 0, 300 * MS, 100 * MS));

    // t = 250 ms: debt 150 ms, one more (need 250 ms, remaining floor(50/100) = 0).
    clock.advance(Duration::from_millis(150));
    expect(l.check(&1), allow(3, 0, 250 * MS));
    // need 350 ms: retry 50 ms.
    expect(l.check(&1), deny(3, 0, 250 * MS, 50 * MS));

    // t = 1 s: long idle, the bucket is full again (never more than burst).
    clock.set_ns(S);
    expect(l.check(&1), allow(3, 2, 100 * MS));

    // Another key is independent.
    expect(l.check(&2), allow(3, 2, 100 * MS));
}

/// Cost `n` charges `n * T`; a cost above the burst can never pass and is an error.
#[test]
fn token_bucket_cost_n_and_errors() {
    let clock = FakeClock::new();
    let l = limiter(Quota::per_second(10).burst(3), &clock);
    expect(l.check_n(&1, 2).unwrap(), allow(3, 1, 200 * MS));
    // need = 200 + 200 = 400 > 300: retry 100 ms; remaining (300 - 200) / 100 = 1.
    expect(l.check_n(&1, 2).unwrap(), deny(3, 1, 200 * MS, 100 * MS));
    assert_retry_exact(&l, &clock, 1, 2);
    // A cost that fits passes.
    expect(l.check_n(&1, 1).unwrap(), allow(3, 0, 300 * MS));
    // The whole burst needs a full bucket: 300 ms from now.
    expect(l.check_n(&1, 3).unwrap(), deny(3, 0, 300 * MS, 300 * MS));
    assert_retry_exact(&l, &clock, 1, 3);
    clock.advance(Duration::from_millis(300));
    expect(l.check_n(&1, 3).unwrap(), allow(3, 0, 300 * MS));

    assert_eq!(
        l.check_n(&1, 4),
        Err(Error::CostExceedsCapacity {
            cost: 4,
            capacity: 3
        })
    );
    let msg = l.check_n(&1, 4).unwrap_err().to_string();
    assert!(msg.contains('4') && msg.contains('3'), "{msg}");
    assert_eq!(l.check_n(&1, 0), Err(Error::ZeroCost));
    assert_eq!(
        l.reserve(&1, 0, Duration::from_secs(1)),
        Err(Error::ZeroCost)
    );
    assert_eq!(
        l.reserve(&1, 4, Duration::from_secs(1)),
        Err(Error::CostExceedsCapacity {
            cost: 4,
            capacity: 3
        })
    );
}

/// T is rounded up: 3 per second gives T = 333,333,334 ns, never faster than the quota.
#[test]
fn token_bucket_rounds_the_emission_interval_up() {
    let clock = FakeClock::new();
    let l = limiter(Quota::per_second(3).burst(1), &clock);
    let t = 333_333_334;
    expect(l.check(&1), allow(1, 0, t));
    expect(l.check(&1), deny(1, 0, t, t));
    clock.set_ns(t - 1);
    expect(l.check(&1), deny(1, 0, 1, 1));
    clock.set_ns(t);
    expect(l.check(&1), allow(1, 0, t));
    clock.set_ns(2 * t);
    expect(l.check(&1), allow(1, 0, t));
    // Three admitted at 0, T and 2T; a fourth would need 3T = 1 s + 2 ns: at 1 s it is 2 ns
    // early, so no interval of 1 s ever holds more than 3.
    clock.set_ns(S);
    expect(l.check(&1), deny(1, 0, 2, 2));
}

/// The leaky bucket meter is the same automaton: identical decisions, field by field.
#[test]
fn leaky_bucket_meter_equals_token_bucket() {
    let clock = FakeClock::new();
    let tb = limiter(Quota::per_second(10).burst(3), &clock);
    let lb = limiter(
        Quota::per_second(10)
            .burst(3)
            .algorithm(Algorithm::LeakyBucket),
        &clock,
    );
    // The same table as `token_bucket_table`, on both.
    let table: [(u64, u64, Fields); 9] = [
        (0, 1, allow(3, 2, 100 * MS)),
        (0, 1, allow(3, 1, 200 * MS)),
        (0, 1, allow(3, 0, 300 * MS)),
        (0, 1, deny(3, 0, 300 * MS, 100 * MS)),
        (100 * MS - 1, 1, deny(3, 0, 200 * MS + 1, 1)),
        (1, 1, allow(3, 0, 300 * MS)),
        (150 * MS, 2, deny(3, 1, 150 * MS, 50 * MS)),
        (50 * MS, 2, allow(3, 0, 300 * MS)),
        (S, 3, allow(3, 0, 300 * MS)),
    ];
    for (i, (advance, cost, want)) in table.into_iter().enumerate() {
        clock.advance_ns(advance);
        let a = tb.check_n(&9, cost).unwrap();
        let b = lb.check_n(&9, cost).unwrap();
        assert_eq!(fields(&a), want, "token bucket, row {i}");
        assert_eq!(fields(&b), want, "leaky bucket, row {i}");
    }
}

// ---------------------------------------------------------------------------------------------
// Fixed window
// ---------------------------------------------------------------------------------------------

/// 10 per minute: the window [0, 60 s) then [60 s, 120 s). 10 at 59 s and 10 at 60 s: the 2x
/// boundary burst is real (20 admitted within one nanosecond).
#[test]
fn fixed_window_table_and_boundary_burst() {
    let clock = FakeClock::new();
    let l = limiter(
        Quota::per_minute(10).algorithm(Algorithm::FixedWindow),
        &clock,
    );
    // First request at t = 0: the window ends in 60 s.
    expect(l.check(&1), allow(10, 9, 60 * S));

    // t = 59 s: 9 more fill the window; reset is when the window ends, 1 s away.
    clock.set_ns(59 * S);
    for remaining in (0..9).rev() {
        expect(l.check(&1), allow(10, remaining, S));
    }
    expect(l.check(&1), deny(10, 0, S, S));
    assert_retry_exact(&l, &clock, 1, 1);

    // Fresh key: 10 at the very end of the window...
    clock.set_ns(60 * S - 1);
    for remaining in (0..10).rev() {
        expect(l.check(&2), allow(10, remaining, 1));
    }
    expect(l.check(&2), deny(10, 0, 1, 1));
    // ... and 10 more one nanosecond later, at the start of the next one.
    clock.advance_ns(1);
    for remaining in (0..10).rev() {
        expect(l.check(&2), allow(10, remaining, 60 * S));
    }
    expect(l.check(&2), deny(10, 0, 60 * S, 60 * S));

    // Costs: 4 then 7 does not fit (6 left); the denial reports what is left.
    clock.set_ns(120 * S + 30 * S);
    expect(l.check_n(&3, 4).unwrap(), allow(10, 6, 30 * S));
    expect(l.check_n(&3, 7).unwrap(), deny(10, 6, 30 * S, 30 * S));
    assert_retry_exact(&l, &clock, 3, 7);
    expect(l.check_n(&3, 6).unwrap(), allow(10, 0, 30 * S));
    assert_eq!(
        l.check_n(&3, 11),
        Err(Error::CostExceedsCapacity {
            cost: 11,
            capacity: 10
        })
    );
}

/// Windows follow Unix time, not the limiter's start: with the clock's epoch 45 s into a
/// minute, the first window ends 15 s after the start.
#[test]
fn fixed_window_aligned_to_unix_time() {
    let clock = FakeClock::with_unix_epoch(Duration::from_secs(FAKE_UNIX_EPOCH_S + 45));
    let l = limiter(
        Quota::per_minute(2).algorithm(Algorithm::FixedWindow),
        &clock,
    );
    expect(l.check(&1), allow(2, 1, 15 * S));
    expect(l.check(&1), allow(2, 0, 15 * S));
    expect(l.check(&1), deny(2, 0, 15 * S, 15 * S));
    clock.set_ns(15 * S);
    expect(l.check(&1), allow(2, 1, 60 * S));

    // The seed's Redis key `ratelimit:ip:28421876` is the minute floor(unix / 60) = 28421876.
    // A clock started one second before that minute ends sees its window close after 1 s.
    let clock = FakeClock::with_unix_epoch(Duration::from_secs(28_421_876 * 60 + 59));
    let l = limiter(
        Quota::per_minute(1).algorithm(Algorithm::FixedWindow),
        &clock,
    );
    expect(l.check(&1), allow(1, 0, S));
    expect(l.check(&1), deny(1, 0, S, S));
    clock.advance(Duration::from_secs(1)); // minute 28421877
    expect(l.check(&1), allow(1, 0, 60 * S));

    // Sub-second epochs align too: epoch at .250 s, 1 s windows end at t = 750 ms.
    let clock = FakeClock::with_unix_epoch(Duration::from_millis(FAKE_UNIX_EPOCH_S * 1000 + 250));
    let l = limiter(
        Quota::per_second(1).algorithm(Algorithm::FixedWindow),
        &clock,
    );
    expect(l.check(&1), allow(1, 0, 750 * MS));
    expect(l.check(&1), deny(1, 0, 750 * MS, 750 * MS));
}

// ---------------------------------------------------------------------------------------------
// Sliding window counter
// ---------------------------------------------------------------------------------------------

/// 10 per minute, P = 60 s. `est = prev * (P - e) + cur * P` (in unit-ns), passes iff
/// `est + n * P <= 10 * P`.
#[test]
fn sliding_window_counter_table() {
    let clock = FakeClock::new();
    let l = limiter(
        Quota::per_minute(10).algorithm(Algorithm::SlidingWindowCounter),
        &clock,
    );
    // Window 0, e = 0: cur = 1..10. The estimate is back to 0 when window 2 starts: 120 s.
    for remaining in (0..10).rev() {
        expect(l.check(&1), allow(10, remaining, 120 * S));
    }
    // cur + 1 > 10: only the next window can help. There prev = 10 weighs (P - e'') / P; need
    // 10 * (P - e'') <= 9 * P, so e'' >= P / 10 = 6 s: retry = 60 s + 6 s.
    expect(l.check(&1), deny(10, 0, 120 * S, 66 * S));
    assert_retry_exact(&l, &clock, 1, 1);

    // t = 66 s: window 1, e = 6 s: est = 10 * 54 s = 9 units; one more fits exactly.
    clock.set_ns(66 * S);
    // cur = 1 now: reset when window 2 ends (e = 6 s, left 54 s, + 60 s).
    expect(l.check(&1), allow(10, 0, 114 * S));
    // est = 10 * 54 + 60 = 600 = cap. Next request: cur + 1 = 2 <= 10, prev = 10:
    // q = (10 - 1 - 1) * P / 10 = 48 s; retry = P - q - e = 60 - 48 - 6 = 6 s.
    expect(l.check(&1), deny(10, 0, 114 * S, 6 * S));
    assert_retry_exact(&l, &clock, 1, 1);

    // t = 90 s: e = 30 s, est = 10 * 30 + 1 * 60 = 360 (6 units): 4 more fit.
    clock.set_ns(90 * S);
    for remaining in (0..4).rev() {
        expect(l.check(&1), allow(10, remaining, 90 * S));
    }
    // cur = 5: q = (10 - 5 - 1) * 60 / 10 = 24 s; retry = 60 - 24 - 30 = 6 s.
    expect(l.check(&1), deny(10, 0, 90 * S, 6 * S));
    assert_retry_exact(&l, &clock, 1, 1);
    // Cost 3: q = (10 - 5 - 3) * 60 / 10 = 12 s; retry = 60 - 12 - 30 = 18 s.
    expect(l.check_n(&1, 3).unwrap(), deny(10, 0, 90 * S, 18 * S));
    assert_retry_exact(&l, &clock, 1, 3);
    // Cost 6: cur + 6 > 10, next window: prev = 5, need 5 * (P - e'') <= 4 * P,
    // e'' >= 12 s: retry = (60 - 30) + 12 = 42 s.
    expect(l.check_n(&1, 6).unwrap(), deny(10, 0, 90 * S, 42 * S));
    assert_retry_exact(&l, &clock, 1, 6);

    // t = 120 s: window 2, prev = 5, e = 0: est = 5 units, 5 left.
    clock.set_ns(120 * S);
    expect(l.check_n(&1, 5).unwrap(), allow(10, 0, 120 * S));
    // t = 240 s: window 4; the counts of window 2 are two windows old: fresh.
    clock.set_ns(240 * S);
    expect(l.check(&1), allow(10, 9, 120 * S));
    // A denial at a moment with only prev counting: reset is the end of this window.
    // Cost 10 needs prev's weight entirely gone (q = 0): the next window.
    clock.set_ns(300 * S); // window 5, prev = 1, cur = 0
    expect(l.check_n(&1, 10).unwrap(), deny(10, 9, 60 * S, 60 * S));
    assert_retry_exact(&l, &clock, 1, 10);
}

/// Where the division does not come out even, the integer estimate and its retry are exact:
/// 4 per second, prev = 3, cost 2 needs `3 * (P - e) <= 2 * P`, i.e. e >= 333,333,333.3 ns.
#[test]
fn sliding_window_counter_rounding() {
    let clock = FakeClock::new();
    let l = limiter(
        Quota::per_second(4).algorithm(Algorithm::SlidingWindowCounter),
        &clock,
    );
    expect(l.check_n(&1, 3).unwrap(), allow(4, 1, 2 * S));
    // In window 0: cur 3 + 2 > 4; next window needs 3 * (P - e'') <= 2 * P:
    // q2 = floor(2e9 / 3) = 666,666,666, e'' >= 333,333,334: retry = 1 s + 333,333,334 ns.
    expect(
        l.check_n(&1, 2).unwrap(),
        deny(4, 1, 2 * S, S + 333_333_334),
    );
    assert_retry_exact(&l, &clock, 1, 2);

    clock.set_ns(S); // window 1, e = 0: est = 3 units
    expect(l.check_n(&1, 2).unwrap(), deny(4, 1, S, 333_333_334));
    assert_retry_exact(&l, &clock, 1, 2);
    clock.set_ns(S + 333_333_333);
    // est = 3 * 666,666,667 = 2,000,000,001: two units do not fit by 1 unit-ns.
    expect(l.check_n(&1, 2).unwrap(), deny(4, 1, S - 333_333_333, 1));
    clock.advance_ns(1);
    // est = 3 * 666,666,666 + 2e9 = 3,999,999,998 <= 4e9: remaining floor(2 / 1e9) = 0.
    expect(l.check_n(&1, 2).unwrap(), allow(4, 0, 2 * S - 333_333_334));
}

/// Admission is "after charging within the limit", stricter than the seed's `total < limit`:
/// with prev = 1 at 25% into the window (est 0.75), the seed admits while total 0.75 < 1; here
/// 0.75 + 1 > 1 is denied. Retry is at e = 100% of the window's weight gone: the next window.
#[test]
fn sliding_window_counter_is_stricter_than_the_seed() {
    let clock = FakeClock::new();
    let l = limiter(
        Quota::per_second(1).algorithm(Algorithm::SlidingWindowCounter),
        &clock,
    );
    expect(l.check(&1), allow(1, 0, 2 * S));
    clock.set_ns(S + 250 * MS);
    // q = (1 - 0 - 1) * P / 1 = 0: not in this window; next window, cur = 0: retry = left.
    expect(l.check(&1), deny(1, 0, 750 * MS, 750 * MS));
    assert_retry_exact(&l, &clock, 1, 1);
}

// ---------------------------------------------------------------------------------------------
// Sliding window log
// ---------------------------------------------------------------------------------------------

/// 3 per second, exact: an entry admitted at `s` counts while `t - s < 1 s`.
#[test]
fn sliding_window_log_table() {
    let clock = FakeClock::new();
    let l = limiter(
        Quota::per_second(3).algorithm(Algorithm::SlidingWindowLog),
        &clock,
    );
    // Entries at 0, 200 ms, 400 ms. Reset after an admission: the newest entry's expiry.
    expect(l.check(&1), allow(3, 2, S));
    clock.set_ns(200 * MS);
    expect(l.check(&1), allow(3, 1, S));
    clock.set_ns(400 * MS);
    expect(l.check(&1), allow(3, 0, S));
    // t = 500 ms: full. The oldest entry (0) leaves at 1 s: retry 500 ms; the newest at 1.4 s.
    clock.set_ns(500 * MS);
    expect(l.check(&1), deny(3, 0, 900 * MS, 500 * MS));
    // Cost 2 needs the two oldest gone: 200 ms + 1 s.
    expect(l.check_n(&1, 2).unwrap(), deny(3, 0, 900 * MS, 700 * MS));
    // Cost 3: all three: 1.4 s.
    expect(l.check_n(&1, 3).unwrap(), deny(3, 0, 900 * MS, 900 * MS));
    // One ns before 1 s: still denied, retry 1 ns.
    clock.set_ns(S - 1);
    expect(l.check(&1), deny(3, 0, 400 * MS + 1, 1));
    // At 1 s the entry at 0 no longer counts (t - s = P).
    clock.set_ns(S);
    expect(l.check(&1), allow(3, 0, S));
    // Entries 200 ms, 400 ms, 1 s. At 1.3 s the 200 ms one is gone: cost 2 needs 1 more unit
    // freed, which the 400 ms entry does at 1.4 s.
    clock.set_ns(1_300 * MS);
    expect(l.check_n(&1, 2).unwrap(), deny(3, 1, 700 * MS, 100 * MS));
    clock.set_ns(1_400 * MS - 1);
    expect(l.check_n(&1, 2).unwrap(), deny(3, 1, 600 * MS + 1, 1));
    clock.advance_ns(1);
    expect(l.check_n(&1, 2).unwrap(), allow(3, 0, S));
    // Entries 1 s (cost 1) and 1.4 s (cost 2): a cost-2 entry leaves as one.
    clock.set_ns(1_500 * MS);
    expect(l.check(&1), deny(3, 0, 900 * MS, 500 * MS));
    expect(l.check_n(&1, 3).unwrap(), deny(3, 0, 900 * MS, 900 * MS));
}

/// The log has no boundary burst: 3 at 0.9 s, and at 1.0 s nothing more, unlike the window.
#[test]
fn sliding_window_log_has_no_boundary_burst() {
    let clock = FakeClock::new();
    let log = limiter(
        Quota::per_second(3).algorithm(Algorithm::SlidingWindowLog),
        &clock,
    );
    let fixed = limiter(
        Quota::per_second(3).algorithm(Algorithm::FixedWindow),
        &clock,
    );
    clock.set_ns(900 * MS);
    for remaining in (0..3).rev() {
        expect(log.check(&1), allow(3, remaining, S));
        expect(fixed.check(&1), allow(3, remaining, 100 * MS));
    }
    clock.set_ns(S);
    expect(log.check(&1), deny(3, 0, 900 * MS, 900 * MS));
    expect(fixed.check(&1), allow(3, 2, S));
}

// ---------------------------------------------------------------------------------------------
// The leaky bucket as a queue, and nginx
// ---------------------------------------------------------------------------------------------

/// nginx `limit_req zone=mylimit rate=10r/s burst=20` (no `nodelay`): requests beyond the rate
/// are delayed, up to 20 of them queued. In tollgate: `Quota::per_second(10).burst(1)` with
/// `reserve(.., max_delay = 20 * 100 ms)`: 21 requests at once get delays 0, 100 ms, ..., 2 s,
/// and the 22nd is denied.
#[test]
fn nginx_burst_without_nodelay_is_reserve() {
    let clock = FakeClock::new();
    let l = limiter(Quota::per_second(10).burst(1), &clock);
    let max_delay = Duration::from_millis(20 * 100);
    for i in 0..=20u64 {
        // Admitted for the moment i * 100 ms; TAT' = (i + 1) * 100 ms.
        let d = l.reserve(&1, 1, max_delay).unwrap();
        expect(d, queued(1, 0, (i + 1) * 100 * MS, i * 100 * MS));
    }
    // The 22nd would wait 2.1 s > 2 s: denied; in 100 ms the wait would be 2 s.
    expect(
        l.reserve(&1, 1, max_delay).unwrap(),
        deny(1, 0, 2_100 * MS, 100 * MS),
    );
    clock.advance_ns(100 * MS - 1);
    expect(
        l.reserve(&1, 1, max_delay).unwrap(),
        deny(1, 0, 2_000 * MS + 1, 1),
    );
    clock.advance_ns(1);
    expect(
        l.reserve(&1, 1, max_delay).unwrap(),
        queued(1, 0, 2_100 * MS, 2_000 * MS),
    );
    // check() on a key with queued reservations is denied until its debt drains.
    expect(l.check(&1), deny(1, 0, 2_100 * MS, 2_100 * MS));
    // Reservations keep the rate: at t = 100 ms + 2.1 s the key is idle again.
    clock.advance(Duration::from_millis(2_100));
    expect(
        l.reserve(&1, 1, max_delay).unwrap(),
        queued(1, 0, 100 * MS, 0),
    );
}

/// nginx `burst=20 nodelay`: 1 + 20 requests pass at once, the 22nd is rejected, and the slots
/// come back at the rate. In tollgate: `Quota::per_second(10).burst(21)` with `check()`.
#[test]
fn nginx_burst_with_nodelay_is_check() {
    let clock = FakeClock::new();
    let l = limiter(Quota::per_second(10).burst(21), &clock);
    for i in 0..21u64 {
        expect(l.check(&1), allow(21, 20 - i, (i + 1) * 100 * MS));
    }
    expect(l.check(&1), deny(21, 0, 2_100 * MS, 100 * MS));
    clock.advance(Duration::from_millis(100));
    expect(l.check(&1), allow(21, 0, 2_100 * MS));
    expect(l.check(&1), deny(21, 0, 2_100 * MS, 100 * MS));
}

/// The queue strategy on the builder turns `check()` into a reservation.
#[test]
fn queue_strategy_makes_check_reserve() {
    let clock = FakeClock::new();
    let l = builder(Quota::per_second(10).burst(1), &clock)
        .strategy(Strategy::Queue {
            max_delay: Duration::from_millis(200),
        })
        .build()
        .unwrap();
    expect(l.check(&1), queued(1, 0, 100 * MS, 0));
    expect(l.check(&1), queued(1, 0, 200 * MS, 100 * MS));
    expect(l.check(&1), queued(1, 0, 300 * MS, 200 * MS));
    expect(l.check(&1), deny(1, 0, 300 * MS, 100 * MS));
}

/// Cost-n reservations: 10/s burst 2, reserve 3 units: conforms when TAT' - tau <= t.
#[test]
fn reserve_cost_n() {
    let clock = FakeClock::new();
    let l = limiter(Quota::per_second(10).burst(2), &clock);
    let max = Duration::from_millis(250);
    // Cost 2 fits the burst now.
    expect(l.reserve(&1, 2, max).unwrap(), queued(2, 0, 200 * MS, 0));
    // Cost 2 more: TAT' = 400 ms, conforms at 200 ms.
    expect(
        l.reserve(&1, 2, max).unwrap(),
        queued(2, 0, 400 * MS, 200 * MS),
    );
    // Cost 1 more: TAT' 500 ms, conforms at 300 ms > 250 ms: denied, 50 ms short.
    expect(
        l.reserve(&1, 1, max).unwrap(),
        deny(2, 0, 400 * MS, 50 * MS),
    );
    // A zero max_delay is a plain check.
    expect(
        l.reserve(&2, 2, Duration::ZERO).unwrap(),
        queued(2, 0, 200 * MS, 0),
    );
    expect(
        l.reserve(&2, 1, Duration::ZERO).unwrap(),
        deny(2, 0, 200 * MS, 100 * MS),
    );
}

/// Windows cannot schedule ahead: a reservation admits only what passes now, with no delay.
#[test]
fn windows_reserve_only_what_passes_now() {
    let clock = FakeClock::new();
    for algo in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
    ] {
        let l = limiter(Quota::per_second(2).algorithm(algo), &clock);
        let max = Duration::from_secs(10);
        let a = l.reserve(&1, 1, max).unwrap();
        let b = l.reserve(&1, 1, max).unwrap();
        let c = l.reserve(&1, 1, max).unwrap();
        assert!(a.is_allowed() && b.is_allowed(), "{algo:?}");
        assert_eq!((a.delay_ns(), b.delay_ns()), (0, 0), "{algo:?}");
        assert!(!c.is_allowed(), "{algo:?}");
        assert_eq!(c.delay_ns(), 0, "{algo:?}");
        assert_eq!(fields(&c), fields(&l.check(&1)), "{algo:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration errors
// ---------------------------------------------------------------------------------------------

#[track_caller]
fn build_err(q: Quota) -> Error {
    match builder(q, &FakeClock::new()).build() {
        Ok(_) => panic!("{q:?} must be rejected"),
        Err(e) => e,
    }
}

#[track_caller]
fn assert_names(e: &Error, parts: &[&str]) {
    let msg = e.to_string();
    for p in parts {
        assert!(msg.contains(p), "message {msg:?} must name {p:?}");
    }
}

#[test]
fn config_errors_name_the_value() {
    for algo in Algorithm::ALL {
        let e = build_err(Quota::per_second(0).algorithm(algo));
        assert_eq!(e, Error::ZeroLimit, "{algo:?}");
        assert_names(&e, &["limit", "0"]);

        let e = build_err(Quota::new(10, Duration::ZERO).algorithm(algo));
        assert_eq!(e, Error::ZeroPeriod, "{algo:?}");
        assert_names(&e, &["period", "0"]);

        let e = build_err(Quota::per_second(10).burst(0).algorithm(algo));
        assert_eq!(e, Error::ZeroBurst, "{algo:?}");
        assert_names(&e, &["burst", "0"]);
    }

    // More than one unit per nanosecond.
    for algo in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let e = build_err(Quota::new(2, Duration::from_nanos(1)).algorithm(algo));
        assert_eq!(
            e,
            Error::RateTooHigh {
                limit: 2,
                period_ns: 1
            }
        );
        assert_names(&e, &["2", "1 ns"]);
        let e = build_err(Quota::per_second(1_000_000_001).algorithm(algo));
        assert_eq!(
            e,
            Error::RateTooHigh {
                limit: 1_000_000_001,
                period_ns: S
            }
        );
        assert_names(&e, &["1000000001", "1000000000"]);
    }
    // Exactly one per nanosecond is fine.
    assert!(
        builder(Quota::new(1, Duration::from_nanos(1)), &FakeClock::new())
            .build()
            .is_ok()
    );

    // Sliding window counter: 22-bit counters, at most 4,194,303 per window.
    let q = Quota::per_second(4_194_303).algorithm(Algorithm::SlidingWindowCounter);
    assert!(builder(q, &FakeClock::new()).build().is_ok());
    let e = build_err(Quota::per_second(4_194_304).algorithm(Algorithm::SlidingWindowCounter));
    assert_eq!(
        e,
        Error::LimitTooLarge {
            algorithm: "sliding_window_counter",
            limit: 4_194_304,
            max: 4_194_303
        }
    );
    assert_names(&e, &["4194304", "sliding_window_counter", "4194303"]);

    // Sliding window log: O(limit) memory per key, capped at 65,536 entries.
    let q = Quota::per_minute(65_536).algorithm(Algorithm::SlidingWindowLog);
    assert!(builder(q, &FakeClock::new()).build().is_ok());
    let e = build_err(Quota::per_minute(65_537).algorithm(Algorithm::SlidingWindowLog));
    assert_eq!(
        e,
        Error::LimitTooLarge {
            algorithm: "sliding_window_log",
            limit: 65_537,
            max: 65_536
        }
    );
    assert_names(&e, &["65537", "sliding_window_log", "65536"]);

    // Fixed window: 32-bit counter.
    let e = build_err(Quota::per_hour(1 << 32).algorithm(Algorithm::FixedWindow));
    assert_eq!(
        e,
        Error::LimitTooLarge {
            algorithm: "fixed_window",
            limit: 1 << 32,
            max: (1 << 32) - 1
        }
    );
    assert_names(&e, &["4294967296", "fixed_window", "4294967295"]);

    // A burst whose credit would exceed 2^62 ns: 1 per 100 years allows a burst of 1 only.
    let century = Duration::from_secs(100 * 365 * 86_400);
    let e = build_err(Quota::new(1, century).burst(2));
    assert_eq!(e, Error::BurstTooLarge { burst: 2, max: 1 });
    assert_names(&e, &["burst 2", "1"]);

    // No quota at all.
    let e = match Limiter::<u64>::builder().clock(FakeClock::new()).build() {
        Ok(_) => panic!("a limiter without a quota must be rejected"),
        Err(e) => e,
    };
    assert_eq!(e, Error::NoQuota);
}

// ---------------------------------------------------------------------------------------------
// Extremes
// ---------------------------------------------------------------------------------------------

/// 1 per 100 years: T = 3,153,600,000 s in ns (3.15e18, below 2^62); no overflow anywhere.
#[test]
fn one_per_century() {
    let century = 100 * 365 * 86_400 * S;
    assert_eq!(century, 3_153_600_000_000_000_000);
    let q = Quota::new(1, Duration::from_nanos(century));

    for algo in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let clock = FakeClock::new();
        let l = limiter(q.algorithm(algo), &clock);
        expect(l.check(&1), allow(1, 0, century));
        expect(l.check(&1), deny(1, 0, century, century));
        assert_retry_exact(&l, &clock, 1, 1);
        clock.set_ns(century - 1);
        expect(l.check(&1), deny(1, 0, 1, 1));
        clock.set_ns(century);
        expect(l.check(&1), allow(1, 0, century));
        expect(l.check(&1), deny(1, 0, century, century));
    }

    // The windows are aligned to Unix time: the century window containing the fake epoch
    // (Unix 0 .. 3.15e18 ns) ends 3.1536e18 - 1.7000064e18 ns after the start.
    let left = century - FAKE_UNIX_EPOCH_S * S;
    let clock = FakeClock::new();
    let l = limiter(q.algorithm(Algorithm::FixedWindow), &clock);
    expect(l.check(&1), allow(1, 0, left));
    expect(l.check(&1), deny(1, 0, left, left));
    assert_retry_exact(&l, &clock, 1, 1);

    let clock = FakeClock::new();
    let l = limiter(q.algorithm(Algorithm::SlidingWindowCounter), &clock);
    expect(l.check(&1), allow(1, 0, left + century));
    // cur = 1, cap = 1: the window after next.
    expect(l.check(&1), deny(1, 0, left + century, left + century));
    assert_retry_exact(&l, &clock, 1, 1);

    let clock = FakeClock::new();
    let l = limiter(q.algorithm(Algorithm::SlidingWindowLog), &clock);
    expect(l.check(&1), allow(1, 0, century));
    expect(l.check(&1), deny(1, 0, century, century));
    clock.set_ns(century - 1);
    expect(l.check(&1), deny(1, 0, 1, 1));
    clock.set_ns(century);
    expect(l.check(&1), allow(1, 0, century));
}

/// 10^9 per second: T = 1 ns, the finest rate there is.
#[test]
fn billion_per_second() {
    let clock = FakeClock::new();
    let l = limiter(Quota::per_second(1_000_000_000), &clock);
    expect(l.check_n(&1, 1_000_000_000).unwrap(), allow(S, 0, S));
    expect(l.check(&1), deny(S, 0, S, 1));
    clock.advance_ns(1);
    expect(l.check(&1), allow(S, 0, S));
    clock.advance(Duration::from_millis(500));
    expect(l.check_n(&1, 500_000_000).unwrap(), allow(S, 0, S));
    expect(l.check_n(&1, 7).unwrap(), deny(S, 0, S, 7));

    let l = limiter(
        Quota::per_second(1_000_000_000).algorithm(Algorithm::FixedWindow),
        &clock,
    );
    clock.set_ns(0);
    expect(l.check_n(&1, 1_000_000_000).unwrap(), allow(S, 0, S));
    expect(l.check(&1), deny(S, 0, S, S));
}

/// A cost equal to the burst (or the window limit) passes on a fresh key, and only then.
#[test]
fn cost_equal_to_capacity() {
    // (algorithm, retry after a full-capacity charge at t = 0)
    let cases = [
        (Algorithm::TokenBucket, S, S),
        (Algorithm::LeakyBucket, S, S),
        (Algorithm::FixedWindow, S, S),
        // cur = 4 = cap: the next window cannot take 4 (prev weighs > 0): the one after.
        (Algorithm::SlidingWindowCounter, 2 * S, 2 * S),
        (Algorithm::SlidingWindowLog, S, S),
    ];
    for (algo, reset, retry) in cases {
        let clock = FakeClock::new();
        let l = limiter(Quota::per_second(4).burst(4).algorithm(algo), &clock);
        expect(l.check_n(&1, 4).unwrap(), allow(4, 0, reset));
        expect(l.check_n(&1, 4).unwrap(), deny(4, 0, reset, retry));
        if algo != Algorithm::SlidingWindowLog {
            assert_retry_exact(&l, &clock, 1, 4);
        }
        assert_eq!(
            l.check_n(&1, 5),
            Err(Error::CostExceedsCapacity {
                cost: 5,
                capacity: 4
            }),
            "{algo:?}"
        );
        clock.set_ns(retry);
        expect(l.check_n(&1, 4).unwrap(), allow(4, 0, reset));
    }
}

/// Admits cost-1 requests at the current time until the first denial; returns how many passed.
fn drain(l: &Limiter<u64, FakeClock>, key: u64) -> u64 {
    let mut n = 0;
    loop {
        let d = l.check(&key);
        if !d.is_allowed() {
            assert!(d.retry_after_ns() > 0, "a denial must say when to retry");
            return n;
        }
        n += 1;
        assert!(n <= 1_000, "runaway admissions");
    }
}

/// The clock jumps back: no panic, no permits returned. After using the whole burst at 10 s,
/// jumping back to 3 s (and forward again to 10 s) admits nothing more.
#[test]
fn clock_jumps_back() {
    for algo in Algorithm::ALL {
        let clock = FakeClock::new();
        let l = limiter(Quota::per_second(5).algorithm(algo), &clock);
        clock.set_ns(10 * S);
        assert_eq!(drain(&l, 1), 5, "{algo:?}");
        clock.set_ns(3 * S);
        assert_eq!(drain(&l, 1), 0, "{algo:?} after the jump back");
        let d = l.check(&1);
        assert!(!d.is_allowed());
        // Retry is measured from the earlier moment: at least until the later one.
        assert!(d.retry_after_ns() >= 7 * S, "{algo:?}: {d:?}");
        clock.set_ns(3 * S + 500 * MS);
        assert_eq!(drain(&l, 1), 0, "{algo:?}");
        clock.set_ns(10 * S);
        assert_eq!(drain(&l, 1), 0, "{algo:?} back at 10 s");
        // Two periods after the burst, every algorithm is full again: exactly one burst.
        clock.set_ns(12 * S);
        assert_eq!(drain(&l, 1), 5, "{algo:?} at 12 s");

        // A jump back to 0 on a busy key never panics or underflows.
        clock.set_ns(0);
        assert_eq!(drain(&l, 1), 0, "{algo:?} at 0");
        let _ = l.peek(&1);
        let _ = l.reserve(&1, 5, Duration::from_secs(100)).unwrap();
    }

    // GCRA: the exact retry from the earlier moment is the debt minus the tolerance.
    let clock = FakeClock::new();
    let l = limiter(Quota::per_second(5), &clock);
    clock.set_ns(10 * S);
    assert_eq!(drain(&l, 1), 5);
    clock.set_ns(3 * S);
    // TAT = 11 s; need = 11 s + 200 ms - 3 s = 8.2 s; tau = 1 s.
    expect(l.check(&1), deny(5, 0, 8 * S, 7_200 * MS));
}

/// 10 years forward: no panic, no wraparound; the key is full again but admits at most one
/// burst at once.
#[test]
fn clock_jumps_ten_years_forward() {
    let ten_years = Duration::from_secs(10 * 365 * 86_400);
    let cases = [
        (Algorithm::TokenBucket, Quota::per_second(5)),
        (Algorithm::LeakyBucket, Quota::per_second(5)),
        (Algorithm::FixedWindow, Quota::per_second(5)),
        (
            Algorithm::FixedWindow,
            Quota::new(5, Duration::from_millis(1)),
        ),
        (Algorithm::SlidingWindowCounter, Quota::per_second(5)),
        (Algorithm::SlidingWindowCounter, Quota::per_minute(5)),
        (Algorithm::SlidingWindowCounter, Quota::per_day(5)),
        (Algorithm::SlidingWindowLog, Quota::per_second(5)),
    ];
    for (algo, q) in cases {
        let clock = FakeClock::new();
        let l = limiter(q.algorithm(algo), &clock);
        assert_eq!(drain(&l, 1), 5, "{algo:?}");
        clock.advance(ten_years);
        assert_eq!(drain(&l, 1), 5, "{algo:?} {q:?} ten years later");
        clock.advance(ten_years);
        let d = l.check(&1);
        assert!(d.is_allowed(), "{algo:?} twenty years later: {d:?}");
        assert_eq!(d.remaining(), 4, "{algo:?}");
    }
}

/// Regression (sliding window counter): window ids are 20 bits; a key idle for many windows
/// (here 600,000, and 10 years of 1 s windows = 787,200 mod 2^20) must be fresh, not mistaken
/// for a clock that went back (only a stored window at most 2^12 ahead means that).
#[test]
fn sliding_window_counter_idle_for_many_windows() {
    let clock = FakeClock::new();
    let l = limiter(
        Quota::per_second(5).algorithm(Algorithm::SlidingWindowCounter),
        &clock,
    );
    assert_eq!(drain(&l, 1), 5);
    clock.set_ns(600_000 * S); // 600,000 windows (about 7 days) later
    let d = l.check(&1);
    assert!(d.is_allowed(), "7 idle days later: {d:?}");
    clock.set_ns(10 * 365 * 86_400 * S);
    let d = l.check(&1);
    assert!(d.is_allowed(), "10 idle years later: {d:?}");
}

/// Regression (fixed window): window ids are 32 bits; a key idle for 2^31 + 1 windows must be
/// fresh, not mistaken for a clock that went back (only a stored window at most 2^20 ahead).
#[test]
fn fixed_window_idle_for_many_windows() {
    let clock = FakeClock::new();
    let l = limiter(
        Quota::new(5, Duration::from_millis(1)).algorithm(Algorithm::FixedWindow),
        &clock,
    );
    assert_eq!(drain(&l, 1), 5);
    clock.set_ns(((1 << 31) + 1) * MS);
    let d = l.check(&1);
    assert!(d.is_allowed(), "2^31 + 1 idle windows later: {d:?}");
}

// ---------------------------------------------------------------------------------------------
// peek, reset, block
// ---------------------------------------------------------------------------------------------

#[test]
fn peek_charges_nothing() {
    for algo in Algorithm::ALL {
        let clock = FakeClock::new();
        let l = limiter(Quota::per_second(2).algorithm(algo), &clock);
        // A new key: the answer a check would give, and nothing is inserted.
        let p = l.peek(&1);
        assert!(p.is_allowed(), "{algo:?}");
        assert_eq!(p.remaining(), 1, "{algo:?}");
        assert_eq!(l.len(), 0, "{algo:?}: peek must not insert");
        for _ in 0..10 {
            assert_eq!(fields(&l.peek(&1)), fields(&p), "{algo:?}");
        }
        // peek == the following check, field by field, all the way to the denial.
        for _ in 0..3 {
            let p = l.peek(&1);
            let c = l.check(&1);
            assert_eq!(fields(&p), fields(&c), "{algo:?}");
        }
        let d = l.peek(&1);
        assert!(!d.is_allowed(), "{algo:?}");
        let s = l.stats();
        assert_eq!(
            (s.allowed, s.denied),
            (2, 1),
            "{algo:?}: peeks are not counted"
        );
    }
}

#[test]
fn reset_makes_the_key_fresh() {
    for algo in Algorithm::ALL {
        let clock = FakeClock::new();
        let l = limiter(Quota::per_second(3).algorithm(algo), &clock);
        let fresh = fields(&l.peek(&1));
        assert_eq!(drain(&l, 1), 3, "{algo:?}");
        assert_eq!(drain(&l, 2), 3, "{algo:?}");
        assert!(l.reset(&1), "{algo:?}: the key was tracked");
        assert!(!l.reset(&1), "{algo:?}: already gone");
        assert!(!l.reset(&3), "{algo:?}: never seen");
        assert_eq!(fields(&l.check(&1)), fresh, "{algo:?}");
        assert_eq!(drain(&l, 1), 2, "{algo:?}");
        // The other key kept its state.
        assert!(!l.check(&2).is_allowed(), "{algo:?}");
    }
}

#[test]
fn block_denies_with_reason_blocked() {
    let clock = FakeClock::new();
    let l = limiter(Quota::per_second(10).burst(3), &clock);
    assert!(l.block(&1, Duration::from_secs(30)));
    let blocked = (false, Reason::Blocked, 3, 0, 30 * S, 30 * S, 0);
    expect(l.check(&1), blocked);
    expect(l.peek(&1), blocked);
    expect(l.check_n(&1, 3).unwrap(), blocked);
    expect(
        l.reserve(&1, 1, Duration::from_secs(3600)).unwrap(),
        blocked,
    );
    clock.advance_ns(30 * S - 1);
    expect(l.check(&1), (false, Reason::Blocked, 3, 0, 1, 1, 0));
    // A shorter penalty does not shorten a longer one.
    assert!(l.block(&1, Duration::from_nanos(0)));
    expect(l.check(&1), (false, Reason::Blocked, 3, 0, 1, 1, 0));
    clock.advance_ns(1);
    // Served: the key is as it was (fresh, nothing was charged while blocked).
    expect(l.check(&1), allow(3, 2, 100 * MS));
    // Other keys were never affected.
    expect(l.check(&2), allow(3, 2, 100 * MS));

    // Blocking a key with state keeps its state for afterwards; windows too.
    let l = limiter(
        Quota::per_minute(5).algorithm(Algorithm::FixedWindow),
        &clock,
    );
    clock.set_ns(0);
    expect(l.check_n(&1, 4).unwrap(), allow(5, 1, 60 * S));
    assert!(l.block(&1, Duration::from_secs(10)));
    expect(
        l.check(&1),
        (false, Reason::Blocked, 5, 0, 10 * S, 10 * S, 0),
    );
    clock.set_ns(10 * S);
    expect(l.check(&1), allow(5, 0, 50 * S));
    expect(l.check(&1), deny(5, 0, 50 * S, 50 * S));
}
