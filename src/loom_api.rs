//! Internals exposed to the `loom-tests` crate only (under `--cfg tollgate_loom`): one cell and
//! its rule, driven through the same code paths as the limiter's cells (`cell::update` and
//! its `cell::swap_loop`, `Cell::apply`, `Cell::refund`, `Cell::is_fresh`). The flat store's
//! inline path (`cell::apply_inline` on the same loop) is modelled through the public API in
//! `loom-tests/tests/store.rs`.

use crate::algo::Rule;
use crate::cell::{Cell, Mode};
use crate::quota::Quota;

/// A cell and the rule it runs under.
pub struct ModelCell {
    cell: Cell,
    rule: Rule,
}

/// What one model call returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Admitted.
    pub allowed: bool,
    /// Refund token when charged.
    pub token: Option<u64>,
    /// Lost compare-and-swap races.
    pub retries: u32,
}

impl ModelCell {
    /// A fresh cell for `quota` (windows aligned to a Unix epoch of 0).
    pub fn new(quota: Quota) -> Self {
        let rule = quota.compile(0).expect("valid model quota");
        ModelCell {
            cell: Cell::fresh(rule.kind),
            rule,
        }
    }
    /// Checks `cost` at `now`.
    pub fn check(&self, now: u64, cost: u64) -> Outcome {
        let a = self.cell.apply(now, cost, &self.rule, 0, Mode::Check);
        Outcome {
            allowed: a.decision.allowed,
            token: a.token,
            retries: a.retries,
        }
    }
    /// Peeks `cost` at `now`.
    pub fn peek(&self, now: u64, cost: u64) -> bool {
        self.cell
            .apply(now, cost, &self.rule, 0, Mode::Peek)
            .decision
            .allowed
    }
    /// Refunds a charge.
    pub fn refund(&self, cost: u64, token: u64, now: u64) {
        self.cell.refund(cost, &self.rule, token, now);
    }
    /// Reserves `cost` at `now`, at most `max_delay` ns ahead (the queue).
    pub fn reserve(&self, now: u64, cost: u64, max_delay: u64) -> Outcome {
        let a = self
            .cell
            .apply(now, cost, &self.rule, 0, Mode::Reserve(max_delay));
        Outcome {
            allowed: a.decision.allowed,
            token: a.token,
            retries: a.retries,
        }
    }
    /// The raw packed word of a word cell (`None` for a log), read with `Acquire` like a check.
    pub fn state(&self) -> Option<u64> {
        match &self.cell {
            // Acquire: as in `cell::update`.
            Cell::Word(w) => Some(w.load(crate::sync::Ordering::Acquire)),
            Cell::Log(_) => None,
        }
    }
    /// True when the cell is fresh at `now`.
    pub fn is_fresh(&self, now: u64) -> bool {
        self.cell.is_fresh(now, &self.rule)
    }
}
