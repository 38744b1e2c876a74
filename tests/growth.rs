//! Tables that grow under load, through the public API only: two threads charge the same keys
//! while a third inserts new ones, so every shard moves into larger tables while it is being
//! charged. A frozen clock makes every figure exact.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use tollgate::{FakeClock, Limiter, Quota};

/// Each hot key's state holds exactly the charges its checks were told were admitted, however
/// many moves they raced; the threads contended (lost compare-and-swaps on the same keys); the
/// tables grew meanwhile (from a few KiB a shard to tables for 200,000 keys).
#[test]
fn growth_under_racing_checks_loses_no_charge() {
    const HOT: u64 = 32;
    const NEW: u64 = 200_000;
    const BURST: u64 = 1 << 40;
    let l: Arc<Limiter<u64, FakeClock>> = Arc::new(
        Limiter::builder()
            .quota(Quota::per_day(BURST).burst(BURST))
            .clock(FakeClock::new())
            .build()
            .unwrap(),
    );
    let before = l.table_bytes();
    let (barrier, stop) = (Arc::new(Barrier::new(3)), Arc::new(AtomicBool::new(false)));
    let checkers: Vec<_> = (0..2)
        .map(|_| {
            let (l, b, stop) = (l.clone(), barrier.clone(), stop.clone());
            std::thread::spawn(move || {
                b.wait();
                let mut admitted = [0u64; HOT as usize];
                let mut i = 0;
                // At least one pass over the keys after the inserter is done.
                while !stop.load(Ordering::Relaxed) || i < 2 * HOT {
                    let k = i % HOT;
                    admitted[k as usize] += u64::from(l.check(&k).is_allowed());
                    i += 1;
                }
                admitted
            })
        })
        .collect();
    barrier.wait();
    for k in 0..NEW {
        assert!(l.check(&(HOT + k)).is_allowed());
    }
    stop.store(true, Ordering::Relaxed);
    let mut admitted = [0u64; HOT as usize];
    for h in checkers {
        for (a, b) in admitted.iter_mut().zip(h.join().unwrap()) {
            *a += b;
        }
    }
    for k in 0..HOT {
        // What would remain after one more unit: the burst less every charge admitted.
        assert_eq!(
            l.peek(&k).remaining(),
            BURST - admitted[k as usize] - 1,
            "key {k}"
        );
    }
    let st = l.stats();
    assert_eq!(st.allowed, admitted.iter().sum::<u64>() + NEW);
    assert_eq!(st.keys, HOT + NEW);
    assert!(st.cas_retries > 0, "the checkers never raced on a key");
    let after = l.table_bytes();
    assert!(
        after >= 16 * 2 * (HOT + NEW) as usize && after > 100 * before,
        "tables {before} -> {after} bytes"
    );
}
