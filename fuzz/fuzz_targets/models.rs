//! Single-threaded reference models of one key, written from the seeds' pseudocode and the
//! README's guarantees, in exact integer nanoseconds, without looking at how the library computes
//! anything: the token bucket keeps tokens (not a theoretical arrival time), windows keep
//! absolute Unix window numbers (not packed, wrapping ids), the sliding counter finds
//! `retry_after` by searching time, the log is a plain list.
//!
//! Time may go back (the fake clock is moved back by the fuzzer). What the README promises then,
//! and what these models do:
//! - token bucket: tokens are a function of time, `min(cap, tokens + (t - last))`, for any `t`;
//! - fixed window: a count is never moved to an earlier window: a window later than now keeps
//!   counting, and times are measured to its end (up to 2^20 windows back; further is fresh);
//! - sliding counter: a later stored window is judged as at its start, and times are measured
//!   from now (up to 2^12 windows back; further is fresh);
//! - log: an entry is stamped `max(now, newest)`, so the log stays sorted, and an entry counts
//!   at `t` iff `t - stamp < period` (entries stamped after `t` count).

use std::time::Duration;

use tollgate::{Algorithm, Quota};

/// A quota as the models see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    pub alg: Algorithm,
    pub limit: u64,
    pub period: u64,
    pub burst: u64,
}

impl Params {
    pub fn quota(&self) -> Quota {
        Quota::new(self.limit, Duration::from_nanos(self.period))
            .burst(self.burst)
            .algorithm(self.alg)
    }
    fn bucket(&self) -> bool {
        matches!(self.alg, Algorithm::TokenBucket | Algorithm::LeakyBucket)
    }
    /// The most units a key can hold: the burst for buckets, the limit for windows.
    pub fn capacity(&self) -> u64 {
        if self.bucket() {
            self.burst
        } else {
            self.limit
        }
    }
    /// The emission interval of a bucket, rounded up (never faster than the quota).
    fn t(&self) -> i128 {
        i128::from(self.period.div_ceil(self.limit))
    }
    /// True when a key's state under `self` can be carried to `other` (same state layout).
    fn same_layout(&self, other: &Params) -> bool {
        self.bucket() == other.bucket() && (self.bucket() || self.alg == other.alg)
    }
    /// Two quotas the limiter treats as the same rules (for windows the burst means nothing).
    pub fn same_rules(&self, other: &Params) -> bool {
        self.alg == other.alg
            && self.limit == other.limit
            && self.period == other.period
            && self.capacity() == other.capacity()
    }
}

/// One decision, every field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    pub allowed: bool,
    pub limit: u64,
    pub remaining: u64,
    pub reset_after_ns: u64,
    pub retry_after_ns: u64,
    pub delay_ns: u64,
}

fn allow(limit: u64, remaining: u64, reset: u64, delay: u64) -> Want {
    Want {
        allowed: true,
        limit,
        remaining,
        reset_after_ns: reset,
        retry_after_ns: 0,
        delay_ns: delay,
    }
}

fn deny(limit: u64, remaining: u64, reset: u64, retry: u64) -> Want {
    Want {
        allowed: false,
        limit,
        remaining,
        reset_after_ns: reset,
        retry_after_ns: retry,
        delay_ns: 0,
    }
}

fn ns(v: i128) -> u64 {
    u64::try_from(v).expect("a model time fits u64")
}

/// How far back (in windows) a later stored window is still believed (see the module docs).
const FIXED_MAX_AHEAD: u64 = 1 << 20;
const SLIDING_MAX_AHEAD: u64 = 1 << 12;

/// A key's state.
#[derive(Debug, Clone)]
pub enum State {
    /// Tokens in ns of refill (one token = T ns) as of `last`.
    Tokens { tokens: i128, last: u64 },
    /// The count of absolute Unix window `window`.
    Fixed { window: u64, count: u64 },
    /// `cur` counts absolute window `window`, `prev` the one before.
    Sliding { window: u64, prev: u64, cur: u64 },
    /// `(stamp, cost)`, oldest first.
    Log(Vec<(u64, u64)>),
}

/// One key: its quota and state.
#[derive(Debug, Clone)]
pub struct Key {
    pub params: Params,
    /// Which installed rules the state was built for (see `Model::install`).
    pub rules_id: u64,
    pub state: State,
    /// The fake clock's Unix epoch in ns (windows are `floor((epoch + now) / period)`).
    epoch: u64,
}

/// What a call asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Check,
    Peek,
    Reserve(u64),
}

impl Key {
    pub fn fresh(params: Params, rules_id: u64, epoch: u64) -> Key {
        let state = if params.bucket() {
            // Full at every time: TAT 0.
            State::Tokens {
                tokens: i128::from(params.burst) * params.t(),
                last: 0,
            }
        } else {
            match params.alg {
                Algorithm::FixedWindow => State::Fixed {
                    window: 0,
                    count: 0,
                },
                Algorithm::SlidingWindowCounter => State::Sliding {
                    window: 0,
                    prev: 0,
                    cur: 0,
                },
                _ => State::Log(Vec::new()),
            }
        };
        Key {
            params,
            rules_id,
            state,
            epoch,
        }
    }

