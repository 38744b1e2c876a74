//! The limiter on a 2-shard store (under loom, the dash store's protocol on loom's `RwLock`):
//! first insert of a key from two threads, the key cap, sweeping against checks, compound
//! limits on one key and across keys. Each model prints how many interleavings loom explored.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::{FakeClock, Limiter, Plan, Quota, Reason, check_all};
use tollgate_loom_tests::model;

const S: u64 = 1_000_000_000;

/// A limiter on two shards with room for a handful of keys (a store sized for the default
/// million keys would give loom a million objects to track).
fn limiter(quotas: &[Quota], clock: &FakeClock) -> Limiter<u64, FakeClock> {
    let mut b = Limiter::<u64>::builder().shards(2).max_keys(4);
    for q in quotas {
        b = b.quota(*q);
    }
    b.clock(clock.clone())
        .sweep_grace(Duration::ZERO)
        .build()
        .unwrap()
}

/// Runs `f(limiter)` on two threads and returns what each returned.
fn two<T: Send + 'static>(
    l: &Arc<Limiter<u64, FakeClock>>,
    f: impl Fn(&Limiter<u64, FakeClock>, usize) -> T + Send + Sync + 'static,
) -> [T; 2] {
    let f = Arc::new(f);
    let handles: Vec<_> = (0..2)
        .map(|i| {
            let (l, f) = (l.clone(), f.clone());
            thread::spawn(move || f(&l, i))
        })
        .collect();
    let mut it = handles.into_iter().map(|h| h.join().unwrap());
    [it.next().unwrap(), it.next().unwrap()]
}

/// Two threads check the same new key at once: exactly one entry is created and both charges
/// land on it (a third check finds the burst of 2 spent).
#[test]
fn first_insert_of_one_key() {
    model("first insert of one key", || {
        let clock = FakeClock::new();
        let l = Arc::new(limiter(&[Quota::per_second(2)], &clock));
        let admitted = two(&l, |l, _| l.check(&7).is_allowed());
        assert_eq!(admitted, [true, true]);
        assert_eq!(l.len(), 1);
        assert_eq!(l.shard_loads().iter().sum::<usize>(), 1);
        let third = l.check(&7);
        assert!(!third.is_allowed(), "a charge landed on a lost entry");
        assert_eq!(third.reason(), Reason::Limited);
    });
}

/// A table of one key, two threads inserting different keys: exactly one is tracked and
/// admitted, the other is denied as table-full and leaves nothing behind.
#[test]
fn key_cap_under_racing_inserts() {
    model("key cap under racing inserts", || {
        let clock = FakeClock::new();
        let l = Arc::new(
            Limiter::<u64>::builder()
                .shards(2)
                .max_keys(1)
                .quota(Quota::per_second(2))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let reasons = two(&l, |l, i| l.check(&(i as u64)).reason());
        let mut sorted = reasons;
        sorted.sort_by_key(|r| *r != Reason::Within);
        assert_eq!(sorted, [Reason::Within, Reason::TableFull], "{reasons:?}");
        assert_eq!(l.len(), 1);
        assert_eq!(l.shard_loads().iter().sum::<usize>(), 1);
    });
}

/// A sweep races a check on the same key. The key spent its one unit at 0 and is fresh again
/// at 1 s, when the sweep and the check run: the check is admitted, and afterwards the key is
/// spent whatever the order (the sweep removed only the fresh state, never the new charge).
#[test]
fn sweep_against_check_on_one_key() {
    model("sweep against check on one key", || {
        let clock = FakeClock::new();
        let l = Arc::new(limiter(&[Quota::per_second(1)], &clock));
        assert!(l.check(&7).is_allowed());
        clock.advance_ns(S);
        let [admitted, _] = two(&l, |l, i| {
            if i == 0 {
                l.check(&7).is_allowed()
            } else {
                l.sweep_now() == 1
            }
        });
        assert!(admitted);
        assert_eq!(l.len(), 1, "the new charge was swept away");
        assert!(!l.check(&7).is_allowed(), "extra permit after a sweep");
    });
}

/// A compound limit on one key (2 per 20 s AND 1 per 1 s): two threads check at once, one is
/// admitted; the other's charge of the first part is refunded, exactly once. Checked by what
/// the first part admits later: one charge of 10 s stands, so at 1 s one more passes and at 2 s
/// none (a lost refund would deny at 1 s; a double refund would admit at 2 s).
#[test]
fn compound_rollback_on_one_key() {
    model("compound rollback on one key", || {
        let clock = FakeClock::new();
        let slow = Quota::new(2, Duration::from_secs(20));
        let l = Arc::new(limiter(&[slow, Quota::per_second(1)], &clock));
        let admitted = two(&l, |l, _| l.check(&7).is_allowed());
        assert_eq!(admitted.iter().filter(|&&a| a).count(), 1, "{admitted:?}");
        clock.advance_ns(S);
        assert!(l.check(&7).is_allowed(), "the refund was lost");
        clock.advance_ns(S);
        assert!(!l.check(&7).is_allowed(), "refunded twice");
    });
}

/// A compound limit across keys (per-user AND global, `check_all`): two requests of one user
/// race for the last global unit. One passes; the other's per-user charge is refunded, so the
/// user has exactly one unit left of 3.
#[test]
fn compound_rollback_across_keys() {
    model("compound rollback across keys", || {
        let clock = FakeClock::new();
        let users = Arc::new(limiter(&[Quota::per_second(3)], &clock));
        let global = Arc::new(
            Limiter::<()>::builder()
                .shards(2)
                .max_keys(4)
                .quota(Quota::per_second(1))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (users, global) = (users.clone(), global.clone());
                thread::spawn(move || {
                    check_all(&[&users.key(&1), &global.key(&())], 1)
                        .unwrap()
                        .is_allowed()
                })
            })
            .collect();
        let admitted = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&a| a)
            .count();
        assert_eq!(admitted, 1);
        assert_eq!(users.check(&1).remaining(), 1, "the user's refund");
        assert!(users.check(&1).is_allowed());
        assert!(!users.check(&1).is_allowed());
    });
}

/// A plan change races a check: the key's spending carries over whichever comes first (the
/// check lands on the old entry and is migrated, or on the migrated one).
#[test]
fn plan_change_against_check() {
    model("plan change against check", || {
        let clock = FakeClock::new();
        let l = Arc::new(limiter(&[Quota::per_second(2)], &clock));
        assert!(l.check(&7).is_allowed());
        let [admitted, _] = two(&l, |l, i| {
            if i == 0 {
                l.check(&7).is_allowed()
            } else {
                l.set_plan("default", Plan::new([Quota::per_second(4).burst(2)]))
                    .is_ok()
            }
        });
        assert!(admitted);
        // Both units of the burst of 2 are spent under either plan.
        assert!(!l.check(&7).is_allowed());
    });
}
