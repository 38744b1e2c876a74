//! Hostile load: a key flood against the key cap, a hash flood against the shards, and real
//! threads on the real clock.
//!
//! Sizes: the key flood sends `TOLLGATE_FLOOD_KEYS` unique keys (default 10,000,000 in release
//! builds, 100,000 in debug builds) into a limiter capped at a tenth of that (1,000,000).
//! `scripts/test.sh` runs this file in release mode, full size:
//! `cargo test --release --test flood -- --nocapture --test-threads=1` (about 10 s on 2 cores).
//! Each test prints its figures.

use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

#[path = "../src/bin/tollgate/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::CountingAllocator;
use tollgate::{Clock, FakeClock, Limiter, MonotonicClock, OnFull, Quota, Reason};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// The tests of this file measure process-wide memory: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `VmRSS` or `VmHWM` (peak RSS) of this process, in bytes, from /proc/self/status.
fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn flood_keys() -> u64 {
    let default = if cfg!(debug_assertions) {
        100_000
    } else {
        10_000_000
    };
    std::env::var("TOLLGATE_FLOOD_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(1_000)
}

const MB: f64 = 1024.0 * 1024.0;

/// 10M unique keys into a limiter capped at 1M: the table never holds more than the cap; once
/// full, every new key is denied as table-full (the policy, every time) and memory stops
/// growing; the victim key, tracked before the flood, keeps its exact limit; the flooding keys
/// gain no admission beyond one per tracked key.
#[test]
fn key_flood_stays_within_the_cap() {
    let _serial = serial();
    let keys = flood_keys();
    let cap = (keys / 10) as usize;
    let clock = FakeClock::new();
    // Heap through the allocator, and resident memory (a store may map its table directly).
    let heap_before = CountingAllocator::live_bytes();
    let rss_before = proc_status_bytes("VmRSS:").unwrap_or(0);
    let l = Limiter::<u64>::builder()
        .quota(Quota::per_second(10))
        .max_keys(cap)
        .clock(clock.clone())
        .build()
        .unwrap();
    // The victim: 3 of its 10 spent before the flood.
    const VICTIM: u64 = u64::MAX;
    for _ in 0..3 {
        assert!(l.check(&VICTIM).is_allowed());
    }
    let mut admitted = 0u64;
    let mut table_full = 0u64;
    let mut heap_at_cap = None;
    for k in 0..keys {
        let d = l.check(&k);
        if d.is_allowed() {
            admitted += 1;
        } else {
            assert_eq!(d.reason(), Reason::TableFull, "key {k}");
            assert_eq!(d.retry_after(), Duration::from_secs(1), "key {k}");
            table_full += 1;
        }
        if k % 65_536 == 0 {
            assert!(l.len() <= cap, "{} keys tracked, cap {cap}", l.len());
        }
        if l.len() == cap && heap_at_cap.is_none() {
            heap_at_cap = Some((
                CountingAllocator::live_bytes(),
                proc_status_bytes("VmRSS:").unwrap_or(0),
            ));
        }
    }
    assert_eq!(l.len(), cap);
    assert_eq!(
        admitted,
        cap as u64 - 1,
        "one admission per tracked key, no more"
    );
    assert_eq!(table_full, keys - admitted);
    let stats = l.stats();
    assert_eq!(stats.table_full, table_full);
    assert_eq!(stats.allowed, admitted + 3);
    // Memory stopped growing when the table filled: 9M more keys added nothing.
    let (heap_at_cap, rss_at_cap) = heap_at_cap.expect("the table filled");
    let heap_after = CountingAllocator::live_bytes();
    let rss_after = proc_status_bytes("VmRSS:").unwrap_or(0);
    assert!(
        heap_after <= heap_at_cap + 64 * 1024,
        "heap grew {} bytes after the table was full",
        heap_after - heap_at_cap
    );
    assert!(
        rss_after <= rss_at_cap + 16 * 1024 * 1024,
        "resident memory grew {} bytes after the table was full",
        rss_after - rss_at_cap
    );
    // A tracked flooding key holds its own quota (9 of 10 left), no more; an untracked one is
    // still denied.
    assert_eq!(l.check(&0).remaining(), 8);
    assert_eq!(l.check(&(keys - 1)).reason(), Reason::TableFull);
    // The victim kept its exact state: 7 left, then denied.
    for left in (0..7).rev() {
        let d = l.check(&VICTIM);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), left);
    }
    assert_eq!(l.check(&VICTIM).reason(), Reason::Limited);
    let heap_per_key = (heap_after - heap_before) as f64 / cap as f64;
    let rss_per_key = rss_after.saturating_sub(rss_before) as f64 / cap as f64;
    // A key's slot, its u64 and one cell, with the hash table's spare capacity: far below this.
    assert!(heap_per_key < 256.0, "{heap_per_key} heap bytes per key");
    assert!(rss_per_key < 256.0, "{rss_per_key} resident bytes per key");
    println!(
        "key flood: {keys} unique keys, cap {cap}: {} tracked, {admitted} admitted, {table_full} \
         denied as table-full; heap {:.1} MiB = {heap_per_key:.1} bytes per key; resident growth \
         {:.1} MiB = {rss_per_key:.1} bytes per key; VmRSS {:.1} MiB, peak RSS (VmHWM) {:.1} MiB",
        l.len(),
        (heap_after - heap_before) as f64 / MB,
        rss_after.saturating_sub(rss_before) as f64 / MB,
        rss_after as f64 / MB,
        proc_status_bytes("VmHWM:").unwrap_or(0) as f64 / MB,
    );
}

