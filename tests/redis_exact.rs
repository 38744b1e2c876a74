//! Exact mode against a real redis-server: every script makes the in-process engine's decisions
//! on the same trace, keys always carry a TTL, and concurrent clients admit exactly the limit
//! (while the seeds' GET-then-INCR pattern over-admits).
#![cfg(feature = "redis")]

mod redis_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use redis_support::RedisServer;
use tollgate::redis::{RedisLimiter, Source};
use tollgate::{Algorithm, FakeClock, Limiter, Quota};

/// A deterministic pseudo-random sequence (xorshift), so a failing trace can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs a random trace of checks (and reservations, for buckets) through Redis, replays each
/// call in process at the server time Redis used, and demands identical decisions.
fn differential(server: &RedisServer, name: &str, quotas: &[Quota], seed: u64) {
    let rt = runtime();
    let mut b = RedisLimiter::builder(&server.url())
        .prefix(format!("diff:{name}:"))
        .deadline(Duration::from_secs(2));
    let clock = FakeClock::with_unix_epoch(Duration::ZERO);
    let mut lb = Limiter::<String>::builder().clock(clock.clone());
    for q in quotas {
        b = b.quota(*q);
        lb = lb.quota(*q);
    }
    let remote = b.build().unwrap();
    let local = lb.build().unwrap();
    let buckets = quotas
        .iter()
        .all(|q| matches!(q.algo(), Algorithm::TokenBucket | Algorithm::LeakyBucket));
    let max_cost = quotas
        .iter()
        .map(|q| match q.algo() {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => q.burst_size(),
            _ => q.limit(),
        })
        .min()
        .unwrap();
    let mut rng = Rng(seed);
    let (mut allowed, mut denied, mut delayed) = (0, 0, 0);
    let mut ttls = 0;
    rt.block_on(async {
        let mut raw = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        for i in 0..300 {
            // Skewed: hot keys see every window, cold ones come back to stale or fresh state.
            let key = match rng.below(100) {
                0..45 => "k0",
                45..75 => "k1",
                75..92 => "k2",
                _ => "k3",
            }
            .to_string();
            let cost = 1 + rng.below(max_cost.min(3));
            let reserve = buckets && rng.below(5) == 0;
            let max_delay = Duration::from_millis(rng.below(40));
            let got = if reserve {
                remote.reserve(&key, cost, max_delay).await.unwrap()
            } else {
                remote.check_n(&key, cost).await.unwrap()
            };
            assert_eq!(got.source(), Source::Redis, "{name} call {i}: degraded");
            // Every key the limiter wrote carries a TTL (-1 would be none). A key written by
            // an admission near its window's end may have expired by the time PTTL arrives
            // (`src/redis/tests.rs` checks it in the same transaction as the script).
            for k in remote.keys_of(&key) {
                let ttl: i64 = redis::cmd("PTTL")
                    .arg(&k)
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                assert!(ttl >= 0 || ttl == -2, "{name} call {i}: {k} has PTTL {ttl}");
                if got.decision().is_allowed() && ttl > 0 {
                    ttls += 1;
                }
            }
            clock.set_ns(got.server_time_ns().unwrap());
            let want = if reserve {
                local.reserve(&key, cost, max_delay).unwrap()
            } else {
                local.check_n(&key, cost).unwrap()
            };
            assert_eq!(
                got.decision(),
                want,
                "{name} (seed {seed}) call {i}: key {key} cost {cost} reserve {reserve}"
            );
            if want.is_allowed() {
                allowed += 1;
                if want.delay_ns() > 0 {
                    delayed += 1;
                }
            } else {
                denied += 1;
            }
            if rng.below(4) == 0 {
                tokio::time::sleep(Duration::from_millis(rng.below(25))).await;
            }
            if rng.below(40) == 0 {
                tokio::time::sleep(Duration::from_millis(100 + rng.below(100))).await;
            }
        }
    });
    let st = remote.stats();
    assert_eq!(st.mismatches, 0, "{name}: script and algorithm disagreed");
    assert_eq!(st.degraded(), 0);
    assert!(
        allowed > 20 && denied > 20,
        "{name}: trace too one-sided: {allowed} allowed, {denied} denied"
    );
    if buckets {
        assert!(delayed > 0, "{name}: no reservation waited");
    }
    assert!(
        ttls >= allowed / 2,
        "{name}: only {ttls} live TTLs after {allowed} admissions"
    );
    eprintln!(
        "{name}: {allowed} allowed ({delayed} delayed), {denied} denied: identical; {ttls} TTLs checked"
    );
}

