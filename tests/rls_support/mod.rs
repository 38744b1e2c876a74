//! Shared by the `tollgate rls` tests: a tonic client from envoy-types, the service served in
//! process on loopback, and the `tollgate rls` program started on free ports and stopped by pid.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::rls::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use tollgate::rls::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use tollgate::rls::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate::rls::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate::rls::pb::google::protobuf::UInt64Value;
use tollgate::rls::{RlsConfig, RlsService, grpc_service};

pub type Client = RateLimitServiceClient<tonic::transport::Channel>;

pub const OK: i32 = 1;
pub const OVER: i32 = 2;

pub fn config(yaml: &str) -> RlsConfig {
    RlsConfig::from_sources(&[("test.yaml".into(), yaml.into())]).expect("a valid config")
}

/// A descriptor of (key, value) entries, with its own hits_addend if given.
pub fn desc(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        limit: None,
        hits_addend: hits.map(|value| UInt64Value { value }),
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: hits,
    }
}

/// (code, requests_per_unit, limit_remaining) of status `i`.
pub fn status(r: &RateLimitResponse, i: usize) -> (i32, u32, u32) {
    let s = &r.statuses[i];
    (
        s.code,
        s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit),
        s.limit_remaining,
    )
}

/// Serves `service` over gRPC on a loopback port; the server stops when the runtime does.
pub async fn serve_in_process(service: Arc<RlsService>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(grpc_service(service))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    addr
}

pub async fn connect(addr: SocketAddr) -> Client {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
        match endpoint.connect().await {
            Ok(channel) => return RateLimitServiceClient::new(channel),
            Err(e) if Instant::now() > deadline => panic!("cannot connect to {addr}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

pub fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A `tollgate rls` process, killed (by its pid) when dropped.
pub struct Program {
    pub child: Child,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
}

impl Program {
    /// Starts `tollgate rls` and waits for its "serving" line.
    pub fn start(config: &Path, extra: &[&str]) -> Program {
        let (grpc, http) = (free_addr(), free_addr());
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["rls", "--config"])
            .arg(config)
            .args(["--grpc", &grpc.to_string(), "--http", &http.to_string()])
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tollgate rls");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        assert!(first.contains("serving"), "tollgate rls said: {first}");
        // Keep reading stderr so the program never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Program { child, grpc, http }
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -TERM failed");
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the current Unix minute has at least `secs` seconds left, so a test of a
/// per-minute limit runs in one window.
pub fn settle_in_minute(secs: u64) {
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        if 60 - now % 60 >= secs {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
