//! The Lua side of exact mode: one script per algorithm (and one per set of algorithms for a
//! compound limit), and the Rust side that turns its reply into the same [`Decision`] the
//! in-process engine gives.
//!
//! # Arithmetic
//!
//! Redis runs Lua 5.1, whose numbers are doubles: integers are exact only below 2^53, and a Unix
//! time in nanoseconds (about 1.8 * 10^18) is not. So the scripts never hold a nanosecond time in
//! one number:
//!
//! - times and durations in ns are two limbs `(hi, lo)` with `lo` in `[0, 10^9)` (a u64 decimal
//!   string split nine digits from the right), with exact `add`, saturating `sub` and `le`;
//! - window indices come from the time in microseconds (`TIME` has microsecond resolution, and
//!   `sec * 10^6 + usec` is below 2^53 for 285 years), so window periods must be a whole number
//!   of microseconds (checked when the limiter is built);
//! - the sliding counter's products `count * period` are split into base-2^24 limbs.
//!
//! # Who computes what
//!
//! The script reads each part's state and the server time, decides admission (all parts pass or
//! nothing is written), writes the new states with their TTLs, and returns the state it read and
//! the time it used. The client then runs the crate's pure algorithm (`algo::*::decide`) on that
//! state and time to fill `remaining`, `reset_after` and `retry_after` exactly (they need
//! divisions the doubles cannot do exactly); the script's own admission verdict must agree, and
//! a disagreement is counted in the stats (`mismatches`, zero in every test). The sliding log's
//! fields need only additions, so its script computes them itself.

use crate::algo::{self, Kind, Rule, Step};
use crate::decision::Decision;

/// Limb arithmetic, the server time and the TTL helper, shared by every script.
const PRELUDE: &str = r#"
local B = 1000000000
local function big(s)
  if not s or s == '' then return 0, 0 end
  local n = string.len(s)
  if n <= 9 then return 0, tonumber(s) end
  return tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))
end
local function str(h, l)
  if h == 0 then return string.format('%d', l) end
  return string.format('%d%09d', h, l)
end
local function add(ah, al, bh, bl)
  local h, l = ah + bh, al + bl
  if l >= B then return h + 1, l - B end
  return h, l
end
local function le(ah, al, bh, bl)
  return ah < bh or (ah == bh and al <= bl)
end
local function sub(ah, al, bh, bl)
  if le(ah, al, bh, bl) then return 0, 0 end
  local h, l = ah - bh, al - bl
  if l < 0 then return h - 1, l + B end
  return h, l
end
-- PX for a state that matters for (h, l) more ns: rounded up, plus 2 ms so that the key never
-- expires before the state is back to fresh (the expiry clock has millisecond resolution).
local function px(h, l)
  return h * 1000 + math.ceil(l / 1000000) + 2
end
-- Another program's data at a key (a value this limiter never writes): abort before anything is
-- written, with an error the client answers for that key alone by its policy.
local function foreign(key)
  -- A string, not an error table: Redis 6 cannot report a table raised from a script.
  error('TOLLGATE_FOREIGN ' .. key)
end
-- The numbers of a state string matching `pat`, each at most `len` digits (a state this limiter
-- wrote), else foreign.
local function parts(key, raw, pat, len)
  local t = {string.match(raw, pat)}
  if #t == 0 then foreign(key) end
  for i, v in ipairs(t) do
    if #v > len then foreign(key) end
    t[i] = tonumber(v)
  end
  return t
end
local T = redis.call('TIME')
local NH, NL = tonumber(T[1]), tonumber(T[2]) * 1000
local NOW_US = tonumber(T[1]) * 1000000 + tonumber(T[2])
-- floor(NOW_US / p) and the remainder, exact (p in us, q * p below 2^53).
local function window(p)
  local q = math.floor(NOW_US / p)
  local r = NOW_US - q * p
  if r < 0 then q = q - 1; r = r + p elseif r >= p then q = q + 1; r = r - p end
  return q, r
end
"#;

