//! The one error type: mistakes in configuration or in a call. Denials are never errors; they are
//! [`Decision`](crate::Decision) values.

use std::fmt;

/// A configuration or call mistake, with a message that names the bad value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A quota's `limit` is zero.
    ZeroLimit,
    /// A quota's `period` is zero.
    ZeroPeriod,
    /// A quota's `burst` is zero.
    ZeroBurst,
    /// A quota's period is longer than [`Quota::MAX_PERIOD`](crate::Quota::MAX_PERIOD) (2^62 ns,
    /// about 146 years): window arithmetic on it could not stay below 2^64 ns.
    PeriodTooLong {
        /// The quota's period in nanoseconds (saturated at `u64::MAX`).
        period_ns: u64,
        /// The longest period accepted, in nanoseconds.
        max_ns: u64,
    },
    /// More than one unit per nanosecond: `limit` per `period_ns` cannot be represented.
    RateTooHigh {
        /// The quota's limit.
        limit: u64,
        /// The quota's period in nanoseconds.
        period_ns: u64,
    },
    /// `burst * (period / limit)` does not fit the cell (more than about 146 years of credit).
    BurstTooLarge {
        /// The quota's burst.
        burst: u64,
        /// The largest burst this rate allows.
        max: u64,
    },
    /// A window algorithm's limit is larger than its packed cell can count.
    LimitTooLarge {
        /// The algorithm's name.
        algorithm: &'static str,
        /// The quota's limit.
        limit: u64,
        /// The largest limit this algorithm can hold.
        max: u64,
    },
    /// A request's cost is larger than what the key can ever hold, so it could never pass.
    CostExceedsCapacity {
        /// The request's cost.
        cost: u64,
        /// The largest cost the quota can ever admit (its burst, or its window limit).
        capacity: u64,
    },
    /// A request's cost is zero.
    ZeroCost,
    /// A limiter needs at least one quota.
    NoQuota,
    /// A plan keeps back at least as much headroom as its quota holds, so it could never pass.
    HeadroomTooLarge {
        /// The plan's name.
        plan: String,
        /// The headroom kept free for higher tiers.
        headroom: u64,
        /// The smallest capacity among the plan's quotas.
        capacity: u64,
    },
    /// A plan name that the limiter does not know.
    UnknownPlan(String),
    /// A [`PlanId`](crate::PlanId) that another limiter issued: a limiter charges only plans
    /// it resolved itself ([`Limiter::plan`](crate::Limiter::plan)).
    ForeignPlan(crate::PlanId),
    /// A `max_keys` of zero.
    ZeroMaxKeys,
    /// `Builder::shards` is outside the accepted range.
    ShardsOutOfRange {
        /// The shard count asked for.
        shards: usize,
        /// The largest shard count accepted.
        max: usize,
    },
    /// Redis did not do what a call needed of it (unreachable, no answer within the deadline,
    /// an error reply): only for calls that must reach it ([`reset_async`] of a limiter on
    /// Redis); a decision is answered by the failure policy instead.
    ///
    /// [`reset_async`]: crate::Limiter::reset_async
    Redis(String),
    /// A configuration file that does not parse or holds a bad value.
    Config {
        /// 1-based line of the offending value, when known.
        line: Option<usize>,
        /// What is wrong, naming the field.
        message: String,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::ZeroLimit => f.write_str("quota limit is 0: a limit must be at least 1"),
            Error::ZeroPeriod => f.write_str("quota period is 0: a period must be at least 1 ns"),
            Error::ZeroBurst => f.write_str("quota burst is 0: a burst must be at least 1"),
            Error::PeriodTooLong { period_ns, max_ns } => write!(
                f,
                "quota period {period_ns} ns is too long (at most {max_ns} ns, about 146 years)"
            ),
            Error::RateTooHigh { limit, period_ns } => write!(
                f,
                "quota limit {limit} per {period_ns} ns is more than one unit per nanosecond"
            ),
            Error::BurstTooLarge { burst, max } => {
                write!(
                    f,
                    "quota burst {burst} is too large for this rate (at most {max})"
                )
            }
            Error::LimitTooLarge {
                algorithm,
                limit,
                max,
            } => {
                write!(
                    f,
                    "quota limit {limit} is too large for {algorithm} (at most {max})"
                )
            }
            Error::CostExceedsCapacity { cost, capacity } => write!(
                f,
                "cost {cost} exceeds the quota's capacity {capacity}: it could never be admitted"
            ),
            Error::ZeroCost => f.write_str("cost is 0: a request must cost at least 1 unit"),
            Error::NoQuota => f.write_str("no quota configured: a limiter needs at least one"),
            Error::HeadroomTooLarge {
                plan,
                headroom,
                capacity,
            } => write!(
                f,
                "plan '{plan}': headroom {headroom} leaves nothing of capacity {capacity}"
            ),
            Error::UnknownPlan(name) => write!(f, "unknown plan '{name}'"),
            Error::ForeignPlan(id) => write!(
                f,
                "plan id #{} belongs to another limiter: resolve the plan with this limiter's \
                 plan(name)",
                id.index
            ),
            Error::ZeroMaxKeys => f.write_str("max_keys is 0: the table must hold at least 1 key"),
            Error::ShardsOutOfRange { shards, max } => write!(
                f,
                "shards is {shards}: accepted from 1 to {max} (rounded up to a power of two)"
            ),
            Error::Redis(message) => write!(f, "redis: {message}"),
            Error::Config {
                line: Some(line),
                message,
            } => write!(f, "line {line}: {message}"),
            Error::Config {
                line: None,
                message,
            } => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}
