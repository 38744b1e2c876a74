//! What an idle or lightly used limiter costs in resident memory: default limiters (sized for a
//! million keys) holding a hundred keys each, and one holding a hundred thousand. Run one at a
//! time (a lock), in their own process, so no other test's allocations move the figures.

use std::sync::Mutex;

use tollgate::{Limiter, Quota};

/// One figure at a time.
static ALONE: Mutex<()> = Mutex::new(());

fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[test]
fn ten_default_limiters_with_a_hundred_keys_each_stay_small() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    // Warm the allocator and the thread's statistics stripe first, outside the figure.
    let warm = Limiter::<u64>::builder()
        .quota(Quota::per_second(10))
        .build()
        .unwrap();
    assert!(warm.check(&0).is_allowed());
    drop(warm);
    let before = resident_bytes();
    let limiters: Vec<Limiter<u64>> = (0..10)
        .map(|_| {
            Limiter::builder()
                .quota(Quota::per_second(10))
                .build()
                .unwrap()
        })
        .collect();
    for (i, l) in limiters.iter().enumerate() {
        // Keys spread over the whole table, as real clients' hashes are.
        for k in 0..100u64 {
            assert!(l.check(&(k * 7919 + i as u64)).is_allowed());
        }
        assert_eq!(l.len(), 100);
    }
    let grown = resident_bytes().saturating_sub(before);
    println!(
        "10 default limiters x 100 keys: {:.2} MiB resident ({} bytes a limiter)",
        grown as f64 / (1 << 20) as f64,
        grown / 10
    );
    assert!(
        grown < 10 << 20,
        "{grown} bytes resident for 10 limiters of 100 keys"
    );
    // Each still takes up to a million keys: the cap is a bound, not a cost. Its tables now are
    // the first, small ones (a few KiB a shard).
    assert!(
        limiters[0].table_bytes() < 1 << 20,
        "{}",
        limiters[0].table_bytes()
    );
}

/// The tables grow with the keys present: a limiter sized for a million keys that holds 100,000
/// holds tables for about 100,000 (a few MiB), not the 19 MiB of the cap, resident or not.
#[test]
fn a_hundred_thousand_keys_in_a_default_limiter_hold_a_tenth_of_the_cap() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let l: Limiter<u64> = Limiter::builder()
        .quota(Quota::per_second(10))
        .build()
        .unwrap();
    let before = resident_bytes();
    for k in 0..100_000u64 {
        assert!(l.check(&k.wrapping_mul(0x9E37_79B9_7F4A_7C15)).is_allowed());
    }
    let grown = resident_bytes().saturating_sub(before);
    let tables = l.table_bytes();
    println!(
        "100,000 keys: tables {:.2} MiB, resident growth {:.2} MiB",
        tables as f64 / (1 << 20) as f64,
        grown as f64 / (1 << 20) as f64
    );
    // At most 50% of the slots used, at least 25% after a doubling: 32-65 bytes a key.
    assert!((3_200_000..=6_600_000).contains(&tables), "{tables} bytes");
    assert!(grown < 8 << 20, "{grown} bytes resident for 100,000 keys");
}
