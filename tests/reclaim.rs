//! A limiter left alone never locks new clients out: one-off clients fill `max_keys`, and once
//! their states are back to fresh, new clients are admitted with no sweep call and no sweeper,
//! on both stores and for word states and sliding logs alike, while a table full of live state
//! still denies (and never evicts a state that holds anything).

use std::time::Duration;

use tollgate::{Algorithm, FakeClock, Limiter, OnFull, Quota, Reason, StoreKind};

fn limiter(store: StoreKind, quota: Quota, clock: &FakeClock) -> Limiter<u64, FakeClock> {
    Limiter::<u64>::builder()
        .quota(quota)
        .max_keys(1_000)
        .store(store)
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn one_off_clients_never_lock_new_ones_out() {
    let quotas = [
        Quota::per_second(10),
        Quota::per_second(10).algorithm(Algorithm::FixedWindow),
        Quota::per_second(10).algorithm(Algorithm::SlidingWindowLog),
    ];
    for store in [StoreKind::Flat, StoreKind::Dash] {
        for quota in quotas {
            let clock = FakeClock::new();
            let l = limiter(store, quota, &clock);
            for k in 0..1_000 {
                assert!(l.check(&k).is_allowed());
            }
            assert_eq!(l.len(), 1_000);
            // Full of live state: a new client is denied, and nobody's state is evicted.
            assert_eq!(l.check(&5_000).reason(), Reason::TableFull);
            clock.advance(Duration::from_millis(500));
            assert_eq!(l.check(&5_001).reason(), Reason::TableFull);
            assert_eq!(l.stats().evictions, 0);
            // An hour later every one-off client is back to fresh: all new clients pass, each
            // taking a fresh state's place, with no sweep.
            clock.advance(Duration::from_secs(3_600));
            for k in 10_000..10_100 {
                let d = l.check(&k);
                assert!(d.is_allowed(), "{store:?} {quota:?} key {k}: {d:?}");
                assert_eq!(d.remaining(), 9);
            }
            assert_eq!(l.stats().evictions, 100, "{store:?} {quota:?}");
            assert_eq!(l.len(), 1_000);
            // The new clients' states are exact: 9 more each, then denied.
            for _ in 0..9 {
                assert!(l.check(&10_000).is_allowed());
            }
            assert_eq!(l.check(&10_000).reason(), Reason::Limited);
        }
    }
}

#[test]
fn a_live_key_is_never_reclaimed_and_deny_never_reclaims() {
    let clock = FakeClock::new();
    let l = limiter(StoreKind::Flat, Quota::per_hour(10), &clock);
    for k in 0..1_000 {
        assert!(l.check(&k).is_allowed());
    }
    // A minute later no state is fresh (each owes 6 minutes): nothing is reclaimed.
    clock.advance(Duration::from_secs(60));
    for k in 1_000..2_000 {
        assert_eq!(l.check(&k).reason(), Reason::TableFull);
    }
    assert_eq!(l.stats().evictions, 0);
    assert_eq!(l.check(&7).remaining(), 8, "key 7 kept its state");
    // `OnFull::Deny` is the strict cap: nothing is reclaimed, even when all is fresh.
    let strict = Limiter::<u64>::builder()
        .quota(Quota::per_second(10))
        .max_keys(1_000)
        .on_full(OnFull::Deny)
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in 0..1_000 {
        assert!(strict.check(&k).is_allowed());
    }
    clock.advance(Duration::from_secs(3_600));
    assert_eq!(strict.check(&5_000).reason(), Reason::TableFull);
    assert_eq!(strict.sweep_now(), 1_000);
    assert!(strict.check(&5_000).is_allowed());
}
