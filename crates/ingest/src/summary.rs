//! What an ingest answers: the summary of a run, or why it stopped.

use opledger_domain::BatchId;
use opledger_engine::EngineError;
use opledger_worker::PoolError;
use serde::Serialize;
use thiserror::Error;

/// A review-queue entry for a file of this run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReviewEntry {
    pub entry_id: i64,
    pub path: Option<String>,
    pub kind: String,
    pub reason_code: String,
    pub detail: Option<String>,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IngestSummary {
    pub batch_id: Option<BatchId>,
    /// Files found in the folder.
    pub files: usize,
    /// Files the ledger had no media item for.
    pub new: usize,
    /// Files whose last ingestion matches them (same size and modification
    /// time): nothing to do.
    pub unchanged: usize,
    /// Files with a media item whose last ingestion no longer matches them.
    pub changed: usize,
    /// Files whose ingestion an earlier run left unfinished (stopped or
    /// killed): taken over where it was.
    pub resumed: usize,
    /// Files that could not be read or whose image tasks failed for good.
    pub failed: usize,
    /// Files recorded as gone from disk since the last run.
    pub missing: usize,
    /// Folders that could not be read, recorded by this run (each a review
    /// entry; the walk went on without them).
    pub unreadable_folders: usize,
    /// Entries of the folder that are not regular files (links, FIFOs,
    /// sockets, devices): never opened, each with the reason.
    pub skipped: Vec<SkippedFile>,
    /// Operations this run created (ingestions and tasks).
    pub operations_created: usize,
    /// Open review entries of this folder's files.
    pub review_entries: Vec<ReviewEntry>,
    /// Image task executions in this run.
    pub tasks_run: u64,
    pub wall_seconds: f64,
    /// Set when a stop was asked for and the run ended early.
    pub interrupted: Option<Interrupted>,
}

/// An entry of the folder the walk did not open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedFile {
    pub path: String,
    pub reason: String,
}

/// What an ingest stopped early left for the next run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Interrupted {
    /// Who asked it to stop (`SIGINT`, `SIGTERM`).
    pub by: String,
    /// Files of the folder not settled: the next ingest takes them over.
    pub files_left: usize,
    /// Task claims interrupted and queued again (tasks that were running
    /// when the run stopped).
    pub tasks_interrupted: u64,
}

#[derive(Debug, Error)]
pub enum IngestError {
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Pool(#[from] PoolError),
}

impl IngestError {
    /// The engine's refusal inside, if that is what stopped the ingest:
    /// what the command line's exit code is taken from. *Why a method:*
    /// the variants are transparent, so an error chain walks past the
    /// engine's error to its own source, and a conflict read as "no engine
    /// error" exited 5 (unavailable) instead of 3.
    pub fn engine_error(&self) -> Option<&EngineError> {
        match self {
            IngestError::Engine(error) | IngestError::Pool(PoolError::Engine(error)) => Some(error),
            IngestError::Io(_) | IngestError::Pool(_) => None,
        }
    }
}
