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
/// Implementations must be cheap (a check reads the clock once) and should not go backwards.
/// [`MonotonicClock`] never does (it clamps backward steps). What each algorithm guarantees when
/// a custom clock (or [`FakeClock::set_ns`]) does step back:
///
/// - **GCRA token / leaky bucket, queue**: never returns permits, however far back: the stored
///   theoretical arrival time stays ahead of `now`, so the key looks further in debt (stricter)
///   until the clock catches up.
/// - **Sliding window log**: never returns permits: entries stamped after `now` still count.
/// - **Fixed window**: a stored window up to 2^20 windows ahead of `now` keeps its count (stricter);
///   a step back of more than 2^20 windows reads the stored window id as an old one that
///   wrapped, and the key starts fresh in the earlier window: permits can return.
/// - **Sliding window counter**: the same, beyond 2^12 windows back.
///
/// The window ids are the low 32 (fixed) and 20 (sliding) bits of the window index; a state
/// from further in the future cannot be told from a wrapped old one in that space.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since this clock's epoch.
    fn now(&self) -> u64;
    /// The Unix time of this clock's epoch, in nanoseconds. Windows are aligned to
    /// `floor((unix_epoch_ns + now) / period)`.
    fn unix_epoch_ns(&self) -> u64;
    /// An identity that every clone of this clock shares and no other clock has, for clocks
    /// whose clones read one time (`None`, the default: never shared). [`check_all`] reads the
    /// time once for the parts whose limiters' clocks share one, so they decide at one instant.
    ///
    /// [`check_all`]: crate::check_all
    fn shared_id(&self) -> Option<usize> {
        None
    }
}

/// Backward steps of the raw source smaller than this are passed through, larger ones are clamped.
///
/// The high-water mark is written at most once per granule (by whichever thread first reads a
/// time that far past it), so it costs a shared cache-line write about a thousand times a
/// second, not on every check; every check only reads it. Smaller backward steps (TSC skew
/// between cores is nanoseconds) are absorbed by the algorithms themselves (a GCRA cell keeps
/// `max(TAT, now)`, a window keeps the newer window): none returns permits when time goes back.
const CLAMP_GRANULE_NS: u64 = 1_000_000;

/// The default clock: the TSC where quanta reads it (it is invariant), else quanta's clock (the
/// OS monotonic clock).
///
/// On the TSC the counter is read inline and scaled by quanta's calibration. Through quanta a
/// reading is an out-of-line call that matches on quanta's source every time. On the hot path
/// the clock read is most of a denial's cost, and reading the counter here saves that call:
/// about 1 ns a check.
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
    source: Source,
    unix_epoch_ns: u64,
    high_water: AtomicU64,
}

/// Where a [`MonotonicClock`] reads raw time.
#[derive(Debug)]
enum Source {
    /// The TSC, `start` at the epoch; `ticks * scale >> TSC_SHIFT` is nanoseconds.
    #[cfg(target_arch = "x86_64")]
    Tsc { start: u64, scale: u64 },
    /// quanta's clock, `start` its raw reading at the epoch.
    Quanta { clock: quanta::Clock, start: u64 },
}

/// The fixed-point shift of [`Source::Tsc`]'s scale: the scale is the nanoseconds of 2^40 ticks
/// (about six minutes at 3 GHz), so it is exact to about one part in 10^11.
#[cfg(target_arch = "x86_64")]
const TSC_SHIFT: u32 = 40;

impl Source {
    fn new() -> Self {
        let clock = quanta::Clock::new();
        #[cfg(target_arch = "x86_64")]
        if let Some(tsc) = Self::tsc(&clock) {
            return tsc;
        }
        let start = clock.raw();
        Source::Quanta { clock, start }
    }

    /// The TSC source, when `clock` reads the TSC (quanta does where the TSC is invariant):
    /// then each of its raw readings lies between two of ours, and its calibration scales ours.
    #[cfg(target_arch = "x86_64")]
    fn tsc(clock: &quanta::Clock) -> Option<Self> {
        let reads_tsc = (0..3).all(|_| {
            let before = rdtsc();
            let raw = clock.raw();
            before <= raw && raw <= rdtsc()
        });
        let scale = clock.delta_as_nanos(0, 1 << TSC_SHIFT);
        (reads_tsc && scale > 0).then(|| Source::Tsc {
            start: rdtsc(),
            scale,
        })
    }

    /// Nanoseconds since the epoch, as read (before the high-water clamp).
    #[inline(always)]
    fn read(&self) -> u64 {
        match self {
            #[cfg(target_arch = "x86_64")]
            Source::Tsc { start, scale } => {
                let ticks = rdtsc().saturating_sub(*start);
                // At most 2^64 ticks times a scale below 2^40 (a TSC slower than 1 GHz would
                // need more): fits in u128, and the shifted result in u64.
                ((u128::from(ticks) * u128::from(*scale)) >> TSC_SHIFT) as u64
            }
            Source::Quanta { clock, start } => clock.delta_as_nanos(*start, clock.raw()),
        }
    }
}