    fn unix(&self, now: u64) -> u64 {
        self.epoch + now
    }

    /// Fixed window: `(window, count, ns until that window ends)` at `now`.
    fn fixed_view(&self, window: u64, count: u64, now: u64) -> (u64, u64, u64) {
        let p = self.params.period;
        let unix = self.unix(now);
        let w = unix / p;
        if window == w || (window > w && window - w <= FIXED_MAX_AHEAD) {
            (window, count, (window + 1) * p - unix)
        } else {
            (w, 0, (w + 1) * p - unix)
        }
    }

    /// Sliding counter: `(window, prev, cur, elapsed, lead)`: the counters as of the moment
    /// `lead` ns after now (the start of a later stored window), `elapsed` into it.
    fn sliding_view(
        &self,
        window: u64,
        prev: u64,
        cur: u64,
        now: u64,
    ) -> (u64, u64, u64, u64, u64) {
        let p = self.params.period;
        let unix = self.unix(now);
        let (w, e) = (unix / p, unix % p);
        if window == w {
            (w, prev, cur, e, 0)
        } else if window + 1 == w {
            (w, cur, 0, e, 0)
        } else if window > w && window - w <= SLIDING_MAX_AHEAD {
            (window, prev, cur, 0, window * p - unix)
        } else {
            (w, 0, 0, e, 0)
        }
    }

    fn sliding_passes(&self, prev: u64, cur: u64, e: u64, n: u64) -> bool {
        let p = u128::from(self.params.period);
        u128::from(prev) * (p - u128::from(e)) + u128::from(cur + n) * p
            <= u128::from(self.params.limit) * p
    }

    /// Applies a call at `now`; `None` never (the limiter checks costs before).
    pub fn call(&mut self, now: u64, n: u64, call: Call) -> Want {
        let params = self.params;
        let cap = params.capacity();
        match self.state.clone() {
            State::Tokens { tokens, last } => {
                let t = params.t();
                let cap_ns = i128::from(params.burst) * t;
                let units = |v: i128| ns(v.max(0) / t);
                let cur = (tokens + i128::from(now) - i128::from(last)).min(cap_ns);
                let need = i128::from(n) * t;
                match call {
                    Call::Reserve(max_delay) => {
                        let delay = (need - cur).max(0);
                        if delay <= i128::from(max_delay) {
                            let left = cur - need;
                            self.state = State::Tokens {
                                tokens: left,
                                last: now,
                            };
                            allow(cap, units(left + delay), ns(cap_ns - left), ns(delay))
                        } else {
                            deny(
                                cap,
                                units(cur),
                                ns(cap_ns - cur),
                                ns(delay - i128::from(max_delay)),
                            )
                        }
                    }
                    _ => {
                        if cur >= need {
                            let left = cur - need;
                            if call == Call::Check {
                                self.state = State::Tokens {
                                    tokens: left,
                                    last: now,
                                };
                            }
                            allow(cap, units(left), ns(cap_ns - left), 0)
                        } else {
                            deny(cap, units(cur), ns(cap_ns - cur), ns(need - cur))
                        }
                    }
                }
            }
            State::Fixed { window, count } => {
                let (w, count, left) = self.fixed_view(window, count, now);
                if count + n <= cap {
                    if call != Call::Peek {
                        self.state = State::Fixed {
                            window: w,
                            count: count + n,
                        };
                    }
                    allow(cap, cap - count - n, left, 0)
                } else {
                    let reset = if count == 0 { 0 } else { left };
                    deny(cap, cap.saturating_sub(count), reset, left)
                }
            }
            State::Sliding { window, prev, cur } => {
                let p = params.period;
                let (w, prev, cur, e, lead) = self.sliding_view(window, prev, cur, now);
                let pc = u128::from(p);
                let capw = u128::from(cap) * pc;
                let est = u128::from(prev) * (pc - u128::from(e)) + u128::from(cur) * pc;
                let reset = |prev: u64, cur: u64| {
                    lead + if cur > 0 {
                        (p - e) + p
                    } else if prev > 0 {
                        p - e
                    } else {
                        0
                    }
                };
                if self.sliding_passes(prev, cur, e, n) {
                    if call != Call::Peek {
                        self.state = State::Sliding {
                            window: w,
                            prev,
                            cur: cur + n,
                        };
                    }
                    let remaining = (capw - est - u128::from(n) * pc) / pc;
                    allow(cap, remaining as u64, reset(prev, cur + n), 0)
                } else {
                    // The estimate never grows while nothing is admitted: binary search for the
                    // first moment (after the one the view describes) at which the request
                    // passes. Within three periods both counters have rolled out.
                    let at = |d: u64| {
                        let t = w * p + e + d;
                        let (tw, te) = (t / p, t % p);
                        let (tp, tc) = match tw - w {
                            0 => (prev, cur),
                            1 => (cur, 0),
                            _ => (0, 0),
                        };
                        self.sliding_passes(tp, tc, te, n)
                    };
                    let (mut lo, mut hi) = (0u64, 3 * p);
                    assert!(at(hi));
                    while hi - lo > 1 {
                        let mid = lo + (hi - lo) / 2;
                        if at(mid) {
                            hi = mid;
                        } else {
                            lo = mid;
                        }
                    }
                    let remaining = capw.saturating_sub(est) / pc;
                    deny(cap, remaining as u64, reset(prev, cur), lead + hi)
                }
            }
            State::Log(mut entries) => {
                let p = params.period;
                let live = |ts: u64| now.saturating_sub(ts) < p;
                if call != Call::Peek {
                    entries.retain(|&(ts, _)| live(ts));
                }
                let used: u64 = entries.iter().filter(|e| live(e.0)).map(|e| e.1).sum();
                let newest = entries.last().map(|e| e.0);
                let result = if used + n <= cap {
                    let stamp = newest.map_or(now, |s| s.max(now));
                    if call != Call::Peek {
                        entries.push((stamp, n));
                    }
                    allow(cap, cap - used - n, stamp + p - now, 0)
                } else {
                    let reset = newest.map_or(0, |s| (s + p).saturating_sub(now));
                    let mut still = used;
                    let mut retry = 0;
                    for &(ts, c) in entries.iter().filter(|e| live(e.0)) {
                        still -= c;
                        if still + n <= cap {
                            retry = (ts + p).saturating_sub(now);
                            break;
                        }
                    }
                    deny(cap, cap.saturating_sub(used), reset, retry)
                };
                self.state = State::Log(entries);
                result
            }
        }
    }

