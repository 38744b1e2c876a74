//! Differential: arbitrary sequences of check / check_n / peek / reserve / reset / sweep /
//! clock forward / clock back / reconfigure on a limiter with a `FakeClock`, and the same calls on
//! the reference models (`models.rs`). Every decision must be identical, field by field (allowed,
//! limit, remaining, reset_after, retry_after, delay, reason), and so must every error, every
//! `reset` answer, every sweep's count and the number of keys tracked.
#![no_main]
use std::collections::BTreeMap;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tollgate::{
    Algorithm, Clock, Decision, Error, FAKE_UNIX_EPOCH_S, FakeClock, Limiter, Plan, Reason,
};

mod models;
use models::{Call, Key, Params, Want};

const MS: u64 = 1_000_000;
/// Periods in ns, from sub-microsecond windows to a minute, some not dividing a second.
const PERIODS: [u64; 7] = [
    999,
    MS,
    7 * MS + 1,
    250 * MS,
    1_000 * MS,
    1_500 * MS,
    60_000 * MS,
];
/// Whether a peek at a key built for older rules carries the key over for good (this branch's
/// limiter) or only judges a private carried-over copy (the flat-store limiter on main): flip it
/// when the engine changes.
const PEEK_MIGRATES: bool = false;
/// Units of a clock move in ns.
const STEPS: [u64; 4] = [1, 1_000, MS, 10 * MS];

fn params(alg_byte: u8, limit_byte: u8, period_byte: u8, burst_byte: u8) -> Params {
    let alg = Algorithm::ALL[usize::from(alg_byte) % Algorithm::ALL.len()];
    let mut period = PERIODS[usize::from(period_byte) % PERIODS.len()];
    if alg == Algorithm::SlidingWindowCounter && period < MS {
        // Window ids wrap at 2^20 in the sliding counter: a key idle for ~2^20 windows (1 s at
        // 999 ns) would see an old count again, stricter by design (README: window id wrap).
        period = MS;
    }
    Params {
        alg,
        limit: u64::from(limit_byte % 8) + 1,
        period,
        burst: u64::from(burst_byte % 8) + 1,
    }
}

fn got(d: &Decision) -> Want {
    Want {
        allowed: d.is_allowed(),
        limit: d.limit(),
        remaining: d.remaining(),
        reset_after_ns: d.reset_after_ns(),
        retry_after_ns: d.retry_after_ns(),
        delay_ns: d.delay_ns(),
    }
}

/// The reference side: every key's model, the installed rules and the sweep grace.
struct Reference {
    keys: BTreeMap<u8, Key>,
    params: Params,
    rules_id: u64,
    epoch: u64,
    grace: u64,
}

impl Reference {
    /// A call on `key` at `now`: an existing key built for other rules is carried over first
    /// (a peek judges a carried-over copy); a new key is tracked by every call but a peek.
    fn call(&mut self, key: u8, now: u64, n: u64, call: Call) -> Result<Want, Error> {
        let cap = self.params.capacity();
        if n == 0 {
            return Err(Error::ZeroCost);
        }
        if n > cap {
            return Err(Error::CostExceedsCapacity {
                cost: n,
                capacity: cap,
            });
        }
        let (params, id, epoch) = (self.params, self.rules_id, self.epoch);
        if let Some(k) = self.keys.get_mut(&key) {
            // State belongs to (key, rule): a key whose state was built for rules equal to the
            // installed ones (a plan changed away and back) keeps it as it is.
            if !k.params.same_rules(&params) {
                if call == Call::Peek && !PEEK_MIGRATES {
                    let mut copy = k.clone();
                    copy.migrate(now, params, id);
                    return Ok(copy.call(now, n, call));
                }
                k.migrate(now, params, id);
            }
            return Ok(k.call(now, n, call));
        }
        let mut k = Key::fresh(params, id, epoch);
        let want = k.call(now, n, call);
        if call != Call::Peek {
            self.keys.insert(key, k);
        }
        Ok(want)
    }
}

