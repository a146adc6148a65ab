//! What the steps of a run share: the run itself (its folder, its lock,
//! the name it acts under), the files it holds in flight, and how many
//! files one transaction takes.

use crate::lock::{run_worker, IngestLock};
use crate::{IngestError, IngestOptions};
use opledger_domain::{MediaId, OperationId};
use opledger_engine::{CommandContext, Engine, IngestionClaim};
use opledger_store::Store;
use std::path::{Path, PathBuf};

/// Files per transaction when starting, moving and finishing ingestions.
pub(crate) const CHUNK: usize = 250;

/// What a run holds from its start to its end: the folder, the lock, and
/// the name it acts under in the ledger.
pub(crate) struct Run<S: Store> {
    /// The folder, canonical.
    pub root: PathBuf,
    /// Paths the walk leaves alone (canonical where they exist).
    pub exclude: Vec<PathBuf>,
    /// The worker name of this run's ingestions and image workers.
    pub worker: String,
    pub context: CommandContext,
    /// Held for the whole run; dropped with it.
    pub lock: IngestLock<S>,
}

impl<S: Store> Run<S> {
    /// Checks the folder, takes the ingest lock (waiting for another
    /// ingest of the database to end), and clears what a killed run left.
    pub(crate) async fn prepare(engine: &Engine<S>, options: &IngestOptions) -> Result<Run<S>, IngestError> {
        let root = std::fs::canonicalize(&options.root)
            .map_err(|error| IngestError::Io(format!("cannot read folder {}: {error}", options.root.display())))?;
        if !root.is_dir() {
            return Err(IngestError::Io(format!("{} is not a folder", root.display())));
        }
        std::fs::create_dir_all(&options.thumbnails_dir)
            .map_err(|error| IngestError::Io(format!("cannot create {}: {error}", options.thumbnails_dir.display())))?;
        let lock = IngestLock::acquire(engine, || {
            tracing::warn!("another ingest of this ledger runs; waiting for it")
        })
        .await
        .map_err(|error| IngestError::Engine(error.into()))?;
        tracing::debug!(lock = %lock.describe(), "holding the ingest lock");
        // With the lock held no other ingest runs, so every temporary
        // thumbnail in the folder is one a killed run left between writing
        // it and renaming it into place: its claim is dead, and the task
        // runs again under a new claim.
        let abandoned = opledger_worker::remove_abandoned_outputs(&options.thumbnails_dir, |_| false)
            .map_err(|error| IngestError::Io(format!("cleaning {}: {error}", options.thumbnails_dir.display())))?;
        if abandoned > 0 {
            tracing::info!(abandoned, "removed temporary thumbnails a killed run left behind");
        }
        let run = engine.ids().next();
        let worker = run_worker(&run.simple().to_string());
        let context = CommandContext::actor(worker.clone()).with_correlation(format!("ingest-{run}"));
        let canonical = |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut exclude: Vec<PathBuf> = options.exclude.iter().map(|path| canonical(path)).collect();
        exclude.push(canonical(&options.thumbnails_dir));
        exclude.extend(lock.file().map(canonical));
        Ok(Run {
            root,
            exclude,
            worker,
            context,
            lock,
        })
    }
}

/// A file of this run that is being processed.
pub(crate) struct InFlight {
    pub claim: IngestionClaim,
    /// The file on disk (its real bytes, which the ledger's text encodes).
    pub path: PathBuf,
    pub media_id: Option<MediaId>,
    pub tasks: Vec<OperationId>,
}

/// Chunks of `size` items, in order.
pub(crate) fn chunks<T>(items: Vec<T>, size: usize) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        out.push(items.by_ref().take(size).collect());
    }
    out
}
