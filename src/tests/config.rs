//! Configuration mistakes are errors that name the value: plans' TOML (fields, lines, exact
//! paths, durations) and the builder's ranges.

use std::time::Duration;

use crate::{Algorithm, Error, Limiter, PlanConfig, Quota};

/// Dotted keys are TOML too: `free.limit = 10` under `[plans]` is the table `[plans.free]`,
/// in file order like any other; and a type mistake inside an array of inline tables written
/// over several lines is named by its exact path.
#[test]
fn config_dotted_keys_and_multiline_arrays() {
    let dotted = PlanConfig::parse(
        "[plans]\nfree.limit = 10\nfree.window = 60\npro.limit = 100\npro.window = 60\n",
    )
    .unwrap();
    let tables = PlanConfig::parse(
        "[plans.free]\nlimit = 10\nwindow = 60\n[plans.pro]\nlimit = 100\nwindow = 60\n",
    )
    .unwrap();
    assert_eq!(dotted, tables);
    assert_eq!(dotted.names(), ["free", "pro"]);
    let src = "[plans.pro]\nlimits = [\n  { limit = 10, window = \"1s\" },\n  { limit = 100, window = \"1d\", burst = \"ten\" },\n]\n";
    assert_eq!(
        PlanConfig::parse(src).unwrap_err().to_string(),
        "line 4: plans.pro.limits[1].burst: invalid type: string \"ten\", expected an integer"
    );
    let src = "[plans.pro]\nlimits = [\n  { limit = 10, window = \"1s\", burst = 0 },\n]\n";
    assert_eq!(
        PlanConfig::parse(src).unwrap_err().to_string(),
        "line 3: plans.pro.limits[0].burst: must be at least 1, got 0"
    );
    let src = "[plans]\nfree.limit = 10\nfree.window = \"forever\"\n";
    assert_eq!(
        PlanConfig::parse(src).unwrap_err().to_string(),
        "line 3: plans.free.window: must be a positive duration: whole seconds, or a string like \"500ms\", \"10s\", \"5m\", \"1h\", \"1d\", \"1m30s\", \"1.5s\""
    );
}

#[test]
fn plan_config_errors_name_field_and_line() {
    let err = PlanConfig::parse("[plans.free]\nlimit = 10\nwindow = \"1x\"\n").unwrap_err();
    assert_eq!(err.to_string().split(':').next(), Some("line 3"));
    assert!(err.to_string().contains("plans.free.window"), "{err}");
    let err = PlanConfig::parse("[plans.free]\nlimit = 10\nwindow = 60\nalgorithm = \"magic\"\n")
        .unwrap_err();
    assert!(
        err.to_string().starts_with("line 4: plans.free.algorithm"),
        "{err}"
    );
    let err = PlanConfig::parse("[plans.free]\nlimti = 10\n").unwrap_err();
    assert!(matches!(err, Error::Config { line: Some(2), .. }), "{err}");
    let err = PlanConfig::parse("[plans.free]\nlimit = 10\n").unwrap_err();
    assert!(err.to_string().contains("missing field `window`"), "{err}");
    let err = PlanConfig::parse(
        "[plans.a]\nlimit = 5000000\nwindow = 60\nalgorithm = \"sliding_window_counter\"\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("at most 4194303"), "{err}");
    assert!(PlanConfig::parse("not toml [").is_err());
}

/// Window quotas above one unit per nanosecond are an error, as bucket ones are.
#[test]
fn window_rates_above_one_per_ns_are_errors() {
    for alg in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
    ] {
        let q = Quota::new(1000, Duration::from_nanos(1)).algorithm(alg);
        let r = Limiter::<u64>::builder().quota(q).build();
        assert!(
            matches!(
                r,
                Err(crate::Error::RateTooHigh {
                    limit: 1000,
                    period_ns: 1
                })
            ),
            "{alg:?}: {:?}",
            r.map(|_| ())
        );
    }
}

/// Shard counts outside 1..=MAX_SHARDS are an error, not a panic or an abort.
#[test]
fn shard_counts_out_of_range_are_errors() {
    for shards in [0, crate::MAX_SHARDS + 1, 1 << 40, 1 << 63, usize::MAX] {
        let r = Limiter::<u64>::builder()
            .quota(Quota::per_second(1))
            .shards(shards)
            .build();
        assert!(
            matches!(r, Err(crate::Error::ShardsOutOfRange { .. })),
            "{shards}"
        );
    }
    for shards in [1, 3, crate::MAX_SHARDS] {
        let l = Limiter::<u64>::builder()
            .quota(Quota::per_second(1))
            .shards(shards)
            .max_keys(1000)
            .build()
            .unwrap();
        assert!(l.check(&1).is_allowed());
    }
}

