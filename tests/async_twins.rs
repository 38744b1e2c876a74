//! The async twins exist on every build, with or without the `redis` feature (scripts/test.sh
//! runs this file with no features too), and answer in process as the synchronous calls do.

use std::time::Duration;

use tollgate::{FakeClock, Limiter, PlanId, Quota};

#[tokio::test(flavor = "current_thread")]
async fn async_twins_answer_as_the_synchronous_calls() {
    let clock = FakeClock::new();
    let limiter = Limiter::<u64, _>::builder()
        .quota(Quota::per_second(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    let plan = PlanId::DEFAULT;
    let peek = limiter.peek_in_async(&1, plan, 1).await.unwrap();
    assert_eq!((peek.is_allowed(), peek.remaining()), (true, 1));
    assert!(limiter.check_async(&1).await.is_allowed());
    let d = limiter.check_in_async(&1, plan, 1).await.unwrap();
    assert_eq!((d.is_allowed(), d.remaining()), (true, 0));
    assert!(!limiter.check_async(&1).await.is_allowed());
    // Empty: the next unit conforms in 500 ms; a reservation waiting up to a second takes it.
    let r = limiter
        .reserve_in_async(&1, plan, 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        (r.is_allowed(), r.delay()),
        (true, Duration::from_millis(500))
    );
    assert!(
        limiter.check_in_async(&1, plan, 5).await.is_err(),
        "cost above the burst"
    );
}