/// The same flood with `OnFull::EvictFresh`: at a frozen clock no tracked key is fresh, so the
/// flood evicts nothing and is denied every time; once the tracked keys' state has run out (and
/// the sweep grace has passed), each new key takes one fresh key's place (evicted near its
/// slot, or swept by a walk of the shards when none is near), never a key with state.
#[test]
fn key_flood_with_eviction_evicts_only_fresh_keys() {
    let _serial = serial();
    // Smaller than the plain flood: at the cap, every new key makes the store scan its shard
    // for a fresh entry (the cost is printed below).
    let cap = (flood_keys() / 1_000).max(1_000) as usize;
    let clock = FakeClock::new();
    let l = Limiter::<u64>::builder()
        .quota(Quota::per_second(10))
        .max_keys(cap)
        .on_full(OnFull::EvictFresh)
        // Only the cap's own reclaim (a housekeeping sweep would also remove fresh keys).
        .housekeeping(false)
        .clock(clock.clone())
        .build()
        .unwrap();
    for k in 0..cap as u64 {
        assert!(l.check(&k).is_allowed());
    }
    // Three new keys per tracked one, so every shard gets more new keys than it has fresh ones
    // (eviction looks only in the new key's shard).
    let flood = cap as u64..4 * cap as u64;
    let started = std::time::Instant::now();
    for k in flood.clone() {
        assert_eq!(l.check(&k).reason(), Reason::TableFull, "key {k}");
    }
    let per_denial = started.elapsed().as_nanos() as f64 / (3 * cap) as f64;
    let st = l.stats();
    assert_eq!((st.evictions, st.swept), (0, 0));
    // 0.1 s (one unit) refills every key; with the 1 s grace none is fresh yet.
    clock.advance(Duration::from_millis(100));
    assert_eq!(l.check(&flood.start).reason(), Reason::TableFull);
    clock.advance(Duration::from_millis(1_100));
    // The victim (key 0) now spends all 10 of its units: it owes 1 s and must survive every
    // eviction below; every other key has been fresh for over the grace.
    for _ in 0..10 {
        assert!(l.check(&0).is_allowed());
    }
    let mut admitted = 0;
    for k in flood.clone() {
        let d = l.check(&k);
        if d.is_allowed() {
            admitted += 1;
        } else {
            assert_eq!(d.reason(), Reason::TableFull, "key {k}");
        }
        assert!(l.len() <= cap);
    }
    assert_eq!(
        admitted,
        cap - 1,
        "every fresh key evicted once, the victim kept"
    );
    let st = l.stats();
    assert_eq!(st.evictions + st.swept, cap as u64 - 1, "{st:?}");
    // The victim kept its exact state (a recreated key would pass): denied, next unit in 0.1 s.
    let d = l.check(&0);
    assert_eq!(d.reason(), Reason::Limited, "victim: {d:?}");
    assert_eq!(d.retry_after(), Duration::from_millis(100));
    println!(
        "eviction flood: cap {cap}, {} shards: a new key at the cap with nothing fresh costs \
         {per_denial:.0} ns (a bounded look near its home slot, in 4 shards); then {admitted} \
         fresh keys reclaimed (evicted, or swept at the cap), the victim kept",
        l.shard_loads().len()
    );
}

/// A weak hash with a fixed seed, as a naive table would use: Java's `String.hashCode`
/// (`h = 31 * h + byte`).
fn weak_hash(s: &str) -> u32 {
    s.bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
}