/// GCRA (token bucket, leaky bucket as a meter, and as a queue with a larger tolerance).
/// Arguments: `n*T` and the tolerance, both decimal ns.
const GCRA: &str = r#"
local function decide_g(keys, a)
  local raw = redis.call('GET', keys[1])
  -- A TAT in ns: a u64 (reservations far ahead can reach 20 digits).
  if raw then
    parts(keys[1], raw, '^(%d+)$', 20)
    if #raw == 20 and raw > '18446744073709551615' then foreign(keys[1]) end
  end
  local th, tl = big(raw)
  local bh, bl = th, tl
  if le(th, tl, NH, NL) then bh, bl = NH, NL end
  local xh, xl = add(bh, bl, big(a[1]))
  local dh, dl = sub(xh, xl, NH, NL)
  local ok = le(dh, dl, big(a[2]))
  local function write()
    redis.call('SET', keys[1], str(xh, xl), 'PX', px(dh, dl))
  end
  return ok, raw or '0', write
end
"#;

/// Fixed window. Arguments: period (us), cost, limit. State `window:count` (full window index).
const FIXED: &str = r#"
local function decide_f(keys, a)
  local p, cost, cap = tonumber(a[1]), tonumber(a[2]), tonumber(a[3])
  local raw = redis.call('GET', keys[1])
  local w, e = window(p)
  local win, count, left = w, 0, p - e
  if raw then
    local t = parts(keys[1], raw, '^(%d+):(%d+)$', 16)
    local sw, c = t[1], t[2]
    if c > MAXF then foreign(keys[1]) end
    if sw == w then
      count = c
    elseif sw > w and sw - w <= 1048576 then
      win, count, left = sw, c, left + (sw - w) * p
    end
  end
  local ok = count + cost <= cap
  local function write()
    redis.call('SET', keys[1], string.format('%d:%d', win, count + cost), 'PX', math.ceil(left / 1000) + 2)
  end
  return ok, raw or '', write
end
"#;

/// Sliding window counter. Arguments: period (us), cost, limit. State `window:prev:cur`.
const SLIDING: &str = r#"
local M = 16777216
-- x * y as base-2^24 limbs (x below 2^23, y below 2^53).
local function mul(x, y)
  local yh = math.floor(y / M)
  local yl = y - yh * M
  local l = x * yl
  local c = math.floor(l / M)
  return x * yh + c, l - c * M
end
local function decide_s(keys, a)
  local p, cost, cap = tonumber(a[1]), tonumber(a[2]), tonumber(a[3])
  local raw = redis.call('GET', keys[1])
  local w, e = window(p)
  local win, prev, cur, ahead = w, 0, 0, 0
  if raw then
    local t = parts(keys[1], raw, '^(%d+):(%d+):(%d+)$', 16)
    local sw, sp, sc = t[1], t[2], t[3]
    if sp > MAXS or sc > MAXS then foreign(keys[1]) end
    if sw == w then
      prev, cur = sp, sc
    elseif sw == w - 1 then
      prev = sc
    elseif sw > w and sw - w <= 4096 then
      win, prev, cur, ahead = sw, sp, sc, sw - w
    end
  end
  local ok
  if ahead > 0 then
    ok = prev + cur + cost <= cap
  else
    local ah, al = mul(prev, p - e)
    local bh, bl = mul(cur + cost, p)
    local h, l = ah + bh, al + bl
    if l >= M then h = h + 1; l = l - M end
    local ch, cl = mul(cap, p)
    ok = h < ch or (h == ch and l <= cl)
  end
  local function write()
    local left = (p - e) + p + ahead * p
    redis.call('SET', keys[1], string.format('%d:%d:%d', win, prev, cur + cost), 'PX', math.ceil(left / 1000) + 2)
  end
  return ok, raw or '', write
end
"#;

