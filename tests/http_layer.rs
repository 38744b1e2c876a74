//! The HTTP layer end to end: a real axum server on loopback, a real hyper client (connecting
//! from chosen loopback addresses), header values checked exactly against the engine's
//! decisions on a shared fake clock.
#![cfg(feature = "http")]

mod http_support;

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{get, post};
use http::StatusCode;
use http_support::{client_from, get as get_req, send, serve};
use tollgate::http::{ClientKey, HttpConfig, HttpKey, KeySource, OnBadKey, RateLimitLayer};
use tollgate::{FAKE_UNIX_EPOCH_S, FakeClock, Limiter, PlanConfig};

const FREE: &str = r#"
[plans.free]
limit = 5
window = "1m"
burst = 3
"#;

fn app(layer: RateLimitLayer<FakeClock>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/login", post(|| async { "tried" }))
        .route("/api/{*rest}", get(|| async { "api" }))
        .layer(layer)
}

fn layer(src: &str, clock: &FakeClock) -> RateLimitLayer<FakeClock> {
    let config = HttpConfig::parse(src).unwrap().sweep_interval(None);
    RateLimitLayer::with_clock(config, clock.clone()).unwrap()
}

/// X-RateLimit-Reset as the layer computes it: the Unix second (rounded up) when the key is full.
fn unix_reset(clock_now_ns: u64, after_ns: u64) -> u64 {
    (FAKE_UNIX_EPOCH_S * 1_000_000_000 + clock_now_ns + after_ns).div_ceil(1_000_000_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_match_the_engine_and_the_429_is_the_seeds() {
    let clock = FakeClock::new();
    let addr = serve(app(layer(FREE, &clock))).await;
    // The engine on the same plan and clock, as the reference.
    let reference = Limiter::<u64, _>::builder()
        .plans(PlanConfig::parse(FREE).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let client = client_from("127.0.0.2");
    for i in 0..3u64 {
        let r = get_req(&client, addr, "/", &[]).await;
        let want = reference.check(&0);
        assert!(want.is_allowed());
        assert_eq!(r.status, StatusCode::OK, "request {i}");
        assert_eq!(r.body, "hello");
        assert_eq!(r.num("x-ratelimit-limit"), want.limit());
        assert_eq!(r.num("x-ratelimit-remaining"), want.remaining());
        assert_eq!(
            r.num("x-ratelimit-reset"),
            unix_reset(clock_now(&clock), want.reset_after_ns())
        );
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"free\";q=5;w=60;burst=3")
        );
        assert_eq!(
            r.header("ratelimit"),
            Some(
                format!(
                    "\"free\";r={};t={}",
                    want.remaining(),
                    want.reset_after_ns().div_ceil(1_000_000_000)
                )
                .as_str()
            )
        );
        clock.advance(Duration::from_secs(1));
    }
    // The same values written out by hand (T = 12 s, burst 3): after three requests at 0, 1 and
    // 2 s the bucket is empty until 36 s.
    let r = get_req(&client, addr, "/", &[]).await; // at 3 s
    let want = reference.check(&0);
    assert!(!want.is_allowed());
    assert_eq!(want.retry_after(), Duration::from_secs(9));
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("9"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(r.num("x-ratelimit-reset"), FAKE_UNIX_EPOCH_S + 36);
    assert_eq!(r.header("ratelimit"), Some("\"free\";r=0;t=33"));
    let body: serde_json::Value = serde_json::from_str(&r.body).expect("the 429 body is JSON");
    assert_eq!(
        body,
        serde_json::json!({
            "error": "Rate limit exceeded",
            "message": "You have exceeded your 5 requests per minute limit",
            // 1_700_006_400 is 2023-11-15T00:00:00Z; 3 s + 9 s later.
            "reset_at": "2023-11-15T00:00:12Z",
        })
    );
    // Nothing was charged by the denial: at 12 s one unit is back.
    clock.set_ns(12_000_000_000);
    assert_eq!(
        get_req(&client, addr, "/", &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get_req(&client, addr, "/", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

fn clock_now(clock: &FakeClock) -> u64 {
    use tollgate::Clock;
    clock.now()
}

const COMPOUND: &str = r#"
[plans.free]
limit = 5
window = "1m"
burst = 3

[plans.pro]
limits = [ { limit = 4, window = "1s" }, { limit = 100, window = "1h", burst = 10 } ]

[plans.global]
limit = 6
window = "1m"

[http]
api_keys = { "k-pro" = "pro" }

[http.global]
plan = "global"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_part_of_every_limit_is_listed() {
    let clock = FakeClock::new();
    let layer = layer(COMPOUND, &clock);
    let addr = serve(app(layer.clone())).await;
    let client = client_from("127.0.0.3");
    let pro = [("x-api-key", "k-pro")];
    let policy = "\"pro.0\";q=4;w=1, \"pro.1\";q=100;w=3600;burst=10, \"global\";q=6;w=60";
    // pro.0: T = 250 ms, burst 4; pro.1: T = 36 s, burst 10; global: T = 10 s, burst 6.
    let expected = [
        "\"pro.0\";r=3;t=1, \"pro.1\";r=9;t=36, \"global\";r=5;t=10",
        "\"pro.0\";r=2;t=1, \"pro.1\";r=8;t=72, \"global\";r=4;t=20",
        "\"pro.0\";r=1;t=1, \"pro.1\";r=7;t=108, \"global\";r=3;t=30",
        "\"pro.0\";r=0;t=1, \"pro.1\";r=6;t=144, \"global\";r=2;t=40",
    ];
    for (i, want) in expected.iter().enumerate() {
        let r = get_req(&client, addr, "/", &pro).await;
        assert_eq!(r.status, StatusCode::OK, "request {i}");
        assert_eq!(r.header("ratelimit-policy"), Some(policy));
        assert_eq!(r.header("ratelimit"), Some(*want), "request {i}");
        // GitHub style: the binding limit (least remaining), the latest reset.
        assert_eq!(r.num("x-ratelimit-limit"), 4);
        assert_eq!(r.num("x-ratelimit-remaining"), 3 - i as u64);
        assert_eq!(
            r.num("x-ratelimit-reset"),
            FAKE_UNIX_EPOCH_S + 36 * (i as u64 + 1)
        );
    }
    // The 5th in the same instant: pro.0 denies; pro.1 (after it in the plan) and global (after
    // the plan) are only peeked: they report what a request would leave.
    let r = get_req(&client, addr, "/", &pro).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(
        r.header("ratelimit"),
        Some("\"pro.0\";r=0;t=1, \"pro.1\";r=5;t=180, \"global\";r=1;t=50")
    );
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        body["message"],
        "You have exceeded your 4 requests per second limit"
    );
    assert_eq!(body["reset_at"], "2023-11-15T00:00:01Z");
    // One second later pro.0 is full again; the global limit (6/min) has 2 units left and is
    // the one that denies the third request; the pro parts charged for it are refunded.
    clock.advance(Duration::from_secs(1));
    for _ in 0..2 {
        assert_eq!(
            get_req(&client, addr, "/", &pro).await.status,
            StatusCode::OK
        );
    }
    let r = get_req(&client, addr, "/", &pro).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        body["message"],
        "You have exceeded your 6 requests per minute limit"
    );
    // global: TAT = 60 s at t = 1 s; the next unit conforms at TAT + T - burst*T = 10 s.
    assert_eq!(r.header("retry-after"), Some("9"));
    // The refunded pro parts report what they hold without this request (the engine's
    // convention for compound parts), reset included: pro.1 holds 6 units of 36 s (TAT 216 s
    // at t = 1 s, full 215 s later; charged, it would have said 251).
    assert_eq!(
        r.header("ratelimit"),
        Some("\"pro.0\";r=2;t=1, \"pro.1\";r=4;t=215, \"global\";r=0;t=59")
    );
    // The refund really happened: pro.0 still holds 2 units, so a request would leave 1.
    let pro_key = HttpKey {
        rule: None,
        client: ClientKey::Ip("127.0.0.3".parse().unwrap()),
    };
    let pro_plan = layer.limiter().plan("pro").unwrap();
    let peek = layer.limiter().peek_in(&pro_key, pro_plan, 1).unwrap();
    assert_eq!((peek.is_allowed(), peek.remaining()), (true, 1));
    // A free client shares the global limit, which is spent: denied by `global`.
    let other = client_from("127.0.0.4");
    let r = get_req(&other, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"free\";q=5;w=60;burst=3, \"global\";q=6;w=60")
    );
}

const PROXIED: &str = r#"
[plans.free]
limit = 3
window = "1m"

[http]
trusted_proxies = ["127.0.0.1"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let clock = FakeClock::new();
    let layer = layer(PROXIED, &clock);
    let addr = serve(app(layer.clone())).await;
    // From 127.0.0.2 (not a trusted proxy): a new X-Forwarded-For each time does not help.
    let untrusted = client_from("127.0.0.2");
    let mut statuses = Vec::new();
    for i in 0..5 {
        let xff = format!("198.51.100.{i}");
        statuses.push(
            get_req(&untrusted, addr, "/", &[("x-forwarded-for", &xff)])
                .await
                .status,
        );
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let peer_key = HttpKey {
        rule: None,
        client: ClientKey::Ip("127.0.0.2".parse().unwrap()),
    };
    assert!(!layer.limiter().peek(&peer_key).is_allowed());
    // From the trusted proxy 127.0.0.1, each forwarded client is its own.
    let proxy = client_from("127.0.0.1");
    for i in 0..5 {
        let xff = format!("203.0.113.{i}, 127.0.0.1");
        let r = get_req(&proxy, addr, "/", &[("x-forwarded-for", &xff)]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.num("x-ratelimit-remaining"), 2);
    }
    // A client-written hop left of the real client is not believed either: the proxy appended
    // 203.0.113.50, which is untrusted, so that is the key whatever came before it.
    for spoof in ["10.0.0.1", "1.2.3.4", "garbage"] {
        let xff = format!("{spoof}, 203.0.113.50");
        let _ = get_req(&proxy, addr, "/", &[("x-forwarded-for", &xff)]).await;
    }
    let r = get_req(&proxy, addr, "/", &[("x-forwarded-for", "203.0.113.50")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(layer.limiter().len(), 7); // 127.0.0.2, five 203.0.113.x, .50
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_addresses_in_one_ipv6_slash_64_are_one_client() {
    let clock = FakeClock::new();
    let layer = layer(PROXIED, &clock);
    let addr = serve(app(layer.clone())).await;
    let proxy = client_from("127.0.0.1");
    let mut statuses = Vec::new();
    for ip in [
        "2001:db8:aa:bb::1",
        "2001:db8:aa:bb:dead:beef:0:1",
        "2001:db8:aa:bb:ffff:ffff:ffff:ffff",
        "2001:db8:aa:bb::",
        "[2001:db8:aa:bb:1:2:3:4]:443",
    ] {
        statuses.push(
            get_req(&proxy, addr, "/", &[("x-forwarded-for", ip)])
                .await
                .status,
        );
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // The next /64 is another client; so is an IPv4-mapped address, folded to IPv4.
    let r = get_req(
        &proxy,
        addr,
        "/",
        &[("x-forwarded-for", "2001:db8:aa:bc::1")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = get_req(
        &proxy,
        addr,
        "/",
        &[("x-forwarded-for", "::ffff:192.0.2.1")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let key = |ip: &str| HttpKey {
        rule: None,
        client: ClientKey::Ip(ip.parse().unwrap()),
    };
    assert!(!layer.limiter().peek(&key("2001:db8:aa:bb::")).is_allowed());
    assert_eq!(layer.limiter().peek(&key("192.0.2.1")).remaining(), 1);
    assert_eq!(layer.limiter().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_and_missing_keys_get_the_configured_behaviour() {
    let clock = FakeClock::new();
    // Peer fallback: a trusted proxy sending garbage is keyed by the proxy itself.
    let peer = layer(PROXIED, &clock);
    let addr = serve(app(peer.clone())).await;
    let proxy = client_from("127.0.0.1");
    let long = "1.2.3.4, ".repeat(5000);
    for bad in [
        "",
        "unknown",
        "[::1",
        "1.2.3.4:99999",
        &long,
        "_hidden, 1.2.3.4",
        "1.2.3.4, _hidden",
    ] {
        let r = get_req(&proxy, addr, "/", &[("x-forwarded-for", bad)]).await;
        assert!(
            r.status == StatusCode::OK || r.status == StatusCode::TOO_MANY_REQUESTS,
            "{bad:?}"
        );
    }
    let proxy_key = HttpKey {
        rule: None,
        client: ClientKey::Ip("127.0.0.1".parse().unwrap()),
    };
    // "" has no hop: the proxy itself is the client. "_hidden, 1.2.3.4" and the 5,000 hops are
    // client 1.2.3.4 (the walk stops at the first untrusted hop and never reads what the
    // client wrote left of it, however much). The other four are malformed where the walk
    // reads them and fall back to the peer: 5 requests on the proxy's key of 3.
    assert!(!peer.limiter().peek(&proxy_key).is_allowed());
    assert_eq!(peer.limiter().len(), 2);
    assert!(
        peer.metrics().contains("tollgate_http_bad_key_total 4\n"),
        "{}",
        peer.metrics()
    );

    // Reject: an API-key-keyed layer answers 400 to a request without a usable (known) key.
    let src = format!(
        "{PROXIED}key = \"api_key\"\non_bad_key = \"reject\"\napi_keys = {{ \"good-key\" = \"free\" }}\n"
    );
    let strict = layer(&src, &clock);
    let addr = serve(app(strict.clone())).await;
    let client = client_from("127.0.0.5");
    let r = get_req(&client, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["message"], "the API key header is missing");
    let huge = "k".repeat(300);
    let r = get_req(&client, addr, "/", &[("x-api-key", &huge)]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = get_req(&client, addr, "/", &[("x-api-key", "good-key")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(strict.limiter().len(), 1);

    // Shared: every keyless request in one bucket.
    let src = format!("{PROXIED}key = \"api_key\"\non_bad_key = \"shared\"\n");
    let shared = layer(&src, &clock);
    let addr = serve(app(shared.clone())).await;
    for local in ["127.0.0.6", "127.0.0.7", "127.0.0.8", "127.0.0.9"] {
        let _ = get_req(&client_from(local), addr, "/", &[]).await;
    }
    let everyone = HttpKey {
        rule: None,
        client: ClientKey::Unidentified,
    };
    assert!(!shared.limiter().peek(&everyone).is_allowed());
}

const STRATEGIES: &str = r#"
[plans.free]
limit = 2
window = "1m"

[plans.soft]
limit = 2
window = "1m"
strategy = "soft"

[plans.batch]
limit = 4
window = "1s"
burst = 1
strategy = "queue"
max_delay = "600ms"

[plans.login]
limit = 2
window = "5m"
algorithm = "fixed_window"

[http]
api_keys = { "k-soft" = "soft", "k-batch" = "batch" }

[[http.routes]]
path = "/login"
methods = ["POST"]
plan = "login"
"#;

const PRIORITY: &str = r#"
[plans.free]
limit = 2
window = "1m"

[plans.paid]
limit = 100
window = "1m"

[plans.global]
limit = 10
window = "1h"

[plans.global_free]
limit = 10
window = "1h"
headroom = 5

[http]
api_keys = { "k-paid" = "paid" }

[http.global]
plan = "global"
tiers = { free = "global_free" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_queue_route_and_priority_strategies() {
    let clock = FakeClock::new();
    let addr = serve(app(layer(STRATEGIES, &clock))).await;
    let client = client_from("127.0.0.10");

    // Soft: over the limit, passed with a warning; nothing charged, so remaining stays 0.
    let soft = [("x-api-key", "k-soft")];
    for _ in 0..2 {
        let r = get_req(&client, addr, "/", &soft).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("warning"), None);
    }
    let r = get_req(&client, addr, "/", &soft).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, "hello");
    assert_eq!(
        r.header("warning"),
        Some("199 tollgate \"rate limit exceeded; passed by the soft limit\"")
    );
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));

    // Route rule: POST /login has its own 2 per 5 min on top of the plan; GET / does not.
    let other = client_from("127.0.0.11");
    let login = |c| send(c, addr, "POST", "/login", &[]);
    assert_eq!(login(&other).await.status, StatusCode::OK);
    let r = login(&other).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.header("ratelimit-policy")
            .unwrap()
            .contains("\"/login\";q=2;w=300")
    );
    let r = login(&other).await;
    // The free plan (2/min) and the login route (2/5min) are both spent; free is checked first.
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    clock.advance(Duration::from_secs(60));
    let r = login(&other).await; // free has refilled; the fixed 5-minute window has not
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        body["message"],
        "You have exceeded your 2 requests per 5 minutes limit"
    );
    assert_eq!(get_req(&other, addr, "/", &[]).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_by_plan_on_a_shared_limit() {
    // Free clients are checked on the shared global key under `global_free` (the same 10/h,
    // headroom 5), paid ones under `global`: free traffic stops while 5 units are left, and
    // those go to paid clients.
    let clock = FakeClock::new();
    let layer = layer(PRIORITY, &clock);
    let addr = serve(app(layer.clone())).await;
    let mut free = Vec::new();
    for i in 1..=7 {
        let c = client_from(&format!("127.0.1.{i}"));
        free.push(get_req(&c, addr, "/", &[]).await.status == StatusCode::OK);
    }
    assert_eq!(free, [true, true, true, true, true, false, false]);
    let paid_client = client_from("127.0.2.1");
    let mut paid = Vec::new();
    for _ in 0..6 {
        let r = get_req(&paid_client, addr, "/", &[("x-api-key", "k-paid")]).await;
        paid.push(r.status == StatusCode::OK);
    }
    assert_eq!(paid, [true, true, true, true, true, false]);
    let global = HttpKey {
        rule: Some(0),
        client: ClientKey::Unidentified,
    };
    // The global rule's state (the default plan, `free`, is another rule: its own state).
    let limiter = layer.limiter();
    let plan = limiter.plan("global").unwrap();
    assert!(!limiter.peek_in(&global, plan, 1).unwrap().is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_strategy_holds_then_forwards_or_429s() {
    // Real time: the queue sleeps on tokio's clock, and the limiter reads the monotonic clock.
    let config = HttpConfig::parse(STRATEGIES).unwrap().sweep_interval(None);
    let layer = RateLimitLayer::new(config).unwrap();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "hello" }))
            .layer(layer.clone()),
    )
    .await;
    let client = client_from("127.0.0.13");
    let batch = [("x-api-key", "k-batch")];
    // 4/s, burst 1: T = 250 ms. The first passes at once, the next two are held about 250 and
    // 500 ms (within max_delay 600 ms), the fourth would wait 750 ms: 429.
    let start = Instant::now();
    assert_eq!(
        get_req(&client, addr, "/", &batch).await.status,
        StatusCode::OK
    );
    let (a, b, c) = tokio::join!(
        get_req(&client, addr, "/", &batch),
        get_req(&client, addr, "/", &batch),
        get_req(&client, addr, "/", &batch),
    );
    let elapsed = start.elapsed();
    let mut statuses = [a.status, b.status, c.status];
    statuses.sort();
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // The held requests waited for their slots (a lower bound is the contract; no upper bound
    // is asserted on a shared machine).
    assert!(elapsed >= Duration::from_millis(450), "{elapsed:?}");
    let metrics = layer.metrics();
    assert!(
        metrics.contains("tollgate_http_queued_total 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_http_limited_total{limit=\"plan:batch/0\"} 1\n"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_resolver_user_extractor_and_composite_keys() {
    let clock = FakeClock::new();
    let src = r#"
[plans.free]
limit = 1
window = "1m"

[plans.pro]
limit = 3
window = "1m"

[http]
key = ["user", "ip"]
"#;
    let layer = layer(src, &clock)
        .user(|parts| {
            parts
                .headers
                .get("x-user")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })
        .resolver(|parts, client| {
            let user = parts.headers.get("x-user").cloned();
            let composite = matches!(client, ClientKey::Composite(_));
            Box::pin(async move {
                tokio::task::yield_now().await; // a real await, as a database lookup would
                (composite && user.is_some_and(|u| u == "alice")).then(|| "pro".to_string())
            })
        });
    let addr = serve(app(layer.clone())).await;
    let client = client_from("127.0.0.14");
    let alice = [("x-user", "alice")];
    let bob = [("x-user", "bob")];
    for want in [2, 1, 0] {
        let r = get_req(&client, addr, "/", &alice).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.num("x-ratelimit-remaining"), want);
        assert_eq!(r.header("ratelimit-policy"), Some("\"pro\";q=3;w=60"));
    }
    assert_eq!(
        get_req(&client, addr, "/", &alice).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get_req(&client, addr, "/", &bob).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get_req(&client, addr, "/", &bob).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Same user from another address: another composite key.
    let elsewhere = client_from("127.0.0.15");
    assert_eq!(
        get_req(&elsewhere, addr, "/", &bob).await.status,
        StatusCode::OK
    );
    let key = HttpKey {
        rule: None,
        client: ClientKey::Composite(
            vec![
                ClientKey::User("bob".into()),
                ClientKey::Ip("127.0.0.15".parse().unwrap()),
            ]
            .into(),
        ),
    };
    assert!(!layer.limiter().peek(&key).is_allowed());
    // No user: the peer fallback (its own key, the default plan).
    assert_eq!(
        get_req(&client, addr, "/", &[]).await.status,
        StatusCode::OK
    );
    // A request without a user is anonymous, not a bad key.
    let metrics = layer.metrics();
    assert!(
        metrics.contains("tollgate_http_anonymous_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tollgate_http_bad_key_total 0\n"),
        "{metrics}"
    );
}

#[test]
fn config_mistakes_are_errors_with_lines() {
    let cases = [
        (
            "[plans.free]\nlimit = 1\nwindow = 1\n[http]\nkey = \"cookie\"\n",
            "line 5: http.key: unknown key source 'cookie' (expected ip, api_key or user)",
        ),
        (
            "[plans.free]\nlimit = 1\nwindow = 1\n[http]\ntrusted_proxies = [\"10.0.0.1/8\"]\n",
            "line 5: http.trusted_proxies: '10.0.0.1/8': host bits are set below the /8 prefix",
        ),
        (
            "[plans.free]\nlimit = 1\nwindow = 1\n[http]\ndefault_plan = \"gold\"\n",
            "line 5: http.default_plan: unknown plan 'gold'",
        ),
        (
            "[plans.free]\nlimit = 1\nwindow = 1\n[http]\n\n[[http.routes]]\npath = \"login\"\nplan = \"free\"\n",
            "line 7: http.routes[0].path: must start with '/'",
        ),
        (
            "[plans.free]\nlimit = 1\nwindow = 1\n[http]\nipv6_prefix = 129\n",
            "line 5: http.ipv6_prefix: must be 0..=128, got 129",
        ),
        (
            "[plans.free]\nlimit = 1\nwindow = 1\n[http]\nbogus = 1\n",
            "line 5: http.bogus: unknown field `bogus`, expected one of `default_plan`, `key`, `api_key_header`, `forwarded_header`, `trusted_proxies`, `ipv6_prefix`, `on_bad_key`, `headers`, `max_keys`, `sweep_interval`, `api_keys`, `exempt`, `exempt_keys`, `shadow`, `exempt_paths`, `routes`, `global`",
        ),
        (
            "[plans.free]\nlimit = 0\nwindow = 1\n",
            "line 2: plans.free.limit: must be at least 1, got 0",
        ),
        // Type errors name the dotted field and say what it accepts, in words.
        (
            "[plans.free]\nlimit = \"ten\"\nwindow = 60\n",
            "line 2: plans.free.limit: invalid type: string \"ten\", expected an integer",
        ),
        (
            "[plans.free]\nlimit = 10\nwindow = 1.5\n",
            "line 3: plans.free.window: expected a duration: whole seconds (60) or text (\"1m30s\", \"1.5s\", \"1h 30m\")",
        ),
        (
            "[plans.free]\nlimit = 1\nwindow = 1\n[http]\ntrusted_proxies = \"10.0.0.0/8\"\n",
            "line 5: http.trusted_proxies: invalid type: string \"10.0.0.0/8\", expected a list",
        ),
        (
            "[plans.free]\nlimit = 1\nwindow = 1\n[http]\nsweep_interval = 10\n",
            "line 5: http.sweep_interval: invalid type: integer `10`, expected a string",
        ),
        // A key that would do nothing is an error, not ignored.
        (
            "[plans.free]\nlimit = 10\nwindow = 60\nalgorithm = \"fixed_window\"\nburst = 5\n",
            "line 5: plans.free.burst: only token_bucket and leaky_bucket have a burst; fixed_window admits `limit` per window",
        ),
        // A value that does not fit is named on its own line, not the limit's.
        (
            "[plans.free]\nlimit = 10\nwindow = 60\nburst = 100000000000000000\n",
            "line 4: plans.free.burst: 100000000000000000 is too large for this rate (at most 768614336)",
        ),
        (
            "[plans.free]\nlimit = 10\nwindow = \"200000d\"\n",
            "line 3: plans.free.window: 200000d is longer than the longest window, 53375d",
        ),
    ];
    for (src, want) in cases {
        assert_eq!(
            HttpConfig::parse(src).unwrap_err().to_string(),
            want,
            "{src}"
        );
    }
    // The shipped example parses, and builds a layer.
    let example =
        HttpConfig::from_file(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plans.toml")).unwrap();
    let layer =
        RateLimitLayer::new(example.key([KeySource::Ip]).on_bad_key(OnBadKey::Peer)).unwrap();
    assert_eq!(
        layer.limiter().plan_names(),
        ["free", "pro", "batch", "login", "global", "global_free"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_plain_hyper_1_server() {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    use tower::{Layer, ServiceBuilder};

    let clock = FakeClock::new();
    let layer = layer(PROXIED, &clock);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = layer.clone();
    tokio::spawn(async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            // hyper has no connect info of its own: the peer goes in as a `SocketAddr` extension.
            let handler = tower::service_fn(|_req: http::Request<hyper::body::Incoming>| async {
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"hi"))))
            });
            let svc = ServiceBuilder::new()
                .map_request(move |mut req: http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(peer);
                    req
                })
                .service(serving.layer(handler));
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(svc)),
            );
        }
    });
    let client = client_from("127.0.0.20");
    for want in [2, 1, 0] {
        let r = get_req(&client, addr, "/", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, "hi");
        assert_eq!(r.num("x-ratelimit-remaining"), want);
    }
    let r = get_req(&client, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("20"));
    let key = HttpKey {
        rule: None,
        client: ClientKey::Ip("127.0.0.20".parse().unwrap()),
    };
    assert!(!layer.limiter().peek(&key).is_allowed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_header_when_configured_and_only_that_one() {
    let clock = FakeClock::new();
    let src = format!("{PROXIED}forwarded_header = \"forwarded\"\n");
    let layer = layer(&src, &clock);
    let addr = serve(app(layer.clone())).await;
    let proxy = client_from("127.0.0.1");
    let fwd = [(
        "forwarded",
        "for=198.51.100.9;proto=http, for=\"127.0.0.1:8080\"",
    )];
    for want in [2, 1, 0] {
        let r = get_req(&proxy, addr, "/", &fwd).await;
        assert_eq!(r.num("x-ratelimit-remaining"), want);
    }
    // X-Forwarded-For is not the configured header: the proxy itself is the client.
    let r = get_req(&proxy, addr, "/", &[("x-forwarded-for", "198.51.100.9")]).await;
    assert_eq!(
        (r.status, r.num("x-ratelimit-remaining")),
        (StatusCode::OK, 2)
    );
    let key = |ip: &str| HttpKey {
        rule: None,
        client: ClientKey::Ip(ip.parse().unwrap()),
    };
    assert!(!layer.limiter().peek(&key("198.51.100.9")).is_allowed());
    assert_eq!(layer.limiter().peek(&key("127.0.0.1")).remaining(), 1);
}

/// The plain path (a layer keyed by address alone decides from the request's head as it is)
/// answers every request exactly as the general path: the same layer with a cost hook (which
/// takes the general path) on a twin clock gets the same statuses, bodies, rate-limit headers
/// and counters, for passes, 429s, soft passes, queued passes, API-key plans, forwarded
/// clients and a malformed forwarding header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_path_answers_as_the_general_path() {
    const CONFIG: &str = r#"
[plans.free]
limit = 3
window = "1m"
burst = 2
[plans.pro]
strategy = "soft"
limits = [ { limit = 2, window = "1s" }, { limit = 100, window = "1h", burst = 4 } ]
[plans.batch]
limit = 20
window = "1s"
burst = 1
strategy = "queue"
max_delay = "2s"
[http]
key = "ip"
trusted_proxies = ["127.0.0.1"]
on_bad_key = "peer"
headers = "both"
api_keys = { "k-pro" = "pro", "k-batch" = "batch" }
"#;
    let (plain_clock, general_clock) = (FakeClock::new(), FakeClock::new());
    let plain = layer(CONFIG, &plain_clock);
    let general = layer(CONFIG, &general_clock).cost(|_| 1);
    let (plain_addr, general_addr) = (
        serve(app(plain.clone())).await,
        serve(app(general.clone())).await,
    );
    let (direct, proxy) = (client_from("127.0.0.2"), client_from("127.0.0.1"));
    let requests: [(&_, &[(&str, &str)]); 7] = [
        (&direct, &[]),
        (&proxy, &[("x-forwarded-for", "203.0.113.7")]),
        (&direct, &[("x-api-key", "k-pro")]),
        (
            &proxy,
            &[("x-forwarded-for", "203.0.113.8"), ("x-api-key", "k-batch")],
        ),
        (&direct, &[("x-api-key", "unknown")]),
        (&proxy, &[("x-forwarded-for", "not an address")]),
        (&proxy, &[]),
    ];
    let shown = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit",
        "ratelimit-policy",
        "retry-after",
        "warning",
        "content-type",
    ];
    let (mut denied, mut soft) = (0, 0);
    for round in 0..6 {
        for (i, (client, headers)) in requests.iter().enumerate() {
            for _ in 0..2 {
                let a = get_req(client, plain_addr, "/", headers).await;
                let b = get_req(client, general_addr, "/", headers).await;
                let at = format!("round {round}, request {i}");
                assert_eq!(a.status, b.status, "{at}");
                assert_eq!(a.body, b.body, "{at}");
                for name in shown {
                    assert_eq!(a.header(name), b.header(name), "{at}: {name}");
                }
                denied += usize::from(a.status == StatusCode::TOO_MANY_REQUESTS);
                soft += usize::from(a.header("warning").is_some());
            }
        }
        plain_clock.advance(Duration::from_millis(700));
        general_clock.advance(Duration::from_millis(700));
    }
    // Every kind of answer came up, and both layers counted the same (the samples of their
    // `/metrics`, in any order).
    let samples = |l: &RateLimitLayer<FakeClock>| {
        let text = l.metrics();
        let mut lines: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    };
    let counted = samples(&plain);
    assert!(denied > 0 && soft > 0, "{denied} {soft}");
    assert!(counted.contains(&"tollgate_http_queued_total 6".to_string()));
    assert!(counted.contains(&"tollgate_http_bad_key_total 12".to_string()));
    assert_eq!(counted, samples(&general));
}
