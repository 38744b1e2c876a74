//! Per-limiter counters, striped so that counting on the hot path does not bounce one cache line
//! between cores: each thread adds to its own stripe, and a read sums the stripes.
//!
//! The first thread to use a stripe owns it for the limiter's life and counts there with a plain
//! load and store (no locked instruction: a `lock xadd` was a quarter of a denial's cost); a
//! thread whose stripe another thread owns counts with `fetch_add` on the shared stripe. Only an
//! owner ever writes an owned stripe, so no count is lost.

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU64, AtomicUsize, Ordering, StaticAtomicUsize};

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
    /// The thread that owns this stripe (`stripe_index() + 1`), 0 while unowned.
    owner: AtomicUsize,
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
    /// Where threads count whose stripe another thread owns (with `fetch_add`).
    shared: CachePadded<Stripe>,
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
            shared: CachePadded::new(Stripe::default()),
            evictions: AtomicU64::new(0),
            sweeps: AtomicU64::new(0),
            swept: AtomicU64::new(0),
        }
    }

    /// The calling thread's own stripe, if it owns one (claiming it on first use).
    #[inline]
    fn own_stripe(&self) -> Option<&Stripe> {
        let index = stripe_index();
        let s = &self.stripes[index & (self.stripes.len() - 1)];
        let me = index + 1;
        // Relaxed (owner): ownership is claimed once and never changes; a thread only needs to
        // know whether the owner is itself, which its own claim (earlier in its program order)
        // or any older value answers correctly. Under loom every model thread shares one OS
        // thread's index, so models always take the shared stripe.
        let owner = s.owner.load(Ordering::Relaxed);
        let mine = !cfg!(turnstile_loom)
            && (owner == me
                || (owner == 0
                    && s.owner
                        .compare_exchange(0, me, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()));
        mine.then_some(&**s)
    }

    #[inline]
    pub(crate) fn count(&self, what: Count, retries: u32) {
        let (s, owned) = match self.own_stripe() {
            Some(s) => (s, true),
            None => (&*self.shared, false),
        };
        // Relaxed (all counters): statistics, read as an approximate snapshot. An owned stripe
        // has one writer, so a load and a store lose nothing; the shared stripe takes one RMW
        // per add.
        let add = |c: &AtomicU64, n: u64| {
            if owned {
                c.store(c.load(Ordering::Relaxed) + n, Ordering::Relaxed);
            } else {
                c.fetch_add(n, Ordering::Relaxed);
            }
        };
        let c = match what {
            Count::Allowed => &s.allowed,
            Count::Denied => &s.denied,
            Count::SoftPassed => &s.soft_passed,
            Count::TableFull => {
                add(&s.denied, 1);
                &s.table_full
            }
        };
        add(c, 1);
        if retries > 0 {
            add(&s.cas_retries, u64::from(retries));
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
        for s in self.stripes.iter().chain(std::iter::once(&self.shared)) {
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
