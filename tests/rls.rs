//! `tollgate rls` through a tonic client built from the same envoy-types crate: upstream's
//! semantics with exact values, eight clients on one limit, the extras, and the program itself
//! (a bad config at start-up, reloads while serving, SIGTERM with requests in flight).
#![cfg(all(feature = "rls", feature = "cli"))]

mod rls_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rls_support::*;
use tollgate::rls::RlsService;

const SEMANTICS: &str = "
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 10}
  - key: internal
    rate_limit: {unlimited: true}
  - key: banned
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: burst
    rate_limit: {unit: hour, requests_per_unit: 3600, algorithm: token_bucket, burst: 2}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_semantics_with_exact_values() {
    let service = Arc::new(RlsService::new(config(SEMANTICS)).unwrap());
    let mut c = connect(serve_in_process(service.clone()).await).await;
    let t = [("tenant", "a")];
    let mut ask = async |descs, hits| {
        c.should_rate_limit(request("api", descs, hits))
            .await
            .unwrap()
            .into_inner()
    };
    assert_eq!(status(&ask(vec![desc(&t, None)], 4).await, 0), (OK, 10, 6));
    // 4 + 7 > 10: over, and the hits count (upstream's INCRBY), so a check of 0 hits is over.
    let r = ask(vec![desc(&t, None)], 7).await;
    assert_eq!((r.overall_code, status(&r, 0)), (OVER, (OVER, 10, 0)));
    assert_eq!(
        status(&ask(vec![desc(&t, Some(0))], 1).await, 0),
        (OVER, 10, 0)
    );
    let s = &ask(vec![desc(&t, Some(0))], 0).await.statuses[0];
    let reset = s.duration_until_reset.unwrap().seconds;
    assert!((1..=86_400).contains(&reset), "{reset}");
    // Stats as upstream counts them: near threshold 8; 4 within, then 7 hits from 4: the two
    // from 8 to 10 near, the one past 10 over (the three below 8 nowhere).
    assert_eq!(service.stats_of("api.tenant"), Some([11, 4, 1, 2, 0]));
    // Unknown domain, no match, unlimited, limit 0, several descriptors.
    let r = c
        .should_rate_limit(request("nowhere", vec![desc(&t, None)], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.overall_code, status(&r, 0)), (OK, (OK, 0, 0)));
    assert!(r.statuses[0].current_limit.is_none());
    let r = c
        .should_rate_limit(request(
            "api",
            vec![
                desc(&[("internal", "x")], None),
                desc(&[("banned", "x")], None),
                desc(&[("other", "x")], None),
            ],
            0,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OVER);
    assert_eq!(status(&r, 0), (OK, 0, u32::MAX));
    assert_eq!(status(&r, 1), (OVER, 0, 0));
    assert_eq!(status(&r, 2), (OK, 0, 0));
    // The extra `algorithm: token_bucket, burst: 2`: two at once, then one a second.
    let b = [("burst", "x")];
    let mut got = Vec::new();
    for _ in 0..3 {
        let r = c
            .should_rate_limit(request("api", vec![desc(&b, None)], 0))
            .await
            .unwrap()
            .into_inner();
        got.push(status(&r, 0));
    }
    assert_eq!(got, [(OK, 3600, 1), (OK, 3600, 0), (OVER, 3600, 0)]);
    // Request errors are gRPC errors, as upstream's.
    let e = c
        .should_rate_limit(request("", vec![desc(&t, None)], 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unknown);
    assert_eq!(e.message(), "rate limit domain must not be empty");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clients_get_exactly_the_limit() {
    const CLIENTS: usize = 8;
    const EACH: usize = 500;
    let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n";
    let service = Arc::new(RlsService::new(config(yaml)).unwrap());
    let addr = serve_in_process(service.clone()).await;
    tokio::task::spawn_blocking(|| settle_in_minute(10))
        .await
        .unwrap();
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let (in_flight, most) = (in_flight.clone(), most.clone());
        let mut c = connect(addr).await;
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            for _ in 0..EACH {
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                let r = c
                    .should_rate_limit(request("d", vec![desc(&[("k", "one")], None)], 0))
                    .await
                    .unwrap()
                    .into_inner();
                in_flight.fetch_sub(1, Ordering::SeqCst);
                ok += usize::from(r.overall_code == OK);
            }
            ok
        }));
    }
    let mut oks = Vec::new();
    for t in tasks {
        oks.push(t.await.unwrap());
    }
    assert_eq!(oks.iter().sum::<usize>(), 1000, "per client: {oks:?}");
    // Contention: requests of several clients were in flight at once.
    let most = most.load(Ordering::SeqCst);
    assert!(most >= 2, "at most {most} request in flight: no contention");
    // total, within, over, near (above 800 of 1000), shadow.
    assert_eq!(service.stats_of("d.k"), Some([4000, 1000, 3000, 200, 0]));
    eprintln!(
        "8 x 500: oks per client {oks:?}, up to {most} in flight, {} CAS retries",
        service.limiter().stats().cas_retries
    );
}

