//! `RateLimitLayer::reload`: a new config in effect on a serving layer without losing what
//! clients spent, with hooks, counters and every clone kept; a config the running limiter
//! cannot take refused with the old one still in effect; reloads racing real requests on a
//! real server never lose or double a unit.
#![cfg(feature = "http")]

mod http_support;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use http_support::{client_from, get as get_req, serve};
use tollgate::FakeClock;
use tollgate::http::{HttpConfig, RateLimitLayer, Rule};

fn app(layer: RateLimitLayer<FakeClock>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/api/x", get(|| async { "api" }))
        .layer(layer)
}

fn config(src: &str) -> HttpConfig {
    HttpConfig::parse(src).unwrap().sweep_interval(None)
}

const BEFORE: &str = "[plans.free]\nlimit = 3\nwindow = \"1h\"\n\n[plans.pro]\nlimit = 10\nwindow = \"1h\"\n\n[http]\nkey = \"ip\"\nheaders = \"github\"\n";

const AFTER: &str = "[plans.free]\nlimit = 5\nwindow = \"1h\"\n\n[plans.pro]\nlimit = 10\nwindow = \"1h\"\n\n[plans.api]\nlimit = 1\nwindow = \"1h\"\n\n[http]\nkey = \"ip\"\nheaders = \"github\"\nexempt = [\"127.0.0.3\"]\napi_keys = { \"k-pro\" = \"pro\" }\n\n[[http.routes]]\npath = \"/api/*\"\nplan = \"api\"\n";

