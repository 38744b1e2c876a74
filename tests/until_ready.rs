//! `Limiter::until_ready` (feature `tokio`, no HTTP needed): waiting for a reservation, window
//! retries, deadlines, and `Duration::MAX` as no deadline.
#![cfg(feature = "tokio")]

use std::time::{Duration, Instant};

use tollgate::{Algorithm, Limiter, PlanId, Quota};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_ready_waits_for_the_reservation() {
    let limiter = Limiter::<&str>::builder()
        .quota(Quota::per_second(10).burst(1))
        .build()
        .unwrap();
    assert!(
        limiter
            .until_ready(&"k", Duration::ZERO)
            .await
            .unwrap()
            .is_allowed()
    );
    let start = Instant::now();
    let d = limiter
        .until_ready(&"k", Duration::from_secs(1))
        .await
        .unwrap();
    assert!(d.is_allowed());
    assert!(start.elapsed() >= d.delay());
    assert!(d.delay() > Duration::from_millis(50));
    // Window algorithms retry after the denial's retry_after while the deadline allows.
    let windows = Limiter::<&str>::builder()
        .quota(Quota::new(1, Duration::from_millis(200)).algorithm(Algorithm::FixedWindow))
        .build()
        .unwrap();
    assert!(windows.check(&"w").is_allowed());
    let d = windows
        .until_ready(&"w", Duration::from_secs(2))
        .await
        .unwrap();
    assert!(d.is_allowed());
    let denied = windows
        .until_ready(&"w", Duration::from_millis(1))
        .await
        .unwrap();
    assert!(!denied.is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_ready_with_no_deadline() {
    let limiter = Limiter::<&str>::builder()
        .quota(Quota::per_second(20).burst(1))
        .build()
        .unwrap();
    assert!(limiter.check(&"k").is_allowed());
    let start = Instant::now();
    let d = limiter.until_ready(&"k", Duration::MAX).await.unwrap();
    assert!(d.is_allowed() && d.delay() > Duration::ZERO);
    assert!(start.elapsed() >= d.delay());
    // A window algorithm retries after each denial's retry_after, with no deadline either.
    let windows = Limiter::<&str>::builder()
        .quota(Quota::new(1, Duration::from_millis(100)).algorithm(Algorithm::FixedWindow))
        .build()
        .unwrap();
    assert!(windows.check(&"w").is_allowed());
    assert!(
        windows
            .until_ready(&"w", Duration::MAX)
            .await
            .unwrap()
            .is_allowed()
    );
    // The deadline of `until_ready_in` is the same: `Duration::MAX` never overflows.
    let d = windows
        .until_ready_in(&"w", PlanId::DEFAULT, 1, Duration::MAX)
        .await
        .unwrap();
    assert!(d.is_allowed());
}

/// A bucket whose first free slot lies past the deadline is denied at once: waiting brings the
/// slot no nearer (it once slept out most of the patience before saying so). Paused tokio time:
/// the elapsed time is exact.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_bucket_past_the_deadline_is_denied_at_once() {
    let limiter = Limiter::<&str>::builder()
        .quota(Quota::per_second(10).burst(1))
        .build()
        .unwrap();
    assert!(limiter.check(&"job").is_allowed());
    // The next slot, 100 ms away, taken: the first free one is 200 ms away.
    assert!(
        limiter
            .reserve(&"job", 1, Duration::from_secs(1))
            .unwrap()
            .is_allowed()
    );
    let start = tokio::time::Instant::now();
    let d = limiter
        .until_ready(&"job", Duration::from_millis(150))
        .await
        .unwrap();
    assert!(!d.is_allowed());
    assert_eq!(start.elapsed(), Duration::ZERO, "denied without sleeping");
}
