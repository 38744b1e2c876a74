//! Single-thread cost of one check, per algorithm, next to governor's keyed limiter in the same
//! run; plus the clock read and a new-key insert. Run: `cargo bench --bench check`.
//!
//! Every case cycles over 1,000 existing u64 keys with the real monotonic clock. "allow" quotas
//! admit nearly everything (10^9 per second); "deny" quotas are spent once and then deny.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use turnstile::{Algorithm, Clock, Limiter, MonotonicClock, Quota};

const KEYS: u64 = 1_000;

fn turnstile_limiter(alg: Algorithm, allow: bool) -> Limiter<u64> {
    let q = if allow {
        Quota::per_second(1_000_000_000).burst(1_000_000_000)
    } else {
        Quota::new(1, Duration::from_secs(3600)).burst(1)
    };
    let q = if alg == Algorithm::SlidingWindowLog && allow {
        Quota::per_second(65_536)
    } else if matches!(
        alg,
        Algorithm::SlidingWindowCounter | Algorithm::FixedWindow
    ) && allow
    {
        Quota::per_second(4_000_000)
    } else {
        q
    };
    let l = Limiter::builder().quota(q.algorithm(alg)).build().unwrap();
    for k in 0..KEYS {
        let _ = l.check(&k);
    }
    l
}

fn bench_checks(c: &mut Criterion) {
    let mut g = c.benchmark_group("check_1k_keys");
    for allow in [true, false] {
        let mode = if allow { "allow" } else { "deny" };
        for alg in Algorithm::ALL {
            let l = turnstile_limiter(alg, allow);
            let mut k = 0u64;
            g.bench_function(format!("turnstile/{}/{mode}", alg.name()), |b| {
                b.iter(|| {
                    k = (k + 1) % KEYS;
                    black_box(l.check(black_box(&k)))
                })
            });
        }
        let gq = if allow {
            governor::Quota::per_second(NonZeroU32::MAX).allow_burst(NonZeroU32::MAX)
        } else {
            governor::Quota::per_hour(NonZeroU32::MIN)
        };
        let gov = governor::RateLimiter::keyed(gq);
        for k in 0..KEYS {
            let _ = gov.check_key(&k);
        }
        let mut k = 0u64;
        g.bench_function(format!("governor/gcra/{mode}"), |b| {
            b.iter(|| {
                k = (k + 1) % KEYS;
                black_box(gov.check_key(black_box(&k)).is_ok())
            })
        });
    }
    g.finish();
}

fn bench_clock(c: &mut Criterion) {
    let clock = MonotonicClock::new();
    c.bench_function("clock/monotonic_now", |b| b.iter(|| black_box(clock.now())));
}

fn bench_insert(c: &mut Criterion) {
    c.bench_function("insert/new_key", |b| {
        let l: Limiter<u64> = Limiter::builder()
            .quota(Quota::per_second(10))
            .max_keys(usize::MAX)
            .build()
            .unwrap();
        let mut k = 0u64;
        b.iter(|| {
            k += 1;
            black_box(l.check(&k))
        })
    });
}

fn bench_sweep(c: &mut Criterion) {
    c.bench_function("sweep/100k_fresh_keys", |b| {
        b.iter_batched(
            || {
                let l: Limiter<u64> = Limiter::builder()
                    .quota(Quota::new(1, Duration::from_nanos(1)))
                    .build()
                    .unwrap();
                for k in 0..100_000 {
                    let _ = l.check(&k);
                }
                l
            },
            |l| black_box(l.sweep_now()),
            criterion::BatchSize::LargeInput,
        )
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = bench_checks, bench_clock, bench_insert, bench_sweep
}
criterion_main!(benches);
