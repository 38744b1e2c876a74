//! Expiry: a pure step, [`sweep_once`], and a thin driver, the [`Sweeper`] thread.
//!
//! A sweep removes only states that are indistinguishable from one never seen (fresh at the
//! sweep's `now` under their own rule), each atomically with its test (a compare-and-swap in the
//! flat store, the shard's exclusive lock elsewhere), so no check can charge a state between
//! the freshness test and the removal. The limiter passes a `now` that
//! is `sweep_grace` (default 1 s) in the past: a check that read its clock before the sweep and
//! runs after the removal finds a fresh key, and the state removed was already fresh at any
//! clock reading at most that stale, so sweeping never hands out extra permits to such a check.

use std::sync::Weak;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::store::{Fresh, Store};
use crate::sync::{AtomicUsize, Ordering};

/// Sweeps shards starting at `cursor` until at least `budget` entries have been visited or every
/// shard has been seen once. Returns `(visited, removed)`; advances the cursor past the shards
/// it swept, so the next step continues where this one stopped.
pub(crate) fn sweep_once<K, S: Store<K>>(
    store: &S,
    cursor: &AtomicUsize,
    fresh: Fresh<'_>,
    budget: usize,
    on_removed: impl FnMut(usize),
) -> (usize, usize) {
    sweep_until(
        store,
        cursor,
        fresh,
        |visited, _| visited >= budget,
        on_removed,
    )
}

/// Sweeps shards starting at `cursor`, one at a time, until `done(visited, removed)` (asked
/// after each shard) or every shard has been seen once. Returns `(visited, removed)`; advances
/// the cursor past the shards it swept.
pub(crate) fn sweep_until<K, S: Store<K>>(
    store: &S,
    cursor: &AtomicUsize,
    fresh: Fresh<'_>,
    mut done: impl FnMut(usize, usize) -> bool,
    mut on_removed: impl FnMut(usize),
) -> (usize, usize) {
    let shards = store.shards();
    let (mut visited, mut removed) = (0, 0);
    for _ in 0..shards {
        // Relaxed: the cursor only spreads work; two sweepers on one shard are each correct.
        let shard = cursor.fetch_add(1, Ordering::Relaxed) % shards;
        let (v, r) = store.sweep_shard(shard, fresh);
        visited += v;
        removed += r;
        on_removed(r);
        if done(visited, removed) {
            break;
        }
    }
    (visited, removed)
}

/// Something a [`Sweeper`] can sweep (implemented by every limiter).
pub(crate) trait Sweep: Send + Sync + 'static {
    fn sweep_all(&self) -> usize;
}

/// A background thread that sweeps a limiter every interval. Dropping the handle stops the
/// thread and joins it; the thread also ends by itself when the limiter is dropped.
///
/// ```
/// use std::{sync::Arc, time::Duration};
/// use tollgate::{Limiter, Quota};
/// let limiter = Arc::new(Limiter::<u64>::builder().quota(Quota::per_second(5)).build().unwrap());
/// let sweeper = limiter.start_sweeper(Duration::from_millis(10));
/// drop(sweeper); // stops and joins
/// ```
#[derive(Debug)]
pub struct Sweeper {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Sweeper {
    pub(crate) fn start<L: Sweep>(target: Weak<L>, interval: Duration) -> Sweeper {
        let (stop, wake) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("tollgate-sweeper".into())
            .spawn(move || {
                loop {
                    match wake.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => match target.upgrade() {
                            Some(limiter) => {
                                limiter.sweep_all();
                            }
                            None => return,
                        },
                        // A message or a dropped sender: stop.
                        _ => return,
                    }
                }
            })
            .ok();
        Sweeper {
            stop: Some(stop),
            thread,
        }
    }

    /// Stops the thread and waits for it (what dropping does).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.shutdown();
    }
}
