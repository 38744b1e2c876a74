//! A `Limiter` synced through Redis (`Builder::redis_synced`), against real redis-servers:
//! three limiters (three "processes", each its own connection and rounds) with the same plans
//! share every plan's, compound plan's and cross-key limit's state; a table-full or a dead Redis
//! answer by the configured policy; a sliding log is a construction error.
#![cfg(feature = "redis")]

mod redis_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis_support::RedisServer;
use tollgate::redis::{FailurePolicy, RedisConfig};
use tollgate::{Algorithm, Error, Limiter, Plan, PlanId, Quota, check_all};

const NODES: usize = 3;
const INTERVAL: Duration = Duration::from_millis(50);

/// The hammering tests run one at a time: each keeps three threads busy.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// `NODES` limiters with the same plans, synced through `server` under `prefix`.
fn limiters(
    rt: &tokio::runtime::Runtime,
    server: &RedisServer,
    prefix: &str,
    build: impl Fn() -> tollgate::Builder<String>,
) -> Vec<Arc<Limiter<String>>> {
    let _g = rt.enter();
    (0..NODES)
        .map(|_| {
            build()
                .redis_synced(
                    RedisConfig::new(&server.url())
                        .prefix(prefix)
                        .interval(INTERVAL),
                )
                .build_shared()
                .unwrap()
        })
        .collect()
}

/// Every limiter hammers `call` from its own thread for `run`; the units admitted in all.
fn hammer(
    limiters: &[Arc<Limiter<String>>],
    run: Duration,
    call: impl Fn(&Limiter<String>) -> bool + Send + Sync + Copy + 'static,
) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = limiters
        .iter()
        .map(|l| {
            let (l, admitted, stop) = (Arc::clone(l), admitted.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut a, mut c) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    if call(&l) {
                        a += 1;
                    }
                    c += 1;
                    if c % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
                admitted.fetch_add(a, Ordering::SeqCst);
            })
        })
        .collect();
    std::thread::sleep(run);
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    admitted.load(Ordering::SeqCst)
}

/// A plan checked by three limiters on one key admits within synced mode's bucket bound
/// (`burst + rate*t + (N-1) * (burst + rate * (interval + round trip))`), and well under what
/// three unshared limiters would (three times the rate): the state is shared. Another key on
/// another plan is held to its own plan.
#[test]
fn three_limiters_share_each_plan() {
    let _serial = serial();
    let server = RedisServer::start();
    let rt = runtime();
    const RATE: u64 = 200;
    const BURST: u64 = 20;
    let ls = limiters(&rt, &server, "shared-plans:", || {
        Limiter::<String>::builder()
            .quota(Quota::per_second(1))
            .plan("free", Plan::new([Quota::per_second(RATE).burst(BURST)]))
            .plan("pro", Plan::new([Quota::per_second(2 * RATE).burst(BURST)]))
    });
    // A plan id is its limiter's own: each resolves the plan by name.
    let plan = |l: &Limiter<String>, name: &str| -> PlanId { l.plan(name).unwrap() };
    let start = Instant::now();
    let admitted = hammer(&ls, Duration::from_secs(2), move |l| {
        l.check_in(&"alice".to_string(), plan(l, "free"), 1)
            .unwrap()
            .is_allowed()
    });
    let t = start.elapsed().as_secs_f64();
    let exact = BURST as f64 + RATE as f64 * t;
    let slack = INTERVAL.as_secs_f64() + 0.05;
    let bound = exact + (NODES - 1) as f64 * (BURST as f64 + RATE as f64 * slack);
    eprintln!(
        "shared plan, {NODES} limiters, {RATE}/s burst {BURST}: {admitted} admitted in {t:.2} s; \
         exact {exact:.0}, bound {bound:.0}; {:?}",
        ls[0].synced_stats()
    );
    assert!((admitted as f64) <= bound, "{admitted} > {bound:.0}");
    assert!(
        (admitted as f64) < exact * 1.5,
        "not shared: {admitted} vs {exact:.0}"
    );
    assert!(
        (admitted as f64) >= exact * 0.8,
        "under-admitted: {admitted}"
    );
    // The pro plan's state is its own: a fresh burst for the same key.
    for _ in 0..BURST {
        assert!(
            ls[1]
                .check_in(&"alice".to_string(), plan(&ls[1], "pro"), 1)
                .unwrap()
                .is_allowed()
        );
    }
    for l in &ls {
        let s = l.synced_stats().unwrap();
        assert!(s.rounds >= 10 && s.failed_rounds <= 2, "{s:?}");
    }
    // Each limiter's stats count its own decisions, per plan.
    let per_plan: u64 = ls.iter().map(|l| l.plan_stats()[1].allowed).sum();
    assert_eq!(per_plan, admitted);
}

