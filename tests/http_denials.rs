//! The HTTP layer's limits are decided before anything is written: a request that a route rule
//! denies leaves the client's own plan as it was, not charged and taken back, so the client's
//! other requests, racing it on the other core, see exactly their own charges. The layer is
//! called in process (the axum router as a tower service) from two threads, so that the
//! requests really interleave at the limiter.
#![cfg(feature = "http")]

use std::net::SocketAddr;
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{Request, StatusCode};
use tollgate::FakeClock;
use tollgate::http::{HttpConfig, RateLimitLayer};
use tower::ServiceExt;

/// The client's own plan holds this many requests an hour.
const LIMIT: u64 = 1_000_000;

fn request(path: &str) -> Request<Body> {
    let mut r = Request::get(path).body(Body::empty()).unwrap();
    r.extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([10, 0, 0, 7], 5000))));
    r
}

/// Sends `path` through `app`: the status and the `x-ratelimit-remaining` header, if any.
fn send(rt: &tokio::runtime::Runtime, app: &Router, path: &str) -> (StatusCode, Option<u64>) {
    let resp = rt.block_on(app.clone().oneshot(request(path))).unwrap();
    let remaining = resp
        .headers()
        .get("x-ratelimit-remaining")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (resp.status(), remaining)
}

#[test]
fn a_route_rule_denial_never_shows_a_charge_on_the_client_plan() {
    let config = HttpConfig::parse(&format!(
        r#"
[plans.client]
limit = {LIMIT}
window = "1h"

[plans.spent]
limit = 1
window = "1h"

[[http.routes]]
path = "/spent"
plan = "spent"
shared = true

[http]
headers = "github"
"#
    ))
    .unwrap()
    .sweep_interval(None);
    let layer = RateLimitLayer::with_clock(config, FakeClock::new()).unwrap();
    let app = Router::new()
        .route("/spent", get(|| async { "spent" }))
        .route("/other", get(|| async { "other" }))
        .layer(layer);
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    };
    // The route's one request, which also creates the client's state.
    let first = rt();
    assert_eq!(send(&first, &app, "/spent").0, StatusCode::OK);
    assert_eq!(
        send(&first, &app, "/spent").0,
        StatusCode::TOO_MANY_REQUESTS
    );

    let barrier = Barrier::new(2);
    let (stop, denying) = (AtomicBool::new(false), AtomicBool::new(false));
    let (denied, overlapped) = (AtomicU64::new(0), AtomicU64::new(0));
    let run = Duration::from_millis(400);
    let (checked, wrong) = std::thread::scope(|s| {
        s.spawn(|| {
            let rt = rt();
            barrier.wait();
            let start = Instant::now();
            while start.elapsed() < run {
                denying.store(true, Ordering::SeqCst);
                for _ in 0..32 {
                    assert_eq!(send(&rt, &app, "/spent").0, StatusCode::TOO_MANY_REQUESTS);
                    denied.fetch_add(1, Ordering::Relaxed);
                }
                denying.store(false, Ordering::SeqCst);
            }
            stop.store(true, Ordering::SeqCst);
        });
        let other = s.spawn(|| {
            let rt = rt();
            barrier.wait();
            // Each request on the plan alone: exactly one unit less each time.
            let (mut checked, mut wrong) = (0u64, Vec::new());
            while !stop.load(Ordering::SeqCst) {
                let during = denying.load(Ordering::SeqCst);
                let (status, remaining) = send(&rt, &app, "/other");
                assert_eq!(status, StatusCode::OK);
                checked += 1;
                let expected = LIMIT - 1 - checked;
                if remaining != Some(expected) {
                    wrong.push((checked, remaining));
                }
                if during && denying.load(Ordering::SeqCst) {
                    overlapped.fetch_add(1, Ordering::Relaxed);
                }
            }
            (checked, wrong)
        });
        other.join().unwrap()
    });
    let (denied, overlapped) = (denied.into_inner(), overlapped.into_inner());
    assert!(denied >= 2_000, "only {denied} denied requests");
    assert!(checked >= 2_000, "only {checked} requests on the plan");
    assert!(
        overlapped >= 500,
        "only {overlapped} of {checked} requests while the other thread was being denied"
    );
    assert!(
        wrong.is_empty(),
        "{} of {checked} requests saw a charge of a denied request, first {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(3)]
    );
    // Nothing of the denied requests stayed charged.
    assert_eq!(send(&rt(), &app, "/other").1, Some(LIMIT - 2 - checked));
}