#[tokio::test]
async fn a_reload_keeps_what_clients_spent_and_puts_routes_keys_and_exemptions_in_effect() {
    let clock = FakeClock::new();
    let layer = RateLimitLayer::with_clock(config(BEFORE), clock.clone())
        .unwrap()
        .on_denied(|_| {
            let mut no = Response::new(Full::new(Bytes::from("come back later")));
            *no.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            no
        });
    let handle = layer.clone();
    let addr = serve(app(layer)).await;
    let (one, three, four) = (
        client_from("127.0.0.1"),
        client_from("127.0.0.3"),
        client_from("127.0.0.4"),
    );
    for left in [2, 1] {
        let r = get_req(&one, addr, "/", &[]).await;
        assert_eq!(
            (r.status, r.num("x-ratelimit-remaining")),
            (StatusCode::OK, left)
        );
    }
    // Routes before the reload: none; the exempt address is an ordinary client.
    assert_eq!(
        get_req(&three, addr, "/", &[])
            .await
            .num("x-ratelimit-remaining"),
        2
    );

    handle.reload(config(AFTER)).unwrap();
    // Raised to 5: client .1 keeps the 2 it spent.
    let r = get_req(&one, addr, "/", &[]).await;
    assert_eq!(
        (
            r.status,
            r.num("x-ratelimit-limit"),
            r.num("x-ratelimit-remaining")
        ),
        (StatusCode::OK, 5, 2)
    );
    // The new route rule, and the hook kept: its second request is the custom denial.
    assert_eq!(
        get_req(&four, addr, "/api/x", &[]).await.status,
        StatusCode::OK
    );
    let r = get_req(&four, addr, "/api/x", &[]).await;
    assert_eq!(
        (r.status, r.body.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "come back later")
    );
    // The new exemption: no charge, no headers.
    for _ in 0..8 {
        let r = get_req(&three, addr, "/", &[]).await;
        assert_eq!(
            (r.status, r.header("x-ratelimit-remaining")),
            (StatusCode::OK, None)
        );
    }
    // The new API key table: .4 with the pro key is under pro (10), its own fresh state.
    let r = get_req(&four, addr, "/", &[("x-api-key", "k-pro")]).await;
    assert_eq!(
        (r.num("x-ratelimit-limit"), r.num("x-ratelimit-remaining")),
        (10, 9)
    );

    // What the running limiter was built with cannot change: refused, the config unchanged.
    let err = handle
        .reload(config(
            &AFTER.replace("key = \"ip\"\n", "key = \"ip\"\nmax_keys = 100\n"),
        ))
        .unwrap_err()
        .to_string();
    assert!(err.contains("http.max_keys cannot change"), "{err}");
    // A config `new` would refuse (a route under an unknown plan) is refused too.
    let err = handle
        .reload(config(AFTER).rule(Rule::route("/more", "nope")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("nope"), "{err}");
    // A config with a raised limit refused for another field: the limit is still 5, not 50.
    let raised = config(&AFTER.replace("limit = 5\n", "limit = 50\n"));
    let err = handle
        .reload(raised.api_key_header("no such header"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not a header name"), "{err}");
    // More rules than the layer can number: refused with the rest of the checks, before any
    // plan changes.
    let mut crowded = config(&AFTER.replace("limit = 5\n", "limit = 50\n"));
    for i in 0..=u16::MAX {
        crowded = crowded.rule(Rule::route(format!("/r{i}"), "api"));
    }
    let err = handle.reload(crowded).unwrap_err().to_string();
    assert!(err.contains("rules; at most 65535"), "{err}");
    let r = get_req(&one, addr, "/", &[]).await;
    assert_eq!(
        (
            r.status,
            r.num("x-ratelimit-limit"),
            r.num("x-ratelimit-remaining")
        ),
        (StatusCode::OK, 5, 1)
    );
    assert_eq!(
        get_req(&four, addr, "/api/x", &[]).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );

    // Reloaded once more with the same config: the denial counts go on under their labels.
    handle.reload(config(AFTER)).unwrap();
    // The counters went on across the reloads: 4 requests before, 13 after.
    let text = handle.metrics();
    assert!(
        text.contains("tollgate_http_limited_total{limit=\"rule:/api/*/0\"} 2"),
        "{text}"
    );
    assert!(text.contains("tollgate_http_requests_total 17"), "{text}");
    assert!(text.contains("tollgate_http_exempt_total 8"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_racing_requests_never_lose_or_double_a_unit() {
    // One plan of 300 that every reload keeps; the reloads add and drop a route rule and an
    // exemption (neither matching these requests). 4 clients x 100 requests on one address:
    // exactly 300 pass, whichever config each request saw.
    const PLAN: &str = "[plans.free]\nlimit = 300\nwindow = \"1h\"\n\n[plans.other]\nlimit = 1\nwindow = \"1h\"\n\n[http]\nkey = \"ip\"\nheaders = \"none\"\n";
    let clock = FakeClock::new();
    let layer = RateLimitLayer::with_clock(config(PLAN), clock).unwrap();
    let handle = layer.clone();
    let addr = serve(app(layer)).await;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = std::sync::Arc::clone(&done);
    // Reloads until every client is done, so they overlap the requests by construction.
    let reloader = tokio::spawn(async move {
        let mut reloads = 0;
        for i in 0.. {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            let extra = if i % 2 == 0 {
                "exempt = [\"127.0.0.9\"]\n\n[[http.routes]]\npath = \"/nowhere\"\nplan = \"other\"\n"
            } else {
                ""
            };
            handle.reload(config(&format!("{PLAN}{extra}"))).unwrap();
            reloads += 1;
            tokio::task::yield_now().await;
        }
        (reloads, handle)
    });
    let clients: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                let client = client_from("127.0.0.1");
                let mut ok = 0;
                for _ in 0..100 {
                    if get_req(&client, addr, "/", &[]).await.status == StatusCode::OK {
                        ok += 1;
                    }
                }
                ok
            })
        })
        .collect();
    let mut ok = 0;
    for c in clients {
        ok += c.await.unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (reloads, handle) = reloader.await.unwrap();
    assert_eq!(ok, 300);
    assert!(
        reloads >= 20,
        "only {reloads} reloads overlapped the requests"
    );
    let st = handle.limiter().stats();
    assert_eq!((st.allowed, st.denied), (300, 100));
}
