//! Exact mode when Redis is down, slow or has lost its data, with faults injected into a real
//! redis-server: SIGKILL and restart, SIGSTOP / SIGCONT, SCRIPT FLUSH, SHUTDOWN NOSAVE, and a
//! limiter that starts before its server.
#![cfg(feature = "redis")]

mod redis_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis_support::{RedisServer, free_port};
use tollgate::Quota;
use tollgate::redis::{FailurePolicy, RedisLimiter, Source};

const DEADLINE: Duration = Duration::from_millis(20);
/// Scheduling slack on a shared, noisy machine (timer wheel granularity, a busy runtime).
const SLACK: Duration = Duration::from_millis(80);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn limiter(url: &str, prefix: &str, policy: FailurePolicy) -> RedisLimiter {
    RedisLimiter::builder(url)
        .prefix(prefix)
        .quota(Quota::per_second(1_000_000).burst(1_000_000))
        .deadline(DEADLINE)
        .on_failure(policy)
        .breaker(3, Duration::from_millis(50), Duration::from_millis(200))
        .build()
        .unwrap()
}

/// What a loop of calls saw.
#[derive(Default, Debug)]
struct Seen {
    calls: u64,
    exact: u64,
    degraded: u64,
    policy_broken: u64,
    slowest: Duration,
}