#[test]
fn a_bad_config_at_start_up_names_the_file_and_the_field() {
    let dir = temp_dir("bad");
    std::fs::write(
        dir.join("ok.yaml"),
        "domain: fine\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("broken.yml"),
        "domain: broken\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1, colour: red}\n",
    )
    .unwrap();
    std::fs::write(dir.join("notes.txt"), "not yaml: [").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["rls", "--config"])
        .arg(&dir)
        .args(["--grpc", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken.yml: descriptors[0].rate_limit.colour: unknown field `colour`"),
        "{err}"
    );
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tollgate-rls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn limit_of(rt: &tokio::runtime::Runtime, c: &mut Client, domain: &str) -> (i32, u32, u32) {
    rt.block_on(async {
        let r = c
            .should_rate_limit(request(domain, vec![desc(&[("k", "v")], Some(0))], 0))
            .await
            .unwrap()
            .into_inner();
        status(&r, 0)
    })
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: not in effect within 5 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn reloads_while_serving() {
    let dir = temp_dir("reload");
    let rule = |n: u32| {
        format!(
            "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {n}}}\n"
        )
    };
    std::fs::write(dir.join("r.yaml"), rule(2)).unwrap();
    let program = Program::start(&dir, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut c = rt.block_on(connect(program.grpc));
    assert_eq!(limit_of(&rt, &mut c, "r"), (OK, 2, 2));
    std::fs::write(dir.join("r.yaml"), rule(7)).unwrap();
    wait_until("modified in place", || limit_of(&rt, &mut c, "r").1 == 7);
    std::fs::write(
        dir.join("r.yaml"),
        "domain: r\ndescriptors: [{key: k, rate_limit: {unit: 3}}]\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        limit_of(&rt, &mut c, "r"),
        (OK, 7, 7),
        "a bad file keeps the old config"
    );
    std::fs::write(dir.join("next.tmp"), rule(9)).unwrap();
    std::fs::rename(dir.join("next.tmp"), dir.join("r.yaml")).unwrap();
    wait_until("replaced by rename", || limit_of(&rt, &mut c, "r").1 == 9);
    std::fs::write(dir.join("s.yml"), rule(4).replace("domain: r", "domain: s")).unwrap();
    wait_until("added", || limit_of(&rt, &mut c, "s").1 == 4);
    std::fs::remove_file(dir.join("s.yml")).unwrap();
    wait_until("removed", || limit_of(&rt, &mut c, "s") == (OK, 0, 0));
}

#[test]
fn sigterm_answers_requests_in_flight() {
    let dir = temp_dir("term");
    std::fs::write(
        dir.join("t.yaml"),
        "domain: t\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n",
    )
    .unwrap();
    let mut program = Program::start(&dir, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let addr = program.grpc;
    let answered = Arc::new(AtomicUsize::new(0));
    let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (answered, stopping) = (answered.clone(), stopping.clone());
            rt.spawn(async move {
                let mut c = connect(addr).await;
                loop {
                    let sent_before_stop = !stopping.load(Ordering::SeqCst);
                    match c
                        .should_rate_limit(request("t", vec![desc(&[("k", "v")], None)], 0))
                        .await
                    {
                        Ok(r) => {
                            assert_eq!(r.into_inner().overall_code, OK);
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        // A request sent before the signal is answered; only one sent after
                        // it may find the server gone.
                        Err(e) => return (sent_before_stop, e.code(), e.message().to_string()),
                    }
                }
            })
        })
        .collect();
    while answered.load(Ordering::SeqCst) < 200 {
        std::thread::sleep(Duration::from_millis(10));
    }
    stopping.store(true, Ordering::SeqCst);
    program.terminate();
    let code = program.child.wait().unwrap();
    assert_eq!(code.code(), Some(0));
    for t in tasks {
        let code = rt.block_on(t).unwrap();
        assert!(
            !code.0,
            "a request in flight at SIGTERM was cut off: {code:?}"
        );
    }
}

/// Upstream's own example configs (`examples/ratelimit/config/`), as its README walks them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_example_configs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/rls/upstream");
    let config = tollgate::rls::RlsConfig::load(&dir).unwrap();
    assert_eq!(config.domains(), ["mongo_cps", "rl"]);
    let service = Arc::new(RlsService::new(config).unwrap());
    let mut c = connect(serve_in_process(service).await).await;
    tokio::task::spawn_blocking(|| settle_in_minute(5))
        .await
        .unwrap();
    let mut ask = async |domain: &str, entries: &[(&str, &str)]| {
        let r = c
            .should_rate_limit(request(domain, vec![desc(entries, None)], 0))
            .await
            .unwrap()
            .into_inner();
        status(&r, 0)
    };
    let sd = [("source_cluster", "proxy"), ("destination_cluster", "mock")];
    assert_eq!(ask("rl", &sd).await, (OK, 1, 0));
    assert_eq!(ask("rl", &sd).await, (OVER, 1, 0));
    // foo alone: 2 a minute; foo + bar (any value): 3; bar=banned: 0; baz=shady: shadow.
    assert_eq!(ask("rl", &[("foo", "f")]).await, (OK, 2, 1));
    assert_eq!(ask("rl", &[("foo", "f"), ("bar", "b")]).await, (OK, 3, 2));
    assert_eq!(
        ask("rl", &[("foo", "f"), ("bar", "banned")]).await,
        (OVER, 0, 0)
    );
    assert_eq!(
        ask("rl", &[("foo", "f"), ("baz", "shady")]).await,
        (OK, 1, 0)
    );
    assert_eq!(
        ask("rl", &[("foo", "f"), ("baz", "shady")]).await,
        (OK, 1, 0)
    );
    assert_eq!(
        ask("rl", &[("foo", "f"), ("bay", "x")]).await,
        (OK, 0, u32::MAX)
    );
    assert_eq!(ask("rl", &[("qux", "q")]).await, (OK, 0, u32::MAX));
    for left in (0..5).rev() {
        assert_eq!(
            ask("mongo_cps", &[("database", "users")]).await,
            (OK, 5, left)
        );
    }
    assert_eq!(
        ask("mongo_cps", &[("database", "users")]).await,
        (OVER, 5, 0)
    );
    assert_eq!(
        ask("mongo_cps", &[("database", "default")]).await,
        (OK, 5, 4)
    );
    assert_eq!(ask("mongo_cps", &[("database", "other")]).await, (OK, 0, 0));
}

/// Envoy's per-descriptor limit override: the override's rate, counted under the descriptor's
/// own stats key; ignored for an unknown domain (as upstream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_limit_override() {
    use tollgate::rls::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let service = Arc::new(RlsService::new(config(SEMANTICS)).unwrap());
    let mut c = connect(serve_in_process(service.clone()).await).await;
    let with_override = |domain: &str| {
        let mut d = desc(&[("custom", "x"), ("tenant", "t")], None);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: 3, // HOUR
        });
        request(domain, vec![d], 0)
    };
    let mut got = Vec::new();
    for _ in 0..3 {
        let r = c
            .should_rate_limit(with_override("api"))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().unit, 3);
        got.push(status(&r, 0));
    }
    assert_eq!(got, [(OK, 2, 1), (OK, 2, 0), (OVER, 2, 0)]);
    assert_eq!(
        service.stats_of("api.custom_x.tenant_t"),
        Some([3, 2, 1, 1, 0])
    );
    let r = c
        .should_rate_limit(with_override("nowhere"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status(&r, 0), (OK, 0, 0));
}

