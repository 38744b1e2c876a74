//! Time sources: a monotonic clock on `quanta`, and a [`FakeClock`] that tests move by hand.
//!
//! The engine sees time as integer nanoseconds (`u64`) since the clock's epoch, the moment the
//! clock was created. Window algorithms align their windows to Unix time, so a clock also reports
//! the Unix time of its epoch ([`Clock::unix_epoch_ns`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::sync::{AtomicU64, Ordering};

/// A source of time for a limiter.
///
/// Implementations must be cheap (a check reads the clock once) and should not go backwards;
/// every algorithm still stays safe if one does: time going back never returns permits.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since this clock's epoch.
    fn now(&self) -> u64;
    /// The Unix time of this clock's epoch, in nanoseconds. Windows are aligned to
    /// `floor((unix_epoch_ns + now) / period)`.
    fn unix_epoch_ns(&self) -> u64;
}

/// Backward steps of the raw source smaller than this are passed through, larger ones are clamped.
///
/// The high-water mark is written at most once per granule (by whichever thread first reads a
/// time that far past it), so it costs a shared cache-line write about a thousand times a
/// second, not on every check; every check only reads it. Smaller backward steps (TSC skew
/// between cores is nanoseconds) are absorbed by the algorithms themselves (a GCRA cell keeps
/// `max(TAT, now)`, a window keeps the newer window): none returns permits when time goes back.
const CLAMP_GRANULE_NS: u64 = 1_000_000;

/// The default clock: `quanta` (the TSC where it is invariant, else the OS monotonic clock).
///
/// TSC caveat: on machines whose TSC is not synchronised across sockets, two cores can disagree by
/// a small amount. This clock keeps a high-water mark, refreshed at most once per millisecond of
/// progress, and never returns less than it, so a large backwards step is clamped; smaller
/// disagreement between cores remains and is harmless to every algorithm.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    inner: Arc<MonotonicInner>,
}

#[derive(Debug)]
struct MonotonicInner {
    quanta: quanta::Clock,
    start: u64,
    unix_epoch_ns: u64,
    high_water: AtomicU64,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    ///
    /// ```
    /// use turnstile::{Clock, MonotonicClock};
    /// let clock = MonotonicClock::new();
    /// let a = clock.now();
    /// assert!(clock.now() >= a);
    /// ```
    pub fn new() -> Self {
        let quanta = quanta::Clock::new();
        let start = quanta.raw();
        let unix_epoch_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Self {
            inner: Arc::new(MonotonicInner {
                quanta,
                start,
                unix_epoch_ns,
                high_water: AtomicU64::new(0),
            }),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> u64 {
        let inner = &*self.inner;
        let raw = inner.quanta.delta_as_nanos(inner.start, inner.quanta.raw());
        // Relaxed: the high-water mark is a hint that only ever grows; no other memory is
        // published through it. If a racing thread raised it first we read either value, and both
        // are times some thread has already observed.
        let high = inner.high_water.load(Ordering::Relaxed);
        if raw <= high {
            return high;
        }
        if raw - high > CLAMP_GRANULE_NS {
            // Relaxed: fetch_max is a single RMW, so concurrent raisers cannot lower the mark.
            inner.high_water.fetch_max(raw, Ordering::Relaxed);
        }
        raw
    }

    fn unix_epoch_ns(&self) -> u64 {
        self.inner.unix_epoch_ns
    }
}

/// A clock that moves only when told to; clones share one time.
///
/// ```
/// use std::time::Duration;
/// use turnstile::{Clock, FakeClock};
/// let clock = FakeClock::new();
/// let other = clock.clone();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(other.now(), 5_000_000);
/// ```
#[derive(Debug, Clone)]
pub struct FakeClock {
    now: Arc<AtomicU64>,
    unix_epoch_ns: u64,
}

/// The Unix time a [`FakeClock::new`] starts at: 2023-11-14T22:13:20Z, a whole number of days,
/// hours and minutes, so windows of those sizes start exactly at the epoch.
pub const FAKE_UNIX_EPOCH_S: u64 = 1_700_006_400;

impl FakeClock {
    /// A clock at 0 whose epoch is Unix second [`FAKE_UNIX_EPOCH_S`].
    pub fn new() -> Self {
        Self::with_unix_epoch(Duration::from_secs(FAKE_UNIX_EPOCH_S))
    }

    /// A clock at 0 whose epoch is the given Unix time.
    pub fn with_unix_epoch(unix: Duration) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(0)),
            unix_epoch_ns: u64::try_from(unix.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    /// Moves time forward by `d` (saturating at `u64::MAX` nanoseconds).
    pub fn advance(&self, d: Duration) {
        self.advance_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Moves time forward by `ns` nanoseconds (saturating).
    pub fn advance_ns(&self, ns: u64) {
        // AcqRel: pairs with the Acquire load in `now`, so a thread that sees the new time also
        // sees everything the advancing thread did before it (tests rely on that to sequence).
        let mut cur = self.now.load(Ordering::Acquire);
        loop {
            let next = cur.saturating_add(ns);
            match self
                .now
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Sets the time, forwards or backwards (tests of clocks that jump back use this).
    pub fn set_ns(&self, ns: u64) {
        // Release: pairs with the Acquire load in `now`.
        self.now.store(ns, Ordering::Release);
    }
}

impl Default for FakeClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for FakeClock {
    #[inline]
    fn now(&self) -> u64 {
        // Acquire: pairs with the Release/AcqRel writes in `advance_ns` and `set_ns`.
        self.now.load(Ordering::Acquire)
    }

    fn unix_epoch_ns(&self) -> u64 {
        self.unix_epoch_ns
    }
}

/// Converts a duration to whole nanoseconds, saturating at `u64::MAX` (about 584 years).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
