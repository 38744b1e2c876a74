//! `tollgate rls`: Envoy's global rate limit service on the engine, over gRPC and HTTP, with
//! the config watched and reloaded, and a graceful shutdown on SIGTERM / SIGINT.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;
use tollgate::redis::RedisConfig;
use tollgate::rls::{
    Backend, GRPC_SERVICE_NAME, RlsConfig, RlsService, grpc_service, http_router, read_sources,
};

use crate::Fail;

/// The command's options.
pub(crate) struct RlsArgs {
    pub(crate) config: PathBuf,
    pub(crate) grpc: String,
    pub(crate) http: String,
    pub(crate) redis: Option<String>,
    pub(crate) redis_mode: String,
}

fn addr(option: &str, value: &str) -> Result<SocketAddr, Fail> {
    value.parse().map_err(|_| {
        Fail::Usage(format!(
            "option '{option}' expects ADDRESS:PORT like 127.0.0.1:8081, got '{value}'"
        ))
    })
}

fn backend(args: &RlsArgs) -> Result<Backend, Fail> {
    let Some(url) = &args.redis else {
        return Ok(Backend::InProcess);
    };
    let config = RedisConfig::new(url);
    match args.redis_mode.as_str() {
        "exact" => Ok(Backend::RedisExact(config)),
        "synced" => Ok(Backend::RedisSynced(config)),
        other => Err(Fail::Usage(format!(
            "option '--redis-mode' expects 'exact' or 'synced', got '{other}'"
        ))),
    }
}

/// Serves until SIGTERM or SIGINT, then answers what is in flight and exits.
pub(crate) fn rls(args: RlsArgs) -> Result<(), Fail> {
    let grpc_addr = addr("--grpc", &args.grpc)?;
    let http_addr = addr("--http", &args.http)?;
    let backend = backend(&args)?;
    let config = RlsConfig::load(&args.config)
        .map_err(|e| Fail::Run(format!("cannot load the config: {e}")))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Fail::Run(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(run(args.config, config, backend, grpc_addr, http_addr))
}

async fn run(
    path: PathBuf,
    config: RlsConfig,
    backend: Backend,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
) -> Result<(), Fail> {
    let service = Arc::new(
        RlsService::with_backend(config, backend)
            .map_err(|e| Fail::Run(format!("cannot load the config: {e}")))?,
    );
    let grpc_listener = tokio::net::TcpListener::bind(grpc_addr)
        .await
        .map_err(|e| Fail::Run(format!("cannot listen on {grpc_addr} (gRPC): {e}")))?;
    let http_listener = tokio::net::TcpListener::bind(http_addr)
        .await
        .map_err(|e| Fail::Run(format!("cannot listen on {http_addr} (HTTP): {e}")))?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status(GRPC_SERVICE_NAME, tonic_health::ServingStatus::Serving)
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(watch_config(path, service.clone(), stop_rx.clone()));
    let grpc = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(grpc_service(service.clone()))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(grpc_listener),
            stopped(stop_rx.clone()),
        );
    let http = axum::serve(http_listener, http_router(service.clone()))
        .with_graceful_shutdown(stopped(stop_rx.clone()));
    eprintln!(
        "tollgate rls: serving domains {:?}: gRPC on {grpc_addr}, HTTP on {http_addr}",
        service.config().domains()
    );
    let signals = async move {
        crate::watch::stop_signal().await;
        eprintln!("tollgate rls: shutting down (answering requests in flight)");
        service.set_serving(false);
        for name in [GRPC_SERVICE_NAME, ""] {
            reporter
                .set_service_status(name, tonic_health::ServingStatus::NotServing)
                .await;
        }
        let _ = stop_tx.send(true);
    };
    let (grpc, http, ()) = tokio::join!(grpc, http, signals);
    grpc.map_err(|e| Fail::Run(format!("gRPC server: {e}")))?;
    http.map_err(|e| Fail::Run(format!("HTTP server: {e}")))?;
    eprintln!("tollgate rls: stopped");
    Ok(())
}

/// Resolves once the stop flag is set.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Reloads `service` from `path` whenever what it names changes (see [`watch::watch`]); a
/// config that cannot be read or loaded is counted and logged, and the running one kept.
async fn watch_config(path: PathBuf, service: Arc<RlsService>, stop: watch::Receiver<bool>) {
    let dir = path.clone();
    // Compared as read: a failure that repeats is logged once.
    let read = move || read_sources(&dir).map_err(|e| e.to_string());
    let changed = |now: &Result<Vec<(String, String)>, String>, _asked: bool| match now {
        Ok(sources) => reload(&path, &service, sources),
        Err(e) => {
            service.note_load_error();
            eprintln!("tollgate rls: keeping the previous config: {e}");
        }
    };
    crate::watch::watch(read, false, changed, stopped(stop)).await;
}

fn reload(path: &Path, service: &RlsService, sources: &[(String, String)]) {
    // A config the engine refuses is counted by `reload`; one that does not parse, here.
    let result = match RlsConfig::from_sources(sources) {
        Ok(c) => {
            let domains = c.domains();
            service.reload(c).map(|()| domains)
        }
        Err(e) => {
            service.note_load_error();
            Err(e)
        }
    };
    match result {
        Ok(domains) => eprintln!(
            "tollgate rls: reloaded {}: domains {domains:?}",
            path.display()
        ),
        Err(e) => eprintln!("tollgate rls: keeping the previous config: {e}"),
    }
}
