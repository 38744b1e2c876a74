//! Envoy's global rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) on the
//! engine, configured by envoyproxy/ratelimit's YAML files, answering as it does (feature `rls`;
//! the `tollgate rls` command serves it).
//!
//! - [`RlsConfig`]: the YAML files (one domain each) and their descriptor trees.
//! - [`RlsService`]: matching, counting on a [`Limiter`](crate::Limiter) (in process or on
//!   Redis), reloads that keep counters, upstream's stats.
//! - [`grpc_service`] and [`http_router`]: the gRPC service and the HTTP port
//!   (`/healthcheck`, `/json`, `/metrics`).
//!
//! `docs/rls.md` has the semantics, the differences from upstream and the extras.

mod all;
mod config;
mod json;
mod matching;
mod server;
mod service;
mod stats;

pub use config::{ConfigError, RateLimit, RlsConfig, Unit, read_sources};
pub use server::{GRPC_SERVICE_NAME, Grpc, grpc_service, http_router};
pub use service::{Backend, RequestError, RlsService};
pub use stats::LimitStats;

/// The generated Envoy types the service speaks (re-exported from `envoy-types`).
pub use envoy_types::pb;
