use opledger_engine::EngineError;
use opledger_store::StoreError;

/// Why a benchmark could not run. The engine's and the store's errors stay
/// themselves, so the binary gives them their usual exit codes.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Ingest(#[from] opledger_ingest::IngestError),
    #[error(transparent)]
    Media(#[from] opledger_media::MediaError),
    #[error(transparent)]
    Compute(#[from] opledger_worker::ComputeError),
    /// A floor's plain statement failed.
    #[error("{context}: {source}")]
    Floor { context: &'static str, source: sqlx::Error },
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    /// The workload or the URL cannot be run as asked.
    #[error("{0}")]
    Invalid(String),
    /// A task of the workload panicked or was cancelled.
    #[error("{0}")]
    Task(String),
}

impl BenchError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
        let context = context.into();
        move |source| BenchError::Io { context, source }
    }

    pub(crate) fn floor(context: &'static str) -> impl FnOnce(sqlx::Error) -> BenchError {
        move |source| BenchError::Floor { context, source }
    }

    pub(crate) fn task(what: &str) -> impl FnOnce(tokio::task::JoinError) -> BenchError + '_ {
        move |error| BenchError::Task(format!("{what}: {error}"))
    }
}
