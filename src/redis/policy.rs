//! What answers when Redis cannot: the [`FailurePolicy`], the one place its answer is worked
//! out ([`FailurePolicy::answer`], for both modes), and what a caller learns of who decided
//! ([`Source`], [`Checked`]) and how often ([`RedisStats`]).

use super::link::Breaker;
use crate::decision::{Decision, Reason};

/// What a limiter answers when Redis cannot.
///
/// | policy | while Redis is unreachable | use when |
/// |---|---|---|
/// | `Open` | every request passes | availability matters more than the limit |
/// | `Closed` (default) | every request is denied, `retry_after` = time to the next probe | the limit protects something fragile (logins, payments) |
/// | `LocalShare { nodes }` | exact mode: each process enforces `1/nodes` of every quota on its own; synced mode: each process's local cells go on deciding alone, with the whole quota (`nodes` unused) | a rough limit beats none and beats a full stop |
///
/// ```
/// use tollgate::redis::FailurePolicy;
/// let p = FailurePolicy::LocalShare { nodes: 4 };
/// assert_ne!(p, FailurePolicy::Closed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Let every request through.
    Open,
    /// Deny every request.
    #[default]
    Closed,
    /// Exact mode: enforce `limit / nodes` (and `burst / nodes`, at least 1) per process, in
    /// memory. Synced mode: the local cells go on deciding alone, each process with the whole
    /// quota from what it last knew (so up to `N` times it in all; `nodes` is not used).
    LocalShare {
        /// How many processes share the quota.
        nodes: u64,
    },
}

/// Who answered a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// Redis, exactly.
    Redis,
    /// The policy let it through: Redis could not answer.
    FailedOpen,
    /// The policy denied it: Redis could not answer.
    FailedClosed,
    /// The local share answered: Redis could not.
    LocalShare,
}

/// A decision and where it came from.
///
/// ```
/// use tollgate::redis::{Checked, Source};
/// fn header(c: &Checked) -> &'static str {
///     if c.source() == Source::Redis { "exact" } else { "degraded" }
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a Checked holds whether the request may pass"]
pub struct Checked {
    pub(super) decision: Decision,
    pub(super) source: Source,
    pub(super) server_time_ns: Option<u64>,
}

impl Checked {
    /// The decision.
    pub fn decision(&self) -> Decision {
        self.decision
    }
    /// Who made it.
    pub fn source(&self) -> Source {
        self.source
    }
    /// True when the failure policy answered instead of Redis.
    pub fn is_degraded(&self) -> bool {
        self.source != Source::Redis
    }
    /// The Redis server's Unix time (ns, microsecond resolution) the decision was made at;
    /// `None` when degraded.
    pub fn server_time_ns(&self) -> Option<u64> {
        self.server_time_ns
    }
}

/// Counters of a Redis-backed limiter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisStats {
    /// Decisions Redis made.
    pub exact: u64,
    /// Degraded decisions: let through by [`FailurePolicy::Open`].
    pub failed_open: u64,
    /// Degraded decisions: denied by [`FailurePolicy::Closed`].
    pub failed_closed: u64,
    /// Degraded decisions: made by the local share.
    pub local_share: u64,
    /// Calls that hit their deadline (outcome unknown; never replayed).
    pub timeouts: u64,
    /// Calls that failed with an error (connection refused or dropped, a server error).
    pub errors: u64,
    /// Calls answered by the policy without trying Redis because the breaker was open.
    pub short_circuited: u64,
    /// Times the breaker opened.
    pub breaker_opens: u64,
    /// Probes sent while the breaker was open.
    pub probes: u64,
    /// Scripts reloaded after NOSCRIPT (a flush, a restart, a failover).
    pub reloads: u64,
    /// Connections made.
    pub connects: u64,
    /// Calls waiting on Redis right now.
    pub in_flight: u64,
    /// Times the script's verdict and the in-process algorithm disagreed (a bug if non-zero).
    pub mismatches: u64,
}

impl RedisStats {
    /// All degraded decisions.
    pub fn degraded(&self) -> u64 {
        self.failed_open + self.failed_closed + self.local_share
    }
}

