//! The answer to a check: a value, never an error.

use std::time::Duration;

/// Why a [`Decision`] came out the way it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Within the quota; charged.
    Within,
    /// Over the quota; nothing charged.
    Limited,
    /// Over the quota, but the plan's strategy is soft: let through, flagged, nothing charged.
    SoftLimit,
    /// Over the quota (or a new key at a full table), but the limit is in shadow mode
    /// ([`Strategy::Shadow`](crate::Strategy::Shadow)): let through unmarked, nothing charged,
    /// counted as `shadow_passed`. The rest of the decision (`remaining`, `retry_after`) is what
    /// enforcing would have answered.
    Shadow,
    /// The key is serving a penalty set by [`Limiter::block`](crate::Limiter::block).
    Blocked,
    /// The key is new and the table is at `max_keys`: denied without being tracked.
    TableFull,
}

/// Whether a request may pass, and everything a response header needs, from one lookup.
///
/// ```
/// use tollgate::{FakeClock, Limiter, Quota};
/// let limiter = Limiter::<u64, _>::builder()
///     .quota(Quota::per_second(2))
///     .clock(FakeClock::new())
///     .build()
///     .unwrap();
/// let d = limiter.check(&7);
/// assert!(d.is_allowed());
/// assert_eq!((d.limit(), d.remaining()), (2, 1));
/// ```
#[must_use = "a Decision says whether the request may pass"]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    pub(crate) allowed: bool,
    pub(crate) reason: Reason,
    pub(crate) limit: u64,
    pub(crate) remaining: u64,
    pub(crate) reset_after_ns: u64,
    pub(crate) retry_after_ns: u64,
    pub(crate) delay_ns: u64,
}

impl Decision {
    /// True when the request may pass (after [`delay`](Self::delay), for a reservation).
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }
    /// Why.
    pub fn reason(&self) -> Reason {
        self.reason
    }
    /// The most units the key can hold at once: the burst for the bucket algorithms, the
    /// per-window limit for the window algorithms. For a compound limit, the binding part's.
    pub fn limit(&self) -> u64 {
        self.limit
    }
    /// Units the key may still spend right now, after this request.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }
    /// Time until the key is back to full (as if never used).
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_ns)
    }
    /// [`reset_after`](Self::reset_after) in nanoseconds.
    pub fn reset_after_ns(&self) -> u64 {
        self.reset_after_ns
    }
    /// When denied: the earliest moment the same request would pass. Zero when allowed.
    pub fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after_ns)
    }
    /// [`retry_after`](Self::retry_after) in nanoseconds.
    pub fn retry_after_ns(&self) -> u64 {
        self.retry_after_ns
    }
    /// For a reservation (the queue strategy): how long to wait before proceeding. Zero otherwise.
    pub fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_ns)
    }
    /// [`delay`](Self::delay) in nanoseconds.
    pub fn delay_ns(&self) -> u64 {
        self.delay_ns
    }

    pub(crate) fn denied(reason: Reason, retry_after_ns: u64) -> Self {
        Decision {
            allowed: false,
            reason,
            limit: 0,
            remaining: 0,
            reset_after_ns: 0,
            retry_after_ns,
            delay_ns: 0,
        }
    }

    /// What [`merge`](Self::merge) starts from: merging a part's decision into it gives that
    /// decision (allowed, `Within`, no remaining or limit smaller, nothing later).
    pub(crate) const NEUTRAL: Decision = Decision {
        allowed: true,
        reason: Reason::Within,
        limit: u64::MAX,
        remaining: u64::MAX,
        reset_after_ns: 0,
        retry_after_ns: 0,
        delay_ns: 0,
    };

    /// A part's state reported as it holds, for a part charged and then refunded: what a
    /// decision of cost 0 says of the state (`remaining`, `reset_after` as they are), admitted,
    /// with no wait.
    #[inline]
    pub(crate) fn held(self) -> Decision {
        Decision {
            allowed: true,
            reason: Reason::Within,
            retry_after_ns: 0,
            delay_ns: 0,
            ..self
        }
    }

    /// Folds another part of a compound limit into this one: allowed only if both are, the
    /// smaller `remaining` (and its `limit`), the later reset, the later retry.
    #[inline]
    pub(crate) fn merge(&mut self, other: &Decision) {
        if other.remaining < self.remaining
            || (other.remaining == self.remaining && other.limit < self.limit)
        {
            self.remaining = other.remaining;
            self.limit = other.limit;
        }
        if !other.allowed && self.allowed {
            self.allowed = false;
            self.reason = other.reason;
        }
        self.reset_after_ns = self.reset_after_ns.max(other.reset_after_ns);
        self.retry_after_ns = self.retry_after_ns.max(other.retry_after_ns);
        self.delay_ns = self.delay_ns.max(other.delay_ns);
    }
}
