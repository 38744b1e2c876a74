//! What users configure, against what they would build from governor instead, in one run:
//! plans resolved per request (`check_in`, 3 plans), a compound plan (two quotas on one key),
//! and `check_all` (per-user AND global), each admitting and with each of its parts denying.
//! 100k keys, 1 and 2 threads, runs interleaved, medians.
//!
//! ```text
//! cd benches                                     # the benches' own package
//! cargo bench --bench plans                      # about 1 minute on a 2-core machine
//! TOLLGATE_BENCH=short cargo bench --bench plans # CI smoke run, a few seconds
//! ```
//!
//! Every case checks one unit per request on pre-generated random keys. Allow-heavy quotas
//! (10^8 to 4 x 10^8 per second, every request admitted and written) unless the case says "denies".
//! governor's side, as its users combine it: one keyed limiter per plan picked per request; two
//! keyed limiters checked in turn for a compound limit (the second only if the first passes;
//! governor cannot refund the first when the second denies); a keyed and a direct limiter for
//! per-user AND global.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, RateLimiter};
use tollgate::{Limiter, Plan, PlanId, Quota, check_all};

const KEYS: u64 = 100_000;
const STREAM: usize = 1 << 16;

fn allow(n: u32) -> Quota {
    Quota::per_second(u64::from(n)).burst(u64::from(n))
}

fn gov_allow(n: u32) -> governor::Quota {
    let n = NonZeroU32::new(n).unwrap();
    governor::Quota::per_second(n).allow_burst(n)
}

/// A rate-limit setup under test: one call decides one request for key `k`.
trait Case: Sync {
    fn call(&self, k: u64) -> bool;
}

struct TgDefault(Limiter<u64>);
impl Case for TgDefault {
    fn call(&self, k: u64) -> bool {
        self.0.check(&k).is_allowed()
    }
}

struct TgPlans(Limiter<u64>, [PlanId; 3]);
impl Case for TgPlans {
    fn call(&self, k: u64) -> bool {
        self.0
            .check_in(&k, self.1[(k % 3) as usize], 1)
            .is_ok_and(|d| d.is_allowed())
    }
}

struct TgAll(Limiter<u64>, Limiter<()>);
impl Case for TgAll {
    fn call(&self, k: u64) -> bool {
        check_all(&[&self.0.key(&k), &self.1.key(&())], 1).is_ok_and(|d| d.is_allowed())
    }
}

struct GovKeyed(DefaultKeyedRateLimiter<u64>);
impl Case for GovKeyed {
    fn call(&self, k: u64) -> bool {
        self.0.check_key(&k).is_ok()
    }
}

struct GovPlans([DefaultKeyedRateLimiter<u64>; 3]);
impl Case for GovPlans {
    fn call(&self, k: u64) -> bool {
        self.0[(k % 3) as usize].check_key(&k).is_ok()
    }
}

struct GovTwo(DefaultKeyedRateLimiter<u64>, DefaultKeyedRateLimiter<u64>);
impl Case for GovTwo {
    fn call(&self, k: u64) -> bool {
        self.0.check_key(&k).is_ok() && self.1.check_key(&k).is_ok()
    }
}

struct GovAll(DefaultKeyedRateLimiter<u64>, DefaultDirectRateLimiter);
impl Case for GovAll {
    fn call(&self, k: u64) -> bool {
        self.0.check_key(&k).is_ok() && self.1.check().is_ok()
    }
}

fn keyed(q: governor::Quota) -> DefaultKeyedRateLimiter<u64> {
    RateLimiter::keyed(q)
}

