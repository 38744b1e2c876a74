//! Models of the lock-free flat store's protocol, driven through the public `Limiter` API on a
//! two-shard table: first insert of one key from two threads, check against sweep, check against
//! spill (a key moving from its inline slot into the spill map), and reset against insert.
//!
//! Each model prints how many interleavings loom explored.

use std::sync::atomic::{AtomicUsize, Ordering as StdOrdering};
use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::{FakeClock, Limiter, Quota, StoreKind};

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

/// A check against a spill of the same key (a zero-length penalty moves its state from the
/// inline slot into an entry): exactly the burst is admitted across both paths.
#[test]
fn check_against_spill() {
    model("flat: check against spill", || {
        let clock = FakeClock::new();
        let l = limiter(2, &clock);
        assert!(l.check(&7).is_allowed());
        let checker = {
            let l = l.clone();
            thread::spawn(move || l.check(&7).is_allowed())
        };
        let spiller = {
            let l = l.clone();
            thread::spawn(move || l.block(&7, Duration::ZERO))
        };
        assert!(checker.join().unwrap(), "one unit was left");
        assert!(spiller.join().unwrap());
        assert!(
            !l.check(&7).is_allowed(),
            "the bucket of 2 is spent, wherever it lives"
        );
        assert_eq!(l.len(), 1);
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
