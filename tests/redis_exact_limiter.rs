//! A `Limiter` in Redis exact mode (`Builder::redis_exact`), against a real redis-server: two
//! limiters with the same plans (two "processes", each its own connection) decide every call in
//! one script, so together they admit exactly what one in-process limiter admits: plans,
//! compound plans, tiers, the strategies, peek and the per-plan stats. A synchronous call is
//! answered by the failure policy, `check_all` is an error, and a dead Redis answers by policy.
#![cfg(feature = "redis")]

mod redis_support;

use std::sync::Arc;
use std::time::Duration;

use redis_support::RedisServer;
use tollgate::redis::{FailurePolicy, RedisConfig};
use tollgate::{Error, FakeClock, Limiter, Plan, PlanId, Quota, Reason, check_all};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A day-long quota of `n` (burst `n`): nothing refills during a test.
fn per_day(n: u64) -> Quota {
    Quota::new(n, Duration::from_secs(86_400)).burst(n)
}

/// Two exact-mode limiters with the plans of `build`, on `url` under `prefix`.
fn pair(
    url: &str,
    prefix: &str,
    build: impl Fn() -> tollgate::Builder<String>,
) -> [Arc<Limiter<String>>; 2] {
    [0, 1].map(|_| {
        build()
            .redis_exact(
                RedisConfig::new(url)
                    .prefix(prefix)
                    .deadline(Duration::from_secs(5)),
            )
            .build_shared()
            .unwrap()
    })
}

fn plans() -> tollgate::Builder<String> {
    Limiter::<String>::builder()
        .plan("free", Plan::new([per_day(5)]))
        // A compound plan listing free's quota too: the two share that state per key.
        .plan("pro", Plan::new([per_day(5), per_day(100)]))
        .plan("big", Plan::new([per_day(20)]))
        // A lower tier on big's quota: denied while fewer than 15 units would remain.
        .plan("batch", Plan::new([per_day(20)]).headroom(15))
        .plan(
            "soft",
            Plan::new([per_day(2)]).strategy(tollgate::Strategy::Soft),
        )
}

fn id(l: &Limiter<String>, name: &str) -> PlanId {
    l.plan(name).unwrap()
}

/// Requests spread over two processes are admitted exactly as by one: each plan's limit in
/// all, a compound plan all or nothing, equal quotas one state per key.
#[test]
fn two_processes_admit_exactly_one_limit() {
    let server = RedisServer::start();
    let rt = runtime();
    let ls = pair(&server.url(), "x1:", plans);
    assert!(ls.iter().all(|l| l.is_exact()));
    rt.block_on(async {
        // free: 5 in all, alternating processes.
        let mut admitted = 0;
        for i in 0..12 {
            let l = &ls[i % 2];
            let d = l
                .check_in_async(&"u1".into(), id(l, "free"), 1)
                .await
                .unwrap();
            admitted += u64::from(d.is_allowed());
        }
        assert_eq!(admitted, 5);
        // pro lists free's quota: spent for u1 already, so pro denies and charges nothing.
        let pro = ls[0]
            .check_in_async(&"u1".into(), id(&ls[0], "pro"), 1)
            .await
            .unwrap();
        assert!(!pro.is_allowed());
        // A fresh key under pro: 5 (free's quota binds), and the 100 part holds exactly 5.
        let mut admitted = 0;
        for i in 0..10 {
            let l = &ls[i % 2];
            let d = l
                .check_in_async(&"u2".into(), id(l, "pro"), 1)
                .await
                .unwrap();
            admitted += u64::from(d.is_allowed());
        }
        assert_eq!(admitted, 5);
        // Nothing was charged by the denied compound calls: free for u2 is spent by pro's 5.
        let free = ls[1]
            .check_in_async(&"u2".into(), id(&ls[1], "free"), 1)
            .await
            .unwrap();
        assert!(!free.is_allowed());
        // The per-plan stats count each process's own decisions: 12 free + 1 pro on one, ...
        let allowed: u64 = ls.iter().map(|l| l.plan_stats()[0].allowed).sum();
        assert_eq!(allowed, 5);
    });
}

