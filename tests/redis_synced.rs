//! Synced mode against a real redis-server: three engines (each with its own connection)
//! hammer one key from three threads, for a token bucket, a fixed window and a sliding window
//! counter; the admitted units stay within each algorithm's documented over-admission bound,
//! and the global state really is shared.
#![cfg(feature = "redis")]

mod redis_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis_support::RedisServer;
use tollgate::Quota;
use tollgate::redis::{FailurePolicy, SyncedLimiter};

const RATE: u64 = 200; // per second
const BURST: u64 = 20;
const NODES: u64 = 3;
const INTERVAL: Duration = Duration::from_millis(50);

/// The hammering tests run one at a time: each keeps three threads busy, and the bounds assume
/// each engine's rounds keep to their interval.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn three_engines_on_one_key_stay_within_the_bound() {
    let _serial = serial();
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let engines: Vec<Arc<SyncedLimiter>> = {
        let _g = rt.enter();
        (0..NODES)
            .map(|_| {
                Arc::new(
                    SyncedLimiter::builder(&server.url())
                        .prefix("synced:")
                        .quota(Quota::per_second(RATE).burst(BURST))
                        .interval(INTERVAL)
                        .build()
                        .unwrap(),
                )
            })
            .collect()
    };
    let admitted = Arc::new(AtomicU64::new(0));
    let checks = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let threads: Vec<_> = engines
        .iter()
        .map(|e| {
            let (e, admitted, checks, stop) =
                (e.clone(), admitted.clone(), checks.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut a, mut c) = (0, 0);
                while !stop.load(Ordering::Relaxed) {
                    if e.check("hot").is_allowed() {
                        a += 1;
                    }
                    c += 1;
                    if c % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
                admitted.fetch_add(a, Ordering::SeqCst);
                checks.fetch_add(c, Ordering::SeqCst);
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    // The global state carries a TTL (sampled while the engines run: the key is in debt).
    let ttl: i64 = server
        .cli(&["PTTL", "synced:{hot}:s"])
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 0, "PTTL {ttl}");
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let total = admitted.load(Ordering::SeqCst) as f64;
    let exact = BURST as f64 + RATE as f64 * elapsed;
    // burst + rate*t + (N-1) * (burst + rate * (interval + round trip)); 50 ms allowed for the
    // round trip and timer lateness on a shared machine.
    let slack_s = INTERVAL.as_secs_f64() + 0.05;
    let bound = exact + (NODES - 1) as f64 * (BURST as f64 + RATE as f64 * slack_s);
    let stats: Vec<_> = engines.iter().map(|e| e.stats()).collect();
    eprintln!(
        "synced, {NODES} engines, {RATE}/s burst {BURST}, interval {INTERVAL:?}: {total} admitted in \
         {elapsed:.2} s of {} checks; exact {exact:.0}, over-admission {:.0} ({:.1}%), bound {bound:.0}; {stats:?}",
        checks.load(Ordering::SeqCst),
        total - exact,
        (total - exact) / exact * 100.0,
    );
    assert!(total <= bound, "admitted {total}, bound {bound:.0}");
    // Shared state is real: without it three engines would admit about three times the rate.
    assert!(
        total < exact * 1.5,
        "engines did not share state: {total} vs {exact:.0}"
    );
    assert!(
        total >= exact * 0.8,
        "under-admitted: {total} vs {exact:.0}"
    );
    for s in &stats {
        assert!(s.rounds >= 10 && s.failed_rounds <= 2, "{s:?}");
    }
}

/// Waits up to 5 s for `f`, checking another key on `e` meanwhile (a round reaches Redis, and
/// learns that it is down, only when it has a touched key to push); how long it waited.
fn wait_checking(e: &SyncedLimiter, what: &str, f: &dyn Fn() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(5), "{what}");
        let _ = e.check("other");
        std::thread::sleep(Duration::from_millis(2));
    }
    t.elapsed()
}