/// Where a mode counts its degraded decisions: exact mode one counter per [`Source`], synced
/// mode one for all.
pub(crate) trait CountsDegraded {
    /// Counts one degraded decision made by `source`.
    fn count(&self, source: Source);
}

/// The failure policy's answer to one call that Redis cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fallback {
    /// The policy decided (and counted it): `Open` admits, `Closed` denies until the breaker's
    /// next probe.
    Decided(Decision, Source),
    /// [`FailurePolicy::LocalShare`]: local state decides (exact mode's in-memory share, synced
    /// mode's local cells), not counted yet: whoever decides counts it, or not.
    Local,
}

impl FailurePolicy {
    /// The answer while Redis cannot give one, for a call whose decision reports `limit`, at
    /// `now` on the breaker's clock (`Closed` waits for the breaker's next probe: that is the
    /// denial's `retry_after` and `reset_after`). A decided answer is counted in `counts`.
    pub(crate) fn answer(
        self,
        limit: u64,
        breaker: &Breaker,
        now: u64,
        counts: &impl CountsDegraded,
    ) -> Fallback {
        let (decision, source) = match self {
            FailurePolicy::LocalShare { .. } => return Fallback::Local,
            // Admitted, with nothing known of what remains.
            FailurePolicy::Open => (
                Decision {
                    allowed: true,
                    reason: Reason::Within,
                    limit,
                    remaining: 0,
                    reset_after_ns: 0,
                    retry_after_ns: 0,
                    delay_ns: 0,
                },
                Source::FailedOpen,
            ),
            FailurePolicy::Closed => {
                let wait = breaker.wait_ns(now);
                let denied = Decision {
                    limit,
                    reset_after_ns: wait,
                    ..Decision::denied(Reason::Limited, wait)
                };
                (denied, Source::FailedClosed)
            }
        };
        counts.count(source);
        Fallback::Decided(decision, source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::link::BreakerConfig;
    use crate::sync::{AtomicU64, Ordering};

    #[derive(Default)]
    struct Tally(AtomicU64, AtomicU64);

    impl CountsDegraded for Tally {
        fn count(&self, source: Source) {
            let c = if source == Source::FailedOpen {
                &self.0
            } else {
                &self.1
            };
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn each_policy_answers_and_counts_what_it_decides() {
        let breaker = Breaker::new(BreakerConfig::DEFAULT);
        let tally = Tally::default();
        // A closed breaker: the wait is the first backoff.
        let Fallback::Decided(d, Source::FailedClosed) =
            FailurePolicy::Closed.answer(7, &breaker, 0, &tally)
        else {
            panic!("Closed decides");
        };
        assert!(!d.allowed);
        assert_eq!((d.limit, d.remaining), (7, 0));
        assert_eq!(d.retry_after_ns, BreakerConfig::DEFAULT.min_backoff_ns);
        assert_eq!(d.reset_after_ns, d.retry_after_ns);
        // An open breaker: the wait is what is left to the probe.
        for _ in 0..BreakerConfig::DEFAULT.threshold {
            let _ = breaker.failure(breaker.gate(1_000), 1_000);
        }
        assert!(breaker.is_open());
        let Fallback::Decided(d, _) = FailurePolicy::Closed.answer(7, &breaker, 2_000, &tally)
        else {
            panic!("Closed decides");
        };
        assert_eq!(
            d.retry_after_ns,
            BreakerConfig::DEFAULT.min_backoff_ns - 1_000
        );
        let Fallback::Decided(d, Source::FailedOpen) =
            FailurePolicy::Open.answer(7, &breaker, 2_000, &tally)
        else {
            panic!("Open decides");
        };
        assert!(d.allowed);
        assert_eq!((d.limit, d.remaining, d.retry_after_ns), (7, 0, 0));
        let local = FailurePolicy::LocalShare { nodes: 2 }.answer(7, &breaker, 2_000, &tally);
        assert_eq!(local, Fallback::Local);
        // Counted: one open, two closed, the local share not at all.
        assert_eq!(tally.0.load(Ordering::Relaxed), 1);
        assert_eq!(tally.1.load(Ordering::Relaxed), 2);
    }
}
