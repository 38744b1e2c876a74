//! A call that one of its limits denies leaves the others as they were, not even for an instant:
//! the limits whose states are in the table are decided before anything is written, so a
//! concurrent reader of another limit never sees a charge that is about to be taken back. (A
//! state the call itself creates, a key's first call, is charged and then taken back.) Real
//! threads on two cores; each test proves that the two threads ran at the same time.

use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate::{FakeClock, Limiter, Plan, Quota, check_all};

/// How long each side runs.
const RUN: Duration = Duration::from_millis(400);

/// Runs `deny` (a call that must be denied, by another limit) in one thread and `watch` (whether
/// the watched limit still holds its one unit) in another, at the same time. Returns (denied
/// calls, watches, watches that found the unit gone, watches made while the other thread was
/// inside its calls).
fn race(deny: impl Fn() -> bool + Sync, watch: impl Fn() -> bool + Sync) -> (u64, u64, u64, u64) {
    let barrier = Barrier::new(2);
    let (stop, calling) = (AtomicBool::new(false), AtomicBool::new(false));
    let (denied, watched, gone, overlapped) = (
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    );
    std::thread::scope(|s| {
        s.spawn(|| {
            barrier.wait();
            let start = Instant::now();
            while start.elapsed() < RUN {
                calling.store(true, Ordering::SeqCst);
                for _ in 0..64 {
                    assert!(!deny(), "the call must be denied");
                    denied.fetch_add(1, Ordering::Relaxed);
                }
                calling.store(false, Ordering::SeqCst);
            }
            stop.store(true, Ordering::SeqCst);
        });
        s.spawn(|| {
            barrier.wait();
            while !stop.load(Ordering::SeqCst) {
                let during = calling.load(Ordering::SeqCst);
                if !watch() {
                    gone.fetch_add(1, Ordering::Relaxed);
                }
                watched.fetch_add(1, Ordering::Relaxed);
                if during && calling.load(Ordering::SeqCst) {
                    overlapped.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    });
    (
        denied.into_inner(),
        watched.into_inner(),
        gone.into_inner(),
        overlapped.into_inner(),
    )
}

/// The two sides really ran at once, many times over.
fn assert_overlapped(denied: u64, watched: u64, overlapped: u64) {
    assert!(denied >= 10_000, "only {denied} denied calls");
    assert!(watched >= 10_000, "only {watched} watches");
    assert!(
        overlapped >= 1_000,
        "only {overlapped} of {watched} watches while the other thread was calling"
    );
}

#[test]
fn check_all_denied_by_a_later_part_never_shows_a_charge_on_an_earlier_one() {
    let clock = FakeClock::new();
    // One unit for user 7; the global limit is spent.
    let per_user = Limiter::<u64>::builder()
        .quota(Quota::per_hour(1).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let global = Limiter::<()>::builder()
        .quota(Quota::per_hour(1).burst(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(global.check(&()).is_allowed());
    // The first call creates user 7's state (a new state is charged, then taken back); the
    // race is about a state that is there.
    assert!(
        !check_all(&[&per_user.key(&7), &global.key(&())], 1)
            .unwrap()
            .is_allowed()
    );
    assert!(per_user.peek(&7).is_allowed());
    let (denied, watched, gone, overlapped) = race(
        || {
            check_all(&[&per_user.key(&7), &global.key(&())], 1)
                .unwrap()
                .is_allowed()
        },
        || per_user.peek(&7).is_allowed(),
    );
    assert_overlapped(denied, watched, overlapped);
    assert_eq!(
        gone, 0,
        "{gone} of {watched} peeks saw user 7's unit charged"
    );
    // Nothing was spent: the unit is still there.
    assert_eq!(per_user.peek(&7).remaining(), 0);
    assert!(per_user.check(&7).is_allowed());
    assert_eq!(per_user.stats().allowed, 1);
    assert_eq!(per_user.stats().denied_elsewhere, denied + 1);
}

#[test]
fn a_compound_plan_denied_by_its_second_quota_never_shows_a_charge_on_its_first() {
    let clock = FakeClock::new();
    // Equal quotas share one state per key: `first` watches the first quota of `both`.
    let first = Quota::per_hour(1).burst(1);
    let spent = Quota::per_day(1).burst(1);
    let limiter = Limiter::<u64>::builder()
        .plan("both", Plan::new(vec![first, spent]))
        .plan("first", Plan::new(vec![first]))
        .plan("spent", Plan::new(vec![spent]))
        .clock(clock)
        .build()
        .unwrap();
    let [both, only_first, only_spent] =
        ["both", "first", "spent"].map(|p| limiter.plan(p).unwrap());
    assert!(limiter.check_in(&7, only_spent, 1).unwrap().is_allowed());
    // The first call creates the first quota's state (charged, then taken back).
    assert!(!limiter.check_in(&7, both, 1).unwrap().is_allowed());
    let (denied, watched, gone, overlapped) = race(
        || limiter.check_in(&7, both, 1).unwrap().is_allowed(),
        || limiter.peek_in(&7, only_first, 1).unwrap().is_allowed(),
    );
    assert_overlapped(denied, watched, overlapped);
    assert_eq!(
        gone, 0,
        "{gone} of {watched} peeks saw the first quota charged"
    );
    assert!(limiter.check_in(&7, only_first, 1).unwrap().is_allowed());
    assert!(!limiter.check_in(&7, only_first, 1).unwrap().is_allowed());
}

/// More parts than the four decided on the stack: the fifth and sixth are charged in order and
/// taken back when a later part denies; every part still holds exactly its own bound.
#[test]
fn check_all_of_six_parts_is_all_or_nothing() {
    let clock = FakeClock::new();
    // Part `i` holds `i + 2` units; part 5, the last, holds 2 of its own.
    let limiters: Vec<Limiter<u64, FakeClock>> = (0..6u64)
        .map(|i| {
            Limiter::<u64>::builder()
                .quota(Quota::per_hour(1).burst(if i == 5 { 2 } else { i + 3 }))
                .clock(clock.clone())
                .build()
                .unwrap()
        })
        .collect();
    let keys: Vec<_> = limiters.iter().map(|l| l.key(&7)).collect();
    let parts: Vec<&dyn tollgate::Part> = keys.iter().map(|k| k as &dyn tollgate::Part).collect();
    let first = check_all(&parts, 1).unwrap();
    assert!(first.is_allowed());
    assert_eq!(first.remaining(), 1, "the last part, burst 2, binds");
    assert!(check_all(&parts, 1).unwrap().is_allowed());
    // The last part is spent: denied, and every other part keeps what the two calls left.
    let denied = check_all(&parts, 1).unwrap();
    assert!(!denied.is_allowed());
    assert_eq!(denied.retry_after(), Duration::from_secs(3600));
    for (i, l) in limiters.iter().enumerate().take(5) {
        let burst = i as u64 + 3;
        assert_eq!(l.peek(&7).remaining(), burst - 3, "part {i}");
        assert_eq!(l.stats().allowed, 2, "part {i}");
        assert_eq!(l.stats().denied_elsewhere, 1, "part {i}");
    }
    assert_eq!(limiters[5].stats().denied, 1);
}
