//! Pure decision functions, one module per algorithm, and the rule types they decide by
//! ([`rule`]).
//!
//! Each takes `(state, now, cost, rule)` and returns a [`Step`]: the decision and, when the
//! request is admitted, the next state. No atomics, no clock, no allocation: integer arithmetic
//! on nanoseconds, fuzzed and property-tested against reference models with no threads.
//!
//! Preconditions the limiter guarantees before calling: `cost <= rule.capacity - headroom`, and
//! `now < 2^63` (292 years of uptime), so every sum below fits a u64. A call's cost is at least
//! 1; cost 0 is the limiter's own report of what a state holds (`Decision::held`: `remaining`
//! and `reset_after` as they are, nothing charged).

pub(crate) mod fixed;
pub(crate) mod gcra;
pub(crate) mod log;
pub(crate) mod rule;
pub(crate) mod sliding;

pub use rule::Algorithm;
pub(crate) use rule::{Kind, Rule};

use crate::decision::Decision;

/// The outcome of a pure decision: what to answer, and what to store if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Step<S> {
    pub(crate) decision: Decision,
    /// `Some(state')` when admitted; `None` for a denial, which changes no state.
    pub(crate) next: Option<S>,
}

impl<S> Step<S> {
    #[inline(always)]
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

    #[inline(always)]
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

/// Division by a divisor fixed when a quota is compiled, as one multiplication and a shift: an
/// exact `x / d` for every `x < 2^63` (every numerator the algorithms divide by a GCRA
/// emission interval is at most a tolerance, at most 2^62). A `div` instruction was the single
/// largest cost of a denial.
///
/// With `l = ceil(log2 d)` and `m = ceil(2^(63+l) / d)`, `floor(x / d) = floor(m * x / 2^(63+l))`
/// for `0 <= x < 2^63` (Granlund and Montgomery, "Division by invariant integers using
/// multiplication", theorem 4.2 with N = 63: `2^(63+l) <= m*d < 2^(63+l) + d <= 2^(63+l) + 2^l`).
/// Since `d > 2^(l-1)`, `m < 2^64`: the multiplier fits a `u64`, the product a `u128`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Divisor {
    /// `ceil(2^(63+l) / d)`.
    magic: u64,
    /// `63 + l`.
    shift: u32,
}

impl Divisor {
    /// Numerators must be below this.
    pub(crate) const MAX_NUMERATOR: u64 = 1 << 63;

    /// The divisor `d` (at least 1, below 2^63).
    pub(crate) fn new(d: u64) -> Divisor {
        assert!(
            (1..Self::MAX_NUMERATOR).contains(&d),
            "divisor {d} out of range"
        );
        let l = u64::BITS - (d - 1).leading_zeros(); // ceil(log2 d); 0 for d = 1
        let shift = 63 + l;
        let magic = (1u128 << shift).div_ceil(u128::from(d));
        Divisor {
            magic: u64::try_from(magic).expect("the multiplier fits 64 bits (see the type's docs)"),
            shift,
        }
    }

    /// `x / d`, exactly, for `x < 2^63`.
    #[inline(always)]
    pub(crate) fn divide(self, x: u64) -> u64 {
        debug_assert!(x < Self::MAX_NUMERATOR);
        ((u128::from(x) * u128::from(self.magic)) >> self.shift) as u64
    }
}

/// `floor(a * b / d)` for `d >= 1`, saturating at `u64::MAX` where the quotient does not fit.
///
/// On x86-64 a quotient that fits (the high word of `a * b` below `d`) is one `div` of the
/// 128-bit product by `d`, where a `u128` division is a call into compiler-builtins (which ends
/// in the same instruction after a few tests): that call was a quarter of a sliding-window
/// denial's time.
#[inline(always)]
pub(crate) fn mul_div(a: u64, b: u64, d: u64) -> u64 {
    debug_assert!(d > 0);
    let product = u128::from(a) * u128::from(b);
    let high = (product >> 64) as u64;
    if high >= d {
        return u64::MAX;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let quotient: u64;
        // SAFETY: `div` divides rdx:rax by `d`; it faults only for a zero divisor or a quotient
        // above 64 bits, and `high < d` rules out both. It touches no memory and no stack.
        unsafe {
            std::arch::asm!(
                "div {d}",
                d = in(reg) d,
                inout("rax") product as u64 => quotient,
                inout("rdx") high => _,
                options(pure, nomem, nostack),
            );
        }
        quotient
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (product / u128::from(d)) as u64
    }
}

/// The window a moment falls in, and how far into it: `floor((now + phase) / period)`.
#[inline]
pub(crate) fn window_of(now: u64, phase: u64, period: u64) -> (u64, u64) {
    let aligned = now.saturating_add(phase);
    (aligned / period, aligned % period)
}

/// The end of the window `now` falls in. A window algorithm judges a state by that window
/// (which window the state counts, against `now`'s), whatever the moment in it, so a state that
/// is not fresh at `now` cannot be before this.
pub(crate) fn window_end(now: u64, rule: &Rule) -> u64 {
    let (_, into) = window_of(now, rule.phase, rule.period);
    now.saturating_add(rule.period - into)
}

#[cfg(test)]
mod tests {
    use super::{Divisor, mul_div};
    use proptest::prelude::*;

    /// `mul_div` against `u128` arithmetic, at the edges and at random.
    #[test]
    fn mul_div_is_exact_or_saturates() {
        let reference = |a: u64, b: u64, d: u64| {
            u64::try_from(u128::from(a) * u128::from(b) / u128::from(d)).unwrap_or(u64::MAX)
        };
        let edges = [
            0,
            1,
            2,
            3,
            7,
            1 << 22,
            (1 << 32) - 1,
            1 << 32,
            1 << 63,
            u64::MAX - 1,
            u64::MAX,
        ];
        for a in edges {
            for b in edges {
                for d in edges.iter().copied().filter(|&d| d > 0) {
                    assert_eq!(mul_div(a, b, d), reference(a, b, d), "{a} * {b} / {d}");
                }
            }
        }
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x >> (x % 64)
        };
        for _ in 0..100_000 {
            let (a, b, d) = (next(), next(), next().max(1));
            assert_eq!(mul_div(a, b, d), reference(a, b, d), "{a} * {b} / {d}");
        }
    }

    /// Divisors at the edges: 1, powers of two and their neighbours, the largest allowed.
    fn edge_divisors() -> Vec<u64> {
        let mut d = vec![1, 2, 3, 5, 7, 10, 1000, 1_000_000_007, (1 << 63) - 1];
        for k in 1..63 {
            d.extend([(1u64 << k) - 1, 1 << k, (1 << k) + 1]);
        }
        d
    }

    #[test]
    fn divides_exactly_at_the_edges() {
        let top = Divisor::MAX_NUMERATOR - 1;
        for d in edge_divisors() {
            let div = Divisor::new(d);
            let near = |q: u64| [q.saturating_mul(d).saturating_sub(1), q.saturating_mul(d)];
            let xs = [0, 1, d - 1, d, d + 1, top, top - 1, top - d % top]
                .into_iter()
                .chain(near(top / d))
                .chain(near(2))
                .filter(|&x| x <= top);
            for x in xs {
                assert_eq!(div.divide(x), x / d, "{x} / {d}");
            }
        }
    }

    proptest! {
        #[test]
        fn divides_exactly(d in 1u64..(1 << 63), x in 0u64..(1 << 63), small in 1u64..100_000) {
            prop_assert_eq!(Divisor::new(d).divide(x), x / d);
            prop_assert_eq!(Divisor::new(small).divide(x), x / small);
        }
    }
}
