//! Quotas (what the user asks for), checked and compiled into the [`Rule`]s (the integer
//! parameters) that the algorithms in `algo` decide by.

use std::time::Duration;

pub use crate::algo::Algorithm;
use crate::algo::{Divisor, Kind, Rule, fixed, log, sliding};
use crate::clock::nanos;
use crate::error::Error;

/// `limit` units per `period`, with a `burst` and an [`Algorithm`].
///
/// A quota is a plain value; it is checked when a limiter is built, and every mistake (a zero, a
/// rate above one per nanosecond, a burst that overflows) is an [`Error`] naming the value.
///
/// ```
/// use tollgate::{Algorithm, Quota};
/// let q = Quota::per_second(10).burst(20);
/// assert_eq!(q.limit(), 10);
/// let w = Quota::per_minute(100).algorithm(Algorithm::FixedWindow);
/// assert_eq!(w.period(), std::time::Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period_ns: u64,
    burst: Option<u64>,
    algorithm: Algorithm,
}

impl Quota {
    /// `limit` units per `period`. The burst defaults to `limit`; the algorithm to the token bucket.
    pub fn new(limit: u64, period: Duration) -> Self {
        Self {
            limit,
            period_ns: nanos(period),
            burst: None,
            algorithm: Algorithm::TokenBucket,
        }
    }
    /// The longest period a quota may have: 2^62 ns, about 146 years. Longer is
    /// [`Error::PeriodTooLong`]: with times below 2^63 ns, a time plus a period always fits.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Error, Limiter, Quota};
    /// let centuries = Quota::new(1, Quota::MAX_PERIOD + Duration::from_nanos(1));
    /// let built = Limiter::<u64>::builder().quota(centuries).build();
    /// assert!(matches!(built, Err(Error::PeriodTooLong { .. })));
    /// ```
    pub const MAX_PERIOD: Duration = Duration::from_nanos(MAX_TOLERANCE_NS);

    /// `limit` per second.
    pub fn per_second(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(1))
    }
    /// `limit` per minute.
    pub fn per_minute(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(60))
    }
    /// `limit` per hour.
    pub fn per_hour(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(3600))
    }
    /// `limit` per day.
    pub fn per_day(limit: u64) -> Self {
        Self::new(limit, Duration::from_secs(86_400))
    }
    /// How many units an idle key may spend at once (bucket algorithms; windows ignore it).
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }
    /// The algorithm that enforces the quota.
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }
    /// Units per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }
    /// The burst (defaults to the limit).
    pub fn burst_size(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }
    /// The algorithm.
    pub fn algo(&self) -> Algorithm {
        self.algorithm
    }

    /// The burst as set with [`burst`](Self::burst) (`None`: the limit), for writing a quota
    /// back as it was configured.
    pub(crate) fn burst_set(&self) -> Option<u64> {
        self.burst
    }
    /// The most units a key can hold: the burst for buckets, the limit for windows.
    pub(crate) fn capacity(&self) -> u64 {
        if self.algorithm.kind() == Kind::Gcra {
            self.burst_size()
        } else {
            self.limit
        }
    }

    /// Checks the quota and derives the integer parameters; `unix_epoch_ns` aligns windows.
    pub(crate) fn compile(&self, unix_epoch_ns: u64) -> Result<Rule, Error> {
        if self.limit == 0 {
            return Err(Error::ZeroLimit);
        }
        if self.period_ns == 0 {
            return Err(Error::ZeroPeriod);
        }
        if self.period_ns > MAX_TOLERANCE_NS {
            return Err(Error::PeriodTooLong {
                period_ns: self.period_ns,
                max_ns: MAX_TOLERANCE_NS,
            });
        }
        let burst = self.burst_size();
        if burst == 0 {
            return Err(Error::ZeroBurst);
        }
        let kind = self.algorithm.kind();
        let max_limit = match kind {
            Kind::Gcra => u64::MAX,
            Kind::Fixed => fixed::MAX_LIMIT,
            Kind::Sliding => sliding::MAX_LIMIT,
            Kind::Log => log::MAX_LIMIT,
        };
        if self.limit > max_limit {
            return Err(Error::LimitTooLarge {
                algorithm: self.algorithm.name(),
                limit: self.limit,
                max: max_limit,
            });
        }
        // Every algorithm: more than one unit per nanosecond is not a rate this crate keeps.
        if self.limit > self.period_ns {
            return Err(Error::RateTooHigh {
                limit: self.limit,
                period_ns: self.period_ns,
            });
        }
        let (emission, tolerance) = if kind == Kind::Gcra {
            // Rounded up: the steady rate is never above limit/period (at most 1 ns per unit
            // slower), so no quota admits more than its own bound.
            let t = self.period_ns.div_ceil(self.limit);
            let max = MAX_TOLERANCE_NS / t;
            if burst > max {
                return Err(Error::BurstTooLarge { burst, max });
            }
            (t, burst * t)
        } else {
            (0, 0)
        };
        let capacity = if kind == Kind::Gcra {
            burst
        } else {
            self.limit
        };
        Ok(Rule {
            algorithm: self.algorithm,
            kind,
            limit: self.limit,
            period: self.period_ns,
            capacity,
            emission,
            per_emission: Divisor::new(emission.max(1)),
            tolerance,
            phase: unix_epoch_ns % self.period_ns,
        })
    }
}

/// The largest bucket tolerance (`burst * T`), 2^62 ns (about 146 years): with any `now` below
/// 2^63 (292 years of uptime) every sum of a time and a tolerance fits in a u64.
pub(crate) const MAX_TOLERANCE_NS: u64 = 1 << 62;
