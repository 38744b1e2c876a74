//! The layer's API as an axum user meets it: hooks that return what handlers return, settings
//! that cannot take effect (errors and warnings), route rules that replace the plan, exempt
//! paths, path patterns with parameters, denial metrics by limit, anonymous requests, and the
//! public header formatter in a hand-written middleware. A real axum server on loopback and a
//! real hyper client throughout.
#![cfg(feature = "http")]

mod http_support;

#[path = "../examples/axum.rs"]
#[allow(dead_code)]
mod example;

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use http_support::{client_from, get as get_req, serve, serve_without_connect_info};
use tollgate::http::{
    ClientKey, HeaderPolicy, HeaderStyle, HttpConfig, HttpKey, KeySource, RateLimitLayer, Rule,
};
use tollgate::{FakeClock, Limiter, Quota};

fn layer(config: HttpConfig, clock: &FakeClock) -> RateLimitLayer<FakeClock> {
    RateLimitLayer::with_clock(config.sweep_interval(None), clock.clone()).unwrap()
}

fn routes(layer: RateLimitLayer<FakeClock>) -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .route("/health", get(|| async { "ok" }))
        .route("/users/{id}/export", get(|| async { "export" }))
        .route("/users/{id}/report", get(|| async { "report" }))
        .route("/files/{*path}", get(|| async { "file" }))
        .layer(layer)
}

fn metric(layer: &RateLimitLayer<FakeClock>, series: &str) -> u64 {
    let text = layer.metrics();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in {text}"))
        .parse()
        .unwrap()
}

const PLANS: &str = r#"
[plans.free]
limit = 3
window = "1m"

[plans.export]
limit = 2
window = "1d"

[plans.report]
limit = 5
window = "1d"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_that_replaces_the_plan_is_the_only_limit_on_its_route() {
    let in_code = HttpConfig::parse(PLANS)
        .unwrap()
        .rule(Rule::route("/users/{id}/export", "export").replaces_plan())
        .rule(Rule::route("/users/{id}/report", "report"));
    let in_toml = HttpConfig::parse(&format!(
        "{PLANS}[[http.routes]]\npath = \"/users/{{id}}/export\"\nplan = \"export\"\n\
         replaces_plan = true\n[[http.routes]]\npath = \"/users/{{id}}/report\"\nplan = \"report\"\n"
    ))
    .unwrap();
    for (config, from) in [(in_code, "127.0.0.61"), (in_toml, "127.0.0.66")] {
        replaced_on_its_route(config, from).await;
    }
}