/// Calls per second of `threads` threads on their own key streams for `d`.
fn rate(case: &dyn Case, streams: &[Vec<u64>], threads: usize, d: Duration) -> f64 {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let calls: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = streams[..threads]
            .iter()
            .map(|keys| {
                let (stop, barrier) = (&stop, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for &k in &keys[..1024] {
                            black_box(case.call(k));
                        }
                        n += 1024;
                        for &k in &keys[1024..] {
                            black_box(case.call(k));
                            n += 1;
                            if n % 4096 == 0 && stop.load(Ordering::Relaxed) {
                                break;
                            }
                        }
                    }
                    n
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        std::thread::sleep(d);
        stop.store(true, Ordering::Relaxed);
        let n: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        let secs = start.elapsed().as_secs_f64();
        (n as f64 / secs) as u64
    });
    calls as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Keys spread over the key space (a fixed xorshift sequence per thread).
fn streams(threads: usize) -> Vec<Vec<u64>> {
    (0..threads as u64)
        .map(|t| {
            let mut x = 0x9E37_79B9_7F4A_7C15 ^ (t + 1);
            (0..STREAM)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % KEYS
                })
                .collect()
        })
        .collect()
}

/// `calls` calls of `case` in turn over `keys`, one thread (for instruction counts).
#[inline(never)]
fn calls_tollgate(case: &dyn Case, keys: &[u64], calls: usize) {
    for &k in keys.iter().cycle().take(calls) {
        black_box(case.call(k));
    }
}

/// [`calls_tollgate`] for the governor side (a function of its own for the profile).
#[inline(never)]
fn calls_governor(case: &dyn Case, keys: &[u64], calls: usize) {
    // Not the same body as `calls_tollgate`, which the compiler would merge with this one.
    black_box("governor");
    for &k in keys.iter().cycle().take(calls) {
        black_box(case.call(k));
    }
}

/// Fills every key once so the measured calls find their state.
fn fill(case: &dyn Case) {
    for k in 0..KEYS {
        black_box(case.call(k));
    }
}

