//! What an idle or lightly used limiter costs in resident memory: default limiters (sized for a
//! million keys) holding a hundred keys each. One test in its own process, so no other test's
//! allocations move the figure.

use tollgate::{Limiter, Quota};

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
    // Each is still sized for a million keys: the table is a cap, not a cost.
    assert!(limiters[0].table_bytes() > 10 << 20);
}