/// Calls `l` in a loop until `stop`, checking the policy on every degraded answer.
async fn hammer(l: RedisLimiter, policy: FailurePolicy, stop: Arc<AtomicBool>) -> Seen {
    let mut seen = Seen::default();
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let t = Instant::now();
        let c = l.check(&format!("k{}", i % 16)).await;
        seen.slowest = seen.slowest.max(t.elapsed());
        seen.calls += 1;
        let ok = match (c.source(), policy) {
            (Source::Redis, _) => {
                seen.exact += 1;
                true
            }
            (Source::FailedOpen, FailurePolicy::Open) => c.decision().is_allowed(),
            (Source::FailedClosed, FailurePolicy::Closed) => !c.decision().is_allowed(),
            (Source::LocalShare, FailurePolicy::LocalShare { .. }) => true,
            _ => false,
        };
        if c.is_degraded() {
            seen.degraded += 1;
        }
        if !ok {
            seen.policy_broken += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    seen
}

#[test]
fn sigkill_then_restart_honours_the_policy_and_recovers() {
    let mut server = RedisServer::start();
    let rt = runtime();
    let policies = [
        FailurePolicy::Open,
        FailurePolicy::Closed,
        FailurePolicy::LocalShare { nodes: 3 },
    ];
    let limiters: Vec<RedisLimiter> = policies
        .iter()
        .enumerate()
        .map(|(i, p)| limiter(&server.url(), &format!("kill{i}:"), *p))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = limiters
        .iter()
        .zip(policies)
        .map(|(l, p)| rt.spawn(hammer(l.clone(), p, stop.clone())))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    server.kill();
    std::thread::sleep(Duration::from_millis(600));
    let down = limiters
        .iter()
        .map(|l| l.stats().degraded())
        .collect::<Vec<_>>();
    server.restart();
    let restarted = Instant::now();
    // Recovery: every limiter answers from Redis again, by itself.
    let mut recovered = Vec::new();
    for l in &limiters {
        let before = l.stats().exact;
        while l.stats().exact == before {
            assert!(
                restarted.elapsed() < Duration::from_secs(5),
                "no recovery in 5 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        recovered.push(restarted.elapsed());
    }
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::SeqCst);
    for ((t, l), p) in tasks.into_iter().zip(&limiters).zip(policies) {
        let seen = rt.block_on(t).unwrap();
        let st = l.stats();
        eprintln!("{p:?}: {seen:?}; stats {st:?}");
        assert_eq!(seen.policy_broken, 0, "{p:?}: policy not honoured");
        assert!(seen.degraded > 0 && seen.exact > 0);
        assert!(
            seen.slowest <= DEADLINE + SLACK,
            "{p:?}: a call took {:?}",
            seen.slowest
        );
        assert_eq!(
            st.degraded(),
            seen.degraded,
            "every degraded decision is counted"
        );
        assert!(st.breaker_opens >= 1);
        assert_eq!(st.in_flight, 0);
    }
    assert!(down.iter().all(|&d| d > 0));
    eprintln!("recovery after restart: {recovered:?}");
}

#[test]
fn sigstop_calls_end_at_the_deadline_without_pile_up() {
    let server = RedisServer::start();
    let rt = runtime();
    let l = limiter(&server.url(), "stop:", FailurePolicy::Closed);
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..8)
        .map(|_| rt.spawn(hammer(l.clone(), FailurePolicy::Closed, stop.clone())))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mem_before = server.info("used_memory").unwrap();
    server.pause();
    std::thread::sleep(Duration::from_millis(1500));
    let during = l.stats();
    server.resume();
    let resumed = Instant::now();
    let before = l.stats().exact;
    while l.stats().exact == before {
        assert!(
            resumed.elapsed() < Duration::from_secs(5),
            "no recovery after SIGCONT"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let recovery = resumed.elapsed();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let mut slowest = Duration::ZERO;
    for t in tasks {
        let seen = rt.block_on(t).unwrap();
        assert_eq!(seen.policy_broken, 0);
        slowest = slowest.max(seen.slowest);
    }
    let st = l.stats();
    let clients = server.info("connected_clients").unwrap();
    let mem_after = server.info("used_memory").unwrap();
    eprintln!(
        "SIGSTOP: slowest call {slowest:?}, recovery {recovery:?}, stats while stopped {during:?}, \
         after {st:?}, server clients {clients}, memory {mem_before} -> {mem_after}"
    );
    assert!(slowest <= DEADLINE + SLACK, "a call took {slowest:?}");
    assert!(
        during.timeouts >= 1 && during.short_circuited > 0,
        "the breaker never opened"
    );
    // While stopped, calls were short-circuited, not sent: only probes reached the socket, plus
    // at most one call per task that passed the breaker just before each time it opened.
    assert!(
        during.timeouts <= 8 + during.probes + during.breaker_opens,
        "calls piled up: {during:?}"
    );
    assert!(during.short_circuited > 10 * during.timeouts, "{during:?}");
    assert_eq!(st.in_flight, 0);
    // Our one connection plus redis-cli's own; probes that timed out were closed.
    assert!(clients <= 3, "{clients} clients connected after recovery");
    assert!(
        mem_after < mem_before + 1_000_000,
        "server memory grew {mem_before} -> {mem_after}"
    );
}

#[test]
fn script_flush_mid_run_never_reaches_the_caller() {
    let server = RedisServer::start();
    let rt = runtime();
    let l = RedisLimiter::builder(&server.url())
        .prefix("flush:")
        .quota(Quota::per_second(1_000_000).burst(1_000_000))
        .deadline(Duration::from_secs(2))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..4)
        .map(|_| rt.spawn(hammer(l.clone(), FailurePolicy::Closed, stop.clone())))
        .collect();
    for _ in 0..25 {
        std::thread::sleep(Duration::from_millis(20));
        assert!(server.cli(&["SCRIPT", "FLUSH"]).contains("OK"));
    }
    stop.store(true, Ordering::SeqCst);
    let mut calls = 0;
    for t in tasks {
        let seen = rt.block_on(t).unwrap();
        assert_eq!(seen.degraded, 0, "a flush reached the caller: {seen:?}");
        calls += seen.calls;
    }
    let st = l.stats();
    eprintln!("SCRIPT FLUSH x25: {calls} calls, {st:?}");
    assert!(st.reloads >= 5, "the flushes were never noticed: {st:?}");
    assert_eq!(st.errors + st.timeouts, 0);
}

#[test]
fn shutdown_nosave_loses_at_most_one_burst_per_key() {
    const BURST: u64 = 5;
    let mut server = RedisServer::start();
    let rt = runtime();
    let l = RedisLimiter::builder(&server.url())
        .prefix("lost:")
        // One unit per 100 s after the burst: nothing refills during the test.
        .quota(Quota::new(1, Duration::from_secs(100)).burst(BURST))
        .deadline(Duration::from_millis(50))
        .breaker(2, Duration::from_millis(20), Duration::from_millis(100))
        .build()
        .unwrap();
    let keys = ["a", "b", "c"];
    let count = |n: usize| {
        rt.block_on(async {
            let mut admitted = [0u64; 3];
            for (i, k) in keys.iter().enumerate() {
                for _ in 0..n {
                    let c = l.check(k).await;
                    if c.decision().is_allowed() {
                        assert_eq!(c.source(), Source::Redis);
                        admitted[i] += 1;
                    }
                }
            }
            admitted
        })
    };
    assert_eq!(count(20), [BURST; 3]);
    assert_eq!(count(5), [0; 3]);
    let _ = server.cli(&["SHUTDOWN", "NOSAVE"]);
    server.wait_exit();
    // Down: the default policy (closed) denies.
    assert_eq!(count(3), [0; 3]);
    server.restart();
    let t = Instant::now();
    rt.block_on(async {
        while l.check("probe").await.source() != Source::Redis {
            assert!(t.elapsed() < Duration::from_secs(5), "no recovery");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    // The data is gone: each key gets its burst once more, and no more than that.
    let after = count(20);
    eprintln!(
        "after SHUTDOWN NOSAVE: {after:?} admitted (burst {BURST}); recovery {:?}",
        t.elapsed()
    );
    assert_eq!(after, [BURST; 3]);
}

#[test]
fn a_limiter_starts_while_redis_is_down_and_recovers_by_itself() {
    let port = free_port(false);
    let rt = runtime();
    let l = limiter(
        &format!("redis://127.0.0.1:{port}/"),
        "late:",
        FailurePolicy::Closed,
    );
    let slowest = rt.block_on(async {
        let mut slowest = Duration::ZERO;
        for _ in 0..50 {
            let t = Instant::now();
            let c = l.check("k").await;
            slowest = slowest.max(t.elapsed());
            assert_eq!(c.source(), Source::FailedClosed);
            assert!(!c.decision().is_allowed());
            assert!(c.decision().retry_after() > Duration::ZERO);
        }
        slowest
    });
    assert!(slowest <= DEADLINE + SLACK);
    assert_eq!(l.stats().failed_closed, 50);
    let _server = RedisServer::start_at(port);
    let t = Instant::now();
    rt.block_on(async {
        while l.check("k").await.source() != Source::Redis {
            assert!(t.elapsed() < Duration::from_secs(5), "no recovery");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    eprintln!(
        "started while down: recovered {:?} after the server came up",
        t.elapsed()
    );
    let _ = AtomicU64::new(0);
}

#[test]
fn a_corrupted_key_is_answered_by_the_policy_without_tripping_the_breaker() {
    let server = RedisServer::start();
    let rt = runtime();
    // Values another program could leave at a key: none of them a state this limiter writes
    // (numbers with letters, signs, exponents, too many digits, the wrong shape).
    let values = [
        "not:a:state:at:all",
        "12abc",
        "-5",
        "1e30",
        "123456789012345678901234567890",
        "1:2:3:4",
    ];
    for (i, quota) in [
        Quota::per_second(10),
        Quota::per_second(10).algorithm(tollgate::Algorithm::FixedWindow),
        Quota::per_second(10).algorithm(tollgate::Algorithm::SlidingWindowCounter),
        Quota::per_second(10).algorithm(tollgate::Algorithm::SlidingWindowLog),
    ]
    .into_iter()
    .enumerate()
    {
        let l = RedisLimiter::builder(&server.url())
            .prefix(format!("bad{i}:"))
            .quota(quota)
            .deadline(Duration::from_secs(1))
            .build()
            .unwrap();
        // Another program writes a string under each of these keys, and a list under one more
        // (a list of a foreign entry, for a sliding log).
        let names: Vec<String> = (0..values.len()).map(|v| format!("garbage{v}")).collect();
        for (name, value) in names.iter().zip(values) {
            server.cli(&["SET", &l.keys_of(name)[0], value]);
        }
        let list = l.keys_of("list")[0].clone();
        server.cli(&["RPUSH", &list, "x"]);
        let mut bad: Vec<&str> = names.iter().map(String::as_str).chain(["list"]).collect();
        // A sliding log's total (its second key) that is not a count.
        let total = l.keys_of("total");
        if let [_, total] = total.as_slice() {
            server.cli(&["SET", total, "-3"]);
            bad.push("total");
        }
        rt.block_on(async {
            // Many calls in a row on the bad keys, none between them that succeeds (a success
            // would reset the breaker's count of failures).
            for _ in 0..5 {
                for &key in &bad {
                    let c = l.check(key).await;
                    assert_eq!(c.source(), Source::FailedClosed, "{quota:?} {key}");
                    assert!(!c.decision().is_allowed());
                }
            }
            assert_eq!(l.check("fine").await.source(), Source::Redis, "{quota:?}");
        });
        let st = l.stats();
        let calls = 5 * bad.len() as u64;
        assert_eq!(st.breaker_opens, 0, "{quota:?}: {st:?}");
        assert_eq!(st.errors, calls);
        assert_eq!(st.failed_closed, calls);
        // Nothing was written over the other program's data.
        for (name, value) in names.iter().zip(values) {
            assert_eq!(
                server.cli(&["GET", &l.keys_of(name)[0]]).trim(),
                value,
                "{quota:?}"
            );
        }
        assert_eq!(server.cli(&["LRANGE", &list, "0", "-1"]).trim(), "x");
    }
}