/// Sliding window log: a list of `ts:cost` entries (oldest first) and a total, two keys.
/// Arguments: period (decimal ns), cost, limit. Returns its decision fields itself.
const LOG: &str = r#"
local function decide_l(keys, a)
  local ph, pl = big(a[1])
  local cost, cap = tonumber(a[2]), tonumber(a[3])
  local used = parts(keys[2], redis.call('GET', keys[2]) or '0', '^(%d+)$', 9)[1]
  -- Each entry is checked before it is used or trimmed (an entry of another program's stops
  -- the script; expired entries trimmed before it only leave the total too high: stricter).
  local entry = '^(%d+):(%d+)$'
  while true do
    local e = redis.call('LINDEX', keys[1], 0)
    if not e then break end
    local s2 = parts(keys[1], e, entry, 19)[2]
    local ah, al = sub(NH, NL, big(string.match(e, '^(%d+)')))
    if not le(ph, pl, ah, al) then break end
    redis.call('LPOP', keys[1])
    used = used - s2
  end
  -- A total lost without its list (evicted, deleted) must not go negative.
  if used < 0 then used = 0 end
  if used > 0 then
    redis.call('SET', keys[2], used, 'KEEPTTL')
  else
    redis.call('DEL', keys[2])
  end
  local last = redis.call('LINDEX', keys[1], -1)
  local lh, ll, rh, rl = 0, 0, 0, 0
  if last then
    parts(keys[1], last, entry, 19)
    lh, ll = big(string.match(last, '^(%d+):'))
    local eh, el = add(lh, ll, ph, pl)
    rh, rl = sub(eh, el, NH, NL)
  end
  if used + cost <= cap then
    local sh, sl = rh, rl
    if le(sh, sl, ph, pl) then sh, sl = ph, pl end
    local function write()
      local th, tl = lh, ll
      if le(th, tl, NH, NL) then th, tl = NH, NL end
      redis.call('RPUSH', keys[1], str(th, tl) .. ':' .. cost)
      redis.call('SET', keys[2], used + cost)
      local xh, xl = add(th, tl, ph, pl)
      local eh, el = sub(xh, xl, NH, NL)
      redis.call('PEXPIRE', keys[1], px(eh, el))
      redis.call('PEXPIRE', keys[2], px(eh, el))
    end
    return true, string.format('1:%d:%s:0', cap - used - cost, str(sh, sl)), write
  end
  local need, freed, yh, yl = used + cost - cap, 0, 0, 0
  local i = 0
  while freed < need do
    local chunk = redis.call('LRANGE', keys[1], i, i + 99)
    if #chunk == 0 then break end
    for _, e in ipairs(chunk) do
      local s2 = parts(keys[1], e, entry, 19)[2]
      local s1 = string.match(e, '^(%d+)')
      freed = freed + s2
      if freed >= need then
        local th, tl = big(s1)
        local xh, xl = add(th, tl, ph, pl)
        yh, yl = sub(xh, xl, NH, NL)
        break
      end
    end
    i = i + 100
  end
  local rem = cap - used
  if rem < 0 then rem = 0 end
  return false, string.format('0:%d:%s:%s', rem, str(rh, rl), str(yh, yl)), nil
end
"#;

