//! Shadow mode in the HTTP layer (a dry run) for the whole layer, one rule, or one plan: the
//! requests a limit in shadow mode would deny pass unmarked, it adds no headers, and the
//! counters say exactly what enforcing would have done. Real server, real client.
#![cfg(feature = "http")]

mod http_support;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use http_support::{Reply, client_from, get as get_req, serve};
use tollgate::FakeClock;
use tollgate::http::{HttpConfig, RateLimitLayer};

async fn start(src: &str) -> (RateLimitLayer<FakeClock>, std::net::SocketAddr) {
    let config = HttpConfig::parse(src).unwrap().sweep_interval(None);
    let layer = RateLimitLayer::with_clock(config, FakeClock::new()).unwrap();
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/api/x", get(|| async { "api" }))
        .layer(layer.clone());
    (layer.clone(), serve(app).await)
}

/// The value of the Prometheus line `series` (with its labels) in `text`.
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// Every `tollgate_http_limited_total` series summed (one per limit that can deny).
fn limited(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("tollgate_http_limited_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

fn rate_headers(r: &Reply) -> Vec<&str> {
    r.headers
        .keys()
        .map(|k| k.as_str())
        .filter(|k| k.starts_with("x-ratelimit") || k.starts_with("ratelimit") || *k == "warning")
        .collect()
}

#[tokio::test]
async fn a_layer_in_shadow_mode_never_denies_adds_no_headers_and_counts_what_it_would_deny() {
    let (layer, addr) = start(
        "[plans.free]\nlimit = 2\nwindow = \"1h\"\n\n[http]\nkey = \"ip\"\nheaders = \"both\"\nshadow = true\n\n[plans.api]\nlimit = 1\nwindow = \"1h\"\n\n[[http.routes]]\npath = \"/api/*\"\nplan = \"api\"\n",
    )
    .await;
    let client = client_from("127.0.0.1");
    for _ in 0..5 {
        let r = get_req(&client, addr, "/", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(rate_headers(&r), Vec::<&str>::new());
    }
    for _ in 0..3 {
        assert_eq!(
            get_req(&client, addr, "/api/x", &[]).await.status,
            StatusCode::OK
        );
    }
    let text = layer.metrics();
    // The plan: 2 admitted, 6 it would have denied (5 + 3 - 2); the route: 1 and 2.
    assert_eq!(
        metric(
            &text,
            "tollgate_plan_decisions_total{plan=\"free\",outcome=\"allowed\"}"
        ),
        2
    );
    assert_eq!(
        metric(
            &text,
            "tollgate_plan_decisions_total{plan=\"free\",outcome=\"shadow_passed\"}"
        ),
        6
    );
    assert_eq!(
        metric(
            &text,
            "tollgate_plan_decisions_total{plan=\"api\",outcome=\"allowed\"}"
        ),
        1
    );
    assert_eq!(
        metric(
            &text,
            "tollgate_plan_decisions_total{plan=\"api\",outcome=\"shadow_passed\"}"
        ),
        2
    );
    // Requests with at least one limit that would have denied: 3 on "/", 3 on the route.
    assert_eq!(metric(&text, "tollgate_http_shadow_passed_total"), 6);
    assert_eq!(limited(&text), 0);
}

#[tokio::test]
async fn a_rule_in_shadow_mode_counts_on_its_own_and_the_others_still_enforce() {
    let (layer, addr) = start(
        "[plans.free]\nlimit = 4\nwindow = \"1h\"\n\n[plans.api]\nlimit = 1\nwindow = \"1h\"\n\n[http]\nkey = \"ip\"\nheaders = \"github\"\n\n[[http.routes]]\npath = \"/api/*\"\nplan = \"api\"\nshadow = true\n",
    )
    .await;
    let client = client_from("127.0.0.1");
    // The rule would deny from the second request on; the plan (4) enforces, and its headers
    // are the only ones.
    let mut seen = Vec::new();
    for _ in 0..5 {
        let r = get_req(&client, addr, "/api/x", &[]).await;
        let left = r.header("x-ratelimit-remaining").map(str::to_string);
        seen.push((
            r.status.as_u16(),
            r.header("x-ratelimit-limit").map(str::to_string),
            left,
        ));
    }
    let s = |n: &str| Some(n.to_string());
    assert_eq!(
        seen,
        [
            (200, s("4"), s("3")),
            (200, s("4"), s("2")),
            (200, s("4"), s("1")),
            (200, s("4"), s("0")),
            (429, s("4"), s("0")),
        ]
    );
    let text = layer.metrics();
    // The rule's twin: 1 admitted, 3 it would have denied, 1 denied elsewhere (the plan's 429).
    let twin = |outcome: &str| {
        metric(
            &text,
            &format!("tollgate_plan_decisions_total{{plan=\"api@shadow\",outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(
        (
            twin("allowed"),
            twin("shadow_passed"),
            twin("denied_elsewhere")
        ),
        (1, 3, 1)
    );
    assert_eq!(metric(&text, "tollgate_http_shadow_passed_total"), 3);
    assert_eq!(limited(&text), 1);
    assert_eq!(
        metric(&text, "tollgate_http_limited_total{limit=\"plan:free/0\"}"),
        1
    );
}

#[tokio::test]
async fn a_plan_in_shadow_mode_adds_no_headers_while_an_enforcing_rule_does() {
    let (layer, addr) = start(
        "[plans.free]\nlimit = 1\nwindow = \"1h\"\nstrategy = \"shadow\"\n\n[plans.api]\nlimit = 2\nwindow = \"1h\"\n\n[http]\nkey = \"ip\"\nheaders = \"github\"\n\n[[http.routes]]\npath = \"/api/*\"\nplan = \"api\"\n",
    )
    .await;
    let client = client_from("127.0.0.1");
    let r = get_req(&client, addr, "/", &[]).await;
    assert_eq!(
        (r.status, rate_headers(&r)),
        (StatusCode::OK, Vec::<&str>::new())
    );
    let r = get_req(&client, addr, "/", &[]).await;
    assert_eq!(
        (r.status, rate_headers(&r)),
        (StatusCode::OK, Vec::<&str>::new())
    );
    let statuses: Vec<(u16, u64)> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            let r = get_req(&client, addr, "/api/x", &[]).await;
            v.push((r.status.as_u16(), r.num("x-ratelimit-limit")));
        }
        v
    };
    assert_eq!(statuses, [(200, 2), (200, 2), (429, 2)]);
    let text = layer.metrics();
    let free = |outcome: &str| {
        metric(
            &text,
            &format!("tollgate_plan_decisions_total{{plan=\"free\",outcome=\"{outcome}\"}}"),
        )
    };
    // free: 1 admitted, then 3 it would deny (2 on "/", 1 on the route), 1 peeked after the
    // rule's denial.
    assert_eq!(
        (
            free("allowed"),
            free("shadow_passed"),
            free("denied_elsewhere")
        ),
        (1, 3, 1)
    );
}