fn main() {
    let short = std::env::var("TOLLGATE_BENCH").is_ok_and(|v| v == "short");
    let (runs, run) = if short {
        (1, Duration::from_millis(20))
    } else {
        (5, Duration::from_millis(300))
    };
    let threads_list = [1usize, 2];
    // Spent by `fill`'s one call a key: every measured call is denied.
    let deny = Quota::per_hour(1).burst(1);
    let deny_day = Quota::per_day(1).burst(1);
    let gov_deny = governor::Quota::per_hour(NonZeroU32::MIN);
    let gov_deny_day = governor::Quota::with_period(Duration::from_secs(86_400)).unwrap();

    let tg = |plans: &[(&str, Vec<Quota>)]| {
        let mut b = Limiter::<u64>::builder().max_keys(4 * KEYS as usize);
        for (name, qs) in plans {
            b = b.plan(*name, Plan::new(qs.clone()));
        }
        b.build().unwrap()
    };
    let default = TgDefault(tg(&[("default", vec![allow(100_000_000)])]));
    let plans_l = tg(&[
        ("free", vec![allow(100_000_000)]),
        ("pro", vec![allow(200_000_000)]),
        ("ent", vec![allow(300_000_000)]),
    ]);
    let ids = ["free", "pro", "ent"].map(|p| plans_l.plan(p).unwrap());
    let plans = TgPlans(plans_l, ids);
    let compound_l = tg(&[("both", vec![allow(100_000_000), allow(200_000_000)])]);
    let both = [compound_l.plan("both").unwrap(); 3];
    let compound = TgPlans(compound_l, both);
    let compound_of = |quotas: Vec<Quota>| {
        let l = tg(&[("both", quotas)]);
        let both = [l.plan("both").unwrap(); 3];
        TgPlans(l, both)
    };
    // Both quotas spent: the first denies, the second is only peeked (for retry_after).
    let first_denies = compound_of(vec![deny, deny_day]);
    // The first admits, the second denies: the first is charged and refunded.
    let second_denies = compound_of(vec![allow(200_000_000), deny]);
    let global_of = |q: Quota| Limiter::<()>::builder().quota(q).build().unwrap();
    let all_of =
        |user: Quota, global: Quota| TgAll(tg(&[("default", vec![user])]), global_of(global));
    let all = all_of(allow(100_000_000), allow(400_000_000));
    let all_user_denies = all_of(deny, allow(400_000_000));
    let all_global_denies = all_of(allow(100_000_000), deny);

    let g_default = GovKeyed(keyed(gov_allow(100_000_000)));
    let g_plans = GovPlans([
        keyed(gov_allow(100_000_000)),
        keyed(gov_allow(200_000_000)),
        keyed(gov_allow(300_000_000)),
    ]);
    let g_compound = GovTwo(keyed(gov_allow(100_000_000)), keyed(gov_allow(200_000_000)));
    let g_first_denies = GovTwo(keyed(gov_deny), keyed(gov_deny_day));
    let g_second_denies = GovTwo(keyed(gov_allow(200_000_000)), keyed(gov_deny));
    let g_all_of = |user: governor::Quota, global: governor::Quota| {
        GovAll(keyed(user), RateLimiter::direct(global))
    };
    let g_all = g_all_of(gov_allow(100_000_000), gov_allow(400_000_000));
    let g_all_user_denies = g_all_of(gov_deny, gov_allow(400_000_000));
    let g_all_global_denies = g_all_of(gov_allow(100_000_000), gov_deny);

    let cases: Vec<(&str, &dyn Case, &dyn Case)> = vec![
        ("default plan (check)", &default, &g_default),
        ("3 plans (check_in)", &plans, &g_plans),
        ("compound plan, 2 quotas", &compound, &g_compound),
        (
            "compound plan, first denies",
            &first_denies,
            &g_first_denies,
        ),
        (
            "compound plan, second denies",
            &second_denies,
            &g_second_denies,
        ),
        ("check_all per-user AND global", &all, &g_all),
        (
            "check_all, per-user denies",
            &all_user_denies,
            &g_all_user_denies,
        ),
        (
            "check_all, global denies",
            &all_global_denies,
            &g_all_global_denies,
        ),
    ];
    if let Ok(only) = std::env::var("TOLLGATE_PLANS_ONLY") {
        // Instruction counts: run under `valgrind --tool=callgrind` and read the inclusive
        // cost of `calls_tollgate` and `calls_governor` (see docs/performance.md).
        let calls: usize =
            std::env::var("TOLLGATE_PLANS_CALLS").map_or(100_000, |v| v.parse().unwrap());
        let (_, t, g) = cases
            .iter()
            .find(|(name, _, _)| name.contains(only.as_str()))
            .expect("no such case");
        fill(*t);
        fill(*g);
        let keys = &streams(1)[0];
        calls_tollgate(*t, keys, calls);
        calls_governor(*g, keys, calls);
        return;
    }
    // `TOLLGATE_PLANS_CASES=default,denies`: only the cases whose names contain one of these.
    let cases: Vec<_> = match std::env::var("TOLLGATE_PLANS_CASES") {
        Ok(list) => cases
            .into_iter()
            .filter(|(name, _, _)| list.split(',').any(|c| name.contains(c)))
            .collect(),
        Err(_) => cases,
    };
    for (_, t, g) in &cases {
        fill(*t);
        fill(*g);
    }
    let streams = streams(2);
    println!("| case | threads | tollgate (M/s) | governor (M/s) | ratio |\n|---|---|---|---|---|");
    let mut default_rate = [0.0; 2];
    for (name, t, g) in &cases {
        for (i, &threads) in threads_list.iter().enumerate() {
            let (mut tr, mut gr) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                tr.push(rate(*t, &streams, threads, run));
                gr.push(rate(*g, &streams, threads, run));
            }
            let (tm, gm) = (median(tr), median(gr));
            if name.starts_with("default") {
                default_rate[i] = tm;
            }
            println!(
                "| {name} | {threads} | {:.1} | {:.1} | {:.2}x{} |",
                tm / 1e6,
                gm / 1e6,
                tm / gm,
                if name.starts_with("3 plans") {
                    format!(" ({:.2} of default)", tm / default_rate[i])
                } else {
                    String::new()
                }
            );
        }
    }
}
