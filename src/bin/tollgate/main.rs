//! `tollgate`: a demo of a bot at 10,000 req/s among honest users on a virtual
//! clock through every algorithm, and a quick single-thread benchmark.
//!
//! Built with `cargo run --release --features cli -- <command>`; `tollgate --help` lists the
//! commands, `tollgate <command> --help` explains one. Arguments are parsed by clap (derive);
//! the SVG chart is written by hand.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::process::ExitCode;
use std::time::{Duration, Instant};

mod chart;
mod counting_alloc;

use clap::{Parser, Subcommand};
use counting_alloc::CountingAllocator;
use tollgate::{Algorithm, Clock, Error, FakeClock, Limiter, Quota};

#[cfg(feature = "rls")]
mod rls;
#[cfg(feature = "http")]
mod serve;
#[cfg(any(feature = "http", feature = "rls"))]
mod watch;

/// Live heap bytes, for the demo's "bytes per key" column.
#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

fn live_bytes() -> usize {
    CountingAllocator::live_bytes()
}

// ---------------------------------------------------------------------------------------------
// Command line.
// ---------------------------------------------------------------------------------------------

/// A keyed rate limiter, demonstrated.
#[derive(Parser)]
#[command(name = "tollgate", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replays a bot among honest users on a virtual clock, through every algorithm.
    ///
    /// One bot client sends 10,000 req/s (starting at t = 59 s, the last second of the first
    /// minute window) while 50 honest users send about 1 req/s each; every client is limited
    /// to 100 requests per minute (buckets: burst 100). Prints what each algorithm admitted,
    /// the bot's worst 2-second span, and the memory each tracked key costs.
    Demo {
        /// Also write an SVG chart of the bot's admitted req/s.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<String>,
        /// Virtual seconds to simulate.
        #[arg(long, default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..=3600))]
        seconds: u64,
    },
    /// Single-thread ns per check with the real monotonic clock.
    ///
    /// Median of 5 runs, for an allow-heavy quota (1,000,000 per ms, nearly everything
    /// admitted) and a deny-heavy one (1 per hour, after the unit is spent).
    Bench {
        /// Distinct keys, checked in turn.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
        keys: u64,
        /// Wall time per algorithm, seconds (0.001 to 600).
        #[arg(long, default_value_t = 0.2, value_parser = parse_seconds)]
        seconds: f64,
    },
    /// An HTTP server behind the rate-limit layer (needs `--features cli,http`).
    ///
    /// Watch the headers count down with `curl -i` and the 429 arrive: GET /, POST /login,
    /// any /api/...; GET /metrics (not limited) has the counters in the Prometheus text format.
    /// With a `[redis]` table in the config, every plan is shared with the other servers on
    /// that Redis. The config is reloaded on SIGHUP and within a second of the file changing,
    /// keeping what clients spent (a bad new file keeps the running config and says why on
    /// stderr). Runs until interrupted or terminated (SIGTERM: requests in flight are answered).
    Serve {
        /// Plans, `[http]` and `[redis]` settings (see examples/plans.toml).
        #[arg(long, value_name = "FILE")]
        config: String,
        /// Address to listen on.
        #[arg(long, value_name = "ADDRESS:PORT", default_value = "127.0.0.1:8080")]
        listen: String,
    },
    /// Envoy's global rate limit service (needs `--features cli,rls`).
    ///
    /// Answers `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC (with
    /// grpc.health.v1), and GET /healthcheck, POST /json, GET /metrics over HTTP, from
    /// envoyproxy/ratelimit's YAML config (a file, or a directory of *.yaml / *.yml files),
    /// reloaded within seconds of a change. Runs until SIGTERM or SIGINT.
    Rls {
        /// A YAML file, or a directory of them (one domain each).
        #[arg(long, value_name = "PATH")]
        config: std::path::PathBuf,
        /// gRPC address.
        #[arg(long, value_name = "ADDRESS:PORT", default_value = "0.0.0.0:8081")]
        grpc: String,
        /// HTTP address.
        #[arg(long, value_name = "ADDRESS:PORT", default_value = "0.0.0.0:8080")]
        http: String,
        /// Share the limits with other instances through this Redis (`redis://host:6379/`).
        #[arg(long, value_name = "URL")]
        redis: Option<String>,
        /// `exact` (one script per decision) or `synced` (local cells reconciled in rounds).
        #[arg(long, value_name = "MODE", default_value = "exact")]
        redis_mode: String,
    },
}

/// Seconds from 0.001 to 600.
fn parse_seconds(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(s) if s.is_finite() && (0.001..=600.0).contains(&s) => Ok(s),
        _ => Err(format!("expected seconds from 0.001 to 600, got '{value}'")),
    }
}

