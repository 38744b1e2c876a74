//! Arbitrary operation sequences on a limiter with a fake clock: check, check_n, peek, reserve,
//! reset, sweep, clock forward and back. Invariants: no panic; with time frozen, a key never
//! admits more than its capacity at once; a peek agrees with the check that follows it.
#![no_main]
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use turnstile::{Algorithm, FakeClock, Limiter, Quota};

fuzz_target!(|data: &[u8]| {
    let Some((&head, ops)) = data.split_first() else {
        return;
    };
    let alg = Algorithm::ALL[usize::from(head) % Algorithm::ALL.len()];
    let limit = u64::from(head % 7) + 1;
    let clock = FakeClock::new();
    let Ok(l) = Limiter::<u8>::builder()
        .quota(
            Quota::new(
                limit,
                Duration::from_millis(u64::from(head % 5) * 250 + 250),
            )
            .burst(limit)
            .algorithm(alg),
        )
        .clock(clock.clone())
        .build()
    else {
        return;
    };
    let mut since_advance = [0u64; 4];
    for op in ops.chunks(2) {
        let (kind, arg) = (op[0], *op.get(1).unwrap_or(&0));
        let key = kind & 3;
        match kind >> 5 {
            0 | 1 => {
                let peek = l.peek(&key).is_allowed();
                let d = l.check(&key);
                assert_eq!(peek, d.is_allowed(), "peek disagrees with check");
                if d.is_allowed() {
                    since_advance[usize::from(key)] += 1;
                }
            }
            2 => {
                if let Ok(d) = l.check_n(&key, u64::from(arg) % (limit + 2)) {
                    if d.is_allowed() {
                        since_advance[usize::from(key)] += u64::from(arg) % (limit + 2);
                    }
                }
            }
            3 => {
                let _ = l.reserve(&key, 1, Duration::from_millis(u64::from(arg)));
            }
            4 => {
                l.reset(&key);
                since_advance[usize::from(key)] = 0;
            }
            5 => {
                l.sweep_now();
            }
            6 => {
                clock.advance(Duration::from_millis(u64::from(arg) * 10));
                since_advance = [0; 4];
            }
            _ => clock.set_ns(clock_now(&clock).saturating_sub(u64::from(arg) * 10_000_000)),
        }
        // Frozen time (or time moved back): a fixed window may admit a second window's worth
        // only after time moves forward, so every algorithm stays within capacity here.
        for used in since_advance {
            assert!(
                used <= 2 * limit,
                "admitted {used} with capacity {limit} without time passing"
            );
        }
    }
});

fn clock_now(c: &FakeClock) -> u64 {
    use turnstile::Clock;
    c.now()
}
