//! Three `tollgate serve` processes on loopback behind one redis-server (and a 3-master
//! cluster), with one plan keyed by IP and a `[redis]` table in the same TOML: requests spread
//! over them are admitted exactly as by one process in exact mode and within the bound in
//! synced mode; Redis killed while they serve answers by the configured policy (closed, open,
//! local share), then they decide again after a restart.
#![cfg(all(feature = "redis", feature = "http", feature = "cli"))]

mod redis_support;
mod serve_support;

use std::time::{Duration, Instant};

use redis_support::{RedisCluster, RedisServer};
use serve_support::Serve;

/// The status of `GET /` from 127.0.0.1 (one connection per request).
fn status(port: u16) -> u16 {
    serve_support::status(port, "/")
}

/// A config file for one plan of `limit` a minute keyed by IP, on Redis (`target`: the `url`
/// or `nodes` line) in `mode`.
fn config(
    dir: &std::path::Path,
    test: &str,
    target: &str,
    limit: u64,
    on_failure: &str,
    mode: &str,
) -> std::path::PathBuf {
    let path = dir.join(format!(
        "serve-{test}-{on_failure}-{}.toml",
        std::process::id()
    ));
    std::fs::write(
        &path,
        format!(
            "[plans.free]\nlimit = {limit}\nwindow = \"1m\"\n\n[http]\nkey = \"ip\"\nheaders = \"github\"\n\n\
             [redis]\n{target}\nmode = \"{mode}\"\ninterval = \"20ms\"\ndeadline = \"20ms\"\n\
             on_failure = \"{on_failure}\"\nprefix = \"serve-{test}-{on_failure}:\"\n",
        ),
    )
    .unwrap();
    path
}

/// The `url` line of a server.
fn url(redis: &RedisServer) -> String {
    format!("url = \"{}\"", redis.url())
}

/// Three processes on a 3-master Redis Cluster (`nodes = [...]`), one plan by IP: exact mode
/// admits exactly the limit, synced mode within its bound.
#[test]
fn three_serve_processes_on_a_cluster() {
    let cluster = RedisCluster::start();
    let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let target = format!("nodes = [{}]", nodes.join(", "));
    let dir = std::env::temp_dir();
    for mode in ["exact", "synced"] {
        let cfg = config(
            &dir,
            &format!("cluster-{mode}"),
            &target,
            10,
            "closed",
            mode,
        );
        let servers: Vec<Serve> = (0..3).map(|_| Serve::start(&cfg)).collect();
        let mut statuses = Vec::new();
        for i in 0..30 {
            statuses.push(status(servers[i % 3].port));
            if mode == "synced" {
                std::thread::sleep(Duration::from_millis(60));
            }
        }
        let admitted = statuses.iter().filter(|&&c| c == 200).count();
        eprintln!("three serve processes on a cluster, {mode}: {admitted} of 30: {statuses:?}");
        match mode {
            "exact" => assert_eq!(statuses, [vec![200; 10], vec![429; 20]].concat()),
            _ => assert!((10..=12).contains(&admitted), "{statuses:?}"),
        }
    }
}

/// Requests spread over three processes, each a little more than a round apart: the plan's
/// limit, then 429s, within the documented bound `limit + (N - 1) * min(burst, d)`, `d` = 1
/// here: a process decides its first request for a key on a fresh local state (it has no
/// global state of a key it never saw), so each of the other two may admit one more.
#[test]
fn three_serve_processes_share_one_plan() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir();
    let cfg = config(&dir, "share", &url(&redis), 10, "closed", "synced");
    let servers: Vec<Serve> = (0..3).map(|_| Serve::start(&cfg)).collect();
    let mut admitted = 0;
    let mut statuses = Vec::new();
    for i in 0..30 {
        let code = status(servers[i % 3].port);
        statuses.push(code);
        if code == 200 {
            admitted += 1;
        } else {
            assert_eq!(code, 429);
        }
        std::thread::sleep(Duration::from_millis(60));
    }
    eprintln!("three serve processes, 10 a minute by IP: {admitted} of 30 admitted: {statuses:?}");
    assert!((10..=12).contains(&admitted), "{admitted}: {statuses:?}");
    assert!(statuses[20..].iter().all(|&c| c == 429), "{statuses:?}");
}

