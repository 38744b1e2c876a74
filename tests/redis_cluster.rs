//! Exact mode on a real 3-master Redis Cluster (`redis-cli --cluster create` on loopback):
//! compound limits keep their parts in one slot and stay all-or-nothing and exact; synced mode
//! (a `SyncedLimiter`, and a `Limiter` with plans synced through the cluster) shares keys that
//! live on different masters.
#![cfg(feature = "redis")]

mod redis_support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis_support::RedisCluster;
use tollgate::redis::{RedisConfig, RedisLimiter, Source, SyncedLimiter};
use tollgate::{Algorithm, Limiter, Plan, Quota};

#[test]
fn compound_limits_on_a_three_master_cluster() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Per key: at most 3 at once (no refill during the test), and at most 5 per hour-long window
    // of a sliding log; a compound of two algorithms on one key.
    let build = || {
        RedisLimiter::cluster_builder(&seeds)
            .prefix("cl:")
            .quota(Quota::new(3, Duration::from_secs(86_400)).burst(3))
            .quota(Quota::new(5, Duration::from_secs(3_600)).algorithm(Algorithm::SlidingWindowLog))
            .deadline(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    let adapters = [build(), build()];
    const USERS: usize = 40;
    // Keys whose names could leave Cluster no hash tag, or a tag that is not the whole key
    // (empty, braces, the escape character), among them.
    let mut users: Vec<String> = (6..USERS).map(|i| format!("user{i}")).collect();
    users.extend(["", "}x", "a}b", "{alice}", "_alice_", "%"].map(String::from));

    // Every part of a key lives in one slot; the keys spread over all three masters.
    let ranges: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| {
            let nodes = n.cli(&["CLUSTER", "NODES"]);
            nodes
                .lines()
                .find(|l| l.contains("myself"))
                .unwrap()
                .to_string()
        })
        .collect();
    let mut masters = HashSet::new();
    for u in &users {
        let keys = adapters[0].keys_of(u);
        assert_eq!(keys.len(), 3, "token bucket + log (list and total)");
        let slots: HashSet<u16> = keys
            .iter()
            .map(|k| {
                cluster.nodes[0]
                    .cli(&["CLUSTER", "KEYSLOT", k])
                    .trim()
                    .parse()
                    .unwrap()
            })
            .collect();
        assert_eq!(slots.len(), 1, "{u}: parts in different slots: {slots:?}");
        let slot = slots.into_iter().next().unwrap();
        let owner = ranges
            .iter()
            .position(|l| owns(l, slot))
            .expect("some master owns the slot");
        masters.insert(owner);
    }
    assert_eq!(masters.len(), 3, "keys did not spread over the masters");

    // 16 concurrent clients per user over two adapters: exactly 3 admitted per user (the
    // bucket binds), 64 calls each.
    let admitted = Arc::new(
        (0..users.len())
            .map(|_| AtomicU64::new(0))
            .collect::<Vec<_>>(),
    );
    rt.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..16 {
            let l = adapters[c % 2].clone();
            let (users, admitted) = (users.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..4 {
                    for (i, u) in users.iter().enumerate() {
                        let c = l.check(u).await;
                        assert_eq!(c.source(), Source::Redis, "round {round} {u}");
                        if c.decision().is_allowed() {
                            admitted[i].fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    for (i, a) in admitted.iter().enumerate() {
        assert_eq!(a.load(Ordering::SeqCst), 3, "{:?}", users[i]);
    }
    // All-or-nothing: the log part never charged for a request the bucket denied, so each
    // log holds exactly the 3 admitted units (its own limit is 5).
    for u in &users {
        let keys = adapters[0].keys_of(u);
        let node = cluster
            .nodes
            .iter()
            .find(|n| n.cli(&["EXISTS", &keys[1]]).trim() == "1")
            .unwrap_or_else(|| panic!("{u}: log key not found on any master"));
        assert_eq!(node.cli(&["LLEN", &keys[1]]).trim(), "3", "{u}");
        assert_eq!(node.cli(&["GET", &keys[2]]).trim(), "3", "{u}");
        for k in &keys {
            let ttl: i64 = node.cli(&["PTTL", k]).trim().parse().unwrap();
            assert!(ttl > 0, "{k} has PTTL {ttl}");
        }
    }
    let st = adapters[0].stats();
    assert_eq!(st.degraded() + st.mismatches, 0, "{st:?}");

    synced_on_the_cluster(&cluster, &seeds, &rt);
    limiter_on_the_cluster(&seeds, &rt);
}

/// A `Limiter` synced through the cluster (`RedisConfig::cluster`): three limiters with the same
/// plans share a compound plan's keys, which live on different masters, within the bound of
/// its binding part.
fn limiter_on_the_cluster(seeds: &[&str], rt: &tokio::runtime::Runtime) {
    const RATE: u64 = 100;
    const BURST: u64 = 10;
    const KEYS: usize = 4;
    let interval = Duration::from_millis(50);
    let limiters: Vec<Arc<Limiter<String>>> = {
        let _g = rt.enter();
        (0..3)
            .map(|_| {
                Limiter::<String>::builder()
                    .quota(Quota::per_second(1))
                    .plan(
                        "api",
                        Plan::new([
                            Quota::per_second(RATE).burst(BURST),
                            Quota::per_hour(100_000),
                        ]),
                    )
                    .redis_synced(RedisConfig::cluster(seeds).prefix("cl:").interval(interval))
                    .build_shared()
                    .unwrap()
            })
            .collect()
    };
    let start = Instant::now();
    let checks: Vec<Check> = limiters
        .iter()
        .map(|l| {
            let l = Arc::clone(l);
            // A plan id is its limiter's own: each process resolves the plan by name.
            let api = l.plan("api").unwrap();
            Box::new(move |k: &str| l.check_in(&k.to_string(), api, 1).unwrap().is_allowed())
                as Check
        })
        .collect();
    let totals = hammer_keys::<KEYS>(checks);
    let secs = start.elapsed().as_secs_f64();
    let exact = BURST as f64 + RATE as f64 * secs;
    let bound = exact + 2.0 * (BURST as f64 + RATE as f64 * (interval.as_secs_f64() + 0.05));
    let stats: Vec<_> = limiters.iter().map(|l| l.synced_stats().unwrap()).collect();
    eprintln!(
        "a Limiter synced on the cluster: {totals:?} admitted per key, exact {exact:.0}, bound {bound:.0}; {stats:?}"
    );
    for (k, &t) in totals.iter().enumerate() {
        assert!((t as f64) <= bound, "key{k}: {t} > {bound:.0}");
        assert!((t as f64) < exact * 1.5, "key{k}: {t}: not shared");
        assert!((t as f64) >= exact * 0.8, "key{k}: {t}: under-admitted");
    }
    for s in &stats {
        assert!(s.rounds >= 10 && s.failed_rounds <= 2, "{s:?}");
    }
}

/// One engine's check of a key.
type Check = Box<dyn Fn(&str) -> bool + Send>;

/// Each check hammers keys `key0..key{N}` from its own thread for 1.5 s; the units admitted per
/// key, all threads together.
fn hammer_keys<const N: usize>(checks: Vec<Check>) -> [u64; N] {
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = checks
        .into_iter()
        .map(|check| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut admitted = [0u64; N];
                while !stop.load(Ordering::Relaxed) {
                    for (k, a) in admitted.iter_mut().enumerate() {
                        if check(&format!("key{k}")) {
                            *a += 1;
                        }
                    }
                    std::thread::yield_now();
                }
                admitted
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let mut totals = [0u64; N];
    for t in threads {
        for (k, a) in t.join().unwrap().iter().enumerate() {
            totals[k] += a;
        }
    }
    totals
}

/// Synced mode on the same cluster: three engines share keys that live on different masters,
/// and stay within the documented bound.
fn synced_on_the_cluster(cluster: &RedisCluster, seeds: &[&str], rt: &tokio::runtime::Runtime) {
    const RATE: u64 = 100;
    const BURST: u64 = 10;
    const KEYS: usize = 6;
    let interval = Duration::from_millis(50);
    let engines: Vec<Arc<SyncedLimiter>> = {
        let _g = rt.enter();
        (0..3)
            .map(|_| {
                Arc::new(
                    SyncedLimiter::cluster_builder(seeds)
                        .prefix("cs:")
                        .quota(Quota::per_second(RATE).burst(BURST))
                        .interval(interval)
                        .build()
                        .unwrap(),
                )
            })
            .collect()
    };
    let start = Instant::now();
    let checks: Vec<Check> = engines
        .iter()
        .map(|e| {
            let e = e.clone();
            Box::new(move |k: &str| e.check(k).is_allowed()) as Check
        })
        .collect();
    let totals = hammer_keys::<KEYS>(checks);
    let secs = start.elapsed().as_secs_f64();
    let exact = BURST as f64 + RATE as f64 * secs;
    let bound = exact + 2.0 * (BURST as f64 + RATE as f64 * (interval.as_secs_f64() + 0.05));
    let stats: Vec<_> = engines.iter().map(|e| e.stats()).collect();
    eprintln!(
        "synced on the cluster: {totals:?} admitted per key, exact {exact:.0}, bound {bound:.0}; {stats:?}"
    );
    for (k, &t) in totals.iter().enumerate() {
        assert!((t as f64) <= bound, "key{k}: {t} > {bound:.0}");
        assert!(
            (t as f64) < exact * 1.5,
            "key{k}: {t}: engines did not share state"
        );
        assert!((t as f64) >= exact * 0.8, "key{k}: {t}: under-admitted");
    }
    for s in &stats {
        assert!(s.rounds >= 10 && s.failed_rounds <= 2, "{s:?}");
    }
    // The keys spread over more than one master, each with its TTL.
    let holders: HashSet<usize> = (0..KEYS)
        .filter_map(|k| {
            let key = format!("cs:{{key{k}}}:s");
            cluster.nodes.iter().position(|n| {
                let ttl: i64 = n.cli(&["PTTL", &key]).trim().parse().unwrap_or(-3);
                ttl > 0
            })
        })
        .collect();
    assert!(holders.len() >= 2, "keys on masters {holders:?}");
}

/// True when a `CLUSTER NODES` line's slot ranges include `slot`.
fn owns(line: &str, slot: u16) -> bool {
    line.split_whitespace()
        .skip(8)
        .any(|r| match r.split_once('-') {
            Some((a, b)) => {
                (a.parse().unwrap_or(u16::MAX)..=b.parse().unwrap_or(0)).contains(&slot)
            }
            None => r.parse::<u16>().ok() == Some(slot),
        })
}
