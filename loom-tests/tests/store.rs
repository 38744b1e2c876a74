//! Models of the lock-free flat store's protocol, driven through the public `Limiter` API on a
//! two-shard table: first insert of one key from two threads, check against sweep, a compound
//! charge's refund against a check of its first part, a compound charge losing its write to a
//! check, and reset against insert.
//!
//! Each model prints how many interleavings loom explored.

use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::{FakeClock, Limiter, Plan, Quota, StoreKind};

/// Runs `f` under loom and prints the number of interleavings explored.
fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&runs);
    loom::model(move || {
        counter.fetch_add(1, StdOrdering::Relaxed);
        f();
    });
    println!("{name}: {} interleavings", runs.load(StdOrdering::Relaxed));
}

/// A flat-store limiter: one unit per hour (so a charge never drains during a model), burst
/// `burst`, two shards, a handful of keys, no sweep grace.
fn limiter(burst: u64, clock: &FakeClock) -> Arc<Limiter<u64, FakeClock>> {
    let l = Limiter::builder()
        .quota(Quota::per_hour(1).burst(burst))
        .store(StoreKind::Flat)
        .shards(2)
        .max_keys(4)
        .sweep_grace(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .expect("valid model limiter");
    assert_eq!(l.store_kind(), StoreKind::Flat);
    Arc::new(l)
}

/// Two threads check the same new key: one slot, one admission (burst 1), the other denied.
#[test]
fn first_insert_race() {
    model("flat: first insert race", || {
        let clock = FakeClock::new();
        let l = limiter(1, &clock);
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let l = l.clone();
                thread::spawn(move || l.check(&7).is_allowed())
            })
            .collect();
        let admitted = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|a| *a)
            .count();
        assert_eq!(admitted, 1);
        assert_eq!(l.len(), 1);
        assert!(!l.check(&7).is_allowed());
    });
}

/// A check against a sweep of the same fresh key: whichever wins, the charge is never lost (a
/// later check is denied) and the table holds the key exactly when the charge landed in it.
#[test]
fn check_against_sweep() {
    model("flat: check against sweep", || {
        let clock = FakeClock::new();
        let l = limiter(1, &clock);
        // Insert the key and let it drain back to fresh.
        assert!(l.check(&7).is_allowed());
        clock.advance(Duration::from_secs(3600));
        let checker = {
            let l = l.clone();
            thread::spawn(move || l.check(&7).is_allowed())
        };
        let sweeper = {
            let l = l.clone();
            thread::spawn(move || l.sweep_now())
        };
        assert!(checker.join().unwrap());
        let swept = sweeper.join().unwrap();
        assert!(swept <= 1);
        assert_eq!(
            l.len(),
            1,
            "the key is tracked again (or was never removed)"
        );
        assert!(!l.check(&7).is_allowed(), "the charge was not lost");
    });
}

/// A flat-store limiter with plan `both` of two quotas (each of burst 1, per hour and per two
/// hours) and plans `first` and `second` of each alone (equal quotas share one state per key),
/// and the three plans' ids.
fn compound_limiter(clock: &FakeClock) -> (Arc<Limiter<u64, FakeClock>>, [tollgate::PlanId; 3]) {
    let first = Quota::per_hour(1).burst(1);
    let second = Quota::per_hour(2).burst(1);
    let l = Limiter::builder()
        .plan("both", Plan::new([first, second]))
        .plan("first", Plan::new([first]))
        .plan("second", Plan::new([second]))
        .store(StoreKind::Flat)
        .shards(2)
        .max_keys(4)
        .clock(clock.clone())
        .build()
        .expect("valid model limiter");
    let ids = ["both", "first", "second"].map(|p| l.plan(p).unwrap());
    (Arc::new(l), ids)
}