/// Durations people write: sums (`"1m30s"`, `"1h 30m"`) and fractions (`"1.5s"`), in exact
/// nanoseconds; anything else, or a fraction of a nanosecond, is an error naming the field.
#[test]
fn config_durations_compound_and_fractional() {
    use crate::plan::config::parse_duration as parse;
    assert_eq!(parse("1m30s"), Some(Duration::from_secs(90)));
    assert_eq!(parse("1h 30m"), Some(Duration::from_secs(5_400)));
    assert_eq!(parse("1.5s"), Some(Duration::from_millis(1_500)));
    assert_eq!(parse("0.25h"), Some(Duration::from_secs(900)));
    assert_eq!(parse(".5ms"), Some(Duration::from_micros(500)));
    assert_eq!(
        parse("2d 1.5h 10ms"),
        Some(Duration::from_millis(178_200_010))
    );
    assert_eq!(parse("250us"), Some(Duration::from_micros(250)));
    for bad in [
        "",
        "1.5ns",
        "1",
        "s",
        "1.2.3s",
        "1x",
        "1 s",
        "1m30",
        ".s",
        "99999999999999999999d",
    ] {
        assert_eq!(parse(bad), None, "{bad:?}");
    }
    let plans = PlanConfig::parse("[plans.a]\nlimit = 3\nwindow = \"1m30s\"\n")
        .unwrap()
        .into_plans();
    assert_eq!(plans[0].1.quotas()[0].period(), Duration::from_secs(90));
    let err = PlanConfig::parse("[plans.a]\nlimit = 3\nwindow = \"1.5ns\"\n").unwrap_err();
    assert!(
        err.to_string().starts_with("line 3: plans.a.window"),
        "{err}"
    );
    // A key that would do nothing is an error, at its own line.
    let err = PlanConfig::parse("[plans.a]\nlimit = 3\nwindow = \"1s\"\nmax_delay = \"2s\"\n")
        .unwrap_err();
    assert!(
        err.to_string().starts_with("line 4: plans.a.max_delay"),
        "{err}"
    );
}

/// A value too large for what it configures names the largest accepted, in the unit the user
/// wrote (never in nanoseconds, never as a type mistake), at the field it is about.
#[test]
fn config_too_large_values_name_the_maximum_as_written() {
    let cases = [
        (
            "[plans.a]\nlimit = 10\nwindow = \"5000000d\"\n",
            "line 3: plans.a.window: 5000000d is longer than the longest window, 53375d",
        ),
        (
            "[plans.a]\nlimit = 10\nwindow = \"1d 5000000h\"\n",
            "line 3: plans.a.window: 1d 5000000h is longer than the longest window, 1281023h",
        ),
        (
            "[plans.a]\nlimit = 10\nwindow = 99999999999999999999\n",
            "line 3: plans.a.window: 99999999999999999999s is longer than the longest window, 4611686018s",
        ),
        (
            "[plans.a]\nlimit = 1\nwindow = \"1s\"\nstrategy = \"queue\"\nmax_delay = \"5000000d\"\n",
            "line 5: plans.a.max_delay: 5000000d is longer than the longest max_delay, 213503d",
        ),
        (
            "[plans.a]\nlimit = 99999999999999999999\nwindow = 60\n",
            "line 2: plans.a.limit: 99999999999999999999 per 60s is more than one per nanosecond (at most 60000000000 per 60s)",
        ),
        (
            "[plans.a]\nlimits = [{ limit = 2000, window = \"1us\" }]\n",
            "line 2: plans.a.limits[0].limit: 2000 per 1us is more than one per nanosecond (at most 1000 per 1us)",
        ),
        (
            "[plans.a]\nlimit = 99999999999999999999\nwindow = 60\nalgorithm = \"fixed_window\"\n",
            "line 2: plans.a.limit: 99999999999999999999 is too large for fixed_window (at most 4294967295)",
        ),
        (
            "[plans.a]\nlimit = 5000000\nwindow = 60\nalgorithm = \"sliding_window_counter\"\n",
            "line 2: plans.a.limit: 5000000 is too large for sliding_window_counter (at most 4194303)",
        ),
        (
            "[plans.a]\nlimit = 10\nwindow = 60\nburst = 99999999999999999999\n",
            "line 4: plans.a.burst: 99999999999999999999 is too large for this rate (at most 768614336)",
        ),
        (
            "[plans.a]\nlimit = 10\nwindow = 60\nheadroom = 99999999999999999999\n",
            "line 4: plans.a.headroom: 99999999999999999999 leaves nothing of capacity 10 (at most 9)",
        ),
        (
            "[plans.a]\nlimit = 10\nwindow = 60\nheadroom = -1\n",
            "line 4: plans.a.headroom: must not be negative, got -1",
        ),
    ];
    for (src, message) in cases {
        assert_eq!(
            PlanConfig::parse(src).unwrap_err().to_string(),
            message,
            "{src}"
        );
    }
    #[cfg(feature = "http")]
    for (src, message) in [
        (
            "[plans.a]\nlimit = 1\nwindow = 60\n[http]\nmax_keys = 99999999999999999999\n",
            format!(
                "line 5: http.max_keys: 99999999999999999999 is too large (at most {})",
                usize::MAX
            ),
        ),
        (
            "[plans.a]\nlimit = 1\nwindow = 60\n[http]\nmax_keys = 0\n",
            "line 5: http.max_keys: must be at least 1, got 0".to_string(),
        ),
    ] {
        assert_eq!(
            crate::http::HttpConfig::parse(src).unwrap_err().to_string(),
            message,
            "{src}"
        );
    }
    // The largest accepted values are accepted.
    let edge = PlanConfig::parse(
        "[plans.a]\nlimit = 1000\nwindow = \"1us\"\n[plans.b]\nlimit = 1\nwindow = \"53375d\"\n[plans.c]\nlimit = 10\nwindow = 60\nheadroom = 9\n",
    )
    .unwrap();
    assert_eq!(edge.get("a").unwrap().quotas()[0].limit(), 1000);
    assert_eq!(
        edge.get("b").unwrap().quotas()[0].period(),
        Duration::from_secs(53_375 * 86_400)
    );
    assert_eq!(edge.get("c").unwrap().headroom_units(), 9);
}