/// Exact mode (`mode = "exact"`): requests spread over three processes as fast as they go
/// are admitted exactly as one process would: the limit, then 429s.
#[test]
fn three_serve_processes_in_exact_mode_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    let dir = std::env::temp_dir();
    let cfg = config(&dir, "exact", &url(&redis), 10, "closed", "exact");
    let servers: Vec<Serve> = (0..3).map(|_| Serve::start(&cfg)).collect();
    let statuses: Vec<u16> = (0..30).map(|i| status(servers[i % 3].port)).collect();
    eprintln!("three serve processes, exact mode, 10 a minute by IP: {statuses:?}");
    let want: Vec<u16> = [vec![200; 10], vec![429; 20]].concat();
    assert_eq!(statuses, want);
}

/// Redis killed while three processes serve, in each mode: the policy answers (closed: 429
/// for a client with room left; open: 200 for one without; local share: each process goes on
/// deciding on its own), and after a restart the processes decide again.
#[test]
fn killing_redis_answers_by_each_policy() {
    for (mode, policy, want) in [
        ("synced", "closed", 429),
        ("synced", "open", 200),
        ("exact", "closed", 429),
        ("exact", "open", 200),
        ("synced", "local_share", 200),
        ("exact", "local_share", 200),
    ] {
        let mut redis = RedisServer::start();
        let dir = std::env::temp_dir();
        // Closed: room for many; open: room for none once spent (1 a minute).
        // Closed and local share: room for many (local share keeps admitting on this process's
        // own state); open: room for none once spent (1 a minute), so a 200 is the policy's.
        let limit = if policy == "open" { 1 } else { 1000 };
        let cfg = config(
            &dir,
            &format!("kill-{mode}"),
            &url(&redis),
            limit,
            policy,
            mode,
        );
        let servers: Vec<Serve> = (0..3).map(|_| Serve::start(&cfg)).collect();
        for s in &servers {
            let _ = status(s.port);
        }
        std::thread::sleep(Duration::from_millis(100));
        redis.kill();
        // Rounds fail, the breaker opens (3 failed rounds of 20 ms), the policy answers.
        let t = Instant::now();
        let mut seen = Vec::new();
        loop {
            let codes: Vec<u16> = servers.iter().map(|s| status(s.port)).collect();
            if codes.iter().all(|&c| c == want) {
                break;
            }
            seen.push(codes);
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{mode} {policy}: the policy never answered: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        if policy == "local_share" {
            // Still deciding locally, a while after the breaker opened.
            std::thread::sleep(Duration::from_millis(300));
            assert!(
                servers.iter().all(|s| status(s.port) == 200),
                "{mode} local_share"
            );
        }
        redis.restart();
        // After the restart Redis has no state: the processes decide again (closed: admitted).
        if policy == "closed" {
            let t = Instant::now();
            while !servers.iter().all(|s| status(s.port) == 200) {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "{mode} closed: no recovery"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        eprintln!("{mode} {policy}: Redis killed, every process answered {want}; recovered");
    }
}

/// What exact mode does not serve is a construction error that names synced mode: route and
/// global rules. Tiers (`headroom`) it serves, as the limiter's exact mode does.
#[test]
fn exact_mode_refuses_rules_and_serves_tiers() {
    use tollgate::http::{HttpConfig, RateLimitLayer};
    let redis = "[redis]\nurl = \"redis://127.0.0.1:1/\"\nmode = \"exact\"\n";
    let with_rule = format!(
        "[plans.free]\nlimit = 10\nwindow = \"1m\"\n[plans.burst]\nlimit = 5\nwindow = \"1s\"\n\
         [[http.routes]]\npath = \"/login\"\nplan = \"burst\"\n{redis}"
    );
    let err = RateLimitLayer::new(HttpConfig::parse(&with_rule).unwrap()).unwrap_err();
    assert!(err.to_string().contains("mode = \"synced\""), "{err}");
    let with_headroom = format!("[plans.free]\nlimit = 10\nwindow = \"1m\"\nheadroom = 2\n{redis}");
    let layer = RateLimitLayer::new(HttpConfig::parse(&with_headroom).unwrap()).unwrap();
    assert!(layer.limiter().is_exact());
}
