//! The HTTP layer's cost per request, in process (no sockets): the same axum router called
//! directly with and without `RateLimitLayer`, for each header style, and with tower_governor's
//! `GovernorLayer` (keyed by peer IP, with and without its headers), median of 9 runs taken in
//! turn (each router once per round), and the difference printed next to the baseline. Both
//! limit each of 1000 peers to 5000/s (burst 5000); every request is admitted.
//!
//! `cargo bench --features http --bench http` in `benches/` (about 30 s after the build). Loopback numbers,
//! sockets included, come from `cargo test --release --features http --test http_load -- --nocapture`.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::Request;
use tollgate::http::{HttpConfig, RateLimitLayer};
use tower::{Service, ServiceExt};

const PER_RUN: u32 = 100_000;
const RUNS: usize = 9;

fn request(peer: SocketAddr) -> Request<Body> {
    let mut r = Request::get("/").body(Body::empty()).unwrap();
    r.extensions_mut().insert(ConnectInfo(peer));
    r
}

/// Ns per request of one run of `PER_RUN` requests, each from one of 1000 peers.
async fn run_once(app: &mut Router) -> f64 {
    let start = Instant::now();
    for i in 0..PER_RUN {
        let peer = SocketAddr::from(([10, 0, (i % 1000 / 256) as u8, (i % 256) as u8], 5000));
        let svc = <Router as ServiceExt<Request<Body>>>::ready(app)
            .await
            .unwrap();
        let resp = svc.call(request(peer)).await.unwrap();
        // Every request is admitted (a 429 is another path, of another cost).
        assert_eq!(resp.status(), http::StatusCode::OK);
        black_box(resp);
    }
    start.elapsed().as_nanos() as f64 / f64::from(PER_RUN)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let hello = || Router::new().route("/", get(|| async { "hello" }));
        let governor = |headers: bool| {
            let mut builder = tower_governor::governor::GovernorConfigBuilder::default();
            builder.per_nanosecond(200_000).burst_size(5000);
            if headers {
                let config = builder.use_headers().finish().unwrap();
                hello().layer(tower_governor::GovernorLayer::new(config))
            } else {
                let config = builder.finish().unwrap();
                hello().layer(tower_governor::GovernorLayer::new(config))
            }
        };
        let ours = |style: &str| {
            let config = HttpConfig::parse(&format!(
                "[plans.all]\nlimit = 5000\nwindow = \"1s\"\n[http]\nheaders = \"{style}\"\n"
            ))
            .unwrap()
            .sweep_interval(None);
            hello().layer(RateLimitLayer::new(config).unwrap())
        };
        let mut apps = vec![
            ("axum router alone (baseline)".to_string(), hello()),
            (
                "tower_governor, headers = false".to_string(),
                governor(false),
            ),
            ("tower_governor, headers = true".to_string(), governor(true)),
        ];
        for style in ["none", "github", "ietf", "both"] {
            apps.push((format!("with the layer, headers = {style}"), ours(style)));
        }
        if let Ok(only) = std::env::var("TOLLGATE_HTTP_ONLY") {
            // For a profile (`valgrind --tool=callgrind`): one run of the one app named.
            let (_, app) = apps
                .iter_mut()
                .find(|(name, _)| name.contains(only.as_str()))
                .expect("no such app");
            black_box(run_once(app).await);
            return;
        }
        // Runs interleaved (each app once per round), so a slow spell of this shared machine
        // falls on every app alike; medians.
        let mut runs = vec![Vec::with_capacity(RUNS); apps.len()];
        for _ in 0..RUNS {
            for (i, (_, app)) in apps.iter_mut().enumerate() {
                runs[i].push(run_once(app).await);
            }
        }
        let medians: Vec<f64> = runs
            .iter_mut()
            .map(|r| {
                r.sort_by(f64::total_cmp);
                r[RUNS / 2]
            })
            .collect();
        let base = medians[0];
        println!("http: {:<40} {base:8.0} ns/request", apps[0].0);
        for ((name, _), t) in apps.iter().zip(&medians).skip(1) {
            println!(
                "http: {name:<40} {t:8.0} ns/request  (+{:.0} ns, {:.2}x the baseline)",
                t - base,
                t / base
            );
        }
    });
}
