//! `tollgate serve`: a small axum server behind the rate-limit layer, to watch the headers
//! count down with `curl -i`, and `/metrics` in the Prometheus text format.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::Path;
use axum::routing::{any, get, post};
use tollgate::http::{HttpConfig, RateLimitLayer};

use crate::Fail;

/// Serves until the process is interrupted (one runtime thread: a demo, not a production server).
pub(crate) fn serve(config: &str, listen: &str) -> Result<(), Fail> {
    let addr: SocketAddr = listen.parse().map_err(|_| {
        Fail::Usage(format!(
            "option '--listen' expects ADDRESS:PORT like 127.0.0.1:8080, got '{listen}'"
        ))
    })?;
    let config = HttpConfig::from_file(config)
        .map_err(|e| Fail::Run(format!("cannot load '{config}': {e}")))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Fail::Run(format!("cannot start the runtime: {e}")))?;
    // Inside the runtime: with a `[redis]` table the limiter starts its rounds on it.
    let layer = {
        let _in_runtime = runtime.enter();
        RateLimitLayer::new(config)
            .map_err(|e| Fail::Run(format!("cannot build the limiter: {e}")))?
    };
    let plans = layer.limiter().plan_names().join(", ");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Fail::Run(format!("cannot listen on {addr}: {e}")))?;
        let bound = listener
            .local_addr()
            .map_err(|e| Fail::Run(format!("cannot read the bound address: {e}")))?;
        let metrics = layer.clone();
        let app = Router::new()
            .route("/", get(|| async { "hello from tollgate\n" }))
            .route("/login", post(|| async { "login attempt recorded\n" }))
            .route(
                "/api/{*path}",
                any(|Path(path): Path<String>| async move { format!("api: /{path}\n") }),
            )
            .layer(layer)
            // Not rate-limited: added after the layer.
            .route("/metrics", get(move || async move { metrics.metrics() }));
        {
            // Written, not printed: a closed stdout (a parent that read the first line and
            // went) must not stop the server.
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(
                out,
                "tollgate serve: listening on http://{bound} (plans: {plans})"
            );
            let _ = writeln!(
                out,
                "  try: curl -i http://{bound}/    and    curl -s http://{bound}/metrics"
            );
            let _ = out.flush();
        }
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .map_err(|e| Fail::Run(format!("server error: {e}")))
    })
}