/// Runs every part, writes only if all pass (never for a peek: a negative part count), and
/// replies `{all_passed, now_ns, verdict_1, state_1, verdict_2, state_2, ...}`.
const DRIVER: &str = r#"
local n = tonumber(ARGV[1])
local peek = n < 0
if peek then n = -n end
local ki, ai = 1, 2
local all, writes, out = true, {}, {0, str(NH, NL)}
for i = 1, n do
  local kind = ARGV[ai]
  local nk = 1
  if kind == 'l' then nk = 2 end
  local ok, state, write = DECIDE[kind]({KEYS[ki], KEYS[ki + nk - 1]}, {ARGV[ai + 1], ARGV[ai + 2], ARGV[ai + 3]})
  ki = ki + nk
  ai = ai + 4
  if ok then out[#out + 1] = 1 else out[#out + 1] = 0; all = false end
  out[#out + 1] = state
  writes[#writes + 1] = write
end
if all then
  if not peek then
    for _, w in ipairs(writes) do w() end
  end
  out[1] = 1
end
return out
"#;

/// The Lua source for a limiter whose parts run on these kinds: the prelude, the functions of
/// the kinds used (one script per algorithm; a compound of several algorithms gets their union)
/// and the driver.
pub(crate) fn source(kinds: &[Kind]) -> String {
    let mut s = String::from(PRELUDE);
    let has = |k: Kind| kinds.contains(&k);
    s.push_str("local DECIDE = {}\n");
    s.push_str(&format!(
        "local MAXF, MAXS = {}, {}\n",
        algo::fixed::MAX_LIMIT,
        algo::sliding::MAX_LIMIT
    ));
    if has(Kind::Gcra) {
        s.push_str(GCRA);
        s.push_str("DECIDE['g'] = decide_g\n");
    }
    if has(Kind::Fixed) {
        s.push_str(FIXED);
        s.push_str("DECIDE['f'] = decide_f\n");
    }
    if has(Kind::Sliding) {
        s.push_str(SLIDING);
        s.push_str("DECIDE['s'] = decide_s\n");
    }
    if has(Kind::Log) {
        s.push_str(LOG);
        s.push_str("DECIDE['l'] = decide_l\n");
    }
    s.push_str(DRIVER);
    s
}

/// The shared Lua prelude (limb arithmetic, server time, TTL helper).
pub(crate) fn prelude() -> &'static str {
    PRELUDE
}

/// One part's reply from the script: its own verdict and the state it read (or, for a log,
/// the decision fields it computed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartReply {
    pub(crate) admitted: bool,
    pub(crate) state: String,
}

/// A malformed reply: a script or server that does not speak our protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadReply(pub(crate) String);

/// Parses a decimal u64.
fn num(s: &str, what: &str) -> Result<u64, BadReply> {
    s.parse::<u64>()
        .map_err(|_| BadReply(format!("{what}: '{s}' is not a u64")))
}

/// The state a word cell would hold, from the script's string.
fn word_state(kind: Kind, s: &str) -> Result<u64, BadReply> {
    match kind {
        Kind::Gcra => num(s, "tat"),
        Kind::Fixed => {
            if s.is_empty() {
                return Ok(0);
            }
            let (w, c) = s
                .split_once(':')
                .ok_or_else(|| BadReply(format!("fixed state '{s}'")))?;
            let c = num(c, "fixed count")?;
            if c > algo::fixed::MAX_LIMIT {
                return Err(BadReply(format!("fixed count {c} too large")));
            }
            // Truncated as the in-process cell truncates it.
            Ok(algo::fixed::encode(num(w, "fixed window")? as u32, c))
        }
        Kind::Sliding => {
            if s.is_empty() {
                return Ok(0);
            }
            let mut it = s.split(':');
            let (Some(w), Some(p), Some(c), None) = (it.next(), it.next(), it.next(), it.next())
            else {
                return Err(BadReply(format!("sliding state '{s}'")));
            };
            let (p, c) = (num(p, "sliding prev")?, num(c, "sliding cur")?);
            if p > algo::sliding::MAX_LIMIT || c > algo::sliding::MAX_LIMIT {
                return Err(BadReply(format!("sliding counts in '{s}' too large")));
            }
            Ok(algo::sliding::encode(num(w, "sliding window")?, p, c))
        }
        Kind::Log => Err(BadReply("a log has no word state".into())),
    }
}

/// A log part's decision from the fields its script computed (`allowed:remaining:reset:retry`).
fn log_decision(s: &str, rule: &Rule) -> Result<Decision, BadReply> {
    let mut it = s.split(':');
    let (Some(a), Some(rem), Some(reset), Some(retry), None) =
        (it.next(), it.next(), it.next(), it.next(), it.next())
    else {
        return Err(BadReply(format!("log reply '{s}'")));
    };
    let (rem, reset, retry) = (
        num(rem, "log remaining")?,
        num(reset, "log reset")?,
        num(retry, "log retry")?,
    );
    let step: Step<()> = if a == "1" {
        Step::allow((), rule.limit, rem, reset, 0)
    } else {
        Step::deny(rule.limit, rem, reset, retry)
    };
    Ok(step.decision)
}

/// Whether a part is being checked, reserved (bucket parts may admit for a later moment) or
/// peeked: decided as a check, or as a reservation up to the given delay, nothing written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Call {
    Check,
    Reserve(u64),
    Peek(Option<u64>),
}

