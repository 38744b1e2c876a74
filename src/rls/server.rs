//! The service's two front doors: the gRPC `RateLimitService` (plus `grpc.health.v1`) and the
//! HTTP port (`GET /healthcheck`, `POST /json`, `GET /metrics`).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::json::{parse_request, response_json};
use super::service::RlsService;

/// The gRPC face of an [`RlsService`].
#[derive(Debug, Clone)]
pub struct Grpc(pub Arc<RlsService>);

#[tonic::async_trait]
impl RateLimitService for Grpc {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        // A request error is a plain error upstream, which gRPC reports as UNKNOWN.
        self.0
            .decide(request.get_ref())
            .await
            .map(tonic::Response::new)
            .map_err(|e| tonic::Status::unknown(e.0))
    }
}

/// The tonic service to add to a `tonic::transport::Server`.
pub fn grpc_service(service: Arc<RlsService>) -> RateLimitServiceServer<Grpc> {
    RateLimitServiceServer::new(Grpc(service))
}

/// The fully qualified gRPC service name (for the health service).
pub const GRPC_SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The HTTP port's routes.
pub fn http_router(service: Arc<RlsService>) -> Router {
    Router::new()
        .route("/healthcheck", get(healthcheck))
        .route("/json", post(json))
        .route("/metrics", get(metrics))
        .with_state(service)
}

async fn healthcheck(State(s): State<Arc<RlsService>>) -> Response {
    if s.is_serving() {
        (StatusCode::OK, "OK").into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "shutting down").into_response()
    }
}

async fn json(State(s): State<Arc<RlsService>>, body: Bytes) -> Response {
    let req = match parse_request(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("bad request: {e}\n")).into_response(),
    };
    match s.decide(&req).await {
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
        Ok(resp) => {
            let status = if resp.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                response_json(&resp).to_string(),
            )
                .into_response()
        }
    }
}

async fn metrics(State(s): State<Arc<RlsService>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics_text(),
    )
        .into_response()
}