/// Tiers on one key across processes: the lower tier stops with 15 units left, the higher
/// takes the rest; peek charges nothing; a soft plan lets an over-quota request through,
/// flagged; a queue plan's reservation waits.
#[test]
fn tiers_peek_and_strategies_hold_across_processes() {
    let server = RedisServer::start();
    let rt = runtime();
    let ls = pair(&server.url(), "x2:", || {
        plans().plan(
            "queue",
            Plan::new([Quota::per_second(10).burst(1)]).strategy(tollgate::Strategy::Queue {
                max_delay: Duration::from_secs(1),
            }),
        )
    });
    rt.block_on(async {
        let key = "shared".to_string();
        let mut low = 0;
        for i in 0..10 {
            let l = &ls[i % 2];
            low += u64::from(
                l.check_in_async(&key, id(l, "batch"), 1)
                    .await
                    .unwrap()
                    .is_allowed(),
            );
        }
        assert_eq!(low, 5, "the lower tier leaves 15 of 20");
        let mut high = 0;
        for i in 0..20 {
            let l = &ls[i % 2];
            high += u64::from(
                l.check_in_async(&key, id(l, "big"), 1)
                    .await
                    .unwrap()
                    .is_allowed(),
            );
        }
        assert_eq!(high, 15, "the higher tier takes what is left");

        // Peek: the same answer twice, nothing charged.
        let free = id(&ls[0], "free");
        let p1 = ls[0].peek_in_async(&"p".into(), free, 5).await.unwrap();
        let p2 = ls[1]
            .peek_in_async(&"p".into(), id(&ls[1], "free"), 5)
            .await
            .unwrap();
        assert!(p1.is_allowed() && p2.is_allowed());
        assert_eq!(p1.remaining(), 0);
        assert!(
            ls[0]
                .check_in_async(&"p".into(), free, 5)
                .await
                .unwrap()
                .is_allowed()
        );
        assert!(
            !ls[1]
                .peek_in_async(&"p".into(), id(&ls[1], "free"), 1)
                .await
                .unwrap()
                .is_allowed()
        );

        // Soft: over the quota, let through and flagged.
        let mut reasons = Vec::new();
        for i in 0..3 {
            let d = ls[i % 2]
                .check_in_async(&"s".into(), id(&ls[i % 2], "soft"), 1)
                .await
                .unwrap();
            assert!(d.is_allowed());
            reasons.push(d.reason());
        }
        assert_eq!(reasons, [Reason::Within, Reason::Within, Reason::SoftLimit]);

        // Queue: the second request in the same instant waits about 100 ms (a peek says so
        // first, reserving nothing).
        let queue = id(&ls[0], "queue");
        let first = ls[0].check_in_async(&"q".into(), queue, 1).await.unwrap();
        let peeked = ls[1]
            .peek_in_async(&"q".into(), id(&ls[1], "queue"), 1)
            .await
            .unwrap();
        assert!(peeked.is_allowed() && peeked.delay() > Duration::from_millis(50));
        let second = ls[1]
            .check_in_async(&"q".into(), id(&ls[1], "queue"), 1)
            .await
            .unwrap();
        assert_eq!(first.delay(), Duration::ZERO);
        assert!(second.is_allowed());
        assert!(
            second.delay() > Duration::from_millis(50)
                && second.delay() <= Duration::from_millis(100),
            "{:?}",
            second.delay()
        );
    });
}

