//! The HTTP layer's ways around the limit, closed, and its extension points, each with a real
//! server on loopback and a real client: a hostile client that rotates API keys, one that forges
//! `X-Forwarded-For` from an untrusted peer, anonymous clients behind a trusted proxy, a custom
//! key extractor, a custom denial, exemptions, costs, refunds after the response, a real tonic
//! server and client, and TOML layouts without an `[http]` line.
#![cfg(feature = "http")]

mod http_support;

use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;
use http_support::{client_from, get as get_req, send, serve, serve_without_connect_info};
use tollgate::FakeClock;
use tollgate::http::{ClientKey, HttpConfig, HttpKey, RateLimitLayer};

fn app(layer: RateLimitLayer<FakeClock>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/login", post(|| async { "tried" }))
        .route(
            "/fail",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "broken") }),
        )
        .layer(layer)
}

fn layer(src: &str, clock: &FakeClock) -> RateLimitLayer<FakeClock> {
    let config = HttpConfig::parse(src).unwrap().sweep_interval(None);
    RateLimitLayer::with_clock(config, clock.clone()).unwrap()
}

fn own(client: ClientKey) -> HttpKey {
    HttpKey { rule: None, client }
}

fn ip(s: &str) -> ClientKey {
    ClientKey::Ip(s.parse().unwrap())
}

const API_KEYED: &str = r#"
[plans.free]
limit = 3
window = "1m"

[plans.pro]
limit = 100
window = "1m"