#[test]
fn synced_mode_degrades_by_policy_and_recovers() {
    let mut server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let e = {
        let _g = rt.enter();
        SyncedLimiter::builder(&server.url())
            .prefix("syncfail:")
            .quota(Quota::per_second(1_000_000).burst(1_000))
            .interval(Duration::from_millis(20))
            .deadline(Duration::from_millis(20))
            .on_failure(FailurePolicy::Closed)
            .breaker(1, Duration::from_millis(20), Duration::from_millis(50))
            .build()
            .unwrap()
    };
    let wait = |what: &str, f: &dyn Fn() -> bool| wait_checking(&e, what, f);
    wait("first round", &|| e.stats().rounds > 0);
    server.kill();
    // The next failed round opens the breaker: checks are then denied (fail closed), counted.
    wait("breaker open", &|| !e.check("k").is_allowed());
    let degraded = e.stats().degraded;
    assert!(degraded >= 1);
    assert!(!e.check("k").is_allowed());
    assert_eq!(e.stats().degraded, degraded + 1);
    server.restart();
    let recovery = wait("recovery", &|| e.check("k").is_allowed());
    eprintln!(
        "synced: recovered {recovery:?} after restart; {:?}",
        e.stats()
    );
    assert!(e.stats().failed_rounds >= 1);
}

/// With `LocalShare`, while the breaker is open the local cells go on deciding alone (the whole
/// quota: `nodes` is not used in synced mode), and every such decision counts as degraded.
#[test]
fn synced_local_share_decides_locally_and_counts_it() {
    let mut server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let e = {
        let _g = rt.enter();
        SyncedLimiter::builder(&server.url())
            .prefix("synclocal:")
            .quota(Quota::per_minute(5).burst(5))
            .interval(Duration::from_millis(20))
            .deadline(Duration::from_millis(20))
            .on_failure(FailurePolicy::LocalShare { nodes: 2 })
            .breaker(1, Duration::from_millis(50), Duration::from_millis(200))
            .build()
            .unwrap()
    };
    let wait = |what: &str, f: &dyn Fn() -> bool| wait_checking(&e, what, f);
    wait("first round", &|| e.stats().rounds > 0);
    server.kill();
    wait("breaker open", &|| e.stats().degraded > 0);
    let degraded = e.stats().degraded;
    let admitted = (0..8).filter(|_| e.check("k").is_allowed()).count();
    assert_eq!(admitted, 5, "the local cell decides with the whole quota");
    assert_eq!(e.stats().degraded, degraded + 8);
}