/// What used to be accepted silently is refused: a plan's own `limit` beside `limits` (they
/// were merged into one compound plan), and `gcra` (the automaton of both buckets).
#[test]
fn config_refuses_what_it_used_to_merge_or_alias() {
    let cases = [
        (
            "[plans.pro]\nlimit = 10\nwindow = \"1s\"\nlimits = [{ limit = 1000, window = \"1d\" }]\n",
            "line 2: plans.pro: `limit` beside `limits`: a plan has either its own `limit` and `window`, or a list of `limits`; write every limit in `limits`",
        ),
        (
            "[plans.pro]\nlimits = [{ limit = 1000, window = \"1d\" }]\nburst = 5\n",
            "line 3: plans.pro: `burst` beside `limits`: a plan has either its own `limit` and `window`, or a list of `limits`; write every limit in `limits`",
        ),
        (
            "[plans.free]\nlimit = 10\nwindow = 60\nalgorithm = \"gcra\"\n",
            "line 4: plans.free.algorithm: unknown algorithm 'gcra': GCRA runs both token_bucket and leaky_bucket here, so write the one you mean",
        ),
        (
            "[plans.free]\nlimits = [{ limit = 10, window = 60, algorithm = \"GCRA\" }]\n",
            "line 2: plans.free.limits[0].algorithm: unknown algorithm 'GCRA': GCRA runs both token_bucket and leaky_bucket here, so write the one you mean",
        ),
        (
            "[plans.free]\nlimit = 10\nwindow = 60\nalgorithm = \"magic\"\n",
            "line 4: plans.free.algorithm: unknown algorithm 'magic' (expected one of token_bucket, leaky_bucket, fixed_window, sliding_window_counter, sliding_window_log)",
        ),
    ];
    for (src, message) in cases {
        assert_eq!(
            PlanConfig::parse(src).unwrap_err().to_string(),
            message,
            "{src}"
        );
    }
    assert_eq!(Algorithm::from_name("gcra"), None);
    for alg in Algorithm::ALL {
        assert_eq!(Algorithm::from_name(alg.name()), Some(alg));
    }
}

/// A config written out (`Serialize`) reads back equal, through TOML and through another format,
/// for every kind of plan: one quota, compound, each algorithm, burst, strategies, headroom,
/// durations of every unit.
#[test]
fn plan_config_written_out_reads_back_equal() {
    let src = r#"
[plans.free]
limit = 100
window = 86400
burst = 10

[plans.pro]
strategy = "soft"
limits = [ { limit = 10, window = "1s" }, { limit = 10000, window = "1d", burst = 100 } ]

[plans.batch]
limit = 10
window = "1.5s"
burst = 1
strategy = "queue"
max_delay = "2s"

[plans.login]
limit = 5
window = "5m"
algorithm = "fixed_window"

[plans.windows]
headroom = 3
limits = [
  { limit = 7, window = "250us", algorithm = "sliding_window_counter" },
  { limit = 9, window = "1h 30m", algorithm = "sliding_window_log" },
  { limit = 11, window = "100ns", algorithm = "leaky_bucket", burst = 5 },
]
"#;
    let config = PlanConfig::parse(src).unwrap();
    let text = toml::to_string(&config).unwrap();
    let again = PlanConfig::parse(&text).unwrap();
    assert_eq!(again, config, "{text}");
    assert_eq!(again.names(), ["free", "pro", "batch", "login", "windows"]);
    // The unit written is the largest that divides the duration; defaults are left out.
    assert!(text.contains("window = \"1500ms\""), "{text}");
    assert!(text.contains("window = \"90m\""), "{text}");
    assert!(text.contains("window = \"1d\""), "{text}");
    assert!(!text.contains("token_bucket"), "{text}");
    let json = serde_json::to_value(&config).unwrap();
    assert_eq!(json["plans"]["login"]["algorithm"], "fixed_window");
    assert_eq!(json["plans"]["batch"]["max_delay"], "2s");
    // Text keeps the plans' order (a `serde_json::Value` would sort them: see `PlanConfig`).
    let from_json: PlanConfig =
        serde_json::from_str(&serde_json::to_string(&config).unwrap()).unwrap();
    assert_eq!(from_json, config);
}
