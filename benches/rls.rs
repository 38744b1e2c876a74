//! `ShouldRateLimit` over real gRPC on loopback: requests per second and p50 / p99 latency for
//! 1 and 8 connections, against the rate limit service (in process, Redis exact, Redis synced)
//! and against an empty handler on the same server stack (the floor of gRPC itself), with the
//! ratio to the floor. Client and server share the machine.
//!
//! `cd benches && cargo bench --features rls --bench rls` (about 30 s: 2 s per row; `RLS_BENCH_SECS` sets the
//! seconds per row). The Redis rows need `redis-server` on PATH (`scripts/ensure-redis.sh`); the
//! bench starts its own on a free port and stops it.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::redis::RedisConfig;
use tollgate::rls::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate::rls::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate::rls::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use tollgate::rls::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate::rls::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use tollgate::rls::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate::rls::{Backend, RlsConfig, RlsService, grpc_service};

/// Rounds per row (each `secs / ROUNDS` long), interleaved across the servers.
const ROUNDS: usize = 5;
/// Distinct descriptor values the clients cycle through.
const KEYS: usize = 1000;
const CONFIG: &str = "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 4000000000}\n";

/// The floor: a handler that answers OK (with one status, as the service does) and does nothing.
struct Empty;

#[tonic::async_trait]
impl RateLimitService for Empty {
    async fn should_rate_limit(
        &self,
        _request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: 1,
            statuses: vec![DescriptorStatus {
                code: 1,
                ..Default::default()
            }],
            ..Default::default()
        }))
    }
}

async fn serve<S>(svc: S) -> SocketAddr
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    addr
}

fn request(i: usize) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: format!("u{}", i % KEYS),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// (requests per second, p50 µs, p99 µs) of `conns` connections, each sending one request at a
/// time for `secs`.
async fn load(addr: SocketAddr, conns: usize, secs: f64) -> (f64, f64, f64) {
    let mut tasks = Vec::new();
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    for c in 0..conns {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = RateLimitServiceClient::new(channel);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut i = c * 7919;
            while Instant::now() < until {
                let t = Instant::now();
                let r = client.should_rate_limit(request(i)).await.unwrap();
                assert_eq!(r.into_inner().overall_code, 1);
                lat.push(t.elapsed().as_nanos() as u64);
                i += 1;
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() - 1) as f64 * p) as usize] as f64 / 1e3;
    (all.len() as f64 / elapsed, pct(0.50), pct(0.99))
}

/// A `redis-server` on a free port, stopped (by pid) when dropped.
struct Redis(Child, u16);

impl Redis {
    fn start() -> Option<Redis> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        for _ in 0..50 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(Redis(child, port));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let secs: f64 = std::env::var("RLS_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let redis = Redis::start();
    println!(
        "rls bench: ShouldRateLimit over gRPC on loopback, one descriptor, {KEYS} values, \
         {secs} s per row in {ROUNDS} interleaved rounds (the median round shown), client and \
         server in one process ({} threads)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "\n{:<22} {:>6} {:>12} {:>9} {:>9} {:>9}",
        "server", "conns", "req/s", "p50 µs", "p99 µs", "x floor"
    );
    rt.block_on(async {
        let floor = serve(RateLimitServiceServer::new(Empty)).await;
        let config = || RlsConfig::from_sources(&[("bench.yaml".into(), CONFIG.into())]).unwrap();
        let mut targets: Vec<(&str, SocketAddr)> = vec![("empty handler (floor)", floor)];
        let local = Arc::new(RlsService::new(config()).unwrap());
        targets.push(("rls in process", serve(grpc_service(local)).await));
        if let Some(r) = &redis {
            let url = format!("redis://127.0.0.1:{}/", r.1);
            for (name, backend) in [
                (
                    "rls redis exact",
                    Backend::RedisExact(RedisConfig::new(&url)),
                ),
                (
                    "rls redis synced",
                    Backend::RedisSynced(RedisConfig::new(&url)),
                ),
            ] {
                let s = Arc::new(RlsService::with_backend(config(), backend).unwrap());
                targets.push((name, serve(grpc_service(s)).await));
            }
        }
        // Warm-up: connections, the engine's tables, the allocator, the CPU's clocks.
        for (_, addr) in &targets {
            load(*addr, 8, 0.5).await;
        }
        for conns in [1, 8] {
            // Rounds interleave the servers, so a burst of other load on the machine falls on
            // all of them; each row is the round with its median rate.
            let mut rounds: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); targets.len()];
            for _ in 0..ROUNDS {
                for (i, (_, addr)) in targets.iter().enumerate() {
                    rounds[i].push(load(*addr, conns, secs / ROUNDS as f64).await);
                }
            }
            let mut floor_rate = 0.0;
            for ((name, _), mut r) in targets.iter().zip(rounds) {
                r.sort_by(|a, b| a.0.total_cmp(&b.0));
                let (rate, p50, p99) = r[r.len() / 2];
                if floor_rate == 0.0 {
                    floor_rate = rate;
                }
                println!(
                    "{name:<22} {conns:>6} {rate:>12.0} {p50:>9.1} {p99:>9.1} {:>9.2}",
                    rate / floor_rate
                );
            }
        }
    });
    if redis.is_none() {
        println!("\n(no redis-server on PATH: the Redis rows were left out)");
    }
}
