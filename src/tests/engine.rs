use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::{
    Algorithm, FakeClock, Limiter, LoginGuard, OnFull, Plan, PlanConfig, Quota, Reason, Strategy,
    check_all,
};

fn limiter<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>(
    q: Quota,
    clock: &FakeClock,
) -> Limiter<K, FakeClock> {
    Limiter::builder()
        .quota(q)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// Admissions when `threads` threads, started together, each check key 7 `checks` times.
fn admitted_by_threads(l: &Arc<Limiter<u64, FakeClock>>, threads: usize, checks: u64) -> u64 {
    let barrier = Arc::new(Barrier::new(threads));
    (0..threads)
        .map(|_| {
            let (l, barrier) = (l.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                (0..checks).filter(|_| l.check(&7).is_allowed()).count() as u64
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .sum()
}

/// Frozen clock, several threads on one key: exactly `burst` admitted, and the CAS loop really
/// raced (retries observed). Then advancing k*T admits exactly k more.
#[test]
fn threads_on_one_key_admit_exactly_burst() {
    const BURST: u64 = 100_000;
    const THREADS: usize = 4;
    for attempt in 0..10 {
        let clock = FakeClock::new();
        let l = Arc::new(limiter::<u64>(Quota::per_second(1000).burst(BURST), &clock));
        let admitted = admitted_by_threads(&l, THREADS, BURST);
        assert_eq!(admitted, BURST, "attempt {attempt}");
        let stats = l.stats();
        assert_eq!(stats.allowed, BURST);
        assert_eq!(stats.denied, THREADS as u64 * BURST - BURST);
        // T = 1 ms: advancing 5 T admits exactly 5 more.
        clock.advance(Duration::from_millis(5));
        let more = (0..100).filter(|_| l.check(&7).is_allowed()).count();
        assert_eq!(more, 5);
        if stats.cas_retries > 0 {
            return;
        }
    }
    panic!("threads never collided in 10 attempts: the test proved nothing");
}

/// The window algorithms on the short path, the same way: frozen clock, threads on one inline
/// key, exactly the window's limit admitted, with the CAS loop really raced.
#[test]
fn threads_on_one_key_admit_exactly_the_window_limit() {
    const LIMIT: u64 = 50_000;
    const THREADS: usize = 4;
    for alg in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let raced = (0..10).any(|attempt| {
            let clock = FakeClock::new();
            let l = Arc::new(limiter::<u64>(
                Quota::per_minute(LIMIT).algorithm(alg),
                &clock,
            ));
            assert_eq!(l.store_kind(), crate::StoreKind::Flat);
            let admitted = admitted_by_threads(&l, THREADS, LIMIT);
            assert_eq!(admitted, LIMIT, "{alg:?}, attempt {attempt}");
            let stats = l.stats();
            assert_eq!(stats.allowed, LIMIT, "{alg:?}");
            assert_eq!(stats.denied, THREADS as u64 * LIMIT - LIMIT, "{alg:?}");
            stats.cas_retries > 0
        });
        assert!(
            raced,
            "{alg:?}: threads never collided in 10 attempts: the test proved nothing"
        );
    }
}

#[test]
fn full_table_denies_new_keys_and_never_tracks_them() {
    let clock = FakeClock::new();
    let l: Limiter<u64, _> = Limiter::builder()
        .quota(Quota::per_second(1))
        .max_keys(10)
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in 0..10 {
        assert!(l.check(&k).is_allowed());
    }
    let d = l.check(&99);
    assert!(!d.is_allowed());
    assert_eq!(d.reason(), Reason::TableFull);
    assert_eq!(l.len(), 10);
    // Known keys keep their exact limit.
    assert!(!l.check(&3).is_allowed());
    assert_eq!(l.stats().table_full, 1);
    // Keys fresh only now are kept for the sweep grace (1 s), then swept; new keys get in.
    clock.advance(Duration::from_secs(1));
    assert_eq!(l.sweep_now(), 0);
    clock.advance(Duration::from_secs(1));
    assert_eq!(l.sweep_now(), 10);
    assert!(l.check(&99).is_allowed());
}

#[test]
fn evict_fresh_policy_only_evicts_fresh_state() {
    let clock = FakeClock::new();
    let l: Limiter<u64, _> = Limiter::builder()
        .quota(Quota::per_minute(1))
        .max_keys(4)
        .shards(2)
        .on_full(OnFull::EvictFresh)
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in 0..4 {
        assert!(l.check(&k).is_allowed());
    }
    // Nothing is fresh yet: the new key is denied, no victim loses its state.
    assert_eq!(l.check(&100).reason(), Reason::TableFull);
    for k in 0..4 {
        assert!(!l.check(&k).is_allowed(), "key {k} kept its spent state");
    }
    clock.advance(Duration::from_secs(60));
    // Fresh, but not yet for the sweep grace: still no eviction.
    assert_eq!(l.check(&100).reason(), Reason::TableFull);
    clock.advance(Duration::from_secs(1));
    // Everything is fresh now; new keys evict fresh ones (same shard) and are admitted.
    assert!(l.check(&100).is_allowed());
    assert_eq!(l.len(), 4);
    assert!(l.stats().evictions >= 1);
}

#[test]
fn sweeper_removes_only_fresh_state() {
    let clock = FakeClock::new();
    let l = limiter::<u64>(Quota::per_second(1).burst(2), &clock);
    let _ = l.check(&1);
    let _ = l.check(&2);
    let _ = l.check(&2);
    // Key 1 is back to full after 1 s, key 2 only after 2 s; sweeps judge 1 s in the past.
    clock.advance(Duration::from_secs(1));
    assert_eq!(l.sweep_now(), 0);
    clock.advance(Duration::from_secs(1));
    assert_eq!(l.sweep_now(), 1);
    assert_eq!(l.len(), 1);
    // Key 2's state survived (it was not yet fresh 1 s ago); it is full now: exactly two units.
    assert!(l.check(&2).is_allowed());
    assert!(l.check(&2).is_allowed());
    assert!(!l.check(&2).is_allowed());
    // A blocked key is never swept while its penalty lasts.
    assert!(l.block(&3, Duration::from_secs(10)));
    clock.advance(Duration::from_secs(5));
    l.sweep_now();
    assert_eq!(l.check(&3).reason(), Reason::Blocked);
    assert_eq!(l.stats().swept, 2);
}

#[test]
fn background_sweeper_runs_and_stops_on_drop() {
    let clock = FakeClock::new();
    let l = Arc::new(limiter::<u64>(Quota::per_second(10), &clock));
    for k in 0..100 {
        let _ = l.check(&k);
    }
    clock.advance(Duration::from_secs(2)); // fresh for longer than the 1 s sweep grace
    let sweeper = l.start_sweeper(Duration::from_millis(5));
    let start = std::time::Instant::now();
    while !l.is_empty() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(l.is_empty());
    drop(sweeper);
    let sweeps = l.stats().sweeps;
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(l.stats().sweeps, sweeps, "the thread stopped");
}

/// Sweeping while threads check: the total admitted never exceeds what the quota allows.
#[test]
fn sweep_racing_checks_grants_no_extra_permits() {
    let clock = FakeClock::new();
    let l = Arc::new(limiter::<u64>(Quota::per_second(1).burst(50), &clock));
    let stop = Arc::new(crate::sync::AtomicU64::new(0));
    let sweeper = {
        let (l, stop) = (l.clone(), stop.clone());
        std::thread::spawn(move || {
            while stop.load(crate::sync::Ordering::Relaxed) == 0 {
                l.sweep_now();
            }
        })
    };
    let checkers: Vec<_> = (0..2)
        .map(|_| {
            let l = l.clone();
            std::thread::spawn(move || {
                (0..20_000)
                    .filter(|i| l.check(&(i % 8)).is_allowed())
                    .count()
            })
        })
        .collect();
    let admitted: usize = checkers.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(1, crate::sync::Ordering::Relaxed);
    sweeper.join().unwrap();
    assert_eq!(admitted, 8 * 50);
}

#[test]
fn compound_on_one_key_is_all_or_nothing() {
    let clock = FakeClock::new();
    let l: Limiter<u64, _> = Limiter::builder()
        .quota(Quota::per_second(10))
        .quota(Quota::per_day(15).algorithm(Algorithm::FixedWindow))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!((0..20).filter(|_| l.check(&1).is_allowed()).count(), 10);
    clock.advance(Duration::from_secs(1));
    // The day has 5 left; the second only gives 10 but the day caps it.
    assert_eq!((0..20).filter(|_| l.check(&1).is_allowed()).count(), 5);
    clock.advance(Duration::from_secs(1));
    // Denials by the daily part refund the per-second part: a peek shows it full.
    assert_eq!(l.peek(&1).remaining(), 0);
    assert!(!l.check(&1).is_allowed());
    let d = l.check_n(&1, 1).unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Duration::from_secs(86_400 - 2));
}

#[test]
fn compound_across_keys_refunds_on_denial() {
    let clock = FakeClock::new();
    let per_user = limiter::<u64>(Quota::per_second(3), &clock);
    let global = limiter::<()>(Quota::per_second(4), &clock);
    let mut admitted = [0; 3];
    for _ in 0..4 {
        for user in 0..3u64 {
            if check_all(&[&per_user.key(&user), &global.key(&())], 1)
                .unwrap()
                .is_allowed()
            {
                admitted[user as usize] += 1;
            }
        }
    }
    assert_eq!(admitted.iter().sum::<i32>(), 4, "global bound holds");
    // Users denied by the global part were refunded: each still has 3 - admitted left.
    for user in 0..3u64 {
        assert_eq!(
            per_user.peek(&user).remaining() as i32,
            3 - admitted[user as usize] - 1
        );
    }
}

#[test]
fn plans_resolve_per_key_and_survive_a_live_change() {
    let clock = FakeClock::new();
    let config = PlanConfig::parse(
        r#"
[plans.free]
limit = 100
window = 86400
burst = 10

[plans.pro]
limit = 10000
window = "1d"
burst = 100
"#,
    )
    .unwrap();
    let l: Limiter<u64, _> = Limiter::builder()
        .plans(config)
        .clock(clock.clone())
        .build()
        .unwrap();
    let (free, pro) = (l.plan("free").unwrap(), l.plan("pro").unwrap());
    let count = |plan, key| {
        (0..200)
            .filter(|_| l.check_in(&key, plan, 1).unwrap().is_allowed())
            .count()
    };
    assert_eq!(count(free, 1), 10);
    assert_eq!(count(pro, 2), 100);
    // Key 1 checked under pro too: pro's quota is its own state, so free's spending does not
    // count there (and pro's does not count under free).
    let d = l.check_in(&1, pro, 1).unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 99);
    assert!(!l.check_in(&1, free, 1).unwrap().is_allowed());
    // A live change of the free plan keeps what free keys spent.
    let _ = l.check_in(&3, free, 5).unwrap();
    l.set_plan("free", Plan::new([Quota::per_day(100).burst(20)]))
        .unwrap();
    let d = l.check_in(&3, l.plan("free").unwrap(), 1).unwrap();
    assert_eq!(d.remaining(), 14);
}

#[test]
fn strategies_soft_queue_priority() {
    let clock = FakeClock::new();
    let soft: Limiter<u64, _> = Limiter::builder()
        .quota(Quota::per_second(1))
        .strategy(Strategy::Soft)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(soft.check(&1).reason(), Reason::Within);
    let d = soft.check(&1);
    assert!(d.is_allowed());
    assert_eq!(d.reason(), Reason::SoftLimit);
    assert_eq!(soft.stats().soft_passed, 1);

    let queue: Limiter<u64, _> = Limiter::builder()
        .quota(Quota::per_second(10).burst(1))
        .strategy(Strategy::Queue {
            max_delay: Duration::from_millis(250),
        })
        .clock(clock.clone())
        .build()
        .unwrap();
    let delays: Vec<_> = (0..4)
        .map(|_| queue.check(&1))
        .map(|d| (d.is_allowed(), d.delay().as_millis()))
        .collect();
    assert_eq!(delays, [(true, 0), (true, 100), (true, 200), (false, 0)]);

    // Priority on a shared global key: free keeps 5 units free for pro.
    let global: Limiter<(), _> = Limiter::builder()
        .plan("pro", Plan::new([Quota::per_second(10)]))
        .plan("free", Plan::new([Quota::per_second(10)]).headroom(5))
        .clock(clock.clone())
        .build()
        .unwrap();
    let (pro, free) = (global.plan("pro").unwrap(), global.plan("free").unwrap());
    let free_ok = (0..10)
        .filter(|_| global.check_in(&(), free, 1).unwrap().is_allowed())
        .count();
    assert_eq!(free_ok, 5);
    let pro_ok = (0..10)
        .filter(|_| global.check_in(&(), pro, 1).unwrap().is_allowed())
        .count();
    assert_eq!(pro_ok, 5);
}

#[test]
fn login_guard_is_atomic_and_success_clears_only_its_pair() {
    let clock = FakeClock::new();
    let guard = Arc::new(LoginGuard::recommended(clock.clone()).unwrap());
    let ip = "203.0.113.9".parse().unwrap();
    // 8 concurrent guesses for one account: exactly 5 get to try a password.
    let tried: usize = (0..8)
        .map(|_| {
            let g = guard.clone();
            std::thread::spawn(move || g.attempt(ip, "alice").is_allowed() as usize)
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .sum();
    assert_eq!(tried, 5);
    // The attacker also owns "mallory": logging in there does not unlock alice.
    assert!(guard.attempt(ip, "mallory").is_allowed());
    guard.succeeded(ip, "mallory");
    let d = guard.attempt(ip, "alice");
    assert!(!d.is_allowed());
    assert_eq!(d.reason(), Reason::Blocked);
    // The per-ip budget (20) still counts every attempt: 6 used, 14 left across other accounts.
    let others = (0..30)
        .filter(|i| guard.attempt(ip, &format!("user{i}")).is_allowed())
        .count();
    assert_eq!(others, 14);
}

#[test]
fn composite_and_string_keys() {
    let clock = FakeClock::new();
    let l = limiter::<(String, &'static str)>(Quota::per_minute(2), &clock);
    let k = ("user-1".to_string(), "/api/search");
    assert!(l.check(&k).is_allowed());
    assert!(l.check(&k).is_allowed());
    assert!(!l.check(&k).is_allowed());
    assert!(l.check(&("user-1".to_string(), "/api/items")).is_allowed());
}

/// A clock saturated at `u64::MAX` must not turn the bucket into "allow everything".
#[test]
fn time_at_u64_max_still_limits() {
    for alg in Algorithm::ALL {
        let clock = FakeClock::new();
        let l = limiter::<u64>(Quota::per_second(3).algorithm(alg), &clock);
        clock.advance(Duration::MAX);
        let admitted = (0..100).filter(|_| l.check(&1).is_allowed()).count();
        assert_eq!(admitted, 3, "{alg:?}");
    }
}

/// A refund after the charge has drained takes back only what is left of it: never time that
/// belongs to a later charge.
#[test]
fn gcra_refund_after_drain_returns_nothing_extra() {
    use crate::cell::{Cell, Mode};
    let rule = Quota::per_second(10).burst(2).compile(0).unwrap(); // T = 100 ms
    let cell = Cell::fresh(rule.kind);
    let ms = 1_000_000;
    let ours = cell.apply(0, 1, &rule, 0, Mode::Check); // TAT = 100 ms
    // 300 ms later our charge has drained; another request charges 2 (TAT = 500 ms).
    let theirs = cell.apply(300 * ms, 2, &rule, 0, Mode::Check);
    assert!(ours.decision.is_allowed() && theirs.decision.is_allowed());
    cell.refund(1, &rule, ours.token.unwrap(), 300 * ms);
    // Their two units are still charged: nothing passes at 300 ms.
    assert!(
        !cell
            .apply(300 * ms, 1, &rule, 0, Mode::Peek)
            .decision
            .is_allowed()
    );
    // A refund while ours is still pending takes it back in full.
    let cell = Cell::fresh(rule.kind);
    let ours = cell.apply(0, 2, &rule, 0, Mode::Check);
    cell.refund(2, &rule, ours.token.unwrap(), 0);
    assert_eq!(
        cell.apply(0, 2, &rule, 0, Mode::Peek).decision.remaining(),
        0
    );
    assert!(cell.apply(0, 2, &rule, 0, Mode::Peek).decision.is_allowed());
}

/// The queue strategy honours a plan's priority headroom.
#[test]
fn reserve_respects_headroom() {
    let clock = FakeClock::new();
    let l: Limiter<(), _> = Limiter::builder()
        .plan(
            "free",
            Plan::new([Quota::per_second(10).burst(4)]).headroom(2),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let free = l.plan("free").unwrap();
    let d: Vec<_> = (0..3)
        .map(|_| {
            l.reserve_in(&(), free, 1, Duration::ZERO)
                .unwrap()
                .is_allowed()
        })
        .collect();
    assert_eq!(
        d,
        [true, true, false],
        "2 of 4 units are kept for higher tiers"
    );
}

/// A denied compound reports what the refunded parts really hold.
#[test]
fn denied_compound_reports_remaining_without_the_refunded_charge() {
    let clock = FakeClock::new();
    let l: Limiter<u64, _> = Limiter::builder()
        .quota(Quota::per_second(10).burst(3))
        .quota(Quota::per_minute(5).algorithm(Algorithm::FixedWindow))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(l.check_n(&1, 3).unwrap().is_allowed()); // A: 0 left, B: 2 left
    clock.advance(Duration::from_millis(300)); // A back to 3
    // A admits (and would hold 0), B denies holding 2; A is refunded and holds 3 again.
    let d = l.check_n(&1, 3).unwrap();
    assert!(!d.is_allowed());
    assert_eq!(
        (d.remaining(), d.limit()),
        (2, 5),
        "the refunded part no longer binds"
    );
    assert_eq!(
        l.peek(&1).remaining(),
        1,
        "B: 2 left, minus the peeked unit"
    );
}

/// A compound refund lands only on the entry it charged, never on one recreated after a reset.
#[test]
fn compound_refund_skips_a_recreated_entry() {
    use crate::Part;
    let clock = FakeClock::new();
    let per_user = limiter::<u64>(Quota::per_second(2), &clock);
    let bound = per_user.key(&1);
    let (mut undo, mut d) = (None, crate::Decision::denied(crate::Reason::Limited, 0));
    bound
        .charge_part(1, false, &mut d, &mut undo, &mut None)
        .unwrap();
    assert!(d.is_allowed());
    assert!(per_user.reset(&1)); // e.g. LoginGuard::succeeded between charge and refund
    assert_eq!(per_user.check(&1).remaining(), 1); // the new incarnation
    let _ = bound.undo_part(undo, false, &mut None);
    assert!(per_user.check(&1).is_allowed());
    assert!(
        !per_user.check(&1).is_allowed(),
        "the refund did not land on the new entry"
    );
}

/// Under a queue strategy, `peek` answers what `check` would: the reservation and its delay.
#[test]
fn peek_previews_the_queue() {
    let clock = FakeClock::new();
    let l: Limiter<u64, FakeClock> = Limiter::builder()
        .quota(Quota::per_second(10).burst(1))
        .strategy(crate::Strategy::Queue {
            max_delay: Duration::from_secs(1),
        })
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(l.check(&1).is_allowed());
    let peeked = l.peek(&1);
    let checked = l.check(&1);
    assert_eq!(peeked, checked);
    assert!(checked.is_allowed());
    assert_eq!(checked.delay(), Duration::from_millis(100));
}

/// `check_all` reads the time once for parts whose limiters share a clock (clones of one: the
/// process clock every default limiter uses, or one `FakeClock`), and once per clock otherwise.
#[test]
fn check_all_reads_a_shared_clock_once() {
    use crate::Clock;
    use crate::sync::{AtomicU64, Ordering};
    /// A clock that counts its readings; clones share the count and, when `shared`, an id.
    #[derive(Clone)]
    struct Counting {
        reads: Arc<AtomicU64>,
        shared: bool,
    }
    impl Clock for Counting {
        fn now(&self) -> u64 {
            self.reads.fetch_add(1, Ordering::Relaxed);
            1_000_000_000
        }
        fn unix_epoch_ns(&self) -> u64 {
            0
        }
        fn shared_id(&self) -> Option<usize> {
            self.shared.then_some(Arc::as_ptr(&self.reads) as usize)
        }
    }
    for shared in [true, false] {
        let clock = Counting {
            reads: Arc::new(AtomicU64::new(0)),
            shared,
        };
        let build = || {
            Limiter::<u64>::builder()
                .quota(Quota::per_second(5))
                .clock(clock.clone())
                .build()
                .unwrap()
        };
        let (per_user, global) = (build(), build());
        let before = clock.reads.load(Ordering::Relaxed);
        let d = crate::check_all(&[&per_user.key(&1), &global.key(&0)], 1).unwrap();
        assert!(d.is_allowed());
        let reads = clock.reads.load(Ordering::Relaxed) - before;
        assert_eq!(reads, if shared { 1 } else { 2 }, "shared: {shared}");
    }
    // Default limiters read the process clock.
    let a = Limiter::<u64>::builder()
        .quota(Quota::per_second(1))
        .build()
        .unwrap();
    let b = Limiter::<u64>::builder()
        .quota(Quota::per_second(1))
        .build()
        .unwrap();
    assert_eq!(a.clock().shared_id(), b.clock().shared_id());
    assert!(a.clock().shared_id().is_some());
}

/// A denied `check_all` peeks the parts after the one that denied: its `retry_after` is the
/// latest of them, to the nanosecond, and a call made exactly then (no other traffic) passes.
#[test]
fn check_all_denied_early_waits_for_every_later_part() {
    let clock = FakeClock::new();
    let second = limiter::<u64>(Quota::per_second(1), &clock);
    let minute = limiter::<u64>(Quota::per_minute(1), &clock);
    let hour = limiter::<()>(Quota::per_hour(1), &clock);
    for parts in [
        vec![&second.key(&1) as &dyn crate::Part, &minute.key(&1)],
        vec![
            &second.key(&2) as &dyn crate::Part,
            &minute.key(&2),
            &hour.key(&()),
        ],
    ] {
        let first = check_all(&parts, 1).unwrap();
        assert!(first.is_allowed());
        // The per-second part denies first; the later parts, never charged, are peeked.
        let d = check_all(&parts, 1).unwrap();
        assert!(!d.is_allowed());
        let latest = if parts.len() == 3 { 3_600 } else { 60 };
        assert_eq!(d.retry_after(), Duration::from_secs(latest));
        assert_eq!(d.remaining(), 0);
        clock.advance(d.retry_after() - Duration::from_nanos(1));
        assert!(!check_all(&parts, 1).unwrap().is_allowed(), "1 ns early");
        clock.advance(Duration::from_nanos(1));
        assert!(check_all(&parts, 1).unwrap().is_allowed(), "at retry_after");
    }
}

/// A part charged and then refunded reports what it holds without the request: `reset_after`
/// too, not only `remaining` (for a compound plan, its short two-part path and its general
/// path, and for `check_all`).
#[test]
fn refunded_parts_report_their_reset_without_the_charge() {
    let clock = FakeClock::new();
    let hourly = Quota::per_hour(2); // T = 30 min
    let window = Quota::per_second(1).algorithm(Algorithm::FixedWindow);
    let log = Quota::per_minute(1).algorithm(Algorithm::SlidingWindowLog);
    // Two word parts take the short path; with a log part the general one.
    for quotas in [vec![hourly, window], vec![hourly, window, log]] {
        let mut b = Limiter::<u64>::builder().clock(clock.clone());
        for q in &quotas {
            b = b.quota(*q);
        }
        let l = b.build().unwrap();
        assert!(l.check(&1).is_allowed());
        // The bucket admits (and would owe 60 min), the window denies: the bucket is refunded
        // and owes the 30 min of the first request (the log, peeked, a minute).
        let d = l.check(&1);
        assert!(!d.is_allowed());
        let parts = quotas.len();
        assert_eq!(d.reset_after(), Duration::from_secs(1_800), "{parts} parts");
        assert_eq!(d.remaining(), 0);
    }
    let bucket = limiter::<u64>(hourly, &clock);
    let per_window = limiter::<u64>(window, &clock);
    let parts = [&bucket.key(&9) as &dyn crate::Part, &per_window.key(&9)];
    assert!(check_all(&parts, 1).unwrap().is_allowed());
    let d = check_all(&parts, 1).unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.reset_after(), Duration::from_secs(1_800));
    let left = bucket.peek(&9);
    assert_eq!(
        (left.is_allowed(), left.remaining()),
        (true, 0),
        "1 held: refunded"
    );
}

/// `check_all` of three parts denied by the middle one: the first, charged and refunded,
/// reports what it holds (its reset is the one unit it holds); the last, never charged, is
/// peeked; the wait is the denying part's.
#[test]
fn check_all_denied_in_the_middle_reports_each_part_as_it_is() {
    let clock = FakeClock::new();
    let a = limiter::<u64>(Quota::per_minute(2), &clock); // T = 30 s
    let b = limiter::<u64>(Quota::per_second(1), &clock);
    let c = limiter::<u64>(Quota::per_second(5), &clock);
    let parts = [&a.key(&1) as &dyn crate::Part, &b.key(&1), &c.key(&1)];
    assert!(check_all(&parts, 1).unwrap().is_allowed());
    let d = check_all(&parts, 1).unwrap();
    assert!(!d.is_allowed());
    // Charged, `a` would be 60 s from full; refunded it holds one unit: 30 s.
    assert_eq!(d.reset_after(), Duration::from_secs(30));
    assert_eq!(d.retry_after(), Duration::from_secs(1));
    assert_eq!(d.remaining(), 0);
    let left = a.peek(&1);
    assert_eq!(
        (left.is_allowed(), left.remaining()),
        (true, 0),
        "a refunded"
    );
    assert_eq!(
        c.peek(&1).remaining(),
        3,
        "c never charged for the denied call"
    );
    clock.advance(Duration::from_secs(1));
    assert!(check_all(&parts, 1).unwrap().is_allowed());
}

/// A report of cost 0 of an empty window is full already: no reset to wait for.
#[test]
fn window_reports_of_nothing_need_no_reset() {
    use crate::algo;
    let rule = Quota::per_second(5)
        .algorithm(Algorithm::FixedWindow)
        .compile(0)
        .unwrap();
    let d = algo::fixed::decide(0, 1_500_000_000, 0, &rule, 0).decision;
    assert_eq!((d.remaining(), d.reset_after()), (5, Duration::ZERO));
    let charged = algo::fixed::decide(0, 1_500_000_000, 1, &rule, 0).decision;
    assert_eq!(charged.reset_after(), Duration::from_millis(500));
}

/// At most `max_keys` keys under a penalty at once, counting only penalties still in force:
/// ones that are over make room for new ones without a sweep.
#[test]
fn penalties_that_are_over_do_not_count_toward_the_cap() {
    let clock = FakeClock::new();
    let l: Limiter<u64, _> = Limiter::builder()
        .quota(Quota::per_second(10))
        .max_keys(4)
        .housekeeping(false)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(l.block(&1, Duration::from_secs(10)));
    for k in 10..13 {
        assert!(l.block(&k, Duration::from_secs(60)));
    }
    assert!(!l.block(&13, Duration::from_secs(60)), "four in force");
    assert!(
        l.block(&1, Duration::from_secs(20)),
        "a key under a penalty extends it"
    );
    clock.advance(Duration::from_secs(20));
    // Key 1's penalty is over (not swept): key 13 takes its place; key 1 is free.
    assert!(l.block(&13, Duration::from_secs(60)));
    assert!(l.check(&1).is_allowed());
    assert_eq!(l.check(&13).reason(), Reason::Blocked);
    assert!(
        !l.block(&14, Duration::from_secs(60)),
        "four in force again"
    );
}

/// A queue that reaches past the end of time (`u64` ns) reserves nothing there: the moments
/// handed out never repeat, so the bucket never admits above its burst (a saturated sum once
/// gave the same moment to every later reservation).
#[test]
fn reservations_past_the_end_of_time_are_denied() {
    let l: Limiter<u64, _> = Limiter::builder()
        .quota(Quota::new(1, Quota::MAX_PERIOD).burst(1))
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let mut moments = Vec::new();
    for _ in 0..6 {
        let d = l.reserve(&1, 1, Duration::MAX).unwrap();
        if d.is_allowed() {
            moments.push(d.delay());
        } else {
            assert!(
                d.retry_after() > Duration::from_secs(100 * 365 * 86_400),
                "{d:?}"
            );
        }
    }
    let mut distinct = moments.clone();
    distinct.dedup();
    assert_eq!(distinct, moments, "a moment handed out twice: {moments:?}");
    assert!(moments.len() >= 2, "{moments:?}");
    let period = Duration::from_nanos(moments[1].as_nanos() as u64);
    for w in moments.windows(2) {
        assert!(w[1] - w[0] >= period, "closer than one unit: {moments:?}");
    }
}

/// `Stats::sweeps` counts sweep steps, one per `sweep_once` / `sweep_now` call, whatever number
/// of shards each visits; `swept` the states they removed.
#[test]
fn sweeps_count_steps_not_shards() {
    let clock = FakeClock::new();
    let l: Limiter<u64, _> = Limiter::builder()
        .quota(Quota::per_second(1))
        .shards(4)
        .housekeeping(false)
        .sweep_grace(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in 0..10 {
        let _ = l.check(&k);
    }
    assert_eq!(l.sweep_now(), 0);
    clock.advance(Duration::from_secs(1));
    assert_eq!(l.sweep_now(), 10);
    let _ = l.sweep_once(1);
    let st = l.stats();
    assert_eq!((st.sweeps, st.swept), (3, 10));
}