fn same(step: usize, what: &str, d: Result<Decision, Error>, want: Result<Want, Error>) {
    match (d, want) {
        (Ok(d), Ok(want)) => {
            assert_eq!(got(&d), want, "step {step}: {what}");
            let reason = if want.allowed {
                Reason::Within
            } else {
                Reason::Limited
            };
            assert_eq!(d.reason(), reason, "step {step}: {what}");
        }
        (d, want) => assert_eq!(d.map(|d| got(&d)), want, "step {step}: {what}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((head, ops)) = data.split_first_chunk::<6>() else {
        return;
    };
    let p = params(head[0], head[1], head[2], head[3]);
    let epoch = FAKE_UNIX_EPOCH_S * 1_000_000_000 + u64::from(head[4]) * 7_777_777;
    let grace = if head[5] & 1 == 0 { 0 } else { 1_000 * MS };
    let clock = FakeClock::with_unix_epoch(Duration::from_nanos(epoch));
    let Ok(l) = Limiter::<u8>::builder()
        // Four keys are used: a small table keeps each run cheap (a store may map its whole
        // table up front), far from the cap.
        .max_keys(64)
        // The reference models explicit sweeps only: no housekeeping sweeps of their own
        // (tests/reclaim.rs covers those).
        .housekeeping(false)
        .quota(p.quota())
        .clock(clock.clone())
        .sweep_grace(Duration::from_nanos(grace))
        .build()
    else {
        // Only a rate above one per nanosecond can be refused here.
        assert!(p.limit > p.period, "{p:?} refused");
        return;
    };
    let mut r = Reference {
        keys: BTreeMap::new(),
        params: p,
        rules_id: 0,
        epoch,
        grace,
    };
    for (step, op) in ops.chunks_exact(3).enumerate() {
        let (kind, a, b) = (op[0] % 10, op[1], op[2]);
        let key = a & 3;
        let now = clock.now();
        let cap = r.params.capacity();
        match kind {
            0 | 1 => {
                let want = r.call(key, now, 1, Call::Check);
                same(step, "check", Ok(l.check(&key)), want);
            }
            2 => {
                let n = u64::from(b) % (cap + 2);
                let want = r.call(key, now, n, Call::Check);
                same(step, "check_n", l.check_n(&key, n), want);
            }
            3 => {
                let want = r.call(key, now, 1, Call::Peek);
                same(step, "peek", Ok(l.peek(&key)), want);
            }
            4 => {
                let n = u64::from(b) % (cap + 1);
                let max_delay = u64::from(a >> 2) * r.params.period / 8;
                let want = r.call(key, now, n, Call::Reserve(max_delay));
                let d = l.reserve(&key, n, Duration::from_nanos(max_delay));
                same(step, "reserve", d, want);
            }
            5 => {
                let want = r.keys.remove(&key).is_some();
                assert_eq!(l.reset(&key), want, "step {step}: reset");
            }
            6 => {
                let at = now.saturating_sub(r.grace);
                let before = r.keys.len();
                r.keys.retain(|_, k| !k.is_fresh(at));
                assert_eq!(l.sweep_now(), before - r.keys.len(), "step {step}: sweep");
            }
            7 => clock.advance_ns(u64::from(b) * STEPS[usize::from(a) % STEPS.len()]),
            8 => {
                clock.set_ns(now.saturating_sub(u64::from(b) * STEPS[usize::from(a) % STEPS.len()]))
            }
            _ => {
                let next = params(a, b, a >> 4, b >> 3);
                if l.set_plan("default", Plan::new([next.quota()])).is_err() {
                    assert!(next.limit > next.period, "{next:?} refused");
                    continue;
                }
                // Equal rules are shared (keys keep theirs); other rules are new, and every key
                // built for the old ones is carried over on its next call.
                if !next.same_rules(&r.params) {
                    r.rules_id += 1;
                }
                r.params = next;
            }
        }
        assert_eq!(l.len(), r.keys.len(), "step {step}: keys tracked");
    }
});