/// A compound plan (per second AND per minute) and a cross-key `check_all` (per user AND a
/// global limit) across three limiters: the binding part holds across all of them.
#[test]
fn compound_plans_and_check_all_hold_across_limiters() {
    let _serial = serial();
    let server = RedisServer::start();
    let rt = runtime();
    // The per-minute part binds: 150 a minute, far below the 1,000 a second part.
    let ls = limiters(&rt, &server, "shared-compound:", || {
        Limiter::<String>::builder()
            .quota(Quota::per_second(1_000))
            .quota(Quota::per_minute(150).burst(150))
    });
    let start = Instant::now();
    let admitted = hammer(&ls, Duration::from_millis(1_500), |l| {
        l.check(&"bob".to_string()).is_allowed()
    });
    // The bucket bound on the binding part: each of the other two limiters may spend the
    // burst before its first round shows it the others'.
    let (burst, rate) = (150.0, 150.0 / 60.0);
    let t = start.elapsed().as_secs_f64();
    let slack = INTERVAL.as_secs_f64() + 0.05;
    let bound = burst + rate * t + (NODES - 1) as f64 * (burst + rate * slack);
    eprintln!("shared compound: {admitted} admitted, binding part 150 a minute, bound {bound:.0}");
    assert!(admitted as f64 <= bound, "{admitted} > {bound:.0}");
    assert!(admitted >= 150, "{admitted}");
    // Once all have synced, the minute part is spent everywhere.
    std::thread::sleep(INTERVAL * 4);
    for l in &ls {
        assert!(!l.check(&"bob".to_string()).is_allowed());
    }

    // check_all: per user AND global, the global limiter synced too.
    let users = limiters(&rt, &server, "shared-users:", || {
        Limiter::<String>::builder().quota(Quota::per_minute(1_000))
    });
    let global = limiters(&rt, &server, "shared-global:", || {
        Limiter::<String>::builder().quota(Quota::per_minute(90).burst(90))
    });
    let all: Vec<_> = users.into_iter().zip(global).collect();
    let admitted = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for (i, (u, g)) in all.iter().enumerate() {
            let admitted = &admitted;
            s.spawn(move || {
                let deadline = Instant::now() + Duration::from_millis(1_500);
                let user = format!("user-{i}");
                let everyone = "everyone".to_string();
                while Instant::now() < deadline {
                    if check_all(&[&u.key(&user), &g.key(&everyone)], 1)
                        .unwrap()
                        .is_allowed()
                    {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    std::thread::yield_now();
                }
            });
        }
    });
    let admitted = admitted.load(Ordering::Relaxed);
    let (burst, rate) = (90.0, 90.0 / 60.0);
    let bound = burst + rate * 1.5 + (NODES - 1) as f64 * (burst + rate * 0.1);
    eprintln!("shared check_all: {admitted} admitted, global 90 a minute, bound {bound:.0}");
    assert!(admitted >= 90 && admitted as f64 <= bound, "{admitted}");
    std::thread::sleep(INTERVAL * 4);
    for (u, g) in &all {
        assert!(
            !check_all(
                &[&u.key(&"late".to_string()), &g.key(&"everyone".to_string())],
                1
            )
            .unwrap()
            .is_allowed()
        );
    }
}

