//! Three `tollgate rls` processes behind one real `redis-server`: requests spread over them are
//! admitted exactly as by one process in exact mode (`--redis-mode exact`), and within the
//! documented bound `limit + (N - 1) * min(limit, d)` in synced mode (`d`: what one process
//! admits in a round; here one request at a time, so `d` = 1).
#![cfg(all(feature = "rls", feature = "cli"))]

mod redis_support;
mod rls_support;

use redis_support::RedisServer;
use rls_support::*;

const LIMIT: usize = 10;

/// 30 requests for one descriptor, in turn to each of three processes: the codes in order.
fn codes(mode: &str) -> Vec<i32> {
    let redis = RedisServer::start();
    let url = format!("redis://127.0.0.1:{}/", redis.port);
    let dir =
        std::env::temp_dir().join(format!("tollgate-rls-redis-{mode}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("shared.yaml"),
        format!("domain: shared\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}}}\n"),
    )
    .unwrap();
    let programs: Vec<Program> = (0..3)
        .map(|_| Program::start(&dir, &["--redis", &url, "--redis-mode", mode]))
        .collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut clients = Vec::new();
        for p in &programs {
            clients.push(connect(p.grpc).await);
        }
        let mut out = Vec::new();
        for i in 0..3 * LIMIT {
            let r = clients[i % 3]
                .should_rate_limit(request("shared", vec![desc(&[("user", "ada")], None)], 0))
                .await
                .unwrap()
                .into_inner();
            out.push(r.overall_code);
            if mode == "synced" {
                // Let a round carry each admission to the others (the bound's `d` = 1).
                tokio::time::sleep(std::time::Duration::from_millis(150)).await;
            }
        }
        out
    })
}

#[test]
fn three_processes_in_exact_mode_admit_exactly_the_limit() {
    let codes = codes("exact");
    let want: Vec<i32> = [vec![OK; LIMIT], vec![OVER; 2 * LIMIT]].concat();
    assert_eq!(codes, want);
}

#[test]
fn three_processes_in_synced_mode_stay_within_the_bound() {
    let codes = codes("synced");
    let admitted = codes.iter().filter(|&&c| c == OK).count();
    assert!(
        (LIMIT..=LIMIT + 2).contains(&admitted),
        "{admitted} admitted: {codes:?}"
    );
    assert!(codes[..LIMIT].iter().all(|&c| c == OK), "{codes:?}");
    assert!(codes[2 * LIMIT..].iter().all(|&c| c == OVER), "{codes:?}");
}
