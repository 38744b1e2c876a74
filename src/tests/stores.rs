//! The flat store against the dash store (every operation answers the same on both), and how
//! the flat store places keys and sizes its table.

use std::time::Duration;

use proptest::prelude::*;

use crate::{
    Algorithm, Decision, FakeClock, Limiter, OnFull, Plan, Quota, Reason, StoreKind, check_all,
};

fn build(store: StoreKind, q: Quota, clock: &FakeClock, max_keys: usize) -> Limiter<u8, FakeClock> {
    build_with(store, Plan::new([q]), clock, max_keys, OnFull::EvictFresh)
}

/// [`build`] with a whole default plan (its strategy and headroom too).
fn build_with(
    store: StoreKind,
    default: Plan,
    clock: &FakeClock,
    max_keys: usize,
    on_full: OnFull,
) -> Limiter<u8, FakeClock> {
    let l = Limiter::builder()
        .plan("default", default)
        .plan("other", Plan::new([Quota::per_second(3).burst(2)]))
        .plan(
            "compound",
            Plan::new([
                Quota::per_second(2).burst(3),
                Quota::per_minute(5).algorithm(Algorithm::FixedWindow),
            ]),
        )
        .store(store)
        // Two shards: each store's eviction then looks at every state (the flat store at 16
        // groups in up to 4 shards, the dash store in up to 4 shards).
        .shards(2)
        .max_keys(max_keys)
        .on_full(on_full)
        // No housekeeping sweeps: each store's would sweep a different shard's states.
        .housekeeping(false)
        .sweep_grace(Duration::ZERO)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(
        l.store_kind(),
        store,
        "the store asked for is the store built"
    );
    l
}

/// One operation of the differential test.
#[derive(Debug, Clone)]
enum Op {
    Check(u8),
    CheckN(u8, u64),
    Peek(u8),
    Reserve(u8, u64),
    Other(u8),
    Compound(u8),
    All(u8, u8),
    Block(u8, u64),
    Reset(u8),
    Sweep,
    Reconfigure(u64),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..6;
    prop_oneof![
        6 => key.clone().prop_map(Op::Check),
        2 => (key.clone(), 1u64..4).prop_map(|(k, n)| Op::CheckN(k, n)),
        1 => key.clone().prop_map(Op::Peek),
        1 => (key.clone(), 0u64..3_000).prop_map(|(k, ms)| Op::Reserve(k, ms)),
        2 => key.clone().prop_map(Op::Other),
        1 => key.clone().prop_map(Op::Compound),
        1 => (key.clone(), key.clone()).prop_map(|(a, b)| Op::All(a, b)),
        1 => (key.clone(), 0u64..2_000).prop_map(|(k, ms)| Op::Block(k, ms)),
        1 => key.prop_map(Op::Reset),
        1 => Just(Op::Sweep),
        1 => (1u64..6).prop_map(Op::Reconfigure),
        3 => (0u64..1_500).prop_map(Op::Advance),
    ]
}

/// What one operation answered, comparable across stores.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Decision(Decision),
    Error(String),
    Done(bool),
    Swept(usize),
    Nothing,
}

