//! The opledger HTTP service (`opledger serve`): the JSON API under
//! `/api/v1`, the work protocol for workers in any language, live updates
//! as server-sent events, a dashboard page, metrics and health.
//!
//! It must not know SQL or which backend it runs on: it is generic over
//! [`opledger_store::Store`] and calls the engine exactly as the CLI does,
//! so a route answers what the matching command prints (the export routes
//! call `opledger_supervise` as `opledger export` does). It owns only what
//! is HTTP's: routes, roles by bearer token, the error shape, long-polls,
//! event streams, request limits, the page's files, and the download
//! attempts of export artifacts with the stream that hands each one out.
//! It must not know how a supervisor runs a job.

pub mod app;
pub mod auth;
pub mod error;
pub mod extract;
pub mod files;
pub mod guard;
pub mod metrics;
pub mod routes;
pub mod server;
pub mod wake;

pub use app::{App, ServiceConfig, DEFAULT_BODY_LIMIT, DEFAULT_MAX_TEXT_BYTES};
pub use auth::{entry_toml, new_token, Role, TokenEntry, Tokens, TokensError};
pub use error::{ApiError, ErrorBody};
pub use files::{Outputs, DEFAULT_MAX_FILE_BYTES};
pub use server::ConnectionLimits;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use opledger_engine::{CommandContext, Engine, EngineError};
use opledger_store::Store;
use std::future::Future;
use std::time::Instant;
use tower_http::catch_panic::CatchPanicLayer;
use utoipa::OpenApi;

/// The actor of the recovery the service runs.
pub const RECOVERY_ACTOR: &str = "recovery";

/// The OpenAPI 3.1 document of every route ([`routes::ApiPaths`]).
pub fn openapi() -> utoipa::openapi::OpenApi {
    #[derive(OpenApi)]
    #[openapi(
        info(title = "opledger", description = "An event-sourced operations ledger for media pipelines: \
            its JSON API, the work protocol over HTTP, and live updates."),
        components(schemas(ErrorBody)),
        modifiers(&BearerAuth)
    )]
    struct Document;
    let mut document = Document::openapi();
    document.merge(routes::ApiPaths::openapi());
    document.info.version = env!("CARGO_PKG_VERSION").to_string();
    document
}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Every route with the service's layers: the readiness gate, credentials
/// looked at before anything else of the request, the target and body
/// limits, the panic layer (a panic is a logged 500 in the error shape,
/// never a dropped connection), every error answer in the error shape, and
/// outermost the request log and latency histogram, so every answer is
/// measured, a panic's 500 included.
pub fn router<S: Store>(app: App<S>) -> Router {
    with_layers(routes::api_routes::<S>(), app)
}

/// `routes` with the service's layers (what [`router`] serves); tests
/// layer routes of their own with it, such as one that panics.
pub fn with_layers<S: Store>(routes: Router<App<S>>, app: App<S>) -> Router {
    let limit = app.config().body_limit;
    routes
        .fallback(not_found)
        .method_not_allowed_fallback(guard::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(app.clone(), gate::<S>))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            guard::authenticate_first::<S>,
        ))
        .layer(axum::middleware::from_fn(guard::bounded_target))
        .layer(DefaultBodyLimit::max(limit))
        .layer(CatchPanicLayer::custom(panicked))
        .layer(axum::middleware::from_fn(guard::error_shape))
        .layer(axum::middleware::from_fn_with_state(app.clone(), observe::<S>))
        .with_state(app)
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

/// The API answers 503 until startup recovery is done; health, the page
/// and the documents are served from the start.
async fn gate<S: Store>(State(app): State<App<S>>, request: Request, next: Next) -> Response {
    if request.uri().path().starts_with("/api/") && !app.is_ready() {
        return ApiError::unavailable("startup recovery is still running").into_response();
    }
    next.run(request).await
}