#[test]
fn scripts_match_in_process_algorithms_on_the_same_trace() {
    let server = RedisServer::start();
    let ms = Duration::from_millis;
    let cases: Vec<(&str, Vec<Quota>)> = vec![
        ("token", vec![Quota::new(20, ms(500)).burst(4)]),
        (
            "leaky",
            vec![
                Quota::new(30, ms(700))
                    .burst(3)
                    .algorithm(Algorithm::LeakyBucket),
            ],
        ),
        (
            "fixed",
            vec![Quota::new(6, ms(80)).algorithm(Algorithm::FixedWindow)],
        ),
        (
            "sliding",
            vec![Quota::new(7, ms(60)).algorithm(Algorithm::SlidingWindowCounter)],
        ),
        (
            "log",
            vec![Quota::new(6, ms(160)).algorithm(Algorithm::SlidingWindowLog)],
        ),
        // A rate whose emission interval is not a whole microsecond (ns arithmetic in Lua).
        ("odd-rate", vec![Quota::new(3, ms(100)).burst(2)]),
        (
            "compound",
            vec![
                Quota::new(10, ms(200)).burst(3),
                Quota::new(12, ms(400)).algorithm(Algorithm::FixedWindow),
                Quota::new(9, ms(300)).algorithm(Algorithm::SlidingWindowLog),
            ],
        ),
    ];
    // The traces are independent (own keys, own prefixes): run them side by side.
    std::thread::scope(|s| {
        for (seed, (name, quotas)) in cases.iter().enumerate() {
            let server = &server;
            s.spawn(move || differential(server, name, quotas, seed as u64 + 1));
        }
    });

    // Whatever is left carries a TTL too.
    let keys = server.cli(&["--scan", "--pattern", "diff:*"]);
    for k in keys.lines().filter(|l| !l.is_empty()) {
        let ttl: i64 = server.cli(&["PTTL", k]).trim().parse().unwrap();
        // 0: under a millisecond left; -2: expired since the scan; -1 would be no TTL.
        assert!(ttl >= 0 || ttl == -2, "key {k} has PTTL {ttl}");
    }
}

#[test]
fn bad_costs_are_errors_not_calls() {
    let server = RedisServer::start();
    let rt = runtime();
    let l = RedisLimiter::builder(&server.url())
        .quota(Quota::per_second(5).burst(2))
        .build()
        .unwrap();
    rt.block_on(async {
        assert_eq!(
            l.check_n("k", 0).await.unwrap_err(),
            tollgate::Error::ZeroCost
        );
        assert!(matches!(
            l.check_n("k", 3).await.unwrap_err(),
            tollgate::Error::CostExceedsCapacity {
                cost: 3,
                capacity: 2
            }
        ));
    });
    assert_eq!(l.stats().exact, 0);
    // Windows must be whole microseconds in exact mode.
    let e = RedisLimiter::builder(&server.url())
        .quota(Quota::new(5, Duration::from_nanos(1_500)).algorithm(Algorithm::FixedWindow))
        .build();
    assert!(matches!(e, Err(tollgate::Error::Config { .. })));
}

