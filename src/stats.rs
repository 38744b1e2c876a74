//! Per-limiter counters, striped so that counting on the hot path does not bounce one cache line
//! between cores: each thread adds to its own stripe, and a read sums the stripes.

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, Ordering, StaticAtomicUsize};

/// A snapshot of a limiter's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests admitted (including those admitted after a delay).
    pub allowed: u64,
    /// Requests denied (over quota, blocked, or a full table).
    pub denied: u64,
    /// Requests over quota let through by a soft strategy.
    pub soft_passed: u64,
    /// Denials of new keys because the table was at `max_keys`.
    pub table_full: u64,
    /// Keys in the table now.
    pub keys: u64,
    /// Keys evicted to make room for new ones (only ever fresh ones).
    pub evictions: u64,
    /// Sweep steps run.
    pub sweeps: u64,
    /// Keys removed by sweeping.
    pub swept: u64,
    /// Compare-and-swap attempts lost to another thread (a measure of contention).
    pub cas_retries: u64,
}

/// Counters a thread bumps on the hot path.
#[derive(Default)]
struct Stripe {
    allowed: AtomicU64,
    denied: AtomicU64,
    soft_passed: AtomicU64,
    table_full: AtomicU64,
    cas_retries: AtomicU64,
}

/// What a check adds to the counters.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Count {
    Allowed,
    Denied,
    SoftPassed,
    TableFull,
}

impl Count {
    /// The counter a decision adds to.
    pub(crate) fn of(d: &crate::Decision) -> Count {
        match d.reason {
            crate::Reason::SoftLimit => Count::SoftPassed,
            crate::Reason::TableFull => Count::TableFull,
            _ if d.allowed => Count::Allowed,
            _ => Count::Denied,
        }
    }
}

pub(crate) struct Counters {
    stripes: Box<[CachePadded<Stripe>]>,
    evictions: AtomicU64,
    sweeps: AtomicU64,
    swept: AtomicU64,
}

/// Stripes per limiter: enough that threads up to twice the core count each get their own.
fn stripe_count() -> usize {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    (cores * 2).next_power_of_two().min(256)
}

/// The calling thread's stripe index (assigned round-robin on first use).
#[inline]
fn stripe_index() -> usize {
    static NEXT: StaticAtomicUsize = StaticAtomicUsize::new(0);
    thread_local! {
        // Relaxed: only distinctness matters, and fetch_add gives it.
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i)
}

impl Counters {
    pub(crate) fn new() -> Self {
        Counters {
            stripes: (0..stripe_count())
                .map(|_| CachePadded::new(Stripe::default()))
                .collect(),
            evictions: AtomicU64::new(0),
            sweeps: AtomicU64::new(0),
            swept: AtomicU64::new(0),
        }
    }

    #[inline]
    pub(crate) fn count(&self, what: Count, retries: u32) {
        let s = &self.stripes[stripe_index() & (self.stripes.len() - 1)];
        // Relaxed (all counters): statistics, read as an approximate snapshot; each add is one RMW
        // so none is lost.
        let c = match what {
            Count::Allowed => &s.allowed,
            Count::Denied => &s.denied,
            Count::SoftPassed => &s.soft_passed,
            Count::TableFull => {
                s.denied.fetch_add(1, Ordering::Relaxed);
                &s.table_full
            }
        };
        c.fetch_add(1, Ordering::Relaxed);
        if retries > 0 {
            s.cas_retries
                .fetch_add(u64::from(retries), Ordering::Relaxed);
        }
    }

    pub(crate) fn evicted(&self) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn swept(&self, removed: usize) {
        self.sweeps.fetch_add(1, Ordering::Relaxed);
        self.swept.fetch_add(removed as u64, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, keys: usize) -> Stats {
        let mut st = Stats {
            keys: keys as u64,
            ..Stats::default()
        };
        for s in self.stripes.iter() {
            st.allowed += s.allowed.load(Ordering::Relaxed);
            st.denied += s.denied.load(Ordering::Relaxed);
            st.soft_passed += s.soft_passed.load(Ordering::Relaxed);
            st.table_full += s.table_full.load(Ordering::Relaxed);
            st.cas_retries += s.cas_retries.load(Ordering::Relaxed);
        }
        st.evictions = self.evictions.load(Ordering::Relaxed);
        st.sweeps = self.sweeps.load(Ordering::Relaxed);
        st.swept = self.swept.load(Ordering::Relaxed);
        st
    }
}
