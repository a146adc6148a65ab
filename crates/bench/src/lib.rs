//! opledger's benchmarks: the workloads behind `opledger bench`, the raw
//! floor each is measured against in the same run, and the throwaway
//! databases they run in. [`run`] builds its own databases (files in a
//! folder of its own, or databases of its own on the server a `postgres://`
//! URL names), runs one workload, and returns one JSON object with our
//! figure, the floor and their ratio; the binary prints it. Tests never
//! assert on these numbers; people read them (`docs/benchmarks.md`).
//!
//! This crate must not be a dependency of any product crate
//! (`tests/it/architecture/dependencies.rs`): measurement code, its raw SQL
//! and its temporary files stay out of what a library user links. It
//! reaches the ledger only through the engine's public commands and
//! queries, and the databases only through the stores' public
//! raw-connection hooks and the PostgreSQL crate's `databases` functions,
//! so what it measures is what a user's code would get.

mod backend;
mod cpu;
mod error;
pub mod events;
mod export;
pub mod floor;
mod http;
mod ingest;
pub mod lifecycle;
mod listings;
mod log;
mod photos;
mod queries;
mod record;
pub mod stats;

pub use error::BenchError;

use backend::{PostgresBench, SqliteBench};
use opledger_store_postgres::PostgresConfig;
use opledger_store_sqlite::SqliteConfig;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The start of every generated log's clock (microseconds since the epoch).
const START: i64 = 1_796_000_000_000_000;

/// Which workload a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Durable appends with inline projections, batched and unbatched.
    Append,
    /// Rebuilding every projection from the log.
    Replay,
    /// Tasks through request, claim and complete with every projection updated, N workers.
    Lifecycle,
    /// `opledger ingest` of generated images with N workers; the ledger's share of the wall time.
    Ingest,
    /// Latency of the dashboard summary in a log of `events` events.
    Status,
    /// Latency of one operation's timeline in a log of `events` events.
    Timeline,
    /// Seconds and peak RSS of exporting `operations` as CSV from a log of
    /// `events` events (SQLite), beside a plain scan of the log.
    Export,
    /// The lifecycle over HTTP (an in-process `opledger serve`, N worker
    /// clients), against the in-process lifecycle in the same run.
    Http,
}

impl Workload {
    /// The workload's name on the command line and in its results file.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Append => "append",
            Workload::Replay => "replay",
            Workload::Lifecycle => "lifecycle",
            Workload::Ingest => "ingest",
            Workload::Status => "status",
            Workload::Timeline => "timeline",
            Workload::Export => "export",
            Workload::Http => "http",
        }
    }
}

/// How to run a workload: the flags of `opledger bench` (each workload
/// reads the ones it names in its documentation).
#[derive(Debug, Clone)]
pub struct Options {
    pub workload: Workload,
    /// Events in the log the workload builds and measures.
    pub events: u64,
    /// Events per transaction for the batched append figure.
    pub batch: usize,
    /// Events appended one per transaction for the unbatched figure.
    pub unbatched_events: u64,
    /// Rounds of each measurement; figures are medians (ours and the floor alternate).
    pub rounds: usize,
    /// Tasks the lifecycle and http workloads run (half metadata, half thumbnail).
    pub tasks: u64,
    /// Worker counts the lifecycle and ingest workloads measure, one run each.
    pub workers: Vec<usize>,
    /// Tasks each lifecycle worker claims per call.
    pub claim_batch: usize,
    /// Folder for the benchmark databases (a temporary folder beside the
    /// current directory when absent).
    pub dir: Option<PathBuf>,
    /// Images the ingest workload generates and ingests.
    pub files: usize,
    /// With a count: the ingest workload generates that many camera-sized
    /// JPEGs instead and measures them against the decode floor.
    pub photos: Option<usize>,
    /// The size of those photos.
    pub megapixels: f64,
    /// Queries the status and timeline workloads time.
    pub samples: usize,
    /// Where to append the run's figures (`<workload>.jsonl`), if anywhere.
    pub record: Option<PathBuf>,
}

/// Runs the workload on fresh databases of the backend `database_url`
/// names (never on that database itself), and returns its report. With
/// [`Options::record`], the report is also appended to the results file.
pub async fn run(database_url: &str, options: &Options) -> Result<Value, BenchError> {
    let report = if database_url.starts_with("postgres://") || database_url.starts_with("postgresql://") {
        let server = PostgresConfig::server_from_url(database_url).map_err(BenchError::Invalid)?;
        let backend = PostgresBench::new(server);
        let report = on_any_backend(&backend, options).await;
        backend.drop_databases().await;
        report?
    } else {
        let template = SqliteConfig::from_url(database_url).map_err(BenchError::Invalid)?;
        let temporary;
        let dir: &Path = match &options.dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(BenchError::io(format!("creating {}", dir.display())))?;
                dir
            }
            None => {
                temporary = folder_beside_the_current_directory()?;
                temporary.path()
            }
        };
        match options.workload {
            Workload::Ingest if options.photos.is_some() => photos::photos(&template, dir, options).await?,
            Workload::Ingest => ingest::ingest(&template, dir, options).await?,
            Workload::Status => queries::status(&template, dir, options).await?,
            Workload::Timeline => queries::timeline(&template, dir, options).await?,
            Workload::Export => export::export(&template, dir, options).await?,
            Workload::Append | Workload::Replay | Workload::Lifecycle | Workload::Http => {
                let backend = SqliteBench {
                    template,
                    dir: dir.to_path_buf(),
                };
                on_any_backend(&backend, options).await?
            }
        }
    };
    if let Some(results) = &options.record {
        record::append(results, database_url, options, &report)?;
    }
    Ok(report)
}

async fn on_any_backend<B: backend::BenchBackend>(backend: &B, options: &Options) -> Result<Value, BenchError> {
    match options.workload {
        Workload::Append => log::append(backend, options).await,
        Workload::Replay => log::replay(backend, options).await,
        Workload::Lifecycle => lifecycle::lifecycle(backend, options).await,
        Workload::Http => http::http(backend, options).await,
        Workload::Ingest | Workload::Status | Workload::Timeline | Workload::Export => Err(BenchError::Invalid(
            format!("opledger bench {} runs on SQLite only so far", options.workload.name()),
        )),
    }
}

/// A temporary folder on the same file system as the current directory, so
/// the benchmark measures the disk the user's database would live on.
fn folder_beside_the_current_directory() -> Result<tempfile::TempDir, BenchError> {
    tempfile::Builder::new()
        .prefix(".opledger-bench-")
        .tempdir_in(".")
        .map_err(BenchError::io("creating a benchmark folder in the current directory"))
}
