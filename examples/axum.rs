//! A runnable axum 0.8 server behind the rate-limit layer, configured from `examples/plans.toml`,
//! with an async plan resolver (API key -> plan, as a database lookup would be) and the
//! authenticated user from a header your auth layer would have checked.
//!
//! ```sh
//! cargo run --example axum --features http          # listens on 127.0.0.1:3000
//! curl -i http://127.0.0.1:3000/                    # X-RateLimit-Remaining counts down
//! curl -i -H 'x-api-key: demo-pro-key' http://127.0.0.1:3000/
//! curl -s http://127.0.0.1:3000/metrics
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tollgate::http::{HttpConfig, RateLimitLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plans.toml");
    let config = HttpConfig::from_file(path)?;

    // Stands in for a database of customers: API key -> plan name.
    let customers: Arc<HashMap<String, String>> = Arc::new(HashMap::from([
        ("demo-pro-key".to_string(), "pro".to_string()),
        ("demo-batch-key".to_string(), "batch".to_string()),
    ]));
    let layer = RateLimitLayer::new(config)?
        .resolver(move |parts, _client| {
            // Copy what the lookup needs out of the request, then look it up asynchronously.
            let key = parts
                .headers
                .get("x-api-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let customers = Arc::clone(&customers);
            Box::pin(async move { customers.get(&key?).cloned() })
        })
        .user(|parts| {
            // An auth layer in front would have verified this; here it is taken as given.
            parts
                .headers
                .get("x-user")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        });

    let metrics = layer.clone();
    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/api/{*rest}", get(|| async { "api\n" }))
        .layer(layer)
        .route("/metrics", get(move || async move { metrics.metrics() }));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    // Connect info gives the layer each request's peer address.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