/// Exports under their rule alone, reports under the rule and the plan, from address `from`.
async fn replaced_on_its_route(config: HttpConfig, from: &str) {
    let clock = FakeClock::new();
    let layer = layer(config, &clock);
    let addr = serve(routes(layer.clone())).await;
    let client = client_from(from);
    // Two exports under the rule alone: the free plan is not spent, and not in the headers.
    for (path, remaining) in [("/users/7/export", 1), ("/users/8/export", 0)] {
        let r = get_req(&client, addr, path, &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.num("x-ratelimit-remaining"), remaining);
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("\"/users/{id}/export\";q=2;w=86400")
        );
    }
    let r = get_req(&client, addr, "/users/9/export", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let free = HttpKey {
        rule: None,
        client: ClientKey::ip(from.parse().unwrap()),
    };
    // Untouched: a peek (what one more request would leave) says 2 of 3.
    assert_eq!(layer.limiter().peek(&free).remaining(), 2);
    // A rule that does not replace the plan spends both.
    let r = get_req(&client, addr, "/users/7/report", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("ratelimit"),
        Some("\"free\";r=2;t=20, \"/users/{id}/report\";r=4;t=17280")
    );
    // A path the pattern does not match is not the rule's.
    let r = get_req(&client, addr, "/users/7/export/x", &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.header("ratelimit-policy"), Some("\"free\";q=3;w=60"));
    assert_eq!(layer.limiter().peek(&free).remaining(), 0);
    // Which limit denied, by label: the rule's part, never a client.
    assert_eq!(
        metric(
            &layer,
            "tollgate_http_limited_total{limit=\"rule:/users/{id}/export/0\"}"
        ),
        1
    );
    assert_eq!(
        metric(&layer, "tollgate_http_limited_total{limit=\"plan:free/0\"}"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exempt_paths_pass_unkeyed_and_uncharged() {
    let clock = FakeClock::new();
    let src = format!("{PLANS}[http]\nexempt_paths = [\"/health\", \"/files/{{*path}}\"]\n");
    let layer = layer(HttpConfig::parse(&src).unwrap(), &clock);
    let addr = serve(routes(layer.clone())).await;
    let client = client_from("127.0.0.62");
    for path in ["/health"; 10].into_iter().chain(["/files/a/b.txt"; 5]) {
        let r = get_req(&client, addr, path, &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.header("x-ratelimit-limit"), None, "{path}");
    }
    // `/files/` has no rest: not exempt (and not a route).
    assert_eq!(
        get_req(&client, addr, "/files/", &[]).await.status,
        StatusCode::NOT_FOUND
    );
    for want in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        assert_eq!(get_req(&client, addr, "/", &[]).await.status, want);
    }
    assert_eq!(metric(&layer, "tollgate_http_exempt_total"), 15);
    assert_eq!(metric(&layer, "tollgate_http_requests_total"), 19);
    assert_eq!(layer.limiter().len(), 1);
    // Exempt before keying: a server without connect info still answers its health check.
    let bare = serve_without_connect_info(routes(layer.clone())).await;
    assert_eq!(
        get_req(&client, bare, "/health", &[]).await.status,
        StatusCode::OK
    );
    assert_eq!(
        get_req(&client, bare, "/", &[]).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
}

#[test]
fn rules_that_could_never_apply_are_construction_errors() {
    let plans = || HttpConfig::parse(PLANS).unwrap();
    for (config, want) in [
        (
            plans().rule(Rule::route("/users/{id/export", "export")),
            "http.rules[0].path: '/users/{id/export': a parameter is a whole segment ('/{id}/'), not '{id'",
        ),
        (
            plans().rule(Rule::route("/search?q", "export")),
            "http.rules[0].path: '/search?q' holds '?', which no request path has (a path is \
             visible ASCII without '?' or '#'; percent-encode anything else as clients send it)",
        ),
        (
            plans().rule(Rule::route("export", "export")),
            "http.rules[0].path: 'export' must start with '/'",
        ),
        (
            plans().rule(Rule::route("/x", "export").methods(["GET POST"])),
            "http.rules[0].methods: 'GET POST' is not an HTTP method, so the rule could never apply",
        ),
        (
            plans()
                .exempt_path("/users/*")
                .rule(Rule::global("report"))
                .rule(Rule::route("/users/{id}/export", "export")),
            "http.rules[1].path: every request to '/users/{id}/export' is exempt \
             (exempt_paths[0] = '/users/*'), so the rule could never apply",
        ),
        (
            plans().exempt_path("/health/{*}"),
            "http.exempt_paths[0]: '/health/{*}': '{*}' is not a parameter (`{id}`)",
        ),
    ] {
        assert_eq!(RateLimitLayer::new(config).unwrap_err().to_string(), want);
    }
    // The same from the TOML file.
    let src = format!(
        "{PLANS}[http]\nexempt_paths = [\"/health\"]\n[[http.routes]]\npath = \"/health\"\nplan = \"export\"\n"
    );
    assert_eq!(
        HttpConfig::parse(&src).unwrap_err().to_string(),
        "http.rules[0].path: every request to '/health' is exempt (exempt_paths[0] = \
         '/health'), so the rule could never apply"
    );
    let src = format!(
        "{PLANS}[[http.routes]]\npath = \"/a/{{id}}\"\nplan = \"export\"\nreplaces_plan = true\n"
    );
    assert!(HttpConfig::parse(&src).is_ok());
}

#[test]
fn settings_that_cannot_take_effect_are_warned_about() {
    let plans =
        "[plans.free]\nlimit = 3\nwindow = \"1m\"\n[plans.pro]\nlimit = 9\nwindow = \"1m\"\n";
    let by_ip = || HttpConfig::parse(plans).unwrap();
    let user = |_: &axum::http::request::Parts| Some("bob");
    let never_called = "the user extractor (`.user`) is never called: `http.key` is [\"ip\"], \
                        without \"user\"";
    let cases: Vec<(RateLimitLayer, Vec<&str>)> = vec![
        (
            RateLimitLayer::new(by_ip()).unwrap().user(user),
            vec![never_called],
        ),
        (
            RateLimitLayer::new(by_ip().key([KeySource::User]))
                .unwrap()
                .user(user)
                .key_extractor(|_| Ok::<_, StatusCode>(ClientKey::user("x"))),
            vec![
                "the user extractor (`.user`) is never called: the key extractor \
                 (`.key_extractor`) keys every request",
            ],
        ),
        (
            RateLimitLayer::new(by_ip().key([KeySource::User])).unwrap(),
            vec![
                "`http.key` includes \"user\" but no user extractor is set (`.user`): every \
                 request is keyed as one without a user (`on_bad_key`)",
            ],
        ),
        (
            RateLimitLayer::new(
                by_ip()
                    .api_key_plan("k-1", "pro")
                    .api_key_plan("k-2", "pro"),
            )
            .unwrap()
            .resolver(|_, _| async { None }),
            vec![
                "the resolver (`.resolver`) replaces the `http.api_keys` table: its 2 key(s) \
                 are never read",
            ],
        ),
        (
            RateLimitLayer::new(by_ip().key([KeySource::User, KeySource::Ip]))
                .unwrap()
                .user(user)
                .resolver(|_, _| async { Some("pro".to_string()) }),
            vec![],
        ),
    ];
    for (layer, want) in cases {
        assert_eq!(layer.warnings(), want);
    }
}

#[cfg(feature = "tracing")]
#[test]
fn a_warning_is_logged_once_when_its_hook_is_set() {
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Warnings(Arc<Mutex<Vec<String>>>);
    impl tracing::Subscriber for Warnings {
        fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
            *m.level() == tracing::Level::WARN
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            struct Message(String);
            impl tracing::field::Visit for Message {
                fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                    if f.name() == "message" {
                        self.0 = format!("{v:?}");
                    }
                }
            }
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0.lock().unwrap().push(m.0);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }
    let seen = Warnings::default();
    let config = HttpConfig::parse("[plans.free]\nlimit = 3\nwindow = \"1m\"\n")
        .unwrap()
        .api_key_plan("k-1", "free");
    tracing::subscriber::with_default(seen.clone(), || {
        let layer = RateLimitLayer::new(config).unwrap();
        let layer = layer.cost(|_| 1).resolver(|_, _| async { None });
        let _ = layer.refund_when(|s| s.is_server_error());
    });
    assert_eq!(
        *seen.0.lock().unwrap(),
        [
            "the resolver (`.resolver`) replaces the `http.api_keys` table: its 1 key(s) are never read"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_keys_each_user_apart() {
    let layer = example::layer().unwrap();
    assert_eq!(layer.warnings(), Vec::<String>::new());
    let addr = serve(example::app(layer.clone())).await;
    let client = client_from("127.0.0.63");
    // Seven users from one address: seven buckets (the free plan's burst is 5).
    for user in ["u1", "u2", "u3", "u4", "u5", "u6", "u7"] {
        let r = get_req(&client, addr, "/", &[("x-user", user)]).await;
        assert_eq!(r.status, StatusCode::OK, "{user}");
        assert_eq!(r.num("x-ratelimit-remaining"), 4, "{user}");
    }
    assert_eq!(layer.limiter().len(), 7 + 1); // each user's plan, and the shared global rule
    // The customer database names the plan.
    let r = get_req(
        &client,
        addr,
        "/",
        &[("x-user", "u1"), ("x-api-key", "demo-pro-key")],
    )
    .await;
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"pro.0\";q=5;w=1, \"pro.1\";q=1000;w=3600;burst=100, \"global\";q=100;w=1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denials_are_counted_by_limit_and_missing_keys_as_anonymous() {
    let clock = FakeClock::new();
    let src = r#"
[plans.free]
limit = 2
window = "1m"

[plans.pro]
limits = [ { limit = 10, window = "1s" }, { limit = 3, window = "1h" } ]

[http]
key = "api_key"
api_keys = { "k-pro" = "pro" }
"#;
    let layer = layer(HttpConfig::parse(src).unwrap(), &clock);
    let addr = serve(routes(layer.clone())).await;
    let client = client_from("127.0.0.64");
    // Five without a key: anonymous, keyed by address under free (two pass).
    for want in [200, 200, 429, 429, 429] {
        assert_eq!(get_req(&client, addr, "/", &[]).await.status.as_u16(), want);
    }
    // Four with the pro key: the hourly part (part 1) denies the fourth.
    for want in [200, 200, 200, 429] {
        let r = get_req(&client, addr, "/", &[("x-api-key", "k-pro")]).await;
        assert_eq!(r.status.as_u16(), want);
    }
    // Two made-up keys: bad, not anonymous.
    for _ in 0..2 {
        get_req(&client, addr, "/", &[("x-api-key", "nope")]).await;
    }
    for (series, want) in [
        ("tollgate_http_anonymous_total", 5),
        ("tollgate_http_bad_key_total", 2),
        ("tollgate_http_limited_total{limit=\"plan:free/0\"}", 5),
        ("tollgate_http_limited_total{limit=\"plan:pro/0\"}", 0),
        ("tollgate_http_limited_total{limit=\"plan:pro/1\"}", 1),
        ("tollgate_http_limited_total{limit=\"blocked\"}", 0),
        ("tollgate_http_requests_total", 11),
    ] {
        assert_eq!(metric(&layer, series), want, "{series}");
    }
    // A blocked key is counted as such.
    let pro = HttpKey {
        rule: None,
        client: ClientKey::api_key("k-pro"),
    };
    layer.limiter().reset(&pro);
    layer
        .limiter()
        .block(&pro, std::time::Duration::from_secs(60));
    let r = get_req(&client, addr, "/", &[("x-api-key", "k-pro")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        metric(&layer, "tollgate_http_limited_total{limit=\"blocked\"}"),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_written_middleware_writes_the_layers_headers() {
    use axum::extract::Request;
    use axum::middleware::{Next, from_fn};
    use axum::response::{IntoResponse, Response};
    use std::sync::Arc;

    let quota = Quota::per_minute(3);
    let clock = FakeClock::new();
    let limiter = Arc::new(
        Limiter::<String, _>::builder()
            .quota(quota)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    let policy = Arc::new(HeaderPolicy::new("free", &[quota]));
    let mw = {
        let (limiter, policy) = (Arc::clone(&limiter), Arc::clone(&policy));
        move |req: Request, next: Next| {
            let (limiter, policy) = (Arc::clone(&limiter), Arc::clone(&policy));
            async move {
                let who = req
                    .headers()
                    .get("x-user")
                    .map_or("anonymous".to_string(), |v| v.to_str().unwrap().to_string());
                let d = limiter.check(&who);
                let headers = tollgate::http::headers(&d, &policy, HeaderStyle::Both);
                let mut resp: Response = if d.is_allowed() {
                    next.run(req).await
                } else {
                    StatusCode::TOO_MANY_REQUESTS.into_response()
                };
                resp.headers_mut().extend(headers);
                resp
            }
        }
    };
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(from_fn(mw));
    // The layer on the same quota, for the same requests: the same headers but the reset
    // second (the layer counts from the fake clock's epoch, the middleware from the system's).
    let layer = layer(
        HttpConfig::new([("free".to_string(), tollgate::Plan::new([quota]))])
            .key([KeySource::User])
            .on_bad_key(tollgate::http::OnBadKey::Shared),
        &clock,
    )
    .user(|p| {
        p.headers
            .get("x-user")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    });
    let ours = serve(app).await;
    let theirs = serve(routes(layer)).await;
    let client = client_from("127.0.0.65");
    for _ in 0..4 {
        let a = get_req(&client, ours, "/", &[("x-user", "ann")]).await;
        let b = get_req(&client, theirs, "/", &[("x-user", "ann")]).await;
        assert_eq!(a.status, b.status);
        for name in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "ratelimit-policy",
            "ratelimit",
            "retry-after",
        ] {
            assert_eq!(a.header(name), b.header(name), "{name}");
        }
    }
}

/// Every code example in the HTTP layer's rustdoc and in `docs/http.md` names only `axum`,
/// `tollgate` and the standard library, so a user can follow it with just those two
/// dependencies (the doc tests compile each one).
#[test]
fn rustdoc_examples_need_only_axum_and_tollgate() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut files = vec![format!("{root}/docs/http.md")];
    let mut dirs = vec![format!("{root}/src/http")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path.display().to_string());
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path.display().to_string());
            }
        }
    }
    // serde and serde_json only where a config is embedded in an app's own serde config
    // (`HttpConfig: Deserialize`): such an app has them already.
    let allowed = [
        "axum",
        "tollgate",
        "std",
        "core",
        "alloc",
        "crate",
        "self",
        "super",
        "serde",
        "serde_json",
    ];
    let mut examples = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let (mut in_fence, mut in_code) = (false, false);
        for (n, line) in text.lines().enumerate() {
            let doc = if file.ends_with(".md") {
                Some(line)
            } else {
                let t = line.trim_start();
                t.strip_prefix("///").or_else(|| t.strip_prefix("//!"))
            };
            let Some(doc) = doc else {
                (in_fence, in_code) = (false, false);
                continue;
            };
            if let Some(lang) = doc.trim_start().strip_prefix("```") {
                in_fence = !in_fence;
                in_code = in_fence && (lang.is_empty() || lang.starts_with("rust"));
                examples += usize::from(in_code);
                continue;
            }
            if !in_code {
                continue;
            }
            // A `use` names its crate first; elsewhere, every `name::` that starts a path
            // (not `axum::http::`, `tollgate::http::`, a turbofish).
            let code = doc.trim_start().trim_start_matches("# ");
            if let Some(path) = code.strip_prefix("use ") {
                let root = path.split("::").next().unwrap_or("");
                assert!(
                    allowed.contains(&root),
                    "{file}:{}: `use {root}` in a doc example needs a dependency beyond axum \
                     and tollgate",
                    n + 1
                );
                continue;
            }
            // String literals blanked: addresses like "2001:db8::1" are no paths.
            let mut doc = doc.to_string();
            while let Some(open) = doc.find("r#\"") {
                let close = doc[open + 3..]
                    .find("\"#")
                    .map_or(doc.len(), |c| open + 5 + c);
                doc.replace_range(open..close, &" ".repeat(close - open));
            }
            let mut quoted = false;
            let doc: String = doc
                .chars()
                .map(|c| {
                    if c == '"' {
                        quoted = !quoted;
                    }
                    if quoted { ' ' } else { c }
                })
                .collect();
            for (at, _) in doc.match_indices("::") {
                let start = doc[..at]
                    .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .map_or(0, |i| i + 1);
                let name = &doc[start..at];
                let starts_path = start == 0 || !doc[..start].ends_with("::");
                let is_type = name.starts_with(|c: char| c.is_ascii_uppercase());
                let turbofish = doc[at + 2..].starts_with('<');
                if name.is_empty() || !starts_path || is_type || turbofish {
                    continue;
                }
                assert!(
                    allowed.contains(&name),
                    "{file}:{}: `{name}::` in a doc example needs a dependency beyond axum and \
                     tollgate: {doc}",
                    n + 1
                );
            }
        }
    }
    assert!(examples > 20, "{examples} examples read");
}
