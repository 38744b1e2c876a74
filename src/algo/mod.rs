//! Pure decision functions, one module per algorithm.
//!
//! Each takes `(state, now, cost, rule)` and returns a [`Step`]: the decision and, when the
//! request is admitted, the next state. No atomics, no clock, no allocation: integer arithmetic
//! on nanoseconds, fuzzed and property-tested against reference models with no threads.
//!
//! Preconditions the limiter guarantees before calling: `1 <= cost <= rule.capacity - headroom`,
//! and `now < 2^63` (292 years of uptime), so every sum below fits a u64.

pub(crate) mod fixed;
pub(crate) mod gcra;
pub(crate) mod log;
pub(crate) mod sliding;

use crate::decision::Decision;

/// The outcome of a pure decision: what to answer, and what to store if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step<S> {
    pub(crate) decision: Decision,
    /// `Some(state')` when admitted; `None` for a denial, which changes no state.
    pub(crate) next: Option<S>,
}

impl<S> Step<S> {
    pub(crate) fn allow(
        next: S,
        limit: u64,
        remaining: u64,
        reset_after_ns: u64,
        delay_ns: u64,
    ) -> Self {
        Step {
            decision: Decision {
                allowed: true,
                reason: crate::decision::Reason::Within,
                limit,
                remaining,
                reset_after_ns,
                retry_after_ns: 0,
                delay_ns,
            },
            next: Some(next),
        }
    }

    pub(crate) fn deny(
        limit: u64,
        remaining: u64,
        reset_after_ns: u64,
        retry_after_ns: u64,
    ) -> Self {
        Step {
            decision: Decision {
                allowed: false,
                reason: crate::decision::Reason::Limited,
                limit,
                remaining,
                reset_after_ns,
                retry_after_ns,
                delay_ns: 0,
            },
            next: None,
        }
    }
}

/// The window a moment falls in, and how far into it: `floor((now + phase) / period)`.
#[inline]
pub(crate) fn window_of(now: u64, phase: u64, period: u64) -> (u64, u64) {
    let aligned = now.saturating_add(phase);
    (aligned / period, aligned % period)
}