/// 64 concurrent clients over two adapters (two connections) on one key with limit L admit
/// exactly L; the seeds' GET-then-INCR over the same clients admits more.
#[test]
fn concurrent_clients_admit_exactly_the_limit() {
    const L: u64 = 100;
    const CLIENTS: usize = 64;
    const CALLS: usize = 8;
    let server = RedisServer::start();
    let rt = runtime();
    let adapters: Vec<RedisLimiter> = (0..2)
        .map(|_| {
            RedisLimiter::builder(&server.url())
                .prefix("conc:")
                // A refill of one unit per 864 s: none during the test.
                .quota(Quota::new(L, Duration::from_secs(86_400)).burst(L))
                .deadline(Duration::from_secs(5))
                .build()
                .unwrap()
        })
        .collect();
    let admitted = Arc::new(AtomicU64::new(0));
    let in_flight = Arc::new(AtomicU64::new(0));
    let max_in_flight = Arc::new(AtomicU64::new(0));
    rt.block_on(async {
        let barrier = Arc::new(tokio::sync::Barrier::new(CLIENTS));
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let l = adapters[c % 2].clone();
            let (admitted, in_flight, max_in_flight, barrier) = (
                admitted.clone(),
                in_flight.clone(),
                max_in_flight.clone(),
                barrier.clone(),
            );
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                for _ in 0..CALLS {
                    let n = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    max_in_flight.fetch_max(n, Ordering::SeqCst);
                    let c = l.check("shared").await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    assert_eq!(c.source(), Source::Redis);
                    if c.decision().is_allowed() {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let admitted = admitted.load(Ordering::SeqCst);
    let overlap = max_in_flight.load(Ordering::SeqCst);
    eprintln!(
        "exact: {admitted} admitted of {} calls, up to {overlap} in flight",
        CLIENTS * CALLS
    );
    assert_eq!(admitted, L);
    assert!(
        overlap >= 8,
        "clients never overlapped (max {overlap} in flight)"
    );

    // The control: the seeds' GET, compare, INCR from the same 64 clients.
    let control = rt.block_on(async {
        let client = redis::Client::open(server.url()).unwrap();
        let conns = [
            client.get_multiplexed_async_connection().await.unwrap(),
            client.get_multiplexed_async_connection().await.unwrap(),
        ];
        let admitted = Arc::new(AtomicU64::new(0));
        let barrier = Arc::new(tokio::sync::Barrier::new(CLIENTS));
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            let mut con = conns[c % 2].clone();
            let (admitted, barrier) = (admitted.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                for _ in 0..CALLS {
                    let n: Option<u64> = redis::cmd("GET")
                        .arg("control")
                        .query_async(&mut con)
                        .await
                        .unwrap();
                    if n.unwrap_or(0) < L {
                        let _: u64 = redis::cmd("INCR")
                            .arg("control")
                            .query_async(&mut con)
                            .await
                            .unwrap();
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        admitted.load(Ordering::SeqCst)
    });
    eprintln!("GET-then-INCR control: {control} admitted for a limit of {L}");
    assert!(
        control > L,
        "the control should over-admit, admitted {control}"
    );
}

#[test]
fn skewed_local_clocks_make_identical_decisions() {
    let server = RedisServer::start();
    let rt = runtime();
    // Two adapters whose local clocks are 7 s apart (their Unix epochs differ), one key.
    let quota = Quota::new(5, Duration::from_millis(300)).burst(3);
    let a = RedisLimiter::builder(&server.url())
        .prefix("skew:")
        .quota(quota)
        .deadline(Duration::from_secs(2))
        .clock(FakeClock::with_unix_epoch(Duration::from_secs(
            1_700_000_000,
        )))
        .build()
        .unwrap();
    let b = RedisLimiter::builder(&server.url())
        .prefix("skew:")
        .quota(quota)
        .deadline(Duration::from_secs(2))
        .clock(FakeClock::with_unix_epoch(Duration::from_secs(
            1_700_000_007,
        )))
        .build()
        .unwrap();
    let clock = FakeClock::with_unix_epoch(Duration::ZERO);
    let reference = Limiter::<String>::builder()
        .quota(quota)
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut rng = Rng(99);
    let (mut allowed, mut denied) = (0, 0);
    rt.block_on(async {
        for i in 0..120 {
            let l = if rng.below(2) == 0 { &a } else { &b };
            let got = l.check("k").await;
            clock.set_ns(got.server_time_ns().unwrap());
            let want = reference.check(&"k".to_string());
            assert_eq!(got.decision(), want, "call {i}");
            if want.is_allowed() {
                allowed += 1
            } else {
                denied += 1
            }
            if rng.below(3) == 0 {
                tokio::time::sleep(Duration::from_millis(rng.below(60))).await;
            }
        }
    });
    assert!(
        allowed > 10 && denied > 10,
        "{allowed} allowed, {denied} denied"
    );
}

/// State per (key, quota) on Redis as in process: two limiters under one prefix (two plans),
/// one with a quota A and one with A and a larger B, both charge A's one state for a client, so
/// the client gets A's limit in all, whichever limiter each request goes to; a third limiter
/// with a different quota keeps its own state. A quota listed twice keeps two keys.
#[test]
fn limiters_listing_an_equal_quota_share_its_state() {
    let server = RedisServer::start();
    let rt = runtime();
    let a = Quota::new(5, Duration::from_secs(86_400)).burst(5);
    let b = Quota::new(100, Duration::from_secs(86_400)).burst(100);
    let build = |quotas: &[Quota]| {
        let mut builder = RedisLimiter::builder(&server.url())
            .prefix("plans:")
            .deadline(Duration::from_secs(5));
        for q in quotas {
            builder = builder.quota(*q);
        }
        builder.build().unwrap()
    };
    let (free, pro, other) = (build(&[a]), build(&[a, b]), build(&[b]));
    assert_eq!(free.keys_of("u1")[0], pro.keys_of("u1")[0]);
    assert_ne!(pro.keys_of("u1")[0], pro.keys_of("u1")[1]);
    assert_eq!(pro.keys_of("u1")[1], other.keys_of("u1")[0]);
    rt.block_on(async {
        let mut admitted = 0;
        for i in 0..20 {
            let l = if i % 2 == 0 { &free } else { &pro };
            let c = l.check("u1").await;
            assert_eq!(c.source(), Source::Redis);
            admitted += u64::from(c.decision().is_allowed());
        }
        assert_eq!(admitted, 5, "A's limit across both plans");
        // B's state holds pro's admitted requests: 2 of the 5 (requests 1 and 3; from request
        // 5 on, A denies and the compound charges nothing).
        let pro_admitted = (0..20).filter(|i| i % 2 == 1 && *i < 5).count() as u64;
        let left = other.check("u1").await.decision();
        assert!(left.is_allowed());
        assert_eq!(left.remaining(), 100 - pro_admitted - 1);
    });
    let twice = build(&[a, a]);
    let keys = twice.keys_of("u1");
    assert_eq!(keys.len(), 2);
    assert_ne!(keys[0], keys[1]);
}

/// The hash tag Redis Cluster hashes a key by: the text between the first `{` and the first `}`
/// after it, if that is not empty (else the key is hashed whole: `None`).
fn cluster_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// The names `keys_of` gives (a token bucket and a sliding log's list and total): every
    /// name of a key carries one non-empty Cluster tag holding no brace (one slot), and two
    /// distinct keys share no name and no tag, near misses like `{a}` / `_a_` / `%7Ba%7D`
    /// included.
    #[test]
    fn key_names_are_injective_and_tagged(
        a in prop_oneof!["[{}%_7BD25a:]{0,8}", any::<String>()],
        b in prop_oneof!["[{}%_7BD25a:]{0,8}", any::<String>()],
    ) {
        let l = RedisLimiter::builder("redis://127.0.0.1:1/")
            .prefix("t:")
            .quota(Quota::per_second(5))
            .quota(Quota::per_minute(50).algorithm(Algorithm::SlidingWindowLog))
            .build()
            .unwrap();
        let (na, nb) = (l.keys_of(&a), l.keys_of(&b));
        for (k, names) in [(&a, &na), (&b, &nb)] {
            prop_assert_eq!(names.len(), 3);
            let tag = cluster_tag(&names[0]);
            prop_assert!(tag.is_some(), "{:?}: no Cluster tag in {:?}", k, names[0]);
            let tag = tag.unwrap();
            prop_assert!(!tag.contains(['{', '}']), "{:?}: tag {:?}", k, tag);
            for n in names {
                prop_assert_eq!(cluster_tag(n), Some(tag), "{:?}: two slots", k);
            }
        }
        if a != b {
            prop_assert_ne!(cluster_tag(&na[0]), cluster_tag(&nb[0]));
            prop_assert!(na.iter().all(|n| !nb.contains(n)), "{:?} {:?}", na, nb);
        }
    }
}
