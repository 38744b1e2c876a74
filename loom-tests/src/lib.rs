//! loom models of tollgate: one test file per area (`tests/cells.rs` the cells and the CAS loop,
//! `tests/limiter.rs` the limiter on a 2-shard store: first insert, the cap, sweeping, compound
//! limits, `tests/clock.rs` the fake clock). Run with `scripts/loom.sh`.
#[cfg(not(tollgate_loom))]
compile_error!(
    "loom-tests must be built with RUSTFLAGS=\"--cfg tollgate_loom\": run scripts/loom.sh"
);

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `f` under loom and prints the number of interleavings explored, as
/// `loom model <name>: <n> interleavings` (scripts/loom.sh collects these lines).
pub fn model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    loom::model(move || {
        // Relaxed: a plain counter read after `loom::model` returns (same thread).
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    println!(
        "loom model {name}: {} interleavings",
        runs.load(Ordering::Relaxed)
    );
}
