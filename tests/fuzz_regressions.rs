//! Inputs the fuzz targets (fuzz/) found, replayed here on stable so they stay fixed.

use std::time::Duration;

use tollgate::{Algorithm, Error, FakeClock, Limiter, Quota, Reason};

/// `decide` found: a sliding window counter whose period is near 2^64 ns overflowed
/// `reset_after` (a panic in debug builds, a wrapped value in release) and, with a Unix phase
/// near the period, saturated the window arithmetic so `retry_after` was wrong. Periods above
/// 2^62 ns are now a configuration error, and the longest allowed one works with exact times.
#[test]
fn centuries_long_windows() {
    for alg in Algorithm::ALL {
        let too_long = Quota::new(3, Quota::MAX_PERIOD + Duration::from_nanos(1)).algorithm(alg);
        let built = Limiter::<u64>::builder().quota(too_long).build();
        assert!(
            matches!(built, Err(Error::PeriodTooLong { .. })),
            "{alg:?} accepted a period above the maximum"
        );
    }
    // The longest period, with the clock's Unix epoch just before a window ends.
    let epoch = Duration::from_nanos(Quota::MAX_PERIOD.as_nanos() as u64 - 1_000);
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let clock = FakeClock::with_unix_epoch(epoch);
        let l = Limiter::<u64>::builder()
            .quota(Quota::new(3, Quota::MAX_PERIOD).algorithm(alg))
            .clock(clock.clone())
            .build()
            .unwrap();
        for left in (0..3).rev() {
            let d = l.check(&1);
            assert!(d.is_allowed(), "{alg:?}");
            assert_eq!(d.remaining(), left);
        }
        let denied = l.check(&1);
        assert_eq!(denied.reason(), Reason::Limited, "{alg:?}");
        // The window ends in 1,000 ns.
        let retry = denied.retry_after_ns();
        assert!(retry >= 1_000, "{alg:?}: retry {retry}");
        clock.advance_ns(retry);
        assert!(
            l.check(&1).is_allowed(),
            "{alg:?}: denied at retry_after {retry}"
        );
    }
}
