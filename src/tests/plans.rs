//! State per (key, rule): plans, tiers, compound and cross-key limits on one key, each rule
//! holding its own bound whatever else shares the key; refunds exact under real threads.

use std::collections::HashMap;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use proptest::prelude::*;

use crate::{
    Algorithm, Decision, FAKE_UNIX_EPOCH_S, FakeClock, Limiter, Plan, PlanId, Quota, StoreKind,
    check_all,
};

/// The quotas the plans below are made of.
fn fast() -> Quota {
    Quota::per_second(10).burst(5)
}
fn strict() -> Quota {
    Quota::per_second(10).burst(1)
}
fn slow() -> Quota {
    Quota::per_second(2).burst(3)
}
fn window() -> Quota {
    Quota::per_second(5).algorithm(Algorithm::FixedWindow)
}
fn log() -> Quota {
    Quota::per_second(4).algorithm(Algorithm::SlidingWindowLog)
}
fn route() -> Quota {
    Quota::per_second(5).burst(2)
}

/// Several live plans over the same few quotas: two that differ only in burst, a compound plan
/// and the same quotas in the other order, a lower tier (headroom) on `fast`, a log.
fn plans(store: StoreKind, clock: &FakeClock) -> Limiter<u8, FakeClock> {
    Limiter::builder()
        .plan("a", Plan::new([fast()]))
        .plan("b", Plan::new([strict()]))
        .plan("c", Plan::new([slow(), window()]))
        .plan("d", Plan::new([window(), slow()]))
        .plan("lo", Plan::new([fast()]).headroom(2))
        .plan("log", Plan::new([log()]))
        .store(store)
        .max_keys(1000)
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn route_limiter(store: StoreKind, clock: &FakeClock) -> Limiter<u8, FakeClock> {
    Limiter::builder()
        .quota(route())
        .store(store)
        .clock(clock.clone())
        .build()
        .unwrap()
}

const PLANS: [&str; 6] = ["a", "b", "c", "d", "lo", "log"];

fn quotas_of(plan: &str) -> Vec<Quota> {
    match plan {
        "a" | "lo" => vec![fast()],
        "b" => vec![strict()],
        "c" => vec![slow(), window()],
        "d" => vec![window(), slow()],
        "log" => vec![log()],
        _ => vec![route()],
    }
}

/// The most units `quota` may admit to one key among `admitted` (time ns, cost): GCRA at most
/// `burst + floor(d / T)` in any span `d`; the fixed window at most `limit` per Unix-aligned
/// window; the log at most `limit` in any span shorter than the period.
fn bound_holds(quota: &Quota, admitted: &mut [(u64, u64)]) -> Result<(), String> {
    admitted.sort();
    let period = quota.period().as_nanos() as u64;
    let limit = quota.limit();
    for j in 0..admitted.len() {
        let (tj, _) = admitted[j];
        let mut units = 0;
        for i in (0..=j).rev() {
            let (ti, ci) = admitted[i];
            units += ci;
            let allowed = match quota.algo() {
                Algorithm::FixedWindow => {
                    let phase = (FAKE_UNIX_EPOCH_S * 1_000_000_000) % period;
                    if (ti + phase) / period != (tj + phase) / period {
                        break;
                    }
                    limit
                }
                Algorithm::SlidingWindowLog => {
                    if tj - ti >= period {
                        break;
                    }
                    limit
                }
                _ => {
                    let t = period.div_ceil(limit);
                    quota.burst_size() + (tj - ti) / t
                }
            };
            if units > allowed {
                return Err(format!(
                    "{quota:?}: {units} units in [{ti}, {tj}] ns, at most {allowed}"
                ));
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Check(u8, usize, u64),
    All(u8, usize, u8),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, 0..PLANS.len(), 1u64..3).prop_map(|(k, p, n)| Op::Check(k, p, n)),
        2 => (0u8..3, 0..PLANS.len(), 0u8..2).prop_map(|(k, p, r)| Op::All(k, p, r)),
        3 => (0u64..400).prop_map(Op::Advance),
    ]
}

/// Admissions per (limiter, key, quota): time and cost.
type Ledger = HashMap<(u8, u8, String), (Quota, Vec<(u64, u64)>)>;

fn record(ledger: &mut Ledger, limiter: u8, key: u8, quotas: &[Quota], now: u64, cost: u64) {
    for q in quotas {
        let e = ledger
            .entry((limiter, key, format!("{q:?}")))
            .or_insert_with(|| (*q, Vec::new()));
        e.1.push((now, cost));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Random traces of live plans on a few keys (plans differing in burst, the same quotas in
    /// another order, a tier with headroom, a log) and `check_all` of a user plan with a route
    /// limit: for every quota and key, the units admitted never exceed its bound over any span.
    #[test]
    fn every_rule_holds_its_own_bound(
        store in prop_oneof![Just(StoreKind::Flat), Just(StoreKind::Dash)],
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let clock = FakeClock::new();
        let l = plans(store, &clock);
        let r = route_limiter(store, &clock);
        let ids: Vec<PlanId> = PLANS.iter().map(|p| l.plan(p).unwrap()).collect();
        let mut ledger = Ledger::new();
        for op in &ops {
            let now = crate::Clock::now(&clock);
            match *op {
                Op::Check(k, p, n) => {
                    let cost = n.min(if PLANS[p] == "b" { 1 } else { 2 });
                    if l.check_in(&k, ids[p], cost).unwrap().is_allowed() {
                        record(&mut ledger, 0, k, &quotas_of(PLANS[p]), now, cost);
                    }
                }
                Op::All(k, p, rk) => {
                    let d = check_all(&[&l.key_in(&k, ids[p]), &r.key(&rk)], 1).unwrap();
                    if d.is_allowed() {
                        record(&mut ledger, 0, k, &quotas_of(PLANS[p]), now, 1);
                        record(&mut ledger, 1, rk, &[route()], now, 1);
                    }
                }
                Op::Advance(ms) => clock.advance(Duration::from_millis(ms)),
            }
        }
        for ((_, _, _), (q, admitted)) in ledger.iter_mut() {
            if let Err(e) = bound_holds(q, admitted) {
                prop_assert!(false, "{}", e);
            }
        }
    }
}

/// Checks of `plan` for key 0 at one instant, `n` times.
fn admitted(l: &Limiter<u8, FakeClock>, plan: &str, n: usize) -> usize {
    let id = l.plan(plan).unwrap();
    (0..n)
        .filter(|_| l.check_in(&0, id, 1).unwrap().is_allowed())
        .count()
}

/// Two plans on one key that differ only in burst, alternated at one instant: each admits
/// exactly its own burst (a state per key moved between them admitted without bound).
#[test]
fn alternating_plans_each_hold_their_burst() {
    for store in StoreKind::ALL {
        let clock = FakeClock::new();
        let l = plans(store, &clock);
        let (mut a, mut b) = (0, 0);
        for _ in 0..100 {
            a += admitted(&l, "a", 1);
            b += admitted(&l, "b", 1);
        }
        assert_eq!((a, b), (5, 1), "{store:?}");
    }
}

/// The same two quotas listed in another order are the same two states: together the two
/// plans admit exactly the binding bound (slow's burst of 3).
#[test]
fn the_same_quotas_in_another_order_share_their_states() {
    for store in StoreKind::ALL {
        let clock = FakeClock::new();
        let l = plans(store, &clock);
        let mut total = 0;
        for _ in 0..50 {
            total += admitted(&l, "c", 1) + admitted(&l, "d", 1);
        }
        assert_eq!(total, 3, "{store:?}");
    }
}

/// A lower tier on a shared quota is that quota's one state seen with headroom: the tier stops
/// while 2 would remain, the higher tier takes those 2.
#[test]
fn tiers_are_one_state_with_headroom() {
    for store in StoreKind::ALL {
        let clock = FakeClock::new();
        let l = plans(store, &clock);
        assert_eq!(admitted(&l, "lo", 10), 3, "{store:?}");
        assert_eq!(admitted(&l, "a", 10), 2, "{store:?}");
        assert_eq!(admitted(&l, "lo", 10), 0, "{store:?}");
    }
}

/// A request made exactly at `retry_after`, with no other traffic, passes: for a plain plan, a
/// compound plan whose second part denies, and `check_all` of a user plan with a route limit.
#[test]
fn retry_after_is_honoured() {
    for store in StoreKind::ALL {
        for plan in ["a", "b", "c", "d", "log"] {
            let clock = FakeClock::new();
            let l = plans(store, &clock);
            let id = l.plan(plan).unwrap();
            let mut denied: Option<Decision> = None;
            for _ in 0..20 {
                let d = l.check_in(&0, id, 1).unwrap();
                if !d.is_allowed() {
                    denied = Some(d);
                    break;
                }
            }
            let wait = denied.expect("a plan with a burst denies").retry_after();
            assert!(wait > Duration::ZERO);
            clock.advance(wait);
            let d = l.check_in(&0, id, 1).unwrap();
            assert!(
                d.is_allowed(),
                "{store:?} {plan}: denied at retry_after: {d:?}"
            );
        }
        let clock = FakeClock::new();
        let (l, r) = (plans(store, &clock), route_limiter(store, &clock));
        let user = l.plan("a").unwrap();
        let all = || check_all(&[&l.key_in(&0, user), &r.key(&0)], 1).unwrap();
        assert!(all().is_allowed() && all().is_allowed());
        let d = all();
        assert!(!d.is_allowed());
        clock.advance(d.retry_after());
        assert!(
            all().is_allowed(),
            "{store:?}: check_all denied at retry_after"
        );
    }
}

/// Real threads, frozen clock, one key on a compound plan whose second part binds: exactly that
/// part's limit is admitted, the first part keeps exactly those charges (every refund exact),
/// and the threads really raced (retries seen).
#[test]
fn threads_on_a_compound_plan_admit_exactly_the_binding_bound() {
    const THREADS: usize = 4;
    const LIMIT: u64 = 20_000;
    let bucket = Quota::per_second(1000).burst(3 * LIMIT);
    let window = Quota::per_hour(LIMIT).algorithm(Algorithm::FixedWindow);
    for attempt in 0..100 {
        let clock = FakeClock::new();
        let l: Arc<Limiter<u64, FakeClock>> = Arc::new(
            Limiter::builder()
                .plan("both", Plan::new([bucket, window]))
                .plan("bucket", Plan::new([bucket]))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let barrier = Arc::new(Barrier::new(THREADS));
        let admitted: u64 = (0..THREADS)
            .map(|_| {
                let (l, barrier) = (l.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let both = l.plan("both").unwrap();
                    barrier.wait();
                    (0..LIMIT)
                        .filter(|_| l.check_in(&7, both, 1).unwrap().is_allowed())
                        .count() as u64
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(admitted, LIMIT, "attempt {attempt}");
        let left = l.peek_in(&7, l.plan("bucket").unwrap(), 1).unwrap();
        assert_eq!(
            left.remaining(),
            3 * LIMIT - LIMIT - 1,
            "attempt {attempt}: refunds"
        );
        if l.stats().cas_retries > 0 {
            return;
        }
    }
    panic!("threads never collided in 100 attempts: the test proved nothing");
}

/// Real threads, frozen clock, each on its own user, all under one global limit (`check_all`):
/// exactly the global bound is admitted, and each user's state holds exactly its own
/// admissions (every refund of a global denial exact), with the global word really raced.
#[test]
fn threads_across_keys_admit_exactly_the_global_bound() {
    const THREADS: usize = 4;
    const GLOBAL: u64 = 30_000;
    const USER: u64 = 20_000;
    for attempt in 0..100 {
        let clock = FakeClock::new();
        let users: Arc<Limiter<u64, FakeClock>> = Arc::new(
            Limiter::builder()
                .quota(Quota::per_hour(1).burst(USER))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let global: Arc<Limiter<(), FakeClock>> = Arc::new(
            Limiter::builder()
                .quota(Quota::per_hour(1).burst(GLOBAL))
                .clock(clock.clone())
                .build()
                .unwrap(),
        );
        let barrier = Arc::new(Barrier::new(THREADS));
        let per_user: Vec<u64> = (0..THREADS as u64)
            .map(|user| {
                let (users, global, barrier) = (users.clone(), global.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..USER)
                        .filter(|_| {
                            check_all(&[&users.key(&user), &global.key(&())], 1)
                                .unwrap()
                                .is_allowed()
                        })
                        .count() as u64
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        assert_eq!(per_user.iter().sum::<u64>(), GLOBAL, "attempt {attempt}");
        for (user, n) in per_user.iter().enumerate() {
            // A peek reports what one more unit would leave: none when the user holds all
            // USER units (a thread that ran through before the others reached the global
            // limit).
            let left = users.peek(&(user as u64)).remaining();
            assert_eq!(
                left,
                (USER - n).saturating_sub(1),
                "attempt {attempt}: user {user}'s refunds"
            );
        }
        if global.stats().cas_retries > 0 {
            return;
        }
    }
    panic!("threads never collided in 100 attempts: the test proved nothing");
}

/// A plan change moves each key's state once, whatever the algorithms: from a log to a bucket
/// (another algorithm: a fresh start, the log's state gone), then to a faster bucket (the debt
/// carried in units); one state per key throughout.
#[test]
fn a_plan_change_moves_each_state_once() {
    for store in StoreKind::ALL {
        let clock = FakeClock::new();
        let l: Limiter<u8, FakeClock> = Limiter::builder()
            .quota(Quota::per_second(10).algorithm(Algorithm::SlidingWindowLog))
            .store(store)
            .clock(clock.clone())
            .build()
            .unwrap();
        assert!(l.check(&1).is_allowed());
        assert_eq!(l.len(), 1);
        l.set_plan("default", Plan::new([Quota::per_second(10).burst(5)]))
            .unwrap();
        assert_eq!(
            l.check(&1).remaining(),
            4,
            "{store:?}: another algorithm starts fresh"
        );
        assert_eq!(l.len(), 1, "{store:?}: the log's state moved out");
        assert_eq!(l.check(&1).remaining(), 3);
        l.set_plan("default", Plan::new([Quota::per_second(20).burst(5)]))
            .unwrap();
        // Two units of debt (200 ms at 10/s) are two units at 20/s: 5 - 2 - 1 left.
        assert_eq!(
            l.check(&1).remaining(),
            2,
            "{store:?}: the debt carried in units"
        );
        assert_eq!(l.len(), 1, "{store:?}");
        // Back to the first bucket's quota: its rule is live again, the key's state moves back.
        l.set_plan("default", Plan::new([Quota::per_second(10).burst(5)]))
            .unwrap();
        assert_eq!(
            l.check(&1).remaining(),
            1,
            "{store:?}: 3 units of debt, and this one"
        );
        assert_eq!(l.len(), 1, "{store:?}");
    }
}

/// A plan id belongs to the limiter that issued it: another limiter refuses it with
/// `ForeignPlan` on every call that takes a plan, whether its index lies past that limiter's
/// plans or names one of them (which is never charged in its place). `PlanId::DEFAULT` is every
/// limiter's default plan, and a plan changed in place keeps its id.
#[test]
fn a_plan_id_from_another_limiter_is_refused() {
    let clock = FakeClock::new();
    let build = |names: &[&str]| {
        let mut b = Limiter::<u8>::builder()
            .quota(Quota::per_minute(5))
            .clock(clock.clone());
        for name in names {
            b = b.plan(*name, Plan::new([Quota::per_minute(1)]));
        }
        b.build().unwrap()
    };
    let a = build(&["x", "y", "z"]);
    let b = build(&["w"]);
    // `z` is #3, past b's two plans; `x` is #1, the place of b's `w`.
    let (x, z) = (a.plan("x").unwrap(), a.plan("z").unwrap());
    for id in [z, x] {
        let foreign = crate::Error::ForeignPlan(id);
        assert_eq!(b.check_in(&1, id, 1).unwrap_err(), foreign);
        assert_eq!(b.peek_in(&1, id, 1).unwrap_err(), foreign);
        assert_eq!(
            b.reserve_in(&1, id, 1, Duration::from_secs(1)).unwrap_err(),
            foreign
        );
        assert_eq!(check_all(&[&b.key_in(&1, id)], 1).unwrap_err(), foreign);
    }
    assert_eq!(
        crate::Error::ForeignPlan(x).to_string(),
        "plan id #1 belongs to another limiter: resolve the plan with this limiter's plan(name)"
    );
    // Nothing was charged or counted under b's plans: `w` (1 a minute) still has its unit.
    assert_eq!(b.len(), 0);
    let counted: u64 = b.plan_stats().iter().map(|p| p.allowed + p.denied).sum();
    assert_eq!(counted, 0);
    let w = b.plan("w").unwrap();
    assert!(b.check_in(&1, w, 1).unwrap().is_allowed());
    // Each limiter takes its own ids, and DEFAULT is each one's default plan.
    assert!(a.check_in(&1, x, 1).unwrap().is_allowed());
    assert_eq!(b.check_in(&1, PlanId::DEFAULT, 1).unwrap().remaining(), 4);
    assert_eq!(a.check_in(&1, PlanId::DEFAULT, 1).unwrap().remaining(), 4);
    // A plan changed in place keeps its id, still a's alone.
    assert_eq!(
        a.set_plan("x", Plan::new([Quota::per_minute(2)])).unwrap(),
        x
    );
    assert!(a.check_in(&1, x, 1).unwrap().is_allowed());
    assert_eq!(
        b.check_in(&1, x, 1).unwrap_err(),
        crate::Error::ForeignPlan(x)
    );
}

/// Penalties live beside the states: at most `max_keys` keys under one at once, every plan of a
/// blocked key denied, and a sweep drops the expired ones so new keys can be blocked.
#[test]
fn penalties_are_capped_and_swept() {
    for store in StoreKind::ALL {
        let clock = FakeClock::new();
        let l: Limiter<u8, FakeClock> = Limiter::builder()
            .plan("a", Plan::new([fast()]))
            .plan("c", Plan::new([slow(), window()]))
            .max_keys(2)
            .sweep_grace(Duration::ZERO)
            .store(store)
            .clock(clock.clone())
            .build()
            .unwrap();
        assert!(l.block(&1, Duration::from_secs(1)));
        assert!(l.block(&2, Duration::from_secs(1)));
        assert!(!l.block(&3, Duration::from_secs(1)), "{store:?}: the cap");
        assert!(
            l.block(&1, Duration::from_secs(2)),
            "{store:?}: a blocked key again"
        );
        for plan in ["a", "c"] {
            let d = l.check_in(&2, l.plan(plan).unwrap(), 1).unwrap();
            assert_eq!(d.reason(), crate::Reason::Blocked, "{store:?} {plan}");
            assert_eq!(d.retry_after(), Duration::from_secs(1));
        }
        assert!(l.check(&3).is_allowed());
        assert_eq!(l.len(), 1, "{store:?}: a penalty holds no state");
        clock.advance(Duration::from_millis(1500));
        l.sweep_now();
        assert!(
            l.block(&3, Duration::from_secs(1)),
            "{store:?}: key 2's penalty was swept"
        );
        assert_eq!(
            l.check(&1).reason(),
            crate::Reason::Blocked,
            "{store:?}: key 1's is not over"
        );
        assert!(l.check(&2).is_allowed(), "{store:?}");
    }
}