/// What exact mode answers without Redis: a synchronous call by the failure policy (counted);
/// `check_all` an error; a dead server by the policy within the deadline; `build()` an error;
/// a plan change rebuilds the plan on Redis.
#[test]
fn sync_calls_check_all_and_a_dead_redis_answer_by_the_policy() {
    let server = RedisServer::start();
    let rt = runtime();
    let [closed, _] = pair(&server.url(), "x3:", plans);
    // Synchronous calls cannot wait for Redis: closed denies them.
    assert!(
        !closed
            .check_in(&"u".into(), id(&closed, "free"), 1)
            .unwrap()
            .is_allowed()
    );
    assert_eq!(closed.sync_calls_degraded(), 1);
    let open = Limiter::<String>::builder()
        .quota(per_day(1))
        .redis_exact(RedisConfig::new(&server.url()).on_failure(FailurePolicy::Open))
        .build_shared()
        .unwrap();
    assert!(open.check(&"u".into()).is_allowed());
    assert!(open.check(&"u".into()).is_allowed());
    // LocalShare: a synchronous call decides on the plan's in-memory share, limit/nodes and
    // burst/nodes per process, as while Redis is out of reach (8 / 4 = 2 here).
    let share = Limiter::<String>::builder()
        .quota(Quota::per_minute(100).burst(8))
        .redis_exact(
            RedisConfig::new(&server.url()).on_failure(FailurePolicy::LocalShare { nodes: 4 }),
        )
        .build_shared()
        .unwrap();
    let admitted = (0..20)
        .filter(|_| share.check(&"u".into()).is_allowed())
        .count();
    assert_eq!(admitted, 2);
    assert_eq!(share.sync_calls_degraded(), 20);
    let err = check_all(&[&closed.key(&"u".into()), &open.key(&"u".into())], 1).unwrap_err();
    assert!(matches!(err, Error::Config { .. }), "{err}");
    assert!(err.to_string().contains("synced mode"), "{err}");
    // build() of an exact-mode limiter says to share it.
    let built = Limiter::<String>::builder()
        .quota(per_day(1))
        .redis_exact(RedisConfig::new(&server.url()))
        .build();
    assert!(built.is_err());
    rt.block_on(async {
        // A plan change on a live exact limiter: the new quota holds on Redis at once.
        let free = closed.set_plan("free", Plan::new([per_day(2)])).unwrap();
        let mut admitted = 0;
        for _ in 0..4 {
            admitted += u64::from(
                closed
                    .check_in_async(&"v".into(), free, 1)
                    .await
                    .unwrap()
                    .is_allowed(),
            );
        }
        assert_eq!(admitted, 2);
    });
    // A dead server: the policy answers within the deadline.
    let dead = Limiter::<String>::builder()
        .quota(per_day(5))
        .clock(FakeClock::new())
        .redis_exact(
            RedisConfig::new("redis://127.0.0.1:1/")
                .deadline(Duration::from_millis(50))
                .on_failure(FailurePolicy::Open),
        )
        .build_shared()
        .unwrap();
    rt.block_on(async {
        let d = dead.check_async(&"u".into()).await;
        assert!(d.is_allowed(), "open admits while Redis is down");
    });
}

/// In exact mode too, a part charged and then given back (the script writes nothing when a
/// later part denies) reports what it holds without the request: its `reset_after` is the one
/// unit it holds (12 h of a 2-a-day bucket), not the two a charge would have left.
#[test]
fn a_part_given_back_reports_its_reset_without_the_request() {
    let server = RedisServer::start();
    let rt = runtime();
    let build = || {
        Limiter::<String>::builder()
            .quota(per_day(2))
            .quota(Quota::per_minute(1).algorithm(tollgate::Algorithm::FixedWindow))
    };
    let [l, _] = pair(&server.url(), "x9:", build);
    rt.block_on(async {
        // A minute window may roll over between two calls: try again on another key then.
        for attempt in 0..3 {
            let key = format!("k{attempt}");
            assert!(l.check_async(&key).await.is_allowed());
            let d = l.check_async(&key).await;
            if d.is_allowed() {
                continue;
            }
            let half_day = Duration::from_secs(43_200);
            assert!(
                d.reset_after() <= half_day && d.reset_after() > half_day - Duration::from_secs(10),
                "{d:?}"
            );
            return;
        }
        panic!("three window boundaries in three attempts");
    });
}

