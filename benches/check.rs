//! Single-thread cost of one check, per algorithm, next to governor's keyed limiter in the same
//! run; plus the clock read, a new-key insert and a sweep (per key), for every store. Run:
//! `cargo bench --bench check` in `benches/` (a package of its own). The multi-threaded comparison is `benches/throughput.rs`.
//!
//! Every case cycles over 1,000 existing u64 keys with the real monotonic clock. "allow" quotas
//! admit nearly everything (10^9 per second); "deny" quotas are spent once and then deny.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tollgate::{Algorithm, Clock, Limiter, MonotonicClock, Quota, StoreKind};

const KEYS: u64 = 1_000;

fn tollgate_limiter(alg: Algorithm, allow: bool, store: StoreKind) -> Limiter<u64> {
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
    let l = Limiter::builder()
        .quota(q.algorithm(alg))
        .store(store)
        .build()
        .unwrap();
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
            let l = tollgate_limiter(alg, allow, StoreKind::default());
            let mut k = 0u64;
            g.bench_function(format!("tollgate/{}/{mode}", alg.name()), |b| {
                b.iter(|| {
                    k = (k + 1) % KEYS;
                    black_box(l.check(black_box(&k)))
                })
            });
        }
        // The other stores, on the token bucket.
        for kind in StoreKind::ALL
            .into_iter()
            .filter(|&k| k != StoreKind::default())
        {
            let l = tollgate_limiter(Algorithm::TokenBucket, allow, kind);
            let mut k = 0u64;
            g.bench_function(format!("tollgate-{}/gcra/{mode}", kind.name()), |b| {
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

/// The key cap of the insert bench: more keys than criterion inserts in its runs.
const INSERT_CAP: usize = 16_000_000;

fn bench_insert(c: &mut Criterion) {
    let mut g = c.benchmark_group("insert");
    for kind in StoreKind::ALL {
        g.bench_function(format!("new_key/{}", kind.name()), |b| {
            // Room for every key criterion inserts (a flat table cannot be sized for
            // `usize::MAX`: that would fall back to the dash store, so check the kind), and a
            // quarter of it filled first: the flat table's pages are then mapped, so this
            // measures inserting a key, not the kernel zeroing a fresh page for it.
            let l: Limiter<u64> = Limiter::builder()
                .quota(Quota::per_second(10))
                .store(kind)
                .max_keys(INSERT_CAP)
                .build()
                .unwrap();
            assert_eq!(l.store_kind(), kind, "the store asked for");
            let mut k = 0u64;
            while k < INSERT_CAP as u64 / 4 {
                k += 1;
                let _ = l.check(&k);
            }
            b.iter(|| {
                k += 1;
                black_box(l.check(&k))
            })
        });
    }
    g.finish();
}

/// Keys in the sweep benches; criterion reports the time per key (elements/s).
const SWEEP_KEYS: u64 = 100_000;

fn bench_sweep(c: &mut Criterion) {
    let mut g = c.benchmark_group("sweep");
    g.throughput(Throughput::Elements(SWEEP_KEYS));
    for kind in StoreKind::ALL {
        // Every key fresh (1 per microsecond, burst 1, checked over a millisecond ago, no
        // grace): the sweep removes all of them.
        g.bench_function(format!("remove_100k_fresh/{}", kind.name()), |b| {
            b.iter_batched(
                || {
                    let l: Limiter<u64> = Limiter::builder()
                        .quota(Quota::new(1, Duration::from_micros(1)).burst(1))
                        .store(kind)
                        .sweep_grace(Duration::ZERO)
                        // The sweep is what is measured: no housekeeping sweeps during setup.
                        .housekeeping(false)
                        .build()
                        .unwrap();
                    for k in 0..SWEEP_KEYS {
                        let _ = l.check(&k);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    l
                },
                |l| assert_eq!(l.sweep_now() as u64, SWEEP_KEYS),
                criterion::BatchSize::LargeInput,
            )
        });
        // Every key live (its one unit per hour spent): the sweep visits all, removes none.
        let l: Limiter<u64> = Limiter::builder()
            .quota(Quota::per_hour(1))
            .store(kind)
            .build()
            .unwrap();
        for k in 0..SWEEP_KEYS {
            let _ = l.check(&k);
        }
        g.bench_function(format!("visit_100k_live/{}", kind.name()), |b| {
            b.iter(|| assert_eq!(l.sweep_now(), 0))
        });
    }
    g.finish();
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