/// While Redis is down the policy answers: `Closed` denies (counted as degraded), and after a
/// restart the limiter decides again; `Open` admits.
#[test]
fn a_dead_redis_answers_by_the_policy() {
    let _serial = serial();
    for policy in [FailurePolicy::Closed, FailurePolicy::Open] {
        let mut server = RedisServer::start();
        let rt = runtime();
        let l = {
            let _g = rt.enter();
            Limiter::<String>::builder()
                .quota(Quota::per_second(1_000_000).burst(1_000))
                .redis_synced(
                    RedisConfig::new(&server.url())
                        .interval(Duration::from_millis(20))
                        .deadline(Duration::from_millis(20))
                        .on_failure(policy)
                        .breaker(1, Duration::from_millis(20), Duration::from_millis(50)),
                )
                .build_shared()
                .unwrap()
        };
        let k = "k".to_string();
        let wait = |what: &str, f: &dyn Fn() -> bool| {
            let t = Instant::now();
            while !f() {
                assert!(t.elapsed() < Duration::from_secs(5), "{what} ({policy:?})");
                let _ = l.check(&"other".to_string());
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        wait("first round", &|| l.synced_stats().unwrap().rounds > 0);
        server.kill();
        wait("breaker open", &|| l.synced_stats().unwrap().degraded > 0);
        let d = l.check(&k);
        match policy {
            FailurePolicy::Closed => assert!(!d.is_allowed(), "{d:?}"),
            _ => assert!(d.is_allowed(), "{d:?}"),
        }
        server.restart();
        // Recovered: a check the local table decides again (not counted as degraded).
        wait("recovery", &|| {
            let before = l.synced_stats().unwrap().degraded;
            l.check(&k).is_allowed() && l.synced_stats().unwrap().degraded == before
        });
        assert!(l.synced_stats().unwrap().failed_rounds >= 1);
    }
}

/// A sliding log cannot be synced, a synced limiter is built with `build_shared`, and outside
/// a tokio runtime the rounds cannot start: clear construction errors.
#[test]
fn what_cannot_be_synced_is_a_construction_error() {
    let sync = || RedisConfig::new("redis://127.0.0.1:1/");
    let err = Limiter::<String>::builder()
        .quota(Quota::per_second(10))
        .redis_synced(sync())
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("build_shared"), "{err}");
    let err = Limiter::<String>::builder()
        .quota(Quota::per_second(10))
        .redis_synced(sync())
        .build_shared()
        .unwrap_err();
    assert!(err.to_string().contains("tokio runtime"), "{err}");
    let rt = runtime();
    let _g = rt.enter();
    let err = Limiter::<String>::builder()
        .quota(Quota::per_second(10).algorithm(Algorithm::SlidingWindowLog))
        .redis_synced(sync())
        .build_shared()
        .unwrap_err();
    assert!(
        matches!(err, Error::Config { .. }) && err.to_string().contains("exact mode"),
        "{err}"
    );
    let err = Limiter::<String>::builder()
        .quota(Quota::per_second(10))
        .redis_synced(RedisConfig::new("not a url"))
        .build_shared()
        .unwrap_err();
    assert!(matches!(err, Error::Config { .. }), "{err}");
}

/// Tiers across two processes: a low tier (`headroom` 10) and a high tier share one quota's
/// state on a global key; requests alternate between the two limiters, each a round apart.
/// The low tier is denied once fewer than 10 units would remain globally, the high tier spends
/// the rest: as one process would decide, give or take a first request on a fresh state.
#[test]
fn tiers_share_one_state_across_processes() {
    let _serial = serial();
    let server = RedisServer::start();
    let rt = runtime();
    let quota = || Quota::per_minute(20).burst(20);
    let ls = limiters(&rt, &server, "shared-tiers:", || {
        Limiter::<String>::builder()
            .plan("low", Plan::new([quota()]).headroom(10))
            .plan("high", Plan::new([quota()]))
    });
    // A plan id is its limiter's own: each resolves the plan by name.
    let (low, high) = (ls[0].plan("low").unwrap(), ls[1].plan("high").unwrap());
    let key = "everyone".to_string();
    let (mut low_in, mut high_in) = (0, 0);
    for _ in 0..20 {
        if ls[0].check_in(&key, low, 1).unwrap().is_allowed() {
            low_in += 1;
        }
        std::thread::sleep(Duration::from_millis(60));
        if ls[1].check_in(&key, high, 1).unwrap().is_allowed() {
            high_in += 1;
        }
        std::thread::sleep(Duration::from_millis(60));
    }
    eprintln!("tiers across two limiters: low {low_in}, high {high_in} (one process: 5 and 15)");
    assert!((5..=6).contains(&low_in), "low tier admitted {low_in}");
    assert!((14..=16).contains(&high_in), "high tier admitted {high_in}");
    assert!(low_in + high_in <= 21, "{low_in} + {high_in}");
}

/// `reset_async` of a synced limiter forgets the key on Redis (its global state) and the units
/// this process has not pushed yet: nothing brings them back in later rounds.
#[test]
fn reset_async_forgets_the_key_on_redis() {
    let _g = serial();
    let server = RedisServer::start();
    let rt = runtime();
    // A bucket and a window: one Redis key for the bucket, one per window for the window.
    let ls = limiters(&rt, &server, "rs:", || {
        Limiter::<String>::builder()
            .quota(Quota::new(4, Duration::from_secs(86_400)).burst(4))
            .quota(Quota::per_hour(100).algorithm(Algorithm::FixedWindow))
    });
    let k: String = "k".into();
    let held = || server.cli(&["KEYS", "rs:*"]);
    let windows = || held().lines().filter(|k| k.contains("fixed")).count();
    for l in &ls {
        assert!(l.check(&k).is_allowed());
    }
    // The rounds push every process's unit to the key's global state.
    let deadline = Instant::now() + Duration::from_secs(5);
    while windows() == 0 || held().lines().count() < 2 {
        assert!(
            Instant::now() < deadline,
            "no round pushed the key: {}",
            held()
        );
        std::thread::sleep(INTERVAL);
    }
    std::thread::sleep(INTERVAL * 2);
    // A unit charged just now is pending in ls[0] when it resets: dropped with the rest.
    assert!(ls[0].check(&k).is_allowed());
    assert!(
        rt.block_on(ls[0].reset_async(&k)).unwrap(),
        "Redis held the state"
    );
    assert_eq!(held().trim(), "", "deleted");
    std::thread::sleep(INTERVAL * 4);
    assert_eq!(held().trim(), "", "nothing pushed it back");
    let d = ls[0].peek_in(&k, PlanId::DEFAULT, 1).unwrap();
    assert_eq!((d.is_allowed(), d.remaining()), (true, 3), "fresh here");
}

/// Keys that differ only where a brace stands (`{alice}` and `_alice_`, `a{b` and `a_b`, `}`
/// and `_`) are distinct clients on Redis, as in process: each spends its own 25 a day. The
/// second key of a pair is checked once and waits for a round to adopt its global state before
/// it goes on, so a state shared on Redis with the first key would show as denials.
#[test]
fn lookalike_keys_are_distinct_clients() {
    let _g = serial();
    let server = RedisServer::start();
    let rt = runtime();
    let per_day = || Quota::new(25, Duration::from_secs(86_400)).burst(25);
    let ls = limiters(&rt, &server, "lookalike:", || {
        Limiter::<String>::builder().quota(per_day())
    });
    let local = Limiter::<String>::builder()
        .quota(per_day())
        .build()
        .unwrap();
    // Waits until `l`'s rounds have pushed `n` units in all (each admitted unit is pushed
    // once, and a round adopts the global states before it counts what it pushed).
    let pushed = |l: &Limiter<String>, n: u64| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while l.synced_stats().unwrap().units_pushed < n {
            assert!(Instant::now() < deadline, "{:?}", l.synced_stats());
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let admit = |l: &Limiter<String>, k: &str, n: u64| -> u64 {
        (0..n)
            .map(|_| u64::from(l.check(&k.to_string()).is_allowed()))
            .sum()
    };
    let (mut first_pushed, mut second_pushed) = (0, 0);
    for (a, b) in [
        ("{alice}", "_alice_"),
        ("a{b", "a_b"),
        ("}", "_"),
        ("", "%"),
    ] {
        let in_process = (admit(&local, a, 30), admit(&local, b, 30));
        assert_eq!(in_process, (25, 25), "{a:?} / {b:?} in process");
        let first = admit(&ls[0], a, 30);
        first_pushed += first;
        pushed(&ls[0], first_pushed);
        let mut second = admit(&ls[1], b, 1);
        second_pushed += second;
        pushed(&ls[1], second_pushed);
        second += admit(&ls[1], b, 29);
        second_pushed += second - 1;
        assert_eq!((first, second), in_process, "{a:?} / {b:?} synced");
    }
}
