//! The scripts against the pure algorithms at exact boundaries, on a real redis-server.
//!
//! The integration tests (`tests/redis_exact.rs`) compare whole traces at the server's real
//! time, which lands on an exact boundary (a TAT exactly `tau` ahead, an entry exactly one
//! period old) only by chance. Here the test feeds the script a chosen time instead of `TIME`
//! (a test-only substitution of that one line of the prelude), writes crafted states, and
//! demands the same decision and the same next state as `algo::*` for thousands of cases,
//! many of them placed on a boundary, one nanosecond before it, and one after.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ::redis::{Commands, Connection, Value};

use super::script::{self, Call};
use crate::algo::{self, Kind, Rule, log::Log};
use crate::{Algorithm, Quota};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn server() -> (Server, Connection) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (scripts/ensure-redis.sh)");
    let guard = Server(child);
    let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let t = Instant::now();
    loop {
        if let Ok(c) = client.get_connection() {
            return (guard, c);
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The production script with `TIME` replaced by the last two arguments (seconds, micros).
fn source_at(kind: Kind) -> String {
    let s = script::source(&[kind]);
    let line = "local T = redis.call('TIME')";
    assert!(s.contains(line));
    s.replace(line, "local T = {ARGV[#ARGV - 1], ARGV[#ARGV]}")
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn near(&mut self, x: u64) -> u64 {
        (x + self.below(3)).saturating_sub(1)
    }
}

/// Runs one part at `now_us` and returns (decision, the key's value afterwards).
fn eval(
    con: &mut Connection,
    src: &str,
    keys: &[String],
    rule: &Rule,
    cost: u64,
    now_us: u64,
) -> (crate::Decision, bool, Option<String>) {
    let mut cmd = ::redis::cmd("EVAL");
    cmd.arg(src).arg(keys.len()).arg(keys).arg(1);
    cmd.arg(&script::part_args(rule, cost, Call::Check, 0));
    cmd.arg(now_us / 1_000_000).arg(now_us % 1_000_000);
    // One transaction, so no time passes between the script and the reads (some TTLs here are
    // a few ms: the time the script is given is not the server's).
    let state_key = keys.last().unwrap();
    let (v, after, ttl): (Value, Option<String>, i64) = ::redis::pipe()
        .atomic()
        .add_command(cmd)
        .get(state_key)
        .pttl(state_key)
        .query(con)
        .unwrap();
    let (all, now, replies) = script::parse_reply(&v, 1).unwrap();
    assert_eq!(now, now_us * 1000);
    let (d, mismatches) = script::combine(&[*rule], &replies, now, cost, Call::Check, 0).unwrap();
    assert_eq!(mismatches, 0);
    assert_eq!(d.allowed, all);
    // The script is given a time that is not the server's: a key written near its window's end
    // can be due at once (PTTL 0, or gone: -2). What must never happen is a key with no TTL.
    assert!(ttl != -1, "a key without a TTL (admitted: {all})");
    (d, all, after)
}

const BASE_US: u64 = 1_790_000_000_000_000;

#[test]
fn gcra_script_matches_at_exact_boundaries() {
    let (_s, mut con) = server();
    let src = source_at(Kind::Gcra);
    let mut rng = Rng(11);
    let mut on_edge = 0;
    for i in 0..1500 {
        let limit = 1 + rng.below(50);
        let period = 1_000 + rng.below(3_000_000_000);
        let Ok(rule) = Quota::new(limit, Duration::from_nanos(period))
            .burst(1 + rng.below(10))
            .compile(0)
        else {
            continue;
        };
        let cost = 1 + rng.below(rule.capacity);
        let now = (BASE_US + rng.below(1 << 40)) * 1000;
        let edge = (now + rule.tolerance).saturating_sub(cost * rule.emission);
        let tat = match rng.below(4) {
            0 => 0,
            1 => now.saturating_sub(rng.below(1 << 30)),
            2 => rng.near(edge),
            _ => now + rng.below(2 * rule.tolerance),
        };
        if tat.abs_diff(edge) <= 1 {
            on_edge += 1;
        }
        let key = format!("g{i}");
        if tat > 0 {
            let _: () = con.pset_ex(&key, tat.to_string(), 600_000).unwrap();
        }
        let want = algo::gcra::decide(tat, now, cost, &rule, 0);
        let (got, _, after) = eval(&mut con, &src, &[key], &rule, cost, now / 1000);
        assert_eq!(
            got, want.decision,
            "case {i}: tat {tat} now {now} cost {cost}"
        );
        if let Some(next) = want.next {
            assert_eq!(after, Some(next.to_string()), "case {i}");
        }
    }
    assert!(on_edge > 300, "{on_edge} cases on the edge");
}

#[test]
fn window_scripts_match_at_exact_boundaries() {
    let (_s, mut con) = server();
    let mut rng = Rng(12);
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let kind = if algorithm == Algorithm::FixedWindow {
            Kind::Fixed
        } else {
            Kind::Sliding
        };
        let src = source_at(kind);
        for i in 0..1500 {
            let period_us = match rng.below(3) {
                0 => 1 + rng.below(1000),
                1 => 1_000_000,
                _ => 1 + rng.below(86_400_000_000),
            };
            let rule = Quota::new(1 + rng.below(20), Duration::from_micros(period_us))
                .algorithm(algorithm)
                .compile(0)
                .unwrap();
            let cost = 1 + rng.below(rule.limit);
            let w = BASE_US / period_us + rng.below(1000);
            let e = match rng.below(4) {
                0 => 0,
                1 => period_us / 2,
                2 => period_us - 1,
                _ => rng.below(period_us),
            };
            let now = (w * period_us + e) * 1000;
            let sw = match rng.below(7) {
                0 => w,
                1 => w - 1,
                2 => w - 2 - rng.below(5),
                3 => w + 1,
                4 => {
                    w + if kind == Kind::Fixed {
                        1 << 20
                    } else {
                        1 << 12
                    }
                }
                5 => {
                    w + if kind == Kind::Fixed {
                        (1 << 20) + 1
                    } else {
                        (1 << 12) + 1
                    }
                }
                _ => w,
            };
            let key = format!("{}{i}", kind_name(kind));
            let near_cap = rng.near(rule.limit.saturating_sub(cost));
            let (state, raw) = if kind == Kind::Fixed {
                let c = near_cap.min(rule.limit);
                (algo::fixed::encode(sw as u32, c), format!("{sw}:{c}"))
            } else {
                let p = rng.below(rule.limit + 1);
                let c = near_cap.min(rule.limit);
                (algo::sliding::encode(sw, p, c), format!("{sw}:{p}:{c}"))
            };
            let fresh = rng.below(8) == 0;
            if !fresh {
                let _: () = con.pset_ex(&key, &raw, 600_000).unwrap();
            }
            let state = if fresh { 0 } else { state };
            let want = if kind == Kind::Fixed {
                algo::fixed::decide(state, now, cost, &rule, 0)
            } else {
                algo::sliding::decide(state, now, cost, &rule, 0)
            };
            let (got, _, after) = eval(&mut con, &src, &[key], &rule, cost, now / 1000);
            assert_eq!(
                got, want.decision,
                "{algorithm:?} case {i}: {raw} now {now} cost {cost}"
            );
            if let Some(next) = want.next {
                let after = after.expect("written");
                let mut it = after.split(':').map(|x| x.parse::<u64>().unwrap());
                let written = if kind == Kind::Fixed {
                    algo::fixed::encode(it.next().unwrap() as u32, it.next().unwrap())
                } else {
                    algo::sliding::encode(
                        it.next().unwrap(),
                        it.next().unwrap(),
                        it.next().unwrap(),
                    )
                };
                assert_eq!(written, next, "{algorithm:?} case {i}: wrote {after}");
            }
        }
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Gcra => "g",
        Kind::Fixed => "f",
        Kind::Sliding => "s",
        Kind::Log => "l",
    }
}

#[test]
fn log_script_matches_at_exact_boundaries() {
    let (_s, mut con) = server();
    let src = source_at(Kind::Log);
    let mut rng = Rng(13);
    for i in 0..1000 {
        let period = 1 + rng.below(5_000_000_000);
        let rule = Quota::new(1 + rng.below(8), Duration::from_nanos(period))
            .algorithm(Algorithm::SlidingWindowLog)
            .compile(0)
            .unwrap();
        let cost = 1 + rng.below(rule.limit);
        let now = (BASE_US + rng.below(1 << 40)) * 1000;
        let edge = now - period;
        let mut ts: Vec<(u64, u64)> = (0..rng.below(rule.limit + 1))
            .map(|_| {
                let t = match rng.below(3) {
                    0 => rng.near(edge),
                    1 => edge.saturating_sub(rng.below(period)),
                    _ => edge + rng.below(period + 2),
                };
                (t, 1 + rng.below(2))
            })
            .collect();
        ts.sort_unstable();
        let key = format!("l{i}");
        let total_key = format!("l{i}:n");
        let mut log = Log::default();
        for &(t, c) in &ts {
            log.push(t, c);
            let _: () = con.rpush(&key, format!("{t}:{c}")).unwrap();
        }
        let total: u64 = ts.iter().map(|&(_, c)| c).sum();
        if total > 0 {
            let _: () = con.pset_ex(&total_key, total, 600_000).unwrap();
            let _: () = con.pexpire(&key, 600_000).unwrap();
        }
        log.expire(now, period);
        let want = algo::log::decide(&log, now, cost, &rule, 0);
        let (got, all, _) = eval(
            &mut con,
            &src,
            &[key.clone(), total_key.clone()],
            &rule,
            cost,
            now / 1000,
        );
        assert_eq!(got, want.decision, "case {i}: {ts:?} now {now} cost {cost}");
        if all {
            log.push(now, cost);
            let entries: Vec<String> = con.lrange(&key, 0, -1).unwrap();
            assert_eq!(entries.len(), log.len(), "case {i}");
            let n: u64 = con.get(&total_key).unwrap();
            let used: u64 = entries
                .iter()
                .map(|e| e.split(':').nth(1).unwrap().parse::<u64>().unwrap())
                .sum();
            assert_eq!(n, used, "case {i}");
        }
    }
}
