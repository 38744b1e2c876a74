//! Statistics per plan and per rule: exact decision counts for each plan (through `check`,
//! `check_in`, a compound plan and `check_all`, summing to the limiter's totals, kept across a
//! plan change), states and evictions per rule (a rule shared by two plans is one rule), and the
//! HTTP layer's `/metrics`, fetched from a real server, parsed as Prometheus text with a counter
//! per plan.

use tollgate::{FakeClock, Limiter, OnFull, Plan, Quota, check_all};

fn by_plan(l: &Limiter<u64, FakeClock>) -> Vec<(String, u64, u64)> {
    l.plan_stats()
        .into_iter()
        .map(|p| (p.plan, p.allowed, p.denied))
        .collect()
}

#[test]
fn each_plan_counts_its_own_decisions_exactly() {
    let clock = FakeClock::new();
    let l = Limiter::<u64, _>::builder()
        .quota(Quota::per_minute(3))
        .plan("pro", Plan::new([Quota::per_minute(5)]))
        .plan(
            "both",
            Plan::new([Quota::per_minute(2), Quota::per_hour(100)]),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let (pro, both) = (l.plan("pro").unwrap(), l.plan("both").unwrap());
    for _ in 0..4 {
        let _ = l.check(&1); // default: 3 allowed, 1 denied
    }
    for _ in 0..6 {
        let _ = l.check_in(&2, pro, 1).unwrap(); // pro: 5 allowed, 1 denied
    }
    for _ in 0..3 {
        let _ = l.check_in(&3, both, 1).unwrap(); // both: 2 allowed, 1 denied
    }
    assert_eq!(
        by_plan(&l),
        [
            ("default".to_string(), 3, 1),
            ("pro".to_string(), 5, 1),
            ("both".to_string(), 2, 1)
        ]
    );
    let st = l.stats();
    assert_eq!(
        (st.allowed, st.denied),
        (10, 3),
        "the plans sum to the totals"
    );

    // check_all counts in each part's plan what that plan decided: the global limit denies the
    // third call; the per-user part, charged then refunded, did not deny it.
    let global = Limiter::<()>::builder()
        .quota(Quota::per_minute(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    for _ in 0..3 {
        let _ = check_all(&[&l.key_in(&9, pro), &global.key(&())], 1).unwrap();
    }
    assert_eq!(by_plan(&l)[1], ("pro".to_string(), 7, 1));
    assert_eq!(l.plan_stats()[1].denied_elsewhere, 1);
    let g = global.plan_stats();
    assert_eq!((g[0].allowed, g[0].denied), (2, 1));
    assert_eq!(l.check_in(&9, pro, 1).unwrap().remaining(), 2, "refunded");

    // A plan changed on the live limiter keeps counting under its name.
    l.set_plan("pro", Plan::new([Quota::per_minute(50)]))
        .unwrap();
    assert!(l.check_in(&2, pro, 1).unwrap().is_allowed());
    assert_eq!(by_plan(&l)[1], ("pro".to_string(), 9, 1));
}

/// (allowed, denied, denied_elsewhere) of plan `i`.
fn decided<K: std::hash::Hash + Eq + Clone + Send + Sync + 'static>(
    l: &Limiter<K, FakeClock>,
    i: usize,
) -> (u64, u64, u64) {
    let p = &l.plan_stats()[i];
    (p.allowed, p.denied, p.denied_elsewhere)
}

/// In `check_all` each plan counts what it decided. A request that the user's plan admitted
/// and the global limit denied is `denied` under the global limit and `denied_elsewhere` under
/// the user's plan (its charge refunded), not `denied` there; so is a request the global limit
/// denied before the user's plan was asked, and a part after the one that denied. The
/// limiters' totals are the sums.
#[test]
fn check_all_counts_a_denial_under_the_part_that_denied() {
    let clock = FakeClock::new();
    let users = Limiter::<u64, _>::builder()
        .quota(Quota::per_minute(10))
        .plan("pro", Plan::new([Quota::per_minute(100)]))
        .clock(clock.clone())
        .build()
        .unwrap();
    let global = Limiter::<()>::builder()
        .quota(Quota::per_minute(2))
        .clock(clock.clone())
        .build()
        .unwrap();
    let pro = users.plan("pro").unwrap();
    let allowed: Vec<bool> = (0..3)
        .map(|_| {
            check_all(&[&users.key_in(&1, pro), &global.key(&())], 1)
                .unwrap()
                .is_allowed()
        })
        .collect();
    assert_eq!(allowed, [true, true, false]);
    assert_eq!(decided(&users, 1), (2, 0, 1), "pro admitted the third");
    assert_eq!(decided(&global, 0), (2, 1, 0), "the global limit denied it");
    // The global limit first: it denies, and the user's plan is never charged.
    assert!(
        !check_all(&[&global.key(&()), &users.key_in(&1, pro)], 1)
            .unwrap()
            .is_allowed()
    );
    assert_eq!(decided(&users, 1), (2, 0, 2));
    assert_eq!(decided(&global, 0), (2, 2, 0));
    // Three parts: pro admits, the global limit denies, the default plan after it is not asked.
    assert!(
        !check_all(
            &[&users.key_in(&2, pro), &global.key(&()), &users.key(&2)],
            1
        )
        .unwrap()
        .is_allowed()
    );
    assert_eq!(decided(&users, 1), (2, 0, 3));
    assert_eq!(decided(&users, 0), (0, 0, 1));
    assert_eq!(decided(&global, 0), (2, 3, 0));
    let (u, g) = (users.stats(), global.stats());
    assert_eq!((u.allowed, u.denied, u.denied_elsewhere), (2, 0, 4));
    assert_eq!((g.allowed, g.denied, g.denied_elsewhere), (2, 3, 0));
    // Only what pro admitted stays charged for key 1: 2 of 100, so one more leaves 97.
    assert_eq!(users.peek_in(&1, pro, 1).unwrap().remaining(), 97);
}

#[test]
fn each_rule_reports_its_states_and_evictions() {
    let clock = FakeClock::new();
    // "free" and "team" list the same quota: one rule, one state per key, both plans named.
    let l = Limiter::<u64, _>::builder()
        .quota(Quota::per_second(1))
        .plan("free", Plan::new([Quota::per_minute(10)]))
        .plan(
            "team",
            Plan::new([Quota::per_minute(10), Quota::per_hour(500).burst(50)]),
        )
        .max_keys(8)
        // One shard: an eviction's neighbourhood is the whole (small) table, so every new key
        // below evicts, whatever the per-process hash placed where.
        .shards(1)
        .on_full(OnFull::EvictFresh)
        .clock(clock.clone())
        .build()
        .unwrap();
    let (free, team) = (l.plan("free").unwrap(), l.plan("team").unwrap());
    for k in 0..3 {
        assert!(l.check_in(&k, free, 1).unwrap().is_allowed());
    }
    assert!(l.check_in(&0, team, 1).unwrap().is_allowed()); // key 0 shares its "free" state; adds one hourly state
    let rules = l.rule_stats();
    let view: Vec<(&str, Vec<&str>, u64)> = rules
        .iter()
        .map(|r| {
            (
                r.rule.as_str(),
                r.plans.iter().map(String::as_str).collect(),
                r.keys,
            )
        })
        .collect();
    assert_eq!(
        view,
        [
            ("token_bucket 1/1s", vec!["default.0"], 0),
            ("token_bucket 10/1m", vec!["free.0", "team.0"], 3),
            ("token_bucket 500/1h burst 50", vec!["team.1"], 1),
        ]
    );
    // Fill the cap with default-plan states, let every state go fresh, then bring new keys:
    // fresh states are evicted, and each eviction counts under its own rule.
    for k in 100..104 {
        assert!(l.check(&k).is_allowed());
    }
    assert_eq!(l.len(), 8);
    clock.advance(std::time::Duration::from_secs(3600));
    for k in 200..208 {
        assert!(l.check(&k).is_allowed());
    }
    let rules = l.rule_stats();
    let evicted: u64 = rules.iter().map(|r| r.evictions).sum();
    assert_eq!(evicted, 8, "{rules:?}");
    assert_eq!(evicted, l.stats().evictions);
    assert_eq!(
        rules[0].keys, 8,
        "only the new default-plan states are left"
    );
    assert_eq!((rules[1].keys, rules[2].keys), (0, 0));
    assert_eq!(rules[1].evictions, 3);
    assert_eq!(rules[2].evictions, 1);
    assert_eq!(rules[0].evictions, 4);
}

#[cfg(feature = "http")]
#[path = "http_support/mod.rs"]
mod http_support;

#[cfg(feature = "http")]
mod http_metrics {
    use std::collections::HashMap;

    /// Samples by (name, labels).
    type Samples = HashMap<(String, Vec<(String, String)>), f64>;

    use super::http_support::{client_from, get as get_req, serve};
    use axum::Router;
    use axum::routing::get;
    use http::StatusCode;
    use tollgate::FakeClock;
    use tollgate::http::{HttpConfig, RateLimitLayer};

    /// Parses Prometheus text (exposition format 0.0.4): every sample line is
    /// `name{label="value",...} number`, every sample's family has a `# TYPE` line before it,
    /// and no series repeats. Returns the samples as `(name, labels) -> value`.
    fn parse(text: &str) -> Samples {
        let mut types: HashMap<String, String> = HashMap::new();
        let mut samples = HashMap::new();
        for line in text.lines() {
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
                assert!(
                    ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                    "{line}"
                );
                types.insert(name.to_string(), kind.to_string());
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            assert!(!line.starts_with('#'), "unknown comment: {line}");
            let (series, value) = line.rsplit_once(' ').expect("a sample: series value");
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("value in {line}"));
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => {
                    let body = rest.strip_suffix('}').expect("labels end with }");
                    let labels = body
                        .split("\",")
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once("=\"").expect("label=\"value\"");
                            (k.to_string(), v.trim_end_matches('"').to_string())
                        })
                        .collect();
                    (name, labels)
                }
                None => (series, Vec::new()),
            };
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
                "metric name {name}"
            );
            assert!(types.contains_key(name), "no # TYPE before {line}");
            let old = samples.insert((name.to_string(), labels), value);
            assert!(old.is_none(), "series twice: {line}");
        }
        samples
    }

    fn sample(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
        let key = (
            name.to_string(),
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        *samples
            .get(&key)
            .unwrap_or_else(|| panic!("no {name}{labels:?}"))
    }

    #[tokio::test]
    async fn metrics_parse_as_prometheus_text_with_counters_per_plan() {
        let config = HttpConfig::parse(
            "[plans.free]\nlimit = 2\nwindow = \"1m\"\n\
             [plans.pro]\nlimit = 5\nwindow = \"1m\"\n\
             [http]\nkey = \"ip\"\ndefault_plan = \"free\"\n\
             [http.api_keys]\nk-pro = \"pro\"\n",
        )
        .unwrap()
        .sweep_interval(None);
        let layer = RateLimitLayer::with_clock(config, FakeClock::new()).unwrap();
        let scrape = layer.clone();
        let app = Router::new()
            .route("/", get(|| async { "hello" }))
            .layer(layer)
            .route(
                "/metrics",
                get(move || {
                    let l = scrape.clone();
                    async move { l.metrics() }
                }),
            );
        let addr = serve(app).await;
        let client = client_from("127.0.0.1");
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(get_req(&client, addr, "/", &[]).await.status);
        }
        for _ in 0..6 {
            statuses.push(
                get_req(&client, addr, "/", &[("x-api-key", "k-pro")])
                    .await
                    .status,
            );
        }
        let ok = |n| vec![StatusCode::OK; n];
        let want: Vec<StatusCode> = [
            ok(2),
            vec![StatusCode::TOO_MANY_REQUESTS],
            ok(5),
            vec![StatusCode::TOO_MANY_REQUESTS],
        ]
        .concat();
        assert_eq!(statuses, want);
        let text = get_req(&client, addr, "/metrics", &[]).await.body;
        let s = parse(&text);
        let plan = |p, o| {
            sample(
                &s,
                "tollgate_plan_decisions_total",
                &[("plan", p), ("outcome", o)],
            )
        };
        assert_eq!(plan("free", "allowed"), 2.0, "{text}");
        assert_eq!(plan("free", "denied"), 1.0);
        assert_eq!(plan("pro", "allowed"), 5.0);
        assert_eq!(plan("pro", "denied"), 1.0);
        assert_eq!(
            sample(&s, "tollgate_decisions_total", &[("outcome", "allowed")]),
            7.0
        );
        assert_eq!(sample(&s, "tollgate_http_requests_total", &[]), 9.0);
        // One denial by each plan, each under its own label.
        for label in ["plan:free/0", "plan:pro/0"] {
            assert_eq!(
                sample(&s, "tollgate_http_limited_total", &[("limit", label)]),
                1.0
            );
        }
        assert_eq!(
            sample(
                &s,
                "tollgate_http_limited_total",
                &[("limit", "table_full")]
            ),
            0.0
        );
        assert_eq!(
            sample(&s, "tollgate_rule_keys", &[("rule", "token_bucket 2/1m")]),
            1.0
        );
        assert!(text.contains("# TYPE tollgate_plan_decisions_total counter"));
    }

    /// The HTTP layer counts as `check_all` does: a request its client plan admitted and the
    /// global rule denied is `denied_elsewhere` under the client plan, and one the client plan
    /// denied is `denied_elsewhere` under the global rule's plan (only peeked).
    #[tokio::test]
    async fn a_rule_that_denies_is_the_one_that_counts_the_denial() {
        let config = HttpConfig::parse(
            "[plans.free]\nlimit = 3\nwindow = \"1m\"\n\
             [plans.global]\nlimit = 4\nwindow = \"1m\"\n\
             [http]\nkey = \"ip\"\ndefault_plan = \"free\"\n\
             [http.global]\nplan = \"global\"\n",
        )
        .unwrap()
        .sweep_interval(None);
        let layer = RateLimitLayer::with_clock(config, FakeClock::new()).unwrap();
        let limiter = layer.limiter().clone();
        let app = Router::new()
            .route("/", get(|| async { "hello" }))
            .layer(layer);
        let addr = serve(app).await;
        let (a, b) = (client_from("127.0.0.1"), client_from("127.0.0.2"));
        let mut statuses = Vec::new();
        // a: 3 pass, the 4th is free's denial; b: 1 passes (the global limit's 4th unit), the
        // next is the global limit's denial.
        for client in [&a, &a, &a, &a, &b, &b] {
            statuses.push(get_req(client, addr, "/", &[]).await.status);
        }
        let (ok, limited) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(statuses, [ok, ok, ok, limited, ok, limited]);
        let counts: Vec<(String, u64, u64, u64)> = limiter
            .plan_stats()
            .into_iter()
            .map(|p| (p.plan, p.allowed, p.denied, p.denied_elsewhere))
            .collect();
        let want = |plan: &str, a, d, e| (plan.to_string(), a, d, e);
        assert!(counts.contains(&want("free", 4, 1, 1)), "{counts:?}");
        assert!(counts.contains(&want("global", 4, 1, 1)), "{counts:?}");
    }
}