/// A two-part compound charge that its second part denies (its first part a new state, so
/// charged, then refunded) racing a check of that first part alone under another plan: the compound is denied,
/// and the first part's state ends holding exactly the other check's charge, if it was admitted
/// (it may be denied while the compound's charge is in, never admitted twice).
#[test]
fn compound_refund_against_check() {
    model("flat: compound refund against check", || {
        let clock = FakeClock::new();
        let (l, [both, one, two]) = compound_limiter(&clock);
        assert!(l.check_in(&7, two, 1).unwrap().is_allowed()); // the second part is spent
        assert!(l.peek_in(&7, one, 1).unwrap().is_allowed());
        let compound = {
            let l = l.clone();
            thread::spawn(move || l.check_in(&7, both, 1).unwrap().is_allowed())
        };
        let checker = {
            let l = l.clone();
            thread::spawn(move || l.check_in(&7, one, 1).unwrap().is_allowed())
        };
        assert!(!compound.join().unwrap(), "the second part denies");
        let admitted = checker.join().unwrap();
        let left = l.peek_in(&7, one, 1).unwrap().is_allowed();
        assert_eq!(
            left, !admitted,
            "the first part holds the check's charge and nothing of the refunded one"
        );
    });
}

/// A compound charge whose states are in the table against a check that takes its first part's
/// last unit: the compound call decides the first part, charges the second, then writes the
/// first; when the check got there first, that write denies and the second part's charge is
/// taken back. Exactly one of them gets the first part's unit, and the second part keeps its
/// unit unless the compound call was admitted.
#[test]
fn compound_commit_race_against_check() {
    model("flat: compound commit against check", || {
        let clock = FakeClock::new();
        let (l, [both, one, two]) = compound_limiter(&clock);
        // Both states in the table, each with its one unit (a reset takes the charges back
        // and keeps the slots).
        assert!(l.check_in(&7, both, 1).unwrap().is_allowed());
        clock.advance(std::time::Duration::from_secs(3600));
        assert!(l.peek_in(&7, both, 1).unwrap().is_allowed());
        let compound = {
            let l = l.clone();
            thread::spawn(move || l.check_in(&7, both, 1).unwrap().is_allowed())
        };
        let checker = {
            let l = l.clone();
            thread::spawn(move || l.check_in(&7, one, 1).unwrap().is_allowed())
        };
        let (compound, checker) = (compound.join().unwrap(), checker.join().unwrap());
        assert!(
            compound != checker,
            "one of them gets the first part's unit"
        );
        let second_left = l.peek_in(&7, two, 1).unwrap().is_allowed();
        assert_eq!(
            second_left, !compound,
            "the second part holds only an admitted charge"
        );
    });
}

/// A reset against a check of the same key: the key ends tracked once at most, and the check
/// was either forgotten with the reset or is still counted.
#[test]
fn reset_against_check() {
    model("flat: reset against check", || {
        let clock = FakeClock::new();
        let l = limiter(1, &clock);
        assert!(l.check(&7).is_allowed());
        let checker = {
            let l = l.clone();
            thread::spawn(move || l.check(&7).is_allowed())
        };
        let resetter = {
            let l = l.clone();
            thread::spawn(move || l.reset(&7))
        };
        let admitted = checker.join().unwrap();
        assert!(resetter.join().unwrap(), "the key was tracked");
        // Admitted only if the reset came first; then that charge is on a new slot.
        assert_eq!(l.len(), usize::from(admitted));
        assert_eq!(l.check(&7).is_allowed(), !admitted);
    });
}

/// A check racing its shard's move into a larger table (the move a new key past the table's
/// load makes): the charge lands before the move, and moves with the state, or meets the moved
/// slot, waits for the move and lands in the new table; never lost, never twice. Burst 2 with
/// one charge in: exactly one more is admitted, whenever the move comes.
#[test]
fn check_against_growth() {
    model("flat: check against growth", || {
        let clock = FakeClock::new();
        let l = limiter(2, &clock);
        assert!(l.check(&7).is_allowed());
        let checker = {
            let l = l.clone();
            thread::spawn(move || (l.check(&7).is_allowed(), l.check(&7).is_allowed()))
        };
        let grower = {
            let l = l.clone();
            thread::spawn(move || l.grow_all())
        };
        let (second, third) = checker.join().unwrap();
        grower.join().unwrap();
        assert!(second, "the second unit of the burst is admitted");
        assert!(!third, "a charge was lost in the move");
        assert!(!l.check(&7).is_allowed(), "a charge was lost in the move");
        assert_eq!(l.len(), 1);
    });
}