/// Measures and logs every request: method, matched route, status and
/// latency, in the request log (`tracing`, JSON with `--log-format json`)
/// and in the latency histogram.
pub async fn observe<S: Store>(State(app): State<App<S>>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |path| path.as_str().to_string());
    let response = next.run(request).await;
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    app.metrics().request(&method, &route, status, elapsed);
    let latency_ms = elapsed.as_secs_f64() * 1000.0;
    if response.status().is_server_error() {
        tracing::warn!(%method, %route, status, latency_ms, "request");
    } else {
        tracing::info!(%method, %route, status, latency_ms, "request");
    }
    response
}

fn panicked(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let message = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a handler panicked");
    tracing::error!(panic = message, "a request handler panicked");
    ApiError::internal("the service failed on this request; it is logged").into_response()
}

/// Runs the service on `listener` until `shutdown` resolves: answers
/// health at once, runs startup (projections to the head, maintenance,
/// recovery of expired claims) and only then reports ready, runs recovery
/// every `recovery_interval`, and looks at the log's head for other
/// processes' commits. On shutdown it stops taking claims, answers
/// long-polls with no work, ends event streams, finishes requests in
/// flight, and returns.
pub async fn serve<S: Store>(
    app: App<S>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let router = router(app.clone());
    let stopping = app.clone();
    let graceful = async move {
        shutdown.await;
        tracing::info!("shutting down: no new claims; finishing requests in flight");
        stopping.stop();
    };
    let limits = app.config().connections;
    let server = tokio::spawn(server::run(listener, router, limits, graceful));
    let startup = start(&app).await;
    if let Err(error) = startup {
        app.stop();
        server.abort();
        return Err(ServeError::Startup(error));
    }
    app.set_ready();
    tracing::info!("ready");
    let upkeep = tokio::spawn(upkeep(app.clone()));
    let served = server.await;
    upkeep.abort();
    match served {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(ServeError::Io(error)),
        Err(error) => Err(ServeError::Io(std::io::Error::other(error))),
    }
}

/// Why the service stopped other than by a shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("startup: {0}")]
    Startup(EngineError),
    #[error(transparent)]
    Io(std::io::Error),
}

async fn start<S: Store>(app: &App<S>) -> Result<(), EngineError> {
    let engine = app.engine();
    let report = engine.startup().await?;
    for (name, from, to, events) in &report.rebuilt {
        tracing::info!(projection = name, from, to, events, "projection rebuilt");
    }
    engine.maintain(&CommandContext::actor("system")).await?;
    let recovered = engine.recover(&CommandContext::actor(RECOVERY_ACTOR)).await?;
    tracing::info!(
        interrupted = recovered.interrupted,
        requeued = recovered.requeued,
        "startup recovery done"
    );
    app.metrics().count_from(engine.store().head().await?).await;
    app.wake().bump();
    Ok(())
}

/// What the service does on its own while it runs: recovery of expired
/// claims every `recovery_interval`, and a look at the log's head every
/// `head_poll` that wakes waiters when another process committed.
async fn upkeep<S: Store>(app: App<S>) {
    let config = app.config().clone();
    let mut recovery = tokio::time::interval(config.recovery_interval);
    let mut head_poll = tokio::time::interval(config.head_poll);
    recovery.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    head_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut head = None;
    loop {
        tokio::select! {
            _ = recovery.tick() => {
                match app.engine().recover(&CommandContext::actor(RECOVERY_ACTOR)).await {
                    Ok(report) if report.interrupted > 0 => {
                        tracing::info!(interrupted = report.interrupted, requeued = report.requeued, "recovered expired claims");
                        app.wake().bump();
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "periodic recovery failed"),
                }
            }
            _ = head_poll.tick() => {
                match app.engine().store().head().await {
                    Ok(now) if head != Some(now) => {
                        head = Some(now);
                        app.wake().bump();
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "reading the log's head failed"),
                }
            }
            _ = app.stopped() => return,
        }
    }
}

/// A service over `engine` (not yet started; [`serve`] starts it).
pub fn app<S: Store>(engine: Engine<S>, config: ServiceConfig) -> App<S> {
    App::new(engine, config)
}
