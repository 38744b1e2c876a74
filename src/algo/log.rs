//! Sliding window log: exact. At most `limit` units are admitted in any interval of length
//! `period`: a unit admitted at `s` counts against every moment `t` with `t - s < period`.
//!
//! Memory is O(limit) per key: one `(timestamp, cost)` entry (16 bytes) per admitted request
//! still inside the window, so at most `limit` entries. The limit is capped at [`MAX_LIMIT`]
//! (1 MiB per key in the worst case); a larger one is a construction error.
//!
//! Timestamps are recorded as `max(now, newest)`, so the log stays sorted even when the clock
//! steps back (an entry then expires a little later: stricter, never looser).

use std::collections::VecDeque;

use super::{Rule, Step};

/// The largest limit a sliding window log accepts.
pub(crate) const MAX_LIMIT: u64 = 1 << 16;

/// Admitted requests still inside the window, oldest first.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Log {
    entries: VecDeque<(u64, u64)>,
    /// Sum of the costs in `entries`.
    total: u64,
}

impl Log {
    /// Drops the entries that no longer count at `now`.
    pub(crate) fn expire(&mut self, now: u64, period: u64) {
        while let Some(&(ts, cost)) = self.entries.front() {
            if now.saturating_sub(ts) < period {
                break;
            }
            self.entries.pop_front();
            self.total -= cost;
        }
    }

    /// Records an admitted request (after [`decide`] allowed it at `now`).
    pub(crate) fn push(&mut self, now: u64, cost: u64) -> u64 {
        let ts = self.entries.back().map_or(now, |&(last, _)| last.max(now));
        self.entries.push_back((ts, cost));
        self.total += cost;
        ts
    }

    /// Takes back a charge of `cost` recorded at `ts`, if it is still in the log.
    pub(crate) fn refund(&mut self, ts: u64, cost: u64) {
        if let Some(i) = self
            .entries
            .iter()
            .rposition(|&(t, c)| t == ts && c == cost)
        {
            self.entries.remove(i);
            self.total -= cost;
        }
    }

    /// True when nothing in the log counts at `now`.
    pub(crate) fn is_fresh(&self, now: u64, period: u64) -> bool {
        self.entries
            .back()
            .is_none_or(|&(ts, _)| now.saturating_sub(ts) >= period)
    }

    /// The first moment from `now` on at which nothing in the log counts: a period after its
    /// latest entry.
    pub(crate) fn fresh_from(&self, now: u64, period: u64) -> u64 {
        self.entries
            .back()
            .map_or(now, |&(ts, _)| ts.saturating_add(period).max(now))
    }

    /// Entries held (for memory accounting).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Decides a cost-`cost` request at `now` against `log` (expired entries are ignored, so the
/// caller may or may not have expired them first).
pub(crate) fn decide(log: &Log, now: u64, cost: u64, rule: &Rule, headroom: u64) -> Step<()> {
    let p = rule.period;
    let live = |&&(ts, _): &&(u64, u64)| now.saturating_sub(ts) < p;
    let expired: u64 = log
        .entries
        .iter()
        .take_while(|e| !live(e))
        .map(|&(_, c)| c)
        .sum();
    let used = log.total - expired;
    let cap = rule.limit - headroom;
    let reset = log
        .entries
        .back()
        .map_or(0, |&(ts, _)| ts.saturating_add(p).saturating_sub(now));
    if used + cost <= cap {
        // A charge adds an entry now, which leaves the window a period from now; a report of
        // cost 0 adds none.
        let reset = if cost > 0 { reset.max(p) } else { reset };
        return Step::allow((), rule.limit, cap - used - cost, reset, 0);
    }
    // Wait until enough of the oldest live units have left the window.
    let need = used + cost - cap;
    let mut freed = 0;
    let mut retry = 0;
    for &(ts, c) in log.entries.iter().filter(live) {
        freed += c;
        if freed >= need {
            retry = ts.saturating_add(p).saturating_sub(now);
            break;
        }
    }
    Step::deny(rule.limit, cap.saturating_sub(used), reset, retry)
}