/// A penalty denies an exact-mode call before Redis is asked (it is this process's: another
/// process still admits); `reset_async` forgets the key on Redis, for every process.
#[test]
fn block_and_reset_async_reach_exact_mode() {
    let server = RedisServer::start();
    let rt = runtime();
    let [a, b] = pair(&server.url(), "x8:", plans);
    rt.block_on(async {
        let free = id(&a, "free");
        let k: String = "k".into();
        for _ in 0..5 {
            assert!(a.check_in_async(&k, free, 1).await.unwrap().is_allowed());
        }
        assert!(
            !b.check_in_async(&k, id(&b, "free"), 1)
                .await
                .unwrap()
                .is_allowed()
        );
        // The synchronous reset cannot reach Redis: the key stays spent there.
        a.reset(&k);
        assert!(
            !b.check_in_async(&k, id(&b, "free"), 1)
                .await
                .unwrap()
                .is_allowed()
        );
        assert!(
            a.reset_async(&k).await.unwrap(),
            "Redis held the key's state"
        );
        let d = b.check_in_async(&k, id(&b, "free"), 1).await.unwrap();
        assert_eq!(
            (d.is_allowed(), d.remaining()),
            (true, 4),
            "fresh in every process"
        );
        assert!(!a.reset_async(&"never".to_string()).await.unwrap());

        let m: String = "mallory".into();
        assert!(a.block(&m, Duration::from_secs(60)));
        let d = a.check_in_async(&m, free, 1).await.unwrap();
        assert_eq!(d.reason(), Reason::Blocked);
        // A synchronous call meets the penalty too (the policy, Closed, would say Limited).
        assert_eq!(a.check_in(&m, free, 1).unwrap().reason(), Reason::Blocked);
        assert!(d.retry_after() > Duration::from_secs(59), "{d:?}");
        assert!(!a.peek_in_async(&m, free, 1).await.unwrap().is_allowed());
        assert!(
            b.check_in_async(&m, id(&b, "free"), 1)
                .await
                .unwrap()
                .is_allowed()
        );
        // Redis charged nothing for the blocked calls: b's one unit is all that is spent.
        assert_eq!(
            b.peek_in_async(&m, id(&b, "free"), 1)
                .await
                .unwrap()
                .remaining(),
            3
        );
    });
}

/// Keys that differ only where a brace stands (`{alice}` and `_alice_`, `a{b` and `a_b`, `}`
/// and `_`), or where an escape would (`{` and `%7B`, `""` and `%`), are distinct clients on
/// Redis, as in process: each spends its own 25 a day.
#[test]
fn lookalike_keys_are_distinct_clients() {
    let server = RedisServer::start();
    let rt = runtime();
    let build = || Limiter::<String>::builder().quota(per_day(25));
    let ls = pair(&server.url(), "x9:", build);
    let local = build().build().unwrap();
    let pairs = [
        ("{alice}", "_alice_"),
        ("a{b", "a_b"),
        ("}", "_"),
        ("{", "%7B"),
        ("", "%"),
    ];
    rt.block_on(async {
        for (a, b) in pairs {
            let mut on_redis = [0u64; 2];
            for (i, k) in [a, b].into_iter().enumerate() {
                for n in 0..30 {
                    let l = &ls[n % 2];
                    let d = l
                        .check_in_async(&k.to_string(), PlanId::DEFAULT, 1)
                        .await
                        .unwrap();
                    on_redis[i] += u64::from(d.is_allowed());
                }
            }
            let in_process = [a, b].map(|k| {
                (0..30)
                    .map(|_| u64::from(local.check(&k.to_string()).is_allowed()))
                    .sum::<u64>()
            });
            assert_eq!(in_process, [25, 25], "{a:?} / {b:?} in process");
            assert_eq!(on_redis, in_process, "{a:?} / {b:?} on Redis");
        }
    });
}
