//! The HTTP layer's cost per request, in process (no sockets): the same axum router called
//! directly with and without `RateLimitLayer`, for each header style, and with tower_governor's
//! `GovernorLayer` (keyed by peer IP, with and without its headers), median of 5 runs, and the
//! difference printed next to the baseline. Every request is admitted.
//!
//! `cargo bench --features http --bench http` (about 30 s after the build). Loopback numbers,
//! sockets included, come from `cargo test --release --features http --test http_load -- --nocapture`.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::Request;
use tollgate::http::{HttpConfig, RateLimitLayer};
use tower::{Service, ServiceExt};

const PER_RUN: u32 = 100_000;
const RUNS: usize = 5;

fn request(peer: SocketAddr) -> Request<Body> {
    let mut r = Request::get("/").body(Body::empty()).unwrap();
    r.extensions_mut().insert(ConnectInfo(peer));
    r
}

/// Median ns per request of `RUNS` runs of `PER_RUN` requests, each from one of 1000 peers.
async fn measure(mut app: Router) -> f64 {
    let mut runs = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        for i in 0..PER_RUN {
            let peer = SocketAddr::from(([10, 0, (i % 1000 / 256) as u8, (i % 256) as u8], 5000));
            let svc = <Router as ServiceExt<Request<Body>>>::ready(&mut app)
                .await
                .unwrap();
            let resp = svc.call(request(peer)).await.unwrap();
            // Every request is admitted (a 429 is another path, of another cost).
            assert_eq!(resp.status(), http::StatusCode::OK);
            black_box(resp);
        }
        runs.push(start.elapsed());
    }
    runs.sort();
    let median: Duration = runs[RUNS / 2];
    median.as_nanos() as f64 / f64::from(PER_RUN)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let hello = || Router::new().route("/", get(|| async { "hello" }));
        let base = measure(hello()).await;
        println!("http: axum router alone (baseline)            {base:8.0} ns/request");
        for headers in [false, true] {
            let mut builder = tower_governor::governor::GovernorConfigBuilder::default();
            builder.per_nanosecond(200_000).burst_size(5000);
            let t = if headers {
                let config = builder.use_headers().finish().unwrap();
                measure(hello().layer(tower_governor::GovernorLayer::new(config))).await
            } else {
                let config = builder.finish().unwrap();
                measure(hello().layer(tower_governor::GovernorLayer::new(config))).await
            };
            println!(
                "http: tower_governor, headers = {:<5}          {t:8.0} ns/request  (+{:.0} ns, {:.2}x the baseline)",
                headers,
                t - base,
                t / base
            );
        }
        for style in ["none", "github", "ietf", "both"] {
            let config = HttpConfig::parse(&format!(
                "[plans.all]\nlimit = 5000\nwindow = \"1s\"\n[http]\nheaders = \"{style}\"\n"
            ))
            .unwrap()
            .sweep_interval(None);
            let layer = RateLimitLayer::new(config).unwrap();
            let t = measure(hello().layer(layer)).await;
            println!(
                "http: with the layer, headers = {style:<7}        {t:8.0} ns/request  (+{:.0} ns, {:.2}x the baseline)",
                t - base,
                t / base
            );
        }
    });
}
