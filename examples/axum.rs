//! A runnable axum 0.8 server behind the rate-limit layer, configured from `examples/plans.toml`,
//! keyed by the authenticated user (from a header your auth layer would have checked), with an
//! async plan resolver (API key -> plan, as a database lookup would be).
//!
//! ```sh
//! cargo run --example axum --features http          # listens on 127.0.0.1:3000
//! curl -i -H 'x-user: alice' http://127.0.0.1:3000/  # alice's own bucket counts down
//! curl -i -H 'x-user: bob' http://127.0.0.1:3000/    # bob's is another
//! curl -i -H 'x-user: carol' -H 'x-api-key: demo-pro-key' http://127.0.0.1:3000/
//! curl -s http://127.0.0.1:3000/metrics
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tollgate::http::{HttpConfig, KeySource, RateLimitLayer};

/// The layer: `examples/plans.toml`'s plans and rules, keyed by user (a request without a user
/// is anonymous and keyed by its address), plans from the customer database.
pub fn layer() -> Result<RateLimitLayer, tollgate::Error> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/plans.toml");
    let config = HttpConfig::from_file(path)?
        // plans.toml keys by address (`tollgate serve` knows no users); this app knows them.
        .key([KeySource::User])
        // The customer database below answers for API keys instead of the file's table.
        .api_keys(Vec::<(String, String)>::new());

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
            async move { customers.get(&key?).cloned() }
        })
        .user(|parts| {
            // An auth layer in front would have verified this; here it is taken as given.
            parts
                .headers
                .get("x-user")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        });
    Ok(layer)
}

/// The app: `/` and `/api/...` behind the layer, `/metrics` beside it.
pub fn app(layer: RateLimitLayer) -> Router {
    let metrics = layer.clone();
    Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/api/{*rest}", get(|| async { "api\n" }))
        .layer(layer)
        .route("/metrics", get(move || async move { metrics.metrics() }))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let layer = layer()?;
    for warning in layer.warnings() {
        eprintln!("warning: {warning}");
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    // Connect info gives the layer each request's peer address.
    axum::serve(
        listener,
        app(layer).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