impl Call {
    /// The script's first argument: the part count, negative for a peek.
    pub(crate) fn count_arg(self, parts: usize) -> String {
        match self {
            Call::Peek(_) => format!("-{parts}"),
            _ => parts.to_string(),
        }
    }
}

/// The decision for one part, computed by the in-process algorithm on the state the script read
/// at the time it used. Returns the decision and whether it admits (to cross-check the script).
pub(crate) fn part_decision(
    rule: &Rule,
    reply: &PartReply,
    now: u64,
    cost: u64,
    call: Call,
    headroom: u64,
) -> Result<Decision, BadReply> {
    if rule.kind == Kind::Log {
        return log_decision(&reply.state, rule);
    }
    let state = word_state(rule.kind, &reply.state)?;
    let step = match (rule.kind, call) {
        (Kind::Gcra, Call::Reserve(max) | Call::Peek(Some(max))) => {
            algo::gcra::reserve(state, now, cost, rule, max, headroom)
        }
        (Kind::Gcra, _) => algo::gcra::decide(state, now, cost, rule, headroom),
        (Kind::Fixed, _) => algo::fixed::decide(state, now, cost, rule, headroom),
        (Kind::Sliding, _) => algo::sliding::decide(state, now, cost, rule, headroom),
        (Kind::Log, _) => unreachable!("handled above"),
    };
    Ok(step.decision)
}

/// Folds the parts' decisions as the in-process compound does: parts before the first denial
/// report what they hold without this request, parts after it are judged as plain checks, and
/// the merge keeps the binding part.
pub(crate) fn combine(
    rules: &[Rule],
    replies: &[PartReply],
    now: u64,
    cost: u64,
    call: Call,
    headroom: u64,
) -> Result<(Decision, usize), BadReply> {
    let mut decisions = Vec::with_capacity(rules.len());
    let mut denied_at = None;
    let mut mismatches = 0;
    for (rule, reply) in rules.iter().zip(replies) {
        let c = if denied_at.is_some() {
            Call::Check
        } else {
            call
        };
        let d = part_decision(rule, reply, now, cost, c, headroom)?;
        if denied_at.is_none() && d.allowed != reply.admitted {
            mismatches += 1;
        }
        if denied_at.is_none() && !d.allowed {
            denied_at = Some(decisions.len());
        }
        decisions.push(d);
    }
    if let Some(at) = denied_at {
        // The script wrote nothing: the state it read is what these parts hold without the
        // request, reported as a decision of cost 0 does. A log part's fields are the
        // script's own (made with the cost): only its `remaining` can be given back.
        for ((d, rule), reply) in decisions[..at].iter_mut().zip(rules).zip(replies) {
            if rule.kind == Kind::Log {
                d.remaining = (d.remaining + cost).min(d.limit);
            } else {
                *d = part_decision(rule, reply, now, 0, Call::Check, headroom)?.held();
            }
        }
    }
    let mut it = decisions.into_iter();
    let mut merged = it
        .next()
        .ok_or_else(|| BadReply("no parts in the reply".into()))?;
    for d in it {
        merged.merge(&d);
    }
    Ok((merged, mismatches))
}

/// The script's arguments for one part: kind code and three values. `headroom` units stay
/// unavailable to this caller (a lower tier, see `Plan::headroom`): the tolerance or the limit
/// the script sees is that much smaller, as in process.
pub(crate) fn part_args(rule: &Rule, cost: u64, call: Call, headroom: u64) -> [String; 4] {
    let limit = rule.limit - headroom;
    match rule.kind {
        Kind::Gcra => {
            let extra = match call {
                Call::Reserve(max) | Call::Peek(Some(max)) => max,
                Call::Check | Call::Peek(None) => 0,
            };
            [
                "g".into(),
                (cost * rule.emission).to_string(),
                (rule.tolerance - headroom * rule.emission)
                    .saturating_add(extra)
                    .to_string(),
                String::new(),
            ]
        }
        Kind::Fixed => [
            "f".into(),
            (rule.period / 1000).to_string(),
            cost.to_string(),
            limit.to_string(),
        ],
        Kind::Sliding => [
            "s".into(),
            (rule.period / 1000).to_string(),
            cost.to_string(),
            limit.to_string(),
        ],
        Kind::Log => [
            "l".into(),
            rule.period.to_string(),
            cost.to_string(),
            limit.to_string(),
        ],
    }
}

