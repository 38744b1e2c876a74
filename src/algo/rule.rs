//! The rule types the algorithms decide by: which algorithm, the state layout behind it, and a
//! quota checked into integer nanoseconds ([`Rule`]). `crate::quota` builds rules from quotas;
//! nothing in `algo` imports it.

use super::Divisor;

/// Which algorithm enforces a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// GCRA, the token bucket in time arithmetic: `limit` per `period`, up to `burst` at once.
    #[default]
    TokenBucket,
    /// The leaky bucket as a meter: the same automaton as [`Algorithm::TokenBucket`] (the water
    /// level is the bucket's debt), kept as its own name because it is usually described so.
    LeakyBucket,
    /// At most `limit` per window, windows aligned to Unix time; up to 2x across a boundary.
    FixedWindow,
    /// The two-window estimate `prev * (1 - elapsed/period) + cur`, in integer arithmetic.
    SlidingWindowCounter,
    /// Exact: at most `limit` in any interval of length `period`; O(limit) memory per key.
    SlidingWindowLog,
}

impl Algorithm {
    /// Every algorithm, in the order this crate's docs introduce them.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ];

    /// The name used in configuration files and output.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::SlidingWindowLog => "sliding_window_log",
        }
    }

    /// Parses a configuration name, as [`name`](Self::name) writes it.
    ///
    /// ```
    /// use tollgate::Algorithm;
    /// assert_eq!(Algorithm::from_name("leaky_bucket"), Some(Algorithm::LeakyBucket));
    /// // GCRA is the automaton of both buckets: the name does not say which one is meant.
    /// assert_eq!(Algorithm::from_name("gcra"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Some(match name {
            "token_bucket" => Algorithm::TokenBucket,
            "leaky_bucket" => Algorithm::LeakyBucket,
            "fixed_window" => Algorithm::FixedWindow,
            "sliding_window_counter" => Algorithm::SlidingWindowCounter,
            "sliding_window_log" => Algorithm::SlidingWindowLog,
            _ => return None,
        })
    }

    /// The cell kind this algorithm runs on; two algorithms with the same kind share state layout.
    pub(crate) fn kind(self) -> Kind {
        match self {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => Kind::Gcra,
            Algorithm::FixedWindow => Kind::Fixed,
            Algorithm::SlidingWindowCounter => Kind::Sliding,
            Algorithm::SlidingWindowLog => Kind::Log,
        }
    }
}

/// The state layout behind an algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Gcra,
    Fixed,
    Sliding,
    Log,
}

/// A checked quota in integer nanoseconds: what the pure algorithms take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) algorithm: Algorithm,
    pub(crate) kind: Kind,
    /// Units per period.
    pub(crate) limit: u64,
    /// Period in ns.
    pub(crate) period: u64,
    /// The most units a key can hold at once: the burst (buckets) or the limit (windows).
    pub(crate) capacity: u64,
    /// GCRA emission interval `T = ceil(period / limit)`, ns; 0 for windows.
    pub(crate) emission: u64,
    /// Division by `emission` (by 1 for windows, which do not use it).
    pub(crate) per_emission: Divisor,
    /// GCRA tolerance `burst * T`, ns; 0 for windows.
    pub(crate) tolerance: u64,
    /// `unix_epoch_ns % period`: window `w` is `floor((now + phase) / period)`, aligned to Unix time.
    pub(crate) phase: u64,
}

impl Rule {
    /// The rule in words, as statistics label it: `token_bucket 100/1m burst 20`,
    /// `fixed_window 10/1s`.
    pub(crate) fn describe(&self) -> String {
        let mut out = format!(
            "{} {}/{}",
            self.algorithm.name(),
            self.limit,
            period_text(self.period)
        );
        if self.capacity != self.limit {
            out.push_str(&format!(" burst {}", self.capacity));
        }
        out
    }
}

/// A period in the largest whole unit: `1h`, `90s`, `250ms`, `7ns`.
fn period_text(ns: u64) -> String {
    const UNITS: [(u64, &str); 5] = [
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
    ];
    for (unit, name) in UNITS {
        if ns >= unit && ns % unit == 0 {
            return format!("{}{name}", ns / unit);
        }
    }
    format!("{ns}ns")
}
