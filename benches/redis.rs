//! Redis benchmark (harness = false): exact-mode throughput and latency against
//! `redis-benchmark`'s raw EVALSHA (of the same script, same arguments) and INCR on the same
//! server in the same run, then synced-mode checks per second on 2 threads and its measured
//! over-admission with three engines on one key.
//!
//! Run in `benches/`: `cargo bench --bench redis --features redis` (starts and stops its own redis-server on a
//! free loopback port; needs `redis-server` and `redis-benchmark` on PATH).

#[path = "../tests/redis_support/mod.rs"]
mod redis_support;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis_support::RedisServer;
use tollgate::redis::{RedisConfig, RedisLimiter, Source, SyncedLimiter};
use tollgate::{Limiter, Quota};

/// Requests in flight at once, for both redis-benchmark (connections) and our client (tasks).
const CONCURRENCY: usize = 64;
const KEYS: u64 = 10_000;
const REQUESTS: usize = 200_000;

/// Runs redis-benchmark and returns (requests/s, p50 ms, p99 ms) from its CSV line.
fn redis_benchmark(port: u16, args: &[&str]) -> (f64, f64, f64) {
    let out = Command::new("redis-benchmark")
        .args(["-p", &port.to_string()])
        .args(["-c", &CONCURRENCY.to_string()])
        .args(["-n", &REQUESTS.to_string()])
        .args(["-r", &KEYS.to_string()])
        .args(["--threads", "1", "--csv"])
        .args(args)
        .output()
        .expect("redis-benchmark");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| !l.starts_with("\"test\"") && l.contains(','))
        .unwrap_or_else(|| panic!("no CSV from redis-benchmark: {text}"));
    let f: Vec<f64> = line
        .split(',')
        .skip(1)
        .map(|v| v.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    // rps, avg, min, p50, p95, p99, max
    (f[0], f[3], f[5])
}

/// Calls of `check` per second from 2 threads for 2 s, each over its own 1,000 keys.
fn checks_per_second(check: impl Fn(&String) + Send + Sync + Clone + 'static) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (check, stop, total) = (check.clone(), stop.clone(), total.clone());
            std::thread::spawn(move || {
                let keys: Vec<String> = (0..1000).map(|k| format!("t{t}k{k}")).collect();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for k in &keys {
                        check(k);
                    }
                    n += keys.len() as u64;
                }
                total.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    total.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

/// CONCURRENCY tasks, REQUESTS calls of `check` in all over keys spread on KEYS: the calls per
/// second and every call's latency in µs, sorted. `check` says whether Redis answered.
fn drive<F, Fut>(rt: &tokio::runtime::Runtime, check: F) -> (f64, Vec<u32>)
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let lat: Vec<Vec<u32>> = rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..CONCURRENCY {
            let (check, done) = (check.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(REQUESTS / CONCURRENCY + 1);
                let mut x = c as u64 * 7919 + 1;
                for _ in 0..REQUESTS / CONCURRENCY {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let key = format!("{}", (x >> 33) % KEYS);
                    let t = Instant::now();
                    let answered = check(key).await;
                    lat.push(t.elapsed().as_micros() as u32);
                    assert!(answered, "Redis answered every call");
                    done.fetch_add(1, Ordering::Relaxed);
                }
                lat
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await.unwrap());
        }
        all
    });
    let secs = start.elapsed().as_secs_f64();
    let mut lat: Vec<u32> = lat.into_iter().flatten().collect();
    lat.sort_unstable();
    (done.load(Ordering::Relaxed) as f64 / secs, lat)
}