/// Parses the script's reply `{all, now, verdict, state, ...}`.
pub(crate) fn parse_reply(
    v: &::redis::Value,
    parts: usize,
) -> Result<(bool, u64, Vec<PartReply>), BadReply> {
    use ::redis::Value;
    let Value::Array(items) = v else {
        return Err(BadReply(format!("expected an array, got {v:?}")));
    };
    if items.len() != 2 + 2 * parts {
        return Err(BadReply(format!(
            "expected {} items, got {}",
            2 + 2 * parts,
            items.len()
        )));
    }
    let int = |v: &Value| match v {
        Value::Int(i) => Ok(*i),
        other => Err(BadReply(format!("expected an integer, got {other:?}"))),
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|_| BadReply("utf8".into())),
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(BadReply(format!("expected a string, got {other:?}"))),
    };
    let all = int(&items[0])? == 1;
    let now = num(&text(&items[1])?, "now")?;
    let mut out = Vec::with_capacity(parts);
    for p in items[2..].chunks(2) {
        out.push(PartReply {
            admitted: int(&p[0])? == 1,
            state: text(&p[1])?,
        });
    }
    Ok((all, now, out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Quota;
    use ::redis::Value;

    #[test]
    fn one_script_per_algorithm_and_their_union_for_compounds() {
        let g = source(&[Kind::Gcra]);
        assert!(g.contains("decide_g") && !g.contains("decide_f") && !g.contains("decide_l"));
        let all = source(&[Kind::Fixed, Kind::Sliding, Kind::Log]);
        assert!(all.contains("decide_f") && all.contains("decide_s") && all.contains("decide_l"));
        assert!(!all.contains("decide_g"));
    }

    #[test]
    fn arguments_carry_exact_integers() {
        let r = Quota::new(3, std::time::Duration::from_millis(100))
            .burst(2)
            .compile(0)
            .unwrap();
        // T = ceil(1e8 / 3) = 33,333,334 ns.
        assert_eq!(
            part_args(&r, 2, Call::Check, 0),
            ["g", "66666668", "66666668", ""].map(String::from)
        );
        assert_eq!(part_args(&r, 1, Call::Reserve(5), 0)[2], "66666673");
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let s = |x: &str| Value::BulkString(x.as_bytes().to_vec());
        assert!(parse_reply(&Value::Nil, 1).is_err());
        assert!(parse_reply(&Value::Array(vec![Value::Int(1)]), 1).is_err());
        let v = Value::Array(vec![Value::Int(1), s("-5"), Value::Int(1), s("0")]);
        assert!(parse_reply(&v, 1).is_err());
        let v = Value::Array(vec![Value::Int(1), s("1000"), Value::Int(1), s("7")]);
        let (all, now, parts) = parse_reply(&v, 1).unwrap();
        assert!(all && now == 1000 && parts[0].state == "7");
        let fixed = Quota::per_second(5)
            .algorithm(crate::Algorithm::FixedWindow)
            .compile(0)
            .unwrap();
        for bad in ["x", "1:", "1:99999999999", ":"] {
            let reply = PartReply {
                admitted: true,
                state: bad.into(),
            };
            assert!(
                part_decision(&fixed, &reply, 0, 1, Call::Check, 0).is_err(),
                "{bad}"
            );
        }
        let log = Quota::per_second(5)
            .algorithm(crate::Algorithm::SlidingWindowLog)
            .compile(0)
            .unwrap();
        let reply = PartReply {
            admitted: true,
            state: "1:2:3".into(),
        };
        assert!(part_decision(&log, &reply, 0, 1, Call::Check, 0).is_err());
    }
}