/// Keys that all collide under the weak hash: "Aa" and "BB" hash alike, so every string of `n`
/// blocks, each "Aa" or "BB", has the same hash (2^n keys).
fn colliding_keys(blocks: u32) -> Vec<String> {
    (0..1u32 << blocks)
        .map(|bits| {
            (0..blocks)
                .map(|i| if bits >> i & 1 == 0 { "Aa" } else { "BB" })
                .collect()
        })
        .collect()
}

/// 2^17 keys that collide completely under a fixed-seed weak hash (so a table using it would
/// put them all in one shard) go into the real limiter: its per-process random hasher spreads
/// them, largest shard / mean <= 1.5.
#[test]
fn hash_flood_spreads_over_shards() {
    let _serial = serial();
    const SHARDS: usize = 64;
    let keys = colliding_keys(17);
    let h0 = weak_hash(&keys[0]);
    assert!(
        keys.iter().all(|k| weak_hash(k) == h0),
        "the keys must collide"
    );
    // Under the weak hash every key lands in one shard: the attack works on a naive table.
    let weak_shard = |k: &str| weak_hash(k) as usize % SHARDS;
    assert!(keys.iter().all(|k| weak_shard(k) == weak_shard(&keys[0])));
    let l = Limiter::<String>::builder()
        .quota(Quota::per_second(10))
        .shards(SHARDS)
        .max_keys(keys.len())
        .clock(FakeClock::new())
        .build()
        .unwrap();
    for k in &keys {
        assert!(l.check(k).is_allowed());
    }
    let loads = l.shard_loads();
    assert_eq!(loads.len(), SHARDS);
    assert_eq!(loads.iter().sum::<usize>(), keys.len());
    let mean = keys.len() as f64 / SHARDS as f64;
    let max = *loads.iter().max().unwrap() as f64;
    let min = *loads.iter().min().unwrap() as f64;
    println!(
        "hash flood: {} keys colliding under a weak hash, {SHARDS} shards: largest shard {max}, \
         smallest {min}, mean {mean:.0}, largest / mean {:.3} (weak hash: all {} in one shard, \
         ratio {SHARDS})",
        keys.len(),
        max / mean,
        keys.len()
    );
    assert!(
        max / mean <= 1.5,
        "largest shard / mean = {:.3}",
        max / mean
    );
}

/// Real threads on the real clock for 2 s, one key, 1,000 per second with a burst of 50: the
/// admitted count never exceeds burst + elapsed / T + 1; the threads really contended (CAS
/// retries); the under-admission is reported.
#[test]
fn real_clock_threads_on_one_key() {
    let _serial = serial();
    const THREADS: usize = 4;
    const BURST: u64 = 50;
    const RUN: Duration = Duration::from_secs(2);
    let clock = MonotonicClock::new();
    let l = Arc::new(
        Limiter::<u64>::builder()
            .quota(Quota::per_second(1_000).burst(BURST))
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let t_ns = 1_000_000u64; // T = 1 s / 1000
    let barrier = Arc::new(Barrier::new(THREADS + 1));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (l, barrier) = (l.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let end = std::time::Instant::now() + RUN;
                let mut admitted = 0u64;
                let mut checks = 0u64;
                while std::time::Instant::now() < end {
                    for _ in 0..64 {
                        if l.check(&1).is_allowed() {
                            admitted += 1;
                        }
                    }
                    checks += 64;
                }
                (admitted, checks)
            })
        })
        .collect();
    // The first check of any thread comes after this reading, the last before the one below.
    let start = clock.now();
    barrier.wait();
    let (admitted, checks) = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .fold((0, 0), |(a, c), (a2, c2)| (a + a2, c + c2));
    let elapsed = clock.now() - start;
    let bound = BURST + elapsed / t_ns + 1;
    let stats = l.stats();
    println!(
        "real clock: {THREADS} threads, {:.3} s, {checks} checks: admitted {admitted}, bound \
         burst + elapsed/T + 1 = {bound}, under-admission {} ({:.3}%), CAS retries {}",
        elapsed as f64 / 1e9,
        bound - admitted.min(bound),
        (bound - admitted.min(bound)) as f64 * 100.0 / bound as f64,
        stats.cas_retries
    );
    assert!(admitted <= bound, "admitted {admitted} > bound {bound}");
    assert_eq!(stats.allowed, admitted);
    assert!(
        stats.cas_retries > 0,
        "the threads never contended: the test proved nothing"
    );
    // Hammering threads leave the bucket idle only between a permit's moment and the next
    // check: on any machine that runs them at all, most of the bound is admitted.
    assert!(
        admitted * 2 >= bound,
        "admitted {admitted} of {bound}: the clock or the cell lost time"
    );
}