fn apply(l: &Limiter<u8, FakeClock>, clock: &FakeClock, op: &Op) -> Answer {
    let plan = |name: &str| l.plan(name).expect("plan exists");
    let answer = |r: Result<Decision, crate::Error>| match r {
        Ok(d) => Answer::Decision(d),
        Err(e) => Answer::Error(e.to_string()),
    };
    match *op {
        Op::Check(k) => Answer::Decision(l.check(&k)),
        Op::CheckN(k, n) => answer(l.check_n(&k, n)),
        Op::Peek(k) => Answer::Decision(l.peek(&k)),
        Op::Reserve(k, ms) => answer(l.reserve(&k, 1, Duration::from_millis(ms))),
        Op::Other(k) => answer(l.check_in(&k, plan("other"), 1)),
        Op::Compound(k) => answer(l.check_in(&k, plan("compound"), 1)),
        Op::All(a, b) => answer(check_all(&[&l.key(&a), &l.key_in(&b, plan("other"))], 1)),
        Op::Block(k, ms) => Answer::Done(l.block(&k, Duration::from_millis(ms))),
        Op::Reset(k) => Answer::Done(l.reset(&k)),
        Op::Sweep => Answer::Swept(l.sweep_now()),
        Op::Reconfigure(burst) => {
            let q = Quota::per_second(4).burst(burst);
            Answer::Done(l.set_plan("default", Plan::new([q])).is_ok())
        }
        Op::Advance(ms) => {
            clock.advance(Duration::from_millis(ms));
            Answer::Nothing
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every operation answers the same on both stores, and both keep the same stats (keys,
    /// admissions, denials, soft passes, sweeps): inline keys (the flat store's short check
    /// path), spilled ones (penalties, other plans, compound and cross-key limits), plan changes,
    /// sweeps and resets (six keys, a cap of six), under a hard or soft default plan with or
    /// without headroom.
    #[test]
    fn flat_and_dash_stores_agree(
        alg in prop_oneof![
            Just(Algorithm::TokenBucket),
            Just(Algorithm::FixedWindow),
            Just(Algorithm::SlidingWindowCounter),
        ],
        soft in any::<bool>(),
        headroom in 0u64..2,
        evict in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let on_full = if evict { OnFull::EvictFresh } else { OnFull::Deny };
        let q = Quota::per_second(4).burst(4).algorithm(alg);
        let strategy = if soft { crate::Strategy::Soft } else { crate::Strategy::Hard };
        let default = Plan::new([q]).strategy(strategy).headroom(headroom);
        let (fc, dc) = (FakeClock::new(), FakeClock::new());
        let flat = build_with(StoreKind::Flat, default.clone(), &fc, 6, on_full);
        let dash = build_with(StoreKind::Dash, default, &dc, 6, on_full);
        for (i, op) in ops.iter().enumerate() {
            let (a, b) = (apply(&flat, &fc, op), apply(&dash, &dc, op));
            // Evictions may pick different fresh states (each store looks in its own order):
            // no decision changes (a fresh state is an absent one), but which states are held
            // does, so what a reset or a sweep finds to remove, and the counts of states and
            // evictions, may differ.
            let held = evict && matches!(op, Op::Reset(_) | Op::Sweep);
            // Each store looks for a fresh victim in a bounded neighbourhood (the flat store
            // takes no displaced state of another shard, whose lock it does not hold): one may
            // find none where the other finds one. The traces part there; the case ends.
            let full = |x: &Answer| matches!(x, Answer::Decision(d) if d.reason() == Reason::TableFull);
            if evict && a != b && (full(&a) || full(&b)) {
                return Ok(());
            }
            if !held {
                prop_assert_eq!(&a, &b, "op {} {:?}", i, op);
            }
            // A new state at the cap that finds no fresh victim nearby walks the table (a
            // sweep): one store may walk where the other evicts.
            let same = |s: crate::Stats| {
                if evict {
                    crate::Stats { evictions: 0, keys: 0, swept: 0, sweeps: 0, ..s }
                } else {
                    s
                }
            };
            prop_assert_eq!(
                same(flat.stats()),
                same(dash.stats()),
                "stats after op {} {:?}",
                i,
                op
            );
            let (wrong, _) = flat.pass_counts().unwrap();
            prop_assert!(wrong.is_empty(), "pass counts after op {} {:?}: {:?}", i, op, wrong);
        }
    }

    /// A batch answers exactly what the same checks one by one answer.
    #[test]
    fn check_many_equals_checks_in_order(
        keys in proptest::collection::vec(0u8..40, 0..100),
        store in prop_oneof![Just(StoreKind::Flat), Just(StoreKind::Dash)],
    ) {
        let (c1, c2) = (FakeClock::new(), FakeClock::new());
        let q = Quota::per_second(2).burst(3);
        let (batch, single) = (build(store, q, &c1, 1000), build(store, q, &c2, 1000));
        let mut out = vec![batch.peek(&0); keys.len() + 3];
        prop_assert_eq!(batch.check_many(&keys, &mut out), keys.len());
        for (k, d) in keys.iter().zip(&out) {
            prop_assert_eq!(*d, single.check(k));
        }
        prop_assert_eq!(batch.stats().allowed, single.stats().allowed);
    }
}

/// A table filled to its cap, where many keys are not in the first slot their probe reads and
/// some are beyond their home group: every key, wherever it sits, is found and charged exactly
/// its burst, then denied, and nothing is counted twice or inserted again; with the inline
/// group scan where the CPU has it, and with portable-atomic's slot-by-slot probe.
#[test]
fn a_full_table_finds_every_key_wherever_it_sits() {
    // Above the small-table size, so the table is sized at its full load.
    const KEYS: u64 = 20_000;
    const BURST: u64 = 3;
    for inline in [true, false] {
        let l: Limiter<u64, FakeClock> = Limiter::builder()
            .quota(Quota::per_hour(BURST).burst(BURST))
            .store(StoreKind::Flat)
            .max_keys(KEYS as usize)
            .shards(2)
            .clock(FakeClock::new())
            .build()
            .unwrap();
        let l = if inline { l } else { l.without_inline_load() };
        for round in 0..=BURST {
            for k in 0..KEYS {
                let d = l.check(&k);
                assert_eq!(d.is_allowed(), round < BURST, "key {k}, round {round}");
                assert_eq!(d.remaining(), BURST.saturating_sub(round + 1), "key {k}");
            }
        }
        let st = l.stats();
        assert_eq!((st.allowed, st.denied, st.keys), (BURST * KEYS, KEYS, KEYS));
        let placed: Vec<(usize, bool)> = (0..KEYS).map(|k| l.placement(&k).unwrap()).collect();
        let elsewhere_in_home = placed
            .iter()
            .filter(|&&(d, first)| d == 0 && !first)
            .count();
        let beyond_home = placed.iter().filter(|&&(d, _)| d > 0).count();
        assert!(
            elsewhere_in_home > KEYS as usize / 10,
            "{elsewhere_in_home} keys off their first slot"
        );
        assert!(beyond_home > 0, "no key beyond its home group");
    }
}

/// At one million keys the table costs at most 20 bytes per key (16-byte slots, ~83% full at the
/// cap, and slack for uneven shards), whatever the shard count.
#[test]
fn table_is_at_most_20_bytes_per_key_at_the_cap() {
    for shards in [2, 8, 64, 256] {
        let l: Limiter<u64> = Limiter::builder()
            .quota(Quota::per_second(10))
            .max_keys(1_000_000)
            .shards(shards)
            .build()
            .unwrap();
        assert_eq!(l.store_kind(), StoreKind::Flat);
        let per_key = l.cap_bytes() as f64 / 1e6;
        assert!(per_key <= 20.0, "{shards} shards: {per_key} bytes per key");
    }
}

/// The tables at the cap's size, 2 MiB and more in all, start on a 2 MiB boundary, so transparent
/// huge pages can cover all of them but their tail (the kernel maps them only on aligned 2 MiB
/// ranges); small ones start wherever their mapping does, on a 4 KiB page.
#[test]
fn large_tables_start_on_a_huge_page_boundary() {
    for (max_keys, aligned) in [(1_000_000, true), (300_000, true), (1_000, false)] {
        let l: Limiter<u64> = Limiter::builder()
            .quota(Quota::per_second(10))
            .max_keys(max_keys)
            .build()
            .unwrap();
        let at = l.table_address().unwrap();
        assert_eq!(at % 4096, 0, "{max_keys} keys: table at {at:#x}");
        if aligned {
            assert!(
                l.cap_bytes() >= 2 << 20,
                "{max_keys} keys: {}",
                l.cap_bytes()
            );
            assert_eq!(at % (2 << 20), 0, "{max_keys} keys: table at {at:#x}");
        } else {
            assert!(
                l.cap_bytes() < 2 << 20,
                "{max_keys} keys: {}",
                l.cap_bytes()
            );
        }
    }
}

/// Every plan runs on the flat store (logs and compound plans too); only a `max_keys` too large
/// to map falls back to the dash store, and says so.
#[test]
fn only_unmappable_tables_fall_back_to_dash() {
    let log = Limiter::<u64>::builder()
        .quota(Quota::per_second(10).algorithm(Algorithm::SlidingWindowLog))
        .build()
        .unwrap();
    assert_eq!(log.store_kind(), StoreKind::Flat);
    let compound = Limiter::<u64>::builder()
        .quota(Quota::per_second(10))
        .quota(Quota::per_day(1000))
        .build()
        .unwrap();
    assert_eq!(compound.store_kind(), StoreKind::Flat);
    let unbounded = Limiter::<u64>::builder()
        .quota(Quota::per_second(10))
        .max_keys(usize::MAX)
        .build()
        .unwrap();
    assert_eq!(unbounded.store_kind(), StoreKind::Dash);
    assert_eq!(unbounded.table_bytes(), 0);
    assert!(unbounded.check(&1).is_allowed());
}

/// A table of at most 16 Ki keys is sized at 45% load (over 35 bytes per key), and a larger
/// `max_keys` never gets a smaller table.
#[test]
fn table_size_grows_with_max_keys_across_the_small_table_step() {
    for shards in [2, 8, 64] {
        let bytes = |max_keys: usize| {
            let l: Limiter<u64> = Limiter::builder()
                .quota(Quota::per_second(10))
                .max_keys(max_keys)
                .shards(shards)
                .build()
                .unwrap();
            assert_eq!(l.store_kind(), StoreKind::Flat);
            l.cap_bytes()
        };
        let sizes = [
            1_000, 8_000, 16_383, 16_384, 16_385, 20_000, 29_000, 40_000, 100_000,
        ];
        let table: Vec<usize> = sizes.iter().map(|&n| bytes(n)).collect();
        assert!(
            table.windows(2).all(|w| w[0] <= w[1]),
            "{shards} shards: {table:?}"
        );
        assert!(
            table[3] > 16_384 * 35,
            "{shards} shards: {} bytes at 16 Ki",
            table[3]
        );
    }
}
