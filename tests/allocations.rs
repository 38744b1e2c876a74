//! A check on an existing key allocates nothing (one test in this binary, so no other test
//! thread allocates while it counts).

use std::hint::black_box;

#[path = "../src/bin/tollgate/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::CountingAllocator;
use tollgate::{Algorithm, FakeClock, Limiter, Quota};

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
        // The allocator counts every thread, and libtest's main thread sometimes allocates a
        // few times while this test runs (measured: 4 allocations from another thread in about
        // one run of five on a loaded machine). A hot-path allocation would show in every
        // round; harness noise does not repeat, so one clean round out of three is required.
        let mut allowed = 0;
        let mut fewest = usize::MAX;
        for round in 0..3u64 {
            let before = CountingAllocator::allocations();
            for i in 0..100_000u64 {
                let key = i % 1000;
                let d = black_box(l.check(&key));
                if round == 0 {
                    allowed += usize::from(d.is_allowed());
                }
                let _ = black_box(l.peek(&key));
            }
            fewest = fewest.min(CountingAllocator::allocations() - before);
            if fewest == 0 {
                break;
            }
        }
        assert_eq!(fewest, 0, "{alg:?} allocated on the hot path");
        // Each key had 49 units left: both admissions and denials were exercised.
        assert_eq!(allowed, 1000 * 49, "{alg:?}");
    }
}
