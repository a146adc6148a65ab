//! The service's shared state: the engine, the configuration, the tokens,
//! readiness and shutdown, the wake-up of long-polls, and the download
//! attempts of export artifacts.

use crate::auth::Tokens;
use crate::files::{Outputs, DEFAULT_MAX_FILE_BYTES};
use crate::metrics::Metrics;
use crate::server::ConnectionLimits;
use crate::wake::Wake;
use opledger_engine::Engine;
use opledger_store::Store;
use opledger_supervise::attempts::Attempts;
use opledger_supervise::ArtifactDir;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How the service runs (`opledger serve`'s flags).
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub tokens: Tokens,
    /// Reading routes answer requests without a token.
    pub allow_anonymous_read: bool,
    /// The largest request body read; a larger one is 413 before it is parsed.
    pub body_limit: usize,
    /// How often the service runs recovery (expired leases) itself.
    pub recovery_interval: Duration,
    /// How often the log's head is looked at for commits of other
    /// processes (other `serve` processes, CLI writers) that wake
    /// long-polls and event streams.
    pub head_poll: Duration,
    /// The longest a claim long-poll waits (`wait_ms` is capped here).
    pub max_wait: Duration,
    /// Between server-sent events' heartbeat comments.
    pub sse_heartbeat: Duration,
    /// The artifact directory the supervisors of this ledger share; without
    /// one the export routes answer 503.
    pub artifact_dir: Option<ArtifactDir>,
    /// The directories worker-reported output files are served from, and
    /// the largest file served ([`crate::files`]).
    pub outputs: Outputs,
    /// Connection bounds: the cap, the header-read timeout, the shutdown grace.
    pub connections: ConnectionLimits,
    /// The time a client has to send a request's body once its headers
    /// came; a slower one is answered 408.
    pub body_timeout: Duration,
    /// The longest text a body may carry in any field, and the largest
    /// output (serialized), in bytes: the CLI's `--max-text-bytes`.
    pub max_text_bytes: usize,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            tokens: Tokens::none(),
            allow_anonymous_read: false,
            body_limit: DEFAULT_BODY_LIMIT,
            recovery_interval: Duration::from_secs(5),
            head_poll: Duration::from_millis(250),
            max_wait: Duration::from_secs(30),
            sse_heartbeat: Duration::from_secs(15),
            artifact_dir: None,
            outputs: Outputs::new([], DEFAULT_MAX_FILE_BYTES),
            connections: ConnectionLimits::default(),
            body_timeout: Duration::from_secs(30),
            max_text_bytes: DEFAULT_MAX_TEXT_BYTES,
        }
    }
}

/// 1 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 1 << 20;

/// 64 KiB: the CLI's default `--max-text-bytes`.
pub const DEFAULT_MAX_TEXT_BYTES: usize = 64 * 1024;

/// The state every handler gets: cheap to clone.
pub struct App<S: Store> {
    inner: Arc<Inner<S>>,
}

impl<S: Store> Clone for App<S> {
    fn clone(&self) -> Self {
        App {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<S: Store> {
    engine: Engine<S>,
    config: ServiceConfig,
    ready: AtomicBool,
    stopping: watch::Sender<bool>,
    wake: Wake,
    metrics: Metrics,
    attempts: Attempts,
}

impl<S: Store> App<S> {
    /// A service over `engine`, not ready until [`App::set_ready`].
    pub fn new(engine: Engine<S>, config: ServiceConfig) -> Self {
        let (stopping, _) = watch::channel(false);
        let metrics = Metrics::new();
        // The engine's write timings land in this service's histograms.
        let engine = engine.with_write_observer(metrics.write_observer());
        App {
            inner: Arc::new(Inner {
                engine,
                config,
                ready: AtomicBool::new(false),
                stopping,
                wake: Wake::new(),
                metrics,
                attempts: Attempts::default(),
            }),
        }
    }

    pub fn engine(&self) -> &Engine<S> {
        &self.inner.engine
    }

    pub fn config(&self) -> &ServiceConfig {
        &self.inner.config
    }

    /// Startup recovery is done: the API serves.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self) {
        self.inner.ready.store(true, Ordering::Release);
    }

    /// Shutdown began: no new claims, long-polls and event streams end.
    pub fn is_stopping(&self) -> bool {
        *self.inner.stopping.borrow()
    }

    pub fn stop(&self) {
        self.inner.stopping.send_replace(true);
    }

    /// Resolves once shutdown began.
    pub async fn stopped(&self) {
        let mut stopping = self.inner.stopping.subscribe();
        // An error means the sender is gone, which happens only with the app.
        let _ = stopping.wait_for(|stopping| *stopping).await;
    }

    /// What wakes long-polls and event streams.
    pub fn wake(&self) -> &Wake {
        &self.inner.wake
    }

    /// This service's download attempts of export artifacts (held in
    /// memory: an attempt is one service's, as is the connection that
    /// streams it). Their time is the engine's clock, which tests inject.
    pub fn attempts(&self) -> &Attempts {
        &self.inner.attempts
    }

    /// This service's metrics (its own recorder, not a process-global one).
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }
}