fn main() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let quota = Quota::per_second(1_000_000).burst(1_000_000);
    let limiter = RedisLimiter::builder(&server.url())
        .prefix("bench:")
        .quota(quota)
        .deadline(Duration::from_secs(1))
        .build()
        .unwrap();

    // Load the script and find its hash and arguments (the same EVALSHA our client sends).
    let first = rt.block_on(limiter.check("warm"));
    assert_eq!(first.source(), Source::Redis);
    let scripts = limiter.script_sha().to_string();
    // Tolerance and n*T for cost 1, as the client sends them.
    let t_ns = 1_000u64; // 1e9 / 1e6
    let tau = (1_000_000u64 * t_ns).to_string();
    let nt = t_ns.to_string();

    println!("# tollgate Redis benchmark");
    println!(
        "machine: {} cores, redis-server {}, concurrency {CONCURRENCY}, {KEYS} keys, {REQUESTS} requests",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        server
            .cli(&["INFO", "server"])
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim()
    );

    let (incr_rps, incr_p50, incr_p99) =
        redis_benchmark(server.port, &["INCR", "bench:incr:__rand_int__"]);
    let (eval_rps, eval_p50, eval_p99) = redis_benchmark(
        server.port,
        &[
            "EVALSHA",
            &scripts,
            "1",
            // The key our client names for this quota (see `RedisLimiter::keys_of`).
            "bench:{__rand_int__}:t1000000/1000000000+1000000",
            "1",
            "g",
            &nt,
            &tau,
            "x",
        ],
    );

    // Our client: CONCURRENCY tasks over one multiplexed connection, REQUESTS calls in all;
    // then the same through a `Limiter` in exact mode (its plan's RedisLimiter, by
    // `check_async`).
    let (ours_rps, lat) = drive(&rt, {
        let l = limiter.clone();
        move |key| {
            let l = l.clone();
            async move { l.check(&key).await.source() == Source::Redis }
        }
    });
    let pct = |lat: &[u32], p: f64| {
        lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1000.0
    };
    let exact = Limiter::<String>::builder()
        .quota(quota)
        .redis_exact(
            RedisConfig::new(&server.url())
                .prefix("bexact:")
                .deadline(Duration::from_secs(1)),
        )
        .build_shared()
        .unwrap();
    let (exact_rps, exact_lat) = drive(&rt, {
        move |key| {
            let l = exact.clone();
            async move { l.check_async(&key).await.is_allowed() }
        }
    });

    println!();
    println!("| exact mode, same server, same run | requests/s | p50 ms | p99 ms |");
    println!("|---|---|---|---|");
    println!("| redis-benchmark INCR | {incr_rps:.0} | {incr_p50:.3} | {incr_p99:.3} |");
    println!(
        "| redis-benchmark EVALSHA (our GCRA script) | {eval_rps:.0} | {eval_p50:.3} | {eval_p99:.3} |"
    );
    println!(
        "| tollgate RedisLimiter::check (1 multiplexed connection) | {ours_rps:.0} | {:.3} | {:.3} |",
        pct(&lat, 0.5),
        pct(&lat, 0.99)
    );
    println!(
        "| tollgate Limiter in exact mode, check_async (1 connection) | {exact_rps:.0} | {:.3} | {:.3} |",
        pct(&exact_lat, 0.5),
        pct(&exact_lat, 0.99)
    );
    println!(
        "ratio tollgate / raw EVALSHA: {:.2}x (target >= 0.9x)",
        ours_rps / eval_rps
    );
    println!("stats: {:?}", limiter.stats());

    // Synced mode: checks per second, 2 threads, 1000 keys each.
    let synced = {
        let _g = rt.enter();
        Arc::new(
            SyncedLimiter::builder(&server.url())
                .prefix("bsync:")
                .quota(Quota::per_second(1_000_000_000).burst(1_000_000))
                .interval(Duration::from_millis(100))
                .build()
                .unwrap(),
        )
    };
    let synced_rate = {
        let s = synced.clone();
        checks_per_second(move |k| {
            let _ = std::hint::black_box(s.check(k));
        })
    };
    println!();
    println!(
        "synced mode: {:.1} M checks/s on 2 threads (2,000 keys, interval 100 ms; target >= 10 M/s); {:?}",
        synced_rate / 1e6,
        synced.stats()
    );

    // A Limiter synced through Redis: check_in of a plan, 2 threads, 1,000 keys each.
    let limiter = {
        let _g = rt.enter();
        tollgate::Limiter::<String>::builder()
            .quota(Quota::per_second(1))
            .plan(
                "api",
                tollgate::Plan::new([Quota::per_second(1_000_000_000).burst(1_000_000)]),
            )
            .redis_synced(
                tollgate::redis::RedisConfig::new(&server.url())
                    .prefix("blim:")
                    .interval(Duration::from_millis(100)),
            )
            .build_shared()
            .unwrap()
    };
    let api = limiter.plan("api").unwrap();
    let limiter_rate = {
        let l = limiter.clone();
        checks_per_second(move |k| {
            let _ = std::hint::black_box(l.check_in(k, api, 1));
        })
    };
    println!(
        "Limiter synced through Redis: {:.1} M check_in/s on 2 threads (2,000 keys, interval 100 ms); {:?}",
        limiter_rate / 1e6,
        limiter.synced_stats()
    );

    // Over-admission: three engines, each with its own connection, one key, one thread each.
    const RATE: u64 = 1000;
    const BURST: u64 = 50;
    for interval_ms in [10u64, 50, 100] {
        let engines: Vec<Arc<SyncedLimiter>> = {
            let _g = rt.enter();
            (0..3)
                .map(|_| {
                    Arc::new(
                        SyncedLimiter::builder(&server.url())
                            .prefix(format!("over{interval_ms}:"))
                            .quota(Quota::per_second(RATE).burst(BURST))
                            .interval(Duration::from_millis(interval_ms))
                            .build()
                            .unwrap(),
                    )
                })
                .collect()
        };
        let stop = Arc::new(AtomicBool::new(false));
        let admitted = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let threads: Vec<_> = engines
            .iter()
            .map(|e| {
                let (e, stop, admitted) = (e.clone(), stop.clone(), admitted.clone());
                std::thread::spawn(move || {
                    let mut a = 0;
                    while !stop.load(Ordering::Relaxed) {
                        if e.check("hot").is_allowed() {
                            a += 1;
                        }
                    }
                    admitted.fetch_add(a, Ordering::Relaxed);
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        let secs = start.elapsed().as_secs_f64();
        let exact = BURST as f64 + RATE as f64 * secs;
        let got = admitted.load(Ordering::Relaxed) as f64;
        let bound = exact + 2.0 * (BURST as f64 + RATE as f64 * interval_ms as f64 / 1000.0);
        println!(
            "over-admission, 3 engines, {RATE}/s burst {BURST}, interval {interval_ms} ms, {secs:.1} s: \
             admitted {got:.0}, exact {exact:.0}, over {:+.0} ({:+.1}%), documented bound +{:.0}",
            got - exact,
            (got - exact) / exact * 100.0,
            bound - exact
        );
    }
}
