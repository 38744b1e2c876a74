//! Shadow mode (a dry run): a limit decides and counts exactly as when enforcing, and never
//! denies what it would have denied.

use std::time::Duration;

use crate::{
    Algorithm, Decision, FakeClock, Limiter, OnFull, Plan, Quota, Reason, StoreKind, Strategy,
    check_all,
};

/// A plan of `quotas` under `strategy`, alone in a limiter on `store` and `clock`.
fn limiter(
    quotas: &[Quota],
    strategy: Strategy,
    store: StoreKind,
    clock: &FakeClock,
) -> Limiter<u64, FakeClock> {
    Limiter::builder()
        .plan("p", Plan::new(quotas.to_vec()).strategy(strategy))
        .store(store)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// The shadow twin of an enforcing decision: the same figures, let through as `Shadow` where
/// enforcing denied.
fn shadowed(hard: Decision) -> Decision {
    let mut d = hard;
    if !d.allowed {
        d.allowed = true;
        d.reason = Reason::Shadow;
    }
    d
}

#[test]
fn a_shadow_plan_decides_and_counts_as_an_enforcing_one_and_never_denies() {
    // One part (the short path), two parts (the compound short path), a log (the general
    // path), on both stores; several keys and costs, time moving in uneven steps.
    let plans: [&[Quota]; 3] = [
        &[Quota::per_second(10).burst(3)],
        &[
            Quota::per_second(10).burst(4),
            Quota::per_minute(6).algorithm(Algorithm::FixedWindow),
        ],
        &[Quota::per_second(3).algorithm(Algorithm::SlidingWindowLog)],
    ];
    for quotas in plans {
        for store in [StoreKind::Flat, StoreKind::Dash] {
            let clock = FakeClock::new();
            let hard = limiter(quotas, Strategy::Hard, store, &clock);
            let shadow = limiter(quotas, Strategy::Shadow, store, &clock);
            let (hp, sp) = (hard.plan("p").unwrap(), shadow.plan("p").unwrap());
            let mut denied = 0;
            for i in 0..200u64 {
                let (key, cost) = (i % 3, 1 + i % 2);
                let h = hard.check_in(&key, hp, cost).unwrap();
                let s = shadow.check_in(&key, sp, cost).unwrap();
                assert_eq!(s, shadowed(h), "{quotas:?} on {store:?}, call {i}");
                assert_eq!(
                    shadow.peek_in(&key, sp, 1).unwrap(),
                    shadowed(hard.peek_in(&key, hp, 1).unwrap())
                );
                denied += u64::from(!h.is_allowed());
                clock.advance(Duration::from_millis(7 * (i % 5)));
            }
            assert!(
                denied > 20,
                "the plan must deny for the test to mean anything"
            );
            let (h, s) = (hard.stats(), shadow.stats());
            assert_eq!(
                (s.allowed, s.denied, s.shadow_passed),
                (h.allowed, 0, h.denied)
            );
            let ps = &shadow.plan_stats()[0];
            assert_eq!((ps.plan.as_str(), ps.shadow_passed), ("p", denied));
        }
    }
}

#[test]
fn a_shadow_plan_lets_a_new_key_through_a_full_table_but_not_a_block() {
    let clock = FakeClock::new();
    let l: Limiter<u64, _> = Limiter::builder()
        .quota(Quota::per_second(1))
        .strategy(Strategy::Shadow)
        .max_keys(1)
        .on_full(OnFull::Deny)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert_eq!(l.check(&1).reason(), Reason::Within);
    let d = l.check(&2);
    assert!(d.is_allowed());
    assert_eq!(d.reason(), Reason::Shadow);
    assert_eq!((l.stats().table_full, l.stats().shadow_passed), (0, 1));
    assert_eq!(l.len(), 1, "a key let through a full table is not tracked");
    // A penalty is the application's own order: it denies even in shadow mode.
    assert!(l.block(&1, Duration::from_secs(5)));
    let d = l.check(&1);
    assert!(!d.is_allowed());
    assert_eq!(d.reason(), Reason::Blocked);
}

#[test]
fn a_shadow_part_of_check_all_never_denies_the_call_and_an_enforcing_one_still_does() {
    let clock = FakeClock::new();
    let l: Limiter<u64, _> = Limiter::builder()
        .plan("user", Plan::new([Quota::per_second(1).burst(3)]))
        .plan(
            "trial",
            Plan::new([Quota::per_second(1).burst(1)]).strategy(Strategy::Shadow),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let (user, trial) = (l.plan("user").unwrap(), l.plan("trial").unwrap());
    let global = 0u64;
    let mut reasons = Vec::new();
    for _ in 0..4 {
        let d = check_all(&[&l.key_in(&7, user), &l.key_in(&global, trial)], 1).unwrap();
        reasons.push((d.is_allowed(), d.remaining()));
    }
    // The user's own limit admits three and denies the fourth; the shadow limit would have
    // denied from the second on, and its verdict never reached the caller.
    assert_eq!(reasons, [(true, 0), (true, 0), (true, 0), (false, 0)]);
    let by_plan = |name: &str| {
        let p = l.plan_stats().into_iter().find(|p| p.plan == name).unwrap();
        (p.allowed, p.denied, p.shadow_passed, p.denied_elsewhere)
    };
    assert_eq!(by_plan("user"), (3, 1, 0, 0));
    // The shadow part's first pass is charged and kept; the next two pass unmarked; at the
    // fourth the user's part denied first, so the shadow part was only peeked.
    assert_eq!(by_plan("trial"), (1, 0, 2, 1));
}

#[test]
fn strategy_shadow_is_read_from_a_plans_file() {
    let config = crate::PlanConfig::parse(
        "[plans.trial]\nlimit = 1\nwindow = \"1m\"\nstrategy = \"shadow\"\n",
    )
    .unwrap();
    let l: Limiter<u64, _> = Limiter::builder()
        .plans(config)
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let trial = l.plan("trial").unwrap();
    let reasons: Vec<_> = (0..3)
        .map(|_| l.check_in(&1, trial, 1).unwrap().reason())
        .collect();
    assert_eq!(reasons, [Reason::Within, Reason::Shadow, Reason::Shadow]);
    let err =
        crate::PlanConfig::parse("[plans.x]\nlimit = 1\nwindow = \"1m\"\nstrategy = \"dry\"\n")
            .unwrap_err()
            .to_string();
    assert!(
        err.contains("expected hard, soft, shadow or queue"),
        "{err}"
    );
}
