//! Models of every cell under two or three threads, each a handful of operations.
//!
//! Each model prints how many interleavings loom explored.

use std::time::Duration;

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;
use tollgate::loom_api::ModelCell;
use tollgate::{Algorithm, Quota};
use tollgate_loom_tests::model;

fn quota(alg: Algorithm, limit: u64, burst: u64) -> Quota {
    Quota::new(limit, Duration::from_secs(1))
        .burst(burst)
        .algorithm(alg)
}

/// Two threads, two checks each, capacity 2: exactly 2 admitted, never more; the state each
/// thread reads after its calls never goes back (TAT, window and counts only grow at a frozen
/// clock); the final state is exactly the one two sequential admissions write; a denial wrote
/// nothing.
fn admitted_never_exceeds(alg: Algorithm) {
    let cell = Arc::new(ModelCell::new(quota(alg, 2, 2)));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let cell = cell.clone();
            thread::spawn(move || {
                let mut admitted = 0;
                let mut seen = cell.state();
                for _ in 0..2 {
                    if cell.check(0, 1).allowed {
                        admitted += 1;
                    }
                    let now = cell.state();
                    assert!(
                        now >= seen,
                        "{alg:?}: state went back from {seen:?} to {now:?}"
                    );
                    seen = now;
                }
                admitted
            })
        })
        .collect();
    let admitted: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(admitted, 2, "{alg:?}");
    let sequential = ModelCell::new(quota(alg, 2, 2));
    assert!(sequential.check(0, 1).allowed && sequential.check(0, 1).allowed);
    assert_eq!(
        cell.state(),
        sequential.state(),
        "{alg:?}: a charge was lost"
    );
    // A denial wrote nothing: a third check is still denied, a peek agrees, the state is as it
    // was.
    let before = cell.state();
    assert!(!cell.check(0, 1).allowed);
    assert!(!cell.peek(0, 1));
    assert_eq!(cell.state(), before);
}

#[test]
fn gcra_cell() {
    model("gcra cell", || {
        admitted_never_exceeds(Algorithm::TokenBucket)
    });
}

#[test]
fn leaky_bucket_cell() {
    model("leaky bucket cell", || {
        admitted_never_exceeds(Algorithm::LeakyBucket)
    });
}

#[test]
fn fixed_window_cell() {
    model("fixed window cell", || {
        admitted_never_exceeds(Algorithm::FixedWindow)
    });
}

#[test]
fn sliding_counter_cell() {
    model("sliding window counter cell", || {
        admitted_never_exceeds(Algorithm::SlidingWindowCounter)
    });
}

#[test]
fn sliding_log_cell() {
    model("sliding window log cell", || {
        admitted_never_exceeds(Algorithm::SlidingWindowLog)
    });
}

/// Rollover: one thread charges in window 0, another in window 1, concurrently. Window 1 must
/// count exactly its own charge (no lost or double counts) whichever lands first.
#[test]
fn fixed_window_rollover() {
    model("fixed window rollover", || {
        let cell = Arc::new(ModelCell::new(quota(Algorithm::FixedWindow, 2, 2)));
        let second = 1_000_000_000;
        let a = {
            let cell = cell.clone();
            thread::spawn(move || cell.check(second - 1, 1).allowed)
        };
        let b = {
            let cell = cell.clone();
            thread::spawn(move || cell.check(second, 1).allowed)
        };
        assert!(b.join().unwrap());
        // The window-0 charge is admitted (capacity 2) unless window 1 already replaced the
        // state, in which case it counts in window 1 (the stored window is newer): either way
        // window 1 holds at most both charges and at least its own.
        let _ = a.join().unwrap();
        assert!(cell.check(second, 1).allowed || !cell.peek(second, 1));
        assert!(
            !cell.check(second, 1).allowed,
            "window 1 holds at most its limit"
        );
    });
}

/// Sliding counter rollover: a charge in window 0 becomes `prev` of window 1, never lost.
#[test]
fn sliding_counter_rollover() {
    model("sliding window counter rollover", || {
        let cell = Arc::new(ModelCell::new(quota(Algorithm::SlidingWindowCounter, 2, 2)));
        let second = 1_000_000_000;
        let a = {
            let cell = cell.clone();
            thread::spawn(move || cell.check(0, 1).allowed)
        };
        let b = {
            let cell = cell.clone();
            thread::spawn(move || cell.check(second, 1).allowed)
        };
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        assert!(a && b);
        // At the start of window 1 the estimate is prev (1, or the charge counted as current)
        // plus cur: 2 units used of 2, so nothing more passes.
        assert!(!cell.peek(second, 1));
    });
}