/// Three engines hammer one key of a window algorithm (`limit` per 1 s window) for about four
/// windows; returns the units admitted in each whole Unix-aligned window (by the wall clock at
/// each admission, or, `by_reset`, by the end of the window the decision names), and each
/// engine's stats.
fn three_on_a_window(
    server: &RedisServer,
    prefix: &str,
    quota: Quota,
    by_reset: bool,
) -> (Vec<u64>, Vec<tollgate::redis::SyncedStats>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let engines: Vec<Arc<SyncedLimiter>> = {
        let _g = rt.enter();
        (0..NODES)
            .map(|_| {
                Arc::new(
                    SyncedLimiter::builder(&server.url())
                        .prefix(prefix)
                        .quota(quota)
                        .interval(INTERVAL)
                        .build()
                        .unwrap(),
                )
            })
            .collect()
    };
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    // Start just after a window boundary, run four whole windows and a little.
    std::thread::sleep(Duration::from_millis(1_000 - unix_ms() % 1_000 + 20));
    let first = unix_ms() / 1_000;
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = engines
        .iter()
        .map(|e| {
            let (e, stop) = (e.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut per_window = std::collections::HashMap::<u64, u64>::new();
                let mut c = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let d = e.check("hot");
                    if d.is_allowed() {
                        // The limiter's own window (its clock and the wall clock differ by
                        // milliseconds, and a fixed window's admissions come at its very start):
                        // a fixed window ends `reset_after` from now, at a whole second.
                        let second = if by_reset {
                            (unix_ms() + d.reset_after().as_millis() as u64 + 500) / 1_000 - 1
                        } else {
                            unix_ms() / 1_000
                        };
                        *per_window.entry(second).or_default() += 1;
                    }
                    c += 1;
                    if c % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
                per_window
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(4_100));
    stop.store(true, Ordering::SeqCst);
    let mut windows = vec![0u64; 4];
    for t in threads {
        for (w, n) in t.join().unwrap() {
            if let Some(slot) = w
                .checked_sub(first)
                .and_then(|i| windows.get_mut(i as usize))
            {
                *slot += n;
            }
        }
    }
    (windows, engines.iter().map(|e| e.stats()).collect())
}

/// Synced fixed windows: in every window the engines together admit at most the documented
/// bound `limit + (N - 1) * min(limit, d)` (`d`, what one engine admits in an interval and a
/// round trip, is the whole limit here: the engines hammer), which the first window, with no
/// shares known yet, reaches; from the second window on each engine starts at the others'
/// share of the last one, and the engines together admit the limit (within 10% either way).
#[test]
fn synced_fixed_windows_stay_within_their_bound() {
    let _serial = serial();
    let server = RedisServer::start();
    const LIMIT: u64 = 300;
    let quota = Quota::per_second(LIMIT).algorithm(tollgate::Algorithm::FixedWindow);
    let (windows, stats) = three_on_a_window(&server, "syncfixed:", quota, true);
    let bound = LIMIT + (NODES - 1) * LIMIT;
    eprintln!(
        "synced fixed window, {NODES} engines, {LIMIT}/s, interval {INTERVAL:?}: admitted per \
         window {windows:?}, limit {LIMIT}, bound {bound}; {stats:?}"
    );
    for (i, &n) in windows.iter().enumerate() {
        assert!(n <= bound, "window {i}: {n} admitted, bound {bound}");
    }
    for (i, &n) in windows.iter().enumerate().skip(1) {
        assert!(
            (LIMIT * 9 / 10..=LIMIT * 11 / 10).contains(&n),
            "window {i}: {n} admitted, limit {LIMIT}: {windows:?}"
        );
    }
    for s in &stats {
        assert!(s.rounds >= 20 && s.failed_rounds <= 2, "{s:?}");
    }
}

/// Synced sliding window counters: the global previous-window count weighs on every engine
/// from the window's first round on, so there is no burst at a boundary; every window admits
/// at most `limit + (N - 1) * min(limit, d)`, and from the second on close to the limit (the
/// estimate lets each engine spend what the previous window's decaying weight frees between
/// two rounds: within 30% over, never under 80%).
#[test]
fn synced_sliding_windows_stay_within_their_bound() {
    let _serial = serial();
    let server = RedisServer::start();
    const LIMIT: u64 = 300;
    let quota = Quota::per_second(LIMIT).algorithm(tollgate::Algorithm::SlidingWindowCounter);
    let (windows, stats) = three_on_a_window(&server, "syncsliding:", quota, false);
    let bound = LIMIT + (NODES - 1) * LIMIT;
    eprintln!(
        "synced sliding window counter, {NODES} engines, {LIMIT}/s, interval {INTERVAL:?}: \
         admitted per window {windows:?}, limit {LIMIT}, bound {bound}; {stats:?}"
    );
    for (i, &n) in windows.iter().enumerate() {
        assert!(n <= bound, "window {i}: {n} admitted, bound {bound}");
    }
    for (i, &n) in windows.iter().enumerate().skip(1) {
        assert!(
            (LIMIT * 8 / 10..=LIMIT * 13 / 10).contains(&n),
            "window {i}: {n} admitted, limit {LIMIT}: {windows:?}"
        );
    }
    for s in &stats {
        assert!(s.rounds >= 20 && s.failed_rounds <= 2, "{s:?}");
    }
}

/// A sliding log cannot be synced (it keeps every request's time): a construction error that
/// says to use exact mode.
#[test]
fn a_synced_sliding_log_is_a_construction_error() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _g = rt.enter();
    let err = SyncedLimiter::builder("redis://127.0.0.1:1/")
        .quota(Quota::per_second(10).algorithm(tollgate::Algorithm::SlidingWindowLog))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("exact mode"), "{err}");
}
