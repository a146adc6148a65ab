//! One ingest run, step by step (see the crate documentation): discover
//! the folder's files and classify them against the ledger, begin their
//! ingestions and the batch, start the image workers, drive every file
//! through its stages until its tasks settle, and collect what needs a
//! person. Each step is a module of its own.

use crate::begin::begin;
use crate::discover::{classify, walk};
use crate::drive::{drive, FileReading};
use crate::lock::IngestLock;
use crate::review::review_entries;
use crate::workers::ImageWorkers;
use crate::{IngestError, IngestOptions, IngestProgress, IngestSummary};
use opledger_engine::{CommandContext, Engine};
use opledger_media::Settler;
use opledger_store::Store;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Files per transaction when starting, moving and finishing ingestions.
pub(crate) const CHUNK: usize = 250;

/// Applies the declarations of the image tasks (`opledger_media::KINDS_TOML`).
/// A ledger whose recorded declarations of these kinds differ in what
/// determines results, at the same version, refuses the ingest.
pub async fn declare_kinds<S: Store>(engine: &Engine<S>, context: &CommandContext) -> Result<(), IngestError> {
    let document = opledger_engine::parse_kinds(opledger_media::KINDS_TOML)?;
    let report = engine.apply_kinds(context, &document, false).await?;
    if let Some(refused) = report.refused().next() {
        return Err(IngestError::Engine(opledger_engine::EngineError::invalid(format!(
            "the ingest's task kind {} cannot be declared: {}",
            refused.name,
            refused.error.as_deref().unwrap_or("refused")
        ))));
    }
    Ok(())
}

/// Runs one ingest of `options.root` to the end.
pub async fn ingest<S: Store>(
    engine: Engine<S>,
    options: IngestOptions,
    progress: Arc<dyn IngestProgress>,
) -> Result<IngestSummary, IngestError> {
    let started = Instant::now();
    let run = Run::prepare(&engine, &options)?;

    // 0. The kinds this pipeline runs, declared (an unchanged declaration
    // appends nothing).
    declare_kinds(&engine, &run.context).await?;

    // 1. Walk, and compare with what the ledger knows.
    let files = walk(&run.root, &run.exclude)?;
    let classified = classify(&engine, &run.root, &files).await?;
    let (new, changed, unchanged) = (classified.new, classified.changed, classified.unchanged.len());
    progress.started(files.len(), unchanged);
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        files = files.len(),
        "walked"
    );

    // 2. Start ingestions, record the gone, and the batch over the folder.
    let begun = begin(&engine, &run, options.batch_name.as_deref(), classified).await?;
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "ingestions and batch started"
    );

    // 3. The workers, in the background until every file has settled.
    let workers = ImageWorkers::start(&engine, &run.worker, &options)?;

    // 4. Each file through its stages; then wait for its tasks.
    let reading = FileReading {
        settler: Settler::new(options.settle_quiet).with_poll(options.settle_quiet / 5),
        compute: workers.compute.clone(),
    };
    let known_paths = workers.known_paths.clone();
    let driven = drive(
        &engine,
        &run.context,
        &reading,
        begun.claims,
        unchanged,
        progress.as_ref(),
        &known_paths,
    )
    .await;
    let stopped = workers.stop().await?;
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        pool_report = ?stopped.report,
        "every file settled"
    );
    let driven = driven?;
    tracing::debug!(pool_report = ?stopped.report, "worker pool finished");

    // 5. What needs a person, among this folder's files.
    let review_entries = review_entries(&engine, &run.root).await?;
    progress.finished();
    Ok(IngestSummary {
        batch_id: begun.batch_id,
        files: files.len(),
        new,
        unchanged,
        changed,
        failed: driven.failed,
        missing: begun.missing,
        operations_created: begun.operations_created + driven.tasks_created,
        review_entries,
        tasks_run: stopped.tasks_run,
        wall_seconds: started.elapsed().as_secs_f64(),
    })
}

/// What a run holds from its start to its end: the folder, the lock, and
/// the name it acts under in the ledger.
pub(crate) struct Run {
    /// The folder, canonical.
    pub root: PathBuf,
    /// Paths the walk leaves alone (canonical where they exist).
    pub exclude: Vec<PathBuf>,
    /// The worker name of this run's ingestions and image workers.
    pub worker: String,
    pub context: CommandContext,
    _lock: IngestLock,
}

impl Run {
    /// Checks the folder, takes the ingest lock (waiting for another
    /// ingest of the database to end), and clears what a killed run left.
    fn prepare<S: Store>(engine: &Engine<S>, options: &IngestOptions) -> Result<Run, IngestError> {
        let root = std::fs::canonicalize(&options.root)
            .map_err(|error| IngestError::Io(format!("cannot read folder {}: {error}", options.root.display())))?;
        if !root.is_dir() {
            return Err(IngestError::Io(format!("{} is not a folder", root.display())));
        }
        std::fs::create_dir_all(&options.thumbnails_dir)
            .map_err(|error| IngestError::Io(format!("cannot create {}: {error}", options.thumbnails_dir.display())))?;
        let lock = IngestLock::acquire(&options.lock_path, || {
            tracing::warn!("another ingest holds {}; waiting for it", options.lock_path.display())
        })
        .map_err(|error| IngestError::Io(format!("locking {}: {error}", options.lock_path.display())))?;
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
        let worker = format!("ingest-{}", run.simple());
        let context = CommandContext::actor(worker.clone()).with_correlation(format!("ingest-{run}"));
        let canonical = |path: &PathBuf| std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        let mut exclude: Vec<PathBuf> = options.exclude.iter().map(canonical).collect();
        exclude.push(canonical(&options.thumbnails_dir));
        exclude.push(canonical(&options.lock_path));
        Ok(Run {
            root,
            exclude,
            worker,
            context,
            _lock: lock,
        })
    }
}
