//! A check on an existing key allocates nothing (one test in this binary, so no other test
//! thread allocates while it counts).

use std::hint::black_box;

use turnstile::{Algorithm, CountingAllocator, FakeClock, Limiter, Quota};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

#[test]
fn checks_on_existing_keys_do_not_allocate() {
    for alg in [
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
    ] {
        let clock = FakeClock::new();
        let l = Limiter::<u64>::builder()
            .quota(Quota::per_second(50).algorithm(alg))
            .clock(clock.clone())
            .build()
            .unwrap();
        for k in 0..1000 {
            let _ = l.check(&k);
        }
        let before = CountingAllocator::allocations();
        let mut allowed = 0;
        for i in 0..100_000u64 {
            allowed += usize::from(black_box(l.check(&(i % 1000))).is_allowed());
            let _ = black_box(l.peek(&(i % 1000)));
        }
        assert_eq!(
            CountingAllocator::allocations(),
            before,
            "{alg:?} allocated on the hot path"
        );
        // Each key had 49 units left: both admissions and denials were exercised.
        assert_eq!(allowed, 1000 * 49, "{alg:?}");
    }
}
