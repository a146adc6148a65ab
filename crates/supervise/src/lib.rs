//! Supervised execution: heavy jobs (the first is the ledger export) run
//! each in a child process of their own, started, watched and stopped by a
//! supervisor, with limits enforced from outside the child.
//!
//! What it owns: the supervisor loop (`supervisor`: slots taken through
//! one file lock per slot, shared by every supervisor on the machine; the
//! job's execution lock; heartbeats of the job and of the supervisor,
//! written by the supervisor every second, so they go on while the child
//! blocks; run-time, size and storage limits; SIGTERM, a grace, SIGKILL,
//! reaping and cleanup before anything is recorded; failing — never
//! re-running — a job whose supervisor died; the sweeping patrol), the
//! artifact directory's layout and its liveness files (`dir`, `live`),
//! registering, reading, cancelling and signing jobs and sweeping the
//! files they no longer need (`jobs`, `token`),
//! and the export job itself (`export`: a fold of the log up to the
//! pinned position, written as CSV or JSON with counted progress).
//!
//! What it must not know: SQL or a backend (it is generic over
//! [`opledger_store::Store`] through [`opledger_engine::Engine`], and a
//! job's life is recorded only by engine commands on an operation of kind
//! [`EXPORT_KIND`]); the command line (the binary parses and prints). The
//! child side (`export::run_child`) knows nothing of the supervisor beyond
//! its arguments, its standard output (one JSON line per progress report)
//! and SIGTERM.

pub mod attempts;
pub mod dir;
pub mod export;
pub mod jobs;
pub mod live;
pub mod locks;
pub mod supervisor;
pub mod token;
mod watch;

pub use dir::ArtifactDir;
pub use jobs::{cancel_export, create_export, export_status, ExportRequest, ExportStatus, Registered};
pub use supervisor::Supervisor;

use opledger_engine::EngineError;
use std::path::PathBuf;
use std::time::Duration;

/// The operation kind of export jobs. Not a declared task kind: an export
/// has no media item or region as its target, which every declared kind
/// has; it is the one built-in supervised kind.
pub const EXPORT_KIND: &str = "export";

/// The limits a supervisor enforces from outside its children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// A job running longer fails with `timeout`.
    pub run_time: Duration,
    /// A job whose artifact grows past this fails with `size_limit`.
    pub artifact_bytes: u64,
    /// Every artifact and temporary file of the directory together; a job
    /// that would take them past it fails with `storage_full`.
    pub storage_bytes: u64,
    /// How long an artifact is kept after its job succeeded.
    pub expiry: Duration,
    /// A job waiting in the queue longer fails with `queue_timeout`.
    pub queued_wait: Duration,
    /// A running job whose supervisor's heartbeat is older fails with
    /// `supervisor_lost`.
    pub staleness: Duration,
    /// Between SIGTERM and SIGKILL.
    pub grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            run_time: Duration::from_secs(120),
            artifact_bytes: 128 * 1024 * 1024,
            storage_bytes: 512 * 1024 * 1024,
            expiry: Duration::from_secs(600),
            queued_wait: Duration::from_secs(150),
            staleness: Duration::from_secs(15),
            grace: Duration::from_secs(5),
        }
    }
}

/// How a supervisor runs.
#[derive(Debug, Clone)]
pub struct SupervisorOptions {
    /// Children at once on this machine, shared by every supervisor of the
    /// directory (one lock file per slot).
    pub slots: usize,
    pub limits: Limits,
    /// This supervisor's name (its worker name on claims).
    pub name: String,
    /// The binary to re-exec for a child, and the database it opens.
    pub exe: PathBuf,
    pub database_url: String,
    /// How often it looks for queued jobs.
    pub poll: Duration,
    /// How often it sweeps.
    pub patrol: Duration,
}

/// Why a supervised job failed, as recorded on its operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailReason {
    Timeout,
    SizeLimit,
    StorageFull,
    QueueTimeout,
    SupervisorLost,
    ChildFailed,
}

impl FailReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::Timeout => "timeout",
            FailReason::SizeLimit => "size_limit",
            FailReason::StorageFull => "storage_full",
            FailReason::QueueTimeout => "queue_timeout",
            FailReason::SupervisorLost => "supervisor_lost",
            FailReason::ChildFailed => "child_failed",
        }
    }
}

/// What supervision can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A job token that is malformed, forged, or another principal's.
    #[error("{0}")]
    Token(String),
    /// The job's artifact is gone (expired) or never was (not succeeded).
    #[error("{0}")]
    Gone(String),
}

impl SuperviseError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SuperviseError {
        let context = context.into();
        move |source| SuperviseError::Io { context, source }
    }
}