/// Why a command stopped.
enum Fail {
    /// Bad command line: message, exit code 2.
    Usage(String),
    /// Something failed at run time: message, exit code 1.
    Run(String),
    /// Writing the output failed (a closed pipe): exit quietly.
    Output(io::Error),
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Self {
        Fail::Output(e)
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Run(format!("cannot build the limiter: {e}"))
    }
}

fn main() -> ExitCode {
    // Usage errors, `--help` and `--version` are clap's (exit code 2 for a usage error).
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { plot, seconds } => demo(seconds, plot.as_deref()),
        Command::Bench { keys, seconds } => bench(keys, seconds),
        Command::Serve { config, listen } => serve(&config, &listen),
        Command::Rls {
            config,
            grpc,
            http,
            redis,
            redis_mode,
        } => rls_command(config, grpc, http, redis, redis_mode),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail::Usage(msg)) => {
            eprintln!("tollgate: error: {msg}");
            eprintln!("Run `tollgate --help` for usage.");
            ExitCode::from(2)
        }
        Err(Fail::Run(msg)) => {
            eprintln!("tollgate: error: {msg}");
            ExitCode::from(1)
        }
        Err(Fail::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(Fail::Output(e)) => {
            eprintln!("tollgate: error: cannot write output: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(feature = "http")]
fn serve(config: &str, listen: &str) -> Result<(), Fail> {
    serve::serve(config, listen)
}

#[cfg(not(feature = "http"))]
fn serve(_config: &str, _listen: &str) -> Result<(), Fail> {
    Err(Fail::Usage(
        "this build has no HTTP server: rebuild with `--features cli,http`".to_string(),
    ))
}

#[cfg(feature = "rls")]
fn rls_command(
    config: std::path::PathBuf,
    grpc: String,
    http: String,
    redis: Option<String>,
    redis_mode: String,
) -> Result<(), Fail> {
    rls::rls(rls::RlsArgs {
        config,
        grpc,
        http,
        redis,
        redis_mode,
    })
}

#[cfg(not(feature = "rls"))]
fn rls_command(
    _config: std::path::PathBuf,
    _grpc: String,
    _http: String,
    _redis: Option<String>,
    _redis_mode: String,
) -> Result<(), Fail> {
    Err(Fail::Usage(
        "this build has no rate limit service: rebuild with `--features cli,rls`".to_string(),
    ))
}

// ---------------------------------------------------------------------------------------------
// Demo.
// ---------------------------------------------------------------------------------------------

const NS: u64 = 1_000_000_000;
/// The bot's client id.
const BOT: u64 = 0;
/// Honest users are clients 1..=HONEST.
const HONEST: u64 = 50;
/// The bot's rate: 10,000 req/s, one every 100 µs.
const BOT_GAP_NS: u64 = NS / 10_000;
/// The bot starts in the last second of the first minute window (windows are aligned to Unix
/// minutes and the fake clock's epoch is a whole minute, so the boundary is at t = 60 s).
const BOT_START_NS: u64 = 59 * NS;
/// Per-client limit: 100 per minute.
const LIMIT: u64 = 100;
/// Keys inserted to measure memory per key.
const MEMORY_KEYS: u64 = 100_000;
/// The fixed PRNG seed: every algorithm sees exactly the same traffic.
const SEED: u64 = 0x7475_726e_7374_696c;

/// splitmix64: a tiny, good-enough deterministic generator.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

fn demo_quota(algorithm: Algorithm) -> Quota {
    // Windows ignore the burst; the buckets hold at most 100 at once.
    Quota::per_minute(LIMIT).burst(LIMIT).algorithm(algorithm)
}

/// What one algorithm did with the demo's traffic.
struct Outcome {
    algorithm: Algorithm,
    bot_sent: u64,
    /// Virtual times (ns) of the bot's admitted requests, in order.
    bot_admitted: Vec<u64>,
    honest_sent: u64,
    honest_admitted: u64,
    bytes_per_key: f64,
}

/// Plays the traffic through a limiter using `algorithm` on a virtual clock.
fn simulate(algorithm: Algorithm, seconds: u64) -> Result<Outcome, Fail> {
    let clock = FakeClock::new();
    let limiter = Limiter::<u64>::builder()
        .quota(demo_quota(algorithm))
        .clock(clock.clone())
        .build()?;
    let end = seconds * NS;
    let mut rng = SplitMix64(SEED);
    // Next request time of each honest user: first one somewhere in the first second, then gaps
    // uniform in 0.5..1.5 s (about 1 req/s each).
    let mut honest: BinaryHeap<Reverse<(u64, u64)>> = (1..=HONEST)
        .map(|user| Reverse((rng.below(NS), user)))
        .collect();
    let mut bot_next = BOT_START_NS;
    let mut out = Outcome {
        algorithm,
        bot_sent: 0,
        bot_admitted: Vec::new(),
        honest_sent: 0,
        honest_admitted: 0,
        bytes_per_key: 0.0,
    };
    loop {
        let honest_next = honest.peek().map_or(u64::MAX, |r| r.0.0);
        let t = bot_next.min(honest_next);
        if t >= end {
            break;
        }
        clock.advance_ns(t - clock.now());
        if bot_next <= honest_next {
            out.bot_sent += 1;
            if limiter.check(&BOT).is_allowed() {
                out.bot_admitted.push(t);
            }
            bot_next += BOT_GAP_NS;
        } else if let Some(Reverse((_, user))) = honest.pop() {
            out.honest_sent += 1;
            if limiter.check(&user).is_allowed() {
                out.honest_admitted += 1;
            }
            honest.push(Reverse((t + NS / 2 + rng.below(NS), user)));
        }
    }
    Ok(out)
}

/// Bytes one tracked key costs in a limiter sized for [`MEMORY_KEYS`] keys, all of them made
/// one request: growth of live heap bytes, plus the flat store's slot table (mapped outside the
/// allocator when the limiter is built), divided by the number of keys.
fn bytes_per_key(algorithm: Algorithm) -> Result<f64, Fail> {
    let limiter = Limiter::<u64>::builder()
        .quota(demo_quota(algorithm))
        .max_keys(MEMORY_KEYS as usize)
        .clock(FakeClock::new())
        .build()?;
    let before = live_bytes();
    for key in 0..MEMORY_KEYS {
        let _ = limiter.check(&key);
    }
    let grown = live_bytes().saturating_sub(before) + limiter.table_bytes();
    drop(limiter);
    Ok(grown as f64 / MEMORY_KEYS as f64)
}

/// The most timestamps in any half-open span `[t, t + span)` (times sorted ascending).
fn max_in_span(times: &[u64], span: u64) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for (hi, &t) in times.iter().enumerate() {
        while t - times[lo] >= span {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

fn demo(seconds: u64, plot: Option<&str>) -> Result<(), Fail> {
    let mut outcomes = Vec::with_capacity(Algorithm::ALL.len());
    for algorithm in Algorithm::ALL {
        let mut o = simulate(algorithm, seconds)?;
        o.bytes_per_key = bytes_per_key(algorithm)?;
        outcomes.push(o);
    }

    let mut text = String::new();
    let _ = writeln!(
        text,
        "tollgate demo: {seconds} virtual seconds; limit {LIMIT}/min per client (buckets: burst \
         {LIMIT}); bot client at 10,000 req/s from t = {} s; {HONEST} honest users at ~1 req/s",
        BOT_START_NS / NS
    );
    text.push('\n');
    let header = [
        "algorithm",
        "bot sent",
        "bot admitted",
        "honest sent",
        "honest admitted",
        "bot max/2s",
        "bot max/60s",
        "bytes/key",
    ];
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            let pct = if o.honest_sent == 0 {
                100.0
            } else {
                100.0 * o.honest_admitted as f64 / o.honest_sent as f64
            };
            vec![
                o.algorithm.name().to_string(),
                o.bot_sent.to_string(),
                o.bot_admitted.len().to_string(),
                o.honest_sent.to_string(),
                format!("{} ({pct:.1}%)", o.honest_admitted),
                max_in_span(&o.bot_admitted, 2 * NS).to_string(),
                max_in_span(&o.bot_admitted, 60 * NS).to_string(),
                format!("{:.1}", o.bytes_per_key),
            ]
        })
        .collect();
    text.push_str(&table(&header, &rows));
    let _ = writeln!(
        text,
        "\nfixed_window admits up to 2x the limit across a window boundary (100 at 59 s + 100 at \
         60 s); sliding_window_log is exact (never over {LIMIT} in any 60 s) but keeps one entry \
         per admitted request; sliding_window_counter estimates it with two counters; the \
         buckets (GCRA) allow a burst of {LIMIT}, then one per 0.6 s; honest users (~60/min) \
         stay under their own limit."
    );
    if let Some(path) = plot {
        let svg = chart::svg_chart(&outcomes, seconds);
        std::fs::write(path, svg)
            .map_err(|e| Fail::Run(format!("cannot write plot '{path}': {e}")))?;
        let _ = writeln!(text, "\nwrote {path}");
    }
    io::stdout().lock().write_all(text.as_bytes())?;
    Ok(())
}

/// Formats an aligned table: the first column left-aligned, the others right-aligned.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i == 0 {
                let _ = write!(s, "{cell:<w$}");
            } else {
                let _ = write!(s, "  {cell:>w$}");
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(&mut header.iter().copied());
    let total: usize = widths.iter().sum::<usize>() + 2 * (widths.len() - 1);
    out.push_str(&"-".repeat(total));
    out.push('\n');
    for row in rows {
        out.push_str(&line(&mut row.iter().map(String::as_str)));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Bench.
// ---------------------------------------------------------------------------------------------

/// Runs per measurement; the median is reported.
const RUNS: usize = 5;
/// Checks between two reads of the wall clock.
const BATCH: u64 = 1024;

/// Checks `keys` keys in turn for `budget`; returns ns per check and the admitted fraction.
fn timed_run<C: Clock>(limiter: &Limiter<u64, C>, keys: u64, budget: Duration) -> (f64, f64) {
    let start = Instant::now();
    let mut key = 0u64;
    let mut checks = 0u64;
    let mut allowed = 0u64;
    loop {
        for _ in 0..BATCH {
            let d = std::hint::black_box(limiter.check(std::hint::black_box(&key)));
            allowed += u64::from(d.is_allowed());
            key += 1;
            if key == keys {
                key = 0;
            }
        }
        checks += BATCH;
        let elapsed = start.elapsed();
        if elapsed >= budget {
            return (
                elapsed.as_nanos() as f64 / checks as f64,
                allowed as f64 / checks as f64,
            );
        }
    }
}

/// Builds a limiter on the monotonic clock, lowering a window limit to the algorithm's maximum if
/// the cell cannot count that far.
fn bench_limiter(quota: Quota) -> Result<(Limiter<u64>, Quota), Fail> {
    match Limiter::<u64>::builder().quota(quota).build() {
        Ok(l) => Ok((l, quota)),
        Err(Error::LimitTooLarge { max, .. }) => {
            let q = Quota::new(max, quota.period()).algorithm(quota.algo());
            Ok((Limiter::<u64>::builder().quota(q).build()?, q))
        }
        Err(e) => Err(e.into()),
    }
}

/// Median ns per check and median admitted fraction of [`RUNS`] runs.
fn measure(quota: Quota, keys: u64, per_run: Duration) -> Result<(f64, f64, Quota), Fail> {
    let (limiter, quota) = bench_limiter(quota)?;
    // Warm-up: every key tracked (and, for the deny-heavy quota, its one unit spent).
    for key in 0..keys {
        let _ = limiter.check(&key);
    }
    let mut ns = Vec::with_capacity(RUNS);
    let mut admitted = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let (n, a) = timed_run(&limiter, keys, per_run);
        ns.push(n);
        admitted.push(a);
    }
    Ok((median(&mut ns), median(&mut admitted), quota))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bench(keys: u64, seconds: f64) -> Result<(), Fail> {
    let per_run = Duration::from_secs_f64(seconds / (2 * RUNS) as f64);
    let mut out = io::stdout().lock();
    writeln!(
        out,
        "tollgate bench: 1 thread, MonotonicClock, {keys} keys checked in turn, median of {RUNS} \
         runs of {:.0} ms",
        per_run.as_secs_f64() * 1e3
    )?;
    writeln!(
        out,
        "allow-heavy: 1,000,000 per 1 ms (or the algorithm's largest limit); deny-heavy: 1 per \
         hour, spent during warm-up\n"
    )?;
    let header = [
        "algorithm",
        "allow ns/check",
        "admitted",
        "deny ns/check",
        "admitted",
        "allow quota",
    ];
    let mut rows = Vec::new();
    for algorithm in Algorithm::ALL {
        let allow = Quota::new(1_000_000, Duration::from_millis(1)).algorithm(algorithm);
        let deny = Quota::per_hour(1).algorithm(algorithm);
        let (a_ns, a_frac, a_quota) = measure(allow, keys, per_run)?;
        let (d_ns, d_frac, _) = measure(deny, keys, per_run)?;
        rows.push(vec![
            algorithm.name().to_string(),
            format!("{a_ns:.1}"),
            format!("{:.1}%", a_frac * 100.0),
            format!("{d_ns:.1}"),
            format!("{:.1}%", d_frac * 100.0),
            format!(
                "{} per {} ms",
                a_quota.limit(),
                a_quota.period().as_secs_f64() * 1e3
            ),
        ]);
    }
    out.write_all(table(&header, &rows).as_bytes())?;
    Ok(())
}
