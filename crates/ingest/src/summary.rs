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
    pub new: usize,
    pub unchanged: usize,
    pub changed: usize,
    /// Files whose image tasks failed for good.
    pub failed: usize,
    /// Files recorded as gone from disk since the last run.
    pub missing: usize,
    /// Operations this run created (ingestions and tasks).
    pub operations_created: usize,
    /// Open review entries of this folder's files.
    pub review_entries: Vec<ReviewEntry>,
    /// Image task executions in this run.
    pub tasks_run: u64,
    pub wall_seconds: f64,
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