    /// True when the key is indistinguishable from one never seen at `t`.
    pub fn is_fresh(&self, t: u64) -> bool {
        match &self.state {
            State::Tokens { tokens, last } => {
                let cap_ns = i128::from(self.params.burst) * self.params.t();
                tokens + i128::from(t) - i128::from(*last) >= cap_ns
            }
            State::Fixed { window, count } => self.fixed_view(*window, *count, t).1 == 0,
            State::Sliding { window, prev, cur } => {
                let (_, prev, cur, _, _) = self.sliding_view(*window, *prev, *cur, t);
                prev == 0 && cur == 0
            }
            State::Log(entries) => entries
                .last()
                .is_none_or(|&(ts, _)| t.saturating_sub(ts) >= self.params.period),
        }
    }

    /// Carries the key to `new` (installed as `rules_id`) at `now`, as the README says: a bucket
    /// keeps its debt in units, re-measured in the new emission interval and capped at the new
    /// burst; windows keep their counts (the same windows: as they are; other windows: what
    /// was used now, as the new current window's count); a log keeps its entries; another
    /// state layout starts fresh.
    pub fn migrate(&mut self, now: u64, new: Params, rules_id: u64) {
        let old = self.params;
        let mut next = Key::fresh(new, rules_id, self.epoch);
        if old.same_layout(&new) {
            let unix = self.unix(now);
            next.state = match self.state.clone() {
                State::Tokens { tokens, last } => {
                    let (t_old, t_new) = (old.t(), new.t());
                    let cap_old = i128::from(old.burst) * t_old;
                    let cur = (tokens + i128::from(now) - i128::from(last)).min(cap_old);
                    let debt = cap_old - cur;
                    if debt <= 0 {
                        next.state
                    } else {
                        let cap_new = i128::from(new.burst) * t_new;
                        let debt = (debt * t_new / t_old).min(cap_new);
                        State::Tokens {
                            tokens: cap_new - debt,
                            last: now,
                        }
                    }
                }
                State::Fixed { window, count } => {
                    if old.period == new.period {
                        State::Fixed { window, count }
                    } else {
                        let (_, count, _) = self.fixed_view(window, count, now);
                        State::Fixed {
                            window: unix / new.period,
                            count: count.min(u64::from(u32::MAX)),
                        }
                    }
                }
                State::Sliding { window, prev, cur } => {
                    if old.period == new.period {
                        State::Sliding { window, prev, cur }
                    } else {
                        let (_, prev, cur, e, _) = self.sliding_view(window, prev, cur, now);
                        let p = u128::from(old.period);
                        let est =
                            (u128::from(prev) * (p - u128::from(e))).div_ceil(p) + u128::from(cur);
                        State::Sliding {
                            window: unix / new.period,
                            prev: 0,
                            cur: (est as u64).min((1 << 22) - 1),
                        }
                    }
                }
                State::Log(mut entries) => {
                    entries.retain(|&(ts, _)| now.saturating_sub(ts) < new.period);
                    State::Log(entries)
                }
            };
        }
        *self = next;
    }
}
