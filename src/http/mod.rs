//! HTTP integration (feature `http`): a `tower::Layer` for axum 0.8, hyper 1 and tonic that
//! answers 429 with `Retry-After` and a JSON body, writes `X-RateLimit-*` and IETF `RateLimit`
//! headers, keys clients by address (behind trusted proxies), API key, user or a composite,
//! resolves plans per request, and applies each plan's strategy.
//!
//! Configuration is one TOML file: the engine's `[plans.*]` tables plus `[http]` (see
//! `examples/plans.toml` and [`HttpConfig`]).
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{Router, routing::get};
//! use tollgate::http::{HttpConfig, RateLimitLayer};
//!
//! let config = HttpConfig::parse(r#"
//! [plans.free]
//! limit = 100
//! window = "1h"
//!
//! [http]
//! trusted_proxies = ["127.0.0.1"]
//! "#)?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(config)?);
//! // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
//! # let _ = app.into_make_service_with_connect_info::<SocketAddr>();
//! # Ok::<(), tollgate::Error>(())
//! ```

mod config;
#[cfg(test)]
pub(crate) use config::RawFile;
mod format;
mod grpc;
mod headers;
mod keys;
mod layer;
mod metrics;

pub use config::{HeaderStyle, HttpConfig, KeySource, Rule};
pub use headers::{HeaderPolicy, RateLimitHeaders, headers};
pub use keys::{
    ClientKey, ForwardedHeader, Hop, KeyError, MAX_HOPS, MAX_KEY_LEN, OnBadKey, TrustedProxies,
    api_key_from_headers, client_ip, client_ip_from_headers, parse_forwarded,
    parse_x_forwarded_for,
};
pub use layer::{
    Denied, HttpKey, PlanFuture, RateLimit, RateLimitBody, RateLimitLayer, ResponseFuture,
};

/// The HTTP guide (`docs/http.md`): its examples compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/http.md")]
struct Guide;
