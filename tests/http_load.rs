//! A bounded load test on loopback: a fixed number of requests (and a wall-time cap) against the
//! same axum app with and without the rate-limit layer, reporting the layer's added latency per
//! request. No speed is asserted (the machine is shared); what is asserted is exact: every
//! response, every count, and, under concurrent clients on one key, exactly `burst` admitted.
//!
//! For meaningful numbers run it optimised:
//! `cargo test --release --features http --test http_load -- --nocapture`
#![cfg(feature = "http")]

mod http_support;

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use http_support::{client_from, get as get_req, serve};
use tollgate::FakeClock;
use tollgate::http::{HttpConfig, RateLimitLayer};

/// Requests per server in the latency phase.
const REQUESTS: usize = 2_000;
/// Requests per server before measuring (connections, caches, allocator).
const WARMUP: usize = 200;
/// The latency phase stops here even if the count is not reached (a slow, shared machine).
const WALL_CAP: Duration = Duration::from_secs(60);

fn hello() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_added_latency_per_request() {
    // A limit no request reaches, so every request does the full work and passes.
    let config = HttpConfig::parse("[plans.all]\nlimit = 1000000000\nwindow = \"1s\"\n")
        .unwrap()
        .sweep_interval(None);
    let layer = RateLimitLayer::new(config).unwrap();
    let bare = serve(hello()).await;
    let limited = serve(hello().layer(layer.clone())).await;
    let client = client_from("127.0.0.1");
    for _ in 0..WARMUP {
        assert_eq!(
            get_req(&client, bare, "/", &[]).await.status,
            StatusCode::OK
        );
        assert_eq!(
            get_req(&client, limited, "/", &[]).await.status,
            StatusCode::OK
        );
    }
    let mut without = Vec::with_capacity(REQUESTS);
    let mut with = Vec::with_capacity(REQUESTS);
    let start = Instant::now();
    // Interleaved, so both servers see the same machine noise.
    while with.len() < REQUESTS && start.elapsed() < WALL_CAP {
        let t = Instant::now();
        let r = get_req(&client, bare, "/", &[]).await;
        without.push(t.elapsed());
        assert_eq!(r.status, StatusCode::OK);
        assert!(r.header("x-ratelimit-remaining").is_none());

        let t = Instant::now();
        let r = get_req(&client, limited, "/", &[]).await;
        with.push(t.elapsed());
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, "hello");
        assert_eq!(r.num("x-ratelimit-limit"), 1_000_000_000);
        assert!(r.header("ratelimit").is_some());
    }
    let n = with.len();
    assert!(n >= 100, "only {n} requests in {WALL_CAP:?}");
    let stats = layer.limiter().stats();
    assert_eq!(stats.allowed, (WARMUP + n) as u64);
    assert_eq!(stats.denied, 0);
    without.sort();
    with.sort();
    let mean = |v: &[Duration]| v.iter().sum::<Duration>() / v.len() as u32;
    let (m0, m1) = (percentile(&without, 50), percentile(&with, 50));
    println!(
        "http_load: {n} sequential keep-alive requests per server on loopback, 2 tokio workers \
         ({} build)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!(
        "  without layer: mean {:?}, p50 {:?}, p99 {:?}",
        mean(&without),
        m0,
        percentile(&without, 99)
    );
    println!(
        "  with layer:    mean {:?}, p50 {:?}, p99 {:?}",
        mean(&with),
        m1,
        percentile(&with, 99)
    );
    println!(
        "  added by the layer: {:?} at p50, {:?} in the mean",
        m1.saturating_sub(m0),
        mean(&with).saturating_sub(mean(&without))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_on_one_key_admit_exactly_the_burst() {
    // A frozen clock: nothing refills, so exactly `burst` of the requests may pass however the
    // concurrent connections interleave.
    const CLIENTS: usize = 8;
    const EACH: usize = 150;
    const BURST: u64 = 500;
    let clock = FakeClock::new();
    let config = HttpConfig::parse(&format!("[plans.all]\nlimit = {BURST}\nwindow = \"1h\"\n"))
        .unwrap()
        .sweep_interval(None);
    let layer = RateLimitLayer::with_clock(config, clock).unwrap();
    let addr = serve(hello().layer(layer.clone())).await;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        tasks.push(tokio::spawn(async move {
            // One connection per task, all from the same address: one key.
            let client = client_from("127.0.0.1");
            let (mut ok, mut limited, mut remaining_seen) = (0u64, 0u64, Vec::new());
            for _ in 0..EACH {
                let r = get_req(&client, addr, "/", &[]).await;
                match r.status {
                    StatusCode::OK => {
                        ok += 1;
                        remaining_seen.push(r.num("x-ratelimit-remaining"));
                    }
                    StatusCode::TOO_MANY_REQUESTS => limited += 1,
                    s => panic!("unexpected status {s}"),
                }
            }
            (ok, limited, remaining_seen)
        }));
    }
    let (mut ok, mut limited, mut remaining) = (0, 0, Vec::new());
    let mut interleaved = 0;
    for t in tasks {
        let (o, l, r) = t.await.unwrap();
        ok += o;
        limited += l;
        // A task whose consecutive admitted requests saw remaining counts more than one apart
        // had another connection's request decided in between: the clients really contended.
        if r.windows(2).any(|w| w[0] > w[1] + 1) {
            interleaved += 1;
        }
        remaining.extend(r);
    }
    assert!(interleaved >= 2, "the connections never interleaved");
    let total = (CLIENTS * EACH) as u64;
    assert_eq!(ok, BURST);
    assert_eq!(limited, total - BURST);
    // Every admitted request saw a distinct remaining count: 499 down to 0, each exactly once.
    remaining.sort_unstable();
    assert_eq!(remaining, (0..BURST).collect::<Vec<_>>());
    let stats = layer.limiter().stats();
    assert_eq!((stats.allowed, stats.denied), (BURST, total - BURST));
    println!(
        "http_load: {total} requests from {CLIENTS} concurrent connections in {:?}; {BURST} \
         admitted, {} answered 429; CAS retries in the engine: {}",
        start.elapsed(),
        total - BURST,
        stats.cas_retries
    );
}