[http]
key = "api_key"
trusted_proxies = ["127.0.0.1"]
api_keys = { "k-pro" = "pro" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_made_up_api_keys_does_not_reset_the_limit() {
    let clock = FakeClock::new();
    let layer = layer(API_KEYED, &clock);
    let addr = serve(app(layer.clone())).await;
    let hostile = client_from("127.0.0.21");
    // Three requests without a key spend the address's free plan.
    for _ in 0..3 {
        assert_eq!(
            get_req(&hostile, addr, "/", &[]).await.status,
            StatusCode::OK
        );
    }
    // Every made-up key is the same client: its address, under the default plan.
    for i in 0..20 {
        let key = format!("random-{i}");
        let r = get_req(&hostile, addr, "/", &[("x-api-key", &key)]).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{key}");
        assert_eq!(r.header("ratelimit-policy"), Some("\"free\";q=3;w=60"));
    }
    assert_eq!(layer.limiter().len(), 1);
    assert!(!layer.limiter().peek(&own(ip("127.0.0.21"))).is_allowed());
    // A known key is its own client, on its own plan.
    let r = get_req(&hostile, addr, "/", &[("x-api-key", "k-pro")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.num("x-ratelimit-remaining"), 99);
    // The three requests without a key are anonymous; the twenty made-up keys are bad.
    let metrics = layer.metrics();
    for line in [
        "tollgate_http_anonymous_total 3\n",
        "tollgate_http_bad_key_total 20\n",
        "tollgate_http_limited_total{limit=\"plan:free/0\"} 20\n",
    ] {
        assert!(metrics.contains(line), "{line}in {metrics}");
    }

    // Configured to reject: an unknown key is a 400 naming why, and charges nothing.
    let strict = self::layer(&format!("{API_KEYED}on_bad_key = \"reject\"\n"), &clock);
    let addr = serve(app(strict.clone())).await;
    let r = get_req(&hostile, addr, "/", &[("x-api-key", "made-up")]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["message"], "the API key is not known");
    assert_eq!(strict.limiter().len(), 0);

    // A resolver that does not know a key (`None`) sends it the same way.
    let resolved = self::layer(API_KEYED, &clock).resolver(|parts, _| {
        let known = parts.headers.get("x-api-key").is_some_and(|k| k == "k-db");
        Box::pin(async move { known.then(|| "pro".to_string()) })
    });
    let addr = serve(app(resolved.clone())).await;
    let other = client_from("127.0.0.22");
    for i in 0..5 {
        let want = if i < 3 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        let key = format!("rotated-{i}");
        assert_eq!(
            get_req(&other, addr, "/", &[("x-api-key", &key)])
                .await
                .status,
            want
        );
    }
    let r = get_req(&other, addr, "/", &[("x-api-key", "k-db")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("ratelimit-policy"), Some("\"pro\";q=100;w=60"));
    assert!(
        resolved
            .limiter()
            .peek(&own(ClientKey::ApiKey("k-db".into())))
            .is_allowed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_fallback_walks_trusted_proxies_and_ignores_forged_headers() {
    let clock = FakeClock::new();
    let layer = layer(API_KEYED, &clock);
    let addr = serve(app(layer.clone())).await;
    // Behind the trusted proxy (127.0.0.1), anonymous clients are told apart by the address it
    // forwards: each has its own three requests.
    let proxy = client_from("127.0.0.1");
    for client in ["203.0.113.1", "203.0.113.2"] {
        for want in [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
        ] {
            let r = get_req(&proxy, addr, "/", &[("x-forwarded-for", client)]).await;
            assert_eq!(r.status, want, "{client}");
        }
        assert!(!layer.limiter().peek(&own(ip(client))).is_allowed());
    }
    // An unknown key behind the proxy falls back to the same forwarded address.
    let r = get_req(
        &proxy,
        addr,
        "/",
        &[("x-forwarded-for", "203.0.113.1"), ("x-api-key", "nope")],
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // From an untrusted peer, a forged X-Forwarded-For is ignored: rotating it changes nothing.
    let forger = client_from("127.0.0.23");
    for i in 0..6 {
        let forged = format!("198.51.100.{i}");
        let r = get_req(&forger, addr, "/", &[("x-forwarded-for", &forged)]).await;
        let want = if i < 3 {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(r.status, want, "{forged}");
    }
    assert!(!layer.limiter().peek(&own(ip("127.0.0.23"))).is_allowed());
    assert!(layer.limiter().peek(&own(ip("198.51.100.0"))).is_allowed());
    assert_eq!(layer.limiter().len(), 3);
}

const FREE: &str = r#"
[plans.free]
limit = 2
window = "1m"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_key_extractor_keys_or_rejects() {
    let clock = FakeClock::new();
    let layer = layer(FREE, &clock).key_extractor(|parts| {
        match parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()) {
            // What an axum handler would return: no `http-body-util` or `bytes` needed.
            Some(t) if !t.is_empty() => Ok(ClientKey::user(t)),
            _ => Err((StatusCode::UNAUTHORIZED, "tenant required")),
        }
    });
    let addr = serve(app(layer.clone())).await;
    let client = client_from("127.0.0.24");
    let r = get_req(&client, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.body, "tenant required");
    for (tenant, want) in [
        ("acme", StatusCode::OK),
        ("acme", StatusCode::OK),
        ("acme", StatusCode::TOO_MANY_REQUESTS),
        ("globex", StatusCode::OK),
    ] {
        let r = get_req(&client, addr, "/", &[("x-tenant", tenant)]).await;
        assert_eq!(r.status, want, "{tenant}");
    }
    let acme = own(ClientKey::User("acme".into()));
    assert!(!layer.limiter().peek(&acme).is_allowed());
    assert_eq!(layer.limiter().len(), 2);
    assert!(
        layer
            .metrics()
            .contains("tollgate_http_rejected_bad_key_total 1\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_denial_keeps_its_own_headers_and_gets_ours() {
    let clock = FakeClock::new();
    let layer = layer(FREE, &clock).on_denied(|d| {
        let body = format!(
            "{} denied {}: retry in {} s",
            d.limit,
            d.client,
            d.decision.retry_after().as_secs()
        );
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        resp.headers_mut()
            .insert("x-ratelimit-limit", "custom".parse().unwrap());
        resp
    });
    let addr = serve(app(layer)).await;
    let client = client_from("127.0.0.25");
    for _ in 0..2 {
        assert_eq!(
            get_req(&client, addr, "/", &[]).await.status,
            StatusCode::OK
        );
    }
    let r = get_req(&client, addr, "/", &[]).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.body, "free denied ip:127.0.0.25: retry in 30 s");
    assert_eq!(r.header("retry-after"), Some("30"));
    assert_eq!(r.header("x-ratelimit-limit"), Some("custom"));
    assert_eq!(r.num("x-ratelimit-remaining"), 0);
    assert_eq!(r.header("ratelimit"), Some("\"free\";r=0;t=60"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exempt_keys_and_networks_pass_uncharged() {
    let clock = FakeClock::new();
    let src = r#"
[plans.free]
limit = 2
window = "1m"

[http]
key = ["api_key", "ip"]
trusted_proxies = ["127.0.0.1"]
api_keys = { "k-monitor" = "free", "k-user" = "free" }
exempt = ["127.0.0.40", "192.0.2.0/24"]
exempt_keys = ["k-monitor"]
"#;
    let layer = layer(src, &clock);
    let addr = serve(app(layer.clone())).await;
    let exempt_host = client_from("127.0.0.40");
    let other = client_from("127.0.0.41");
    let proxy = client_from("127.0.0.1");
    for _ in 0..10 {
        let r = get_req(&exempt_host, addr, "/", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("x-ratelimit-limit"), None);
        let r = get_req(&other, addr, "/", &[("x-api-key", "k-monitor")]).await;
        assert_eq!(r.status, StatusCode::OK);
        // Behind the trusted proxy, the forwarded address is the one tested.
        let r = get_req(&proxy, addr, "/", &[("x-forwarded-for", "192.0.2.9")]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    assert_eq!(layer.limiter().len(), 0);
    assert!(layer.metrics().contains("tollgate_http_exempt_total 30\n"));
    // A forged header from an untrusted peer is not believed; other keys are limited.
    for want in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        let r = get_req(&other, addr, "/", &[("x-forwarded-for", "192.0.2.9")]).await;
        assert_eq!(r.status, want);
    }
    let r = get_req(&other, addr, "/", &[("x-api-key", "k-user")]).await;
    assert_eq!(r.num("x-ratelimit-remaining"), 1);
}

/// A local proxy and a local monitor share one exempt network. A remote client behind the proxy
/// whose forwarding header the walk cannot finish (65 hops of its own, or an unterminated
/// quote) must not borrow the proxy's exemption: it is charged like anyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_the_walk_cannot_read_never_borrows_the_proxys_exemption() {
    let clock = FakeClock::new();
    for (header, value, client) in [
        (
            "x-forwarded-for",
            // 65 hops the client wrote, and the one the proxy appended: the client.
            format!("{}198.51.100.9", "203.0.113.1, ".repeat(65)),
            Some("198.51.100.9"),
        ),
        (
            "x-forwarded-for",
            // 65 trusted proxies in a row: more than MAX_HOPS, malformed.
            format!("198.51.100.9{}", ", 127.0.0.1".repeat(65)),
            None,
        ),
        ("forwarded", "for=\"198.51.100.9".to_string(), None),
    ] {
        let src = format!(
            r#"
[plans.free]
limit = 3
window = "1h"

[http]
trusted_proxies = ["127.0.0.1"]
forwarded_header = "{}"
exempt = ["127.0.0.1"]
"#,
            if header == "forwarded" {
                "forwarded"
            } else {
                "x-forwarded-for"
            }
        );
        let layer = layer(&src, &clock);
        let addr = serve(app(layer.clone())).await;
        let proxy = client_from("127.0.0.1");
        let mut passed = 0;
        for _ in 0..50 {
            let r = get_req(&proxy, addr, "/", &[(header, value.as_str())]).await;
            if r.status == StatusCode::OK {
                assert_eq!(r.num("x-ratelimit-limit"), 3, "{value:?}");
                passed += 1;
            } else {
                assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{value:?}");
            }
        }
        assert_eq!(passed, 3, "{header}: {value:?}");
        assert!(
            layer.metrics().contains("tollgate_http_exempt_total 0\n"),
            "{}",
            layer.metrics()
        );
        // The client the walk found, or (malformed) the proxy's own address, as a request
        // through the proxy without the header is keyed.
        let charged = ip(client.unwrap_or("127.0.0.1"));
        assert!(
            !layer.limiter().peek(&own(charged)).is_allowed(),
            "{value:?}"
        );
        assert_eq!(layer.limiter().len(), 1);
    }
    // A request through the proxy without the header is still exempt (the monitor).
    let src = "[plans.free]\nlimit = 3\nwindow = \"1h\"\n[http]\ntrusted_proxies = [\"127.0.0.1\"]\nexempt = [\"127.0.0.1\"]\n";
    let layer = layer(src, &clock);
    let addr = serve(app(layer.clone())).await;
    for _ in 0..5 {
        let r = get_req(&client_from("127.0.0.1"), addr, "/", &[]).await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("x-ratelimit-limit"), None);
    }
    assert_eq!(layer.limiter().len(), 0);
}

/// `axum::serve(listener, app)` without connect info: no silent bucket for everyone, but a
/// 500 that names the fix, on every request; `on_bad_key = "shared"` is the explicit way to
/// have that one bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_connect_info_is_a_500_naming_the_fix() {
    let clock = FakeClock::new();
    let src = "[plans.free]\nlimit = 2\nwindow = \"1h\"\n";
    for on_bad_key in ["", "[http]\non_bad_key = \"reject\"\n"] {
        let layer = layer(&format!("{src}{on_bad_key}"), &clock);
        let addr = serve_without_connect_info(app(layer.clone())).await;
        for local in ["127.0.0.1", "127.0.0.2", "127.0.0.1"] {
            let r = get_req(&client_from(local), addr, "/", &[]).await;
            assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{on_bad_key}");
            let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
            assert!(
                body["message"]
                    .as_str()
                    .unwrap()
                    .contains("into_make_service_with_connect_info"),
                "{body}"
            );
        }
        assert_eq!(layer.limiter().len(), 0);
        assert!(
            layer
                .metrics()
                .contains("tollgate_http_internal_errors_total 3\n"),
            "{}",
            layer.metrics()
        );
    }
    // The explicit choice: one bucket for every request.
    let layer = layer(&format!("{src}[http]\non_bad_key = \"shared\"\n"), &clock);
    let addr = serve_without_connect_info(app(layer.clone())).await;
    let mut statuses = Vec::new();
    for local in ["127.0.0.1", "127.0.0.2", "127.0.0.3"] {
        statuses.push(get_req(&client_from(local), addr, "/", &[]).await.status);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert!(
        !layer
            .limiter()
            .peek(&own(ClientKey::Unidentified))
            .is_allowed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_charged_their_cost() {
    let clock = FakeClock::new();
    let src = r#"
[plans.free]
limit = 10
window = "1m"
"#;
    let layer = layer(src, &clock).cost(|parts| {
        parts
            .headers
            .get("x-weight")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    });
    let addr = serve(app(layer.clone())).await;
    let client = client_from("127.0.0.26");
    let r = get_req(&client, addr, "/", &[("x-weight", "4")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.num("x-ratelimit-remaining"), 6);
    // Weight 0 is free.
    let r = get_req(&client, addr, "/", &[("x-weight", "0")]).await;
    assert_eq!(r.status, StatusCode::OK);
    // More than is left: denied, nothing charged, retry when 5 units are back (6 s each).
    let r = get_req(&client, addr, "/", &[("x-weight", "11")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), None, "11 can never pass");
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        body["message"],
        "This request costs 11; the limit holds at most 10"
    );
    let r = get_req(&client, addr, "/", &[("x-weight", "7")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("6"));
    assert_eq!(r.num("x-ratelimit-remaining"), 6);
    let r = get_req(&client, addr, "/", &[("x-weight", "6")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.num("x-ratelimit-remaining"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_refunded_after_the_response() {
    let clock = FakeClock::new();
    let layer = layer(FREE, &clock).refund_when(|status| status.is_server_error());
    let addr = serve(app(layer.clone())).await;
    let client = client_from("127.0.0.27");
    let mut full_at = None;
    for _ in 0..5 {
        let r = get_req(&client, addr, "/fail", &[]).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(r.body, "broken");
        // The refund is counted in every header: nothing left to wait for to be full.
        assert_eq!(r.num("x-ratelimit-remaining"), 2, "the refund is counted");
        assert_eq!(r.header("ratelimit"), Some("\"free\";r=2;t=0"));
        assert_eq!(
            *full_at.get_or_insert(r.num("x-ratelimit-reset")),
            r.num("x-ratelimit-reset")
        );
    }
    let full_at = full_at.unwrap();
    for (want, reset) in [
        (StatusCode::OK, 30),
        (StatusCode::OK, 60),
        (StatusCode::TOO_MANY_REQUESTS, 60),
    ] {
        let r = get_req(&client, addr, "/", &[]).await;
        assert_eq!(r.status, want);
        assert_eq!(
            r.num("x-ratelimit-reset"),
            full_at + reset,
            "2 a minute: 30 s a unit"
        );
    }
    assert!(layer.metrics().contains("tollgate_http_refunded_total 5\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_denial_is_resource_exhausted_with_retry_info() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_types::StatusExt;

    let clock = FakeClock::new();
    // 3 per minute, burst 3: after three calls at one instant the next unit is 20 s away.
    let src = "[plans.free]\nlimit = 3\nwindow = \"1m\"\n";
    let layer = layer(src, &clock).key_extractor(|parts| {
        // tonic puts no axum connect info in the request: key by a metadata entry.
        let client = parts.headers.get("x-client").and_then(|v| v.to_str().ok());
        Ok::<_, StatusCode>(ClientKey::user(client.unwrap_or("anonymous")))
    });
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer.clone())
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let call = |who: &'static str| {
        let mut req = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        req.metadata_mut().insert("x-client", who.parse().unwrap());
        req
    };
    for _ in 0..3 {
        client.check(call("svc-a")).await.expect("admitted");
    }
    let status = client.check(call("svc-a")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "You have exceeded your 3 requests per minute limit"
    );
    assert_eq!(
        status
            .metadata()
            .get("retry-after")
            .unwrap()
            .to_str()
            .unwrap(),
        "20"
    );
    let retry = status.get_details_retry_info().expect("RetryInfo detail");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(20)));
    // Another client is not affected.
    client.check(call("svc-b")).await.expect("admitted");
    assert!(
        !layer
            .limiter()
            .peek(&own(ClientKey::User("svc-a".into())))
            .is_allowed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_valid_toml_layout_parses() {
    let clock = FakeClock::new();
    let plans =
        "[plans.free]\nlimit = 10\nwindow = \"1m\"\n[plans.login]\nlimit = 1\nwindow = \"5m\"\n";
    let layouts = [
        format!("{plans}[[http.routes]]\npath = \"/login\"\nplan = \"login\"\n"),
        format!("{plans}[http.global]\nplan = \"login\"\n"),
        format!("http.key = \"ip\"\n{plans}[[http.routes]]\npath = \"/login\"\nplan = \"login\"\n"),
        format!("http = {{ routes = [{{ path = \"/login\", plan = \"login\" }}] }}\n{plans}"),
        format!("{plans}[http]\n[[http.routes]]\npath = \"/login\"\nplan = \"login\"\n"),
    ];
    for src in &layouts {
        let layer = layer(src, &clock);
        let addr = serve(app(layer)).await;
        let client = client_from("127.0.0.28");
        let path = if src.contains("global") {
            "/"
        } else {
            "/login"
        };
        let method = if path == "/" { "GET" } else { "POST" };
        assert_eq!(
            send(&client, addr, method, path, &[]).await.status,
            StatusCode::OK,
            "{src}"
        );
        assert_eq!(
            send(&client, addr, method, path, &[]).await.status,
            StatusCode::TOO_MANY_REQUESTS,
            "the rule applies: {src}"
        );
    }
}