/// Override rates are capped: a client cycling through distinct rates cannot take the quotas
/// the config's reloads need; a rate seen before keeps working past the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_override_rates_are_capped_and_reloads_still_work() {
    use tollgate::rls::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let service = Arc::new(RlsService::new(config(SEMANTICS)).unwrap());
    let mut c = connect(serve_in_process(service.clone()).await).await;
    let with_rate = |n: u32| {
        let mut d = desc(&[("custom", "x")], None);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: n,
            unit: 3, // HOUR
        });
        request("api", vec![d], 0)
    };
    for n in 1..=64 {
        let r = c
            .should_rate_limit(with_rate(n))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(status(&r, 0).0, OK, "rate {n}");
    }
    let refused = c.should_rate_limit(with_rate(65)).await.unwrap_err();
    assert!(
        refused
            .message()
            .contains("too many distinct limit override rates"),
        "{refused:?}"
    );
    // A rate already taken is still served.
    let r = c
        .should_rate_limit(with_rate(7))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status(&r, 0).0, OK);
    // A reload with as many quotas as the limiter has room for beside the config's and the
    // overrides' (256 in its life) still finds room for them.
    let reloaded: String = (0..185)
        .map(|i| {
            format!(
                "  - key: k{i}\n    rate_limit: {{unit: hour, requests_per_unit: {}}}\n",
                1000 + i
            )
        })
        .collect();
    service
        .reload(config(&format!("domain: api\ndescriptors:\n{reloaded}")))
        .unwrap();
    let r = c
        .should_rate_limit(request("api", vec![desc(&[("k184", "v")], Some(1))], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status(&r, 0), (OK, 1184, 1183));
}