/// The time-stamp counter.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rdtsc() -> u64 {
    // SAFETY: `rdtsc` has no preconditions and every x86_64 CPU has it; it reads a counter and
    // touches no memory.
    unsafe { std::arch::x86_64::_rdtsc() }
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    ///
    /// ```
    /// use tollgate::{Clock, MonotonicClock};
    /// let clock = MonotonicClock::new();
    /// let a = clock.now();
    /// assert!(clock.now() >= a);
    /// ```
    pub fn new() -> Self {
        let source = Source::new();
        let unix_epoch_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Self {
            inner: Arc::new(MonotonicInner {
                source,
                unix_epoch_ns,
                high_water: AtomicU64::new(0),
            }),
        }
    }
}

impl MonotonicClock {
    /// The process's clock: clones of one `MonotonicClock`, whose epoch is the first call.
    /// Every limiter built without [`Builder::clock`] reads it, so limiters checked together
    /// ([`check_all`]) share one reading of the time.
    ///
    /// ```
    /// use tollgate::{Clock, MonotonicClock};
    /// assert_eq!(MonotonicClock::process().shared_id(), MonotonicClock::process().shared_id());
    /// assert_ne!(MonotonicClock::new().shared_id(), MonotonicClock::process().shared_id());
    /// ```
    ///
    /// [`Builder::clock`]: crate::Builder::clock
    /// [`check_all`]: crate::check_all
    pub fn process() -> Self {
        // Loom's atomics live for one model execution: a clock shared across them is not.
        #[cfg(tollgate_loom)]
        return Self::new();
        #[cfg(not(tollgate_loom))]
        {
            static PROCESS: std::sync::OnceLock<MonotonicClock> = std::sync::OnceLock::new();
            PROCESS.get_or_init(Self::new).clone()
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
        let raw = inner.source.read();
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

    fn shared_id(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self.inner) as usize)
    }
}

/// A clock that moves only when told to; clones share one time. It can be set back
/// ([`set_ns`](Self::set_ns)); see [`Clock`] for what each algorithm guarantees then.
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, FakeClock};
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

    fn shared_id(&self) -> Option<usize> {
        Some(Arc::as_ptr(&self.now) as usize)
    }
}

/// Converts a duration to whole nanoseconds, saturating at `u64::MAX` (about 584 years).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The nanoseconds `source` counts over 50 ms of `Instant`, less those 50 ms: the smallest
    /// difference of five tries, so a preemption between two paired reads cannot fail the test.
    fn drift_ns(source: &Source) -> u64 {
        (0..5)
            .map(|_| {
                let (a, i) = (source.read(), Instant::now());
                std::thread::sleep(Duration::from_millis(50));
                let (b, j) = (source.read(), Instant::now());
                (b - a).abs_diff(nanos(j - i))
            })
            .min()
            .unwrap()
    }

    /// Both sources run at the rate of std's monotonic clock, to within 0.2% (100 µs in 50 ms):
    /// a wrong TSC scale (a factor of the tick rate, or a shift off by one) is far outside it.
    #[test]
    fn sources_keep_real_time() {
        let clock = quanta::Clock::new();
        let quanta = Source::Quanta {
            start: clock.raw(),
            clock,
        };
        for (name, source) in [("quanta", quanta), ("default", Source::new())] {
            let drift = drift_ns(&source);
            assert!(drift < 100_000, "{name}: {drift} ns off in 50 ms");
        }
    }

    /// On a CPU with an invariant TSC and `rdtscp` (quanta's test for using the TSC; the CI
    /// machines have both) the clock reads the TSC inline: the fast path is the one that runs.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn reads_the_tsc_where_it_is_invariant() {
        use std::arch::x86_64::__cpuid;
        let max_extended = __cpuid(0x8000_0000).eax;
        let invariant = max_extended >= 0x8000_0007
            && __cpuid(0x8000_0007).edx & (1 << 8) != 0
            && __cpuid(0x8000_0001).edx & (1 << 27) != 0;
        assert_eq!(
            matches!(Source::new(), Source::Tsc { .. }),
            invariant,
            "invariant TSC with rdtscp: {invariant}"
        );
    }

    #[test]
    fn monotonic_never_goes_back() {
        let clock = MonotonicClock::new();
        let mut last = clock.now();
        for _ in 0..100_000 {
            let t = clock.now();
            assert!(t >= last, "{t} < {last}");
            last = t;
        }
    }
}
