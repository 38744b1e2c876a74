//! The pure algorithms, exposed to the `decide` fuzz target only (built under `--cfg fuzzing`,
//! which cargo-fuzz sets): raw states, times, costs and rules straight into `algo/*`, with none
//! of the limiter's checks in front.

use crate::algo::{self, Kind, Rule, Step, log::Log};
use crate::decision::Decision;
use crate::error::Error;
use crate::quota::Quota;

/// A compiled quota: the integer rule the algorithms run on.
#[derive(Debug, Clone, Copy)]
pub struct FuzzRule(Rule);

/// What a pure decision returned: the decision, and the next state when admitted.
pub type Outcome = (Decision, Option<u64>);

fn word(step: Step<u64>) -> Outcome {
    (step.decision, step.next)
}

impl FuzzRule {
    /// Compiles `quota` as a limiter would (every configuration error is an `Err`).
    pub fn new(quota: Quota, unix_epoch_ns: u64) -> Result<FuzzRule, Error> {
        quota.compile(unix_epoch_ns).map(FuzzRule)
    }
    /// The most units a key can hold: the burst for buckets, the limit for windows.
    pub fn capacity(&self) -> u64 {
        self.0.capacity
    }
    /// True for the sliding window log (not a packed word).
    pub fn is_log(&self) -> bool {
        self.0.kind == Kind::Log
    }
    /// GCRA emission interval and tolerance (0 for windows).
    pub fn emission_tolerance(&self) -> (u64, u64) {
        (self.0.emission, self.0.tolerance)
    }
    /// The period in ns.
    pub fn period(&self) -> u64 {
        self.0.period
    }
    /// True when both rules have the same cell layout.
    pub fn same_kind(&self, other: &FuzzRule) -> bool {
        self.0.kind == other.0.kind
    }
    /// Decides a cost-`cost` check on a word state.
    pub fn decide(&self, state: u64, now: u64, cost: u64, headroom: u64) -> Outcome {
        match self.0.kind {
            Kind::Gcra => word(algo::gcra::decide(state, now, cost, &self.0, headroom)),
            Kind::Fixed => word(algo::fixed::decide(state, now, cost, &self.0, headroom)),
            Kind::Sliding => word(algo::sliding::decide(state, now, cost, &self.0, headroom)),
            Kind::Log => panic!("a log rule has no word state"),
        }
    }
    /// The queue: a GCRA reservation at most `max_delay` ahead.
    pub fn reserve(
        &self,
        state: u64,
        now: u64,
        cost: u64,
        max_delay: u64,
        headroom: u64,
    ) -> Outcome {
        word(algo::gcra::reserve(
            state, now, cost, &self.0, max_delay, headroom,
        ))
    }
    /// True when a word state is indistinguishable from fresh at `now`.
    pub fn is_fresh(&self, state: u64, now: u64) -> bool {
        match self.0.kind {
            Kind::Gcra => algo::gcra::is_fresh(state, now),
            Kind::Fixed => algo::fixed::is_fresh(state, now, &self.0),
            Kind::Sliding => algo::sliding::is_fresh(state, now, &self.0),
            Kind::Log => true,
        }
    }
    /// The refund token of an admitted word state (what `Cell::apply` hands out).
    pub fn token(&self, written: u64) -> u64 {
        match self.0.kind {
            Kind::Fixed => algo::fixed::token(written),
            Kind::Sliding => algo::sliding::token(written),
            _ => written,
        }
    }
    /// Takes back a charge of `cost` whose token is `token`.
    pub fn refund(&self, state: u64, cost: u64, token: u64, now: u64) -> u64 {
        match self.0.kind {
            Kind::Gcra => algo::gcra::refund(state, cost, &self.0, token, now),
            Kind::Fixed => algo::fixed::refund(state, cost, token),
            Kind::Sliding => algo::sliding::refund(state, cost, token),
            Kind::Log => state,
        }
    }
    /// Carries a word state from this rule to `new` at `now` (same kind only).
    pub fn migrate(&self, state: u64, now: u64, new: &FuzzRule) -> u64 {
        match new.0.kind {
            Kind::Gcra => algo::gcra::migrate(state, now, &self.0, &new.0),
            Kind::Fixed => algo::fixed::migrate(state, now, &self.0, &new.0),
            Kind::Sliding => algo::sliding::migrate(state, now, &self.0, &new.0),
            Kind::Log => 0,
        }
    }
    /// Decides a cost-`cost` check on a log.
    pub fn decide_log(&self, log: &FuzzLog, now: u64, cost: u64, headroom: u64) -> Decision {
        algo::log::decide(&log.0, now, cost, &self.0, headroom).decision
    }
}

/// A sliding window log.
#[derive(Debug, Default, Clone)]
pub struct FuzzLog(Log);

impl FuzzLog {
    /// Drops entries that no longer count at `now`.
    pub fn expire(&mut self, now: u64, period: u64) {
        self.0.expire(now, period);
    }
    /// Records an admitted request; returns its timestamp (the refund token).
    pub fn push(&mut self, now: u64, cost: u64) -> u64 {
        self.0.push(now, cost)
    }
    /// Takes back a charge.
    pub fn refund(&mut self, ts: u64, cost: u64) {
        self.0.refund(ts, cost);
    }
    /// True when nothing counts at `now`.
    pub fn is_fresh(&self, now: u64, period: u64) -> bool {
        self.0.is_fresh(now, period)
    }
    /// Entries held.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// True when the log holds no entry.
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
}