/// Compound rollback: thread A charges part 1, finds part 2 spent, refunds part 1; thread B
/// charges part 1 concurrently. Part 1 ends holding exactly B's charge.
#[test]
fn compound_rollback() {
    model("compound rollback", || {
        let part1 = Arc::new(ModelCell::new(quota(Algorithm::TokenBucket, 2, 2)));
        let part2 = ModelCell::new(quota(Algorithm::TokenBucket, 1, 1));
        assert!(part2.check(0, 1).allowed); // part 2 is spent
        let b = {
            let part1 = part1.clone();
            thread::spawn(move || part1.check(0, 1).allowed)
        };
        let first = part1.check(0, 1);
        assert!(first.allowed);
        assert!(!part2.check(0, 1).allowed);
        part1.refund(1, first.token.unwrap(), 0);
        assert!(b.join().unwrap());
        // Exactly one unit (B's) is charged: one more passes, then none.
        assert!(part1.check(0, 1).allowed);
        assert!(!part1.check(0, 1).allowed);
    });
}

/// Sweep against check: a sweep may only remove a fresh cell; a check that charges first makes
/// it non-fresh. Here the freshness test runs concurrently with a charge: if it saw the cell
/// fresh, the charge came after (and a fresh re-created key gives the same answer).
#[test]
fn sweep_against_check() {
    model("sweep against check", || {
        let cell = Arc::new(ModelCell::new(quota(Algorithm::TokenBucket, 1, 1)));
        let checker = {
            let cell = cell.clone();
            thread::spawn(move || cell.check(0, 1).allowed)
        };
        let sweeper = {
            let cell = cell.clone();
            thread::spawn(move || cell.is_fresh(0))
        };
        let fresh = sweeper.join().unwrap();
        let admitted = checker.join().unwrap();
        assert!(admitted);
        if !fresh {
            // The sweep saw the charge: it must keep the entry, which denies the next check.
            assert!(!cell.check(0, 1).allowed);
        }
    });
}

/// The queue: two threads reserve one unit each on a bucket of burst 1 (T = 1 s), at most 1 s
/// ahead. One goes now, the other exactly one emission interval later: never both now, never
/// the same slot.
#[test]
fn queue_reservations() {
    model("queue (reserve) cell", || {
        let cell = Arc::new(ModelCell::new(quota(Algorithm::LeakyBucket, 1, 1)));
        let second = 1_000_000_000;
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let cell = cell.clone();
                thread::spawn(move || cell.reserve(0, 1, second).allowed)
            })
            .collect();
        for h in handles {
            assert!(h.join().unwrap());
        }
        // Two emission intervals are booked: TAT = 2 s exactly.
        assert_eq!(cell.state(), Some(2 * second));
        assert!(!cell.reserve(0, 1, second).allowed);
    });
}

/// A denial is ordered after the admissions it counted: each thread publishes a value (a plain,
/// non-atomic write) and then checks a cell of capacity 1; the thread that is denied reads the
/// other's value. loom reports a data race unless the admitted charge (Release) happens-before
/// the denying read (Acquire) -- the guarantee a `Relaxed` load in the CAS loop would break.
#[test]
fn denial_sees_what_admissions_published() {
    model("denial sees what admissions published", || {
        let cell = Arc::new(ModelCell::new(quota(Algorithm::TokenBucket, 1, 1)));
        let published = Arc::new([UnsafeCell::new(0u32), UnsafeCell::new(0u32)]);
        let handles: Vec<_> = (0..2)
            .map(|me| {
                let (cell, published) = (cell.clone(), published.clone());
                thread::spawn(move || {
                    // SAFETY (of the model): only this thread writes slot `me`, before its check.
                    published[me].with_mut(|p| unsafe { *p = 1 + me as u32 });
                    let admitted = cell.check(0, 1).allowed;
                    if !admitted {
                        let other = 1 - me;
                        // The other thread was admitted: its write must be visible.
                        let seen = published[other].with(|p| unsafe { *p });
                        assert_eq!(seen, 1 + other as u32);
                    }
                    admitted
                })
            })
            .collect();
        let admitted = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&a| a)
            .count();
        assert_eq!(admitted, 1);
    });
}
