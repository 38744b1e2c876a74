//! A limiter left alone never locks new clients out: one-off clients fill `max_keys`, and once
//! their states are back to fresh, new clients are admitted with no sweep call and no sweeper,
//! on both stores and for word states and sliding logs alike, while a table full of live state
//! still denies (and never evicts a state that holds anything). Stale states also go, and logs
//! give their memory back, by the housekeeping step that calls creating state take now and then.

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

/// States removed without a sweep call: reclaimed at the cap, or swept by housekeeping.
fn reclaimed(l: &Limiter<u64, FakeClock>) -> u64 {
    l.stats().evictions + l.stats().swept
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
            assert_eq!(reclaimed(&l), 0);
            // An hour later every one-off client is back to fresh: all new clients pass, each
            // taking a fresh state's place, with no sweep.
            clock.advance(Duration::from_secs(3_600));
            for k in 10_000..10_100 {
                let d = l.check(&k);
                assert!(d.is_allowed(), "{store:?} {quota:?} key {k}: {d:?}");
                assert_eq!(d.remaining(), 9);
            }
            // Each took a fresh state's place (at the cap, or after a housekeeping sweep freed
            // a shard's worth).
            assert!(reclaimed(&l) >= 100, "{store:?} {quota:?}: {:?}", l.stats());
            assert!(l.len() <= 1_000);
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
    assert_eq!(reclaimed(&l), 0);
    assert_eq!(l.check(&7).remaining(), 8, "key 7 kept its state");
    // `OnFull::Deny` is the strict cap: nothing is reclaimed, even when all is fresh.
    let strict = Limiter::<u64>::builder()
        .quota(Quota::per_second(10))
        .max_keys(1_000)
        .on_full(OnFull::Deny)
        .housekeeping(false)
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

/// With no sweeper and no sweep call, a stream of new clients sweeps the stale ones as it goes:
/// the table holds about the live keys, and sliding logs give their heap back.
#[test]
fn housekeeping_sweeps_stale_states_as_new_ones_come() {
    let clock = FakeClock::new();
    let l = Limiter::<u64>::builder()
        .quota(Quota::per_second(10).algorithm(Algorithm::SlidingWindowLog))
        .max_keys(100_000)
        .shards(8)
        .clock(clock.clone())
        .build()
        .unwrap();
    // 10,000 one-off clients a second for 10 s; each is stale 2 s later (its log empty and the
    // sweep grace passed).
    for second in 0..10u64 {
        for k in 0..10_000 {
            assert!(l.check(&(second * 10_000 + k)).is_allowed());
        }
        clock.advance(Duration::from_secs(1));
    }
    let stats = l.stats();
    assert!(stats.swept > 50_000, "{stats:?}");
    assert_eq!(
        stats.evictions, 0,
        "far from the cap: nothing to reclaim there"
    );
    assert!(l.len() < 60_000, "{} states held", l.len());
    // Off, nothing goes by itself.
    let idle = Limiter::<u64>::builder()
        .quota(Quota::per_second(10).algorithm(Algorithm::SlidingWindowLog))
        .max_keys(100_000)
        .shards(8)
        .housekeeping(false)
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in 0..100_000 {
        assert!(idle.check(&k).is_allowed());
        if k % 10_000 == 9_999 {
            clock.advance(Duration::from_secs(1));
        }
    }
    assert_eq!(idle.stats().swept, 0);
    assert_eq!(idle.len(), 100_000);
    assert!(idle.state_heap_bytes() > l.state_heap_bytes());
}

/// Stale states anywhere make room, not only those near a new key's slot: with many shards a
/// new key's neighbourhood holds no stale state, and the shards are swept in turn before the
/// key is denied. With the stale states gone, the table is full of live state and the next new
/// key is denied.
#[test]
fn stale_states_far_from_a_new_key_make_room_too() {
    for store in [StoreKind::Flat, StoreKind::Dash] {
        let clock = FakeClock::new();
        let l = Limiter::<u64>::builder()
            .quota(Quota::per_minute(10))
            .max_keys(64)
            .shards(64)
            .store(store)
            .clock(clock.clone())
            .build()
            .unwrap();
        for k in 0..64 {
            assert!(l.check(&k).is_allowed());
        }
        clock.advance(Duration::from_secs(3_600));
        // 60 of the old clients come back (live again); 4 stay stale, wherever they sit.
        for k in 4..64 {
            assert!(l.check(&k).is_allowed());
        }
        for k in 1_000..1_004 {
            let d = l.check(&k);
            assert!(
                d.is_allowed(),
                "{store:?} new key {k}: {d:?} {:?}",
                l.stats()
            );
        }
        assert_eq!(reclaimed(&l), 4, "{store:?}: {:?}", l.stats());
        assert_eq!(l.check(&2_000).reason(), Reason::TableFull, "{store:?}");
        clock.advance(Duration::from_millis(200));
        assert_eq!(l.check(&2_001).reason(), Reason::TableFull, "{store:?}");
        assert_eq!(reclaimed(&l), 4, "no live state is ever reclaimed");
    }
}

/// The promise at the cap does not depend on housekeeping, nor on where the stale states lie:
/// 64 shards, 4,096 states, housekeeping off, 16 stale states all in shards 0-7, and 16 new
/// keys in shards 16-55, so no shard a new key's eviction looks in (its own and the next three)
/// holds one. Every new key is admitted in a stale state's place (the table never holds more
/// than `max_keys`), and once nothing is stale a new key is denied, until states go stale again.
/// Both stores.
#[test]
fn stale_states_make_room_at_the_cap_without_housekeeping() {
    const CAP: usize = 4_096;
    for store in [StoreKind::Flat, StoreKind::Dash] {
        let clock = FakeClock::new();
        let l = Limiter::<u64>::builder()
            .quota(Quota::per_minute(10))
            .max_keys(CAP)
            .shards(64)
            .housekeeping(false)
            .store(store)
            .clock(clock.clone())
            .build()
            .unwrap();
        // Where a key lands (the hasher's seed is random): the shard its first check fills.
        let shard_of = |k: u64| {
            let before = l.shard_loads();
            assert!(l.check(&k).is_allowed());
            let after = l.shard_loads();
            (0..before.len()).find(|&i| after[i] > before[i]).unwrap()
        };
        // New keys that land in shards 16-55, each checked once to see where, then forgotten.
        let mut new_keys = Vec::new();
        for k in 1_000_000.. {
            if (16..56).contains(&shard_of(k)) {
                new_keys.push(k);
            }
            assert!(l.reset(&k));
            if new_keys.len() == 16 {
                break;
            }
        }
        assert_eq!(l.len(), 0);
        // Fill the cap; the first 16 keys in shards 0-7 are the ones that will go stale.
        let mut stale = Vec::new();
        for k in 0..CAP as u64 {
            if stale.len() < 16 {
                if shard_of(k) < 8 {
                    stale.push(k);
                }
            } else {
                assert!(l.check(&k).is_allowed());
            }
        }
        assert_eq!(l.len(), CAP);
        // An hour later every state is fresh; all but the 16 come back and are live again.
        clock.advance(Duration::from_secs(3_600));
        for k in (0..CAP as u64).filter(|k| !stale.contains(k)) {
            assert!(l.check(&k).is_allowed());
        }
        assert_eq!(reclaimed(&l), 0);
        for &k in &new_keys {
            let d = l.check(&k);
            assert!(
                d.is_allowed(),
                "{store:?} new key {k}: {d:?} {:?}",
                l.stats()
            );
            assert!(l.len() <= CAP);
        }
        assert_eq!(l.len(), CAP);
        assert_eq!(reclaimed(&l), 16, "{store:?}: {:?}", l.stats());
        assert_eq!(l.sweep_now(), 0, "{store:?}: a stale state was left behind");
        // Nothing is stale: a new key is denied, and so is the next, with no state removed.
        assert_eq!(l.check(&2_000_000).reason(), Reason::TableFull, "{store:?}");
        assert_eq!(l.check(&stale[0]).reason(), Reason::TableFull, "{store:?}");
        assert_eq!(reclaimed(&l), 16);
        // Once the states are stale again (6 s of debt and the 1 s grace), new keys pass.
        clock.advance(Duration::from_secs(7));
        assert!(l.check(&2_000_000).is_allowed(), "{store:?}");
        assert!(l.len() <= CAP);
    }
}
