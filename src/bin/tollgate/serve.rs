//! `tollgate serve`: a small axum server behind the rate-limit layer, to watch the headers
//! count down with `curl -i`, and `/metrics` in the Prometheus text format. It reloads its
//! config on SIGHUP and when the file changes, and stops gracefully on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::Router;
use axum::extract::Path;
use axum::routing::{any, get, post};
use tollgate::http::{HttpConfig, RateLimitLayer};

use crate::{Fail, watch};

/// Serves until the process is interrupted or terminated (one runtime thread: a demo, not a
/// production server); requests in flight are answered first.
pub(crate) fn serve(config: &str, listen: &str) -> Result<(), Fail> {
    let path = PathBuf::from(config);
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
    warn(&layer);
    let plans = layer.limiter().plan_names().join(", ");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Fail::Run(format!("cannot listen on {addr}: {e}")))?;
        let bound = listener
            .local_addr()
            .map_err(|e| Fail::Run(format!("cannot read the bound address: {e}")))?;
        let metrics = layer.clone();
        tokio::spawn(watch_config(path, layer.clone()));
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
        .with_graceful_shutdown(watch::stop_signal())
        .await
        .map_err(|e| Fail::Run(format!("server error: {e}")))
    })
}

/// Says on stderr which settings of the config cannot take effect.
fn warn(layer: &RateLimitLayer) {
    for w in layer.warnings() {
        eprintln!("tollgate serve: warning: {w}");
    }
}

/// Reloads `layer` from `path` on SIGHUP and whenever the file's contents change (see
/// [`watch::watch`]), keeping every unchanged limit's state. A file that cannot be read or is
/// not a valid config leaves the running config in place, and says why on stderr.
async fn watch_config(path: PathBuf, layer: RateLimitLayer) {
    let file = path.clone();
    let read = move || std::fs::read_to_string(&file).map_err(|e| format!("cannot read it: {e}"));
    let shown = path.display();
    let reload = |text: &Result<String, String>, _asked: bool| {
        let reloaded = text.as_ref().map_err(Clone::clone).and_then(|text| {
            HttpConfig::parse(text)
                .and_then(|config| layer.reload(config))
                .map_err(|e| e.to_string())
        });
        match reloaded {
            Ok(()) => {
                eprintln!("tollgate serve: reloaded '{shown}'");
                warn(&layer);
            }
            Err(e) => eprintln!("tollgate serve: kept the running config; '{shown}': {e}"),
        }
    };
    watch::watch(read, true, reload, std::future::pending()).await;
}