/// Stats keys that requests name (here a limit override's, one per descriptor value) are
/// capped: past 4096 of them a new one's hits count under its domain's `stats_overflow` key,
/// while the config's own keys go on counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_keys_named_by_clients_are_capped() {
    use tollgate::rls::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let service = Arc::new(RlsService::new(config(SEMANTICS)).unwrap());
    let mut c = connect(serve_in_process(service.clone()).await).await;
    let with_value = |v: &str| {
        let mut d = desc(&[("custom", v)], None);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: 3, // HOUR
        });
        request("api", vec![d], 0)
    };
    for i in 0..4100 {
        let r = c
            .should_rate_limit(with_value(&format!("v{i}")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(status(&r, 0), (OK, 5, 4), "value {i}");
    }
    assert_eq!(service.stats_of("api.custom_v4095"), Some([1, 1, 0, 0, 0]));
    assert_eq!(service.stats_of("api.custom_v4096"), None);
    assert_eq!(
        service.stats_of("api.stats_overflow"),
        Some([4, 4, 0, 0, 0])
    );
    // A key of the config's own limits still gets its own row.
    let r = c
        .should_rate_limit(request("api", vec![desc(&[("tenant", "a")], None)], 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status(&r, 0), (OK, 10, 9));
    assert_eq!(service.stats_of("api.tenant"), Some([1, 1, 0, 0, 0]));
    assert!(
        service
            .metrics_text()
            .contains("key1=\"stats_overflow\"} 4")
    );
}

/// The extra `check_all: true`: a request's descriptors pass together or nothing is charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_all_charges_every_descriptor_or_none() {
    let yaml = "
domain: shop
check_all: true
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: global
    rate_limit: {unit: hour, requests_per_unit: 5}
";
    let service = Arc::new(RlsService::new(config(yaml)).unwrap());
    let mut c = connect(serve_in_process(service.clone()).await).await;
    let mut ask = async |user: &str| {
        let r = c
            .should_rate_limit(request(
                "shop",
                vec![
                    desc(&[("user", user)], None),
                    desc(&[("global", "g")], None),
                ],
                0,
            ))
            .await
            .unwrap()
            .into_inner();
        (r.overall_code, status(&r, 0), status(&r, 1))
    };
    assert_eq!(ask("a").await, (OK, (OK, 3, 2), (OK, 5, 4)));
    assert_eq!(ask("a").await, (OK, (OK, 3, 1), (OK, 5, 3)));
    assert_eq!(ask("a").await, (OK, (OK, 3, 0), (OK, 5, 2)));
    // User a is over: the global limit is not charged (upstream would charge it).
    assert_eq!(ask("a").await, (OVER, (OVER, 3, 0), (OK, 5, 2)));
    assert_eq!(ask("b").await, (OK, (OK, 3, 2), (OK, 5, 1)));
    assert_eq!(ask("b").await, (OK, (OK, 3, 1), (OK, 5, 0)));
    // The global limit is spent: user b is not charged either.
    assert_eq!(ask("b").await, (OVER, (OK, 3, 1), (OVER, 5, 0)));
    assert_eq!(service.stats_of("shop.user"), Some([7, 5, 1, 1, 0]));
    // A descriptor's own hits_addend has no meaning here: a request error.
    let e = c
        .should_rate_limit(request("shop", vec![desc(&[("user", "c")], Some(2))], 0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unknown);
}
